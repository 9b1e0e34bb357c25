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


@pytest.mark.parametrize("gather_in", ["machine", "machine-reads"])
@pytest.mark.parametrize("how", ["raise", "kill"])
def test_a_failing_gatherer_ends_the_run_with_its_traceback(tiny, how, gather_in):
    """A failure while serving (its thread raises; with machine-reads, the producer's own) reaches
    the trainer, which raises it; a role that dies closes its connections, which ends the run: no
    hang, nothing left."""
    before = snapshot()
    plan = _cpu_plan(gather_in, inject_failure=InjectedFailure("producer", how, 2))
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


# --- machine-reads: a producer per trainer, its rows read by the machine's gatherer ---------------


def test_the_plan_names_the_machines_reads():
    plan = _cpu_plan("machine-reads")
    assert plan.gather_in is GatherIn.MACHINE_READS and plan.gather_in.producer and plan.gather_in.machine
    assert plan.sampler_processes >= 1  # the CPU pipeline samples in sampler processes, as with a producer
    assert "its rows read by the machine's gatherer process" in plan.describe()
    assert not GatherIn.PRODUCER.machine and not GatherIn.MACHINE.producer
    with pytest.raises(PlanError, match="applies to mode 'zerocopy'") as e:
        Plan(device="cpu", sample_on=SampleOn.CPU, mode=Mode.CPU, gather_in="machine-reads", num_samplers=1)
    assert e.value.setting == "gather_in"


def test_one_pipeline_with_machine_reads_trains_as_with_its_own_producer(tiny):
    """The producer samples and fills the ring, the gatherer reads its rows: the same model as a
    producer reading its own table; the gatherer ends with the run, leaving nothing."""
    before, pids, messages = snapshot(), {}, []
    reads = run_pipeline(_cpu_plan("machine-reads"), tiny, on_start=pids.update, on_message=messages.append)
    assert sorted(k.rstrip("0123456789") for k in pids) == ["consumer", "gatherer", "producer", "sampler"]
    _assert_nothing_left(pids, before)
    producer = run_pipeline(_cpu_plan("producer"), tiny)
    assert _summary(reads) == _summary(producer)
    (table,) = [m for m in messages if isinstance(m, TableReady)]  # the gatherer's, through the producer
    assert table.nbytes == tiny.num_nodes * tiny.row_bytes


def test_machine_reads_count_the_gatherers_cache_as_a_producer_counts_its_own(tiny):
    """A cache in front of the gatherer's table: each epoch's hit counts equal those of a
    producer holding the same cache itself."""
    from pytorch_zerocopy import CacheConfig, CachePolicy

    cache = CacheConfig(fraction=0.2, policy=CachePolicy.DEGREE)
    reads = run_pipeline(_cpu_plan("machine-reads", cache=cache), tiny)
    producer = run_pipeline(_cpu_plan("producer", cache=cache), tiny)
    assert [(e.cache_hits, e.cache_lookups) for e in reads] == [(e.cache_hits, e.cache_lookups) for e in producer]
    assert all(0 < e.cache_hits < e.cache_lookups for e in reads)
    assert _summary(reads) == _summary(producer)


def test_two_ranks_read_through_one_gatherer(tiny):
    settings = dict(RUN, use_gpu=False, quiet=True)
    reads = train_data_parallel(tiny, 2, "zerocopy", gather_in="machine-reads", **settings)
    producer = train_data_parallel(tiny, 2, "zerocopy", gather_in="producer", **settings)
    assert {r: _summary(e) for r, e in reads.items()} == {r: _summary(e) for r, e in producer.items()}


def test_a_gatherer_killed_under_machine_reads_ends_the_run(tiny):
    """The gatherer SIGKILLed as the roles start: the producer's connection or its next read
    fails, and the run ends with an error, no hang and nothing left."""
    import os
    import signal
    import threading

    before, pids, outcome = snapshot(), {}, {}

    def killed(started):
        pids.update(started)
        (gatherer,) = [pid for name, pid in started.items() if name.startswith("gatherer")]
        os.kill(gatherer, signal.SIGKILL)

    def target():
        try:
            run_pipeline(_cpu_plan("machine-reads"), tiny, on_start=killed)
            outcome["error"] = None
        except BaseException as e:  # noqa: BLE001
            outcome["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the run did not end after its gatherer was killed"
    assert isinstance(outcome["error"], PipelineError), f"expected a PipelineError, got {outcome['error']!r}"
    assert "gatherer" in str(outcome["error"])
    _assert_nothing_left(pids, before)


class _Gatherer:
    """The machine's gatherer in a process of its own (serving one connection), for a reader in
    this process."""

    def __init__(self, plan, ds, tmp_path, cached_rows=None):
        import torch.multiprocessing as mp

        from pytorch_zerocopy.pipeline.machine import gatherer_main, listen

        ds.share_memory_()
        tmp_path.mkdir(parents=True, exist_ok=True)
        sock = listen(str(tmp_path))
        self.address = sock.getsockname()
        self.process = mp.get_context("spawn").Process(target=gatherer_main, args=(plan, ds, cached_rows, sock, 1))
        self.process.start()
        sock.close()

    def join(self):
        self.process.join(60)
        assert self.process.exitcode == 0, f"the gatherer ended with {self.process.exitcode}"


def _reads_plan(device):
    if device == "cpu":
        return _cpu_plan("machine-reads")
    return make_plan("zerocopy", gather_in="machine-reads", partition="none", **RUN)


def _check_machine_rows(ds, tmp_path, device, cached_rows=None):
    """Fresh random ids, int32 and int64, into poisoned outputs: a new tensor, a view at an
    offset of a larger buffer, ids that grow the staging buffer, an empty read; each equals
    the table's rows."""
    from pytorch_zerocopy.pipeline.machine_reads import MachineRows

    plan = _reads_plan(device)
    gatherer = _Gatherer(plan, ds, tmp_path, cached_rows)
    rows = ds.features
    g = torch.Generator().manual_seed(7)
    dev = torch.device(device)
    reader = MachineRows(gatherer.address, plan, dev)
    try:
        assert tuple(reader.shape) == tuple(rows.shape) and reader.dtype == rows.dtype
        assert reader.table is not None and reader.table.nbytes == rows.numel() * rows.element_size()
        big = torch.full((500, rows.shape[1]), float("nan"), dtype=rows.dtype, device=dev)
        for n, dtype in [(10, torch.int64), (50, torch.int32), (300, torch.int64), (0, torch.int64)]:
            ids = torch.randint(0, rows.shape[0], (n,), generator=g, dtype=dtype)
            fresh = reader.read(ids.to(dev))
            view = big[100:100 + n]
            view.fill_(float("nan"))
            reader.read(ids, view, check_bounds=False)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            assert torch.equal(fresh.cpu(), rows[ids.long()]) and torch.equal(view.cpu(), rows[ids.long()])
        with pytest.raises(IndexError, match="out of bounds"):
            reader.read(torch.tensor([0, rows.shape[0]]))
        with pytest.raises(ValueError, match="out must be a contiguous"):
            reader.read(torch.tensor([0, 1]), torch.empty(3, rows.shape[1], device=dev))
        with pytest.raises(TypeError, match="1-D int32/int64"):
            reader.read(torch.tensor([0.0]))
        assert torch.equal(reader.read(torch.tensor([5])).cpu(), rows[[5]])  # still serving after refused input
    finally:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        reader.close()
    gatherer.join()


def test_machine_rows_read_the_gatherers_table_on_the_cpu(tiny, tmp_path):
    _check_machine_rows(tiny, tmp_path, "cpu")


def test_machine_rows_without_a_gatherer_is_one_line(tmp_path):
    from pytorch_zerocopy.pipeline.machine_reads import MachineRows

    with pytest.raises(LinkClosed, match="cannot reach the machine's gatherer"):
        MachineRows(str(tmp_path / "nobody.sock"), _cpu_plan("machine-reads"), torch.device("cpu"))


def test_a_gatherer_that_goes_mid_read_is_a_clear_error(tmp_path):
    """The gatherer's end closes after the handshake: the producer's next read raises LinkClosed
    naming the gatherer, not a hang."""
    import threading

    from pytorch_zerocopy.pipeline.machine import Link
    from pytorch_zerocopy.pipeline.machine_reads import MachineRows
    from pytorch_zerocopy.pipeline.messages import ReadsOpen
    from multiprocessing.connection import Connection

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "g.sock"))
    server.listen(1)

    def answer_then_go():
        conn, _ = server.accept()
        link = Link(Connection(conn.detach()), "a producer")
        link.get()
        link.put(ReadsOpen(None, (10, 4), torch.float32))
        link.close()

    t = threading.Thread(target=answer_then_go)
    t.start()
    reader = MachineRows(str(tmp_path / "g.sock"), _cpu_plan("machine-reads"), torch.device("cpu"))
    t.join()
    with pytest.raises(LinkClosed, match="the machine's gatherer"):
        reader.read(torch.tensor([1, 2]))
    reader.close()
    server.close()


@pytest.mark.cuda
def test_machine_rows_read_the_gatherers_table_on_a_gpu(tiny, tmp_path):
    """The same reads from a GPU: the ids and outputs reach the gatherer by CUDA IPC, ordered by
    the two interprocess events; with and without the gatherer's cache."""
    _check_machine_rows(tiny, tmp_path / "plain", "cuda:0")
    cached = torch.arange(0, tiny.num_nodes, 3, dtype=torch.int64).share_memory_()
    _check_machine_rows(tiny, tmp_path / "cached", "cuda:0", cached)


@pytest.mark.cuda
def test_one_gpu_pipeline_with_machine_reads_trains(tiny):
    """The whole GPU path (the producer's GPU sampler, its reads through the gatherer, the ring):
    it trains the minibatches a producer of its own trains, to the same loss within float
    noise."""
    reads = run_pipeline(make_plan("zerocopy", gather_in="machine-reads", partition="none", **RUN), tiny)
    producer = run_pipeline(make_plan("zerocopy", gather_in="producer", partition="none", **RUN), tiny)
    assert [(e.epoch, e.train_batches, e.feature_bytes) for e in reads] == \
        [(e.epoch, e.train_batches, e.feature_bytes) for e in producer]
    assert [e.loss for e in reads] == pytest.approx([e.loss for e in producer], rel=1e-3)
