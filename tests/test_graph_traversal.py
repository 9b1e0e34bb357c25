"""bfs / sssp / connected_components / pagerank against plain-Python references, networkx and
scipy, for every variant and placement available; the variant chooser; bad input."""

import dataclasses

import networkx as nx
import numpy as np
import pytest
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph
import torch

from pytorch_zerocopy.placement import Placement

from graph_reference import (bfs_reference, components_reference, dijkstra_reference, np_csr, pagerank_exact,
                             pagerank_reference, poison_cuda_cache, shapes)

from pytorch_zerocopy.graph import (OP_VARIANTS, CSRGraph, GraphTraits, Variant, bfs, choose_variant,
                                    connected_components, pagerank, sssp)

ID_DTYPES = [torch.int32, torch.int64]
HOST_PLACEMENTS = ["cpu", "unified"]


def variants_of(op):
    return list(OP_VARIANTS[op]) + ["auto"]


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


def run_bfs_checks(placement, variant, index_dtype, seed, device=None, symmetrize=False):
    rng = np.random.default_rng(seed)
    for name, g in make_graphs(seed, index_dtype, symmetrize=symmetrize):
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
    for variant in variants_of("bfs"):
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
    for variant in variants_of("sssp"):
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
    for variant in variants_of("connected_components"):
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
    for variant in variants_of("pagerank"):
        for index_dtype in ID_DTYPES:
            run_pagerank_checks(placement, variant, index_dtype, seed)


def run_pagerank_accuracy(placement, variant, seed, device=None):
    """The result is within tol of the exact PageRank in L1, for several tol and alpha, on
    graphs with dangling vertices; a looser tol takes no more iterations (async: its work
    depends on scheduling, so only the bound is checked). The bound holds up to float32
    rounding: 1e-6 in L1 where the op runs on the CPU, 2e-6 on a GPU, whose float atomics add
    in no fixed order (a "unified" graph runs there whenever a GPU is present)."""
    for name, g in make_graphs(seed, torch.int32):
        if g.num_nodes < 2:
            continue
        pg = g.to(placement, device) if placement != "cpu" else g
        slack = 2e-6 if pg.device.type == "cuda" else 1e-6
        indptr, indices, _ = np_csr(g)
        for alpha in (0.5, 0.85):
            exact = pagerank_exact(indptr, indices, alpha)
            iterations = []
            for tol in (1e-2, 1e-4, 1e-6):
                rank, stats = pagerank(pg, alpha=alpha, tol=tol, max_iter=1000, variant=variant, return_stats=True)
                l1 = np.abs(rank.cpu().numpy().astype(np.float64) - exact).sum()
                assert l1 <= tol + slack, (name, variant, alpha, tol, l1)
                iterations.append(int(stats[1]))
            if variant != "async":
                assert iterations == sorted(iterations), (name, variant, alpha, iterations)


@pytest.mark.parametrize("placement", HOST_PLACEMENTS)
def test_pagerank_accuracy_host(placement, seed):
    for variant in variants_of("pagerank"):
        run_pagerank_accuracy(placement, variant, seed)


def test_pagerank_tol_is_an_accuracy_bound(seed):
    """The bound holds on a graph where power iteration mixes slowly (a long directed cycle,
    alpha close to 1), where an iteration's change understates the distance to the solution."""
    n = 300
    path = np.arange(n)
    s = np.concatenate([path[:-1], [n - 1]])
    d = np.concatenate([path[1:], [0]])  # a directed cycle: power iteration mixes slowly
    rng = np.random.default_rng(seed)
    extra = rng.integers(0, n, (2, 20))
    g = CSRGraph.from_coo(np.concatenate([s, extra[0]]), np.concatenate([d, extra[1]]), n)
    indptr, indices, _ = np_csr(g)
    exact = pagerank_exact(indptr, indices, 0.95)
    for tol in (1e-3, 1e-5):
        rank = pagerank(g, alpha=0.95, tol=tol, max_iter=10_000).numpy().astype(np.float64)
        assert np.abs(rank - exact).sum() <= tol + 1e-6


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
    rank = pagerank(g, max_iter=0)
    assert torch.equal(rank, torch.full((100,), 1 / 100, dtype=torch.float32))


def test_stats_count_edges(seed):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, 100, 600), rng.integers(0, 100, 600)
    g = CSRGraph.from_coo(s, d, 100)
    depth, stats = bfs(g, 0, return_stats=True)
    reached = np.nonzero(depth.numpy() >= 0)[0]
    deg = np.diff(g.indptr.numpy())
    assert int(stats[0]) == deg[reached].sum()
    assert int(stats[1]) == depth.max().item() + 1


# --- the variant chooser ------------------------------------------------------------------


def traits(placement="unified", on_gpu=True, symmetric=True, has_in_lists=None, n=1000, m=32_000, spread=0.0):
    return GraphTraits(placement=Placement.parse(placement), on_gpu=on_gpu, symmetric=symmetric,
                       has_in_lists=symmetric if has_in_lists is None else has_in_lists, num_nodes=n, num_edges=m,
                       degree_spread=spread)


@pytest.mark.parametrize("t, op, want", [
    (traits(), "bfs", "direction"),
    (traits(symmetric=False), "bfs", "frontier"),
    (traits(symmetric=False, has_in_lists=True), "bfs", "direction"),
    (traits(placement="cuda", symmetric=False), "bfs", "merged"),
    (traits(placement="cuda"), "bfs", "merged"),  # even degrees
    (traits(placement="cuda", spread=1.0), "bfs", "merged"),
    (traits(placement="cuda", spread=6.5), "bfs", "direction"),  # a Kronecker graph's spread
    (traits(placement="cuda", symmetric=False, spread=6.5), "bfs", "merged"),
    (traits(placement="cuda", symmetric=False, has_in_lists=True, spread=6.5), "bfs", "direction"),
    (traits(placement="cpu", on_gpu=False, symmetric=False), "bfs", "aligned"),
    (traits(placement="managed"), "bfs", "direction"),
    (traits(m=4000), "bfs", "async"),
    (traits(m=4000, placement="cuda"), "bfs", "async"),
    (traits(m=4000, spread=0.3), "bfs", "frontier"),
    (traits(m=4000, spread=0.3, placement="cuda"), "bfs", "frontier"),
    (traits(m=4000, spread=0.3, on_gpu=False, placement="cpu"), "bfs", "direction"),
    (traits(m=4000, on_gpu=False, placement="cpu"), "bfs", "direction"),
    (traits(m=8000), "sssp", "frontier"),
    (traits(m=8001), "sssp", "aligned"),
    (traits(m=8001, placement="managed"), "sssp", "aligned"),
    (traits(m=8001, placement="cuda"), "sssp", "merged"),
    (traits(m=4000, placement="cuda"), "sssp", "frontier"),
    (traits(), "connected_components", "frontier"),
    (traits(placement="uvm"), "connected_components", "frontier"),
    (traits(placement="managed"), "connected_components", "frontier"),
    (traits(m=4000), "connected_components", "staged"),
    (traits(m=16_000), "connected_components", "staged"),  # mean degree 16 < 24: stream the list
    (traits(m=23_999, placement="uvm"), "connected_components", "staged"),
    (traits(m=24_000), "connected_components", "frontier"),
    (traits(m=16_000, placement="cuda"), "connected_components", "frontier"),
    (traits(m=16_000, placement="cpu", on_gpu=False), "connected_components", "frontier"),
    (traits(m=4000, placement="cpu", on_gpu=False), "connected_components", "frontier"),
    (traits(m=4000, placement="uvm"), "connected_components", "staged"),
    (traits(symmetric=False), "connected_components", "staged"),
    (traits(placement="cuda"), "connected_components", "frontier"),
    (traits(placement="cuda", m=4000), "connected_components", "staged"),
    (traits(placement="cuda", symmetric=False), "connected_components", "staged"),
    (traits(), "pagerank", "push"),
    (traits(placement="cuda", m=100), "pagerank", "naive"),
    (traits(placement="cuda", m=100, spread=0.3), "pagerank", "naive"),
    (traits(placement="cuda", m=8001), "pagerank", "push"),
    (traits(placement="unified", m=100), "pagerank", "push"),
    (traits(placement="cuda", m=4000, spread=0.3), "connected_components", "staged"),
])
def test_choose_variant(t, op, want):
    assert choose_variant(op, t) == want
    assert want in OP_VARIANTS[op]


def test_degree_spread_tells_a_lattice_from_a_road_network():
    """A lattice's degrees hardly vary (its border only); a road network's, with a third of the
    links missing, do: only the first gets the async BFS on a GPU."""
    from pytorch_zerocopy.graph import grid_graph, road_graph
    from pytorch_zerocopy.graph.traversal import MESH_MAX_DEGREE_SPREAD, degree_spread

    grid, road = grid_graph(64, 64), road_graph(64, 64, seed=1, device="cpu")
    assert degree_spread(grid.indptr) <= MESH_MAX_DEGREE_SPREAD < degree_spread(road.indptr)
    assert degree_spread(torch.zeros(1, dtype=torch.int64)) == 0.0
    assert degree_spread(torch.zeros(5, dtype=torch.int64)) == 0.0
    deg = torch.tensor([3] * 10000)
    assert degree_spread(torch.cat([torch.zeros(1, dtype=torch.int64), deg.cumsum(0)])) == 0.0
    for g, name in ((grid, "grid"), (road, "road")):
        t = GraphTraits.of(g)
        assert t.mesh_like and t.degree_spread == 0.0, name  # measured only where a GPU runs the op
        on_gpu = dataclasses.replace(t, on_gpu=True, degree_spread=degree_spread(g.indptr))
        assert choose_variant("bfs", on_gpu) == ("async" if name == "grid" else "frontier")
        in_gpu = dataclasses.replace(on_gpu, placement=Placement.GPU)
        assert choose_variant("connected_components", in_gpu) == "staged"
        assert choose_variant("pagerank", in_gpu) == "naive"
        assert GraphTraits.of(g, "pagerank") == GraphTraits.of(g), name  # no spread asked for


def test_choose_variant_huge_mesh_is_not_async():
    assert choose_variant("bfs", traits(n=1 << 31, m=1 << 32)) == "direction"


def test_auto_resolves_every_op_on_a_cpu_graph():
    g = CSRGraph.from_coo([0, 1, 2], [1, 2, 0], 3, symmetrize=True)
    from pytorch_zerocopy.graph import auto_variant

    assert auto_variant("bfs", g) == "direction"
    assert auto_variant("connected_components", g) == "frontier"
    with pytest.raises(ValueError, match="op must be"):
        auto_variant("dfs", g)


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


MALFORMED_CSR = [
    ([1, 2, 2], [1, 0], "indptr\\[0\\] must be 0"),
    ([0, 5, 2], [1, 0], "never decrease"),
    ([0, 2, 1, 2], [1, 0], "never decrease"),
    ([0, -1, 2], [1, 0], "never decrease"),
    ([0, 1, 3], [1, 0], "number of edges"),
    ([0, 1, 2], [1, 7], "indices\\[1\\] = 7 is not a vertex id"),
    ([0, 1, 2], [-1, 0], "indices\\[0\\] = -1 is not a vertex id"),
]


def raw_calls(op, ip, ix, variant, weights=None, symmetric=False):
    """The compiled op `op` on the arrays (ip, ix) in `variant` (an OP_VARIANTS name), as a
    callable; bfs's direction variant reads (ip, ix) as its in-neighbour lists too."""
    from pytorch_zerocopy.graph import Variant

    v = int(Variant[variant.upper()])
    if op == "bfs":
        lists = (ip, ix) if variant == "direction" else (None, None)
        return lambda: torch.ops.zerocopy.graph_bfs.default(ip, ix, 0, v, True, *lists)
    if op == "sssp":
        return lambda: torch.ops.zerocopy.graph_sssp.default(ip, ix, weights, 0, v)
    if op == "connected_components":
        return lambda: torch.ops.zerocopy.graph_connected_components.default(ip, ix, v, symmetric)
    return lambda: torch.ops.zerocopy.graph_pagerank.default(ip, ix, 0.85, 1e-4, 20, v)


@pytest.mark.parametrize("placement", HOST_PLACEMENTS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("indptr,indices,message", MALFORMED_CSR)
def test_raw_ops_refuse_malformed_graphs(indptr, indices, message, index_dtype, placement):
    """The compiled ops check the offsets and ids they are given (every caller, not only
    CSRGraph's), so a malformed graph raises instead of reading out of bounds: on the CPU (and
    for a unified graph without a GPU) in full, before any list is followed, in every variant."""
    from pytorch_zerocopy.unified import gpu_backed

    if placement == "unified" and gpu_backed():
        pytest.skip("a unified graph runs the GPU kernels here, which word their refusals differently and check only "
                    "what they read: test_gpu_ops_refuse_malformed_graphs covers them")
    g = CSRGraph(torch.tensor(indptr), torch.tensor(indices, dtype=index_dtype), torch.ones(len(indices)),
                 validate=False).to(placement)
    for op in OP_VARIANTS:
        for variant in OP_VARIANTS[op]:
            with pytest.raises((ValueError, IndexError), match=message):
                raw_calls(op, g.indptr, g.indices, variant, weights=g.weights)()


@pytest.mark.parametrize("placement", HOST_PLACEMENTS)
def test_nan_weights_refused(placement):
    g = small_graph(weights=torch.tensor([1.0, float("nan"), 3.0]))
    with pytest.raises(ValueError, match="non-negative numbers"):
        sssp(g.to(placement, 0), 0)
    with pytest.raises(ValueError, match="non-negative numbers"):
        torch.ops.zerocopy.graph_sssp.default(g.indptr, g.indices, g.weights, 0, 2)


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


@pytest.mark.parametrize("call, bad", [
    (lambda g, v: bfs(g, 0, variant=v), ["fastest", "staged", "push", 2]),
    (lambda g, v: sssp(g, 0, variant=v), ["direction", "push", "staged"]),
    (lambda g, v: connected_components(g, variant=v), ["direction", "async", "push"]),
    (lambda g, v: pagerank(g, variant=v), ["direction", "staged"]),
])
def test_variant_not_for_this_op(call, bad):
    g = small_graph(symmetric=True)
    for v in bad:
        with pytest.raises(ValueError, match="variant"):
            call(g, v)


@pytest.mark.parametrize("op, args, bad", [
    ("graph_bfs", lambda g, v: (g.indptr, g.indices, 0, v, False), [-1, 6, 7, 8]),
    ("graph_sssp", lambda g, v: (g.indptr, g.indices, None, 0, v), [4, 6, 7, 99]),
    ("graph_connected_components", lambda g, v: (g.indptr, g.indices, v, True), [4, 5, 6, 8]),
    ("graph_pagerank", lambda g, v: (g.indptr, g.indices, 0.85, 1e-4, 10, v), [4, 7, -3]),
])
def test_op_refuses_variant(op, args, bad):
    g = small_graph(symmetric=True)
    for v in bad:
        with pytest.raises(ValueError, match="variant must be one of"):
            getattr(torch.ops.zerocopy, op).default(*args(g, v))


def test_direction_needs_in_lists():
    g = small_graph()
    with pytest.raises(ValueError, match="in-neighbour lists"):
        torch.ops.zerocopy.graph_bfs.default(g.indptr, g.indices, 0, 4, False)
    with pytest.raises(ValueError, match="together"):
        torch.ops.zerocopy.graph_bfs.default(g.indptr, g.indices, 0, 4, False, g.indptr, None)
    with pytest.raises(ValueError, match="in_indptr"):
        torch.ops.zerocopy.graph_bfs.default(g.indptr, g.indices, 0, 4, False, g.indptr[:-1], g.indices)
    with pytest.raises(ValueError, match="in_indices"):
        torch.ops.zerocopy.graph_bfs.default(g.indptr, g.indices, 0, 4, False, g.indptr, g.indices[:-1])
    with pytest.raises(TypeError, match="in_indices"):
        torch.ops.zerocopy.graph_bfs.default(g.indptr, g.indices, 0, 4, False, g.indptr, g.indices.long())
    t = g.csc()
    depth = torch.ops.zerocopy.graph_bfs.default(g.indptr, g.indices, 0, 4, False, t.indptr, t.indices)[0]
    assert depth.tolist() == [0, 1, 2, -1]


def test_direction_on_a_directed_graph_uses_the_transpose(seed):
    rng = np.random.default_rng(seed)
    s, d = rng.integers(0, 300, 900), rng.integers(0, 300, 900)
    g = CSRGraph.from_coo(s, d, 300)
    indptr, indices, _ = np_csr(g)
    for src in (0, 17, 299):
        np.testing.assert_array_equal(bfs(g, src, variant="direction").numpy(), bfs_reference(indptr, indices, src))


def test_chunk_edges_must_not_be_negative():
    g = small_graph(symmetric=True)
    with pytest.raises(ValueError, match="chunk_edges"):
        torch.ops.zerocopy.graph_connected_components.default(g.indptr, g.indices, 7, True, -1)


def test_op_checks_edge_count():
    g = small_graph()
    with pytest.raises(ValueError, match="indptr"):
        torch.ops.zerocopy.graph_bfs.default(g.indptr, g.indices[:2], 0, 2, False)


def test_pagerank_bad_args():
    with pytest.raises(ValueError, match="alpha"):
        pagerank(small_graph(), alpha=1.5)
    with pytest.raises(ValueError, match="max_iter"):
        pagerank(small_graph(), max_iter=-1)
    with pytest.raises(ValueError, match="tol"):
        torch.ops.zerocopy.graph_pagerank.default(small_graph().indptr, small_graph().indices, 0.85, -1.0, 10, 6)


def test_fake_kernels_and_opcheck():
    g = small_graph(symmetric=True, weights=torch.tensor([1, 2, 3], dtype=torch.int32))
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    torch.library.opcheck(torch.ops.zerocopy.graph_bfs.default, (g.indptr, g.indices, 1, 2, True))
    torch.library.opcheck(torch.ops.zerocopy.graph_bfs.default, (g.indptr, g.indices, 1, 4, True, g.indptr, g.indices))
    torch.library.opcheck(torch.ops.zerocopy.graph_sssp.default, (g.indptr, g.indices, g.weights, 1, 3, 4.0))
    torch.library.opcheck(torch.ops.zerocopy.graph_connected_components.default, (g.indptr, g.indices, 2))
    torch.library.opcheck(torch.ops.zerocopy.graph_connected_components.default, (g.indptr, g.indices, 7, True, 2))
    torch.library.opcheck(torch.ops.zerocopy.graph_pagerank.default, (g.indptr, g.indices, 0.85, 1e-4, 20, 2))
    torch.library.opcheck(torch.ops.zerocopy.graph_pagerank.default, (g.indptr, g.indices, 0.85, 1e-4, 20, 6))


def test_compile_fullgraph():
    g = small_graph(symmetric=True)

    @torch.compile(fullgraph=True, backend="eager")
    def depths(indptr, indices):
        return torch.ops.zerocopy.graph_bfs.default(indptr, indices, 0, 2, False)[0] + 1

    assert depths(g.indptr, g.indices).tolist() == [1, 2, 2, 0]


# --- GPU ----------------------------------------------------------------------------------

GPU_PLACEMENTS = ["cuda", "unified", "uvm", "managed"]


@pytest.mark.cuda
@pytest.mark.parametrize("placement", GPU_PLACEMENTS)
@pytest.mark.parametrize("variant", variants_of("bfs"))
@pytest.mark.parametrize("index_dtype", ID_DTYPES)
def test_bfs_gpu(placement, variant, index_dtype, seed):
    poison_cuda_cache()
    run_bfs_checks(placement, variant, index_dtype, seed, device=0)
    run_bfs_checks(placement, variant, index_dtype, seed + 1, device=0, symmetrize=True)


# Graphs whose offsets or ids would make a kernel read out of bounds, and what the GPU ops say
# about each. Three vertices; source 0 reaches every list, in both directions (the direction
# variant reads the same arrays as its in-lists and names them in_indptr / in_indices when a
# bottom-up level finds the fault first), and every list holds at most two ids, so the
# sampled cc reads them all. Each case has one offender (the negative offset spoils vertices 1
# and 2, read by the same kernel, so the smallest, 1, is the one named).
MALFORMED_GPU = [
    ("decreasing", [0, 3, 1, 4], [1, 2, 0, 0], "indptr is not a valid offset array at node 1:"),
    ("past the edge list", [0, 2, 3, 6], [1, 2, 0, 0], "indptr is not a valid offset array at node 2:"),
    ("negative offset", [0, 2, -1, 4], [1, 2, 0, 0], "indptr is not a valid offset array at node 1:"),
    ("id >= num_nodes", [0, 1, 2, 4], [1, 7, 0, 1], "indices\\[1\\] = 7 is out of range for a graph with 3 nodes"),
    ("negative id", [0, 1, 2, 4], [1, -1, 0, 1], "indices\\[1\\] = -1 is out of range for a graph with 3 nodes"),
]


def check_gpu_op_matches_cpu(op, variant, placement):
    """A valid traversal of `op` in `variant` on the GPU, against the CPU's (the CUDA context is
    still usable after an op refused a bad graph)."""
    from pytorch_zerocopy.graph import kronecker_graph

    g = kronecker_graph(9, 4, seed=11, weights="int", device="cpu")
    pg = g.to(placement, 0)
    if op == "bfs":
        assert torch.equal(bfs(pg, 3, variant=variant).cpu(), bfs(g, 3)), variant
    elif op == "sssp":
        assert torch.equal(sssp(pg, 3, variant=variant).cpu(), sssp(g, 3)), variant
    elif op == "connected_components":
        assert torch.equal(connected_components(pg, variant=variant).cpu(), connected_components(g)), variant
    else:
        got = pagerank(pg, tol=1e-6, max_iter=500, variant=variant).cpu().double()
        assert (got - pagerank(g, tol=1e-9, max_iter=500).double()).abs().sum() <= 1e-6 + 2e-6, variant
    torch.cuda.synchronize()


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
@pytest.mark.parametrize("op", list(OP_VARIANTS))
@pytest.mark.parametrize("index_dtype", ID_DTYPES)
@pytest.mark.parametrize("case,indptr,indices,message", MALFORMED_GPU)
def test_gpu_ops_refuse_malformed_graphs(case, indptr, indices, message, index_dtype, op, placement):
    """The GPU kernels check every offset and id they read, so a malformed graph raises a
    ValueError naming the offending vertex or position (no fault, no hang: the async worklists
    end too), in every variant and placement, and the GPU keeps working: a valid traversal run
    next matches the CPU's."""
    g = CSRGraph(torch.tensor(indptr), torch.tensor(indices, dtype=index_dtype), torch.ones(len(indices)),
                 validate=False)
    pg = g.to(placement, 0)
    for variant in OP_VARIANTS[op]:
        for symmetric in ((False, True) if op == "connected_components" else (False,)):
            for weights in ((None, pg.weights) if op == "sssp" else (None,)):
                with pytest.raises(ValueError, match=message):
                    raw_calls(op, pg.indptr, pg.indices, variant, weights=weights, symmetric=symmetric)()
        check_gpu_op_matches_cpu(op, variant, placement)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
@pytest.mark.parametrize("index_dtype", ID_DTYPES)
@pytest.mark.parametrize("case,indptr,indices,message", [
    # vertex 0's list is longer than a lane's share, so the whole warp reads it
    ("bad id in a long list", [0, 6, 7, 8], [1, 2, 1, 2, 9, 1, 0, 0], "indices\\[4\\] = 9 is out of range"),
    # a lane's short list with two bad ids: the first position is reported
    ("two bad ids in a short list", [0, 3, 4, 5], [1, 5, -2, 0, 0], "indices\\[1\\] = 5 is out of range"),
    ("bad offsets past a long list", [0, 6, 7, 9], [1, 2, 1, 2, 1, 2, 0, 0], "indptr is not a valid offset array "
                                                                             "at node 2:"),
])
def test_gpu_async_variants_report_the_first_offender(case, indptr, indices, message, index_dtype, placement):
    """The async worklists check ids and offsets with compares and report each lane's smallest
    offender once, when the lane leaves the kernel: a bad id in a list the whole warp expands,
    and the first of two in a lane's short list, are reported as the level-by-level variants
    report them."""
    g = CSRGraph(torch.tensor(indptr), torch.tensor(indices, dtype=index_dtype), torch.ones(len(indices)),
                 validate=False)
    pg = g.to(placement, 0)
    for op in ("bfs", "sssp", "pagerank"):
        for variant in ("async", "frontier"):
            with pytest.raises(ValueError, match=message):
                raw_calls(op, pg.indptr, pg.indices, variant, weights=pg.weights if op == "sssp" else None)()
    check_gpu_op_matches_cpu("bfs", "async", placement)


def check_top_down(g, pg, s, want):
    """frontier and direction from source s on pg (g placed): the depths `want`, a valid BFS
    tree, and (frontier) every reached list read exactly once."""
    deg = np.diff(np_csr(g)[0])
    for variant in ("frontier", "direction"):
        depth, pred, stats = bfs(pg, s, variant=variant, predecessors=True, return_stats=True)
        np.testing.assert_array_equal(depth.cpu().numpy(), want, err_msg=f"{variant} source {s}")
        check_bfs_tree(g, depth.cpu().numpy(), pred.cpu().numpy())
        if variant == "frontier":
            assert int(stats[0]) == int(deg[want >= 0].sum())


def hub_graph(rng, index_dtype):
    """A sparse random graph with hubs whose lists span one to dozens of 4 KB chunks (the
    top-down variants queue a long list as its chunks), reached at different levels."""
    n = 30_000
    src = [rng.integers(0, n, 3 * n)]
    dst = [rng.integers(0, n, 3 * n)]
    for hub, deg in zip(rng.choice(n, 6, replace=False), (1_100, 1_500, 3_000, 9_000, 20_000, 29_000)):
        src.append(np.full(deg, hub))
        dst.append(rng.choice(n, deg, replace=False))
    return CSRGraph.from_coo(np.concatenate(src), np.concatenate(dst), n, symmetrize=True, index_dtype=index_dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
@pytest.mark.parametrize("index_dtype", ID_DTYPES)
def test_gpu_top_down_reads_long_lists_in_chunks(placement, index_dtype, seed):
    """frontier and direction queue a long list as its chunks, read by many warps: exact depths,
    a valid BFS tree, and (top-down, frontier) every reached list read exactly once, whether the
    hub sits in a queued level or a scanned one, and whatever the edge array's alignment (a view
    three ids into its storage)."""
    rng = np.random.default_rng(seed)
    g = hub_graph(rng, index_dtype)
    indptr, indices, _ = np_csr(g)
    deg = np.diff(indptr)
    pg = g.to(placement, 0)
    padded = torch.cat([torch.full((3,), -7, dtype=index_dtype, device=pg.indices.device), pg.indices.to("cuda")])
    shifted = padded[3:]
    hubs = np.argsort(deg)[-3:]
    for s in [int(hubs[-1]), int(hubs[0])] + [int(x) for x in rng.integers(0, g.num_nodes, 2)]:
        want = bfs_reference(indptr, indices, s)
        check_top_down(g, pg, s, want)
        depth = torch.ops.zerocopy.graph_bfs.default(pg.indptr, shifted, s, int(Variant.FRONTIER), False)[0]
        np.testing.assert_array_equal(depth.cpu().numpy(), want, err_msg=f"shifted source {s}")
    torch.cuda.synchronize()


def runs_graph(rng, index_dtype):
    """A graph for the top-down scan's runs: short lists, a third of the vertices isolated in
    stretches of every length between them, and a few long lists among the short ones, so a
    scanned tile holds runs of consecutive frontier lists broken by unvisited vertices, deeper
    frontier vertices and long lists, and joined across empty lists."""
    n = 24_000
    live = np.flatnonzero(rng.random(n) < np.where((np.arange(n) // 97) % 3 == 0, 0.05, 0.9))
    src = [rng.choice(live, 2 * n)]
    dst = [rng.choice(live, 2 * n)]
    for hub, deg in zip(rng.choice(live, 4, replace=False), (1_200, 2_500, 5_000, 9_000)):
        src.append(np.full(deg, hub))
        dst.append(rng.choice(live, deg))
    return CSRGraph.from_coo(np.concatenate(src), np.concatenate(dst), n, symmetrize=True, index_dtype=index_dtype), live


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
@pytest.mark.parametrize("index_dtype", ID_DTYPES)
def test_gpu_top_down_scan_reads_runs_of_lists(placement, index_dtype, seed):
    """frontier and direction on a graph whose scanned levels hold runs of consecutive lists
    (runs_graph): exact depths, a valid BFS tree (each reached vertex's parent is the owner of
    the list it was found in), and (frontier) every reached list read exactly once."""
    rng = np.random.default_rng(seed)
    g, live = runs_graph(rng, index_dtype)
    indptr, indices, _ = np_csr(g)
    pg = g.to(placement, 0)
    for s in [int(x) for x in rng.choice(live, 3)]:
        want = bfs_reference(indptr, indices, s)
        check_top_down(g, pg, s, want)
    torch.cuda.synchronize()


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
@pytest.mark.parametrize("index_dtype", ID_DTYPES)
def test_gpu_top_down_reports_faults_in_long_lists(placement, index_dtype):
    """A bad id deep in a chunked list, and long lists that overlap (offsets that decrease at a
    vertex the search never reaches, so more chunks than disjoint lists could hold): a clear
    ValueError from frontier and direction, and the GPU keeps working."""
    m = 8192
    ids = np.tile(np.arange(1, 11), m // 10 + 1)[:m]
    ids[5000] = 1000  # not one of the 100 vertices
    # 100 vertices, so that a one-vertex frontier is expanded top-down by direction too
    bad_id = CSRGraph(torch.tensor([0] + [m] * 100), torch.tensor(ids, dtype=index_dtype), validate=False)
    evens = np.tile(np.arange(2, 12, 2), m // 5 + 1)[:m]
    overlapping = CSRGraph(torch.tensor([0, m] * 6 + [m] * 89), torch.tensor(evens, dtype=index_dtype),
                           validate=False)
    for g, message in ((bad_id, "indices\\[5000\\] = 1000 is out of range"),
                       (overlapping, "indptr is not a valid offset array at node 1:")):
        pg = g.to(placement, 0)
        for variant in ("frontier", "direction"):
            with pytest.raises(ValueError, match=message):
                raw_calls("bfs", pg.indptr, pg.indices, variant)()
    check_gpu_op_matches_cpu("bfs", "frontier", placement)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
def test_gpu_staged_cc_refuses_malformed_graphs_in_every_chunk(placement):
    """The staged cc, with chunks smaller than the edge list: a bad id in a later chunk, and
    offsets past the edge list on the last vertex (whose edges the chunks map back by binary
    search), are reported like any other variant's."""
    from pytorch_zerocopy.graph import kronecker_graph

    g = kronecker_graph(11, 8, seed=5, device="cpu")
    for fault in ("id", "offsets"):
        indptr, indices = g.indptr.clone(), g.indices.clone()
        if fault == "id":
            pos = g.num_edges - 3
            indices[pos] = g.num_nodes + 5
            message = f"indices\\[{pos}\\] = {g.num_nodes + 5} is out of range"
        else:
            indptr[-1] += 100
            message = f"indptr is not a valid offset array at node {g.num_nodes - 1}:"
        pg = CSRGraph(indptr, indices, symmetric=True, validate=False).to(placement, 0)
        for chunk in (7, 1000, 1 << 20):
            with pytest.raises(ValueError, match=message):
                torch.ops.zerocopy.graph_connected_components.default(pg.indptr, pg.indices, 7, True, chunk)
    check_gpu_op_matches_cpu("connected_components", "staged", placement)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", GPU_PLACEMENTS)
@pytest.mark.parametrize("variant", variants_of("sssp"))
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
@pytest.mark.parametrize("variant", variants_of("connected_components"))
@pytest.mark.parametrize("index_dtype", ID_DTYPES)
def test_cc_gpu(placement, variant, index_dtype, seed):
    poison_cuda_cache()
    run_cc_checks(placement, variant, index_dtype, seed, device=0)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", GPU_PLACEMENTS)
@pytest.mark.parametrize("variant", variants_of("pagerank"))
def test_pagerank_gpu(placement, variant, seed):
    poison_cuda_cache()
    for index_dtype in ID_DTYPES:
        run_pagerank_checks(placement, variant, index_dtype, seed, device=0)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
@pytest.mark.parametrize("variant", variants_of("pagerank"))
def test_pagerank_gpu_accuracy(placement, variant, seed):
    poison_cuda_cache()
    run_pagerank_accuracy(placement, variant, seed, device=0)


def larger_graphs():
    from pytorch_zerocopy.graph import grid_graph, kronecker_graph, uniform_random_graph

    return {
        "kron14": kronecker_graph(14, 8, seed=3, weights="int", device="cpu"),  # hubs, isolated vertices
        "urand14": uniform_random_graph(14, 8, seed=5, weights="float", device="cpu"),
        "grid60x70": grid_graph(60, 70, weights="float"),  # many levels
        "kron12-directed": kronecker_graph(12, 8, seed=4, weights="int", symmetrize=False, device="cpu"),
    }


@pytest.mark.cuda
@pytest.mark.parametrize("op", ["bfs", "sssp", "connected_components", "pagerank"])
def test_gpu_larger_graphs_match_cpu(op):
    """Graphs big enough for many blocks, long lists (hub vertices) and many levels, every
    variant of the op in every placement."""
    for name, g in larger_graphs().items():
        for placement in GPU_PLACEMENTS:
            pg = g.to(placement, 0)
            for variant in variants_of(op):
                where = f"{name} {placement} {variant}"
                if op == "bfs":
                    for s in (0, g.num_nodes // 2):
                        depth, pred = bfs(pg, s, variant=variant, predecessors=True)
                        ref = bfs(g, s)
                        assert torch.equal(depth.cpu(), ref), where
                        check_bfs_tree(g, depth.cpu().numpy(), pred.cpu().numpy())
                elif op == "sssp":
                    for s in (0, g.num_nodes // 2):
                        torch.testing.assert_close(sssp(pg, s, variant=variant).cpu(), sssp(g, s), rtol=1e-5,
                                                   atol=0, msg=where)
                elif op == "connected_components":
                    assert torch.equal(connected_components(pg, variant=variant, weak=True).cpu(),
                                       connected_components(g, weak=True)), where
                else:
                    got = pagerank(pg, tol=1e-6, max_iter=500, variant=variant).cpu().double()
                    want = pagerank(g, tol=1e-9, max_iter=500).double()
                    assert (got - want).abs().sum() <= 1e-6 + 2e-6, where


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["unified", "cuda"])
def test_direction_reads_less_than_the_edge_list(placement):
    """On graphs with a giant component, bottom-up levels stop reading a list at the first
    64-byte block holding a frontier neighbour: the direction variant reads less than a
    top-down search, which reads every list of the vertices it reaches, with exact depths and a
    valid BFS tree. How much less depends on the lists' length against the block (16 int32
    ids): on the uniform graph (mean degree 16) a list is one or two blocks, so a level goes
    bottom-up only once few vertices are left unvisited (in host memory, where its bytes
    decide, not before), and the lists of the last large frontier are never read; on the
    Kronecker graph the long lists of hubs stop early, and well under half the edge list is
    read."""
    from pytorch_zerocopy.graph import kronecker_graph, uniform_random_graph

    for g, share in ((uniform_random_graph(16, 8, seed=2, device="cpu"), 1.0),
                     (kronecker_graph(15, 16, seed=7, device="cpu"), 0.5)):
        pg = g.to(placement, 0)
        deg = np.diff(g.indptr.numpy())
        for s in (1, g.num_nodes // 4):
            depth, pred, stats = bfs(pg, s, variant="direction", predecessors=True, return_stats=True)
            assert torch.equal(depth.cpu(), bfs(g, s))
            check_bfs_tree(g, depth.cpu().numpy(), pred.cpu().numpy())
            reached = depth.cpu().numpy() >= 0
            if reached.sum() > g.num_nodes // 2:
                top_down = int(deg[reached].sum())
                assert int(stats[0]) < share * top_down, (int(stats[0]), top_down)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["unified", "cuda"])
@pytest.mark.parametrize("shape", [(300, 300), (1, 5000), (2, 3000), (64, 1)])
def test_async_high_diameter(placement, shape):
    """Grids and paths: thousands of levels, the carried-vertex path of the async worklist."""
    from pytorch_zerocopy.graph import grid_graph

    poison_cuda_cache()
    for weights in (None, "int", "float"):
        g = grid_graph(*shape, weights=weights)
        pg = g.to(placement, 0)
        for s in (0, g.num_nodes // 2, g.num_nodes - 1):
            depth, pred = bfs(pg, s, variant="async", predecessors=True)
            assert torch.equal(depth.cpu(), bfs(g, s))
            check_bfs_tree(g, depth.cpu().numpy(), pred.cpu().numpy())
            torch.testing.assert_close(sssp(pg, s, variant="async").cpu(), sssp(g, s), rtol=1e-5, atol=0)


@pytest.mark.cuda
def test_async_repeated_runs(seed):
    """Many runs from many sources on a power-law and a mesh graph: races in the worklist
    (claims, publication, termination) show up as wrong or missing values."""
    from pytorch_zerocopy.graph import grid_graph, kronecker_graph

    rng = np.random.default_rng(seed)
    for g in (kronecker_graph(13, 16, seed=seed % 1000, weights="int", device="cpu"),
              grid_graph(100, 120, weights="int")):
        pg = g.to("unified", 0)
        for s in rng.integers(0, g.num_nodes, 12):
            assert torch.equal(bfs(pg, int(s), variant="async").cpu(), bfs(g, int(s)))
            torch.testing.assert_close(sssp(pg, int(s), variant="async").cpu(), sssp(g, int(s)), rtol=0, atol=0)


@pytest.mark.cuda
@pytest.mark.parametrize("tuning", [("1", "64", "1", "1"), ("2", "1048576", "1073741824", "4"),
                                    ("16", "256", "4096", "2")])
def test_async_tuning_from_environment(monkeypatch, tuning):
    """The worklist's launch and scheduling knobs change its speed, never its result; a bad value
    is a ValueError naming the variable."""
    from pytorch_zerocopy.graph import grid_graph, kronecker_graph

    names = ("PYTORCH_ZEROCOPY_ASYNC_BLOCKS_PER_SM", "PYTORCH_ZEROCOPY_ASYNC_MAX_SLEEP_NS",
             "PYTORCH_ZEROCOPY_ASYNC_CARRY_CHAIN", "PYTORCH_ZEROCOPY_ASYNC_BLOCK_WARPS")
    for name, value in zip(names, tuning):
        monkeypatch.setenv(name, value)
    for g in (grid_graph(60, 70, weights="int"), kronecker_graph(11, 8, seed=2, weights="int", device="cpu")):
        pg = g.to("unified", 0)
        for s in (0, g.num_nodes // 3):
            assert torch.equal(bfs(pg, s, variant="async").cpu(), bfs(g, s))
            torch.testing.assert_close(sssp(pg, s, variant="async").cpu(), sssp(g, s), rtol=0, atol=0)
    g = grid_graph(8, 8).to("unified", 0)
    for name, bad in zip(names, ("0", "12ns", "-3", "5")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            bfs(g, 0, variant="async")
        monkeypatch.delenv(name)


@pytest.mark.cuda
def test_async_edge_cases():
    from pytorch_zerocopy.graph import kronecker_graph

    lone = CSRGraph.from_coo([1], [2], 5).to("unified", 0)  # source 0 has no out-edges
    assert bfs(lone, 0, variant="async").cpu().tolist() == [0, -1, -1, -1, -1]
    assert bfs(lone, 1, variant="async").cpu().tolist() == [-1, 0, 1, -1, -1]
    top = np.iinfo(np.int64).max
    assert sssp(lone, 1, variant="async").cpu().tolist() == [top, 0, 1, top, top]
    empty = CSRGraph.from_coo([], [], 7).to("cuda", 0)  # every vertex dangling
    for variant in ("push", "async"):
        torch.testing.assert_close(pagerank(empty, variant=variant).cpu(), torch.full((7,), 1 / 7))
    g = kronecker_graph(10, 8, seed=1, device="cpu")
    pg = g.to("unified", 0)
    for variant in OP_VARIANTS["pagerank"]:
        torch.testing.assert_close(pagerank(pg, alpha=0.0, variant=variant).cpu(),
                                   torch.full((g.num_nodes,), 1 / g.num_nodes))
        assert torch.equal(pagerank(pg, max_iter=0, variant=variant).cpu(),
                           torch.full((g.num_nodes,), 1 / g.num_nodes, dtype=torch.float32))
        # alpha = 1 never meets a bound: max_iter stops it. Async stops within a few steps per
        # warp of its work budget, part-way through its residuals, so only finiteness holds.
        rank, stats = pagerank(pg, alpha=1.0, max_iter=4, variant=variant, return_stats=True)
        assert torch.isfinite(rank).all(), variant
        if variant != "async":
            assert int(stats[1]) <= 4 and float(rank.double().sum()) == pytest.approx(1.0, abs=1e-3), variant


@pytest.mark.cuda
@pytest.mark.parametrize("placement", GPU_PLACEMENTS)
@pytest.mark.parametrize("chunk", [7, 1000, 4099, 1 << 20])
def test_cc_staged_chunks(placement, chunk, seed):
    """Chunks smaller than a slice, not line-aligned, more than the three buffers (reused), and
    one chunk for everything: the labels of the reference, every edge read once."""
    from pytorch_zerocopy.graph import kronecker_graph

    poison_cuda_cache()
    for g in (kronecker_graph(11, 8, seed=seed % 1000, device="cpu"),
              kronecker_graph(11, 4, seed=seed % 997, symmetrize=False, device="cpu")):
        pg = g.to(placement, 0)
        labels, stats = torch.ops.zerocopy.graph_connected_components.default(pg.indptr, pg.indices, 7, g.symmetric,
                                                                              chunk)
        assert torch.equal(labels.cpu(), connected_components(g, weak=True))
        assert int(stats[0]) == g.num_edges


@pytest.mark.cuda
def test_side_stream_runs():
    """The staged copies and the persistent kernels follow the caller's stream."""
    from pytorch_zerocopy.graph import grid_graph, kronecker_graph

    kron = kronecker_graph(12, 8, seed=2, device="cpu")
    grid = grid_graph(50, 50)
    ug, ugrid = kron.to("unified", 0), grid.to("unified", 0)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        labels = connected_components(ug, variant="staged")
        depth = bfs(ugrid, 7, variant="async")
        rank = pagerank(ug, variant="async")
    s.synchronize()
    assert torch.equal(labels.cpu(), connected_components(kron))
    assert torch.equal(depth.cpu(), bfs(grid, 7))
    assert (rank.cpu().double() - pagerank(kron, tol=1e-9).double()).abs().sum() <= 1e-4 + 2e-6


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
@pytest.mark.whole_gpu
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
    """The CUDA kernels against their schemas and fake kernels. Only calls whose outputs are
    bitwise reproducible also go through opcheck's eager-versus-compiled comparison: on the GPU,
    predecessors are any valid parent, the async variants' results and counters depend on thread
    timing, and PageRank sums floats in atomics' order (each checked against the reference
    elsewhere)."""
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    g = small_graph(symmetric=True, weights=torch.tensor([1.5, 2.0, 3.0])).to("cuda", 0)
    ops = torch.ops.zerocopy
    reproducible = [
        (ops.graph_bfs.default, (g.indptr, g.indices, 1, 3, False)),
        (ops.graph_bfs.default, (g.indptr, g.indices, 1, 4, False, g.indptr, g.indices)),
        (ops.graph_connected_components.default, (g.indptr, g.indices, 3, True)),
    ]
    timing_dependent = [
        (ops.graph_bfs.default, (g.indptr, g.indices, 1, 3, True)),
        (ops.graph_bfs.default, (g.indptr, g.indices, 1, 4, True, g.indptr, g.indices)),
        (ops.graph_bfs.default, (g.indptr, g.indices, 1, 5, True)),
        (ops.graph_sssp.default, (g.indptr, g.indices, g.weights, 1, 3, 2.0)),
        (ops.graph_sssp.default, (g.indptr, g.indices, g.weights, 1, 5, 0.0)),
        (ops.graph_connected_components.default, (g.indptr, g.indices, 7, True, 1)),
        (ops.graph_pagerank.default, (g.indptr, g.indices, 0.85, 1e-4, 20, 3)),
        (ops.graph_pagerank.default, (g.indptr, g.indices, 0.85, 1e-4, 20, 6)),
        (ops.graph_pagerank.default, (g.indptr, g.indices, 0.85, 1e-4, 20, 5)),
    ]
    for op, args in reproducible:
        torch.library.opcheck(op, args)
    for op, args in timing_dependent:
        torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


@pytest.mark.cuda
def test_mixed_devices_refused():
    g = small_graph()
    with pytest.raises(ValueError, match="same device"):
        torch.ops.zerocopy.graph_bfs.default(g.indptr.cuda(), g.indices, 0, 2, False)
    with pytest.raises(ValueError, match="same device"):
        torch.ops.zerocopy.graph_connected_components.default(g.indptr, g.indices.cuda(), 2, False)
    gc = g.to("cuda", 0)
    with pytest.raises(ValueError, match="same device"):
        torch.ops.zerocopy.graph_bfs.default(gc.indptr, gc.indices, 0, 4, False, g.indptr, gc.indices)


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


def test_peer_benchmark_quick(tmp_path):
    """benchmarks/traversal_peer.py --quick runs every op and variant on small graphs (on the
    CPU here) and writes the bars the full run reports."""
    import json
    import os
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    try:
        from benchmarks import traversal_peer
    finally:
        sys.path.remove(root)
    assert traversal_peer.main(["--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "traversal_peer_quick.json").read_text())
    bars = result["bars"]
    for key in ("bfs_unified_ms", "cc_default_unified_ms", "pagerank_unified_ms", "pagerank_l1_vs_fp64",
                "async_over_frontier_high_diameter"):
        assert bars[key] is not None and bars[key] > 0, key
    assert bars["every_variant_matches_reference"] is True
    assert bars["pagerank_l1_vs_fp64"] <= 1e-4
    ran = {(r["op"], r["variant"]) for g in result["graphs"] for r in g["rows"] if r["runs"]}
    for op, short in (("bfs", "bfs"), ("sssp", "sssp"), ("connected_components", "cc"), ("pagerank", "pagerank")):
        for variant in variants_of(op):
            assert (short, variant) in ran, (op, variant)
    assert (tmp_path / "traversal_peer_quick.md").exists()
