"""Per-minibatch timings of the pipeline (``PipelineConfig.trace``): where a step's time goes.

The consumer records, for every training minibatch, how long its host waited for the input,
how long it took to issue the step, and (on a GPU) three timing events on its compute stream:
when the step could start (the producer's "ready" event met), when the minibatch's blocks had
been copied in, and when the optimiser step ended. From them come the *GPU gap* before a step
(the compute stream idle since the previous step ended, waiting for the producer or for its own
host), the blocks' copy time and the GPU time of the training step itself. A pipeline whose
input keeps up has gaps near zero; one limited by its input has gaps that make up the difference.

The producer records its host-side waits and, with its own timing events, the GPU time of each
gather (with the upload of the minibatch's blocks that precedes it); it attaches the timings that are complete to the ``SlotReady`` messages it sends, so
they reach the consumer's statistics without another channel. A trace costs two event records
per minibatch and role, and no host synchronisation.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Dict, List, Optional

import torch

PERCENTILES = (10, 50, 90)


def summarise(values: List[float]) -> Dict[str, float]:
    """``{"n", "mean", "p10", "p50", "p90", "max"}`` of ``values`` (milliseconds); empty -> ``{"n": 0}``."""
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    out = {"n": len(ordered), "mean": sum(ordered) / len(ordered), "max": ordered[-1]}
    for p in PERCENTILES:
        # nearest-rank percentile: simple and exact for the small samples an epoch gives
        out[f"p{p}"] = ordered[min(len(ordered) - 1, max(0, -(-p * len(ordered) // 100) - 1))]
    return out


class ProducerTrace:
    """The producer's timings; ``take()`` returns those complete so far and forgets them."""

    def __init__(self, stream: Optional["torch.cuda.Stream"]):
        self.stream = stream
        self.pending: deque = deque()  # (start event, end event) of gathers not yet complete
        self.host: Dict[str, List[float]] = {"batch_wait_ms": [], "slot_wait_ms": [], "issue_ms": []}
        self.gpu: List[float] = []

    def host_time(self, key: str, seconds: float) -> None:
        self.host[key].append(seconds * 1e3)

    def gather_events(self):
        """Two timing events to record around one gather (``None`` without a GPU)."""
        if self.stream is None:
            return None
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def gather_done(self, events, minibatches: int = 1) -> None:
        """``events`` timed one gather of ``minibatches`` minibatches (each is then reported
        with its share of the time)."""
        if events is not None:
            self.pending.append((events, minibatches))

    def take(self) -> Dict[str, List[float]]:
        while self.pending and self.pending[0][0][1].query():
            (start, end), minibatches = self.pending.popleft()
            self.gpu.extend([start.elapsed_time(end) / minibatches] * minibatches)
        out = dict(self.host, gather_gpu_ms=self.gpu)
        self.host = {k: [] for k in self.host}
        self.gpu = []
        return out


class ConsumerTrace:
    """The consumer's timings of one epoch's training minibatches, summarised at its end."""

    def __init__(self, on_gpu: bool):
        self.on_gpu = on_gpu
        self.rows: list = []  # (wait s, issue s, start, copied, end events) per minibatch
        self._issue_start = 0.0
        self._waited = 0.0
        self._start = self._copied = None

    def _event(self):
        if not self.on_gpu:
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def step_begins(self, waited: float) -> None:
        """The host has the minibatch (after ``waited`` seconds) and the compute stream waits
        for its features; nothing of the step is issued yet."""
        self._waited = waited
        self._issue_start = time.perf_counter()
        self._start = self._event()

    def inputs_copied(self) -> None:
        """The minibatch's blocks and labels have been issued for copying to the device."""
        self._copied = self._event()

    def step_ends(self) -> None:
        """The optimiser step is issued."""
        end = self._event()
        self.rows.append((self._waited, time.perf_counter() - self._issue_start, self._start, self._copied, end))


    def summary(self, producer: "ProducerTimings") -> dict:
        """Per-step lists and their percentiles, with the producer's timings received so far
        (taken out of ``producer``); call after the device has synchronised. The epoch's first
        minibatch is left out (it carries the pipeline's fill), as in the steady-state
        statistics."""
        rows = self.rows[1:]
        steps = {"input_wait_ms": [r[0] * 1e3 for r in rows], "issue_ms": [r[1] * 1e3 for r in rows]}
        if self.on_gpu and rows:
            steps["gpu_gap_ms"] = [prev[4].elapsed_time(r[2]) for prev, r in zip(self.rows, rows)]
            steps["gpu_copy_ms"] = [r[2].elapsed_time(r[3]) for r in rows]
            steps["gpu_train_ms"] = [r[3].elapsed_time(r[4]) for r in rows]
        out = {"per_step": {k: [round(v, 4) for v in vals] for k, vals in steps.items()},
               "consumer": {k: summarise(v) for k, v in steps.items()},
               "producer": {k: summarise(v) for k, v in producer.drain().items()}}
        self.rows = []
        return out


class ProducerTimings:
    """The consumer's pool of the timings producers attach to their messages, training and
    validation minibatches alike, until the next epoch summary takes them."""

    def __init__(self):
        self.values: Dict[str, List[float]] = {}

    def add(self, producer_trace: Optional[dict]) -> None:
        for key, values in (producer_trace or {}).items():
            self.values.setdefault(key, []).extend(values)

    def drain(self) -> Dict[str, List[float]]:
        out, self.values = self.values, {}
        return out
