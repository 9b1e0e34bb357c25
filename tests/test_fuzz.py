"""Property-based fuzzing of the public ops and readers (hypothesis).

Every property says: for any input, the call either raises a clear Python exception of an
expected type, or returns what a simple reference computes; it never dies by a signal, and it
leaks no file descriptor, ``/dev/shm`` segment, temp file or GPU mapping (counted around each
test). The ops run in this process: a signal kills pytest, which fails the run (pytest's
faulthandler prints the test it was in). Inputs that could only crash through another
engineer's op run in a subprocess instead (see the sampling section).

Profiles: ``ZEROCOPY_FUZZ=ci`` (default: derandomized, so CI is reproducible and fast) and
``ZEROCOPY_FUZZ=deep`` (random, ten times the examples) for a longer local hunt.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import tempfile
import textwrap

import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

import pytorch_zerocopy as zc  # noqa: E402
from pytorch_zerocopy.graph import (CSRGraph, bfs, connected_components, load_bel, load_edge_list,  # noqa: E402
                                    load_npz, pagerank, save_bel, save_npz, sssp)
from graph_reference import (bfs_reference, components_reference, dijkstra_reference,  # noqa: E402
                             pagerank_reference)

settings.register_profile("ci", max_examples=40, derandomize=True, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.function_scoped_fixture])
settings.register_profile("deep", parent=settings.get_profile("ci"), max_examples=400, derandomize=False)
PROFILE = os.environ.get("ZEROCOPY_FUZZ", "ci")
FUZZ = settings.get_profile(PROFILE)
FEW = settings(FUZZ, max_examples=max(5, FUZZ.max_examples // 4))  # the costly properties

# What a clear refusal may raise. torch.OutOfMemoryError: legal but larger than this machine.
CLEAR = (ValueError, TypeError, IndexError, torch.OutOfMemoryError)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int16,
          torch.int32, torch.int64, torch.bool]


# --- leak accounting ---------------------------------------------------------------------------


def _fds():
    """This process's open file descriptors, with what they point at. The GPU driver's own
    (/dev/nvidia*), which it opens lazily on first use of a feature, are not ours to count."""
    fds = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listdir's own descriptor)
        if not target.startswith("/dev/nvidia"):
            fds.add((fd, target))
    return fds


@pytest.fixture(scope="module", autouse=True)
def warm_up():
    """Whatever the ops initialise once per process (kernels, a GPU context and its streams),
    initialised before any leak is counted."""
    u = torch.arange(6.0).reshape(3, 2).to("unified")
    zc.gather_rows(u, torch.tensor([2, 0]))
    zc.gather_rows(u, torch.tensor([1]), torch.zeros(1, 2).to("unified"))
    with pytest.raises(IndexError):
        zc.gather_rows(u, torch.tensor([3]), check_bounds=True)
    u[torch.tensor([1])]
    if zc.unified.gpu_backed():
        torch.cuda.synchronize()
    del u
    gc.collect()


def _shm_of_this_process():
    me = f"_{os.getpid()}_"
    return {n for n in os.listdir("/dev/shm") if me in n}


@pytest.fixture
def no_leaks(tmp_path, monkeypatch):
    """Runs the test with a private temp directory and checks afterwards that it left no file
    descriptor, /dev/shm segment, temp file or unified mapping behind."""
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    gc.collect()
    fds, shm, maps = _fds(), _shm_of_this_process(), zc.registration_stats()["live_pieces"]
    yield private
    # A failed test's frames (and the tables and mappings they hold) live on in sys.last_traceback
    # until the next test: drop them, so a failure is reported once, not again as a leak.
    sys.last_type = sys.last_value = sys.last_traceback = None
    if hasattr(sys, "last_exc"):
        sys.last_exc = None
    gc.collect()
    assert _fds() - fds == set(), "leaked file descriptors"
    assert _shm_of_this_process() - shm == set(), "leaked /dev/shm segments"
    assert os.listdir(private) == [], "leaked temp files"
    assert zc.registration_stats()["live_pieces"] == maps, "leaked unified mappings"


def scratch_dir(private) -> tempfile.TemporaryDirectory:
    """A directory for one example's files, removed when the example ends."""
    return tempfile.TemporaryDirectory(dir=private)


# --- strategies --------------------------------------------------------------------------------

small_ints = st.integers(-5, 60)
edge_ids = st.one_of(st.integers(-3, 40), st.sampled_from([2**31 - 1, 2**31, -(2**31), 2**40, 2**62, -(2**63)]))


def random_table(dtype, rows, width, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, (rows, width), generator=g).bool()
    if dtype.is_floating_point:
        return torch.randn(rows, width, generator=g).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(max(info.min, -1000), min(info.max, 1000), (rows, width), generator=g, dtype=dtype)


@st.composite
def tables(draw, unified=False):
    """A 2-D table of any dtype, possibly a view with a row pitch or an offset."""
    dtype = draw(st.sampled_from(DTYPES))
    rows, width = draw(st.integers(0, 40)), draw(st.integers(0, 9))
    pad = draw(st.integers(0, 3))
    offset = draw(st.integers(0, 2))
    base = random_table(dtype, rows + offset, width + pad, draw(st.integers(0, 2**31)))
    table = base[offset:, :width]
    if draw(st.booleans()):
        table = table.contiguous()
    return table.to("unified") if unified else table


@st.composite
def indices(draw, rows):
    dtype = draw(st.sampled_from([torch.int32, torch.int64]))
    lo, hi = (-3, rows + 2) if rows else (-2, 2)
    values = draw(st.lists(st.one_of(st.integers(lo, hi), st.sampled_from([2**31 - 1, -(2**31)])), max_size=30))
    return torch.tensor(values, dtype=torch.int64).to(dtype)


# --- gather_rows and row gathers on unified tensors ----------------------------------------------


@FUZZ
@given(data=st.data(), unified=st.booleans(), check_bounds=st.booleans(), with_out=st.booleans())
def test_gather_rows(no_leaks, host_bytes, data, unified, check_bounds, with_out):
    table = data.draw(tables(unified=unified))
    idx = data.draw(indices(table.shape[0]))
    host = table.cpu()
    rows = host.shape[0]
    bad = [(i, int(v)) for i, v in enumerate(idx.tolist()) if not 0 <= v < rows]
    out = None
    if with_out:
        out = torch.full((idx.numel(), host.shape[1]), 7, dtype=host.dtype) if host.dtype != torch.bool else \
            torch.ones((idx.numel(), host.shape[1]), dtype=torch.bool)
        if unified:
            out = out.to("unified")
    if bad and check_bounds:
        with pytest.raises(IndexError, match=f"index {bad[0][1]} at position {bad[0][0]}"):
            zc.gather_rows(table, idx, out, check_bounds=True)
        return
    got = zc.gather_rows(table, idx, out, check_bounds=check_bounds)
    # A unified out is written on the GPU without a host synchronisation (check_bounds=False).
    got = host_bytes(got) if got.is_unified else got.cpu()
    expect = torch.zeros((idx.numel(), host.shape[1]), dtype=host.dtype)
    for i, v in enumerate(idx.tolist()):
        if 0 <= v < rows:
            expect[i] = host[v]
    assert torch.equal(got, expect)


@FUZZ
@given(data=st.data())
def test_gather_rows_bad_arguments(no_leaks, data):
    table = data.draw(st.one_of(tables(), st.builds(lambda n: torch.zeros(n), st.integers(0, 5)),
                                st.builds(lambda: torch.zeros(2, 2, 2)), st.just([[1.0]])))
    idx = data.draw(st.one_of(indices(4), st.just(torch.tensor([0.5])), st.just(torch.zeros(2, 1, dtype=torch.long)),
                              st.just(torch.tensor(1)), st.just([0])))
    out = data.draw(st.one_of(st.none(), st.just(torch.zeros(1, 1)), st.just(torch.zeros(3, 9, dtype=torch.int8)),
                              st.just("out")))
    try:
        zc.gather_rows(table, idx, out)
    except CLEAR:
        pass
    if not all(isinstance(t, torch.Tensor) for t in (table, idx)):
        return
    # The op itself, without the Python wrapper's checks: the C++ boundary refuses the same calls.
    try:
        if isinstance(out, torch.Tensor):
            torch.ops.zerocopy.gather_rows.out(table, idx, out=out)
        else:
            torch.ops.zerocopy.gather_rows.default(table, idx)
    except CLEAR:
        pass


@FUZZ
@given(data=st.data(), how=st.sampled_from(["index", "index_select", "embedding", "negative"]))
def test_row_gathers_on_unified_tensors_match_the_cpu(no_leaks, data, how):
    table = data.draw(tables())
    if how == "embedding":
        assume(table.dtype.is_floating_point)
    idx = data.draw(indices(table.shape[0]))
    u = table.to("unified")
    ops = {"index": lambda t, i: t[i], "index_select": lambda t, i: torch.index_select(t, 0, i),
           "embedding": lambda t, i: torch.nn.functional.embedding(i, t), "negative": lambda t, i: t[-1 - i.abs()]}
    rows = table.shape[0]
    wrapped = idx.long() if how != "negative" else -1 - idx.long().abs()
    lowest = -rows if how in ("index", "negative") else 0  # Python indexing wraps [-rows, 0)
    in_range = bool(((wrapped >= lowest) & (wrapped < rows)).all())
    if not in_range:
        # Refused, even where the CPU lets an out-of-range index through (a table without columns).
        with pytest.raises((IndexError, RuntimeError)):
            ops[how](u, idx)
        return
    expect = ops[how](table, idx)
    got = ops[how](u, idx)
    assert got.shape == expect.shape and torch.equal(got.cpu(), expect)


# --- block_mean ---------------------------------------------------------------------------------


@FUZZ
@given(n_src=st.integers(0, 12), width=st.integers(0, 5), n_dst=st.integers(-1, 12),
       edges=st.lists(st.tuples(st.integers(-2, 14), st.integers(-2, 14)), max_size=40),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32]),
       id_dtype=st.sampled_from([torch.int32, torch.int64]), seed=st.integers(0, 2**31))
def test_block_mean(no_leaks, n_src, width, n_dst, edges, dtype, id_dtype, seed):
    h = random_table(dtype, n_src, width, seed)
    src = torch.tensor([s for s, _ in edges], dtype=id_dtype)
    dst = torch.tensor([d for _, d in edges], dtype=id_dtype)
    valid = dtype.is_floating_point and n_dst >= 0 and all(0 <= s < n_src and 0 <= d < n_dst for s, d in edges)
    if not valid:
        with pytest.raises(CLEAR):
            zc.block_mean(h, src, dst, n_dst)
        return
    got = zc.block_mean(h, src, dst, n_dst)
    acc = torch.zeros(n_dst, width, dtype=torch.float64)
    deg = torch.zeros(n_dst, dtype=torch.float64)
    for s, d in edges:
        acc[d] += h[s].double()
        deg[d] += 1
    expect = acc / deg.clamp(min=1).unsqueeze(1)
    tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
    torch.testing.assert_close(got.double(), expect, rtol=tol, atol=tol)


# --- CSR graphs and the traversal ops -------------------------------------------------------------


@st.composite
def csr_arrays(draw):
    """indptr/indices that are often valid, and otherwise broken in one way or another."""
    n = draw(st.integers(0, 12))
    degrees = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    indptr = np.concatenate([[0], np.cumsum(degrees)]).astype(np.int64) if n else np.zeros(1, np.int64)
    indices = np.array(draw(st.lists(st.integers(0, max(n - 1, 0)), min_size=int(indptr[-1]),
                                     max_size=int(indptr[-1]))), dtype=np.int64)
    breakage = draw(st.sampled_from(["none"] * 4 + ["indptr", "indices", "dtype", "empty", "2d"]))
    if breakage == "indptr" and indptr.size:
        indptr[draw(st.integers(0, indptr.size - 1))] = draw(edge_ids)
    elif breakage == "indices" and indices.size:
        indices[draw(st.integers(0, indices.size - 1))] = draw(edge_ids)
    elif breakage == "dtype":
        indptr = indptr.astype(draw(st.sampled_from([np.int32, np.float64, np.uint64])))
    elif breakage == "empty":
        indptr = np.zeros(0, np.int64)
    elif breakage == "2d":
        indices = indices.reshape(1, -1)
    id_dtype = draw(st.sampled_from([np.int32, np.int64]))
    if breakage != "indices" and indices.ndim == 1:
        indices = indices.astype(id_dtype)
    return indptr, indices


def _checked_graph(indptr, indices, weights=None, symmetric=False):
    try:
        return CSRGraph.from_csr(indptr, indices, weights, symmetric=symmetric)
    except CLEAR:
        return None


@FUZZ
@given(arrays=csr_arrays(), source=st.integers(-2, 14), variant=st.sampled_from(["naive", "merged", "aligned",
                                                                                  "frontier"]))
def test_bfs_and_cc(no_leaks, arrays, source, variant):
    g = _checked_graph(*arrays)
    if g is None:
        return
    ip, ix = g.indptr.numpy(), g.indices.numpy().astype(np.int64)
    if not 0 <= source < g.num_nodes:
        with pytest.raises(IndexError):
            bfs(g, source, variant=variant)
    else:
        assert bfs(g, source, variant=variant).tolist() == bfs_reference(ip, ix, source).tolist()
    labels = connected_components(g, weak=True, variant=variant)
    assert labels.tolist() == components_reference(ip, ix).tolist()


@FUZZ
@given(arrays=csr_arrays(), source=st.integers(0, 11), data=st.data())
def test_sssp(no_leaks, arrays, source, data):
    indptr, indices = arrays
    count = indices.size
    kind = data.draw(st.sampled_from(["none", "int", "float", "negative", "nan", "short"]))
    weights = {"none": None,
               "int": np.array(data.draw(st.lists(st.integers(0, 50), min_size=count, max_size=count)), np.int32),
               "float": np.array(data.draw(st.lists(st.floats(0, 10), min_size=count, max_size=count)), np.float32),
               "negative": -np.ones(count, np.float32),
               "nan": np.full(count, np.nan, np.float32),
               "short": np.ones(max(count - 1, 0), np.int32)}[kind]
    g = _checked_graph(indptr, indices, weights)
    if g is None:
        return
    if not 0 <= source < g.num_nodes:
        with pytest.raises(IndexError):
            sssp(g, source)
        return
    if kind == "negative" and count:
        with pytest.raises(ValueError, match="non-negative"):
            sssp(g, source)
        return
    if kind == "nan" and count:
        try:
            sssp(g, source)
        except CLEAR:
            pass
        return
    dist = sssp(g, source)
    w = None if g.weights is None else g.weights.numpy()
    ref = dijkstra_reference(g.indptr.numpy(), g.indices.numpy(), w, source)
    unreachable = torch.finfo(dist.dtype).max if dist.dtype.is_floating_point else torch.iinfo(dist.dtype).max
    got = [None if float(d) == float(unreachable) else float(d) for d in dist.tolist()]
    assert [g is None for g in got] == [r is None for r in ref]
    for g_, r in zip(got, ref):
        assert g_ is None or abs(g_ - r) <= 1e-5 * max(1.0, abs(r))


@FEW
@given(arrays=csr_arrays(), alpha=st.floats(0, 1), max_iter=st.integers(0, 30))
def test_pagerank(no_leaks, arrays, alpha, max_iter):
    g = _checked_graph(*arrays)
    if g is None or g.num_nodes == 0:
        return
    rank = pagerank(g, alpha, 1e-6, max_iter)
    ref = pagerank_reference(g.indptr.numpy(), g.indices.numpy().astype(np.int64), alpha, 1e-6, max_iter)
    np.testing.assert_allclose(rank.numpy(), ref, rtol=1e-3, atol=1e-5)


@FUZZ
@given(edges=st.lists(st.tuples(edge_ids, edge_ids), max_size=30), num_nodes=st.one_of(st.none(), st.integers(-1, 50),
       st.just(2**40)), symmetrize=st.booleans(), drop=st.booleans())
def test_from_coo(no_leaks, edges, num_nodes, symmetrize, drop):
    ids = [v for e in edges for v in e]
    vertices = num_nodes if num_nodes is not None else max(ids, default=-1) + 1
    # Legal but large where the machine has the memory (a 2**31-vertex CSR takes 32 GiB): a
    # property for the machine's size, not for a unit test.
    assume(not (min(ids, default=0) >= 0 and vertices > 1 << 20 and
                16 * (vertices + 1) <= zc._C.available_host_memory()[0]))
    src = torch.tensor([s for s, _ in edges], dtype=torch.int64)
    dst = torch.tensor([d for _, d in edges], dtype=torch.int64)
    try:
        g = CSRGraph.from_coo(src, dst, num_nodes, symmetrize=symmetrize, drop_duplicates=drop)
    except CLEAR:
        top = max(ids) + 1 if ids else 0
        fits = num_nodes is None or (0 <= num_nodes and top <= num_nodes)
        small = (num_nodes if num_nodes is not None else top) <= 1 << 20
        assert not (fits and small and min(ids, default=0) >= 0), "a valid small graph was refused"
        return
    pairs = sorted(set(edges) | ({(d, s) for s, d in edges} if symmetrize else set())) if drop else \
        sorted(edges + ([(d, s) for s, d in edges] if symmetrize else []))
    got = [(v, int(u)) for v in range(g.num_nodes) for u in g.indices[g.indptr[v]:g.indptr[v + 1]]]
    assert got == pairs


# --- readers on random, truncated and mutated files ---------------------------------------------------


def _read_or_refuse(fn, path):
    try:
        return fn(path)
    except CLEAR + (FileNotFoundError,):
        return None


def _mutate(path, cut, flip):
    """Cuts ``cut`` bytes off the end of the file and XORs one byte (``flip``: position, mask)."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    data = data[:max(0, len(data) - cut)]
    if flip is not None and flip[0] < len(data):
        data[flip[0]] ^= flip[1]
    with open(path, "wb") as f:
        f.write(bytes(data))


@pytest.mark.parametrize("reader,name", [(load_edge_list, "g.el"), (load_edge_list, "g.wel"), (load_npz, "g.npz"),
                                         (load_bel, "g.bel")], ids=["el", "wel", "npz", "bel"])
@FUZZ
@given(blob=st.binary(max_size=300))
def test_readers_on_random_bytes(no_leaks, reader, name, blob):
    with scratch_dir(no_leaks) as d:
        path = os.path.join(d, name)
        for part in ((".col", ".dst", ".val") if name.endswith(".bel") else ("",)):
            with open(path + part, "wb") as f:
                f.write(blob)
        back = _read_or_refuse(reader, path)
    if name.endswith(".npz"):
        assert back is None


@FUZZ
@given(edges=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(-5, 5)), max_size=20),
       weighted=st.booleans(), cut=st.integers(0, 40), junk=st.sampled_from(["", "x", " 1.5", "\n7", " 9 9 9", "\0"]))
def test_load_edge_list_truncated_and_mutated(no_leaks, edges, weighted, cut, junk):
    text = "".join(f"{s} {d} {w}\n" if weighted else f"{s} {d}\n" for s, d, w in edges)
    text = text[:max(0, len(text) - cut)] + junk
    with scratch_dir(no_leaks) as d:
        path = os.path.join(d, "g.wel" if weighted else "g.el")
        with open(path, "w") as f:
            f.write(text)
        g = _read_or_refuse(load_edge_list, path)
    if g is None:
        return
    rows = [line.split() for line in text.splitlines() if line.strip()]
    assert g.num_edges == len(rows)
    pairs = sorted((int(r[0]), int(r[1])) for r in rows)
    got = [(v, int(u)) for v in range(g.num_nodes) for u in g.indices[g.indptr[v]:g.indptr[v + 1]]]
    assert got == pairs


@FUZZ
@given(arrays=csr_arrays(), part=st.sampled_from([".col", ".dst", ".val"]), cut=st.integers(0, 40),
       flip=st.one_of(st.none(), st.tuples(st.integers(0, 200), st.integers(1, 255))))
def test_load_bel_truncated_and_mutated(no_leaks, arrays, part, cut, flip):
    g = _checked_graph(*arrays)
    assume(g is not None)
    g = CSRGraph(g.indptr, g.indices, torch.arange(g.num_edges, dtype=torch.int32))
    with scratch_dir(no_leaks) as d:
        base = os.path.join(d, "g.bel")
        save_bel(g, base)
        _mutate(base + part, cut, flip)
        back = _read_or_refuse(load_bel, base)
    if back is not None:  # what was read is a consistent graph
        assert int(back.indptr[0]) == 0 and int(back.indptr[-1]) == back.num_edges
        assert back.num_edges == 0 or 0 <= int(back.indices.min()) <= int(back.indices.max()) < back.num_nodes


@FUZZ
@given(arrays=csr_arrays(), cut=st.integers(0, 300), flip=st.one_of(st.none(), st.tuples(st.integers(0, 900),
                                                                                         st.integers(1, 255))))
def test_load_npz_truncated_and_mutated(no_leaks, arrays, cut, flip):
    g = _checked_graph(*arrays)
    assume(g is not None)
    with scratch_dir(no_leaks) as d:
        path = os.path.join(d, "g.npz")
        save_npz(g, path)
        _mutate(path, cut, flip)
        back = _read_or_refuse(load_npz, path)
    if back is not None:
        assert int(back.indptr[-1]) == back.num_edges
        assert back.num_edges == 0 or 0 <= int(back.indices.min()) <= int(back.indices.max()) < back.num_nodes


# --- unified tensors: creation and conversion -----------------------------------------------------------


# Dimensions that are small, or so large that no machine holds them (a legal size between the two
# would really be allocated: this suite must not take gigabytes from a shared CI machine).
dims = st.one_of(st.integers(-2, 6), st.sampled_from([2**44, 2**62, 2**63 - 1]))


@FUZZ
@given(shape=st.lists(dims, max_size=4), dtype=st.sampled_from(DTYPES))
def test_empty_unified(no_leaks, shape, dtype):
    numel, extents = 1, 1  # extents: the product of max(size, 1), which bounds every stride
    for s in shape:
        numel, extents = numel * s, extents * max(s, 1)
    try:
        u = zc.empty_unified(shape, dtype)
    except CLEAR:
        assert min(shape, default=0) < 0 or extents >= 2**63 or \
            numel * torch.empty(0, dtype=dtype).element_size() > 1 << 32, "a small shape was refused"
        return
    assert u.is_unified and tuple(u.shape) == tuple(shape) and u.dtype == dtype
    host = u.cpu()
    host.view(-1).copy_(torch.arange(host.numel()).to(dtype)) if host.numel() else None
    assert torch.equal(u.cpu(), host)


@FUZZ
@given(data=hnp.arrays(dtype=st.sampled_from([np.float32, np.int64, np.int8, np.float16, np.bool_]),
                       shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)),
       view=st.sampled_from(["plain", "transposed", "sliced", "offset"]))
def test_to_unified_is_in_place_and_exact(no_leaks, data, view):
    t = torch.from_numpy(data.copy())
    if view == "transposed" and t.dim() >= 2:
        t = t.transpose(0, 1)
    elif view == "sliced" and t.dim() >= 1:
        t = t[::2]
    elif view == "offset" and t.dim() >= 1 and t.shape[0] > 1:
        t = t[1:]
    u = zc.to_unified(t)
    assert u.is_unified and u.shape == t.shape and u.stride() == t.stride()
    assert u.data_ptr() == t.data_ptr()
    torch.testing.assert_close(u.cpu(), t, rtol=0, atol=0, equal_nan=True)
    copied = u.clone()
    assert copied.is_unified
    torch.testing.assert_close(copied.cpu(), t, rtol=0, atol=0, equal_nan=True)


# --- the sampling op and the CLI (validated by their owners' changes) -------------------------------------

SAMPLING_SCRIPT = textwrap.dedent("""
    import math, sys
    import torch
    from hypothesis import given, settings, strategies as st, HealthCheck, Phase
    from pytorch_zerocopy.sampling import sample_layers, sample_neighbors

    CLEAR = (ValueError, TypeError, IndexError)
    SETTINGS = settings(max_examples=int(sys.argv[1]), derandomize=True, deadline=None, database=None,
                        suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    csr = dict(indptr=st.lists(st.one_of(st.integers(-3, 12), st.just(10**9)), min_size=0, max_size=6),
               indices=st.lists(st.integers(-2, 8), max_size=10), seeds=st.lists(st.integers(-2, 6), max_size=5))

    def rows_ok(indptr, indices, seeds):
        # What the op reads: the rows of the seeds, which must lie inside indices.
        n = len(indptr) - 1
        return n >= 0 and all(0 <= s < n and 0 <= indptr[s] <= indptr[s + 1] <= len(indices) for s in seeds)

    @SETTINGS
    @given(fanout=st.integers(-2, 4), replace=st.booleans(),
           probs=st.one_of(st.none(), st.lists(st.sampled_from([0.0, 0.5, 1.0, math.nan, -1.0]), max_size=10)),
           **csr)
    def sampled_neighbours(indptr, indices, seeds, fanout, replace, probs):
        ip, ix = torch.tensor(indptr, dtype=torch.int64), torch.tensor(indices, dtype=torch.int64)
        pr = None if probs is None else torch.tensor(probs, dtype=torch.float32)
        must_refuse = fanout < -1 or not rows_ok(indptr, indices, seeds) or (
            probs is not None and (len(probs) != len(indices) or any(
                math.isnan(probs[e]) for s in seeds for e in range(indptr[s], indptr[s + 1]))))
        try:
            out = sample_neighbors(ip, ix, torch.tensor(seeds, dtype=torch.int64), fanout, replace=replace,
                                   probs=pr, seed=1)
        except CLEAR:
            return
        assert not must_refuse, "a call reading a malformed row or a NaN probability returned"
        off = out.offsets.tolist()
        assert len(off) == len(seeds) + 1 and off[0] == 0 and off == sorted(off)
        for i, s in enumerate(seeds):
            row = range(indptr[s], indptr[s + 1])
            pos = out.edge_pos[off[i]:off[i + 1]].tolist()
            assert all(p in row for p in pos)
            assert out.neighbors[off[i]:off[i + 1]].tolist() == [indices[p] for p in pos]
            assert out.seed_index[off[i]:off[i + 1]].tolist() == [i] * len(pos)
            if probs is None and not replace:
                assert len(pos) == (len(row) if fanout == -1 else min(fanout, len(row)))

    @SETTINGS
    @given(fanouts=st.lists(st.integers(-1, 3), min_size=1, max_size=3), **csr)
    def sampled_layers_of_a_raw_csr(indptr, indices, seeds, fanouts):
        ip, ix = torch.tensor(indptr, dtype=torch.int64), torch.tensor(indices, dtype=torch.int64)
        try:
            blocks = sample_layers((ip, ix), torch.tensor(seeds, dtype=torch.int64), fanouts, edge_dir="out",
                                   seed=1)
        except CLEAR:
            return
        n = len(indptr) - 1
        for b in blocks:
            ids = b.srcdata["_ID"].tolist()
            assert all(0 <= v < n for v in ids), f"node ids {ids} outside a graph of {n} nodes"

    sampled_neighbours()
    sampled_layers_of_a_raw_csr()
    print("ok")
""")


def test_sample_neighbors_in_a_subprocess():
    # A malformed CSR can corrupt the heap inside this op until it validates its arguments, so
    # it runs in a child: a signal there is a failure here, not the end of the test run.
    examples = str(max(10, FUZZ.max_examples))
    out = subprocess.run([sys.executable, "-c", SAMPLING_SCRIPT, examples], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), \
        f"status {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"


CLI_SCRIPT = textwrap.dedent("""
    import contextlib, io, sys, traceback
    from hypothesis import given, settings, strategies as st, HealthCheck, Phase
    from pytorch_zerocopy.cli import main

    BASE = ["train", "--dataset", "papers-like:500:2", "--feature-dim", "8", "--epochs", "1", "--max-batches", "1",
            "--batch-size", "64", "--fanouts", "2,2", "--hidden", "8"]
    BAD = {"--batch-size": ["0", "-3"], "--hidden": ["0", "-4"], "--feature-dim": ["0", "-1"],
           "--dataset": ["no-such-dataset", "papers-like:abc", "papers-like:0"], "--epochs": ["0", "-1"],
           "--fanouts": ["0,-5", "x"], "--samplers": ["0"], "--max-batches": ["-1", "0"], "--gpus": ["0"]}

    @settings(max_examples=int(sys.argv[1]), derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    @given(option=st.sampled_from(sorted(BAD)), data=st.data())
    def prop(option, data):
        value = data.draw(st.sampled_from(BAD[option]))
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = main(BASE + [option, value])
        except SystemExit as e:  # argparse's own refusals
            rc = e.code
        except BaseException:
            raise AssertionError(f"{option} {value}: a traceback instead of a usage error:\\n"
                                 + traceback.format_exc())
        assert rc == 2, f"{option} {value}: status {rc}, stderr {err.getvalue()!r}"
        assert err.getvalue().strip(), f"{option} {value}: refused without saying why"
    prop()
    print("ok")
""")


def test_train_cli_refuses_bad_options():
    examples = str(max(6, FUZZ.max_examples // 3))
    out = subprocess.run([sys.executable, "-c", CLI_SCRIPT, examples], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), \
        f"status {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
