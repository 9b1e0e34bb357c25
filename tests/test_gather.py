"""zerocopy::gather_rows against ``table.cpu()[index.cpu()]``, and the routing of row gathers on
unified tensors (``u[idx]``, ``index_select``, ``embedding``) to it."""

from __future__ import annotations

import os

import pytest
import torch

import pytorch_zerocopy as zc
from pytorch_zerocopy._compat import has_opcheck

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int32, torch.int64]
WIDTHS = [1, 3, 31, 32, 33, 255, 257]


SENTINEL = {torch.float32: -7.5, torch.float16: -7.5, torch.bfloat16: -7.5, torch.int8: -7, torch.uint8: 251,
            torch.int32: -7, torch.int64: -7}


def random_table(rows: int, width: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """Random values without zeros (and away from the sentinel), so unwritten rows show."""
    if dtype.is_floating_point:
        t = torch.rand(rows, width, generator=gen) * 4 + 1
        t = torch.where(torch.rand(rows, width, generator=gen) < 0.5, t, -t)
        return t.to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -100), min(info.max, 100)
    t = torch.randint(1, hi, (rows, width), generator=gen)
    if lo < 0:
        t = torch.where(torch.rand(rows, width, generator=gen) < 0.5, t, -t)
    return t.to(dtype)


def reference(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    host = table.cpu() if table.device.type != zc.DEVICE_TYPE else table.cpu().clone()
    return host[index.cpu().long()]


def make_table(kind: str, rows: int, width: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    t = random_table(rows, width, dtype, gen)
    if kind == "cpu":
        return t
    if kind == "cuda":
        return t.cuda()
    return zc.to_unified(t)


def index_variants(rows: int, gen: torch.Generator) -> dict:
    n = 3 * rows + 5
    rand = torch.randint(0, rows, (n,), generator=gen)
    return {
        "random": rand,
        "empty": torch.empty(0, dtype=torch.long),
        "duplicates": torch.full((17,), rows // 2, dtype=torch.long),
        "sorted": rand.sort().values,
        "reversed": torch.arange(rows - 1, -1, -1),
        "strided": torch.randint(0, rows, (2 * n,), generator=gen)[::2],
    }


TABLE_KINDS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("unified", id="unified"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.cuda),
]


def index_device(kind: str) -> str:
    return "cuda" if kind == "cuda" else "cpu"


# --- reference comparison ----------------------------------------------------------------


@pytest.mark.parametrize("kind", TABLE_KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_matches_reference_all_widths(kind, dtype, gen):
    for width in WIDTHS:
        table = make_table(kind, 97, width, dtype, gen)
        for name, index in index_variants(97, gen).items():
            for idx_dtype in (torch.int32, torch.int64):
                idx = index.to(idx_dtype).to(index_device(kind))
                if name == "strided":
                    idx = torch.randint(0, 97, (2 * 40,), generator=gen).to(idx_dtype).to(index_device(kind))[::2]
                    assert not idx.is_contiguous()
                got = zc.gather_rows(table, idx)
                want = reference(table, idx)
                assert got.shape == want.shape, (name, width)
                assert got.dtype == dtype
                torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0,
                                           msg=f"{name} width={width} {idx_dtype} seed={gen.initial_seed()}")


@pytest.mark.parametrize("kind", TABLE_KINDS)
def test_long_random_index_and_sorted_flag(kind, gen):
    # Long enough for the GPU kernel to sort the index (and to exercise every CPU thread).
    table = make_table(kind, 5000, 33, torch.float32, gen)
    index = torch.randint(0, 5000, (20000,), generator=gen).to(index_device(kind))
    torch.testing.assert_close(zc.gather_rows(table, index).cpu(), reference(table, index), rtol=0, atol=0)
    ordered = index.sort().values
    torch.testing.assert_close(zc.gather_rows(table, ordered, index_sorted=True).cpu(),
                               reference(table, ordered), rtol=0, atol=0)


@pytest.mark.parametrize("kind", TABLE_KINDS)
def test_out_is_written_completely(kind, gen):
    for dtype in DTYPES:
        for width in (1, 33, 257):
            table = make_table(kind, 60, width, dtype, gen)
            index = torch.randint(0, 60, (45,), generator=gen).to(index_device(kind))
            out_device = "cpu" if kind == "cpu" or not zc.gpu_backed() else "cuda"
            out = torch.full((45, width), SENTINEL[dtype], dtype=dtype, device=out_device)
            got = zc.gather_rows(table, index, out)
            assert got.data_ptr() == out.data_ptr()
            torch.testing.assert_close(out.cpu(), reference(table, index), rtol=0, atol=0)


@pytest.mark.parametrize("kind", TABLE_KINDS)
def test_zero_width_and_empty_table(kind, gen):
    # A table without elements has a null data pointer; its rows are still valid (and empty),
    # row 0 included, in caller order (short index) and in the GPU's sorted order (long index).
    table = make_table(kind, 10, 0, torch.float32, gen) if kind != "unified" else zc.empty_unified((10, 0))
    index = torch.tensor([3, 9, 0]).to(index_device(kind))
    assert zc.gather_rows(table, index).shape == (3, 0)
    long_index = torch.randint(0, 10, (3000,), generator=gen)
    long_index[1234] = 0
    assert zc.gather_rows(table, long_index.to(index_device(kind))).shape == (3000, 0)
    with pytest.raises(IndexError, match="index 10 at position 1"):
        zc.gather_rows(table, torch.tensor([3, 10, 0]).to(index_device(kind)))
    long_index[2345] = 10
    with pytest.raises(IndexError, match="index 10 at position 2345"):
        zc.gather_rows(table, long_index.to(index_device(kind)))
    no_rows = make_table(kind, 0, 4, torch.float32, gen) if kind != "unified" else zc.empty_unified((0, 4))
    assert zc.gather_rows(no_rows, torch.empty(0, dtype=torch.long, device=index_device(kind))).shape == (0, 4)
    with pytest.raises(IndexError, match="index 0 at position 0"):
        zc.gather_rows(no_rows, torch.zeros(1, dtype=torch.long, device=index_device(kind)))


@pytest.mark.parametrize("kind", TABLE_KINDS)
def test_strided_rows(kind, gen):
    # Rows with a pitch wider than the row (a column slice), and a transposed table (copied).
    base = make_table("cpu", 50, 40, torch.float32, gen)
    for view in (base[:, 3:20], base.t()[:, :30]):
        table = view.to("cuda") if kind == "cuda" else view
        if kind == "unified":
            table = zc.to_unified(base)[:, 3:20] if view.stride(1) == 1 else view.contiguous()
        index = torch.randint(0, table.shape[0], (70,), generator=gen).to(index_device(kind))
        torch.testing.assert_close(zc.gather_rows(table, index).cpu(), reference(table, index), rtol=0, atol=0)


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TABLE_KINDS)
@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64], ids=str)
def test_bad_indices_raise_index_error(kind, idx_dtype, gen):
    table = make_table(kind, 20, 8, torch.float32, gen)
    dev = index_device(kind)
    cases = [([1, 2, -1, 5], -1, 2), ([0, 20, 3, 25], 20, 1), ([4, 5, 6, 7, 1000], 1000, 4)]
    for values, bad, pos in cases:
        idx = torch.tensor(values, dtype=idx_dtype, device=dev)
        with pytest.raises(IndexError, match=rf"index {bad} at position {pos} is out of bounds for a table with 20 rows"):
            zc.gather_rows(table, idx)
    # The first bad index is named even when the kernel visits rows in another order.
    long_idx = torch.randint(0, 20, (5000,), generator=gen, dtype=idx_dtype)
    long_idx[4321] = 99
    long_idx[4000] = -3
    long_idx[4999] = 20
    with pytest.raises(IndexError, match="index -3 at position 4000"):
        zc.gather_rows(table, long_idx.to(dev))


@pytest.mark.parametrize("kind", TABLE_KINDS)
def test_unchecked_bad_indices_are_zero_rows(kind, gen):
    table = make_table(kind, 20, 5, torch.float32, gen)
    idx = torch.tensor([3, -4, 19, 20, 7]).to(index_device(kind))
    got = zc.gather_rows(table, idx, check_bounds=False).cpu()
    host = table.cpu()
    torch.testing.assert_close(got[[0, 2, 4]], host[[3, 19, 7]], rtol=0, atol=0)
    assert (got[[1, 3]] == 0).all()


def test_argument_errors_name_the_argument(gen):
    table = random_table(10, 4, torch.float32, gen)
    idx = torch.tensor([1, 2])
    with pytest.raises(TypeError, match="index must be int32 or int64, got torch.float32"):
        zc.gather_rows(table, idx.float())
    with pytest.raises(ValueError, match=r"index must be a 1-D tensor, got shape \(1, 2\)"):
        zc.gather_rows(table, idx.view(1, 2))
    with pytest.raises(ValueError, match=r"table must be a 2-D tensor .* got shape \(40,\)"):
        zc.gather_rows(table.view(-1), idx)
    with pytest.raises(ValueError, match=r"out must have shape \(2, 4\), got \(3, 4\)"):
        zc.gather_rows(table, idx, torch.empty(3, 4))
    with pytest.raises(TypeError, match="out must have the table's dtype torch.float32, got torch.float16"):
        zc.gather_rows(table, idx, torch.empty(2, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match="out must be contiguous"):
        zc.gather_rows(table, idx, torch.empty(4, 2).t())
    with pytest.raises(TypeError, match="table must be a tensor"):
        zc.gather_rows([[1.0]], idx)
    # The op itself (reached without the wrapper, e.g. through routing) checks too.
    with pytest.raises(TypeError, match="index must be int32 or int64"):
        torch.ops.zerocopy.gather_rows(table, idx.float())
    with pytest.raises(ValueError, match="out must have shape"):
        torch.ops.zerocopy.gather_rows.out(table, idx, out=torch.empty(3, 4))
    with pytest.raises(TypeError, match="out must have the table's dtype"):
        torch.ops.zerocopy.gather_rows.out(table, idx, out=torch.empty(2, 4, dtype=torch.int32))


@pytest.mark.cuda
def test_cuda_argument_errors(gen):
    table = random_table(10, 4, torch.float32, gen)
    with pytest.raises(ValueError, match="index must be on the CPU for a CPU table"):
        zc.gather_rows(table, torch.tensor([1], device="cuda"))
    with pytest.raises(ValueError, match="table must be a CUDA or unified tensor"):
        torch.ops.zerocopy.gather_rows(table, torch.tensor([1], device="cuda"))
    with pytest.raises(ValueError, match="out must be on cuda"):
        zc.gather_rows(table.cuda(), torch.tensor([1]), torch.empty(1, 4))


# --- unified tables on the GPU -------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unified_on_gpu_lands_on_gpu(dtype, gen):
    table = make_table("unified", 3000, 257, dtype, gen)
    for idx in (torch.randint(0, 3000, (4000,), generator=gen), torch.randint(0, 3000, (50,), generator=gen)):
        for dev in ("cpu", "cuda"):
            got = zc.gather_rows(table, idx.to(dev))
            assert got.device.type == "cuda"
            torch.testing.assert_close(got.cpu(), reference(table, idx), rtol=0, atol=0)
            out = torch.full_like(got, SENTINEL[dtype])
            zc.gather_rows(table, idx.to(dev), out, check_bounds=False)
            torch.testing.assert_close(out.cpu(), reference(table, idx), rtol=0, atol=0)


@pytest.mark.cuda
def test_unified_misaligned_rows_on_gpu(gen):
    # Row sizes that are not multiples of 16 bytes (narrower loads) and offsets into the mapping.
    for row_bytes in (1020, 1028, 1044, 100, 36):
        table = make_table("unified", 4099, row_bytes // 4, torch.float32, gen)
        idx = torch.randint(0, 4099, (9000,), generator=gen, device="cpu").cuda()
        torch.testing.assert_close(zc.gather_rows(table, idx).cpu(), reference(table, idx), rtol=0, atol=0)
        shifted = table[1:]  # base address no longer 16-byte aligned in general
        idx2 = torch.randint(0, 4098, (9000,), generator=gen).cuda()
        torch.testing.assert_close(zc.gather_rows(shifted, idx2).cpu(), reference(shifted, idx2), rtol=0, atol=0)


@pytest.mark.cuda
def test_unified_table_beyond_int32_rows(gen):
    # 2^31 + 40 one-byte rows: 64-bit sort keys and byte offsets past 2 GiB.
    rows = 2**31 + 40
    table = zc.empty_unified((rows, 1), torch.int8)
    host = table.cpu().view(-1)
    chunk = 256 << 20
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        host[start:stop].copy_(torch.randint(-100, 100, (stop - start,), dtype=torch.int8, device="cuda"))
    idx = torch.randint(0, rows, (5000,), generator=gen)
    idx[:10] = torch.arange(rows - 10, rows)
    got = zc.gather_rows(table, idx.cuda())
    torch.testing.assert_close(got.cpu(), host[idx].view(-1, 1), rtol=0, atol=0)
    with pytest.raises(IndexError, match=f"index {rows} at position 7"):
        bad = idx.clone()
        bad[7] = rows
        zc.gather_rows(table, bad.cuda())


# --- routing of row gathers on unified tensors -----------------------------------------------


def _ran_gather_rows(fn) -> bool:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return any(e.name == "zerocopy::gather_rows" for e in prof.events())


@pytest.mark.parametrize("idx_dtype", [torch.int32, torch.int64], ids=str)
def test_unified_row_gathers_route_to_gather_rows(idx_dtype, device, gen):
    # device: where the index lives (a CUDA index only exists on the GPU machine).
    host = random_table(40, 6, torch.float32, gen)
    u = zc.to_unified(host.clone())
    ref_idx = torch.randint(0, 40, (25,), generator=gen, dtype=idx_dtype)
    idx = ref_idx.to(device)
    checks = {
        "getitem": (lambda: u[idx], host[ref_idx.long()]),
        "index_select": (lambda: torch.index_select(u, 0, idx), host.index_select(0, ref_idx)),
        "embedding": (lambda: torch.nn.functional.embedding(idx.view(5, 5), u), host[ref_idx.long()].view(5, 5, 6)),
        "negative": (lambda: u[idx - 40], host[ref_idx.long() - 40]),
    }
    for name, (fn, want) in checks.items():
        assert _ran_gather_rows(fn), name
        got = fn()
        assert got.device.type != zc.DEVICE_TYPE
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, msg=name)


def test_routing_shapes_and_other_indexing(gen):
    host3 = random_table(12, 20, torch.float32, gen).view(12, 4, 5)
    u3 = zc.to_unified(host3.clone())
    idx = torch.randint(0, 12, (7,), generator=gen)
    assert _ran_gather_rows(lambda: u3[idx])
    torch.testing.assert_close(u3[idx].cpu(), host3[idx], rtol=0, atol=0)
    torch.testing.assert_close(torch.index_select(u3, 0, idx).cpu(), host3.index_select(0, idx), rtol=0, atol=0)
    host1 = random_table(30, 1, torch.float32, gen).view(30)
    u1 = zc.to_unified(host1.clone())
    torch.testing.assert_close(u1[idx].cpu(), host1[idx], rtol=0, atol=0)
    # Not row gathers: the fallback's result, and gather_rows not called.
    mask = torch.rand(12, generator=gen) < 0.5
    assert not _ran_gather_rows(lambda: u3[mask])
    torch.testing.assert_close(u3[mask].cpu(), host3[mask], rtol=0, atol=0)
    torch.testing.assert_close(u3[idx, 2].cpu(), host3[idx, 2], rtol=0, atol=0)
    torch.testing.assert_close(torch.index_select(u3, 1, torch.tensor([3, 0])).cpu(),
                               host3.index_select(1, torch.tensor([3, 0])), rtol=0, atol=0)
    assert not _ran_gather_rows(lambda: torch.index_select(u3, 1, torch.tensor([3, 0])))
    # Index bounds through routing: index_select/embedding raise IndexError like torch.
    with pytest.raises(IndexError):
        torch.index_select(u3, 0, torch.tensor([12]))
    with pytest.raises(IndexError):
        u3[torch.tensor([-13])]


def test_routing_keeps_autograd_usable(gen):
    host = random_table(10, 3, torch.float32, gen)
    u = zc.to_unified(host.clone())
    idx = torch.tensor([1, 4, 4])
    got = torch.nn.functional.embedding(idx, u)
    assert not got.requires_grad
    with torch.no_grad():
        torch.testing.assert_close(u[idx].cpu(), host[idx], rtol=0, atol=0)


# --- torch.library integration --------------------------------------------------------------


@pytest.mark.skipif(not has_opcheck(), reason="torch.library.opcheck needs torch >= 2.4")
def test_opcheck(device, gen):
    table = random_table(50, 7, torch.float32, gen).to(device)
    index = torch.randint(0, 50, (30,), generator=gen).to(device)
    torch.library.opcheck(torch.ops.zerocopy.gather_rows.default, (table, index), {"check_bounds": True})
    torch.library.opcheck(torch.ops.zerocopy.gather_rows.default, (table, index.int()), {"index_sorted": False})
    out = torch.full((30, 7), -7.5, device=device)
    torch.library.opcheck(torch.ops.zerocopy.gather_rows.out, (table, index), {"out": out})


def _compile_usable() -> bool:
    try:
        torch.compile(lambda x: x + 1, fullgraph=True)(torch.ones(2))
        return True
    except Exception:
        return False


def test_torch_compile_fullgraph(gen):
    if not _compile_usable():
        pytest.skip("torch.compile does not work on this machine (no C++ compiler or backend)")
    table = random_table(40, 9, torch.float32, gen)
    index = torch.randint(0, 40, (13,), generator=gen)

    @torch.compile(fullgraph=True)
    def f(t, i):
        return zc.gather_rows(t, i) * 2 + 1

    torch.testing.assert_close(f(table, index), table[index] * 2 + 1)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs at least 2 CPUs")
def test_cpu_kernels_run_multithreaded():
    """The CPU kernels' at::parallel_for fans out (a build without OpenMP runs it on one thread)."""
    from pytorch_zerocopy import _C

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert _C.parallel_for_threads(64) == 2
    finally:
        torch.set_num_threads(before)
