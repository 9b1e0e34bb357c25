"""One minibatch ahead on side CUDA streams: how the in-process loaders overlap their work with
the training loop's.

:func:`one_ahead` wraps the iterator of a loader's minibatches. On a GPU, before it hands out
minibatch ``i`` it has already queued minibatch ``i + 1`` (sampling, gather, build: whatever
``next(source)`` does) on a side stream of its own, so the host work of one minibatch, and the
host synchronisations its sampling makes (which wait for the side stream only), run while the
GPU still works on the loop's step. Two side streams alternate, so that sampling minibatch
``i + 1`` does not wait for the gather of minibatch ``i``.

Two steps (``finish``): a loader whose sampling can be queued without the host waiting for it
(:func:`~pytorch_zerocopy.sampling.sample_layers_async`) gives a ``source`` that only starts
each minibatch (queues its sample and returns at once) and a ``finish`` that completes a
started one (takes the sample, which waits for that sample's GPU work only, then queues the
gather and builds the minibatch). Before minibatch ``i`` is handed out, minibatch ``i + 2`` has
been started and minibatch ``i + 1`` finished: the wait in ``finish`` is for a sample queued one
minibatch earlier, which the GPU ran while the host built the minibatch before it, so it is
short or nothing. Minibatch ``k`` is started and finished on side stream ``k % 3`` of three, so
no minibatch's work queues behind another's on the GPU. ``finish`` must not start work that the
next call of ``next(source)`` depends on: the two run on different streams.

Ordering and lifetime: the stream that is current when the loop asks for a minibatch waits for
the minibatch's event (recorded on its side stream after it was built) before the minibatch is
returned, and every tensor of it is marked as used on that stream (``record_stream``), so the
caching allocator reuses its memory only after the loop's work on it has run. Tensors are found
in tuples, lists, dicts, PyG ``Data`` and blocks (``src``/``dst``, ``srcdata``, ``dstdata``,
``edata``); a minibatch type holding tensors elsewhere must be used on the stream it was built
on. Tensors a minibatch's steps make and drop on the way (a sample's buffers) are made, used
and freed on that minibatch's side stream, so their memory is reused only behind that work.
Leaving the loop early drops the started minibatches; their queued GPU work still runs, on
their side streams, over memory those streams keep until it has.

The side streams never wait for the loop's stream: the graph and the tables must not be written
on the GPU while an epoch runs (host writes, as ``put_tensor`` makes, are seen by the next
minibatch started).

Randomness: minibatch ``i + 1`` (with ``finish``: ``i + 2``) draws its sampling seed from
torch's default CPU generator before the loop's body for minibatch ``i`` runs. The minibatches
are the same as without the overlap unless that body itself draws from torch's CPU generator
between minibatches.

Without a GPU the source is returned as it is (with ``finish``: each item finished in turn):
nothing runs ahead.
"""

from __future__ import annotations

import contextlib
from collections import deque
from typing import Any, Callable, Iterator, Optional

import torch

__all__ = ["one_ahead", "tensors_of"]


def tensors_of(obj: Any) -> Iterator[torch.Tensor]:
    """Every tensor a minibatch holds (see the module docstring for where it looks)."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from tensors_of(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from tensors_of(item)
    elif hasattr(obj, "stores") and hasattr(obj, "to_dict"):  # PyG Data / HeteroData
        for store in obj.stores:
            for item in store.values():
                yield from tensors_of(item)
    elif hasattr(obj, "srcdata") and hasattr(obj, "edata"):  # a block
        for name in ("src", "dst"):
            t = getattr(obj, name, None)
            if isinstance(t, torch.Tensor):
                yield t
        for frame in (obj.srcdata, obj.dstdata, obj.edata):
            for key in list(frame.keys()):
                yield from tensors_of(frame[key])


def one_ahead(source: Iterator[Any], device: torch.device,
              finish: Optional[Callable[[Any], Any]] = None) -> Iterator[Any]:
    """``source``'s items, each built one ahead on a side stream of ``device`` (module
    docstring); ``source`` itself where ``device`` is not a GPU. ``finish``: ``source`` yields
    started minibatches and ``finish(started)`` completes one, started two ahead and finished
    one ahead (on the CPU: ``finish`` of each item in turn)."""
    if device.type != "cuda":
        return source if finish is None else map(finish, source)
    return _ahead(source, finish, device)


class _SideStreams:
    """The side streams of :func:`_ahead`: minibatch ``k``'s work runs on stream ``k % count``;
    the loop's stream waits for a minibatch's event before it gets it. ``device`` None: no
    streams (the same order of work on the host alone; nothing is waited for)."""

    def __init__(self, device: Optional[torch.device], count: int):
        self.streams = [torch.cuda.Stream(device) for _ in range(count)] if device is not None else None
        self.device = device

    def on(self, k: int):
        if self.streams is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self.streams[k % len(self.streams)])

    def mark(self, k: int) -> Optional[torch.cuda.Event]:
        """An event after the work queued so far on minibatch ``k``'s stream."""
        if self.streams is None:
            return None
        event = torch.cuda.Event()
        event.record(self.streams[k % len(self.streams)])
        return event

    def deliver(self, item: Any, event: Optional[torch.cuda.Event]) -> Any:
        """``item`` made safe to use on the current stream (module docstring: ordering and lifetime)."""
        if event is None:
            return item
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(event)
        for t in tensors_of(item):
            if t.is_cuda:
                t.record_stream(consumer)
        return item


def _ahead(source: Iterator[Any], finish: Optional[Callable[[Any], Any]],
           device: Optional[torch.device]) -> Iterator[Any]:
    """:func:`one_ahead`'s schedule on ``device`` (None: on the host alone, no streams): the
    minibatches of ``source`` (each passed through ``finish`` when given), in order."""
    started_ahead = 0 if finish is None else 1  # started, not yet finished, beyond the next built
    streams = _SideStreams(device, started_ahead + 2)
    started: deque = deque()  # (k, what next(source) gave for minibatch k), oldest first
    count = 0  # minibatches started so far
    exhausted = False

    def start_up_to(n: int) -> None:
        nonlocal count, exhausted
        while not exhausted and len(started) < n:
            with streams.on(count):
                try:
                    item = next(source)
                except StopIteration:
                    exhausted = True
                    return
            started.append((count, item))
            count += 1

    def build_next():
        if not started:
            return None
        k, item = started.popleft()
        with streams.on(k):
            built = item if finish is None else finish(item)
            return built, streams.mark(k)

    start_up_to(started_ahead + 1)
    ready = build_next()
    while ready is not None:
        start_up_to(started_ahead + 1)
        following = build_next()
        yield streams.deliver(*ready)
        ready = following
