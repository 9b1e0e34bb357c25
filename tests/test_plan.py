"""The run's plan: one vocabulary, every setting checked once, choices resolved once."""

import os
import pickle
import re
from dataclasses import replace

import pytest

from pytorch_zerocopy.pipeline import GatherIn, Mode, Partition, Plan, PlanError, SampleOn, make_plan
from pytorch_zerocopy.pipeline import plan as plan_module
from pytorch_zerocopy import probe
from pytorch_zerocopy.feature_table import CacheConfig, CachePolicy
from pytorch_zerocopy.ops import GatherTuning
from pytorch_zerocopy.pipeline.plan import (MACHINE_GATHERER_TRAINERS, InjectedFailure, available_cores, default_cache,
                                            default_gather_batches)
from pytorch_zerocopy.placement import Placement

GPU = dict(device="cuda:0")


def rates(mapped: float = 17.0, managed=49.6, gpu_memory=80 << 30) -> probe.HostReadRates:
    return probe.HostReadRates("a GPU", "580", gpu_memory, 4 << 30, 131072, 512, mapped, managed, 54.8)


@pytest.fixture
def gpu_machine(monkeypatch):
    """Resolution is pure logic: pretend a GPU with MPS whose managed memory reads faster (no
    CUDA call is made while planning); ``set_rates`` changes what the machine measured."""
    monkeypatch.setattr(plan_module, "gpu_available", lambda: True)
    monkeypatch.setattr(plan_module.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(plan_module, "available_cores", lambda: 16)
    measured = {"rates": rates()}
    monkeypatch.setattr(probe, "host_read_rates", lambda refresh=False, quiet=True: measured["rates"])

    def set_rates(value):
        measured["rates"] = value

    return set_rates


def test_vocabulary_is_one_word_per_thing():
    assert [m.value for m in Mode] == ["cpu", "dma", "zerocopy-naive", "zerocopy", "gpu"]
    assert [p.value for p in Partition] == ["none", "mps", "green"]
    p = Plan(mode="zerocopy-naive", partition="none", gather_in="trainer", sample_on="gpu", num_samplers=0, **GPU)
    assert (p.mode, p.partition, p.gather_in, p.sample_on) == (Mode.ZEROCOPY_NAIVE, Partition.NONE, GatherIn.TRAINER,
                                                               SampleOn.GPU)
    with pytest.raises(PlanError, match="mode must be one of 'cpu', 'dma', 'zerocopy-naive', 'zerocopy', 'gpu', "
                                        "got 'naive'") as e:
        Plan(mode="naive")
    assert e.value.setting == "mode"


def test_plan_is_frozen_and_picklable():
    p = Plan(fanouts=[5, 5], inject_failure=("producer", "raise", 3))
    assert p.fanouts == (5, 5) and p.inject_failure == InjectedFailure("producer", "raise", 3)
    with pytest.raises(Exception):
        p.batch_size = 3
    assert pickle.loads(pickle.dumps(p)) == p
    assert p.settings()["mode"] == "zerocopy" and p.settings()["fanouts"] == (5, 5)


BAD = [
    (dict(batch_size=0), "batch_size", ">= 1"),
    (dict(batch_size=2.5), "batch_size", "an int"),
    (dict(batch_size=True), "batch_size", "an int"),
    (dict(hidden=0), "hidden", ">= 1"),
    (dict(hidden=-3), "hidden", ">= 1"),
    (dict(epochs=0), "epochs", ">= 1"),
    (dict(fanouts=()), "fanouts", "one positive fanout"),
    (dict(fanouts=(0, 5)), "fanouts", "one positive fanout"),
    (dict(fanouts=(-2,)), "fanouts", "one positive fanout"),
    (dict(fanouts=5), "fanouts", "a sequence of ints"),
    (dict(fanouts=(1.5,)), "fanouts", "ints"),
    (dict(max_batches=0), "max_batches", "None or >= 1"),
    (dict(val_batches=0), "val_batches", "None or >= 1"),
    (dict(dropout=1.0), "dropout", "in [0, 1)"),
    (dict(lr=0), "lr", "> 0"),
    (dict(lr=float("nan")), "lr", "finite"),
    (dict(seed=-1), "seed", ">= 0"),
    (dict(num_samplers=0), "num_samplers", ">= 1"),
    (dict(sampler_threads=0), "sampler_threads", ">= 1"),
    (dict(num_slots=1), "num_slots", ">= 2"),
    (dict(gather_batches=0), "gather_batches", ">= 1"),
    (dict(gather_batches=2, num_slots=3), "num_slots", ">= 2 * gather_batches = 4"),
    (dict(queue_depth=0), "queue_depth", ">= 1"),
    (dict(producer_share=100), "producer_share", "in (0, 100)"),
    (dict(producer_sms=0), "producer_sms", ">= 1"),
    (dict(graph_warmup=0), "graph_warmup", ">= 1"),
    (dict(replay=0), "replay", "None or >= 1"),
    (dict(rank=2, world_size=2), "rank", "in [0, world_size = 2)"),
    (dict(world_size=0), "world_size", ">= 1"),
    (dict(trace="yes"), "trace", "True or False"),
    (dict(producer_yields=1), "producer_yields", "True or False"),
    (dict(inject_failure=("trainer", "raise", 1)), "inject_failure", "a role of"),
    (dict(device="gpu"), "device", "'cpu' or 'cuda:N'"),
    (dict(device="cuda"), "device", "'cpu' or 'cuda:N'"),
    (dict(feature_placement="pinned"), "feature_placement", "feature_placement must be one of"),
    (dict(graph_placement="gpu-ish"), "graph_placement", "graph_placement must be one of"),
    (dict(gather_tuning=GatherTuning(unroll=12)), "gather_tuning", "unroll 0, 4, 8 or 16"),
    (dict(gather_tuning=GatherTuning(blocks_per_sm=33)), "gather_tuning", "blocks_per_sm in [0, 32]"),
    (dict(gather_tuning=4), "gather_tuning", "a pytorch_zerocopy.ops.GatherTuning"),
]


@pytest.mark.parametrize("settings, setting, want", BAD, ids=[f"{k}={v!r}" for s, _, _ in BAD for k, v in
                                                                  list(s.items())[:1]])
def test_every_bad_setting_is_named(settings, setting, want):
    with pytest.raises(PlanError, match=re.escape(want)) as e:
        Plan(**settings)
    assert e.value.setting == setting and str(e.value).startswith(setting)


PLACEMENT = [
    (dict(mode=Mode.CPU, **GPU), "mode 'cpu' trains on the CPU"),
    (dict(mode=Mode.DMA), "needs a CUDA GPU"),
    (dict(mode=Mode.GPU, gather_in=GatherIn.TRAINER), "needs a CUDA GPU"),
    (dict(partition=Partition.MPS), "partitions a GPU"),
    (dict(partition=Partition.MPS, mode=Mode.GPU, **GPU), "applies to mode 'zerocopy' only"),
    (dict(partition=Partition.MPS, gather_in=GatherIn.TRAINER, **GPU), "gather_in must be 'producer'"),
    (dict(partition=Partition.GREEN, gather_in=GatherIn.PRODUCER, cuda_graph=False, **GPU),
     "gather_in must be 'trainer'"),
    (dict(partition=Partition.GREEN, gather_in=GatherIn.TRAINER, **GPU), "cuda_graph must be False"),
    (dict(mode=Mode.DMA, gather_in=GatherIn.TRAINER, **GPU), "gather_in must be 'producer'"),
    (dict(mode=Mode.ZEROCOPY_NAIVE, gather_in=GatherIn.PRODUCER, **GPU), "gather_in must be 'trainer'"),
    (dict(sample_on=SampleOn.GPU), "sample_on 'gpu' needs a CUDA device"),
    (dict(sample_on=SampleOn.GPU, num_samplers=2, **GPU), "num_samplers applies to sample_on 'cpu'"),
    (dict(feature_placement=Placement.MANAGED), "feature_placement must be 'cpu' for mode 'zerocopy' on 'cpu'"),
    (dict(feature_placement="managed", mode=Mode.GPU, gather_in=GatherIn.TRAINER, sample_on="gpu", num_samplers=0,
          **GPU), "feature_placement must be 'cuda' for mode 'gpu'"),
    (dict(feature_placement="cuda", **GPU), "feature_placement must be 'unified' or 'managed' for mode 'zerocopy'"),
    (dict(graph_placement="managed"), "graph_placement must be 'cpu' when sampling on 'cpu'"),
    (dict(gather_tuning=GatherTuning(blocks_per_sm=4)), "gather_tuning tunes the producer's gathers on a GPU"),
    (dict(gather_tuning=GatherTuning(unroll=16), gather_in=GatherIn.TRAINER, **GPU),
     "gather_tuning tunes the producer's gathers on a GPU"),
]


@pytest.mark.parametrize("settings, want", PLACEMENT)
def test_placements_that_cannot_work(settings, want):
    with pytest.raises(PlanError, match=re.escape(want)):
        Plan(**settings)


def test_make_plan_resolves_each_mode_on_a_gpu_machine(gpu_machine):
    zc = make_plan("zerocopy", row_bytes=512)
    assert (zc.device, zc.partition, zc.sample_on, zc.gather_in) == ("cuda:0", Partition.MPS, SampleOn.GPU,
                                                                     GatherIn.PRODUCER)
    assert zc.sampler_processes == 0 and zc.mark_sources == 1
    assert zc.gather_batches == 8 and zc.num_slots == 16  # 512 B rows: 8 minibatches per gather
    assert (zc.table_in, zc.lists_in) == (Placement.MANAGED, Placement.MAPPED)
    assert make_plan("zerocopy", row_bytes=4096).gather_batches == 1
    assert make_plan("zerocopy").gather_batches == 1  # row width unknown
    assert make_plan("zerocopy", "none").partition is Partition.NONE
    green = make_plan("zerocopy", "green", row_bytes=512)
    assert green.gather_in is GatherIn.TRAINER and not green.cuda_graph and green.gather_batches == 1
    dma = make_plan("dma", row_bytes=512)
    assert (dma.sample_on, dma.gather_in, dma.partition, dma.num_samplers) == (SampleOn.CPU, GatherIn.PRODUCER,
                                                                               Partition.NONE, 2)
    assert dma.producer_threads == 8 and dma.sampler_threads == 3 and dma.host_slots
    assert (dma.table_in, dma.lists_in, dma.cache) == (Placement.CPU, Placement.CPU, None)
    # The strongest copy path: GPU sampling, and the CPU gather on every core but one.
    gpu_sampling_dma = make_plan("dma", sample_on="gpu", row_bytes=512)
    assert (gpu_sampling_dma.sampler_processes, gpu_sampling_dma.producer_threads) == (0, 15)
    assert (gpu_sampling_dma.lists_in, gpu_sampling_dma.host_slots) == (Placement.MAPPED, True)
    for mode, table in (("gpu", Placement.GPU), ("zerocopy-naive", Placement.MAPPED)):
        p = make_plan(mode, row_bytes=512)
        assert (p.sample_on, p.gather_in, p.partition) == (SampleOn.GPU, GatherIn.TRAINER, Partition.NONE)
        assert (p.table_in, p.cache) == (table, None)
    assert make_plan("gpu", gather_in="producer", row_bytes=512).gather_batches == 8  # a GPU ring
    cpu_sampling = make_plan("zerocopy", sample_on="cpu", num_samplers=3)
    assert cpu_sampling.sampler_processes == 3 and cpu_sampling.mark_sources == 3
    assert cpu_sampling.lists_in is Placement.CPU
    # The green partition's plan refuses a graphed step that was asked for explicitly.
    with pytest.raises(PlanError, match="cuda_graph"):
        make_plan("zerocopy", "green", cuda_graph=True)
    # None means "decide", for what the plan decides.
    assert make_plan("zerocopy", row_bytes=512, gather_batches=None, num_samplers=None,
                     feature_placement=None) == zc
    rank1 = zc.for_rank(1, 4, 1, 2)
    assert (rank1.rank, rank1.world_size, rank1.device) == (1, 4, "cuda:1")


def test_the_default_is_the_fast_path(gpu_machine):
    """With no settings, zerocopy on a GPU reads the host memory kind the machine measured
    faster, caches a tenth of the rows chosen by pre-sampling, and gives the producer the share
    and gather grid measured best for that; each setting given overrides its part."""
    plan = make_plan("zerocopy", row_bytes=512, table_bytes=16 << 30)
    assert plan.feature_placement is Placement.MANAGED
    assert plan.cache == CacheConfig(policy=CachePolicy.PRESAMPLE, fraction=0.1, fanouts=plan.fanouts,
                                     batch_size=plan.batch_size, edge_dir="out", seed=plan.seed)
    assert plan.producer_share == 25.0 and plan.gather_tuning == GatherTuning(blocks_per_sm=4, unroll=16)
    assert "managed memory kept in host memory" in plan.describe() and "10% of the rows" in plan.describe()
    assert make_plan("zerocopy", row_bytes=512, cache=None).cache is None
    assert make_plan("zerocopy", row_bytes=512, cache=None).producer_share == 10.0
    mapped = make_plan("zerocopy", row_bytes=512, feature_placement="unified")
    assert (mapped.feature_placement, mapped.producer_share, mapped.gather_tuning) == (Placement.MAPPED, 10.0,
                                                                                       GatherTuning())
    assert make_plan("zerocopy", row_bytes=512, producer_share=15).producer_share == 15
    # Several trainers on one machine: one gatherer for all of them holds the table in the kind
    # measured fastest; a producer per trainer shares one mapped table instead.
    several = make_plan("zerocopy", row_bytes=512, local_processes=2)
    assert (several.gather_in, several.feature_placement, several.partition) == (GatherIn.MACHINE, Placement.MANAGED,
                                                                                Partition.MPS)
    assert several.num_samplers == 0 and "machine's gatherer" in several.describe()
    assert several.producer_share == 25.0 and several.gather_tuning == GatherTuning(blocks_per_sm=4, unroll=16)
    each = make_plan("zerocopy", row_bytes=512, local_processes=2, gather_in="producer")
    assert (each.gather_in, each.feature_placement) == (GatherIn.PRODUCER, Placement.MAPPED)
    # More trainers than one gatherer's threads serve well: a producer each, one mapped table.
    many = make_plan("zerocopy", row_bytes=512, local_processes=MACHINE_GATHERER_TRAINERS + 1)
    assert (many.gather_in, many.feature_placement, many.partition) == (GatherIn.PRODUCER, Placement.MAPPED,
                                                                        Partition.MPS)
    assert make_plan("zerocopy", row_bytes=512, local_processes=4, gather_in="machine").gather_in is GatherIn.MACHINE
    # No bounded grid without MPS, or with green contexts.
    for other in (make_plan("zerocopy", "none", row_bytes=512), make_plan("zerocopy", "green")):
        assert other.feature_placement is Placement.MANAGED and other.gather_tuning == GatherTuning()
    # Where managed memory is not faster, or the machine could not be measured, the table stays mapped.
    for measured in (rates(mapped=40.0, managed=42.0), rates(managed=None), None):
        gpu_machine(measured)
        assert make_plan("zerocopy", row_bytes=512).feature_placement is Placement.MAPPED
    assert make_plan("zerocopy", row_bytes=512).cache.fraction == 0.1  # unmeasured: no cap


def test_the_default_cache_fits_the_gpu():
    assert default_cache(16 << 30, 80 << 30).fraction == 0.1
    big = default_cache(1 << 40, 80 << 30)
    assert big.fraction is None and big.cache_bytes == 20 << 30 and big.policy is CachePolicy.PRESAMPLE
    assert default_cache(None, None).fraction == 0.1


def test_make_plan_without_a_gpu():
    if plan_module.gpu_available():
        pytest.skip("checks the no-GPU resolution")
    zc = make_plan("zerocopy", row_bytes=512)
    assert (zc.device, zc.sample_on, zc.gather_in, zc.partition) == ("cpu", SampleOn.CPU, GatherIn.PRODUCER,
                                                                     Partition.NONE)
    assert zc.sampler_processes == 1 and zc.gather_batches == 1 and zc.host_slots
    # A CPU trainer takes the cores the sampler and the producer leave.
    assert zc.consumer_threads == max(1, available_cores() - zc.sampler_threads - 1)
    with pytest.raises(PlanError, match="device 'cuda:0' needs a CUDA GPU"):
        make_plan("zerocopy", device="cuda:0")
    with pytest.raises(PlanError, match="unknown setting 'batchsize'"):
        make_plan("zerocopy", batchsize=5)
    assert make_plan("zerocopy", gpu=False).device == "cpu"


def test_threads_come_from_the_cores_this_process_may_use(monkeypatch):
    assert available_cores() == len(os.sched_getaffinity(0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert available_cores() == 3
    threads = plan_module._threads(Mode.DMA, True, 2, available_cores())
    assert threads == dict(sampler_threads=1, producer_threads=1, consumer_threads=1)
    threads = plan_module._threads(Mode.DMA, True, 2, 16)
    assert threads == dict(sampler_threads=3, producer_threads=8, consumer_threads=1)
    threads = plan_module._threads(Mode.ZEROCOPY, False, 1, 8)
    assert threads == dict(sampler_threads=2, producer_threads=1, consumer_threads=5)
    # Two cores: every role single-threaded (the trainer does not wait on a descheduled sibling).
    assert plan_module._threads(Mode.ZEROCOPY, False, 1, 2) == dict(sampler_threads=1, producer_threads=1,
                                                                     consumer_threads=1)
    # Data-parallel ranks on one machine share its cores.
    p = replace(Plan(mode=Mode.ZEROCOPY, device="cpu", num_samplers=2))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert p.for_rank(0, 2, 0, 2).consumer_threads == 5


@pytest.mark.parametrize("mode, on_gpu", [(Mode.ZEROCOPY, False), (Mode.CPU, False), (Mode.DMA, True),
                                          (Mode.ZEROCOPY, True), (Mode.GPU, True)])
def test_roles_never_ask_for_more_threads_than_cores(mode, on_gpu):
    """The roles' threads together fit the cores, beyond the one thread each role needs."""
    for cores in range(1, 65):
        for samplers in range(0 if on_gpu else 1, 5):
            t = plan_module._threads(mode, on_gpu, samplers, cores)
            total = samplers * t["sampler_threads"] + t["producer_threads"] + t["consumer_threads"]
            assert min(t.values()) >= 1
            assert total <= max(cores, samplers + 2), (cores, samplers, t)
            if samplers and cores >= 4 * samplers + 2:
                assert total >= cores - samplers - 2  # and CPU sampling or training uses the cores


def test_default_gather_batches_shrink_as_rows_widen():
    assert [default_gather_batches(b) for b in (4, 128, 512, 1024, 2048, 4096, 65536)] == [8, 8, 8, 4, 2, 1, 1]


def test_describe_labels_the_replay_diagnostic():
    assert "DIAGNOSTIC" in Plan(replay=4).describe() and "DIAGNOSTIC" not in Plan().describe()


def test_a_loaders_producer_yields_to_the_users_step_under_mps(gpu_machine, monkeypatch, tmp_path):
    from pytorch_zerocopy.pipeline.loader import LOADER_PRODUCER_SHARE, loader_plan
    from pytorch_zerocopy.pipeline.partition import MpsDaemon, this_process_client_env

    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.setenv("CUDA_MPS_CLIENT_PRIORITY", "1")  # never inherited: each client's is set
    plan = loader_plan([10, 15], 1024, 512, 512 << 20)
    assert plan.partition is Partition.MPS and plan.producer_yields
    assert "below-normal MPS priority" in plan.describe()
    assert not make_plan("zerocopy", "auto", **GPU).producer_yields  # zerocopy train: its producer feeds its trainer
    env = this_process_client_env(plan.producer_share, below_normal=plan.producer_yields)
    assert plan.producer_share == LOADER_PRODUCER_SHARE == 50  # it yields, and its GPU sampling must keep up
    assert env["CUDA_MPS_CLIENT_PRIORITY"] == "1" and env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert this_process_client_env(100.0)["CUDA_MPS_CLIENT_PRIORITY"] == "0"
    daemon = MpsDaemon()
    daemon.root = str(tmp_path)  # the environment only; no daemon is started
    assert daemon.client_env(10, below_normal=True)["CUDA_MPS_CLIENT_PRIORITY"] == "1"
    assert daemon.client_env(90)["CUDA_MPS_CLIENT_PRIORITY"] == "0"
