"""DynamicGraph against a plain-Python model of its documented semantics (lists, neighbour
order, duplicates, compaction, vertex-id reuse), on the CPU and unified placements and, where a
GPU exists, CUDA against the CPU (identical pools, page tables and queues); sampling and BFS
against the package's ops on the to_csr snapshot; bad input and all-or-nothing batches."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
import torch

from graph_reference import fresh_seed

import pytorch_zerocopy.sampling as S
from pytorch_zerocopy.graph import CSRGraph, DynamicGraph, PoolFullError, bfs, kronecker_graph
from pytorch_zerocopy.graph.dynamic import csr_bytes

cuda = pytest.mark.cuda


@pytest.fixture
def seed():
    return fresh_seed()


# --- the model ---------------------------------------------------------------------------------


class Model:
    """The documented semantics, one Python list per vertex."""

    def __init__(self, graph: CSRGraph, symmetric=None):
        indptr = graph.indptr.tolist()
        idx = graph.indices.tolist()
        w = None if graph.weights is None else graph.weights.tolist()
        self.weighted = w is not None
        self.lists = [[(idx[e], None if w is None else w[e]) for e in range(indptr[v], indptr[v + 1])]
                      for v in range(graph.num_nodes)]
        self.alive = [True] * graph.num_nodes
        self.free = deque()
        self.symmetric = graph.symmetric if symmetric is None else symmetric

    def insert_edges(self, src, dst, w=None):
        src, dst = list(src), list(dst)
        w = [None] * len(src) if w is None else list(w)
        if self.symmetric:
            src, dst, w = src + dst, dst + src, w + w
        first = {}
        for s, d, x in zip(src, dst, w):
            first.setdefault((s, d), x)
        added = 0
        for (s, d) in sorted(first):
            if all(e[0] != d for e in self.lists[s]):
                self.lists[s].append((d, first[(s, d)]))
                added += 1
        return added

    @staticmethod
    def compact(lst, holes):
        d1 = len(lst) - len(holes)
        holeset = set(holes)
        survivors = [p for p in range(d1, len(lst)) if p not in holeset]
        out = lst[:d1]
        for h, p in zip([h for h in holes if h < d1], survivors):
            out[h] = lst[p]
        return out

    def delete_edges(self, src, dst):
        pairs = set(zip(src, dst))
        if self.symmetric:
            pairs |= {(d, s) for s, d in pairs}
        removed = 0
        for v in sorted({s for s, _ in pairs}):
            holes = [p for p, e in enumerate(self.lists[v]) if (v, e[0]) in pairs]
            removed += len(holes)
            self.lists[v] = self.compact(self.lists[v], holes)
        return removed

    def insert_vertices(self, n):
        ids = []
        while self.free and len(ids) < n:
            ids.append(self.free.popleft())
        while len(ids) < n:
            self.lists.append([])
            self.alive.append(False)
            ids.append(len(self.lists) - 1)
        for v in ids:
            self.alive[v] = True
        return ids

    def delete_vertices(self, ids):
        dying = set(ids)
        removed = 0
        for v in range(len(self.lists)):
            holes = [p for p, e in enumerate(self.lists[v]) if v in dying or e[0] in dying]
            removed += len(holes)
            self.lists[v] = self.compact(self.lists[v], holes)
        for v in sorted(dying):
            self.alive[v] = False
            self.free.append(v)
        return removed

    def csr(self):
        indptr = np.cumsum([0] + [len(x) for x in self.lists])
        indices = [e[0] for x in self.lists for e in x]
        weights = [e[1] for x in self.lists for e in x]
        return indptr, indices, weights


def assert_matches(dg: DynamicGraph, model: Model):
    snap = dg.to_csr()
    indptr, indices, weights = model.csr()
    assert snap.num_nodes == len(model.lists)
    assert snap.indptr.cpu().tolist() == indptr.tolist()
    assert snap.indices.cpu().tolist() == indices
    if model.weighted:
        assert snap.weights.cpu().tolist() == pytest.approx(weights)
    assert dg.is_alive().cpu().tolist() == model.alive
    check_invariants(dg)


def tree_pages(degree: torch.Tensor, page_size: int) -> torch.Tensor:
    """Pages (data and index) of lists of the given degrees (int64, elementwise), as
    ``tree_pages`` in csrc/dynamic_graph.h: ``L = ceil(d / C)`` data pages plus, for every
    level ``l >= 1`` with ``L > C**(l-1)``, ``ceil(L / C**l)`` index pages (the reference)."""
    s = page_size.bit_length() - 1
    leaves = (degree + page_size - 1) >> s
    shifts = s * torch.arange(1, 62 // s + 1, device=degree.device, dtype=torch.int64)
    per_level = (leaves[..., None] + (1 << shifts) - 1) >> shifts
    needed = leaves[..., None] > (1 << (shifts - s))
    return leaves + (per_level * needed).sum(-1)


def check_invariants(dg: DynamicGraph):
    """Pages in use are exactly the trees of the current degrees; free pages are unowned."""
    deg = dg.degree.cpu()
    owner = dg.page_owner.cpu()
    head, tail, fresh = dg.meta.tolist()
    used = int(tree_pages(deg, dg.page_size).sum())
    assert int((owner >= 0).sum()) == used
    assert fresh - (tail - head) == used
    ring = dg.page_ring.cpu()
    queued = ring[(head + torch.arange(tail - head)) % dg.num_pages].long()
    assert bool((owner[queued] == -1).all())
    assert queued.unique().numel() == queued.numel()
    assert bool((queued < fresh).all())
    assert bool((owner[fresh:] == -1).all())
    data = dg.page_rank.cpu() >= 0
    per_vertex = torch.bincount(owner[data].long(), minlength=deg.numel())
    assert per_vertex.tolist() == ((deg + dg.page_size - 1) // dg.page_size).tolist()


# --- graphs ------------------------------------------------------------------------------------


def random_csr(rng, n=60, m=400, *, symmetrize=False, weights=None, index_dtype=torch.int32, duplicates=True):
    src = rng.integers(0, n, m)
    dst = rng.integers(0, n, m)
    # a hub, so that some lists need index pages
    hub = rng.integers(0, n, m // 3)
    src = np.concatenate([src, np.full(m // 3, 7)])
    dst = np.concatenate([dst, hub])
    w = None
    if weights == "float":
        w = torch.from_numpy(rng.uniform(0.5, 4.0, len(src)).astype(np.float32))
    elif weights == "int":
        w = torch.from_numpy(rng.integers(1, 100, len(src)).astype(np.int32))
    return CSRGraph.from_coo(src, dst, n, w, symmetrize=symmetrize, drop_duplicates=not duplicates,
                             index_dtype=index_dtype)


def random_batch(rng, model: Model, size, dead_ok=False):
    live = [v for v, a in enumerate(model.alive) if a]
    src = rng.choice(live, size)
    dst = rng.choice(live, size)
    return src, dst


def existing_edges(rng, model: Model, size):
    pairs = [(v, e[0]) for v, lst in enumerate(model.lists) for e in lst]
    if not pairs:
        return [], []
    pick = rng.choice(len(pairs), min(size, len(pairs)), replace=False)
    return [pairs[i][0] for i in pick], [pairs[i][1] for i in pick]


def run_script(rng, graph, placement, page_size, steps, device=None, others=()):
    """Random batches applied to a DynamicGraph and the model (and to `others`, graphs on other
    devices, whose whole state must stay identical); checks after every batch."""
    dg = DynamicGraph.from_csr(graph, placement=placement, device=device, page_size=page_size, headroom=0.1)
    model = Model(graph)
    assert_matches(dg, model)
    for _step in range(steps):
        kind = rng.choice(["ins", "ins", "del", "del_existing", "vins", "vdel"])
        args = ()
        if kind == "ins":
            src, dst = random_batch(rng, model, int(rng.integers(1, 80)))
            src = np.concatenate([src, src[:5]])  # duplicates within the batch
            dst = np.concatenate([dst, dst[:5]])
            w = None
            if model.weighted:
                w = rng.uniform(0.5, 4.0, len(src)).astype(np.float32) if graph.weights.dtype == torch.float32 \
                    else rng.integers(1, 100, len(src)).astype(np.int32)
            got = dg.insert_edges(torch.from_numpy(src), torch.from_numpy(dst),
                                  None if w is None else torch.from_numpy(w))
            assert got == model.insert_edges(src.tolist(), dst.tolist(), None if w is None else w.tolist())
            args = ("insert_edges", torch.from_numpy(src), torch.from_numpy(dst),
                    None if w is None else torch.from_numpy(w))
        elif kind in ("del", "del_existing"):
            if kind == "del":
                src, dst = random_batch(rng, model, int(rng.integers(1, 60)))
                src, dst = src.tolist(), dst.tolist()
            else:
                src, dst = existing_edges(rng, model, int(rng.integers(1, 120)))
            got = dg.delete_edges(torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64))
            assert got == model.delete_edges(src, dst)
            args = ("delete_edges", torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64))
        elif kind == "vins":
            n = int(rng.integers(0, 6))
            got = dg.insert_vertices(n).cpu().tolist()
            assert got == model.insert_vertices(n)
            args = ("insert_vertices", n)
        else:
            live = [v for v, a in enumerate(model.alive) if a]
            if len(live) < 5:
                continue
            ids = rng.choice(live, int(rng.integers(1, 4)))
            got = dg.delete_vertices(torch.from_numpy(ids))
            assert got == model.delete_vertices(ids.tolist())
            args = ("delete_vertices", torch.from_numpy(ids))
        assert_matches(dg, model)
        for other in others:
            getattr(other, args[0])(*args[1:])
            assert_same_state(dg, other)
    return dg, model


STATE = ("pool", "weights", "root", "height", "degree", "alive", "page_owner", "page_rank", "page_ring",
         "vertex_ring", "meta")


def state_of(dg: DynamicGraph):
    if torch.cuda.is_initialized():
        # A unified pool's .cpu() is the host memory itself, read without waiting for the
        # stream: let the last batch's kernels finish first.
        torch.cuda.synchronize()
    out = {}
    for name in STATE:
        t = getattr(dg, name)
        out[name] = None if t is None else t.cpu().clone()
    out["counters"] = (dg.num_nodes, dg._vertex_head, dg._vertex_tail, dg.num_pages)
    return out


def assert_same_state(a: DynamicGraph, b: DynamicGraph):
    sa, sb = state_of(a), state_of(b)
    for name in sa:
        if sa[name] is None or isinstance(sa[name], tuple):
            assert sa[name] == sb[name], name
        else:
            assert torch.equal(sa[name], sb[name]), name


# --- construction and updates ------------------------------------------------------------------


@pytest.mark.parametrize("page_size", [4, 32])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("weights", [None, "float", "int"])
def test_roundtrip_keeps_rows_in_order(seed, page_size, index_dtype, weights):
    rng = np.random.default_rng(seed)
    g = random_csr(rng, weights=weights, index_dtype=index_dtype)
    dg = DynamicGraph.from_csr(g, page_size=page_size)
    snap, slots = dg.to_csr(return_slots=True)
    assert torch.equal(snap.indptr, g.indptr) and torch.equal(snap.indices, g.indices)
    assert snap.indices.dtype == index_dtype
    if weights:
        assert torch.equal(snap.weights, g.weights)
        assert torch.equal(dg.weights[slots], g.weights)
    assert torch.equal(dg.pool[slots].to(index_dtype), g.indices)
    assert dg.num_edges == g.num_edges and dg.num_nodes == g.num_nodes
    check_invariants(dg)


def test_empty_and_edgeless_graphs():
    for n in (0, 1, 5):
        g = CSRGraph.from_csr(torch.zeros(n + 1, dtype=torch.int64), torch.zeros(0, dtype=torch.int32))
        dg = DynamicGraph.from_csr(g, page_size=4)
        assert dg.num_edges == 0 and dg.to_csr().num_nodes == n
        if n:
            assert dg.insert_edges([0], [n - 1]) == 1
            assert dg.to_csr().indices.tolist() == [n - 1]


@pytest.mark.parametrize("placement", ["cpu", "unified"])
@pytest.mark.parametrize("page_size,symmetrize,weights", [(4, False, None), (4, True, "float"), (8, False, "int"),
                                                          (32, True, None)])
def test_random_batches_match_model(seed, placement, page_size, symmetrize, weights):
    rng = np.random.default_rng(seed)
    g = random_csr(rng, symmetrize=symmetrize, weights=weights)
    run_script(rng, g, placement, page_size, steps=25)


def test_duplicates_ignored_first_weight_wins():
    g = CSRGraph.from_coo([0, 0], [1, 2], 4, torch.tensor([1.0, 2.0]))
    dg = DynamicGraph.from_csr(g, page_size=4)
    assert dg.insert_edges([0, 3, 0, 3, 0], [3, 1, 1, 1, 3], torch.tensor([5.0, 6.0, 7.0, 8.0, 9.0])) == 2
    snap = dg.to_csr()
    assert snap.indices.tolist() == [1, 2, 3, 1]
    assert snap.weights.tolist() == [1.0, 2.0, 5.0, 6.0]  # existing weight kept, first in batch wins


def test_insert_appends_in_ascending_destination_order():
    g = CSRGraph.from_coo([0], [5], 8)
    dg = DynamicGraph.from_csr(g, page_size=4)
    dg.insert_edges([0, 0, 0, 0], [3, 7, 1, 6])
    assert dg.to_csr().indices.tolist() == [5, 1, 3, 6, 7]


def test_delete_moves_tail_into_holes():
    row = list(range(10, 20))
    g = CSRGraph.from_csr(torch.tensor([0, 10] + [10] * 19, dtype=torch.int64), torch.tensor(row, dtype=torch.int32))
    dg = DynamicGraph.from_csr(g, page_size=4)
    # delete positions 1, 4, 8 (ids 11, 14, 18): d' = 7; holes below 7: 1, 4; survivors at 7, 9
    assert dg.delete_edges([0, 0, 0], [11, 14, 18]) == 3
    assert dg.to_csr().indices[:7].tolist() == [10, 17, 12, 13, 19, 15, 16]


def test_delete_removes_every_parallel_copy():
    g = CSRGraph.from_coo([0, 0, 0, 1], [2, 2, 3, 2], 4)
    dg = DynamicGraph.from_csr(g, page_size=4)
    assert dg.delete_edges([0], [2]) == 2
    assert dg.to_csr().indices.tolist() == [3, 2]
    assert dg.delete_edges([0], [1]) == 0


def test_symmetric_updates_both_directions():
    g = CSRGraph.from_coo([0], [1], 4, symmetrize=True)
    dg = DynamicGraph.from_csr(g, page_size=4)
    assert dg.symmetric
    assert dg.insert_edges([2], [3]) == 2
    assert dg.has_edges([3, 2, 0], [2, 3, 3]).tolist() == [True, True, False]
    assert dg.delete_edges([1], [0]) == 2
    assert dg.num_edges == 2
    directed = DynamicGraph.from_csr(g, page_size=4, symmetric=False)
    assert directed.insert_edges([2], [3]) == 1


def test_vertex_deletion_removes_in_edges_and_ids_are_reused():
    g = CSRGraph.from_coo([0, 1, 2, 3, 3], [1, 2, 0, 1, 0], 4)
    dg = DynamicGraph.from_csr(g, page_size=4)
    assert dg.delete_vertices([1, 1]) == 3  # 1->2, 0->1, 3->1
    snap = dg.to_csr()
    assert snap.indptr.tolist() == [0, 0, 0, 1, 2]
    assert snap.indices.tolist() == [0, 0]
    assert dg.is_alive().tolist() == [True, False, True, True]
    with pytest.raises(ValueError, match="deleted vertex"):
        dg.insert_edges([0], [1])
    dg.delete_vertices([3])
    assert dg.insert_vertices(3).tolist() == [1, 3, 4]
    assert dg.num_nodes == 5 and dg.to_csr().num_nodes == 5
    assert dg.insert_edges([4], [1]) == 1


def test_pool_grows_and_keeps_contents(seed):
    rng = np.random.default_rng(seed)
    g = random_csr(rng, n=30, m=60)
    dg = DynamicGraph.from_csr(g, page_size=4, headroom=0.0)
    model = Model(g)
    pages = dg.num_pages
    for _ in range(5):
        src, dst = random_batch(rng, model, 200)
        dg.insert_edges(src, dst)
        model.insert_edges(src.tolist(), dst.tolist())
    assert dg.num_pages > pages
    assert_matches(dg, model)
    grown = dg.num_pages
    dg.reserve_pages(grown + 100)
    assert dg.num_pages == grown + 100
    assert_matches(dg, model)


def test_freed_pages_are_reused(seed):
    rng = np.random.default_rng(seed)
    g = random_csr(rng, n=40, m=100)
    dg = DynamicGraph.from_csr(g, page_size=4, headroom=0.0)
    before = dg.memory()
    pages = None
    src = torch.from_numpy(rng.integers(0, 40, 300))
    dst = torch.from_numpy(rng.integers(0, 40, 300))
    new = ~dg.has_edges(src, dst)
    for _ in range(10):
        dg.insert_edges(src, dst)
        dg.delete_edges(src[new], dst[new])
        # the same degrees as before the round: the same pages in use, none leaked
        assert dg.memory().used_pool_bytes == before.used_pool_bytes
        pages = pages or dg.num_pages
        assert dg.num_pages == pages  # after the first round, freed pages serve every insertion
    check_invariants(dg)
    assert csr_bytes(g) == g.indptr.numel() * 8 + g.num_edges * 4


# --- bad input: clear errors, graph unchanged ---------------------------------------------------


def test_bad_batches_raise_and_leave_graph_unchanged(seed):
    rng = np.random.default_rng(seed)
    g = random_csr(rng, n=20, m=60, weights="float")
    dg = DynamicGraph.from_csr(g, page_size=4, headroom=0.0, grow=False)
    dg.delete_vertices([3])
    before = state_of(dg)
    live = torch.tensor([v for v in range(20) if v != 3])
    w2 = torch.ones(2)
    cases = [
        (IndexError, "src\\[1\\] = 20 is out of range", lambda: dg.insert_edges([0, 20], [1, 2], w2)),
        (IndexError, "dst\\[0\\] = -1 is out of range", lambda: dg.delete_edges([0], [-1])),
        (ValueError, "dst\\[1\\] = 3 is a deleted vertex", lambda: dg.insert_edges([0, 1], [1, 3], w2)),
        (ValueError, "same length", lambda: dg.insert_edges([0, 1], [1], w2)),
        (ValueError, "one weight per edge", lambda: dg.insert_edges([0], [1])),
        (ValueError, "one entry per edge", lambda: dg.insert_edges([0], [1], torch.ones(3))),
        (TypeError, "int32 or int64", lambda: dg.insert_edges(torch.tensor([0.0]), [1], torch.ones(1))),
        (ValueError, "1-D", lambda: dg.insert_edges(torch.zeros(2, 2, dtype=torch.long), [1], torch.ones(1))),
        (ValueError, "ids\\[0\\] = 3 is a deleted vertex", lambda: dg.delete_vertices([3])),
        (IndexError, "out of range", lambda: dg.delete_vertices([0, 99])),
        (ValueError, "count must be", lambda: dg.insert_vertices(-1)),
        (PoolFullError, "pool is full", lambda: dg.insert_edges(live.repeat_interleave(19), live.repeat(19),
                                                                torch.ones(361))),
    ]
    for exc, match, call in cases:
        with pytest.raises(exc, match=match):
            call()
        assert_same_state(dg, _with_state(before))


class _with_state:
    def __init__(self, st):
        self.st = st
        for name in STATE:
            setattr(self, name, st[name])
        self.num_nodes, self._vertex_head, self._vertex_tail, self.num_pages = st["counters"]


def _state_args(dg):
    return [dg.pool, dg.weights, dg.root, dg.height, dg.degree, dg.page_owner, dg.page_rank, dg.page_ring, dg.meta]


def _clear_args(dg):
    return [dg.pool, dg.root, dg.height, dg.degree, dg.page_owner, dg.page_rank, dg.page_ring, dg.meta]


def test_raw_ops_check_batch_contents(seed):
    rng = np.random.default_rng(seed)
    g = random_csr(rng, n=20, m=60)
    dg = DynamicGraph.from_csr(g, page_size=4, headroom=0.0)
    before = state_of(dg)
    ops = torch.ops.zerocopy
    L = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    append = lambda v, o, d: ops.dynamic_graph_append(*_state_args(dg), L(v), L(o), L(d), None, 4)  # noqa: E731
    remove = lambda v, o, p: ops.dynamic_graph_remove(*_state_args(dg), L(v), L(o), L(p), 4)  # noqa: E731
    clear = lambda v: ops.dynamic_graph_clear(*_clear_args(dg), L(v), 4)  # noqa: E731
    deg0 = int(dg.degree[0])
    v2 = int(torch.nonzero(dg.degree.cpu() >= 2)[0])  # a vertex with positions 0 and 1
    cases = [
        (IndexError, "vertices\\[1\\] = 20 is out of range", lambda: append([0, 20], [0, 1, 2], [1, 1])),
        (ValueError, "strictly ascending", lambda: append([2, 1], [0, 1, 2], [1, 1])),
        (ValueError, "run_offsets must start at 0", lambda: append([1, 2], [0, 2, 1], [1, 1])),
        (ValueError, "run_offsets must start at 0", lambda: append([1], [0, 3], [1, 1])),
        (IndexError, "run_dst\\[1\\] = 25 is out of range", lambda: append([1], [0, 2], [1, 25])),
        (IndexError, "positions\\[1\\] = 0 is not a position", lambda: remove([v2], [0, 2], [1, 0])),
        (IndexError, "is not a position", lambda: remove([0], [0, 1], [deg0])),
        (ValueError, "strictly ascending", lambda: clear([4, 4])),
        (IndexError, "vertices\\[1\\] = 20 is out of range", lambda: clear([0, 20])),
        (ValueError, "page_size must be a power of two", lambda: ops.dynamic_graph_clear(*_clear_args(dg), L([1]), 6)),
        (ValueError, "page_size must be a power of two", lambda: ops.dynamic_graph_append(
            *_state_args(dg), L([1]), L([0, 1]), L([1]), None, 6)),
        (TypeError, "height must be Char", lambda: ops.dynamic_graph_contains(
            dg.pool, dg.root, dg.degree, dg.degree, L([1]), L([0, 1]), L([1]), 4)),
    ]
    for exc, match, call in cases:
        with pytest.raises(exc, match=match):
            call()
        assert_same_state(dg, _with_state(before))
    with pytest.raises(RuntimeError, match="pool is full"):
        append(list(range(20)), [0] + [200 * (i + 1) for i in range(20)], [1] * 4000)
    assert_same_state(dg, _with_state(before))


def _marked_reference(dg, vertices, mask):
    """find_marked by the snapshot: per vertex, the positions of marked ids (all when the vertex is marked)."""
    snap = dg.to_csr()
    offsets, positions = [0], []
    for v in vertices:
        row = snap.indices[snap.indptr[v]:snap.indptr[v + 1]].tolist()
        positions += [p for p, x in enumerate(row) if mask[v] or mask[x]]
        offsets.append(len(positions))
    return offsets, positions


@pytest.mark.parametrize("placement", ["cpu", "unified", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("page_size", [4, 8])
def test_find_marked_matches_snapshot(seed, placement, page_size):
    rng = np.random.default_rng(seed)
    dg = updated_graph(rng, placement=placement, page_size=page_size)
    n = dg.root.numel()
    mask = torch.from_numpy(rng.random(n) < 0.2).to(dg.device)
    mask[7] = bool(rng.integers(0, 2))  # the hub's list, whole or searched
    vertices = torch.from_numpy(np.sort(rng.choice(dg.num_nodes, 30, replace=False))).to(dg.device)
    vertices = torch.cat([vertices, torch.tensor([7], device=dg.device)]).unique()
    pos_offsets, positions = torch.ops.zerocopy.dynamic_graph_find_marked(
        dg.pool, dg.root, dg.height, dg.degree, vertices, mask, dg.page_size)
    want_offsets, want_positions = _marked_reference(dg, vertices.tolist(), mask.cpu().tolist())
    assert pos_offsets.tolist() == want_offsets
    assert positions.tolist() == want_positions
    assert positions.numel() > 0


@pytest.mark.parametrize("placement", ["cpu", pytest.param("cuda", marks=cuda)])
def test_find_marked_with_a_coarse_mask(seed, placement):
    """Over ~1.6 M vertex ids a bit of the mask kernel's coarse mask (shared memory) covers
    several ids, so set bits are confirmed in the mask itself: the same positions as the
    reference, for marked ids and for unmarked ids that share a bit with one."""
    rng = np.random.default_rng(seed)
    n = 3_000_000
    dg = DynamicGraph.from_csr(random_csr(rng, n=n, m=30000), placement=placement, page_size=8)
    mask = torch.from_numpy(rng.random(n) < 0.002)
    snap = dg.to_csr()
    indptr, ids = snap.indptr.cpu(), snap.indices.cpu().long()
    mask[ids[torch.from_numpy(rng.random(ids.numel()) < 0.3)]] = True  # hits in the lists read
    partner = (ids ^ 1).clamp(max=n - 1)  # shares a coarse bit with the listed id (shift 1 here)
    mask[partner[torch.from_numpy(rng.random(ids.numel()) < 0.3)]] = True
    assert bool((~mask[ids] & mask[partner]).any())  # unmarked entries under a set bit
    with_edges = torch.nonzero(indptr[1:] > indptr[:-1]).flatten()
    pick = torch.from_numpy(np.sort(rng.choice(with_edges.numel(), 400, replace=False)))
    vertices = torch.cat([with_edges[pick], torch.tensor([7])]).unique()
    pos_offsets, positions = torch.ops.zerocopy.dynamic_graph_find_marked(
        dg.pool, dg.root, dg.height, dg.degree, vertices.to(dg.device), mask.to(dg.device), dg.page_size)
    want_offsets, want_positions = _marked_reference(dg, vertices.tolist(), mask.tolist())
    assert pos_offsets.tolist() == want_offsets
    assert positions.tolist() == want_positions
    assert positions.numel() > 0


@pytest.mark.parametrize("placement", ["cpu", "unified", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("page_size", [4, 32])
def test_clear_is_removing_every_entry(seed, placement, page_size):
    """dynamic_graph_clear leaves the state that removing every position of the lists leaves:
    the same pages freed in the same order, the lists empty."""
    a = updated_graph(np.random.default_rng(seed), placement=placement, page_size=page_size)
    b = updated_graph(np.random.default_rng(seed), placement=placement, page_size=page_size)
    rng = np.random.default_rng(seed + 1)
    empty = int(torch.nonzero(a.degree.cpu() == 0)[0])
    picked = np.sort(rng.choice(a.num_nodes, 20, replace=False)).tolist()
    vertices = torch.tensor(sorted(set(picked) | {7, empty}), device=a.device)
    degrees = a.degree[vertices].cpu()
    removed = torch.ops.zerocopy.dynamic_graph_clear(*_clear_args(a), vertices, page_size)
    assert removed.device.type == "cpu" and removed.dtype == torch.int64
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), degrees.cumsum(0)]).to(b.device)
    positions = torch.cat([torch.arange(int(d)) for d in degrees]).to(b.device)
    torch.ops.zerocopy.dynamic_graph_remove(*_state_args(b), vertices, offsets, positions, page_size)
    assert int(removed) == int(degrees.sum()) > 0
    assert a.degree[vertices].eq(0).all() and a.root[vertices].eq(-1).all()
    assert_same_state(a, b)
    check_invariants(a)
    assert int(torch.ops.zerocopy.dynamic_graph_clear(*_clear_args(a), vertices[:0], page_size)) == 0


@pytest.mark.parametrize("placement", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("page_size", [4, 32, 64])
def test_find_marked_over_long_and_short_lists(seed, placement, page_size):
    """Hubs whose lists span many level-1 nodes (several levels of index pages) beside one-page
    lists, some taken whole: the reference's positions, for every page size (64: two mask words
    a page)."""
    rng = np.random.default_rng(seed)
    n = 5000
    hubs = np.array([11, 12, 300, 4999])
    src = np.concatenate([rng.integers(0, n, 6000), np.repeat(hubs, [3000, 700, 4500, 65])])
    dst = rng.integers(0, n, src.size)
    dg = DynamicGraph.from_csr(CSRGraph.from_coo(src, dst, n), placement=placement, page_size=page_size)
    assert int(dg.height.max()) >= (2 if page_size == 4 else 1)
    mask = torch.from_numpy(rng.random(n) < 0.05)
    mask[12] = True  # a hub taken whole
    mask[11] = mask[300] = False
    with_edges = torch.nonzero(dg.degree.cpu() > 0).flatten()
    pick = torch.from_numpy(np.sort(rng.choice(with_edges.numel(), 700, replace=False)))
    vertices = torch.cat([with_edges[pick], torch.from_numpy(hubs)]).unique()
    pos_offsets, positions = torch.ops.zerocopy.dynamic_graph_find_marked(
        dg.pool, dg.root, dg.height, dg.degree, vertices.to(dg.device), mask.to(dg.device), page_size)
    want_offsets, want_positions = _marked_reference(dg, vertices.tolist(), mask.tolist())
    assert pos_offsets.tolist() == want_offsets
    assert positions.tolist() == want_positions


def test_find_marked_checks_vertices(seed):
    rng = np.random.default_rng(seed)
    dg = DynamicGraph.from_csr(random_csr(rng, n=20, m=60), page_size=4)
    mask = torch.zeros(dg.root.numel(), dtype=torch.bool)
    find = lambda v: torch.ops.zerocopy.dynamic_graph_find_marked(  # noqa: E731
        dg.pool, dg.root, dg.height, dg.degree, torch.tensor(v, dtype=torch.int64), mask, 4)
    with pytest.raises(ValueError, match="strictly ascending"):
        find([3, 3])
    with pytest.raises(IndexError, match="vertices\\[1\\] = 20 is out of range"):
        find([0, 20])
    with pytest.raises(ValueError, match="mask must have one entry per vertex id"):
        torch.ops.zerocopy.dynamic_graph_find_marked(dg.pool, dg.root, dg.height, dg.degree,
                                                     torch.tensor([1]), mask[:5], 4)


@pytest.mark.parametrize("placement", ["cpu", "unified", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("page_size", [4, 32])
def test_mark_neighbours_matches_snapshot(seed, placement, page_size):
    rng = np.random.default_rng(seed)
    dg = updated_graph(rng, placement=placement, page_size=page_size)
    dg.insert_edges(torch.full((70,), 7), torch.arange(70))  # a list of several pages
    vertices = torch.from_numpy(np.sort(rng.choice(dg.num_nodes, 25, replace=False))).to(dg.device)
    vertices = torch.cat([vertices, torch.tensor([7], device=dg.device)]).unique()
    marks = torch.ops.zerocopy.dynamic_graph_mark_neighbours(dg.pool, dg.root, dg.height, dg.degree, vertices,
                                                             dg.page_size)
    snap = dg.to_csr()
    want = torch.zeros(dg.root.numel(), dtype=torch.bool)
    for v in vertices.tolist():
        want[snap.indices[snap.indptr[v]:snap.indptr[v + 1]].long().cpu()] = True
    assert marks.dtype == torch.bool and marks.device == dg.device
    assert torch.equal(marks.cpu(), want)
    assert int(want.sum()) > 0
    empty = torch.ops.zerocopy.dynamic_graph_mark_neighbours(dg.pool, dg.root, dg.height, dg.degree,
                                                             vertices[:0], dg.page_size)
    assert not bool(empty.any()) and empty.numel() == dg.root.numel()


def test_mark_neighbours_checks_vertices(seed):
    rng = np.random.default_rng(seed)
    dg = DynamicGraph.from_csr(random_csr(rng, n=20, m=60), page_size=4)
    mark = lambda v, **kw: torch.ops.zerocopy.dynamic_graph_mark_neighbours(  # noqa: E731
        dg.pool, dg.root, dg.height, dg.degree, torch.tensor(v, **kw), 4)
    with pytest.raises(ValueError, match="strictly ascending"):
        mark([4, 2])
    with pytest.raises(IndexError, match="vertices\\[1\\] = 20 is out of range"):
        mark([0, 20])
    with pytest.raises(IndexError, match="vertices\\[0\\] = -1 is out of range"):
        mark([-1])
    with pytest.raises(TypeError, match="vertices"):
        mark([1, 2], dtype=torch.int32)


def _pages_needed_reference(degree, vertices, offsets, page_size):
    total = 0
    for r, v in enumerate(vertices):
        add = offsets[r + 1] - offsets[r]
        if 0 <= v < len(degree) and add >= 0:
            d = torch.tensor([degree[v], degree[v] + add])
            pages = tree_pages(d, page_size)
            total += int(pages[1] - pages[0])
    return total


@pytest.mark.parametrize("where", ["cpu", pytest.param("cuda", marks=cuda)])
@pytest.mark.parametrize("page_size", [4, 32])
def test_pages_needed_matches_tree_pages(seed, where, page_size):
    rng = np.random.default_rng(seed)
    n = 200
    degree = torch.from_numpy(rng.integers(0, 5000, n)).to(where)
    degree[:5] = 0
    vertices = torch.from_numpy(rng.integers(-3, n + 3, 60)).to(where)  # bad ids count 0
    counts = torch.from_numpy(rng.integers(-2, 3000, 60)).to(where)  # so do negative counts
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device=where), torch.cumsum(counts, 0)])
    got = torch.ops.zerocopy.dynamic_graph_pages_needed(degree, vertices, offsets, page_size)
    assert got.dim() == 0 and got.dtype == torch.int64 and got.device.type == where
    want = _pages_needed_reference(degree.tolist(), vertices.tolist(), offsets.tolist(), page_size)
    assert int(got) == want
    none = torch.ops.zerocopy.dynamic_graph_pages_needed(degree, vertices[:0], offsets[:1], page_size)
    assert int(none) == 0


def test_pages_needed_checks_arguments():
    degree, v = torch.zeros(10, dtype=torch.int64), torch.tensor([1, 2])
    need = torch.ops.zerocopy.dynamic_graph_pages_needed
    with pytest.raises(ValueError, match="one more entry than vertices"):
        need(degree, v, torch.tensor([0, 1]), 4)
    with pytest.raises(TypeError, match="degree"):
        need(degree.int(), v, torch.tensor([0, 1, 2]), 4)
    with pytest.raises(ValueError, match="page_size"):
        need(degree, v, torch.tensor([0, 1, 2]), 3)


def test_contains_marks_first_copy_of_repeated_destination(seed):
    rng = np.random.default_rng(seed)
    dg = DynamicGraph.from_csr(random_csr(rng, n=20, m=60), page_size=4)
    snap = dg.to_csr()
    v = int(torch.nonzero(snap.indptr[1:] - snap.indptr[:-1])[0])
    present = int(snap.indices[snap.indptr[v]])
    absent = next(x for x in range(20) if x not in snap.indices[snap.indptr[v]:snap.indptr[v + 1]].tolist())
    dst = sorted([present, present, present, absent, absent])
    found = torch.ops.zerocopy.dynamic_graph_contains(dg.pool, dg.root, dg.height, dg.degree, torch.tensor([v]),
                                                      torch.tensor([0, 5]), torch.tensor(dst), 4)
    first = dst.index(present)
    assert found.tolist() == [j == first for j in range(5)]


def test_opcheck(seed):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    rng = np.random.default_rng(seed)
    dg = DynamicGraph.from_csr(random_csr(rng, n=20, m=60), page_size=4)
    L = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    ops = torch.ops.zerocopy
    utils = ("test_schema", "test_faketensor")
    lists = (dg.pool, dg.root, dg.height, dg.degree)
    torch.library.opcheck(ops.dynamic_graph_contains.default, (*lists, L([1, 7]), L([0, 2, 3]), L([3, 5, 9]), 4),
                          test_utils=utils)
    torch.library.opcheck(ops.dynamic_graph_find.default, (*lists, L([1, 7]), L([0, 2, 3]), L([3, 5, 9]), 4),
                          test_utils=utils)
    torch.library.opcheck(ops.dynamic_graph_sample.default, (*lists, L([1, 7, 3]), 3, False, 5, 4), test_utils=utils)
    torch.library.opcheck(ops.dynamic_graph_to_csr.default,
                          (dg.pool, None, *lists[1:], dg.page_owner, dg.page_rank, dg.meta, 4, True),
                          test_utils=utils)
    torch.library.opcheck(ops.dynamic_graph_bfs.default,
                          (*lists, dg.page_owner, dg.page_rank, dg.meta, 0, True, 4), test_utils=utils)
    torch.library.opcheck(ops.dynamic_graph_find_touching.default,
                          (*lists, dg.page_owner, dg.page_rank, dg.meta, dg.alive & (dg.degree > 3), 4),
                          test_utils=utils)
    torch.library.opcheck(ops.dynamic_graph_find_marked.default,
                          (*lists, L([1, 7]), dg.alive & (dg.degree > 3), 4), test_utils=utils)
    torch.library.opcheck(ops.dynamic_graph_mark_neighbours.default, (*lists, L([1, 7]), 4), test_utils=utils)
    torch.library.opcheck(ops.dynamic_graph_pages_needed.default, (dg.degree, L([1, 7]), L([0, 2, 40]), 4),
                          test_utils=utils)
    torch.library.opcheck(ops.dynamic_graph_append.default,
                          (*_state_args(dg), L([1, 7]), L([0, 2, 3]), L([3, 5, 9]), None, 4), test_utils=utils)
    torch.library.opcheck(ops.dynamic_graph_remove.default,
                          (*_state_args(dg), L([7]), L([0, 2]), L([0, 2]), 4), test_utils=utils)
    torch.library.opcheck(ops.dynamic_graph_clear.default, (*_clear_args(dg), L([1, 7]), 4), test_utils=utils)


# --- reads: same results as on the snapshot -------------------------------------------------------


def updated_graph(rng, symmetrize=False, placement="cpu", device=None, page_size=4):
    g = random_csr(rng, n=80, m=600, symmetrize=symmetrize)
    dg = DynamicGraph.from_csr(g, placement=placement, device=device, page_size=page_size)
    for _ in range(3):
        src = torch.from_numpy(rng.integers(0, 80, 150))
        dst = torch.from_numpy(rng.integers(0, 80, 150))
        dg.insert_edges(src, dst)
        dg.delete_edges(src[:70], dst[:70])
    dg.delete_vertices([5, 9])
    dg.insert_vertices(3)
    return dg


def check_sample_matches(dg, seeds, fanout, replace, seed):
    snap, slots = dg.to_csr(return_slots=True)
    want = S.sample_neighbors(snap.indptr, snap.indices, seeds, fanout, replace=replace, seed=seed)
    got = dg.sample_neighbors(seeds, fanout, replace=replace, seed=seed)
    assert torch.equal(got.offsets, want.offsets)
    assert torch.equal(got.neighbors, want.neighbors)
    assert torch.equal(got.seed_index, want.seed_index)
    assert torch.equal(got.edge_pos, slots[want.edge_pos])


@pytest.mark.parametrize("placement", ["cpu", "unified"])
@pytest.mark.parametrize("fanout", [-1, 0, 3, 25])
@pytest.mark.parametrize("replace", [False, True])
def test_sampling_matches_snapshot(seed, placement, fanout, replace):
    rng = np.random.default_rng(seed)
    dg = updated_graph(rng, placement=placement)
    seeds = torch.from_numpy(rng.integers(0, dg.num_nodes, 50))
    check_sample_matches(dg, seeds, fanout, replace, seed)


@pytest.mark.parametrize("edge_dir,symmetrize", [("out", False), ("in", True), ("out", True)])
def test_sample_layers_matches_snapshot(seed, edge_dir, symmetrize):
    rng = np.random.default_rng(seed)
    dg = updated_graph(rng, symmetrize=symmetrize)
    snap, slots = dg.to_csr(return_slots=True)
    seeds = torch.from_numpy(rng.choice(dg.num_nodes, 12, replace=False))
    want = S.sample_layers(snap, seeds, [4, 3], edge_dir=edge_dir, seed=seed)
    got = dg.sample_layers(seeds, [4, 3], edge_dir=edge_dir, seed=seed)
    assert len(got) == len(want) == 2
    for a, b in zip(got, want):
        assert torch.equal(a.src, b.src) and torch.equal(a.dst, b.dst)
        assert torch.equal(a.srcdata["_ID"], b.srcdata["_ID"])
        assert (a.num_src, a.num_dst) == (b.num_src, b.num_dst)
        if edge_dir == "out":
            assert torch.equal(a.edata["_ID"], slots[b.edata["_ID"]])
    with pytest.raises(ValueError, match="probs"):
        dg.sample_layers(seeds, [2], edge_dir=edge_dir, probs=torch.ones(3))
    if not symmetrize:
        with pytest.raises(ValueError, match="out-neighbour lists only"):
            dg.sample_layers(seeds, [2])


def test_sampling_bad_seeds(seed):
    rng = np.random.default_rng(seed)
    dg = updated_graph(rng)
    assert dg.num_nodes == 81 and dg.insert_vertices(0).numel() == 0
    dg.delete_vertices([5])
    with pytest.raises(IndexError, match=f"seeds\\[1\\] = {dg.num_nodes} is out of range"):
        dg.sample_neighbors(torch.tensor([0, dg.num_nodes]), 3)
    with pytest.raises(ValueError, match="fanout"):
        dg.sample_neighbors(torch.tensor([0]), -2)
    out = dg.sample_neighbors(torch.tensor([5]), 3)  # a deleted vertex has no neighbours
    assert out.offsets.tolist() == [0, 0]
    check_sample_layers_bad_seeds(dg)


def check_sample_layers_bad_seeds(dg):
    """sample_layers refuses out-of-range and repeated seeds (checked by the op, once)."""
    with pytest.raises(IndexError, match=f"seeds\\[2\\] = {dg.num_nodes} is out of range"):
        dg.sample_layers(torch.tensor([0, 1, dg.num_nodes]), [3, 2], edge_dir="out")
    with pytest.raises(IndexError, match="seeds\\[0\\] = -1 is out of range"):
        dg.sample_layers(torch.tensor([-1]), [3], edge_dir="out")
    with pytest.raises(ValueError, match="seeds\\[2\\] = 1 repeats an earlier seed"):
        dg.sample_layers(torch.tensor([0, 1, 1]), [3, 2], edge_dir="out")
    with pytest.raises(ValueError, match="fanouts"):
        dg.sample_layers(torch.tensor([0]), [3, -2], edge_dir="out")
    with pytest.raises(ValueError, match="fanouts"):
        dg.sample_layers(torch.tensor([0]), [], edge_dir="out")
    blocks = dg.sample_layers(torch.tensor([5], device=dg.device), [3, -1], edge_dir="out")  # deleted: no edges
    assert [b.num_edges() for b in blocks] == [0, 0]


@pytest.mark.parametrize("placement", ["cpu", "unified"])
def test_bfs_matches_snapshot(seed, placement):
    rng = np.random.default_rng(seed)
    dg = updated_graph(rng, placement=placement, page_size=8)
    snap = dg.to_csr()
    ip, ix = snap.indptr.cpu(), snap.indices.cpu()
    for source in (0, 7, int(rng.integers(0, dg.num_nodes))):
        d1, p1, s1 = dg.bfs(source, predecessors=True, return_stats=True)
        d2, p2, s2 = bfs(snap, source, variant="aligned", predecessors=True, return_stats=True)
        assert torch.equal(d1, d2) and torch.equal(s1, s2)
        if dg.device.type == "cpu":
            assert torch.equal(p1, p2)
        else:  # the GPU keeps any parent one level up (bfs's contract), so check the tree
            depth, pred = d1.cpu(), p1.cpu()
            assert int(pred[source]) == source and bool((pred[depth < 0] == -1).all())
            for v in torch.nonzero(depth > 0).flatten().tolist():
                p = int(pred[v])
                assert int(depth[p]) == int(depth[v]) - 1 and v in ix[ip[p]:ip[p + 1]].tolist()
    with pytest.raises(IndexError, match="source"):
        dg.bfs(dg.num_nodes)


def test_kronecker_graph_roundtrip_and_sampling():
    g = kronecker_graph(10, 8, device="cpu")
    dg = DynamicGraph.from_csr(g, page_size=8, symmetric=False)
    snap = dg.to_csr()
    assert torch.equal(snap.indices, g.indices)
    assert int(dg.height.max()) >= 2  # hubs need two levels of index pages
    seeds = torch.arange(0, g.num_nodes, 7)
    check_sample_matches(dg, seeds, 10, False, 3)
    dg.insert_edges(torch.randint(0, 1024, (500,)), torch.randint(0, 1024, (500,)))
    check_sample_matches(dg, seeds, 10, False, 4)


# --- CUDA: identical state to the CPU's ---------------------------------------------------------


@cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
@pytest.mark.parametrize("page_size,symmetrize,weights,index_dtype",
                         [(4, False, None, torch.int32), (4, True, "float", torch.int64),
                          (32, False, "int", torch.int32)])
def test_cuda_updates_match_cpu_exactly(seed, placement, page_size, symmetrize, weights, index_dtype):
    rng = np.random.default_rng(seed)
    g = random_csr(rng, symmetrize=symmetrize, weights=weights, index_dtype=index_dtype)
    gpu = DynamicGraph.from_csr(g, placement=placement, page_size=page_size, headroom=0.1)
    assert gpu.device.type == "cuda"
    run_script(rng, g, "cpu", page_size, steps=30, others=[gpu])


@cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
@pytest.mark.parametrize("page_size", [4, 32])
def test_cuda_append_of_mixed_runs_matches_cpu(seed, placement, page_size):
    """One batch of runs of every length: single entries, a run filling many pages of a hub,
    runs that start mid-page; the pools, page tables and queues equal the CPU's."""
    rng = np.random.default_rng(seed)
    g = random_csr(rng, n=1000, m=3000)
    cpu = DynamicGraph.from_csr(g, page_size=page_size, headroom=0.1)
    gpu = DynamicGraph.from_csr(g, placement=placement, page_size=page_size, headroom=0.1)
    src = np.concatenate([rng.integers(0, 1000, 900), np.full(700, 11), np.repeat(rng.integers(0, 1000, 20), 9)])
    dst = rng.integers(0, 1000, src.size)
    for dg in (cpu, gpu):
        assert dg.insert_edges(torch.from_numpy(src), torch.from_numpy(dst)) > 700
    assert_same_state(gpu, cpu)


@cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
def test_cuda_reads_match_cpu(seed, placement):
    rng = np.random.default_rng(seed)
    cpu = updated_graph(np.random.default_rng(seed), page_size=4)
    gpu = updated_graph(np.random.default_rng(seed), placement=placement, page_size=4)
    assert_same_state(cpu, gpu)
    seeds = torch.from_numpy(rng.integers(0, cpu.num_nodes, 64))
    for fanout, replace in ((-1, False), (3, False), (30, False), (5, True)):
        a = cpu.sample_neighbors(seeds, fanout, replace=replace, seed=11)
        b = gpu.sample_neighbors(seeds, fanout, replace=replace, seed=11)
        for x, y in zip(a, b):
            assert torch.equal(x, y.cpu())
        check_sample_matches(gpu, seeds.cuda(), fanout, replace, 11)
    for source in (0, 7):
        assert torch.equal(cpu.bfs(source), gpu.bfs(source).cpu())
        depth, pred = gpu.bfs(source, predecessors=True)
        snap = gpu.to_csr()
        ip, ix = snap.indptr.cpu(), snap.indices.cpu()
        for v in torch.nonzero(depth.cpu() > 0).flatten().tolist():
            p = int(pred[v])
            assert int(depth[p]) == int(depth[v]) - 1 and v in ix[ip[p]:ip[p + 1]].tolist()
    for fanouts, replace in (([4, 3], False), ([-1, 2], False), ([3, 5], True)):
        layer_seeds = torch.from_numpy(rng.choice(cpu.num_nodes, 20, replace=False))
        a = cpu.sample_layers(layer_seeds, fanouts, edge_dir="out", replace=replace, seed=13)
        b = gpu.sample_layers(layer_seeds.cuda(), fanouts, edge_dir="out", replace=replace, seed=13)
        for x, y in zip(a, b):
            assert torch.equal(x.src, y.src.cpu()) and torch.equal(x.dst, y.dst.cpu())
            assert torch.equal(x.srcdata["_ID"], y.srcdata["_ID"].cpu())
            assert torch.equal(x.edata["_ID"], y.edata["_ID"].cpu())
    check_sample_layers_bad_seeds(gpu)
    sa, _ = cpu.to_csr(return_slots=True)
    sb, _ = gpu.to_csr(return_slots=True)
    assert torch.equal(sa.indices, sb.indices.cpu()) and torch.equal(sa.indptr, sb.indptr.cpu())
    q = (torch.from_numpy(rng.integers(0, cpu.num_nodes, 200)), torch.from_numpy(rng.integers(0, cpu.num_nodes, 200)))
    assert torch.equal(cpu.has_edges(*q), gpu.has_edges(*q).cpu())


@cuda
def test_cuda_bad_batches_leave_graph_unchanged(seed):
    rng = np.random.default_rng(seed)
    g = random_csr(rng, n=20, m=60)
    dg = DynamicGraph.from_csr(g, placement="cuda", page_size=4, headroom=0.0, grow=False)
    before = state_of(dg)
    L = lambda x: torch.tensor(x, dtype=torch.int64, device="cuda")  # noqa: E731
    ops = torch.ops.zerocopy
    with pytest.raises(IndexError, match="out of range"):
        dg.insert_edges([0, 20], [1, 2])
    with pytest.raises(PoolFullError):
        dg.insert_edges(torch.arange(20).repeat_interleave(19), torch.arange(20).repeat(19))
    with pytest.raises(ValueError, match="strictly ascending"):
        ops.dynamic_graph_append(*_state_args(dg), L([2, 1]), L([0, 1, 2]), L([1, 1]), None, 4)
    with pytest.raises(IndexError, match="run_dst\\[1\\] = 25"):
        ops.dynamic_graph_append(*_state_args(dg), L([1]), L([0, 2]), L([1, 25]), None, 4)
    with pytest.raises(IndexError, match="is not a position"):
        ops.dynamic_graph_remove(*_state_args(dg), L([0]), L([0, 2]), L([1, 0]), 4)
    with pytest.raises(RuntimeError, match="pool is full"):
        ops.dynamic_graph_append(*_state_args(dg), L(list(range(20))), L([0] + [200 * (i + 1) for i in range(20)]),
                                 L([1] * 4000), None, 4)
    torch.cuda.synchronize()
    assert_same_state(dg, _with_state(before))
    assert dg.insert_edges([0], [1]) in (0, 1)  # the context is still usable


def test_training_while_updates_arrive(seed):
    """GraphSAGE minibatches sampled from the DynamicGraph, with edge and vertex updates applied
    between minibatches: every sampled edge exists in the graph as it was when sampled."""
    from pytorch_zerocopy.dgl.nn import SAGEConv

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    dg = DynamicGraph.from_csr(random_csr(rng, n=200, m=1500, symmetrize=True), page_size=8)
    feats = torch.randn(400, 8)
    layers = torch.nn.ModuleList([SAGEConv(8, 16, activation=torch.relu), SAGEConv(16, 2)])
    opt = torch.optim.SGD(layers.parameters(), lr=0.1)
    for step in range(6):
        live = torch.nonzero(dg.is_alive()).flatten()
        seeds = live[torch.from_numpy(rng.choice(live.numel(), 16, replace=False))]
        blocks = dg.sample_layers(seeds, [5, 3], seed=step)
        for b in blocks:  # edge_dir='in' on a symmetric graph: dst's list holds src
            nodes = b.srcdata["_ID"]
            assert bool(dg.has_edges(nodes[b.dst], nodes[b.src]).all())
        h = feats[blocks[0].srcdata["_ID"]]
        for layer, b in zip(layers, blocks):
            h = layer(b, h)
        loss = torch.nn.functional.cross_entropy(h, seeds % 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert torch.isfinite(loss)
        # updates between minibatches
        src = torch.from_numpy(rng.integers(0, dg.num_nodes, 100))
        dst = torch.from_numpy(rng.integers(0, dg.num_nodes, 100))
        ok = dg.is_alive()[src] & dg.is_alive()[dst]
        dg.insert_edges(src[ok], dst[ok])
        dg.delete_edges(src[ok][:40], dst[ok][:40])
        new = dg.insert_vertices(2)
        dg.insert_edges(new, live[:2])
        dg.delete_vertices(live[-1:])
