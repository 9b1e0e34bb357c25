"""zerocopy::gather_rows_cached against its documented rule, FeatureTable (a host table with a
GPU cache of hot rows) against ``table[idx]``, and the hotness scores that pick cached rows."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.multiprocessing as mp

import pytorch_zerocopy as zc
from pytorch_zerocopy import hotness
from pytorch_zerocopy._compat import has_opcheck
from pytorch_zerocopy.feature_table import (CacheConfig, CachePolicy, FeatureTable, HostMemory, cached_rows_for,
                                            gather_rows_cached, node_cache_configs)
from pytorch_zerocopy.graph import CSRGraph

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8]
POISON = {torch.float32: -7.5, torch.float16: -7.5, torch.bfloat16: -7.5, torch.int8: -7, torch.uint8: 251}

KINDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("unified", id="unified", marks=pytest.mark.cuda),
    pytest.param("cuda", id="cuda", marks=pytest.mark.cuda),
]


def random_rows(rows: int, width: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Values without zeros, away from the poison, so an unwritten or zeroed row shows."""
    if dtype.is_floating_point:
        t = torch.rand(rows, width, generator=gen) * 4 + 1
        return torch.where(torch.rand(rows, width, generator=gen) < 0.5, t, -t).to(dtype)
    hi = 100
    t = torch.randint(1, hi, (rows, width), generator=gen)
    if dtype == torch.int8:
        t = torch.where(torch.rand(rows, width, generator=gen) < 0.5, t, -t)
    return t.to(dtype)


def place(kind: str, table: torch.Tensor):
    """(table, device of cache/slot_of/output) for a table kind."""
    if kind == "cpu":
        return table, torch.device("cpu")
    if kind == "cuda":
        return table.cuda(), torch.device("cuda")
    return zc.to_unified(table), torch.device("cuda")


def rule(table: torch.Tensor, cache: torch.Tensor, slot_of: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The op's contract: cache[slot_of[i]] where that slot is in range, else table[i]."""
    idx = index.cpu().long()
    slots = slot_of.cpu().long()[idx]
    hit = (slots >= 0) & (slots < cache.shape[0])
    out = table.cpu()[idx].clone()
    out[hit] = cache.cpu()[slots[hit]]
    return out


def random_slots(rows: int, cache_rows: int, gen: torch.Generator) -> torch.Tensor:
    """A slot map with hits, -1, and slots outside the cache (which must read the table)."""
    slot_of = torch.full((rows,), -1, dtype=torch.int32)
    picked = torch.randperm(rows, generator=gen)[: min(rows, cache_rows + 3)]
    slot_of[picked] = torch.randperm(cache_rows + 3, generator=gen)[: picked.numel()].to(torch.int32)
    slot_of[torch.randint(0, rows, (3,), generator=gen)] = -5
    return slot_of


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cached_gather_follows_the_rule(kind, dtype, gen):
    for width in (1, 3, 33, 128):
        rows, cache_rows = 3000, 700
        host = random_rows(rows, width, dtype, gen)
        table, dev = place(kind, host)
        cache = random_rows(cache_rows, width, dtype, gen).to(dev)  # differs from the table: shows where rows came from
        slot_of = random_slots(rows, cache_rows, gen).to(dev)
        indices = {
            "short": torch.randint(0, rows, (300,), generator=gen),
            "long": torch.randint(0, rows, (5000,), generator=gen),  # sorted by address on the GPU
            "duplicates": torch.full((40,), 17, dtype=torch.long),
            "empty": torch.zeros(0, dtype=torch.long),
        }
        for name, index in indices.items():
            for idx_dtype in (torch.int32, torch.int64):
                idx = index.to(idx_dtype).to(dev)
                want = rule(host, cache, slot_of, idx)
                out = torch.full((idx.numel(), width), POISON[dtype], dtype=dtype, device=dev)
                got = gather_rows_cached(table, cache, slot_of, idx, out)
                assert got.data_ptr() == out.data_ptr()
                torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0,
                                           msg=f"{name} width={width} {idx_dtype} seed={gen.initial_seed()}")
                fresh = gather_rows_cached(table, cache, slot_of, idx, check_bounds=False)
                assert fresh.device.type == dev.type
                torch.testing.assert_close(fresh.cpu(), want, rtol=0, atol=0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64], ids=str)
def test_cached_gather_bad_indices(kind, idx_dtype, gen):
    host = random_rows(50, 6, torch.float32, gen)
    table, dev = place(kind, host)
    cache = host[:10].clone().to(dev)
    slot_of = torch.full((50,), -1, dtype=torch.int32)
    slot_of[:10] = torch.arange(10, dtype=torch.int32)
    slot_of = slot_of.to(dev)
    for values, bad, pos in (([1, 2, -1, 5], -1, 2), ([0, 50, 3], 50, 1)):
        with pytest.raises(IndexError, match=rf"index {bad} at position {pos} is out of bounds for a table with 50"):
            gather_rows_cached(table, cache, slot_of, torch.tensor(values, dtype=idx_dtype, device=dev))
    long_idx = torch.randint(0, 50, (4000,), generator=gen, dtype=idx_dtype)
    long_idx[3000], long_idx[3500] = -3, 60
    with pytest.raises(IndexError, match="index -3 at position 3000"):
        gather_rows_cached(table, cache, slot_of, long_idx.to(dev))
    got = gather_rows_cached(table, cache, slot_of, long_idx.to(dev), check_bounds=False).cpu()
    assert (got[[3000, 3500]] == 0).all()
    keep = torch.ones(4000, dtype=torch.bool)
    keep[[3000, 3500]] = False
    torch.testing.assert_close(got[keep], host[long_idx[keep].long()], rtol=0, atol=0)


def test_cached_gather_argument_errors(gen):
    table = random_rows(20, 4, torch.float32, gen)
    cache = table[:5].clone()
    slot_of = torch.full((20,), -1, dtype=torch.int32)
    idx = torch.tensor([1, 2])
    op = torch.ops.zerocopy.gather_rows_cached
    with pytest.raises(TypeError, match="cache must have the table's dtype Float, got Half"):
        op(table, cache.half(), slot_of, idx)
    with pytest.raises(ValueError, match="cache rows must have the table's width 4, got 3"):
        op(table, cache[:, :3], slot_of, idx)
    with pytest.raises(TypeError, match="slot_of must be Int, got Long"):
        op(table, cache, slot_of.long(), idx)
    with pytest.raises(ValueError, match=r"slot_of must hold one entry per table row \(20\), got 19"):
        op(table, cache, slot_of[:19], idx)
    with pytest.raises(TypeError, match="index must be int32 or int64"):
        op(table, cache, slot_of, idx.float())
    with pytest.raises(ValueError, match="table must be a 2-D tensor"):
        op(table.view(-1), cache, slot_of, idx)
    with pytest.raises(ValueError, match=r"out must have shape \[2, 4\]"):
        torch.ops.zerocopy.gather_rows_cached.out(table, cache, slot_of, idx, out=torch.empty(3, 4))
    with pytest.raises(TypeError, match="slot_of must be a tensor"):
        gather_rows_cached(table, cache, [1], idx)


@pytest.mark.cuda
def test_cached_gather_device_errors(gen):
    table = random_rows(20, 4, torch.float32, gen)
    slot_of = torch.full((20,), -1, dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="cache must be a CUDA tensor"):
        torch.ops.zerocopy.gather_rows_cached(zc.to_unified(table), table[:5].clone(), slot_of, torch.tensor([1]))
    with pytest.raises(ValueError, match="table must be unified or on cuda"):
        torch.ops.zerocopy.gather_rows_cached(table, table[:5].cuda(), slot_of, torch.tensor([1], device="cuda"))


@pytest.mark.skipif(not has_opcheck(), reason="torch.library.opcheck needs torch >= 2.4")
def test_cached_gather_opcheck(device, gen):
    table = random_rows(50, 7, torch.float32, gen).to(device)
    cache = table[10:20].clone()
    slot_of = torch.full((50,), -1, dtype=torch.int32)
    slot_of[10:20] = torch.arange(10, dtype=torch.int32)
    index = torch.randint(0, 50, (30,), generator=gen).to(device)
    args = (table, cache, slot_of.to(device), index)
    torch.library.opcheck(torch.ops.zerocopy.gather_rows_cached.default, args, {"check_bounds": True})
    out = torch.full((30, 7), -7.5, device=device)
    torch.library.opcheck(torch.ops.zerocopy.gather_rows_cached.out, args, {"out": out})


# --- FeatureTable -------------------------------------------------------------------------------


MEMORIES = [pytest.param(m, id=m.value) for m in HostMemory]


@pytest.mark.parametrize("memory", MEMORIES)
def test_feature_table_reads_like_the_table(gen, memory):
    host = random_rows(400, 16, torch.float32, gen)
    cached = torch.randperm(400, generator=gen)[:90]
    ft = FeatureTable(host, cached, memory=memory)
    assert ft.memory is memory
    assert ft.cache_rows == 90 and ft.cache_bytes == 90 * 64 and ft.shape == (400, 16) and len(ft) == 400
    idx = torch.randint(0, 400, (2000,), generator=gen)
    want = host[idx]
    dev = ft.device
    for got in (ft[idx], ft.gather(idx), zc.gather_rows(ft, idx), torch.index_select(ft, 0, idx),
                ft[idx.int()], ft[idx.tolist()], ft.gather(idx.to(dev))):
        assert got.device.type == dev.type
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    emb = torch.nn.functional.embedding(idx.view(40, 50), ft)
    torch.testing.assert_close(emb.cpu(), want.view(40, 50, 16), rtol=0, atol=0)
    torch.testing.assert_close(ft[idx - 400].cpu(), want, rtol=0, atol=0)  # negative ids count from the end
    torch.testing.assert_close(ft[7].cpu(), host[7], rtol=0, atol=0)
    out = torch.full((2000, 16), -7.5, device=dev)
    assert zc.gather_rows(ft, idx, out, check_bounds=False) is out
    torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)
    hit = torch.isin(idx, cached).float().mean().item()
    assert ft.hit_rate(idx) == pytest.approx(hit)


def test_feature_table_reads_hits_from_its_cache(gen):
    """Cached rows come from the cache: poisoning a cached row in the cache shows in the result."""
    host = random_rows(100, 4, torch.float32, gen)
    ft = FeatureTable(host, torch.tensor([3, 50, 99]))
    slot = int(ft.slot_of[50])
    ft.cache[slot] = -7.5
    got = ft[torch.tensor([50, 51, 3])].cpu()
    assert (got[0] == -7.5).all()
    torch.testing.assert_close(got[1:], host[[51, 3]], rtol=0, atol=0)


@pytest.mark.parametrize("memory", MEMORIES)
def test_feature_table_without_cache_and_full_cache(gen, memory):
    host = random_rows(300, 5, torch.float16, gen)
    idx = torch.randint(0, 300, (1500,), generator=gen)
    for cached in (None, torch.arange(300)):
        ft = FeatureTable(host, cached, memory=memory)
        torch.testing.assert_close(ft[idx].cpu(), host[idx], rtol=0, atol=0)
        with pytest.raises(IndexError, match="index 300 at position 1"):
            ft[torch.tensor([0, 300])]


def test_feature_table_bad_input(gen):
    host = random_rows(30, 4, torch.float32, gen)
    with pytest.raises(IndexError, match="cached row 30 is out of range for a table with 30 rows"):
        FeatureTable(host, torch.tensor([1, 30]))
    with pytest.raises(IndexError, match="cached row -1 is out of range"):
        FeatureTable(host, torch.tensor([-1]))
    with pytest.raises(ValueError, match="repeats a row id"):
        FeatureTable(host, torch.tensor([4, 2, 4]))
    with pytest.raises(TypeError, match="cached_rows must be a 1-D int32/int64 tensor"):
        FeatureTable(host, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="must be 2-D"):
        FeatureTable(host.view(-1))
    ft = FeatureTable(host, torch.tensor([1, 2]))
    with pytest.raises(TypeError, match="indexing by integer ids only"):
        ft[1:3]
    with pytest.raises(TypeError, match="index must hold integers"):
        ft[torch.tensor([1.0])]
    with pytest.raises(IndexError, match="index 31 at position 0"):
        ft[torch.tensor([31])]


@pytest.mark.parametrize("memory", MEMORIES)
def test_feature_table_detects_writes_and_refreshes(gen, memory):
    """Row 5 is cached, row 6 is not: a managed copy of the table is refreshed too."""
    host = random_rows(64, 3, torch.float32, gen)
    ft = FeatureTable(host, torch.tensor([0, 5, 9]), memory=memory)
    idx = torch.tensor([5, 6, 0])
    host[5:7].mul_(2)  # through a view of the table: same version counter
    with pytest.raises(RuntimeError, match="written after its rows were cached.*refresh"):
        ft[idx]
    ft.refresh()
    torch.testing.assert_close(ft[idx].cpu(), host[idx], rtol=0, atol=0)


@pytest.mark.cuda
def test_feature_table_cache_larger_than_free_memory(gen, monkeypatch):
    host = random_rows(1000, 8, torch.float32, gen)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1024, 80 << 30))
    allocated = torch.cuda.memory_allocated
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: allocated(device))  # no cached blocks
    before = torch.cuda.memory_allocated()
    with pytest.raises(torch.cuda.OutOfMemoryError,
                       match=r"cache of 500 rows x 32 B = 15.6 KiB plus its slot map \(3.9 KiB\).*1.0 KiB free"):
        FeatureTable(host, torch.arange(500))
    assert torch.cuda.memory_allocated() == before


def _child_gathers(ft, idx, results):
    results.put((str(ft.device.type), ft.cache_rows, ft.memory.value, ft[idx].cpu().tolist()))  # plain values: the child exits next


@pytest.mark.parametrize("memory", MEMORIES)
def test_feature_table_crosses_processes(gen, memory):
    host = random_rows(200, 6, torch.float32, gen).share_memory_()
    ft = FeatureTable(host, torch.tensor([1, 10, 100]), memory=memory)
    idx = torch.randint(0, 200, (50,), generator=gen)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    child = ctx.Process(target=_child_gathers, args=(ft, idx, results))
    child.start()
    device_type, cache_rows, memory_value, got = results.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0
    assert device_type == ft.device.type and cache_rows == 3 and memory_value == memory.value
    torch.testing.assert_close(torch.tensor(got), host[idx], rtol=0, atol=0)
    private = FeatureTable(random_rows(5, 2, torch.float32, gen), torch.tensor([0]))
    with pytest.raises(RuntimeError, match="must hold its table in shared memory"):
        pickle.dumps(private)


@pytest.mark.parametrize("memory", MEMORIES)
def test_feature_table_with_cache_shares_the_table(gen, memory):
    host = random_rows(500, 8, torch.float32, gen)
    ft = FeatureTable(host, torch.arange(10), memory=memory)
    other = ft.with_cache(torch.arange(100, 300))
    assert other.memory is memory and other.cache_rows == 200 and ft.cache_rows == 10
    assert other._read.data_ptr() == ft._read.data_ptr()  # the same table reads: nothing copied again
    assert other.cache.data_ptr() != ft.cache.data_ptr()
    idx = torch.randint(0, 500, (3000,), generator=gen)
    for t in (ft, other, ft.with_cache(None)):
        torch.testing.assert_close(t[idx].cpu(), host[idx], rtol=0, atol=0)
    assert other.hit_rate(idx) == pytest.approx(((idx >= 100) & (idx < 300)).float().mean().item())
    with pytest.raises(IndexError, match="cached row 500 is out of range"):
        ft.with_cache(torch.tensor([500]))


def test_feature_host_memory_argument(gen):
    host = random_rows(20, 4, torch.float32, gen)
    assert FeatureTable(host).memory is HostMemory.MAPPED
    assert FeatureTable(host, memory="managed").memory is HostMemory.MANAGED
    with pytest.raises(ValueError, match=r"memory must be a HostMemory or one of \['mapped', 'managed'\], got 'pinned'"):
        FeatureTable(host, memory="pinned")
    with pytest.raises(TypeError, match="table must be a tensor"):
        zc.to_managed_host([1, 2])


@pytest.mark.cuda
def test_to_managed_host_copies_and_checks(gen):
    host = random_rows(1 << 12, 256, torch.float32, gen)
    m = zc.to_managed_host(host)
    assert m.is_cuda and m.shape == host.shape and m.dtype == host.dtype
    assert torch.equal(m[::97].cpu(), host[::97])
    idx = torch.randint(0, host.shape[0], (5000,), generator=gen)
    out = torch.full((5000, 256), -7.5, device="cuda")
    zc.gather_rows(m, idx, out)
    torch.testing.assert_close(out.cpu(), host[idx], rtol=0, atol=0)
    with pytest.raises(IndexError, match="out of bounds"):
        zc.gather_rows(m, torch.tensor([1 << 12]))
    with pytest.raises(ValueError, match="must live in host memory"):
        zc.to_managed_host(host[:4].cuda())
    with pytest.raises(ValueError, match="device must be a GPU"):
        zc.to_managed_host(host[:4], "cpu")
    huge = torch.empty(1, dtype=torch.float32).expand(1 << 42)  # 16 TiB, never materialised
    with pytest.raises(torch.OutOfMemoryError, match="host memory"):
        zc.to_managed_host(huge)


@pytest.mark.cuda
@pytest.mark.whole_gpu  # reads the device's free memory: alone, so no other process moves it
def test_to_managed_host_stays_in_host_memory(gen):
    """Reading every page of the managed copy on the GPU takes no GPU memory (a migrating copy would
    take its size)."""
    zc.to_managed_host(torch.ones(1 << 20)).sum()  # first kernel, first managed range: load code now
    host = random_rows(1 << 18, 1024, torch.float32, gen)  # 1 GiB
    m = zc.to_managed_host(host)
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    top = m.amax(dim=0)  # reads every page; its result and workspace are a few KiB
    assert torch.equal(top.cpu(), host.amax(dim=0))
    used = free_before - torch.cuda.mem_get_info()[0]
    assert used < (256 << 20), f"reading the 1 GiB managed copy took {used} B of GPU memory: its pages migrated"
    del m, top


# --- which rows: hotness and CacheConfig -----------------------------------------------------------


def small_graph() -> CSRGraph:
    # 0 -> 1, 0 -> 2, 3 -> 2, 4 -> 2, 1 -> 2, 2 -> 0 ; node 5 isolated
    return CSRGraph.from_coo(torch.tensor([0, 0, 3, 4, 1, 2]), torch.tensor([1, 2, 2, 2, 2, 0]), num_nodes=6)


def test_degree_hotness():
    g = small_graph()
    assert hotness.degree_hotness(g, "in").tolist() == [2, 1, 1, 1, 1, 0]   # out-degree: in-lists holding it
    assert hotness.degree_hotness(g, "out").tolist() == [1, 1, 4, 0, 0, 0]  # in-degree: out-lists holding it
    assert hotness.degree_hotness((g.indptr, g.indices), "out").tolist() == [1, 1, 4, 0, 0, 0]
    with pytest.raises(ValueError, match="edge_dir"):
        hotness.degree_hotness(g, "both")


def test_hottest_orders_and_drops_cold():
    score = torch.tensor([3, 0, 5, 3, 1, 0])
    assert hotness.hottest(score, 4).tolist() == [2, 0, 3, 4]
    assert hotness.hottest(score, 10).tolist() == [2, 0, 3, 4]
    assert hotness.hottest(score, 0).tolist() == []


def test_presample_hotness(gen):
    g = CSRGraph.from_coo(torch.randint(0, 500, (4000,), generator=gen), torch.randint(0, 500, (4000,), generator=gen),
                          num_nodes=500)
    seeds = torch.arange(0, 500, 5)
    a = hotness.presample_hotness(g, seeds, [4, 3], batch_size=16, seed=3)
    b = hotness.presample_hotness(g, seeds, [4, 3], batch_size=16, seed=3)
    assert torch.equal(a, b) and a.dtype == torch.int64 and a.numel() == 500
    assert (a[seeds] >= 1).all()  # one epoch: every seed is an input node of its own batch
    assert int(a.sum()) > seeds.numel()
    two = hotness.presample_hotness(g, seeds, [4, 3], batch_size=16, num_batches=14, seed=3)
    assert (two[seeds] >= 2).all()  # two epochs (7 batches each)
    with pytest.raises(ValueError, match="batch_size"):
        hotness.presample_hotness(g, seeds, [4], batch_size=0)


def test_cache_config_sizes_and_policies(gen):
    with pytest.raises(ValueError, match="exactly one of rows, cache_bytes and fraction"):
        CacheConfig()
    with pytest.raises(ValueError, match="exactly one"):
        CacheConfig(rows=3, fraction=0.1)
    with pytest.raises(ValueError, match="fraction must be in"):
        CacheConfig(fraction=1.5)
    with pytest.raises(ValueError, match="cache_bytes must be an int >= 0"):
        CacheConfig(cache_bytes=-1)
    with pytest.raises(TypeError, match="CachePolicy"):
        CacheConfig(policy="degree", rows=3)
    assert CacheConfig(rows=10).rows_for(5, 8) == 5
    assert CacheConfig(cache_bytes=100).rows_for(50, 8) == 12
    assert CacheConfig(fraction=0.2).rows_for(50, 8) == 10
    g = small_graph()
    table = random_rows(6, 4, torch.float32, gen)
    ft = FeatureTable.for_graph(table, g, CacheConfig(rows=2))
    assert ft.cached_ids.tolist() == [0, 1]  # hottest by in-list count: node 0 (2), then the lowest-id 1s
    pre = FeatureTable.for_graph(table, g, CacheConfig(policy=CachePolicy.PRESAMPLE, fraction=0.5, fanouts=(2,),
                                                       batch_size=2), seeds=torch.tensor([2, 0]))
    assert pre.cache_rows <= 3 and 2 in pre.cached_ids.tolist()
    with pytest.raises(ValueError, match="needs seeds"):
        FeatureTable.for_graph(table, g, CacheConfig(policy=CachePolicy.PRESAMPLE, rows=2))
    with pytest.raises(ValueError, match="the graph has 6 nodes but the table 5 rows"):
        FeatureTable.for_graph(table[:5], g, CacheConfig(rows=2))


def test_rows_chosen_without_a_gpu_then_built(gen):
    """A parent picks the rows on the CPU; a FeatureTable is built from (table, ids) elsewhere."""
    g = small_graph()
    table = random_rows(6, 4, torch.float32, gen)
    ids = cached_rows_for(g, CacheConfig(cache_bytes=3 * 16), 6, 16)
    assert ids.device.type == "cpu" and ids.tolist() == [0, 1, 2]
    ft = FeatureTable(table, ids)
    torch.testing.assert_close(ft[torch.tensor([2, 5, 0])].cpu(), table[[2, 5, 0]], rtol=0, atol=0)


def test_dgl_gpu_cache_argument():
    assert node_cache_configs(None) == {}
    cfg = node_cache_configs({"node": {"feat": 500}})
    assert cfg["feat"].rows == 500 and cfg["feat"].policy is CachePolicy.DEGREE
    with pytest.raises(NotImplementedError, match="edge-feature caches"):
        node_cache_configs({"edge": {"w": 10}})
    with pytest.raises(ValueError, match="gpu_cache must be a dict"):
        node_cache_configs({"nodes": {"feat": 1}})
    with pytest.raises(ValueError, match="rows must be an int >= 0"):
        node_cache_configs({"node": {"feat": -3}})


def test_cpu_cache_count_hits_and_a_wrapped_index_select(gen, monkeypatch):
    """``device='cpu'`` keeps the cache in host memory on any machine; ``count_hits`` counts
    the cached entries of an index (repeats included) as a 0-d tensor on the cache's device;
    ``torch.index_select`` still reaches the FeatureTable when a library wraps it (PyG does)."""
    table = random_rows(500, 6, torch.float32, gen)
    ids = torch.randperm(500, generator=gen)[:120]
    ft = FeatureTable(table, ids, device="cpu")
    assert ft.device == torch.device("cpu") and ft.cache.device.type == "cpu"
    idx = torch.cat([ids[:30], ids[:5], torch.randint(0, 500, (200,), generator=gen)])
    held = torch.zeros(500, dtype=torch.bool)
    held[ids] = True
    hits = ft.count_hits(idx)
    assert hits.dim() == 0 and hits.dtype == torch.int64 and int(hits) == int(held[idx].sum())
    assert ft.hit_rate(idx) == pytest.approx(int(held[idx].sum()) / idx.numel())
    assert int(FeatureTable(table, None, device="cpu").count_hits(idx)) == 0
    assert torch.equal(ft.gather(idx), table[idx])
    original = torch.index_select

    def wrapped(input, dim, index, *, out=None):
        return original(input, dim, index) if out is None else original(input, dim, index, out=out)

    monkeypatch.setattr(torch, "index_select", wrapped)
    assert torch.equal(torch.index_select(ft, 0, idx), table[idx])
    with pytest.raises(ValueError, match="a GPU or the CPU"):
        FeatureTable(table, ids, device="meta")
