"""CSRGraph construction, validation and placement."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import pytorch_zerocopy
from pytorch_zerocopy.placement import Placement
from pytorch_zerocopy.graph import CSRGraph


@pytest.fixture
def seed():
    from graph_reference import fresh_seed

    return fresh_seed()


def test_from_coo_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, 50, 400), rng.integers(0, 50, 400)
    w = rng.uniform(1, 9, 400).astype(np.float32)
    g = CSRGraph.from_coo(s, d, 60, torch.from_numpy(w))
    assert g.num_nodes == 60 and g.num_edges == 400 and not g.symmetric
    assert g.indptr.dtype == torch.int64 and g.indices.dtype == torch.int32
    ref = sp.coo_matrix((w, (s, d)), shape=(60, 60)).tocsr()  # sums duplicates
    mine = sp.csr_matrix((g.weights.numpy(), g.indices.numpy(), g.indptr.numpy()), shape=(60, 60))
    np.testing.assert_allclose(mine.toarray(), ref.toarray(), rtol=1e-6)
    # Neighbour lists come out sorted.
    for v in range(60):
        row = g.indices[g.indptr[v]:g.indptr[v + 1]].numpy()
        assert np.all(np.diff(row) >= 0)


def test_from_coo_options(seed):
    rng = np.random.default_rng(seed)
    s = np.concatenate([rng.integers(0, 30, 200), [4, 4, 9]])
    d = np.concatenate([rng.integers(0, 30, 200), [4, 4, 9]])
    g = CSRGraph.from_coo(s, d, symmetrize=True, drop_self_loops=True, drop_duplicates=True,
                          index_dtype=torch.int64)
    assert g.symmetric and g.indices.dtype == torch.int64 and g.num_nodes == 30
    pairs = set()
    for v in range(g.num_nodes):
        for u in g.indices[g.indptr[v]:g.indptr[v + 1]].tolist():
            assert u != v
            assert (v, u) not in pairs
            pairs.add((v, u))
    want = {(a, b) for a, b in zip(s.tolist(), d.tolist()) if a != b}
    want |= {(b, a) for a, b in want}
    assert pairs == want


def test_from_coo_duplicates_keep_first_weight():
    g = CSRGraph.from_coo([1, 0, 1], [2, 1, 2], 3, torch.tensor([7, 5, 3], dtype=torch.int32), drop_duplicates=True)
    assert g.indices.tolist() == [1, 2]
    assert g.weights.tolist() == [5, 7]



def _csr_reference(src, dst, n, weights, drop_duplicates):
    """Rows as Python lists: (dst, weight) pairs sorted by dst, input order among equal pairs."""
    rows = [[] for _ in range(n)]
    seen = set()
    for i, (a, b) in enumerate(zip(src, dst)):
        if drop_duplicates and (a, b) in seen:
            continue
        seen.add((a, b))
        rows[a].append((b, None if weights is None else weights[i]))
    return [sorted(r, key=lambda x: x[0]) for r in rows]  # sorted() is stable


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("drop_duplicates", [False, True])
def test_coo_to_csr_matches_reference_on_the_inputs_device(seed, device, weighted, drop_duplicates):
    from pytorch_zerocopy.graph.csr import coo_to_csr

    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 40))
    m = int(rng.integers(50, 300))
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    src[: m // 4] = src[m // 4: 2 * (m // 4)]  # parallel edges for sure
    dst[: m // 4] = dst[m // 4: 2 * (m // 4)]
    w = rng.integers(1, 1000, m).astype(np.int32) if weighted else None
    indptr, indices, weights = coo_to_csr(
        torch.from_numpy(src).to(device), torch.from_numpy(dst).to(device), n,
        None if w is None else torch.from_numpy(w).to(device), drop_duplicates=drop_duplicates,
        index_dtype=torch.int32)
    assert indptr.device.type == device and indices.device.type == device
    assert indptr.dtype == torch.int64 and indices.dtype == torch.int32
    want = _csr_reference(src.tolist(), dst.tolist(), n, None if w is None else w.tolist(), drop_duplicates)
    assert indptr.cpu().tolist() == np.concatenate([[0], np.cumsum([len(r) for r in want])]).tolist()
    assert indices.cpu().tolist() == [b for r in want for b, _ in r]
    if weighted:
        assert weights.cpu().tolist() == [x for r in want for _, x in r]
    else:
        assert weights is None


def test_coo_to_csr_of_no_edges():
    from pytorch_zerocopy.graph.csr import coo_to_csr

    empty = torch.zeros(0, dtype=torch.int64)
    indptr, indices, weights = coo_to_csr(empty, empty, 4)
    assert indptr.tolist() == [0, 0, 0, 0, 0] and indices.numel() == 0 and weights is None

def test_single_vertex_and_empty():
    g = CSRGraph.from_coo([], [], 1)
    assert g.num_nodes == 1 and g.num_edges == 0 and g.indptr.tolist() == [0, 0]
    g0 = CSRGraph.from_coo(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    assert g0.num_nodes == 0


def test_from_csr_validation():
    ok = CSRGraph.from_csr(torch.tensor([0, 2, 3]), torch.tensor([1, 0, 1], dtype=torch.int32))
    assert ok.num_nodes == 2 and ok.num_edges == 3
    with pytest.raises(ValueError, match="non-decreasing"):
        CSRGraph.from_csr(torch.tensor([0, 2, 1, 3]), torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match=r"indptr\[0\]"):
        CSRGraph.from_csr(torch.tensor([1, 2, 3]), torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match=r"indptr\[-1\]"):
        CSRGraph.from_csr(torch.tensor([0, 2, 4]), torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="indices must be in"):
        CSRGraph.from_csr(torch.tensor([0, 2, 3]), torch.tensor([1, 0, 2]))
    with pytest.raises(ValueError, match="indices must be in"):
        CSRGraph.from_csr(torch.tensor([0, 2, 3]), torch.tensor([1, -1, 0]))
    with pytest.raises(TypeError, match="indptr must be int64"):
        CSRGraph.from_csr(torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([1, 0, 1]))
    with pytest.raises(TypeError, match="indices must be int32 or int64"):
        CSRGraph.from_csr(torch.tensor([0, 2, 3]), torch.tensor([1.0, 0.0, 1.0]))
    with pytest.raises(TypeError, match="weights must be float32 or int32"):
        CSRGraph.from_csr(torch.tensor([0, 2, 3]), torch.tensor([1, 0, 1]), torch.tensor([1.0, 2.0, 3.0],
                                                                                         dtype=torch.float64))
    with pytest.raises(ValueError, match="weights must be 1-D with one entry per edge"):
        CSRGraph.from_csr(torch.tensor([0, 2, 3]), torch.tensor([1, 0, 1]), torch.tensor([1.0, 2.0]))


def test_from_coo_validation():
    with pytest.raises(ValueError, match="out of range"):
        CSRGraph.from_coo([0, 5], [1, 2], num_nodes=4)
    with pytest.raises(ValueError, match=">= 0"):
        CSRGraph.from_coo([0, -1], [1, 2])
    with pytest.raises(ValueError, match="same length"):
        CSRGraph.from_coo([0, 1], [1])
    with pytest.raises(TypeError, match="src must be int32 or int64"):
        CSRGraph.from_coo(torch.tensor([0.0]), torch.tensor([1]))
    with pytest.raises(ValueError, match="int32 cannot hold"):
        CSRGraph.from_coo([0], [1], num_nodes=2**31 + 5, index_dtype=torch.int32)


def test_placements_on_host(seed):
    rng = np.random.default_rng(seed)
    g = CSRGraph.from_coo(rng.integers(0, 40, 100), rng.integers(0, 40, 100), 40,
                          torch.from_numpy(rng.integers(1, 9, 100).astype(np.int32)))
    u = g.to("unified")
    assert u.placement == "unified" and pytorch_zerocopy.is_unified(u.indices)
    assert pytorch_zerocopy.is_unified(u.weights)
    assert torch.equal(u.indices.cpu(), g.indices) and torch.equal(u.weights.cpu(), g.weights)
    assert torch.equal(u.indptr.cpu(), g.indptr)
    back = u.to("cpu")
    assert back.placement == "cpu" and torch.equal(back.indices, g.indices)
    assert back.min_weight == g.min_weight >= 1
    with pytest.raises(ValueError, match="placement must be one of"):
        g.to("disk")


def test_managed_needs_cuda_build_or_gpu():
    if torch.cuda.is_available() and pytorch_zerocopy.build_info()["with_cuda"]:
        pytest.skip("this machine can place graphs in managed memory")
    g = CSRGraph.from_coo([0, 1], [1, 0], 2)
    for placement in ("managed", "uvm", "cuda"):
        with pytest.raises(RuntimeError, match="GPU"):
            g.to(placement)


@pytest.mark.cuda
def test_gpu_placements(seed):
    rng = np.random.default_rng(seed)
    g = CSRGraph.from_coo(rng.integers(0, 40, 100), rng.integers(0, 40, 100), 40,
                          torch.from_numpy(rng.uniform(1, 2, 100).astype(np.float32)))
    for placement in ("cuda", "uvm", "unified", "managed"):
        pg = g.to(placement, 0)
        assert pg.placement is Placement.parse(placement)
        assert pg.indptr.device == torch.device("cuda", 0)
        assert torch.equal(pg.indices.cpu(), g.indices) and torch.equal(pg.weights.cpu(), g.weights)
    m1, m2 = g.to("uvm", 0), g.to("uvm", 0)
    assert m1.indices.data_ptr() != m2.indices.data_ptr()  # a fresh (cold) allocation each time


@pytest.mark.cuda
def test_managed_evict_keeps_values(seed):
    rng = np.random.default_rng(seed)
    g = CSRGraph.from_coo(rng.integers(0, 500, 4000), rng.integers(0, 500, 4000), 500)
    m = g.to("uvm", 0)
    from pytorch_zerocopy.graph import bfs

    before = bfs(m, 3)
    torch.ops.zerocopy.managed_evict.default(m.indices)
    assert torch.equal(m.indices.cpu(), g.indices)
    assert torch.equal(bfs(m, 3), before)
    with pytest.raises(ValueError, match="managed"):
        torch.ops.zerocopy.managed_evict.default(torch.zeros(10, device="cuda:0"))


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("symmetrize", [False, True])
def test_csc_is_the_transpose_with_edge_ids(gen, symmetrize, weighted):
    n = 60
    src = torch.randint(0, n, (500,), generator=gen)
    dst = torch.randint(0, n, (500,), generator=gen)
    w = torch.rand(500, generator=gen) if weighted else None
    g = CSRGraph.from_coo(src, dst, n, weights=w, symmetrize=symmetrize, drop_duplicates=True)
    t = g.csc()
    assert t is g.csc(), "the transpose is computed once"
    rows_g = torch.repeat_interleave(torch.arange(n), g.indptr[1:] - g.indptr[:-1])
    rows_t = torch.repeat_interleave(torch.arange(n), t.indptr[1:] - t.indptr[:-1])
    e = t.eids
    # Position p of row v in the transpose is the edge u -> v of g with id eids[p].
    assert torch.equal(rows_g[e], t.indices.long()) and torch.equal(g.indices[e].long(), rows_t)
    assert torch.equal(torch.sort(e).values, torch.arange(g.num_edges))
    if weighted:
        assert torch.equal(t.weights, g.weights[e])


def test_csc_of_a_symmetric_graph_keeps_the_ids_it_carries(gen):
    n = 40
    g = CSRGraph.from_coo(torch.randint(0, n, (300,), generator=gen), torch.randint(0, n, (300,), generator=gen),
                          n, symmetrize=True, drop_duplicates=True)
    ids = torch.randperm(g.num_edges, generator=gen)
    carried = CSRGraph(g.indptr, g.indices, symmetric=True, eids=ids)
    plain = g.csc().eids
    assert torch.equal(carried.csc().eids, ids[plain])
