"""Per-minibatch timings of the pipeline (``Plan.trace``): where a step's time goes.

The trainer records, for every training minibatch, how long its host waited for the input,
how long it took to issue the step, and (on a GPU) three timing events on its compute stream:
when the step could start (its input's "ready" event met), when the minibatch's blocks had been
copied in, and when the optimiser step ended. From them come the *GPU gap* before a step (the
compute stream idle since the previous step ended, waiting for its input or for its own host),
the blocks' copy time and the GPU time of the training step itself. A pipeline whose input
keeps up has gaps near zero; one limited by its input has gaps that make up the difference.

The side that gathers (the producer, or the trainer's inline source) records its host waits
and the time of each sample and gather: GPU time between two events on the stream that ran it
(sampling on the GPU, zero-copy and GPU-memory gathers), host time otherwise (the CPU
samplers report theirs with each minibatch; CPU gathers run on the calling thread). Timings
travel with the ``SlotReady`` messages once complete, so they reach the trainer's statistics
without another channel. A trace costs two event records per timed span and no host
synchronisation.

Tracing wraps stages rather than branching inside them; each role chooses, once, where it
assembles its stages, whether to wrap: :class:`TracedSampling` wraps the GPU sampler's two
steps, :func:`timed_read` a read of rows, the producer's traced flush its group gather
(:mod:`.producer`). The trainer's step is one stage whose timing points fall between its
operations: its loop calls a :class:`StepHook` at them, :data:`NO_TRACE` (does nothing) or a
:class:`TrainerTrace`. Without a trace nothing of this runs per minibatch.

A loader's stages (:class:`Stage`: sample, gather, build, deliver) are timed by a
:class:`StageTimes` the loader is given, :data:`UNTIMED` (records nothing) when it is given
none; the benchmarks print them.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .plan import Phase

PERCENTILES = (10, 50, 90)

# The gathering side's keys (milliseconds): host waits for a sampled minibatch and for a free
# slot, host time to issue a minibatch's gather and its GPU sample, and the sample and gather
# times themselves.
PRODUCER_KEYS = ("batch_wait_ms", "slot_wait_ms", "issue_ms", "sample_issue_ms", "sample_ms", "gather_ms")


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


Span = Tuple["torch.cuda.Event", "torch.cuda.Event"]


class ProducerTrace:
    """The gathering side's timings; :meth:`take` returns those complete so far and forgets them."""

    def __init__(self, on_gpu: bool):
        self.on_gpu = on_gpu
        self.pending: deque = deque()  # (key, span, minibatches) not yet complete on the GPU
        self.done: Dict[str, List[float]] = {k: [] for k in PRODUCER_KEYS}

    def host(self, key: str, seconds: float, count: int = 1) -> None:
        """``count`` minibatches took ``seconds`` of host time together (each gets its share)."""
        self.done[key].extend([seconds * 1e3 / count] * count)

    def value(self, key: str, ms: float) -> None:
        self.done[key].append(ms)

    def span(self) -> Optional[Span]:
        """Two timing events to record around GPU work (None without a GPU)."""
        if not self.on_gpu:
            return None
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def gpu(self, key: str, spans: Sequence[Span], count: int = 1) -> None:
        """``spans`` together timed GPU work of ``count`` minibatches (each is reported with its
        share of their total)."""
        if spans:
            self.pending.append((key, tuple(spans), count))

    def sampled(self, sampled) -> None:
        """A :class:`~.minibatches.Sampled` minibatch reached the gathering side: the host's
        wait for it, and its sampling time (the GPU spans of its sample, else the host time its
        CPU sampler reported)."""
        self.host("batch_wait_ms", sampled.waited)
        if sampled.spans:
            self.host("sample_issue_ms", sampled.issued)
            self.gpu("sample_ms", sampled.spans)
        elif sampled.batch.sample_ms:
            self.value("sample_ms", sampled.batch.sample_ms)

    def take(self) -> Dict[str, List[float]]:
        while self.pending and all(end.query() for _, end in self.pending[0][1]):
            key, spans, count = self.pending.popleft()
            total = sum(start.elapsed_time(end) for start, end in spans)
            self.done[key].extend([total / count] * count)
        out, self.done = self.done, {k: [] for k in PRODUCER_KEYS}
        return out

    def take_all(self) -> Dict[str, List[float]]:
        """:meth:`take` after waiting for every pending span's end (a host synchronisation:
        at a phase's end, so that its mark carries the phase's last timings)."""
        for _, spans, _ in self.pending:
            for _, end in spans:
                end.synchronize()
        return self.take()


class TracedSampling:
    """GPU sampling ``steps`` (:class:`~.minibatches.SampleSteps`) with each step timed into
    ``trace`` (a GPU trace): two events recorded on ``stream``, the sampling stream, around
    each step, the issue and the completion with packing; the finished
    :class:`~.minibatches.Sampled` carries both spans and the host time of both steps (less
    its wait for the sample's sizes). The stretch between the steps, while earlier minibatches
    are gathered, is not counted."""

    def __init__(self, steps, trace: ProducerTrace, stream: "torch.cuda.Stream"):
        self.steps, self.trace, self.stream = steps, trace, stream

    def start(self, batch) -> Tuple[Any, Span, float]:
        t = time.perf_counter()
        span = self.trace.span()
        span[0].record(self.stream)
        started = self.steps.start(batch)
        span[1].record(self.stream)
        return started, span, time.perf_counter() - t

    def finish(self, batch, started: Tuple[Any, Span, float]):
        inner, issued, host = started
        t = time.perf_counter()
        span = self.trace.span()
        span[0].record(self.stream)
        out = self.steps.finish(batch, inner)
        span[1].record(self.stream)
        return replace(out, spans=(issued, span), issued=host + time.perf_counter() - t - out.waited)


def timed_read(read: Callable[..., torch.Tensor], trace: ProducerTrace, key: str = "gather_ms"):
    """``read`` with the time of each call added to ``trace``'s ``key``: with a GPU trace the
    GPU time between two events recorded on the current stream around the call (the stream the
    read is issued on), else the host time of the call."""
    if trace.on_gpu:
        def on_gpu(*args, **kwargs) -> torch.Tensor:
            span = trace.span()
            span[0].record()
            out = read(*args, **kwargs)
            span[1].record()
            trace.gpu(key, [span])
            return out
        return on_gpu

    def on_host(*args, **kwargs) -> torch.Tensor:
        start = time.perf_counter()
        out = read(*args, **kwargs)
        trace.host(key, time.perf_counter() - start)
        return out
    return on_host


@dataclass
class TraceSummary:
    """One epoch's timings: the trainer's per-step lists (ms) and the percentiles
    (:func:`summarise`) of the trainer's and the gathering side's timings."""

    per_step: Dict[str, List[float]] = field(default_factory=dict)
    consumer: Dict[str, Dict[str, float]] = field(default_factory=dict)
    producer: Dict[str, Dict[str, float]] = field(default_factory=dict)


_TRACE_LABELS = (("consumer", "input_wait_ms", "trainer input wait"), ("consumer", "issue_ms", "host issue"),
                 ("consumer", "gpu_gap_ms", "GPU gap"), ("consumer", "gpu_copy_ms", "blocks copy"),
                 ("consumer", "gpu_train_ms", "GPU train"), ("producer", "sample_ms", "sample"),
                 ("producer", "gather_ms", "gather"), ("producer", "sample_issue_ms", "sample issue"),
                 ("producer", "batch_wait_ms", "wait for a sample"),
                 ("producer", "slot_wait_ms", "wait for a slot"))


def describe_trace(summary: TraceSummary) -> str:
    """One line of an epoch's timings: ``name p50/p90`` in ms per minibatch, the trainer's
    (input wait, host issue, and on a GPU: the compute stream's gap before a step, the blocks'
    copy, the step's GPU time) then the gathering side's (sample, gather, its waits)."""
    parts = []
    for side, key, label in _TRACE_LABELS:
        s = getattr(summary, side).get(key)
        if s and s.get("n"):
            parts.append(f"{label} {s['p50']:.2f}/{s['p90']:.2f}")
    return "ms per minibatch, p50/p90: " + (", ".join(parts) if parts else "no steady-state minibatches")


class ConsumerTrace:
    """The trainer's timings of one epoch's training minibatches, summarised at its end."""

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

    def summary(self, producer: "ProducerTimings") -> TraceSummary:
        """Per-step lists and their percentiles, with the gathering side's timings received so
        far (taken out of ``producer``); call after the device has synchronised. The epoch's
        first minibatch is left out (it carries the pipeline's fill), as in the steady-state
        statistics."""
        rows = self.rows[1:]
        steps = {"input_wait_ms": [r[0] * 1e3 for r in rows], "issue_ms": [r[1] * 1e3 for r in rows]}
        if self.on_gpu and rows:
            steps["gpu_gap_ms"] = [prev[4].elapsed_time(r[2]) for prev, r in zip(self.rows, rows)]
            steps["gpu_copy_ms"] = [r[2].elapsed_time(r[3]) for r in rows]
            steps["gpu_train_ms"] = [r[3].elapsed_time(r[4]) for r in rows]
        self.rows = []
        return TraceSummary(per_step={k: [round(v, 4) for v in vals] for k, vals in steps.items()},
                            consumer={k: summarise(v) for k, v in steps.items()},
                            producer={k: summarise(v) for k, v in producer.drain().items()})


class ProducerTimings:
    """The trainer's pool of the timings the gathering side attaches to its messages, training
    and validation minibatches alike, until the next epoch summary takes them."""

    def __init__(self):
        self.values: Dict[str, List[float]] = {}

    def add(self, producer_trace: Optional[dict]) -> None:
        for key, values in (producer_trace or {}).items():
            self.values.setdefault(key, []).extend(values)

    def drain(self) -> Dict[str, List[float]]:
        out, self.values = self.values, {}
        return out


class StepHook:
    """The points of a trainer's minibatch that a trace times, called by the training loop:
    this base class does nothing at each (the hook of a run without ``Plan.trace``,
    :data:`NO_TRACE`); :class:`TrainerTrace` records."""

    def step_begins(self, item, waited: float) -> None:
        """The host has ``item`` (a :class:`~.messages.SlotReady`) after ``waited`` seconds, and
        the current stream waits for its features; nothing of the step is issued yet."""

    def mark_arrives(self, mark) -> None:
        """An :class:`~.messages.EpochMark` arrived (with the gathering side's last timings of
        its phase)."""

    def inputs_copied(self) -> None:
        """The minibatch's blocks and labels have been issued for copying to the device."""

    def step_ends(self) -> None:
        """A training minibatch's optimiser step is issued."""

    def epoch_summary(self, epoch: int) -> Optional[TraceSummary]:
        """The trace of ``epoch``'s training, once its training has ended and the device has
        synchronised (None without a trace)."""
        return None


NO_TRACE = StepHook()


class TrainerTrace(StepHook):
    """``Plan.trace`` in the trainer: a :class:`ConsumerTrace` per epoch of its training
    minibatches (events on the current stream, the compute stream), and the gathering side's
    timings every message carries (:class:`ProducerTimings`)."""

    def __init__(self, on_gpu: bool):
        self.epochs: Dict[int, ConsumerTrace] = defaultdict(lambda: ConsumerTrace(on_gpu))
        self.producer = ProducerTimings()
        self.current: Optional[ConsumerTrace] = None  # the trace of the step in progress, if timed

    def mark_arrives(self, mark) -> None:
        self.producer.add(mark.trace)

    def step_begins(self, item, waited: float) -> None:
        self.producer.add(item.trace)
        batch = item.batch
        self.current = self.epochs[batch.epoch] if batch.phase is Phase.TRAIN else None
        if self.current is not None:
            self.current.step_begins(waited)

    def inputs_copied(self) -> None:
        if self.current is not None:
            self.current.inputs_copied()

    def step_ends(self) -> None:
        if self.current is not None:
            self.current.step_ends()

    def epoch_summary(self, epoch: int) -> TraceSummary:
        trace = self.epochs.pop(epoch, None) or ConsumerTrace(False)
        return trace.summary(self.producer)


class Stage(Enum):
    """The stages of a loader, in the order a minibatch meets them: its seeds are sampled
    (``SAMPLE``), its input rows read (``GATHER``), the loader's minibatch object made
    (``BUILD``: PyG's ``Data``, DGL's blocks), and handed to the training loop (``DELIVER``:
    with the process way, the time the loop waits for it and takes it out of the ring)."""

    SAMPLE = "sample"
    GATHER = "gather"
    BUILD = "build"
    DELIVER = "deliver"


class StageTimes:
    """Milliseconds each minibatch spent in each :class:`Stage` of a loader; a loader whose
    ``stage_times`` is one records into it.

    Stages that run in the calling process are timed on the host around the stage. GPU work is
    asynchronous: with ``synchronize`` the timer waits for the GPU before and after each stage,
    so a stage's GPU work counts in its own time (and stages no longer overlap: a diagnostic,
    not a timing of the run). Stages that run in the loader's processes report the times their
    process measured (GPU time between events there, no synchronisation)."""

    def __init__(self, synchronize: bool = False):
        self.synchronize = bool(synchronize)
        self.values: Dict[Stage, List[float]] = {s: [] for s in Stage}

    def _sync(self) -> None:
        if self.synchronize and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    def begin(self) -> float:
        """The start of a timed stretch (pass it to :meth:`end`)."""
        self._sync()
        return time.perf_counter()

    def end(self, stage: Stage, began: float) -> None:
        """Adds the stretch since ``began`` to ``stage``."""
        self._sync()
        self.values[stage].append((time.perf_counter() - began) * 1e3)

    @contextlib.contextmanager
    def timed(self, stage: Stage):
        """Adds the time the ``with`` body takes to ``stage``."""
        began = self.begin()
        try:
            yield
        finally:
            self.end(stage, began)

    def add(self, stage: Stage, ms: Sequence[float]) -> None:
        self.values[stage].extend(ms)

    def summary(self) -> Dict[str, Dict[str, float]]:
        """:func:`summarise` of each stage's times, by the stage's value."""
        return {s.value: summarise(v) for s, v in self.values.items()}

    def clear(self) -> None:
        for v in self.values.values():
            v.clear()


class _Untimed(StageTimes):
    """The stage times of a loader asked for none: every call records nothing."""

    _NOTHING = contextlib.nullcontext()

    def begin(self) -> float:
        return 0.0

    def end(self, stage: Stage, began: float) -> None:
        pass

    def timed(self, stage: Stage):
        return self._NOTHING

    def add(self, stage: Stage, ms: Sequence[float]) -> None:
        pass


UNTIMED = _Untimed()


def stage_timer(times: Optional[StageTimes]) -> StageTimes:
    """What a loader's stages record into: ``times``, or :data:`UNTIMED` when it is None
    (decided where a minibatch's stages begin, not at each stage)."""
    return UNTIMED if times is None else times
