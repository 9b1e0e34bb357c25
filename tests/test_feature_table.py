"""zerocopy::gather_rows_cached against its documented rule, FeatureTable (a table in one
placement) and CachedTable (a GPU cache of hot rows around any reader) against ``table[idx]``,
feature sources loaded into tables, and the hotness scores that pick cached rows."""

from __future__ import annotations

import pickle

import numpy as np

import pytest
import torch
import torch.multiprocessing as mp

import pytorch_zerocopy as zc
from pytorch_zerocopy import hotness
from pytorch_zerocopy._compat import has_opcheck
from pytorch_zerocopy.feature_table import (CacheConfig, CachedTable, CachePolicy, FeatureTable, cached_rows_for,
                                            gather_rows_cached, node_cache_configs)
from pytorch_zerocopy.placement import Placement, cat_to_device_async
from pytorch_zerocopy.placement import gpu as gpu_device
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


# --- FeatureTable and CachedTable --------------------------------------------------------------

PLACEMENTS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("unified", id="unified"),  # read on the CPU where no GPU serves unified tensors
    pytest.param("managed", id="managed", marks=pytest.mark.cuda),
    pytest.param("cuda", id="cuda", marks=pytest.mark.cuda),
]


def check_reads(table, host: torch.Tensor, gen: torch.Generator) -> None:
    """Every way of reading rows of ``table`` returns ``host``'s rows on the table's device."""
    n, width = host.shape
    idx = torch.randint(0, n, (2000,), generator=gen)
    want = host[idx]
    dev = table.device
    for got in (table[idx], table.read(idx), zc.gather_rows(table, idx), torch.index_select(table, 0, idx),
                table[idx.int()], table[idx.tolist()], table.read(idx.to(dev))):
        assert got.device.type == dev.type
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    emb = torch.nn.functional.embedding(idx.view(40, 50), table)
    torch.testing.assert_close(emb.cpu(), want.view(40, 50, width), rtol=0, atol=0)
    torch.testing.assert_close(table[idx - n].cpu(), want, rtol=0, atol=0)  # negative ids count from the end
    torch.testing.assert_close(table[7].cpu(), host[7], rtol=0, atol=0)
    out = torch.full((2000, width), POISON.get(host.dtype, -7.5), dtype=host.dtype, device=dev)
    assert zc.gather_rows(table, idx, out, check_bounds=False) is out
    torch.testing.assert_close(out.cpu(), want, rtol=0, atol=0)
    with pytest.raises(IndexError, match=f"index {n} at position 1"):
        table[torch.tensor([0, n])]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_feature_table_reads_like_the_table(gen, placement):
    host = random_rows(400, 16, torch.float32, gen)
    table = FeatureTable(host, placement)
    assert table.placement is Placement.parse(placement)
    assert table.shape == (400, 16) and len(table) == 400 and table.row_bytes == 64
    check_reads(table, host, gen)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_cached_table_reads_like_the_table(gen, placement):
    host = random_rows(400, 16, torch.float32, gen)
    cached = torch.randperm(400, generator=gen)[:90]
    table = CachedTable(FeatureTable(host, placement), cached)
    assert table.cache_rows == 90 and table.cache_bytes == 90 * 64 and table.device == table.table.device
    check_reads(table, host, gen)
    idx = torch.randint(0, 400, (2000,), generator=gen)
    assert table.hit_rate(idx) == pytest.approx(torch.isin(idx, cached).float().mean().item())
    for rows in (None, torch.arange(400)):  # no cache, everything cached
        check_reads(CachedTable(table.table, rows), host, gen)


def test_cached_table_reads_hits_from_its_cache(gen):
    """Cached rows come from the cache: poisoning a cached row in the cache shows in the result."""
    host = random_rows(100, 4, torch.float32, gen)
    table = FeatureTable(host).with_cache(torch.tensor([3, 50, 99]))
    table.cache[int(table.slot_of[50])] = -7.5
    got = table[torch.tensor([50, 51, 3])].cpu()
    assert (got[0] == -7.5).all()
    torch.testing.assert_close(got[1:], host[[51, 3]], rtol=0, atol=0)


class _Reader:
    """A reader that is not a FeatureTable: the cache reads its misses through ``read``."""

    def __init__(self, table: FeatureTable):
        self.inner, self.device, self.reads = table, table.device, 0

    @property
    def shape(self):
        return self.inner.shape

    @property
    def dtype(self):
        return self.inner.dtype

    def read(self, ids, out=None, *, check_bounds=True):
        self.reads += int(ids.numel())
        return self.inner.read(ids, out, check_bounds=check_bounds)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_cached_table_wraps_any_reader(gen, placement):
    host = random_rows(300, 5, torch.float16, gen)
    reader = _Reader(FeatureTable(host, placement))
    cached = torch.randperm(300, generator=gen)[:100]
    table = CachedTable(reader, cached)
    reader.reads = 0
    idx = torch.randint(0, 300, (1500,), generator=gen)
    torch.testing.assert_close(table.read(idx).cpu(), host[idx], rtol=0, atol=0)
    assert reader.reads == int((~torch.isin(idx, cached)).sum())  # only the misses reach the reader
    with pytest.raises(IndexError, match="index 300 at position 1"):
        table.read(torch.tensor([0, 300]))


def test_feature_table_bad_input(gen):
    host = random_rows(30, 4, torch.float32, gen)
    table = FeatureTable(host)
    with pytest.raises(IndexError, match="cached row 30 is out of range for a table with 30 rows"):
        CachedTable(table, torch.tensor([1, 30]))
    with pytest.raises(IndexError, match="cached row -1 is out of range"):
        CachedTable(table, torch.tensor([-1]))
    with pytest.raises(ValueError, match="repeats a row id"):
        CachedTable(table, torch.tensor([4, 2, 4]))
    with pytest.raises(TypeError, match="cached_rows must be a 1-D int32/int64 tensor"):
        CachedTable(table, torch.tensor([1.0]))
    with pytest.raises(TypeError, match="must be a feature reader"):
        CachedTable(host, torch.tensor([1]))
    with pytest.raises(ValueError, match="must be 2-D"):
        FeatureTable(host.view(-1))
    with pytest.raises(ValueError, match=r"FeatureTable placement must be one of .*'managed'.*got 'pinned'"):
        FeatureTable(host, "pinned")
    with pytest.raises(ValueError, match="'uvm' migrates pages"):
        FeatureTable(host, "uvm")
    with pytest.raises(TypeError, match="tuning must be a GatherTuning"):
        FeatureTable(host, tuning=4)
    with pytest.raises(TypeError, match="indexing by integer ids only"):
        table[1:3]
    with pytest.raises(TypeError, match="index must hold integers"):
        table[torch.tensor([1.0])]
    with pytest.raises(IndexError, match="index 31 at position 0"):
        table[torch.tensor([31])]


def test_gpu_placements_without_a_gpu_are_a_clear_error(gen):
    if zc.gpu_backed():
        pytest.skip("a GPU serves unified tensors here")
    for placement in ("managed", "cuda"):
        with pytest.raises(ValueError, match=f"placement '{placement}' .* needs a CUDA build"):
            FeatureTable(random_rows(5, 2, torch.float32, gen), placement)


@pytest.mark.parametrize("placement", ["cpu", "unified"])
def test_cached_table_detects_writes_and_refreshes(gen, placement):
    """Row 5 is cached, row 6 is not: writes through the host tensor reach the table (it aliases
    them) and make the cache stale until refreshed."""
    host = random_rows(64, 3, torch.float32, gen)
    table = CachedTable(FeatureTable(host, placement), torch.tensor([0, 5, 9]))
    idx = torch.tensor([5, 6, 0])
    host[5:7].mul_(2)  # through a view of the table: same version counter
    with pytest.raises(RuntimeError, match="written after its rows were cached.*refresh"):
        table[idx]
    table.refresh()
    torch.testing.assert_close(table[idx].cpu(), host[idx], rtol=0, atol=0)


@pytest.mark.parametrize("on", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_cat_to_device_async_concatenates_converted_parts(on):
    seeds = torch.tensor([[5, 1], [9, 7]])
    labels = torch.tensor([3, 0, 2], dtype=torch.int16)
    out = cat_to_device_async([seeds, labels], torch.device(on), torch.int64)
    assert out.device.type == on and out.dtype == torch.int64
    assert out.cpu().tolist() == [5, 1, 9, 7, 3, 0, 2]
    assert cat_to_device_async([], torch.device(on), torch.int64).numel() == 0


def test_a_mapping_watches_the_tensor_it_maps(gen):
    """A table over a unified mapping of a host tensor sees that tensor's writes only through
    ``watch``: with it, a cache over the table notices them."""
    host = random_rows(64, 3, torch.float32, gen)
    mapping = zc.to_unified(host)
    table = CachedTable(FeatureTable(mapping, "unified", watch=host), torch.tensor([0, 5, 9]))
    host[5].add_(1)
    with pytest.raises(RuntimeError, match="refresh"):
        table[torch.tensor([5])]
    table.refresh()
    torch.testing.assert_close(table[torch.tensor([5, 6])].cpu(), host[[5, 6]], rtol=0, atol=0)
    with pytest.raises(TypeError, match="watch must be the CPU tensor"):
        FeatureTable(mapping, "unified", watch="host")


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["managed", "cuda"])
@pytest.mark.parametrize("cached", [False, True])
def test_copied_tables_refuse_reads_after_host_writes_until_refreshed(gen, placement, cached):
    """A copy of a host tensor never serves rows older than the tensor silently: an in-place
    write to it makes the next read raise; refresh() copies it again (cache included)."""
    host = random_rows(64, 3, torch.float32, gen)
    plain = FeatureTable(host, placement)
    table = CachedTable(plain, torch.tensor([0, 5, 9])) if cached else plain
    idx = torch.tensor([5, 6, 0])
    torch.testing.assert_close(table[idx].cpu(), host[idx], rtol=0, atol=0)
    host[5:7].mul_(2)  # through a view: the same version counter
    with pytest.raises(RuntimeError, match="refresh"):
        table[idx]
    table.refresh()
    torch.testing.assert_close(table[idx].cpu(), host[idx], rtol=0, atol=0)


@pytest.mark.cuda
def test_cache_larger_than_free_memory(gen, monkeypatch):
    host = random_rows(1000, 8, torch.float32, gen)
    table = FeatureTable(host)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (1024, 80 << 30))
    allocated = torch.cuda.memory_allocated
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: allocated(device))  # no cached blocks
    before = torch.cuda.memory_allocated()
    with pytest.raises(torch.cuda.OutOfMemoryError,
                       match=r"cache of 500 rows x 32 B = 15.6 KiB plus its slot map \(3.9 KiB\).*1.0 KiB free"):
        CachedTable(table, torch.arange(500))
    assert torch.cuda.memory_allocated() == before


def _child_reads(table, idx, results):
    placement = table.placement.value if table.placement is not None else None
    rows = getattr(table, "cache_rows", 0)
    results.put((str(table.device.type), rows, placement, table[idx].cpu().tolist()))  # plain values


@pytest.mark.parametrize("placement", ["cpu", "unified"])
def test_tables_cross_processes(gen, placement):
    host = random_rows(200, 6, torch.float32, gen).share_memory_()
    idx = torch.randint(0, 200, (50,), generator=gen)
    ctx = mp.get_context("spawn")
    for table in (FeatureTable(host, placement), CachedTable(FeatureTable(host, placement), torch.tensor([1, 10, 100]))):
        results = ctx.Queue()
        child = ctx.Process(target=_child_reads, args=(table, idx, results))
        child.start()
        device_type, cache_rows, placement_value, got = results.get(timeout=120)
        child.join(60)
        assert child.exitcode == 0
        assert device_type == table.device.type and placement_value == placement
        assert cache_rows == getattr(table, "cache_rows", 0)
        torch.testing.assert_close(torch.tensor(got), host[idx], rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="must hold its rows in shared memory"):
        pickle.dumps(FeatureTable(random_rows(5, 2, torch.float32, gen), "cpu"))


@pytest.mark.cuda
def test_private_tables_refuse_to_cross_processes(gen):
    with pytest.raises(RuntimeError, match="not 'managed'.*send the dataset's feature source"):
        pickle.dumps(FeatureTable(random_rows(5, 2, torch.float32, gen).share_memory_(), "managed"))


def test_feature_table_loads_sources(gen, tmp_path):
    """A table loaded from each kind of source holds the source's rows; a host tensor source is
    used in place (no copy) where the placement reads host memory."""
    from pytorch_zerocopy.datasets import GeneratedFeatures, NpyFeatures, TensorFeatures
    from pytorch_zerocopy.datasets.features import shared_rows

    host = random_rows(300, 12, torch.float32, gen)
    np.save(tmp_path / "f.npy", host.numpy())
    np.savez_compressed(tmp_path / "d.npz", node_feat=host.numpy().astype(np.float16))
    placements = ["cpu", "unified"] + (["managed", "cuda"] if zc.gpu_backed() else [])
    sources = [TensorFeatures(host), NpyFeatures.open(tmp_path / "f.npy"),
               NpyFeatures.open(tmp_path / "d.npz", member="node_feat"),
               GeneratedFeatures((300, 12), torch.float32, 7, 0.3, seed=5, chunk_bytes=1000)]
    for source in sources:
        want = shared_rows(source)
        assert want.shape == (300, 12) and want.dtype == source.dtype
        for placement in placements:
            table = FeatureTable.load(source, placement)
            assert table.placement is Placement.parse(placement)
            idx = torch.randint(0, 300, (500,), generator=gen)
            torch.testing.assert_close(table.read(idx).cpu(), want[idx], rtol=0, atol=0)
    torch.testing.assert_close(shared_rows(sources[2]), host.half(), rtol=0, atol=0)
    assert FeatureTable.load(TensorFeatures(host), "cpu").host.data_ptr() == host.data_ptr()
    assert FeatureTable.load(TensorFeatures(host), "unified").host.data_ptr() == host.data_ptr()
    generated = GeneratedFeatures((300, 12), torch.float32, 7, 0.3, seed=5, chunk_bytes=1000)
    assert torch.equal(shared_rows(generated), shared_rows(generated))  # deterministic
    np.save(tmp_path / "bad.npy", np.zeros((3, 4, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="must be 2-D"):
        NpyFeatures.open(tmp_path / "bad.npy")
    (tmp_path / "table.csv").write_text("1,2\n3,4\n")
    with pytest.raises(ValueError, match="is not a NumPy .npy array"):
        NpyFeatures.open(tmp_path / "table.csv")
    short = tmp_path / "short.npy"
    short.write_bytes((tmp_path / "f.npy").read_bytes()[:-100])
    with pytest.raises(ValueError, match="is truncated"):
        shared_rows(NpyFeatures.open(short))


@pytest.mark.cuda
@pytest.mark.whole_gpu  # reads the device's free memory: alone, so no other process moves it
def test_managed_table_stays_in_host_memory(gen):
    """Reading every page of a managed table on the GPU takes no GPU memory (a migrating copy
    would take its size), whether it was copied from a host tensor or filled in place."""
    FeatureTable(torch.ones(1 << 20, 1), "managed").source.sum()  # first kernel, first managed range: load code now
    host = random_rows(1 << 18, 1024, torch.float32, gen)  # 1 GiB
    from pytorch_zerocopy.datasets import GeneratedFeatures

    for table in (FeatureTable(host, "managed"),
                  FeatureTable.load(GeneratedFeatures((1 << 18, 1024), torch.float32, 7, 0.3, seed=1, device="cuda"),
                                    "managed")):
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info()[0]
        top = table.source.amax(dim=0)  # reads every page; its result and workspace are a few KiB
        used = free_before - torch.cuda.mem_get_info()[0]
        assert used < (256 << 20), f"reading the 1 GiB managed table took {used} B of GPU memory: its pages migrated"
        assert top.numel() == 1024
        del table, top
    torch.testing.assert_close(FeatureTable(host, "managed").source[::997].cpu(), host[::997], rtol=0, atol=0)


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


def _hottest_by_stable_sort(score: torch.Tensor, count: int) -> torch.Tensor:
    count = max(0, min(count, score.numel()))
    order = torch.sort(score, descending=True, stable=True).indices[:count]
    return order[score[order] > 0]


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.uint8])
def test_hottest_matches_the_stable_sort(gen, dtype):
    """Integer scores are ranked by their histogram: the same ids in the same order as a stable
    descending sort, with many ties at the cut, few or no positive scores, and every count."""
    for n, top, zeros in ((1, 3, 0.0), (500, 3, 0.0), (2000, 40, 0.5), (2000, 1, 0.9), (300, 0, 0.0),
                          (5000, 200, 0.98)):
        score = torch.randint(0, top + 1, (n,), generator=gen)
        score[torch.rand(n, generator=gen) < zeros] = 0
        score = score.to(dtype)
        for count in sorted({0, 1, n // 7, n // 2, n - 1, n, n + 3, int(torch.randint(0, n + 1, (1,), generator=gen))}):
            got = hotness.hottest(score, count)
            assert got.dtype == torch.int64
            assert torch.equal(got, _hottest_by_stable_sort(score.long(), count)), (n, top, count)


def test_hottest_falls_back_to_sorting_other_scores(gen):
    floats = torch.rand(1000, generator=gen) - 0.3
    assert torch.equal(hotness.hottest(floats, 400), _hottest_by_stable_sort(floats, 400))
    wide = torch.randint(0, 1 << 40, (1000,), generator=gen)  # past the histogram's range
    wide[::3] = 7
    assert torch.equal(hotness.hottest(wide, 600), _hottest_by_stable_sort(wide, 600))
    negative = torch.randint(-5, 6, (1000,), generator=gen)
    assert torch.equal(hotness.hottest(negative, 900), _hottest_by_stable_sort(negative, 900))


def test_presample_hotness_is_the_serial_loop_on_any_thread_count(gen):
    """Batches sampled on several threads count the same rows as the one-batch-at-a-time loop
    (each batch's sample depends on its own seed), and the caller's thread count is kept."""
    import math

    from pytorch_zerocopy.sampling import sample_layers

    g = CSRGraph.from_coo(torch.randint(0, 3000, (40000,), generator=gen),
                          torch.randint(0, 3000, (40000,), generator=gen), num_nodes=3000)
    seeds = torch.randperm(3000, generator=gen)[:700]
    batch_size, fanouts, seed, batches = 32, (5, 4), 11, 50  # 22 batches an epoch: a second, reshuffled one
    perm = torch.Generator().manual_seed(seed)
    epoch = math.ceil(seeds.numel() / batch_size)
    expected = torch.zeros(3000, dtype=torch.int64)
    for b in range(batches):
        if b % epoch == 0:
            order = torch.randperm(seeds.numel(), generator=perm)
        k = b % epoch
        nodes = sample_layers(g, seeds[order[k * batch_size:(k + 1) * batch_size]], fanouts, edge_dir="out",
                              seed=seed * 1_000_003 + b)[0].nodes
        expected.index_add_(0, nodes, torch.ones_like(nodes))
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            got = hotness.presample_hotness(g, seeds, fanouts, batch_size=batch_size, num_batches=batches,
                                            edge_dir="out", seed=seed)
            assert torch.equal(got, expected)
            assert torch.get_num_threads() == n
    finally:
        torch.set_num_threads(threads)


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
    ft = CachedTable.for_graph(FeatureTable(table), g, CacheConfig(rows=2))
    assert ft.cached_ids.tolist() == [0, 1]  # hottest by in-list count: node 0 (2), then the lowest-id 1s
    pre = CachedTable.for_graph(FeatureTable(table), g, CacheConfig(policy=CachePolicy.PRESAMPLE, fraction=0.5,
                                                                    fanouts=(2,), batch_size=2), seeds=torch.tensor([2, 0]))
    assert pre.cache_rows <= 3 and 2 in pre.cached_ids.tolist()
    with pytest.raises(ValueError, match="needs seeds"):
        CachedTable.for_graph(FeatureTable(table), g, CacheConfig(policy=CachePolicy.PRESAMPLE, rows=2))
    with pytest.raises(ValueError, match="the graph has 6 nodes but the table 5 rows"):
        CachedTable.for_graph(FeatureTable(table[:5]), g, CacheConfig(rows=2))


def test_rows_chosen_without_a_gpu_then_built(gen):
    """A parent picks the rows on the CPU; a CachedTable is built from (table, ids) elsewhere."""
    g = small_graph()
    table = random_rows(6, 4, torch.float32, gen)
    ids = cached_rows_for(g, CacheConfig(cache_bytes=3 * 16), 6, 16)
    assert ids.device.type == "cpu" and ids.tolist() == [0, 1, 2]
    ft = CachedTable(FeatureTable(table), ids)
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
    """A ``cpu`` table keeps its cache in host memory on any machine; ``count_hits`` counts
    the cached entries of an index (repeats included) as a 0-d tensor on the cache's device;
    ``torch.index_select`` still reaches the CachedTable when a library wraps it (PyG does)."""
    table = random_rows(500, 6, torch.float32, gen)
    ids = torch.randperm(500, generator=gen)[:120]
    ft = CachedTable(FeatureTable(table, "cpu"), ids)
    assert ft.device == torch.device("cpu") and ft.cache.device.type == "cpu"
    idx = torch.cat([ids[:30], ids[:5], torch.randint(0, 500, (200,), generator=gen)])
    held = torch.zeros(500, dtype=torch.bool)
    held[ids] = True
    hits = ft.count_hits(idx)
    assert hits.dim() == 0 and hits.dtype == torch.int64 and int(hits) == int(held[idx].sum())
    assert ft.hit_rate(idx) == pytest.approx(int(held[idx].sum()) / idx.numel())
    assert int(CachedTable(FeatureTable(table, "cpu"), None).count_hits(idx)) == 0
    assert torch.equal(ft.read(idx), table[idx])
    original = torch.index_select

    def wrapped(input, dim, index, *, out=None):
        return original(input, dim, index) if out is None else original(input, dim, index, out=out)

    monkeypatch.setattr(torch, "index_select", wrapped)
    assert torch.equal(torch.index_select(ft, 0, idx), table[idx])
    with pytest.raises(ValueError, match="expected a GPU, got meta"):
        gpu_device("meta")


def test_side_tables_are_read_from_gpu_memory_while_small():
    """Labels and masks (small next to the features) go to GPU memory, smallest first, while
    together they fit the GPU share; a table as big as a share of the features stays mapped."""
    from pytorch_zerocopy.feature_table import SIDE_TABLES_GPU_SHARE, default_side_readings

    sides = {"y": 8_000_000, "train_mask": 1_000_000, "big": 200_000_000}
    got = default_side_readings(sides, 512_000_000, 80 << 30)
    assert got == {"train_mask": Placement.GPU, "y": Placement.GPU, "big": Placement.MAPPED}
    got = default_side_readings({"c": 30, "a": 10, "b": 20}, 1_000_000, int(40 / SIDE_TABLES_GPU_SHARE))
    assert got == {"a": Placement.GPU, "b": Placement.GPU, "c": Placement.MAPPED}
    assert default_side_readings({}, 1, 1) == {}
