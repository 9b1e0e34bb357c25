"""bfs / sssp / connected_components / pagerank against plain-Python references, networkx and
scipy, for every variant and placement available; bad input."""

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph
import torch

from graph_reference import (bfs_reference, components_reference, dijkstra_reference, np_csr,
                             pagerank_reference, poison_cuda_cache, shapes)

from pytorch_zerocopy.graph import VARIANTS, CSRGraph, bfs, connected_components, pagerank, sssp

ID_DTYPES = [torch.int32, torch.int64]
HOST_PLACEMENTS = ["cpu", "unified"]


@pytest.fixture
def seed():
    from graph_reference import fresh_seed

    return fresh_seed()


def make_graphs(seed, index_dtype, weights=None, symmetrize=False):
    rng = np.random.default_rng(seed)
    graphs = []
    for name, s, d, n in shapes(rng):
        w = None
        if weights == "int":
            w = torch.from_numpy(rng.integers(1, 20, len(s)).astype(np.int32))
        elif weights == "float":
            w = torch.from_numpy(rng.uniform(0.5, 4.0, len(s)).astype(np.float32))
        graphs.append((name, CSRGraph.from_coo(s, d, n, w, symmetrize=symmetrize, index_dtype=index_dtype)))
    return graphs


def sources_of(graph, rng, k=3):
    return sorted(set([0, graph.num_nodes - 1] + list(rng.integers(0, graph.num_nodes, k))))


def check_bfs_tree(g, depth, pred):
    indptr, indices, _ = np_csr(g)
    for v in np.nonzero(depth > 0)[0]:
        p = int(pred[v])
        assert depth[p] == depth[v] - 1, (v, p)
        assert v in indices[indptr[p]:indptr[p + 1]], (v, p)
    assert np.all(pred[depth < 0] == -1)


def run_bfs_checks(placement, variant, index_dtype, seed, device=None):
    rng = np.random.default_rng(seed)
    for name, g in make_graphs(seed, index_dtype):
        pg = g.to(placement, device) if placement != "cpu" else g
        indptr, indices, _ = np_csr(g)
        for s in sources_of(g, rng):
            depth, pred = bfs(pg, int(s), variant=variant, predecessors=True)
            assert depth.dtype == torch.int32 and pred.dtype == index_dtype
            depth = depth.cpu().numpy()
            pred = pred.cpu().numpy()
            np.testing.assert_array_equal(depth, bfs_reference(indptr, indices, s), err_msg=f"{name} source {s}")
            assert pred[s] == s
            check_bfs_tree(g, depth, pred)


@pytest.mark.parametrize("placement", HOST_PLACEMENTS)
@pytest.mark.parametrize("index_dtype", ID_DTYPES)
def test_bfs_host(placement, index_dtype, seed):
    for variant in VARIANTS:
        run_bfs_checks(placement, variant, index_dtype, seed)


def test_bfs_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, 500, 3000), rng.integers(0, 500, 3000)
    g = CSRGraph.from_coo(s, d, 500, drop_duplicates=True)
    mat = sp.csr_matrix((np.ones(g.num_edges), g.indices.numpy(), g.indptr.numpy()), shape=(500, 500))
    ref = csgraph.shortest_path(mat, unweighted=True, indices=7)
    depth = bfs(g, 7).numpy()
    expect = np.where(np.isinf(ref), -1, ref).astype(np.int64)
    np.testing.assert_array_equal(depth, expect)


def run_sssp_checks(placement, variant, index_dtype, weights, seed, device=None):
    rng = np.random.default_rng(seed)
    for name, g in make_graphs(seed, index_dtype, weights=weights):
        pg = g.to(placement, device) if placement != "cpu" else g
        indptr, indices, w = np_csr(g)
        for s in sources_of(g, rng):
            dist = sssp(pg, int(s), variant=variant)
            want_dtype = torch.float32 if weights == "float" else torch.int64
            assert dist.dtype == want_dtype
            dist = dist.cpu().numpy()
            ref = dijkstra_reference(indptr, indices, w, int(s))
            unreachable = np.array([r is None for r in ref])
            top = np.finfo(np.float32).max if weights == "float" else np.iinfo(np.int64).max
            assert np.all(dist[unreachable] == top), name
            got = dist[~unreachable].astype(np.float64)
            want = np.array([r for r in ref if r is not None], dtype=np.float64)
            np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{name} source {s}")


@pytest.mark.parametrize("placement", HOST_PLACEMENTS)
@pytest.mark.parametrize("weights", [None, "int", "float"])
def test_sssp_host(placement, weights, seed):
    for variant in ("naive", "aligned", "frontier"):
        for index_dtype in ID_DTYPES:
            run_sssp_checks(placement, variant, index_dtype, weights, seed)


def test_sssp_matches_networkx(seed):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, 200, 1200), rng.integers(0, 200, 1200)
    w = rng.uniform(0.1, 5.0, 1200).astype(np.float32)
    g = CSRGraph.from_coo(s, d, 200, torch.from_numpy(w))
    nxg = nx.DiGraph()
    nxg.add_nodes_from(range(200))
    for a, b, c in zip(s, d, w):
        if not nxg.has_edge(a, b) or nxg[a][b]["weight"] > c:
            nxg.add_edge(int(a), int(b), weight=float(c))
    ref = nx.single_source_dijkstra_path_length(nxg, 5)
    dist = sssp(g, 5).numpy()
    for v in range(200):
        if v in ref:
            assert dist[v] == pytest.approx(ref[v], rel=1e-5)
        else:
            assert dist[v] == np.finfo(np.float32).max


def run_cc_checks(placement, variant, index_dtype, seed, device=None):
    for name, g in make_graphs(seed, index_dtype, symmetrize=True):
        pg = g.to(placement, device) if placement != "cpu" else g
        indptr, indices, _ = np_csr(g)
        labels = connected_components(pg, variant=variant)
        assert labels.dtype == index_dtype
        np.testing.assert_array_equal(labels.cpu().numpy(), components_reference(indptr, indices), err_msg=name)
    for name, g in make_graphs(seed + 1, index_dtype):
        pg = g.to(placement, device) if placement != "cpu" else g
        indptr, indices, _ = np_csr(g)
        labels = connected_components(pg, weak=True, variant=variant)
        np.testing.assert_array_equal(labels.cpu().numpy(), components_reference(indptr, indices), err_msg=name)


@pytest.mark.parametrize("placement", HOST_PLACEMENTS)
@pytest.mark.parametrize("index_dtype", ID_DTYPES)
def test_cc_host(placement, index_dtype, seed):
    for variant in VARIANTS:
        run_cc_checks(placement, variant, index_dtype, seed)


def test_cc_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, 1000, 700), rng.integers(0, 1000, 700)
    g = CSRGraph.from_coo(s, d, 1000, symmetrize=True)
    mat = sp.csr_matrix((np.ones(g.num_edges), g.indices.numpy(), g.indptr.numpy()), shape=(1000, 1000))
    ncomp, ref = csgraph.connected_components(mat, directed=False)
    labels = connected_components(g).numpy()
    # Same partition, and each label is the smallest member of its component.
    assert len(np.unique(labels)) == ncomp
    for c in range(ncomp):
        members = np.nonzero(ref == c)[0]
        assert np.all(labels[members] == members.min())


def run_pagerank_checks(placement, variant, index_dtype, seed, device=None):
    for name, g in make_graphs(seed, index_dtype):
        pg = g.to(placement, device) if placement != "cpu" else g
        indptr, indices, _ = np_csr(g)
        rank = pagerank(pg, alpha=0.85, tol=1e-7, max_iter=200, variant=variant)
        assert rank.dtype == torch.float32
        ref = pagerank_reference(indptr, indices, 0.85, 1e-7, 200)
        np.testing.assert_allclose(rank.cpu().numpy(), ref, rtol=2e-4, atol=1e-7, err_msg=name)


@pytest.mark.parametrize("placement", HOST_PLACEMENTS)
def test_pagerank_host(placement, seed):
    for variant in VARIANTS:
        for index_dtype in ID_DTYPES:
            run_pagerank_checks(placement, variant, index_dtype, seed)


def test_pagerank_matches_networkx(seed):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, 300, 2000), rng.integers(0, 300, 2000)
    g = CSRGraph.from_coo(s, d, 300, drop_duplicates=True)
    nxg = nx.DiGraph()
    nxg.add_nodes_from(range(300))
    nxg.add_edges_from(zip(s.tolist(), d.tolist()))
    ref = nx.pagerank(nxg, alpha=0.85, tol=1e-10, max_iter=500)
    rank = pagerank(g, tol=1e-9, max_iter=500).numpy()
    np.testing.assert_allclose(rank, [ref[v] for v in range(300)], rtol=1e-3)
    assert rank.sum() == pytest.approx(1.0, rel=1e-4)


def test_pagerank_max_iter_stops(seed):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, 100, 500), rng.integers(0, 100, 500)
    g = CSRGraph.from_coo(s, d, 100)
    _, stats = pagerank(g, tol=0.0, max_iter=3, return_stats=True)
    assert int(stats[1]) == 3


def test_stats_count_edges(seed):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, 100, 600), rng.integers(0, 100, 600)
    g = CSRGraph.from_coo(s, d, 100)
    depth, stats = bfs(g, 0, return_stats=True)
    reached = np.nonzero(depth.numpy() >= 0)[0]
    deg = np.diff(g.indptr.numpy())
    assert int(stats[0]) == deg[reached].sum()
    assert int(stats[1]) == depth.max().item() + 1


# --- bad input ----------------------------------------------------------------------------


def small_graph(symmetric=False, weights=None):
    return CSRGraph.from_coo([0, 1, 2], [1, 2, 0], 4, weights, symmetrize=symmetric)


@pytest.mark.parametrize("op", [bfs, sssp])
@pytest.mark.parametrize("source", [-1, 4, 100])
def test_source_out_of_range(op, source):
    with pytest.raises(IndexError, match="source"):
        op(small_graph(), source)


def test_source_out_of_range_in_op():
    g = small_graph()
    with pytest.raises(IndexError, match="source"):
        torch.ops.zerocopy.graph_bfs.default(g.indptr, g.indices, 9, 2, False)


def test_negative_weights_refused():
    g = small_graph(weights=torch.tensor([1.0, -2.0, 3.0]))
    with pytest.raises(ValueError, match="non-negative"):
        sssp(g, 0)
    with pytest.raises(ValueError, match="non-negative"):
        torch.ops.zerocopy.graph_sssp.default(g.indptr, g.indices, g.weights, 0, 2)


def test_directed_graph_refused_by_cc():
    with pytest.raises(ValueError, match="weak=True"):
        connected_components(small_graph())
    labels = connected_components(small_graph(), weak=True)
    assert labels.tolist() == [0, 0, 0, 3]


def test_unknown_variant():
    with pytest.raises(ValueError, match="variant"):
        bfs(small_graph(), 0, variant="fastest")
    g = small_graph()
    with pytest.raises(ValueError, match="variant"):
        torch.ops.zerocopy.graph_bfs.default(g.indptr, g.indices, 0, 7, False)


def test_op_checks_edge_count():
    g = small_graph()
    with pytest.raises(ValueError, match="indptr"):
        torch.ops.zerocopy.graph_bfs.default(g.indptr, g.indices[:2], 0, 2, False)


def test_pagerank_bad_args():
    with pytest.raises(ValueError, match="alpha"):
        pagerank(small_graph(), alpha=1.5)
    with pytest.raises(ValueError, match="max_iter"):
        pagerank(small_graph(), max_iter=-1)


def test_fake_kernels_and_opcheck():
    g = small_graph(symmetric=True, weights=torch.tensor([1, 2, 3], dtype=torch.int32))
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    torch.library.opcheck(torch.ops.zerocopy.graph_bfs.default, (g.indptr, g.indices, 1, 2, True))
    torch.library.opcheck(torch.ops.zerocopy.graph_sssp.default, (g.indptr, g.indices, g.weights, 1, 3, 4.0))
    torch.library.opcheck(torch.ops.zerocopy.graph_connected_components.default, (g.indptr, g.indices, 2))
    torch.library.opcheck(torch.ops.zerocopy.graph_pagerank.default, (g.indptr, g.indices, 0.85, 1e-4, 20, 2))


def test_compile_fullgraph():
    g = small_graph(symmetric=True)

    @torch.compile(fullgraph=True, backend="eager")
    def depths(indptr, indices):
        return torch.ops.zerocopy.graph_bfs.default(indptr, indices, 0, 2, False)[0] + 1

    assert depths(g.indptr, g.indices).tolist() == [1, 2, 2, 0]


# --- GPU ----------------------------------------------------------------------------------

GPU_PLACEMENTS = ["cuda", "unified", "managed"]


@pytest.mark.cuda
@pytest.mark.parametrize("placement", GPU_PLACEMENTS)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("index_dtype", ID_DTYPES)
def test_bfs_gpu(placement, variant, index_dtype, seed):
    poison_cuda_cache()
    run_bfs_checks(placement, variant, index_dtype, seed, device=0)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", GPU_PLACEMENTS)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("weights", [None, "int", "float"])
def test_sssp_gpu(placement, variant, weights, seed):
    poison_cuda_cache()
    for index_dtype in ID_DTYPES:
        run_sssp_checks(placement, variant, index_dtype, weights, seed, device=0)


@pytest.mark.cuda
@pytest.mark.parametrize("weights", [None, "int", "float"])
@pytest.mark.parametrize("delta", [1e-3, 1.0, 7.0, 1e12])
def test_sssp_gpu_nearfar_bucket_widths(weights, delta, seed):
    """Tiny buckets (many epochs, empty ones skipped), medium ones, and one bucket (a plain
    Bellman-Ford queue) all give exact distances."""
    from pytorch_zerocopy.graph import grid_graph, kronecker_graph

    poison_cuda_cache()
    for g in (kronecker_graph(11, 8, seed=seed % 1000, weights=weights, device="cpu"),
              grid_graph(30, 40, weights=weights)):
        pg = g.to("unified", 0)
        for s in (0, g.num_nodes // 3):
            torch.testing.assert_close(sssp(pg, s, variant="frontier", delta=delta).cpu(), sssp(g, s),
                                       rtol=1e-5, atol=0)


def test_sssp_delta_must_be_positive():
    with pytest.raises(ValueError, match="delta"):
        sssp(small_graph(), 0, delta=0.0)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", GPU_PLACEMENTS)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("index_dtype", ID_DTYPES)
def test_cc_gpu(placement, variant, index_dtype, seed):
    poison_cuda_cache()
    run_cc_checks(placement, variant, index_dtype, seed, device=0)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", GPU_PLACEMENTS)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_pagerank_gpu(placement, variant, seed):
    poison_cuda_cache()
    for index_dtype in ID_DTYPES:
        run_pagerank_checks(placement, variant, index_dtype, seed, device=0)


@pytest.mark.cuda
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gpu_larger_graphs_match_cpu(variant):
    """Graphs big enough for many blocks, long lists (hub vertices) and many levels."""
    from pytorch_zerocopy.graph import grid_graph, kronecker_graph

    kron = kronecker_graph(14, 8, seed=3, weights="int", device="cpu")
    grid = grid_graph(60, 70, weights="float")
    for g in (kron, grid):
        for placement in GPU_PLACEMENTS:
            pg = g.to(placement, 0)
            for s in (0, g.num_nodes // 2):
                assert torch.equal(bfs(pg, s, variant=variant).cpu(), bfs(g, s))
                ref = sssp(g, s)
                got = sssp(pg, s, variant=variant).cpu()
                torch.testing.assert_close(got, ref, rtol=1e-5, atol=0)
            assert torch.equal(connected_components(pg, variant=variant).cpu(), connected_components(g))
            # Same iteration count on both sides (tol=0), so only float rounding differs.
            torch.testing.assert_close(pagerank(pg, tol=0.0, max_iter=60, variant=variant).cpu(),
                                       pagerank(g, tol=0.0, max_iter=60), rtol=1e-3, atol=1e-9)


@pytest.mark.cuda
def test_gpu_result_devices_and_stream():
    g = small_graph(symmetric=True).to("unified", 0)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        depth = bfs(g, 0)
    s.synchronize()
    assert depth.device.type == "cuda"
    assert depth.cpu().tolist() == [0, 1, 1, -1]


@pytest.mark.cuda
def test_managed_refuses_more_than_free_memory():
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info(0)
    hog = torch.empty(max(0, free - (1 << 30)), dtype=torch.uint8, device="cuda:0")  # leave ~1 GiB free
    spare, _ = torch.cuda.mem_get_info(0)
    src = torch.ones(spare // 4 + (1 << 26), dtype=torch.int32)  # 256 MiB more than is free
    with pytest.raises(RuntimeError, match="free"):
        torch.ops.zerocopy.managed_copy.default(src, 0)
    del hog
    small = torch.arange(1000, dtype=torch.int32)
    assert torch.equal(torch.ops.zerocopy.managed_copy.default(small, 0).cpu(), small)


@pytest.mark.cuda
def test_opcheck_cuda():
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    g = small_graph(symmetric=True, weights=torch.tensor([1.5, 2.0, 3.0])).to("cuda", 0)
    torch.library.opcheck(torch.ops.zerocopy.graph_bfs.default, (g.indptr, g.indices, 1, 3, True))
    torch.library.opcheck(torch.ops.zerocopy.graph_sssp.default, (g.indptr, g.indices, g.weights, 1, 3, 2.0))
    torch.library.opcheck(torch.ops.zerocopy.graph_connected_components.default, (g.indptr, g.indices, 3, True))
    torch.library.opcheck(torch.ops.zerocopy.graph_pagerank.default, (g.indptr, g.indices, 0.85, 1e-4, 20, 3))


@pytest.mark.cuda
def test_mixed_devices_refused():
    g = small_graph()
    with pytest.raises(ValueError, match="same device"):
        torch.ops.zerocopy.graph_bfs.default(g.indptr.cuda(), g.indices, 0, 2, False)
    with pytest.raises(ValueError, match="same device"):
        torch.ops.zerocopy.graph_connected_components.default(g.indptr, g.indices.cuda(), 2, False)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", GPU_PLACEMENTS)
def test_cc_frontier_skips_lists_in_the_largest_component(placement):
    """The sampled cc reads far less than the edge list on a graph with a giant component, and
    still labels every vertex as the CPU reference does, small components included."""
    from pytorch_zerocopy.graph import kronecker_graph

    kron = kronecker_graph(15, 16, seed=11, device="cpu")
    assert kron.symmetric
    labels, stats = connected_components(kron.to(placement, 0), variant="frontier", return_stats=True)
    assert torch.equal(labels.cpu(), connected_components(kron))
    assert int(stats[0]) < kron.indices.numel() // 2
