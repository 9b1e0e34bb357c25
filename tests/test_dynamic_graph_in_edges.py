"""DynamicGraph.delete_vertices on each way of finding in-edges (the out-lists of a symmetric
graph, the in-edge index of a directed one, the page sweep) against a multiset of edges, with
edge and vertex updates interleaved; every list path against a twin graph that sweeps (identical
pools, page tables and queues); the index's invariants; bad ids. CUDA cases run the same scripts
on the GPU and compare the whole state, index included, with the CPU's."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from graph_reference import fresh_seed
from test_dynamic_graph import assert_same_state, check_invariants, random_csr, state_of

import pytorch_zerocopy.graph.dynamic as dynamic
from pytorch_zerocopy.graph import CSRGraph, DynamicGraph

cuda = pytest.mark.cuda

# (symmetric, in_index) -> the lookup delete_vertices uses.
MODES = {"index": (False, True), "sweep": (False, False), "out_lists": (True, False)}


@pytest.fixture
def seed():
    return fresh_seed()


class EdgeSet:
    """The reference: a multiset of (source, destination) and the live vertex ids."""

    def __init__(self, graph: CSRGraph):
        indptr, idx = graph.indptr.tolist(), graph.indices.tolist()
        self.edges = Counter((v, idx[e]) for v in range(graph.num_nodes) for e in range(indptr[v], indptr[v + 1]))
        self.alive = set(range(graph.num_nodes))
        self.symmetric = graph.symmetric

    def insert(self, src, dst):
        pairs = list(zip(src, dst)) + (list(zip(dst, src)) if self.symmetric else [])
        added = 0
        for p in dict.fromkeys(pairs):
            if self.edges[p] == 0:
                self.edges[p] = 1
                added += 1
        return added

    def delete(self, src, dst):
        pairs = set(zip(src, dst)) | ({(d, s) for s, d in zip(src, dst)} if self.symmetric else set())
        return sum(self.edges.pop(p, 0) for p in pairs)

    def delete_vertices(self, ids):
        dying = set(ids)
        gone = [p for p in self.edges if p[0] in dying or p[1] in dying]
        removed = sum(self.edges.pop(p) for p in gone)
        self.alive -= dying
        return removed

    def live(self):
        return sorted(self.alive)


def edge_multiset(dg: DynamicGraph) -> Counter:
    snap = dg.to_csr()
    indptr, idx = snap.indptr.cpu().tolist(), snap.indices.cpu().tolist()
    return Counter((v, idx[e]) for v in range(snap.num_nodes) for e in range(indptr[v], indptr[v + 1]))


def check_index(dg: DynamicGraph, *, after_insert: bool = False):
    """Index list v names the source of every edge into v and dead ids' lists are empty; its
    pages are consistent; after an insertion its size is within the bound that triggers a
    rebuild (edge deletion shrinks the graph, not the index)."""
    index = dg._in
    if index is None:
        return
    check_invariants(index)
    n = dg.num_nodes
    snap = index.to_csr() if index._num_nodes == n else None
    assert snap is not None and snap.num_nodes == n
    ip, ix = snap.indptr.cpu().tolist(), snap.indices.cpu().tolist()
    named = {(ix[e], v) for v in range(n) for e in range(ip[v], ip[v + 1])}
    assert set(edge_multiset(dg)) <= named
    assert dg._index_entries == int(index.degree.sum())
    assert dg._entries == int(dg.degree.sum())
    if after_insert:
        assert dg._index_entries <= 2 * dg._entries + dynamic._INDEX_SLACK
    dead = [v for v, a in enumerate(dg.is_alive().cpu().tolist()) if not a]
    assert all(ip[v] == ip[v + 1] for v in dead)


def build(graph, mode, placement="cpu", page_size=4):
    symmetric, in_index = MODES[mode]
    dg = DynamicGraph.from_csr(graph, placement=placement, page_size=page_size, headroom=0.1, symmetric=symmetric,
                               in_index=in_index)
    assert dg.in_edge_lookup == mode
    return dg


def graph_for(rng, mode, n=60, m=400):
    return random_csr(rng, n=n, m=m, symmetrize=MODES[mode][0], duplicates=not MODES[mode][0])


def run_vertex_script(rng, graph, dg, steps, *, twins=(), sweep_twin=None):
    """Random batches on ``dg`` and the reference; ``twins`` get the same calls and must keep the
    same state; ``sweep_twin`` deletes vertices by the sweep and must keep the same lists."""
    ref = EdgeSet(graph)
    ref.symmetric = dg.symmetric
    for step in range(steps):
        kind = rng.choice(["ins", "del", "del_existing", "vins", "vdel", "vdel"])
        live = ref.live()
        if kind == "ins":
            size = int(rng.integers(1, 120))
            call = ("insert_edges", rng.choice(live, size).tolist(), rng.choice(live, size).tolist())
            expected = ref.insert(call[1], call[2])
        elif kind == "del":
            size = int(rng.integers(1, 60))
            call = ("delete_edges", rng.choice(live, size).tolist(), rng.choice(live, size).tolist())
            expected = ref.delete(call[1], call[2])
        elif kind == "del_existing":
            pairs = list(ref.edges)
            if not pairs:
                continue
            pick = rng.choice(len(pairs), min(len(pairs), int(rng.integers(1, 100))), replace=False)
            call = ("delete_edges", [pairs[i][0] for i in pick], [pairs[i][1] for i in pick])
            expected = ref.delete(call[1], call[2])
        elif kind == "vins":
            count = int(rng.integers(0, 8))
            call = ("insert_vertices", count)
            expected = None
        else:
            if len(live) < 8:
                continue
            size = int(rng.integers(1, max(2, len(live) // 4)))
            ids = rng.choice(live, size).tolist()  # repeats on purpose
            call = ("delete_vertices", ids)
            expected = ref.delete_vertices(ids)
        got = getattr(dg, call[0])(*call[1:])
        if call[0] == "insert_vertices":
            ref.alive |= set(got.cpu().tolist())
        else:
            assert got == expected, call[0]
        assert edge_multiset(dg) == +ref.edges
        assert set(torch.nonzero(dg.is_alive()).flatten().cpu().tolist()) == ref.alive
        check_invariants(dg)
        check_index(dg, after_insert=call[0] == "insert_edges")
        for twin in twins:
            getattr(twin, call[0])(*call[1:])
            assert_same_state(dg, twin)
            assert_same_index(dg, twin)
        if sweep_twin is not None:
            if call[0] == "delete_vertices":
                assert sweep_twin._delete_vertices(call[1], sweep=True) == expected
            else:
                getattr(sweep_twin, call[0])(*call[1:])
            assert_same_state(dg, sweep_twin)
    return ref


def assert_same_index(a: DynamicGraph, b: DynamicGraph):
    assert (a._in is None) == (b._in is None)
    if a._in is not None:
        assert_same_state(a._in, b._in)
        assert a._index_entries == b._index_entries


# --- CPU and unified ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("placement", ["cpu", "unified"])
def test_delete_vertices_matches_edge_set(seed, mode, placement):
    rng = np.random.default_rng(seed)
    g = graph_for(rng, mode)
    dg = build(g, mode, placement)
    sweep_twin = build(g, mode, placement)
    run_vertex_script(rng, g, dg, steps=40, sweep_twin=sweep_twin)


@pytest.mark.parametrize("mode", ["index", "out_lists"])
def test_big_batches_and_hubs(seed, mode):
    """Most of the graph deleted at once, page sizes where hub lists need index pages."""
    rng = np.random.default_rng(seed)
    g = graph_for(rng, mode, n=200, m=3000)
    for page_size in (4, 32):
        dg = build(g, mode, page_size=page_size)
        twin = build(g, mode, page_size=page_size)
        ref = EdgeSet(g)
        ids = rng.choice(200, 150, replace=False).tolist() + [7]
        expected = ref.delete_vertices(ids)
        assert expected > 0
        assert dg.delete_vertices(torch.tensor(ids, dtype=torch.int32)) == expected
        assert twin._delete_vertices(ids, sweep=True) == expected
        assert edge_multiset(dg) == +ref.edges
        assert_same_state(dg, twin)
        check_index(dg)


def test_index_rebuilds_when_stale(seed, monkeypatch):
    """Insert/delete churn leaves stale index entries; the index is rebuilt before it holds more
    than twice the graph's entries plus the slack, and stays a superset throughout."""
    monkeypatch.setattr(dynamic, "_INDEX_SLACK", 16)
    rng = np.random.default_rng(seed)
    g = graph_for(rng, "index", n=40, m=200)
    dg = build(g, "index")
    ref = EdgeSet(g)
    rebuilt = 0
    for _ in range(12):
        src, dst = rng.integers(0, 40, 150).tolist(), rng.integers(0, 40, 150).tolist()
        index = dg._in
        assert dg.insert_edges(src, dst) == ref.insert(src, dst)
        rebuilt += dg._in is not index
        check_index(dg, after_insert=True)
        assert dg.delete_edges(src, dst) == ref.delete(src, dst)
        check_index(dg)
    assert rebuilt > 0
    live = ref.live()
    ids = rng.choice(live, 10, replace=False).tolist()
    assert dg.delete_vertices(ids) == ref.delete_vertices(ids)
    assert edge_multiset(dg) == +ref.edges
    check_index(dg)


def test_reused_ids_get_fresh_in_edges(seed):
    rng = np.random.default_rng(seed)
    g = graph_for(rng, "index", n=30, m=120)
    dg = build(g, "index")
    ref = EdgeSet(g)
    assert dg.delete_vertices([3, 5]) == ref.delete_vertices([3, 5])
    assert dg.insert_vertices(2).tolist() == [3, 5]
    ref.alive |= {3, 5}
    assert dg.insert_edges([0, 1, 5], [3, 3, 0]) == ref.insert([0, 1, 5], [3, 3, 0])
    assert dg.delete_vertices([3]) == ref.delete_vertices([3]) == 2
    assert edge_multiset(dg) == +ref.edges
    check_index(dg)


@pytest.mark.parametrize("mode", list(MODES))
def test_bad_ids_raise_and_leave_graph_unchanged(seed, mode):
    rng = np.random.default_rng(seed)
    g = graph_for(rng, mode, n=20, m=60)
    dg = build(g, mode)
    dg.delete_vertices([4])
    before = state_of(dg)
    index_before = None if dg._in is None else state_of(dg._in)
    for exc, pattern, ids in ((IndexError, r"ids\[1\] = 20 is out of range for a graph with 20 vertex ids", [0, 20]),
                              (IndexError, r"ids\[0\] = -1 is out of range", [-1]),
                              (ValueError, r"ids\[2\] = 4 is a deleted vertex", [1, 2, 4]),
                              (TypeError, "int32 or int64", torch.tensor([1.0]))):
        with pytest.raises(exc, match=pattern):
            dg.delete_vertices(ids)
        assert_same_state(dg, _graph_with(dg, before))
        if index_before is not None:
            assert_same_state(dg._in, _graph_with(dg._in, index_before))
    assert dg.delete_vertices([]) == 0


def _graph_with(dg, state):
    """A stand-in exposing a state snapshot the way assert_same_state reads a graph."""
    class Frozen:
        pass
    f = Frozen()
    for name, value in state.items():
        if name != "counters":
            setattr(f, name, value)
    f.num_nodes, f._vertex_head, f._vertex_tail, f.num_pages = state["counters"]
    return f


def test_defaults_and_symmetric_check():
    directed = CSRGraph.from_coo([0, 1, 2], [1, 2, 0], 3)
    assert DynamicGraph.from_csr(directed).in_edge_lookup == "sweep"
    assert DynamicGraph.from_csr(directed, in_index=True).in_edge_lookup == "index"
    sym = CSRGraph.from_coo([0, 1, 2], [1, 2, 0], 3, symmetrize=True)
    dg = DynamicGraph.from_csr(sym, in_index=True)
    assert dg.in_edge_lookup == "out_lists" and dg._in is None
    assert DynamicGraph.from_csr(sym, symmetric=False, in_index=True).in_edge_lookup == "index"
    # symmetric=True on an unmarked CSR: accepted when its edges do come in both directions.
    both = CSRGraph.from_coo([0, 1, 1, 1], [1, 0, 2, 2], 3)
    with pytest.raises(ValueError, match="edges come in both directions"):
        DynamicGraph.from_csr(both, symmetric=True)
    ok = CSRGraph.from_coo([0, 1, 1, 2], [1, 0, 2, 1], 3)
    assert DynamicGraph.from_csr(ok, symmetric=True).delete_vertices([1]) == 4
    with pytest.raises(TypeError, match="in_index must be a bool"):
        DynamicGraph.from_csr(directed, in_index=1)


def test_memory_counts_the_index(seed):
    rng = np.random.default_rng(seed)
    g = graph_for(rng, "index")
    plain, indexed = build(g, "sweep"), build(g, "index")
    a, b = plain.memory(), indexed.memory()
    assert b.total_bytes == a.total_bytes + indexed._in.memory().total_bytes
    assert b.used_pool_bytes > a.used_pool_bytes


# --- CUDA: the same scripts, state identical to the CPU's ------------------------------------


@cuda
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("placement", ["cuda", "unified"])
def test_cuda_delete_vertices_matches_cpu(seed, mode, placement):
    rng = np.random.default_rng(seed)
    g = graph_for(rng, mode)
    cpu = build(g, mode, "cpu")
    gpu = build(g, mode, placement)
    assert gpu.device.type == "cuda"
    sweep_twin = build(g, mode, placement)
    run_vertex_script(rng, g, cpu, steps=40, twins=[gpu], sweep_twin=sweep_twin)


@cuda
@pytest.mark.parametrize("mode", ["index", "out_lists"])
def test_cuda_big_batches(seed, mode):
    rng = np.random.default_rng(seed)
    g = graph_for(rng, mode, n=2000, m=40000)
    cpu, gpu = build(g, mode, "cpu", 32), build(g, mode, "cuda", 32)
    ids = torch.from_numpy(rng.choice(2000, 700, replace=False))
    expected = EdgeSet(g).delete_vertices(ids.tolist())
    assert cpu.delete_vertices(ids) == expected
    assert gpu.delete_vertices(ids.cuda()) == expected
    assert_same_state(cpu, gpu)
    assert_same_index(cpu, gpu)


@cuda
def test_cuda_bad_ids_raise(seed):
    rng = np.random.default_rng(seed)
    dg = build(graph_for(rng, "index", n=20, m=60), "index", "cuda")
    before = state_of(dg)
    with pytest.raises(IndexError, match=r"ids\[1\] = 20 is out of range"):
        dg.delete_vertices(torch.tensor([0, 20], device="cuda"))
    assert_same_state(dg, _graph_with(dg, before))
