"""The wrappers around the pipeline's stages: an injected failure, the replay diagnostic and
tracing wrap a stage only when the plan asks for them, and compose."""

import contextlib
from dataclasses import replace

import pytest
import torch

from pytorch_zerocopy.datasets import papers_like
from pytorch_zerocopy.pipeline import Phase, Plan
from pytorch_zerocopy.pipeline.messages import EpochMark
from pytorch_zerocopy.pipeline.minibatches import (GpuSampler, Replay, SampleStage, SampleSteps, Sampled, SeedBatch,
                                                   cpu_steps, replayed)
from pytorch_zerocopy.pipeline.plan import InjectedFailure
from pytorch_zerocopy.pipeline.process import failing
from pytorch_zerocopy.pipeline.trace import (NO_TRACE, UNTIMED, ProducerTrace, Stage, StageTimes, StepHook,
                                             TracedSampling, TrainerTrace, stage_timer)


@pytest.fixture(scope="module")
def directed():
    return papers_like(2000, avg_degree=6, feature_dim=8, num_classes=10, seed=3, device="cpu")


def _seed_batch(ds, index, phase=Phase.TRAIN, epoch=0):
    return SeedBatch(phase, epoch, index, ds.train_idx[index * 8:(index + 1) * 8])


# --- injected failures ----------------------------------------------------------------------

def test_failing_leaves_items_unwrapped_unless_the_plan_names_this_role_and_rank():
    items = iter([1, 2, 3])
    assert failing(items, Plan(), "producer") is items
    assert failing(items, Plan(inject_failure=InjectedFailure("consumer", "raise", 0)), "producer") is items
    other_rank = Plan(inject_failure=InjectedFailure("producer", "raise", 0, rank=1))
    assert failing(items, other_rank, "producer") is items
    later_attempt = Plan(inject_failure=InjectedFailure("producer", "raise", 0, attempt=5))
    assert failing(items, later_attempt, "producer") is items


def test_failing_raises_at_the_named_minibatch_counting_no_marks():
    plan = Plan(inject_failure=InjectedFailure("sampler", "raise", 2))
    items = ["a", EpochMark(0, Phase.TRAIN), "b", EpochMark(0, Phase.VAL), "c", "d"]
    got = []
    with pytest.raises(RuntimeError, match="injected failure in the sampler at minibatch 2"):
        for item in failing(items, plan, "sampler"):
            got.append(item)
    assert got == items[:4]  # minibatches 0 and 1 and the marks passed; 2 ("c") failed as it was taken


def test_failing_counts_what_its_predicate_accepts():
    plan = Plan(inject_failure=InjectedFailure("consumer", "raise", 1))
    items = [("mark", None), ("x", 1), ("mark", None), ("y", 2)]
    wrapped = failing(items, plan, "consumer", lambda got: got[0] != "mark")
    assert next(wrapped) == items[0] and next(wrapped) == items[1] and next(wrapped) == items[2]
    with pytest.raises(RuntimeError, match="at minibatch 1"):
        next(wrapped)


# --- replay ---------------------------------------------------------------------------------

def test_replayed_is_the_steps_themselves_without_replay(directed):
    steps = cpu_steps(directed, Plan(fanouts=(3, 3), batch_size=8), SampleStage())
    assert replayed(steps, None) is steps
    assert isinstance(replayed(steps, 2), Replay)


def test_replay_keeps_finished_samples_per_phase_and_sends_them_again(directed):
    plan = Plan(fanouts=(3, 3), batch_size=8)
    calls = []
    inner = cpu_steps(directed, plan, SampleStage())
    steps = SampleSteps(lambda b: calls.append(b.index) or inner.start(b), inner.finish)
    replay = Replay(steps, 2)
    # Two starts in flight before either finishes: both sample (nothing is kept until finished).
    first = [replay.start(_seed_batch(directed, i)) for i in range(2)]
    outs = [replay.finish(_seed_batch(directed, i), s) for i, s in enumerate(first)]
    again = [replay.finish(b, replay.start(b)) for b in (_seed_batch(directed, i) for i in range(2, 5))]
    assert calls == [0, 1]
    assert [m.step for m in again] == [2, 3, 4]
    assert again[0].packed is outs[0].packed and again[1].packed is outs[1].packed
    assert again[2].packed is outs[0].packed and all(m.sample_ms == 0 for m in again)
    val = _seed_batch(directed, 0, Phase.VAL)
    replay.finish(val, replay.start(val))
    assert calls == [0, 1, 0]  # each phase keeps its own


class _Event:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def record(self, stream=None):
        self.log.append((self.name, stream))


class _GpuTrace(ProducerTrace):
    """A GPU trace whose events log where they are recorded (no GPU needed)."""

    def __init__(self, log):
        super().__init__(on_gpu=True)
        self.log, self.made = log, 0

    def span(self):
        self.made += 1
        return _Event(self.log, f"begin{self.made}"), _Event(self.log, f"end{self.made}")


def test_traced_sampling_records_a_span_on_the_stream_around_each_step_and_composes_with_replay(directed):
    log = []
    stream = object()
    plan = Plan(fanouts=(3, 3), batch_size=8)
    inner = cpu_steps(directed, plan, SampleStage())
    steps = SampleSteps(lambda b: log.append(("start", b.index)) or inner.start(b),
                        lambda b, s: log.append(("finish", b.index)) or Sampled(inner.finish(b, s)))
    traced = TracedSampling(steps, _GpuTrace(log), stream)
    b0 = _seed_batch(directed, 0)
    out = traced.finish(b0, traced.start(b0))
    assert log == [("begin1", stream), ("start", 0), ("end1", stream),
                   ("begin2", stream), ("finish", 0), ("end2", stream)]
    assert len(out.spans) == 2 and out.spans[0][0].name == "begin1" and out.spans[1][1].name == "end2"
    assert out.issued > 0.0  # both steps' host time, the sizes' wait left out
    # Replay outside tracing: a replayed sample is neither sampled nor timed, and carries no spans.
    chain = replayed(traced, 1)
    kept = chain.finish(b0, chain.start(b0))
    log.clear()
    b1 = _seed_batch(directed, 1)
    again = chain.finish(b1, chain.start(b1))
    assert log == [] and again.spans == () and again.batch.packed is kept.batch.packed and again.batch.step == 1


def test_gpu_sampler_holds_no_wrapper_by_default(directed, monkeypatch):
    from pytorch_zerocopy.graph import CSRGraph

    host_to = CSRGraph.to
    monkeypatch.setattr(CSRGraph, "to", lambda self, placement, device=None: host_to(self, "cpu"))
    monkeypatch.setattr(torch.cuda, "Stream", lambda *a, **k: object())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    plan = Plan(fanouts=(3, 3), batch_size=8)
    plain = GpuSampler(plan, directed, torch.device("cpu"))
    assert type(plain.steps) is SampleSteps and plain.steps.start == plain._start
    # A host trace (host slots) times nothing on the sampling stream: still no wrapper.
    assert type(GpuSampler(plan, directed, torch.device("cpu"), trace=ProducerTrace(False)).steps) is SampleSteps
    traced = GpuSampler(plan, directed, torch.device("cpu"), trace=_GpuTrace([]))
    assert isinstance(traced.steps, TracedSampling)
    both = GpuSampler(replace(plan, replay=2), directed, torch.device("cpu"), trace=_GpuTrace([]))
    assert isinstance(both.steps, Replay) and isinstance(both.steps.steps, TracedSampling)


# --- the trainer's hook and a loader's stage times ------------------------------------------

def test_no_trace_hook_records_nothing_and_a_trainer_trace_times_training_steps_only():
    assert type(NO_TRACE) is StepHook and NO_TRACE.epoch_summary(0) is None
    from pytorch_zerocopy.pipeline.messages import SlotReady

    class _Batch:
        def __init__(self, phase, epoch):
            self.phase, self.epoch = phase, epoch

    trace = TrainerTrace(on_gpu=False)
    for phase, waited in ((Phase.TRAIN, 0.5), (Phase.TRAIN, 0.25), (Phase.VAL, 9.0)):
        item = SlotReady(-1, 1, _Batch(phase, 0), trace={"gather_ms": [1.0]})
        trace.step_begins(item, waited)
        trace.inputs_copied()
        if phase is Phase.TRAIN:
            trace.step_ends()
    summary = trace.epoch_summary(0)
    assert summary.per_step["input_wait_ms"] == [250.0]  # the first step (the fill) is left out
    assert summary.producer["gather_ms"]["n"] == 3  # every message's producer timings, validation's too
    assert trace.epoch_summary(0).per_step["input_wait_ms"] == []


def test_stage_timer_of_none_records_nothing():
    times = StageTimes()
    assert stage_timer(times) is times and stage_timer(None) is UNTIMED
    with UNTIMED.timed(Stage.SAMPLE):
        pass
    UNTIMED.end(Stage.DELIVER, UNTIMED.begin())
    UNTIMED.add(Stage.GATHER, [1.0])
    assert all(v == [] for v in UNTIMED.values.values())
    with times.timed(Stage.SAMPLE):
        pass
    assert len(times.values[Stage.SAMPLE]) == 1


def test_seed_batches_travel_by_value():
    """A seed batch put on a queue carries its seeds inline, not as a shared-memory handle
    (whose receiver would connect back to the sender for each batch), and arrives equal."""
    import pickle
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 - registers torch's tensor reductions, as the queues do

    seeds = torch.randperm(5000)[:1024]
    data = bytes(ForkingPickler.dumps(SeedBatch(Phase.TRAIN, 3, 7, seeds[::1], 11)))
    assert len(data) >= seeds.numel() * seeds.element_size()
    got = pickle.loads(data)
    assert (got.phase, got.epoch, got.index, got.sample_seed) == (Phase.TRAIN, 3, 7, 11)
    assert torch.equal(got.seeds, seeds) and got.seeds.dtype == torch.int64
    strided = pickle.loads(bytes(ForkingPickler.dumps(SeedBatch(Phase.VAL, 0, 0, seeds[::3]))))
    assert torch.equal(strided.seeds, seeds[::3]) and strided.carried is None
    carried = pickle.loads(bytes(ForkingPickler.dumps(SeedBatch(Phase.TRAIN, 0, 1, seeds, None, seeds[::2] + 1))))
    assert torch.equal(carried.carried, seeds[::2] + 1) and torch.equal(carried.seeds, seeds)


@pytest.mark.cuda
def test_producer_trace_take_all_waits_for_pending_spans():
    """take() returns the GPU timings complete so far; take_all() (at an epoch mark) waits for
    the pending ones, so the mark carries every timing of its phase not yet sent."""
    trace = ProducerTrace(on_gpu=True)
    span = trace.span()
    span[0].record()
    torch.cuda._sleep(50_000_000)  # keeps the end event pending for a while
    span[1].record()
    trace.gpu("gather_ms", [span], 2)
    assert trace.take()["gather_ms"] == []
    got = trace.take_all()["gather_ms"]
    assert len(got) == 2 and got[0] == got[1] > 0
    assert trace.take_all()["gather_ms"] == [] and not trace.pending


def test_epoch_marks_equal_by_what_they_mark():
    """A mark's producer timings do not take part in its equality."""
    assert EpochMark(1, Phase.TRAIN, trace={"gather_ms": [1.0]}) == EpochMark(1, Phase.TRAIN)
