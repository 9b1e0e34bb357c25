"""The machine's gatherer (``gather_in='machine'``): one process samples and gathers for every
trainer of the machine, over a ring per trainer on one connection each. On the CPU everywhere
(host slots, gloo ranks); on GPUs the same runs read one table from every GPU."""

import socket

import pytest
import torch

from pytorch_zerocopy import FeatureTable
from pytorch_zerocopy.pipeline import GatherIn, Mode, Plan, PlanError, PipelineError, SampleOn, make_plan, run_pipeline
from pytorch_zerocopy.pipeline.machine import LinkClosed, SlotPool, connect
from pytorch_zerocopy.pipeline.messages import FreeEvents, RingHandles, StepDone, TableReady
from pytorch_zerocopy.pipeline.ring import RingWriter, SlotBuffers
from pytorch_zerocopy.pipeline.plan import InjectedFailure
from pytorch_zerocopy.train import train_data_parallel
from pytorch_zerocopy.datasets import community_graph
from test_pipeline_failures import _assert_nothing_left, _run_with_deadline, snapshot

needs_two_gpus = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                                    reason="needs 2 GPUs")
@pytest.fixture(scope="module")
def tiny():
    return community_graph(num_nodes=3000, feature_dim=16, seed=2)


RUN = dict(batch_size=100, epochs=2, fanouts=(4, 4), hidden=16, max_batches=5, val_batches=2, cuda_graph=False)


def _cpu_plan(gather_in: str, **settings) -> Plan:
    return make_plan("zerocopy", gpu=False, gather_in=gather_in, **{**RUN, **settings})


def _summary(epochs):
    return [(e.epoch, e.train_batches, e.loss, e.val_acc, e.test_acc if e.test_nodes else None, e.param_checksum,
             e.feature_bytes) for e in epochs]


def test_the_plan_names_the_machines_gatherer():
    plan = _cpu_plan("machine")
    assert plan.gather_in is GatherIn.MACHINE and plan.num_samplers == 0 and plan.sampler_processes == 0
    assert plan.mark_sources == 1
    assert "sampling on the CPU in the machine's gatherer process" in plan.describe()
    assert make_plan("zerocopy", gpu=False, local_processes=2).gather_in is GatherIn.PRODUCER  # the CPU path stays


@pytest.mark.parametrize("settings, setting, words", [
    (dict(mode=Mode.CPU, gather_in="machine", num_samplers=0), "gather_in", "applies to mode 'zerocopy'"),
    (dict(gather_in="machine", num_samplers=2), "num_samplers", "0 with gather_in 'machine'"),
])
def test_the_plan_refuses_a_machine_gatherer_that_cannot_work(settings, setting, words):
    with pytest.raises(PlanError, match=words) as e:
        Plan(**{**dict(device="cpu", sample_on=SampleOn.CPU), **settings})
    assert e.value.setting == setting


def test_one_pipeline_trains_as_with_its_own_producer(tiny):
    """The same minibatches, gathered by the machine's gatherer or by a producer, train the same
    model; the gatherer ends with the run, leaving nothing."""
    before, pids, messages = snapshot(), {}, []
    machine = run_pipeline(_cpu_plan("machine"), tiny, on_start=pids.update, on_message=messages.append)
    assert sorted(k.rstrip("0123456789") for k in pids) == ["consumer", "gatherer"]
    _assert_nothing_left(pids, before)
    producer = run_pipeline(_cpu_plan("producer"), tiny)
    assert _summary(machine) == _summary(producer)
    # The gatherer's table, reported once by the trainer before its first minibatch.
    (table,) = [m for m in messages if isinstance(m, TableReady)]
    assert table.nbytes == tiny.num_nodes * tiny.row_bytes and table.seconds >= 0
    assert messages.index(table) < min(i for i, m in enumerate(messages) if isinstance(m, StepDone))


def test_two_ranks_share_one_gatherer(tiny):
    """Two gloo ranks, one gatherer serving both: each rank trains what it trains with a producer
    of its own, and the ranks end with the same parameters."""
    settings = dict(RUN, use_gpu=False, quiet=True)
    machine = train_data_parallel(tiny, 2, "zerocopy", gather_in="machine", **settings)
    producer = train_data_parallel(tiny, 2, "zerocopy", gather_in="producer", **settings)
    assert {r: _summary(e) for r, e in machine.items()} == {r: _summary(e) for r, e in producer.items()}
    assert machine[0][-1].param_checksum == pytest.approx(machine[1][-1].param_checksum, rel=1e-6)


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_gatherer_ends_the_run_with_its_traceback(tiny, how):
    """A failure while serving (its thread raises) reaches the trainer, which raises it; a
    gatherer that dies closes the trainer's connection, which ends the run: no hang, nothing
    left."""
    before = snapshot()
    plan = _cpu_plan("machine", inject_failure=InjectedFailure("producer", how, 2))
    error, pids, _ = _run_with_deadline(plan, tiny)
    assert isinstance(error, PipelineError), f"expected a PipelineError, got {error!r}"
    if how == "raise":
        assert "injected failure in the producer at minibatch 2" in str(error)
    else:
        assert "SIGKILL" in str(error) or "the machine's gatherer closed the connection" in str(error)
    _assert_nothing_left(pids, before)


def test_a_trainer_without_a_gatherer_gets_one_line(tmp_path):
    with pytest.raises(LinkClosed, match="cannot reach the machine's gatherer"):
        connect(str(tmp_path / "nobody.sock"), _cpu_plan("machine"))


def test_a_gatherer_that_closes_is_a_clear_error(tmp_path):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "g.sock"))
    server.listen(1)
    link = connect(str(tmp_path / "g.sock"), _cpu_plan("machine"))
    peer, _ = server.accept()
    peer.close()
    with pytest.raises(LinkClosed, match="the machine's gatherer closed the connection"):
        link.get()
    link.close()
    server.close()


def _slot_buffers(plan, ds, device="cpu", width=None):
    width = ds.feature_dim if width is None else width
    return SlotBuffers([torch.empty(8, width, dtype=ds.feature_dtype, device=device) for _ in range(plan.num_slots)],
                       [torch.empty(8, dtype=torch.int64, device=device) for _ in range(plan.num_slots)])


def test_the_slot_pool_hands_a_set_only_to_a_ring_it_fits(tiny):
    """A trainer's ring buffers wait for the next trainer of the same device and plan: a set of
    another width or slot count, or of another device, is not handed out."""
    plan, cpu = _cpu_plan("machine"), torch.device("cpu")
    pool = SlotPool()
    assert pool.take(plan, tiny, cpu) is None
    wrong_width = _slot_buffers(plan, tiny, width=tiny.feature_dim + 1)
    right = _slot_buffers(plan, tiny)
    pool.give(cpu, wrong_width)
    pool.give(cpu, None)  # a host-slot ring leaves nothing
    assert pool.take(plan, tiny, cpu) is None and pool.held(cpu) == 1
    pool.give(cpu, right)
    assert pool.take(plan, tiny, torch.device("cuda", 0)) is None
    assert pool.take(Plan(**{**plan.__dict__, "num_slots": plan.num_slots + 1}), tiny, cpu) is None
    assert pool.take(plan, tiny, cpu) is right and pool.held(cpu) == 1
    assert pool.take(plan, tiny, cpu) is None


def _handshake_queues(events):
    import queue

    ready, free = queue.Queue(), queue.Queue()
    free.put(FreeEvents(events))
    return ready, free


# --- GPU ------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_a_ring_takes_over_the_buffers_a_gone_trainers_ring_left(tiny):
    """The next trainer of a GPU gets the same buffers (shared again), not new ones: a gatherer
    that outlives elastic restarts holds one set per trainer, however many trainers went."""
    plan = make_plan("zerocopy", gather_in="machine", **RUN)
    device = torch.device("cuda", 0)
    events = [torch.cuda.Event(interprocess=True) for _ in range(plan.num_slots)]
    for ev in events:
        ev.record()
    first = RingWriter(plan, tiny, device, *_handshake_queues(events))
    first.buffers[0].fill_(float("nan"))  # GPU work of the first writer, finished before the hand-over
    left = first.buffers_for_reuse()
    ptrs = [b.data_ptr() for b in first.buffers + first.packed]
    del first
    allocated = torch.cuda.memory_allocated(device)
    ready, free = _handshake_queues(events)
    second = RingWriter(plan, tiny, device, ready, free, reuse=left)
    assert [b.data_ptr() for b in second.buffers + second.packed] == ptrs
    assert torch.cuda.memory_allocated(device) == allocated
    handles = ready.get_nowait()
    assert isinstance(handles, RingHandles) and handles.buffers[0].data_ptr() == ptrs[0]
    other_width = _slot_buffers(plan, tiny, device, width=tiny.feature_dim + 3)
    third = RingWriter(plan, tiny, device, *_handshake_queues(events), reuse=other_width)
    assert third.buffers[0].shape[1] == tiny.feature_dim and third.buffers[0].data_ptr() not in ptrs
    del second, third, left, other_width
    torch.cuda.empty_cache()


@pytest.mark.cuda
@needs_two_gpus
@pytest.mark.parametrize("placement", ["managed", "unified"])
def test_a_host_table_is_read_in_place_by_another_gpu(placement):
    """``for_device``: the same host memory read by GPU 1, no copy; the rows equal the source's
    for fresh random ids, into a poisoned output."""
    rows = torch.randn(1 << 22, 64)  # 1 GiB: a copy on GPU 1 would show in its free memory
    table = FeatureTable(rows, placement, device=0)
    ids = torch.randint(0, rows.shape[0], (5000,))
    out = torch.full((ids.numel(), rows.shape[1]), float("nan"), device="cuda:1")
    torch.cuda.synchronize(1)
    free_before = torch.cuda.mem_get_info(1)[0]
    other = table.for_device(1)
    assert other.device == torch.device("cuda", 1) and other.placement is table.placement
    other.read(ids.to("cuda:1"), out)
    assert torch.equal(out.cpu(), rows[ids])
    # No copy of the table on GPU 1 (its context and the gather's module take some 100 MiB).
    assert torch.cuda.mem_get_info(1)[0] >= free_before - (512 << 20)
    assert table.for_device(0) is table
    with pytest.raises(ValueError, match="cannot be read by"):
        FeatureTable(rows.cuda(0), "cuda").for_device(1)
