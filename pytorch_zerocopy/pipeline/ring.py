"""The ring of slots between the producer and the trainer: :class:`RingWriter` (producer side)
and :class:`RingReader` (trainer side).

Slot ownership is a pair of blocking queues (``ready``: producer -> trainer, ``free``: trainer
-> producer; both directions of one connection with the machine's gatherer, :mod:`.machine`),
so neither side sleeps or polls. Slot ``s`` belongs to the producer from the
moment it takes ``s`` from ``free`` until it puts ``SlotReady(s)`` on ``ready`` (a group's slots
travel in one :class:`~.messages.SlotsReady`); then to the trainer until it puts ``s`` back (a
group's slots go back together, in one :class:`~.messages.FreeSlots`, once the trainer has
released the last of them: the producer takes a whole group's slots before it gathers into
them, so it waits no longer). On a GPU the ordering of the GPU work itself is carried by
one IPC-shared CUDA event per slot and direction, recorded by the side that finished with the
slot and waited on by the other side's stream: a hand-off costs one queue message and no host
synchronisation.

GPU slots hold a minibatch's feature rows and its packed tensor (blocks, labels, input ids), so
the trainer receives a tensor-free description: the training run's trainer reads the slot in
place, a loader's (whose minibatches outlive their slots) copies it out in one call
(:meth:`RingReader.take_out`). Host slots (the DMA path, the CPU pipeline) hold feature rows;
the minibatch's packed tensor travels on the queue.

Sharing: the buffers are shared once (:class:`~.messages.RingHandles`) and again only when a
slot must grow (rare: the first slots hold the largest possible input set, up to a budget).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, List, Optional, Sequence, Tuple

import torch

from .. import unified
from ..datasets.base import NodeDataset, shared_host_tensor
from ..unified import to_unified
from .messages import (RELEASED, EpochMark, FreeEvents, FreeSlots, GathererFailed, Minibatch, PackedParts, RingHandles,
                       SlotReady, SlotsReady, TableReady)
from .plan import Plan


def slot_capacity(plan: Plan, ds: NodeDataset, budget_bytes: int = 2 << 30) -> int:
    """Initial rows per slot: the largest possible input set, capped by ``budget_bytes``."""
    bound = plan.batch_size * math.prod(f + 1 if f > 0 else ds.num_nodes for f in plan.fanouts)
    row_bytes = ds.row_bytes
    return max(1, min(ds.num_nodes, bound, budget_bytes // row_bytes))


def _grown(n: int, current: int) -> int:
    return max(n, current * 5 // 4)


@dataclass
class SlotBuffers:
    """A ring's GPU buffers (feature rows and packed tensors, one of each per slot), which a
    writer can hand to the next writer of the same device and plan (:meth:`RingWriter.buffers_for_reuse`).

    Why: CUDA IPC keeps a shared block alive in the process that made it until every process it
    was sent to has dropped it, and a trainer that was killed never does; so a long-lived
    gatherer that made new buffers for every trainer of an elastic restart would keep the dead
    trainer's buffers for good. Reused, a GPU holds one set per trainer however often it restarts.
    """

    rows: List[torch.Tensor]
    packed: List[torch.Tensor]

    def fits(self, plan: Plan, ds: NodeDataset, device: torch.device) -> bool:
        """Whether a ring of ``plan`` over ``ds`` on ``device`` can use these buffers."""
        return (len(self.rows) == plan.num_slots == len(self.packed)
                and all(b.device == device and b.dtype == ds.feature_dtype and b.shape[1] == ds.feature_dim
                        for b in self.rows))


class RingWriter:
    """The producer's end: allocates the slots, shares them, and fills and publishes them."""

    def __init__(self, plan: Plan, ds: NodeDataset, device: torch.device, ready_q, free_q,
                 reuse: Optional[SlotBuffers] = None, table: Optional[TableReady] = None):
        """``reuse``: GPU buffers an earlier writer left (see :class:`SlotBuffers`), taken over
        when they fit this ring (their contents are not read); else new buffers are made.
        ``table``: the writer's feature table, sent to the trainer with the buffers."""
        self.ds, self.device, self.ready_q, self.free_q = ds, device, ready_q, free_q
        self.on_gpu = device.type == "cuda"
        if self.on_gpu and reuse is not None and reuse.fits(plan, ds, device):
            self.buffers, self.packed = list(reuse.rows), list(reuse.packed)
        else:
            rows = slot_capacity(plan, ds)
            self.buffers = [self.feature_buffer(rows) for _ in range(plan.num_slots)]
            # Room for the input ids, the labels and about two edges per input node; grown like
            # the feature rows otherwise.
            self.packed = [torch.empty(3 * rows + plan.batch_size, dtype=torch.int64, device=device)
                           for _ in self.buffers] if self.on_gpu else []
        self.ready_events = [torch.cuda.Event(interprocess=True) for _ in self.buffers] if self.on_gpu else []
        if self.on_gpu:
            for ev in self.ready_events:  # an IPC handle needs a created event; recording creates it
                ev.record()
            torch.cuda.synchronize(device)
        self.stream = torch.cuda.current_stream(device) if self.on_gpu else None
        self._grown_rows: dict = {}
        self._grown_packed: dict = {}
        ready_q.put(RingHandles(self.buffers, self.ready_events, self.packed, table))
        handshake = free_q.get()
        if not isinstance(handshake, FreeEvents):
            raise RuntimeError(f"producer: expected the trainer's events first, got {handshake!r}")
        self.free_events = handshake.events
        self._unused = deque(range(plan.num_slots))  # slots never handed out yet
        self._given_back: deque = deque()  # slots the trainer gave back, not taken yet

    def buffers_for_reuse(self) -> Optional[SlotBuffers]:
        """This ring's GPU buffers for the next writer of its device, once no GPU work of this
        writer is left (it synchronises the device); None for host slots, which a receiver that
        dies cannot pin (their memory goes when the last process holding it ends)."""
        if not self.on_gpu:
            return None
        torch.cuda.synchronize(self.device)
        return SlotBuffers(list(self.buffers), list(self.packed))

    def feature_buffer(self, rows: int) -> torch.Tensor:
        """An uninitialised buffer of ``rows`` feature rows where this ring's slots live."""
        shape, dtype = (rows, self.ds.feature_dim), self.ds.feature_dtype
        return torch.empty(shape, dtype=dtype, device=self.device) if self.on_gpu else shared_host_tensor(shape, dtype)

    def take(self, n: int) -> List[int]:
        """``n`` free slots (blocks until the trainer gives them back); on a GPU the current
        stream then waits for the trainer's last use of each."""
        slots = [self._free_slot() for _ in range(n)]
        if self.on_gpu:
            for slot in slots:
                self.stream.wait_event(self.free_events[slot])
        return slots

    def _free_slot(self) -> int:
        if self._unused:
            return self._unused.popleft()
        while not self._given_back:
            message = self.free_q.get()
            if not isinstance(message, FreeSlots):
                raise RuntimeError(f"producer: expected slots given back by the trainer, got {message!r}")
            self._given_back.extend(message.slots)
        return self._given_back.popleft()

    def load(self, slot: int, batch: Minibatch) -> Minibatch:
        """Makes ``slot`` hold ``batch``'s feature rows (growing it if needed) and, on a GPU, its
        packed tensor (copied on the current stream: from the GPU, or from host memory through
        torch's pinned staging cache, which reuses a block only after its copy has run).
        Returns the minibatch over the slot's copy of the packed tensor (host slots: itself)."""
        n = batch.layout.input_rows
        if n > self.buffers[slot].shape[0]:
            grown = self.feature_buffer(_grown(n, self.buffers[slot].shape[0]))
            self.buffers[slot] = self._grown_rows[slot] = grown
        if not self.on_gpu:
            return batch
        m = batch.layout.numel
        if m > self.packed[slot].numel():
            self.packed[slot] = self._grown_packed[slot] = torch.empty(
                _grown(m, self.packed[slot].numel()), dtype=torch.int64, device=self.device)
        on_device = self.packed[slot][:m]
        source = batch.packed if batch.packed.is_cuda else batch.packed.pin_memory()
        on_device.copy_(source, non_blocking=True)
        return batch.with_packed(on_device)

    def rows(self, slot: int, n: int) -> torch.Tensor:
        """The first ``n`` feature rows of ``slot`` (to gather into)."""
        return self.buffers[slot][:n]

    def publish(self, slots: List[int], batches: List[Minibatch], traces: List[Optional[dict]],
                complete_on: Optional["torch.cuda.Stream"] = None) -> None:
        """Hands ``slots`` (loaded with ``batches`` and gathered into) to the trainer, in one
        message; on a GPU each slot's "ready" event is recorded first on ``complete_on``, the
        stream whose queued work completes the slots (after the current stream's: default the
        current stream). ``traces``: each slot's producer timings (None: none)."""
        items = []
        for slot, batch, trace in zip(slots, batches, traces):
            if self.on_gpu:
                self.ready_events[slot].record(complete_on or self.stream)
                batch = batch.with_packed(None)
            items.append(SlotReady(slot, batch.layout.input_rows, batch, self._grown_rows.pop(slot, None), trace,
                                   self._grown_packed.pop(slot, None)))
        self.ready_q.put(SlotsReady(items))

    def mark(self, mark: EpochMark) -> None:
        self.ready_q.put(mark)

    def close(self) -> None:
        """Ends the stream of minibatches, then keeps the buffers alive until the trainer says it
        has dropped its mappings of them."""
        self.ready_q.put(None)
        while self.free_q.get() != RELEASED:
            pass
        if self.on_gpu:
            torch.cuda.synchronize(self.device)


@dataclass
class _Released:
    """The slots of one received group released so far, of its ``size``."""

    size: int
    slots: List[int] = field(default_factory=list)


class RingReader:
    """The trainer's end: yields ``(SlotReady, features)`` (and ``(EpochMark, None)``) and gives
    slots back with :meth:`release`, or copies them out and gives them back with
    :meth:`take_out`.

    With host slots and a CUDA trainer (the DMA path) each slot is registered once and copied
    to the GPU asynchronously on a copy stream; the slot returns to the producer as soon as its
    copy has completed, so CPU gathering, the copy and training overlap.

    ``copies_out``: every slot is taken out with :meth:`take_out` (a loader, whose minibatches
    outlive their slots); then GPU slots are yielded as ``(SlotReady, None)``, no views made.
    """

    def __init__(self, ready_q, free_q, device: torch.device, copies_out: bool = False):
        self.ready_q, self.free_q, self.device, self.copies_out = ready_q, free_q, device, copies_out
        handles = ready_q.get()
        if isinstance(handles, GathererFailed):
            raise RuntimeError(f"the machine's gatherer failed:\n{handles.remote_traceback}")
        if not isinstance(handles, RingHandles):
            raise RuntimeError(f"trainer: expected the ring's buffers first, got {handles!r}")
        self.table = handles.table  # the producer's TableReady, for the trainer to report
        self.buffers = list(handles.buffers)
        self.ready_events = list(handles.ready_events)
        self.packed = list(handles.packed)
        self.gpu_slots = self.buffers[0].device.type == "cuda"
        self.copy_in = (not self.gpu_slots) and device.type == "cuda"
        self.free_events: list = []
        self._mapped: list = []
        if self.gpu_slots:
            self.free_events = [torch.cuda.Event(interprocess=True) for _ in self.buffers]
            for ev in self.free_events:
                ev.record()
            torch.cuda.synchronize()
        if self.copy_in:
            self._mapped = [to_unified(b) for b in self.buffers]  # page-locks them: async copies
            self.copy_stream = torch.cuda.Stream(device)
        self.free_q.put(FreeEvents(self.free_events))
        self._copy_done = None
        self._group_of: dict = {}  # slot received and not released -> its group's _Released
        self._index = None if device.type != "cuda" else \
            (device.index if device.index is not None else torch.cuda.current_device())
        self._streams: dict = {}  # torch's key of a stream -> its Stream (made once)

    def _adopt(self, item: SlotReady) -> None:
        """Switches to a slot's grown buffers."""
        if self.gpu_slots:
            # The producer may reuse the old buffer's memory as soon as we drop it: finish our
            # queued reads of it first (rare: slots grow a few times at most).
            torch.cuda.current_stream(self.device).synchronize()
        if item.buffer is not None:
            self.buffers[item.slot] = item.buffer
            if self.copy_in:
                self._mapped[item.slot] = to_unified(item.buffer)
        if item.packed_buffer is not None:
            self.packed[item.slot] = item.packed_buffer

    def __iter__(self) -> Iterator[Tuple[object, Optional[torch.Tensor]]]:
        while True:
            message = self.ready_q.get()
            if message is None:
                return
            if isinstance(message, GathererFailed):
                raise RuntimeError(f"the machine's gatherer failed:\n{message.remote_traceback}")
            if isinstance(message, EpochMark):
                yield message, None
            elif isinstance(message, SlotsReady):
                group = _Released(len(message.items))
                for item in message.items:
                    self._group_of[item.slot] = group
                for item in message.items:
                    yield item, self._features(item)
            else:
                raise RuntimeError(f"trainer: expected slots or an epoch mark from the producer, got {message!r}")

    def _features(self, item: SlotReady) -> Optional[torch.Tensor]:
        """The feature rows of a ready slot, for the current stream (``item.batch`` given the
        slot's packed tensor, with GPU slots; None and no views with ``copies_out``)."""
        if item.buffer is not None or item.packed_buffer is not None:
            self._adopt(item)
        if self.gpu_slots:
            self._current_stream().wait_event(self.ready_events[item.slot])
            if self.copies_out:
                return None
            item.batch.packed = self.packed[item.slot][: item.batch.layout.numel]  # received here: ours to set
            return self.buffers[item.slot][: item.rows]
        view = self.buffers[item.slot][: item.rows]
        if not self.copy_in:
            return view
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self.copy_stream):
            feats = view.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.copy_stream)
        compute.wait_event(done)
        feats.record_stream(compute)
        self._copy_done = done
        return feats

    def _current_stream(self) -> "torch.cuda.Stream":
        """The current stream of the trainer's GPU, without making a ``Stream`` per call (a
        slot's hand-off is on the path of every minibatch): one per stream seen, kept while
        few are (a loop making a stream per step makes them again)."""
        key = torch._C._cuda_getCurrentStream(self._index)  # (id, device index, type): what current_stream reads
        stream = self._streams.get(key)
        if stream is None:
            if len(self._streams) >= 16:
                self._streams.clear()
            stream = self._streams[key] = torch.cuda.Stream(stream_id=key[0], device_index=key[1], device_type=key[2])
        return stream

    def take_out(self, item: SlotReady, feats: Optional[torch.Tensor], label_sizes: Sequence[int] = ()
                 ) -> Tuple[Minibatch, torch.Tensor, PackedParts]:
        """A received slot's minibatch and feature rows (``feats``, as yielded) as tensors of
        their own, the minibatch's packed tensor in its parts
        (:meth:`~.messages.Minibatch.parts` of ``label_sizes``), and the slot given back. GPU
        slots are copied out on the current stream, in one call; host slots hold the rows
        only (copied, unless already copied in to the GPU), the packed tensor having come on
        the queue."""
        batch = item.batch
        if self.gpu_slots:
            rows, batch.packed, *views = unified._C.copy_out_slot(
                self.buffers[item.slot], item.rows, self.packed[item.slot], batch.part_sizes(label_sizes))
            parts = batch.as_parts(views)
        else:
            rows = feats if self.copy_in else feats.clone()
            parts = batch.parts(label_sizes)
        self.release(item)
        return batch, rows, parts

    def release(self, item: SlotReady) -> None:
        """Gives ``item``'s slot back: its group's slots go to the producer once all are."""
        group = self._group_of.pop(item.slot, None)
        if group is None:
            raise RuntimeError(f"trainer: slot {item.slot} was released twice, or never received")
        if self.gpu_slots:
            self.free_events[item.slot].record(self._current_stream())
        elif self.copy_in:
            self._copy_done.synchronize()  # the host slot may be refilled once copied out
        group.slots.append(item.slot)
        if len(group.slots) == group.size:
            self.free_q.put(FreeSlots(tuple(group.slots)))

    def close(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.buffers, self.ready_events, self.free_events, self._mapped, self.packed = [], [], [], [], []
        self.free_q.put(RELEASED)
