"""The GPU hot-row cache in the training pipeline: the plan's ``cache``, rows chosen by the
parent, the gathering process reading through a CachedTable, hit counts per epoch; on the CPU
(the cache then lives in host memory, same code path) and, with the ``cuda`` marker, on a GPU."""

import json
import pickle
from dataclasses import replace

import pytest
import torch

from pytorch_zerocopy import CacheConfig, CachedTable, CachePolicy
from pytorch_zerocopy.datasets import community_graph, papers_like
from pytorch_zerocopy.feature_table import cached_rows_for
from pytorch_zerocopy.pipeline import GatherIn, Mode, Phase, Plan, PlanError, SampleOn, make_plan, run_pipeline
from pytorch_zerocopy.pipeline.gather import CacheHits, choose_cached_rows, feature_reader, gather_into
from pytorch_zerocopy.pipeline.minibatches import epoch_batches, sample_on_cpu, SeedBatch
from pytorch_zerocopy.train import parse_cache
from test_pipeline_failures import _assert_nothing_left, snapshot


@pytest.fixture(scope="module")
def small():
    return community_graph(num_nodes=6000, feature_dim=32, seed=11)


@pytest.fixture(scope="module")
def power_law():
    return papers_like(40_000, avg_degree=8, feature_dim=16, num_classes=8, seed=4, device="cpu", train_fraction=0.02)


def cpu_plan(**settings) -> Plan:
    base = dict(mode=Mode.ZEROCOPY, device="cpu", sample_on=SampleOn.CPU, batch_size=256, epochs=2,
                fanouts=(6, 4), hidden=32, lr=1e-2, consumer_threads=1)
    base.update(settings)
    return Plan(**base)


def training_inputs(plan: Plan, ds, epoch: int):
    """The input nodes of every training minibatch of ``epoch``, sampled again here (samples
    are a function of the plan's seed and the minibatch, wherever they are drawn)."""
    out = []
    for i, seeds in enumerate(epoch_batches(plan, ds, epoch, Phase.TRAIN)):
        out.append(sample_on_cpu(ds.graph, ds.labels, plan, SeedBatch(Phase.TRAIN, epoch, i, seeds)).input_nodes)
    return out


# --- the plan and the command line -----------------------------------------------------------


def test_plan_takes_a_cache_and_samples_it_as_the_run_does():
    cache = CacheConfig(policy=CachePolicy.PRESAMPLE, fraction=0.1, fanouts=(99,), batch_size=7, edge_dir="in")
    plan = Plan(fanouts=(5, 3), batch_size=300, seed=4, cache=cache)
    # The pre-sampling pass uses the run's fanouts, batch size and seed, and reads the dataset's
    # in-neighbour rows as stored (edge_dir 'out' of sample_layers).
    assert plan.cache == replace(cache, fanouts=(5, 3), batch_size=300, edge_dir="out", seed=4)
    assert pickle.loads(pickle.dumps(plan)) == plan
    settings = plan.settings()
    json.dumps(settings)  # plain values only
    assert settings["cache"]["policy"] == "presample" and settings["cache"]["fraction"] == 0.1
    assert "cache of 10% of the rows (presample)" in plan.describe()
    assert Plan().cache is None and "cache" not in Plan().describe()


@pytest.mark.parametrize("settings, want", [
    (dict(cache="10%"), "cache must be a pytorch_zerocopy.CacheConfig or None"),
    (dict(cache=CacheConfig(fraction=0.1), mode="cpu"), "cache applies to mode 'zerocopy' only"),
    (dict(cache=CacheConfig(rows=5), mode="dma", device="cuda:0"), "cache applies to mode 'zerocopy' only"),
    (dict(cache=CacheConfig(rows=5), mode="gpu", device="cuda:0", gather_in="trainer"),
     "cache applies to mode 'zerocopy' only"),
])
def test_plan_refuses_a_cache_that_cannot_work(settings, want):
    settings.setdefault("gather_in", "trainer" if settings.get("mode") == "cpu" else "producer")
    with pytest.raises(PlanError, match=want) as e:
        Plan(**settings)
    assert e.value.setting == "cache"


def test_make_plan_passes_the_cache_through():
    plan = make_plan("zerocopy", "none", gpu=False, cache=CacheConfig(rows=10), fanouts=(3, 3))
    assert plan.cache.rows == 10 and plan.cache.fanouts == (3, 3)


@pytest.mark.parametrize("text, field, value", [
    ("10%", "fraction", 0.1), ("0.5%", "fraction", 0.005), ("100%", "fraction", 1.0),
    ("2GiB", "cache_bytes", 2 * 2**30), ("500MB", "cache_bytes", 500 * 10**6), ("1.5 kib", "cache_bytes", 1536),
    ("100000", "rows", 100_000), ("1", "rows", 1),
])
def test_parse_cache_sizes(text, field, value):
    cache = parse_cache(text)
    assert getattr(cache, field) == pytest.approx(value) and cache.policy is CachePolicy.PRESAMPLE
    assert parse_cache(text, "degree").policy is CachePolicy.DEGREE


@pytest.mark.parametrize("text", ["lots", "0%", "150%", "-5%", "0", "1.5", "10 rows", "", "5XB", "0.1b"])
def test_parse_cache_refuses(text):
    with pytest.raises(PlanError, match="cache must be") as e:
        parse_cache(text)
    assert e.value.setting == "cache"


# --- rows chosen in the parent, gathered through the cache -----------------------------------


def test_parent_chooses_the_rows_without_a_gpu(power_law):
    """Degree: the nodes found in the most in-neighbour rows (the rows sampling reads);
    presample: the same choice cached_rows_for makes with the run's sampling settings."""
    plan = cpu_plan(cache=CacheConfig(policy=CachePolicy.DEGREE, rows=300))
    ids = choose_cached_rows(plan, power_law)
    assert ids.is_shared() and ids.dtype == torch.int64 and ids.numel() == 300
    counts = torch.bincount(power_law.graph.indices.long(), minlength=power_law.num_nodes)
    # Every chosen node is at least as hot as every node left out.
    left_out = torch.ones(power_law.num_nodes, dtype=torch.bool)
    left_out[ids] = False
    assert int(counts[ids].min()) >= int(counts[left_out].max())
    assert choose_cached_rows(replace(plan, cache=None), power_law) is None

    pre = cpu_plan(cache=CacheConfig(policy=CachePolicy.PRESAMPLE, fraction=0.05))
    chosen = choose_cached_rows(pre, power_law)
    assert torch.equal(chosen, cached_rows_for(power_law.graph, pre.cache, power_law.num_nodes, power_law.row_bytes,
                                               seeds=power_law.train_idx))
    assert chosen.numel() == round(0.05 * power_law.num_nodes)


@pytest.mark.parametrize("policy", list(CachePolicy))
def test_chosen_rows_are_the_ones_training_reads(power_law, policy):
    """A cache of 10% of the rows holds well over 10% of the training minibatches' input rows
    on a power-law graph, whichever policy chose them; pre-sampling the run's own sampling
    predicts them best."""
    def hit_rate(policy):
        plan = cpu_plan(cache=CacheConfig(policy=policy, fraction=0.1))
        member = torch.zeros(power_law.num_nodes, dtype=torch.bool)
        member[choose_cached_rows(plan, power_law)] = True
        return float(member[torch.cat(training_inputs(plan, power_law, 1))].float().mean())

    assert hit_rate(policy) > 0.13
    if policy is CachePolicy.PRESAMPLE:
        assert hit_rate(policy) > hit_rate(CachePolicy.DEGREE) + 0.03


def test_feature_reader_reads_through_the_cache_and_counts_hits(small, gen):
    ids = torch.randperm(small.num_nodes, generator=gen)[:700]
    reader = feature_reader(cpu_plan(cache=CacheConfig(rows=700)), small, torch.device("cpu"), ids)
    assert isinstance(reader, CachedTable) and torch.equal(reader.cached_ids, ids.sort().values)
    assert reader.table.host.data_ptr() == small.features.data_ptr()  # the shared table, not a copy
    hits = CacheHits(reader)
    member = torch.zeros(small.num_nodes, dtype=torch.bool)
    member[ids] = True
    want = {Phase.TRAIN: [0, 0], Phase.VAL: [0, 0]}
    for phase in (Phase.TRAIN, Phase.VAL, Phase.TRAIN):
        idx = torch.randint(0, small.num_nodes, (333,), generator=gen)
        out = torch.full((400, small.feature_dim), -7.5)
        gather_into(reader, idx, out)
        assert torch.equal(out[:333], small.features[idx]) and bool((out[333:] == -7.5).all())
        assert torch.equal(reader.read(idx), small.features[idx])
        hits.add(0, phase, idx)
        want[phase][0] += int(member[idx].sum())
        want[phase][1] += 333
    for phase in (Phase.TRAIN, Phase.VAL):
        got = hits.take(0, phase)
        assert (got.hits, got.lookups) == tuple(want[phase])
        assert hits.take(0, phase).lookups == 0  # taken once
    with pytest.raises(ValueError, match="applies to the 'zerocopy' gather"):
        feature_reader(cpu_plan(mode=Mode.CPU, gather_in=GatherIn.TRAINER), small, torch.device("cpu"), ids)


@pytest.mark.parametrize("gather_in", ["producer", "trainer", "machine"])
def test_cpu_pipeline_with_a_cache_trains_identically_and_counts_hits(small, gather_in):
    """The same run with and without a cache (in the producer, gathered by the trainer, or in
    the machine's gatherer): the same losses and parameters, and each epoch's hit count is
    exactly the share of its training minibatches' input rows among the cached rows."""
    plan = cpu_plan(gather_in=gather_in, epochs=2, max_batches=6, val_batches=2,
                    **(dict(num_samplers=0) if gather_in == "machine" else {}))
    cached = replace(plan, cache=CacheConfig(policy=CachePolicy.DEGREE, fraction=0.2))
    pids, before = {}, snapshot()
    with_cache = run_pipeline(cached, small, on_start=pids.update)
    _assert_nothing_left(pids, before)
    without = run_pipeline(plan, small)
    ids = choose_cached_rows(cached, small)
    member = torch.zeros(small.num_nodes, dtype=torch.bool)
    member[ids] = True
    for e, ref in zip(with_cache, without):
        assert e.loss == pytest.approx(ref.loss, rel=1e-5) and e.val_acc == ref.val_acc
        assert e.param_checksum == pytest.approx(ref.param_checksum, rel=1e-5)
        inputs = training_inputs(cached, small, e.epoch)
        assert e.cache_rows == ids.numel() == round(0.2 * small.num_nodes)
        assert e.cache_lookups == sum(i.numel() for i in inputs) == e.feature_bytes // small.row_bytes
        assert e.cache_hits == sum(int(member[i].sum()) for i in inputs)
        assert 0 < e.cache_hit_rate < 1
        assert ref.cache_rows == ref.cache_lookups == 0 and ref.cache_hit_rate != ref.cache_hit_rate  # nan


def test_rows_chosen_once_are_used_as_given(small):
    """run_pipeline takes rows chosen already (data-parallel ranks share one choice)."""
    plan = cpu_plan(epochs=1, max_batches=3, val_batches=1, cache=CacheConfig(rows=50))
    rows = torch.arange(0, 1000, 20).share_memory_()
    (e,) = run_pipeline(plan, small, cached_rows=rows)
    member = torch.zeros(small.num_nodes, dtype=torch.bool)
    member[rows] = True
    inputs = training_inputs(plan, small, 0)
    assert e.cache_rows == 50 and e.cache_hits == sum(int(member[i].sum()) for i in inputs)


# --- GPU ------------------------------------------------------------------------------------


def gpu_plan(ds, **settings):
    settings.setdefault("cache", None)
    return make_plan("zerocopy", settings.pop("partition", "none"), row_bytes=ds.row_bytes, batch_size=512,
                     epochs=2, fanouts=(8, 8), hidden=64, lr=1e-2, **settings)


@pytest.mark.cuda
@pytest.mark.parametrize("settings", [dict(), dict(gather_in="trainer"), dict(gather_batches=1, num_slots=3),
                                      dict(partition="auto"), dict(feature_placement="managed"),
                                      dict(gather_in="machine", feature_placement="managed", partition="auto")],
                         ids=["producer", "trainer", "one-minibatch-per-gather", "mps-if-available", "managed-table",
                              "machine-gatherer"])
def test_gpu_pipeline_with_a_cache_trains_like_without(power_law, settings):
    """Zero-copy training on the GPU with a cache of 10% of the rows: the same losses and
    parameters as without (up to float tolerance: GPU reductions are not bitwise
    deterministic), and the hit counts exactly those of the minibatches' input rows."""
    plan = gpu_plan(power_law, **settings)
    cached = replace(plan, cache=CacheConfig(policy=CachePolicy.PRESAMPLE, fraction=0.1))
    pids, before = {}, snapshot()
    with_cache = run_pipeline(cached, power_law, on_start=pids.update)
    _assert_nothing_left(pids, before)
    without = run_pipeline(plan, power_law)
    ids = choose_cached_rows(cached, power_law)
    member = torch.zeros(power_law.num_nodes, dtype=torch.bool)
    member[ids] = True
    for e, ref in zip(with_cache, without):
        assert e.loss == pytest.approx(ref.loss, rel=1e-3)
        assert e.param_checksum == pytest.approx(ref.param_checksum, rel=1e-3)
        inputs = training_inputs(cached, power_law, e.epoch)
        assert e.cache_lookups == sum(i.numel() for i in inputs)
        assert e.cache_hits == sum(int(member[i].sum()) for i in inputs)
        # Well above the 10% that rows chosen at random would hold, in every epoch (the
        # pre-sampling pass draws epoch 0's own minibatches: later epochs hit less).
        assert e.cache_hit_rate > 0.15
    assert with_cache[-1].test_nodes == power_law.test_idx.numel()
    assert abs(without[-1].test_acc - with_cache[-1].test_acc) <= 0.02
