"""The machine's gatherer (``gather_in='machine'``): one process samples and gathers for every
trainer of the machine, over a ring per trainer on one connection each. On the CPU everywhere
(host slots, gloo ranks); on GPUs the same runs read one table from every GPU."""

import socket

import pytest
import torch

from pytorch_zerocopy import FeatureTable
from pytorch_zerocopy.pipeline import GatherIn, Mode, Plan, PlanError, PipelineError, SampleOn, make_plan, run_pipeline
from pytorch_zerocopy.pipeline.machine import LinkClosed, connect
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
    before, pids = snapshot(), {}
    machine = run_pipeline(_cpu_plan("machine"), tiny, on_start=pids.update)
    assert sorted(k.rstrip("0123456789") for k in pids) == ["consumer", "gatherer"]
    _assert_nothing_left(pids, before)
    producer = run_pipeline(_cpu_plan("producer"), tiny)
    assert _summary(machine) == _summary(producer)


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


# --- GPU ------------------------------------------------------------------------------------


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
