"""The sampler -> producer -> trainer pipeline on the CPU: ring hand-off and end to end (the ring
also on a GPU, with the producer sampling there)."""

import itertools
import queue
import threading
import time
from dataclasses import replace

import pytest
import torch

from pytorch_zerocopy.datasets import community_graph
from test_pipeline_failures import _assert_nothing_left, snapshot
from pytorch_zerocopy.pipeline import EpochStats, Mode, Phase, Plan, SampleOn, StepDone, run_pipeline
from pytorch_zerocopy.pipeline.messages import (EpochMark, FreeEvents, FreeSlots, Minibatch, RingHandles, SlotReady,
                                                SlotsReady)
from pytorch_zerocopy.pipeline.minibatches import epoch_batches
from pytorch_zerocopy.pipeline.producer import group_sizes, producer_main
from pytorch_zerocopy.pipeline.ring import RingReader, RingWriter
from pytorch_zerocopy.pipeline.sampler import sampler_main
from pytorch_zerocopy.train import _printer


@pytest.fixture(scope="module")
def small():
    return community_graph(num_nodes=6000, feature_dim=64, seed=11)


def cpu_ring(**settings) -> Plan:
    """The CPU pipeline's plan: CPU sampler processes, a producer gathering into host slots."""
    return Plan(mode=Mode.ZEROCOPY, device="cpu", sample_on=SampleOn.CPU, **settings)


class StallingQueue(queue.Queue):
    """A queue that reports when a reader finds it empty (the reader is about to block)."""

    def __init__(self):
        super().__init__()
        self.stalled = threading.Event()

    def get(self, block=True, timeout=None):
        if self.empty():
            self.stalled.set()
        return super().get(block, timeout)


class _Done(threading.Event):
    """Stands in for the consumer's end-of-run event: the sampler must not block on it here."""

    def wait(self, timeout=None):
        return True


def test_ring_handoff_keeps_order_and_ownership(small):
    """The producer runs as far ahead as the ring allows; a slot held by the consumer is never
    overwritten; minibatches and epoch marks arrive in the order they were sampled."""
    plan = cpu_ring(num_slots=2, batch_size=200, epochs=2, max_batches=4, val_batches=2, fanouts=(5, 5))
    batch_q, ready_q, free_q = queue.Queue(), queue.Queue(), StallingQueue()
    sampler_main(plan, small, 0, batch_q, _Done())
    expected = list(batch_q.queue)
    producer = threading.Thread(target=producer_main, args=(plan, small, batch_q, ready_q, free_q), daemon=True)
    producer.start()
    source = RingReader(ready_q, free_q, torch.device("cpu"))
    seen, slots_used = [], set()
    for item, feats in source:
        seen.append(item)
        if isinstance(item, EpochMark):
            continue
        assert isinstance(item, SlotReady)
        # Wait until the producer is blocked for want of a free slot (it has run ahead as far
        # as it can); the slot we hold must still hold our minibatch's rows.
        free_q.stalled.wait(10)
        assert torch.equal(feats, small.features[item.batch.input_nodes])
        assert feats.shape[0] == item.batch.input_nodes.numel()
        slots_used.add(item.slot)
        free_q.stalled.clear()
        source.release(item)
    source.close()
    producer.join(10)
    assert not producer.is_alive()
    assert slots_used == {0, 1}
    assert len(seen) == len(expected) - 1  # all but the end marker
    for got, want in zip(seen, expected):
        if isinstance(want, EpochMark):
            assert got == want
        else:
            assert (got.batch.phase, got.batch.epoch, got.batch.step) == (want.phase, want.epoch, want.step)
            assert torch.equal(got.batch.input_nodes, want.input_nodes)


@pytest.mark.parametrize("group", [1, 3])
def test_slots_grow_and_are_reshared(small, device, monkeypatch, group):
    """A minibatch larger than its slot makes the producer grow the slot and send the new
    buffer with the minibatch; the trainer switches to it. With ``group`` > 1 the rows of
    ``group`` minibatches are gathered by one call and copied to their slots. On CUDA this runs
    the GPU ring (CUDA events, device slots) within one process with the producer sampling on
    the GPU itself: its minibatches, uploaded into the slots, equal the CPU sampler's."""
    import pytorch_zerocopy.pipeline.ring as ring

    monkeypatch.setattr(ring, "slot_capacity", lambda plan, ds, budget_bytes=0: 7)
    settings = dict(num_slots=2 * group, batch_size=100, epochs=1, max_batches=7, val_batches=2, fanouts=(3, 3),
                    gather_batches=group)
    reference = queue.Queue()
    sampler_main(cpu_ring(**settings), small, 0, reference, _Done())
    sampled = {(b.phase, b.step): b for b in reference.queue if isinstance(b, Minibatch)}
    if device == "cuda":
        plan = Plan(mode=Mode.ZEROCOPY, device="cuda:0", sample_on=SampleOn.GPU, num_samplers=0, **settings)
        batch_q = None
    else:
        plan, batch_q = cpu_ring(**settings), reference
    ready_q, free_q = queue.Queue(), queue.Queue()
    producer = threading.Thread(target=producer_main, args=(plan, small, batch_q, ready_q, free_q), daemon=True)
    producer.start()
    source = RingReader(ready_q, free_q, torch.device(plan.device))
    grown = packed_grown = seen_batches = 0
    for item, feats in source:
        if isinstance(item, EpochMark):
            continue
        grown += item.buffer is not None
        packed_grown += item.packed_buffer is not None
        assert feats.device.type == device
        # GPU slots carry the minibatch's packed tensor, written by the producer.
        assert item.batch.packed.device.type == device
        want = sampled[(item.batch.phase, item.batch.step)]
        assert item.batch.layout == want.layout
        assert torch.equal(item.batch.packed.cpu(), want.packed)
        assert torch.equal(feats.cpu(), small.features[item.batch.input_nodes.cpu()])
        seen_batches += 1
        source.release(item)
    source.close()
    producer.join(30)
    assert not producer.is_alive()
    assert grown >= 2  # slots grew
    assert packed_grown >= (2 if device == "cuda" else 0)
    assert seen_batches == 7 + 2 + 2  # training, validation, test


def test_each_phase_starts_with_small_groups(small, monkeypatch):
    """From the run's start and after every epoch mark the producer gathers groups of 1, 1, 2,
    2, 4, 4, ... minibatches up to ``gather_batches`` (the trainer's first minibatch of a phase
    waits for one gather), the last group of a phase cut at its mark; every minibatch arrives
    with its own rows."""
    import pytorch_zerocopy.pipeline.producer as producer

    calls = []
    gather = producer._GroupGather.__call__

    def recording(self, slots, batches):
        calls.append(len(batches))
        return gather(self, slots, batches)

    monkeypatch.setattr(producer._GroupGather, "__call__", recording)
    plan = cpu_ring(num_slots=8, gather_batches=4, batch_size=100, epochs=2, max_batches=9, val_batches=3,
                    fanouts=(3, 3))
    batch_q, ready_q, free_q = queue.Queue(), queue.Queue(), queue.Queue()
    sampler_main(plan, small, 0, batch_q, _Done())
    phases, run = [], 0
    for item in list(batch_q.queue):
        if isinstance(item, Minibatch):
            run += 1
        elif isinstance(item, EpochMark) and run:
            phases.append(run)
            run = 0
    want = []
    for n in phases:
        for size in (1, 1, 2, 2, 4, 4, 4, 4, 4):
            if n:
                want.append(min(size, n))
                n -= want[-1]
    thread = threading.Thread(target=producer_main, args=(plan, small, batch_q, ready_q, free_q), daemon=True)
    thread.start()
    source = RingReader(ready_q, free_q, torch.device("cpu"))
    delivered = 0
    for item, feats in source:
        if isinstance(item, SlotReady):
            assert torch.equal(feats, small.features[item.batch.input_nodes])
            delivered += 1
            source.release(item)
    source.close()
    thread.join(30)
    assert not thread.is_alive()
    assert phases[:3] == [9, 3, 9] and delivered == sum(phases)
    assert calls == want  # 9 training minibatches: 1, 1, 2, 2, 3; 3 validation: 1, 1, 1; ...


@pytest.mark.parametrize("limit, first", [(1, [1, 1, 1]), (2, [1, 1, 2, 2, 2]), (8, [1, 1, 2, 2, 4, 4, 8, 8]),
                                          (6, [1, 1, 2, 2, 4, 4, 6, 6])])
def test_group_sizes_repeat_each_size_before_growing(limit, first):
    assert list(itertools.islice(group_sizes(limit), len(first))) == first


def test_ring_reader_refuses_a_message_it_does_not_know():
    """Anything but slots, an epoch mark, a gatherer's failure or the end on the ready queue is
    a clear error, not a minibatch read from garbage."""
    ready_q, free_q = queue.Queue(), queue.Queue()
    ready_q.put(RingHandles([torch.zeros(4, 2)]))
    reader = RingReader(ready_q, free_q, torch.device("cpu"))
    ready_q.put(SlotReady(0, 1, None))  # a bare slot: slots travel in a SlotsReady
    with pytest.raises(RuntimeError, match="expected slots or an epoch mark from the producer"):
        next(iter(reader))


def test_ring_reader_gives_a_groups_slots_back_together():
    """A group's slots go back to the producer in one message once the last of them is
    released, in any order; a slot released twice (or never received) is a clear error."""
    ready_q, free_q = queue.Queue(), queue.Queue()
    ready_q.put(RingHandles([torch.zeros(4, 2) for _ in range(4)]))
    reader = RingReader(ready_q, free_q, torch.device("cpu"))
    assert isinstance(free_q.get_nowait(), FreeEvents)
    ready_q.put(SlotsReady([SlotReady(s, 1, None) for s in (2, 0, 3)]))
    ready_q.put(SlotsReady([SlotReady(1, 1, None)]))
    items = iter(reader)
    group = [next(items)[0] for _ in range(3)]
    reader.release(group[1])
    reader.release(group[0])
    assert free_q.empty()  # one slot of the group is still the trainer's
    alone = next(items)[0]
    reader.release(alone)
    reader.release(group[2])
    assert free_q.get_nowait() == FreeSlots((1,))
    assert free_q.get_nowait() == FreeSlots((0, 2, 3))
    with pytest.raises(RuntimeError, match="slot 1 was released twice, or never received"):
        reader.release(alone)


def test_copy_out_slot_copies_a_slots_rows_and_cuts_its_packed_copy():
    """The trainer's copy-out of a slot (one call): the first n rows and the first sum(cuts)
    packed values, as new tensors (later writes to the slot leave them alone), the packed copy
    cut into views of it; a call that would read past the slot is a clear error."""
    from pytorch_zerocopy.unified import _C

    gen = torch.Generator().manual_seed(21)
    for _ in range(20):
        rows = torch.randn(int(torch.randint(1, 60, (1,), generator=gen)), 3, generator=gen)
        packed = torch.randint(-99, 99, (int(torch.randint(0, 80, (1,), generator=gen)),), generator=gen)
        n = int(torch.randint(0, rows.shape[0] + 1, (1,), generator=gen))
        cuts, left = [], int(torch.randint(0, packed.numel() + 1, (1,), generator=gen))
        while left:
            cuts.append(int(torch.randint(0, left + 1, (1,), generator=gen)))
            left -= cuts[-1]
        got_rows, got_packed, *pieces = _C.copy_out_slot(rows, n, packed, cuts + [0])
        want_rows, want_packed = rows[:n].clone(), packed[:sum(cuts)].clone()
        rows.fill_(float("nan"))
        packed.fill_(-12345)  # the slot refilled: the copies keep what it held
        assert torch.equal(got_rows, want_rows) and torch.equal(got_packed, want_packed)
        assert [p.numel() for p in pieces] == cuts + [0] and torch.equal(torch.cat(pieces), want_packed)
        if pieces[0].numel():
            pieces[0][0] = 7  # views of the packed copy
            assert int(got_packed[0]) == 7
    rows, packed = torch.zeros(4, 2), torch.arange(6)
    with pytest.raises(ValueError, match=r"n must be in \[0, 4\]"):
        _C.copy_out_slot(rows, 5, packed, [])
    with pytest.raises(ValueError, match="add up to at most the slot's packed values"):
        _C.copy_out_slot(rows, 1, packed, [4, 3])
    with pytest.raises(ValueError, match="must be >= 0"):
        _C.copy_out_slot(rows, 1, packed, [-1, 2])
    with pytest.raises(ValueError, match="packed must be a 1-D tensor"):
        _C.copy_out_slot(rows, 1, packed.view(2, 3), [1])
    with pytest.raises(TypeError, match="packed must be Long"):
        _C.copy_out_slot(rows, 1, packed.int(), [1])
    with pytest.raises(ValueError, match="same device"):
        _C.copy_out_slot(rows, 1, packed.to("meta"), [1])


def test_ring_writer_takes_slots_given_back_in_groups(small):
    """The producer's end takes the ring's unused slots first, then those given back, a group's
    at a time, in order; anything else on the free queue is a clear error."""
    ready_q, free_q = queue.Queue(), queue.Queue()
    free_q.put(FreeEvents([]))
    writer = RingWriter(cpu_ring(num_slots=3, batch_size=4, fanouts=(2,)), small, torch.device("cpu"), ready_q, free_q)
    assert writer.take(2) == [0, 1]
    free_q.put(FreeSlots((1, 0)))
    assert writer.take(3) == [2, 1, 0]
    free_q.put(7)
    with pytest.raises(RuntimeError, match="expected slots given back by the trainer, got 7"):
        writer.take(1)


def test_sampler_replay_and_packing(small):
    """Replay sends the first ``replay`` samples again in turn; a minibatch's tensors unpack
    from one packed tensor to exactly what was sampled."""
    plan = cpu_ring(batch_size=200, epochs=1, max_batches=5, val_batches=1, fanouts=(3, 3), replay=2)
    q = queue.Queue()
    sampler_main(plan, small, 0, q, _Done())
    train = [m for m in list(q.queue) if isinstance(m, Minibatch) and m.phase is Phase.TRAIN]
    assert [m.step for m in train] == [0, 1, 2, 3, 4]
    assert torch.equal(train[2].packed, train[0].packed) and torch.equal(train[3].packed, train[1].packed)
    assert not torch.equal(train[0].input_nodes, train[1].input_nodes)
    m = train[1]
    # Seeds come first among the input nodes (DGL's convention), so their labels line up.
    assert torch.equal(m.labels, small.labels[m.input_nodes[:200]])
    assert m.blocks[-1].num_dst_nodes() == 200 and m.blocks[0].num_src_nodes() == m.input_nodes.numel()
    assert m.labels.numel() == 200
    assert train[1].sample_ms > 0 and train[3].sample_ms == 0  # replayed: nothing was sampled


def test_epoch_batches_cover_the_split(small):
    plan = Plan(batch_size=333, epochs=2)
    a = torch.cat(epoch_batches(plan, small, 0, Phase.TRAIN))
    b = torch.cat(epoch_batches(plan, small, 1, Phase.TRAIN))
    assert torch.equal(a.sort().values, small.train_idx.sort().values)
    assert not torch.equal(a, b)  # reshuffled per epoch
    assert torch.equal(torch.cat(epoch_batches(plan, small, 0, Phase.VAL)), small.val_idx)
    assert len(epoch_batches(replace(plan, max_batches=2), small, 0, Phase.TRAIN)) == 2
    # Ranks take equal, disjoint shares of the same permutation.
    shares = [torch.cat(epoch_batches(replace(plan, rank=r, world_size=3), small, 0, Phase.TRAIN)) for r in range(3)]
    assert len({s.numel() for s in shares}) == 1
    assert torch.cat(shares).unique().numel() == sum(s.numel() for s in shares)


def test_cpu_pipeline_trains_end_to_end(small):
    """Three processes (two samplers), ring in shared memory, CPU training: accuracy far above
    chance (1/16) after two short epochs, and every minibatch accounted for."""
    plan = cpu_ring(num_slots=3, num_samplers=2, batch_size=256, epochs=2, fanouts=(8, 8), hidden=64, lr=1e-2,
                    consumer_threads=2)
    messages, pids = [], {}
    before = snapshot()
    epochs = run_pipeline(plan, small, messages.append, on_start=pids.update)
    assert len(pids) == 4
    _assert_nothing_left(pids, before)
    assert all(isinstance(e, EpochStats) for e in epochs) and [e.epoch for e in epochs] == [0, 1]
    n_train = -(-small.train_idx.numel() // 256)
    assert all(e.train_batches == n_train for e in epochs)
    assert all(e.val_nodes == small.val_idx.numel() for e in epochs)
    steps = [m for m in messages if isinstance(m, StepDone)]
    n_test = -(-small.test_idx.numel() // 256)
    assert len(steps) == 2 * (n_train + -(-small.val_idx.numel() // 256)) + n_test
    # The test split is evaluated once, after the last epoch, and reported with it.
    assert epochs[0].test_nodes == 0 and epochs[0].test_acc != epochs[0].test_acc  # nan
    assert epochs[-1].test_nodes == small.test_idx.numel() and epochs[-1].test_acc > 0.5
    # `zerocopy train`'s progress bars count each phase's minibatches: the training bar's total
    # is what the epoch's summary reports, and what arrives.
    totals = _printer(plan, small, quiet=True).totals
    for e in epochs:
        for phase, want in ((Phase.TRAIN, e.train_batches), (Phase.VAL, None), (Phase.TEST, None)):
            arrived = sum(1 for m in steps if m.epoch == e.epoch and m.phase is phase)
            if phase is Phase.TEST and e.epoch != epochs[-1].epoch:
                assert arrived == 0
                continue
            assert arrived == totals[phase] and (want is None or want == arrived)
    assert epochs[-1].val_acc > 0.5
    assert epochs[-1].loss < epochs[0].loss
    assert all(e.feature_bytes > 0 and e.train_seconds > 0 for e in epochs)
    # Steady-state figures leave out each epoch's first minibatch.
    assert all(e.steady_batches == n_train - 1 and 0 < e.steady_bytes < e.feature_bytes for e in epochs)
    # The trainer's wait for input is part of the steady-state time.
    assert all(0 <= e.steady_wait_seconds <= e.steady_seconds for e in epochs)
    assert [m for m in messages if isinstance(m, EpochStats)] == epochs


def test_run_pipeline_needs_a_plan(small):
    with pytest.raises(TypeError, match="needs a Plan"):
        run_pipeline({"mode": "zerocopy"}, small)


def test_trace_records_every_steady_minibatch(small):
    """With ``trace``, each epoch's statistics carry one timing per steady-state training
    minibatch for the consumer, and the producer's host timings for the minibatches it gathered."""
    plan = cpu_ring(num_slots=2, batch_size=512, epochs=2, fanouts=(5, 5), hidden=32, trace=True)
    epochs = run_pipeline(plan, small)
    n_train = -(-small.train_idx.numel() // 512)
    n_val = -(-small.val_idx.numel() // 512)
    for e in epochs:
        tr = e.trace
        assert len(tr.per_step["issue_ms"]) == len(tr.per_step["input_wait_ms"]) == n_train - 1
        assert "gpu_gap_ms" not in tr.per_step  # no GPU, no GPU timings
        assert tr.consumer["issue_ms"]["n"] == n_train - 1 and tr.consumer["issue_ms"]["p50"] > 0
        assert sum(tr.per_step["input_wait_ms"]) / 1e3 <= e.train_seconds
    # The producer's timings of every minibatch it gathered reach the epochs' statistics,
    # except the last epoch's validation minibatches (they come after its summary): host
    # times to issue and to gather (a CPU gather), and the sampler's host time to sample.
    for key in ("issue_ms", "gather_ms", "sample_ms", "batch_wait_ms"):
        assert sum(e.trace.producer[key]["n"] for e in epochs) == 2 * n_train + n_val, key
    assert all(e.trace.producer["sample_ms"]["p50"] > 0 and e.trace.producer["gather_ms"]["p50"] > 0 for e in epochs)
    assert run_pipeline(replace(plan, trace=False, epochs=1), small)[0].trace is None


def test_trace_summary_percentiles():
    from pytorch_zerocopy.pipeline.trace import summarise

    s = summarise([float(v) for v in range(1, 101)])
    assert (s["n"], s["p10"], s["p50"], s["p90"], s["max"], s["mean"]) == (100, 10.0, 50.0, 90.0, 100.0, 50.5)
    assert summarise([3.0]) == {"n": 1, "mean": 3.0, "max": 3.0, "p10": 3.0, "p50": 3.0, "p90": 3.0}
    assert summarise([]) == {"n": 0}


def test_cpu_roles_start_with_passive_openmp_waits(small, monkeypatch):
    """Every role of a CPU run starts with OMP_WAIT_POLICY=PASSIVE (idle OpenMP threads sleep
    rather than spin on cores the other roles need), unless the environment sets a policy."""
    import psutil

    from pytorch_zerocopy.pipeline.runner import cpu_role_environment

    plan = cpu_ring(num_slots=2, batch_size=512, epochs=1, max_batches=2, val_batches=1, fanouts=(3, 3), hidden=16)
    seen = {}

    def look(pids):
        for name, pid in pids.items():
            env, deadline = {}, time.monotonic() + 10
            while not env and time.monotonic() < deadline:  # empty while the child is still exec'ing
                env = psutil.Process(pid).environ()
            seen[name] = env.get("OMP_WAIT_POLICY")

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    run_pipeline(plan, small, on_start=look)
    assert set(seen) == {"sampler0", "producer1", "consumer2"} and set(seen.values()) == {"PASSIVE"}, seen
    assert "OMP_WAIT_POLICY" not in __import__("os").environ  # the parent's own environment is unchanged
    assert cpu_role_environment(replace(plan, mode=Mode.ZEROCOPY, device="cuda:0")) == {}
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert cpu_role_environment(plan) == {}
