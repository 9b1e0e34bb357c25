"""Neighbour sampling: one layer (sample_neighbors), compaction (compact) and the multi-layer op
(sample_layers) against a pure-Python reference of the kernels' contract (csrc/sampling.h);
CUDA against the CPU op, exactly; distributions and probabilities; the async form; the CUDA op's
host synchronisations; bad input at the op boundary. Placements of the graph: CPU, unified
(host memory mapped for the GPU; the CPU without one) and CUDA."""

import warnings

import pytest
import torch

import pytorch_zerocopy  # noqa: F401  (registers the unified device)
from pytorch_zerocopy import sampling as S
from pytorch_zerocopy._compat import has_opcheck
from pytorch_zerocopy.graph import CSRGraph
from pytorch_zerocopy.unified import gpu_backed


@pytest.fixture
def rng():
    """A fresh, randomly seeded generator per test; its seed is in the test's failure output."""
    return torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))


PLACEMENTS = [
    pytest.param("cpu", id="cpu"),
    pytest.param("unified", id="unified"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.cuda),
]


def random_csr(rng, num_nodes=300, max_deg=40, index_dtype=torch.int64):
    """A random CSR graph with zero-degree nodes, low and high degrees (no self-loop rule)."""
    deg = torch.randint(0, max_deg + 1, (num_nodes,), generator=rng)
    deg[torch.randperm(num_nodes, generator=rng)[: num_nodes // 10]] = 0
    deg[torch.randperm(num_nodes, generator=rng)[:3]] = max_deg * 5
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    indptr[1:] = deg.cumsum(0)
    indices = torch.randint(0, num_nodes, (int(indptr[-1]),), generator=rng).to(index_dtype)
    return indptr, indices


def place(t, placement):
    if t is None:
        return None
    if placement == "unified":
        return t.clone().to("unified")
    return t.to(placement)


def poison_allocator(device, nbytes=1 << 24):
    """Leaves freed blocks full of a recognisable garbage value in the allocator's cache, so an
    output element a kernel never writes shows up as -7777777 (or its bytes) in the result."""
    blocks = [torch.full((n,), -7777777, dtype=torch.int64, device=device) for n in (64, 4096, nbytes // 8)]
    del blocks


# ---------------------------------------------------------------------------------------------
# The reference: the kernels' contract in plain Python.

MASK64 = (1 << 64) - 1
REPLACE_STREAM = 1 << 40


def mix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def draw(seed, node, k):
    return mix64((mix64((seed ^ mix64(node)) & MASK64) + k) & MASK64)


def below(r, n):
    return (r * n) >> 64


def layer_seed(seed, layer):
    seed &= MASK64
    return seed if layer == 0 else mix64(seed ^ mix64(layer))


def ref_positions(seed, v, deg, fanout, replace):
    """List positions (relative) that uniform sampling picks for node v, in draw order."""
    if fanout == -1 or (not replace and deg <= fanout):
        return list(range(deg))
    if replace:
        return [below(draw(seed, v, REPLACE_STREAM + k), deg) for k in range(fanout)] if deg else []
    chosen = []
    for k in range(fanout):  # Floyd's algorithm
        j = deg - fanout + k
        t = below(draw(seed, v, k), j + 1)
        chosen.append(j if t in chosen else t)
    return chosen


def ref_sample_layers(indptr, indices, seeds, fanouts_applied, replace, seed, eids=None):
    """Per layer (seeds' layer first): nodes, src, dst, edge ids, as lists."""
    indptr, indices = indptr.tolist(), indices.tolist()
    eids = None if eids is None else eids.tolist()
    layers, cur = [], list(seeds.tolist())
    for layer, fanout in enumerate(fanouts_applied):
        s = layer_seed(seed, layer)
        nbrs, pos, dst = [], [], []
        for i, v in enumerate(cur):
            start, end = indptr[v], indptr[v + 1]
            for r in ref_positions(s, v, end - start, fanout, replace):
                pos.append(start + r)
                nbrs.append(indices[start + r])
                dst.append(i)
        local = {v: i for i, v in enumerate(cur)}
        nodes = list(cur)
        src = []
        for u in nbrs:
            if u not in local:
                local[u] = len(nodes)
                nodes.append(u)
            src.append(local[u])
        layers.append((nodes, src, dst, pos if eids is None else [eids[p] for p in pos]))
        cur = nodes
    return layers


def ref_compact(seeds, neighbors):
    local, nodes = {}, []
    for u in seeds.tolist() + neighbors.tolist():
        if u not in local:
            local[u] = len(nodes)
            nodes.append(u)
    return nodes, [local[u] for u in neighbors.tolist()]


def op_layers(indptr, indices, seeds, fanouts_applied, replace=False, probs=None, eids=None, seed=0):
    return torch.ops.zerocopy.sample_layers.default(indptr, indices, seeds, fanouts_applied, replace, probs, eids,
                                                    seed)


def as_lists(layers):
    nodes, src, dst, eids = layers
    return [tuple(t.cpu().tolist() for t in (n, s, d, e)) for n, s, d, e in zip(nodes, src, dst, eids)]


def assert_same_layers(a, b):
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            assert u.dtype == v.dtype == torch.int64
            assert torch.equal(u.cpu(), v.cpu())


# ---------------------------------------------------------------------------------------------
# One layer.


def check_sample(indptr, indices, seeds, out, fanout, replace, probs=None):
    """Every sampled (seed, neighbour, position) exists; counts follow the contract."""
    offsets, nbrs, pos, seed_index = (t.cpu() for t in out)
    indptr, indices, seeds = indptr.cpu(), indices.cpu(), seeds.cpu()
    assert offsets.dtype == torch.int64 and pos.dtype == torch.int64
    assert torch.equal(seed_index, torch.repeat_interleave(torch.arange(seeds.numel()), offsets.diff()))
    assert nbrs.dtype == indices.dtype
    assert offsets.numel() == seeds.numel() + 1 and int(offsets[0]) == 0
    assert int(offsets[-1]) == nbrs.numel() == pos.numel()
    for i, v in enumerate(seeds.tolist()):
        start, end = int(indptr[v]), int(indptr[v + 1])
        deg = end - start
        p = pos[offsets[i]: offsets[i + 1]]
        allowed = torch.arange(start, end)
        if probs is not None:
            allowed = allowed[probs.cpu()[start:end] > 0]
        positive = allowed.numel()
        if fanout == -1:
            want = positive
        elif replace:
            want = fanout if positive > 0 else 0
        else:
            want = min(fanout, positive)
        assert p.numel() == want, (v, deg, fanout, replace)
        assert bool(((p >= start) & (p < end)).all())
        assert torch.equal(nbrs[offsets[i]: offsets[i + 1]], indices[p])
        assert bool(torch.isin(p, allowed).all()), "sampled an edge with probability 0"
        if not replace or fanout == -1:
            assert p.unique().numel() == p.numel(), "duplicate edge without replacement"
        if fanout == -1 or (not replace and positive <= fanout and probs is None):
            assert torch.equal(p, allowed), "all neighbours must come in list order"


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout", [0, 1, 5, 17, -1])
def test_sampled_edges_exist_and_counts(rng, placement, index_dtype, replace, fanout):
    indptr, indices = random_csr(rng, index_dtype=index_dtype)
    seeds = torch.randperm(indptr.numel() - 1, generator=rng)[:150].to(torch.int32)
    out = S.sample_neighbors(place(indptr, placement), place(indices, placement), seeds, fanout,
                             replace=replace, seed=rng.initial_seed())
    check_sample(indptr, indices, seeds, out, fanout, replace)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout", [3, 17, -1])
def test_sample_neighbors_matches_reference(rng, placement, replace, fanout):
    indptr, indices = random_csr(rng, num_nodes=200)
    seeds = torch.randperm(200, generator=rng)[:60]
    seed = int(torch.randint(-2**63, 2**63 - 1, (), generator=rng))
    out = S.sample_neighbors(place(indptr, placement), place(indices, placement), seeds, fanout,
                             replace=replace, seed=seed)
    want = []
    for v in seeds.tolist():
        start, end = int(indptr[v]), int(indptr[v + 1])
        want += [start + r for r in ref_positions(seed & MASK64, v, end - start, fanout, replace)]
    assert out.edge_pos.cpu().tolist() == want


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout", [1, 3, 50, -1])
def test_weighted_edges_exist_and_skip_zero_probability(rng, placement, replace, fanout):
    indptr, indices = random_csr(rng)
    probs = torch.rand(indices.numel(), generator=rng) + 0.05
    probs[torch.rand(indices.numel(), generator=rng) < 0.4] = 0.0
    seeds = torch.randperm(indptr.numel() - 1, generator=rng)[:120]
    out = S.sample_neighbors(place(indptr, placement), place(indices, placement), seeds, fanout,
                             replace=replace, probs=place(probs, placement), seed=rng.initial_seed())
    check_sample(indptr, indices, seeds, out, fanout, replace, probs)


def many_copies(deg, copies):
    """`copies` nodes, each with the neighbour list 0..deg-1 (positions map to neighbours)."""
    indptr = torch.arange(copies + 1, dtype=torch.int64) * deg
    indices = torch.arange(deg).repeat(copies)
    return indptr, indices


def chi_square(counts, expected):
    return float(((counts - expected) ** 2 / expected).sum())


# Critical values of chi-square at p = 1e-4 (df 3, 9): the seeds are fixed, so these tests
# are deterministic; a biased sampler exceeds them by orders of magnitude.
CHI2_DF3 = 21.1
CHI2_DF9 = 33.7


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_uniform_without_replacement_is_uniform(placement):
    indptr, indices = many_copies(10, 4000)
    seeds = torch.arange(4000)
    out = S.sample_neighbors(place(indptr, placement), place(indices, placement), seeds, 3, seed=11)
    nbrs = out.neighbors.cpu()
    assert nbrs.numel() == 12000
    counts = torch.bincount(nbrs, minlength=10).double()
    assert chi_square(counts, torch.full((10,), 1200.0, dtype=torch.double)) < CHI2_DF9


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("replace", [False, True])
def test_weighted_frequencies_follow_probabilities(placement, replace):
    # Star-like lists: neighbour k has weight w[k]; weight 0 is never drawn.
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0])
    copies = 6000
    indptr, indices = many_copies(5, copies)
    probs = w.repeat(copies)
    out = S.sample_neighbors(place(indptr, placement), place(indices, placement), torch.arange(copies),
                             1, replace=replace, probs=place(probs, placement), seed=3)
    counts = torch.bincount(out.neighbors.cpu(), minlength=5).double()
    assert counts[4] == 0
    expected = w[:4].double() / w.sum() * copies
    assert chi_square(counts[:4], expected) < CHI2_DF3


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_weighted_without_replacement_prefers_heavy_edges(placement):
    # Two picks out of {heavy, light x 4}: the heavy edge (weight 40 of 44) is almost always in.
    copies = 3000
    indptr, indices = many_copies(5, copies)
    probs = torch.tensor([1.0, 1.0, 40.0, 1.0, 1.0]).repeat(copies)
    out = S.sample_neighbors(place(indptr, placement), place(indices, placement), torch.arange(copies),
                             2, probs=place(probs, placement), seed=8)
    nbrs = out.neighbors.cpu().view(copies, 2)
    assert bool((nbrs[:, 0] != nbrs[:, 1]).all())
    heavy_share = float((nbrs == 2).any(1).double().mean())
    assert heavy_share > 0.97


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("replace", [False, True])
def test_reproducible_with_seed_and_independent_of_threads(rng, placement, replace):
    indptr, indices = random_csr(rng)
    seeds = torch.randperm(indptr.numel() - 1, generator=rng)[:200]
    args = (place(indptr, placement), place(indices, placement), seeds, 4)
    a = S.sample_neighbors(*args, replace=replace, seed=123)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        b = S.sample_neighbors(*args, replace=replace, seed=123)
    finally:
        torch.set_num_threads(threads)
    c = S.sample_neighbors(*args, replace=replace, seed=124)
    for x, y in zip(a, b):
        assert torch.equal(x.cpu(), y.cpu())
    assert not torch.equal(a.edge_pos.cpu(), c.edge_pos.cpu())


@pytest.mark.cuda
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanout", [3, 25, -1])
def test_cuda_matches_cpu_uniform(rng, replace, fanout):
    indptr, indices = random_csr(rng, num_nodes=2000, max_deg=100, index_dtype=torch.int32)
    seeds = torch.randperm(2000, generator=rng)[:1500]
    cpu = S.sample_neighbors(indptr, indices, seeds, fanout, replace=replace, seed=77)
    for placement in ("cuda", "unified"):
        poison_allocator("cuda")
        gpu = S.sample_neighbors(place(indptr, placement), place(indices, placement), seeds.cuda(),
                                 fanout, replace=replace, seed=77)
        assert gpu.neighbors.is_cuda
        for x, y in zip(cpu, gpu):
            assert torch.equal(x, y.cpu())


def test_empty_seeds_and_zero_degree(rng):
    indptr, indices = random_csr(rng, num_nodes=40)
    out = S.sample_neighbors(indptr, indices, torch.empty(0, dtype=torch.int64), 3)
    assert out.offsets.tolist() == [0] and out.neighbors.numel() == 0
    lonely = int((indptr[1:] == indptr[:-1]).nonzero()[0])
    out = S.sample_neighbors(indptr, indices, torch.tensor([lonely]), 3, replace=True)
    assert out.offsets.tolist() == [0, 0]


# ---------------------------------------------------------------------------------------------
# Compaction.


def test_compact_first_appearance_order(device):
    seeds = torch.tensor([7, 2, 9], device=device)
    nbrs = torch.tensor([5, 2, 5, 11, 7, 3], dtype=torch.int32, device=device)
    nodes, local = S.compact(seeds, nbrs)
    assert nodes.tolist() == [7, 2, 9, 5, 11, 3]
    assert local.tolist() == [3, 1, 3, 4, 0, 5]


@pytest.mark.parametrize("nbr_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("seed_dtype", [torch.int32, torch.int64])
def test_compact_matches_reference(rng, device, nbr_dtype, seed_dtype):
    seeds = torch.randint(0, 5000, (700,), generator=rng).to(seed_dtype)  # repeats allowed here
    nbrs = torch.randint(0, 5000, (20000,), generator=rng).to(nbr_dtype)
    if device == "cuda":
        poison_allocator(device)
    nodes, local = S.compact(seeds.to(device), nbrs.to(device))
    want_nodes, want_local = ref_compact(seeds, nbrs)
    assert nodes.dtype == local.dtype == torch.int64
    assert nodes.cpu().tolist() == want_nodes and local.cpu().tolist() == want_local
    with pytest.raises(ValueError, match="node ids must be >= 0"):
        S.compact(seeds.to(device), torch.tensor([3, -2], device=device))


# ---------------------------------------------------------------------------------------------
# Multi-layer sampling.


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[4, 3, 2], [-1, 2], [3, -1], [0, 5]])
def test_sample_layers_op_matches_reference(rng, index_dtype, replace, fanouts):
    indptr, indices = random_csr(rng, num_nodes=250, max_deg=12, index_dtype=index_dtype)
    seeds = torch.randperm(250, generator=rng)[:15].to(torch.int32)
    seed = int(torch.randint(0, 2**62, (), generator=rng))
    got = op_layers(indptr, indices, seeds, fanouts, replace, seed=seed)
    assert as_lists(got) == [tuple(x) for x in ref_sample_layers(indptr, indices, seeds, fanouts, replace, seed)]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("edge_dir", ["in", "out"])
def test_sample_layers_blocks_match_reference(rng, placement, edge_dir):
    indptr, indices = random_csr(rng, num_nodes=200, max_deg=10, index_dtype=torch.int32)
    g = CSRGraph.from_csr(indptr, indices)
    adj = g if edge_dir == "out" else g.csc()
    seeds = torch.randperm(200, generator=rng)[:12]
    fanouts = [3, 4, 2]  # DGL order: the seeds sample 2, then 4, then 3
    if placement == "cuda":
        poison_allocator("cuda")
    blocks = S.sample_layers(g.to(placement), seeds, fanouts, edge_dir=edge_dir, seed=99)
    want = ref_sample_layers(adj.indptr, adj.indices, seeds, fanouts[::-1], False, 99, adj.eids)
    assert len(blocks) == 3
    num_dst = seeds.numel()
    for block, (nodes, src, dst, eids) in zip(blocks[::-1], want):
        assert block.nodes.tolist() == nodes and block.src.tolist() == src
        assert block.dst.tolist() == dst and block.eids.tolist() == eids
        assert block.num_src == len(nodes) and block.num_dst == num_dst
        num_dst = len(nodes)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("edge_dir", ["in", "out"])
def test_layers_compact_and_map_back(rng, placement, edge_dir):
    indptr, indices = random_csr(rng, index_dtype=torch.int32)
    src_all = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr[1:] - indptr[:-1])
    dst_all = indices.long()
    g = CSRGraph.from_csr(indptr, indices).to(placement)
    seeds = torch.randperm(indptr.numel() - 1, generator=rng)[:20]
    layers = S.sample_layers(g, seeds, [4, 3, 2], edge_dir=edge_dir, seed=rng.initial_seed())
    assert len(layers) == 3
    assert torch.equal(layers[-1].nodes[: seeds.numel()].cpu(), seeds)
    for lay, nxt in zip(layers, layers[1:] + [None]):
        nodes = lay.nodes.cpu()
        assert nodes.unique().numel() == nodes.numel()
        if nxt is not None:
            assert torch.equal(nodes[: lay.num_dst], nxt.nodes.cpu()), "dst nodes must come first"
        src_l, dst_l = lay.src.cpu(), lay.dst.cpu()
        assert bool((dst_l < lay.num_dst).all()) and bool((src_l < lay.num_src).all())
        nbr = nodes[src_l]
        seed_of_edge = nodes[dst_l]
        eid = lay.eids.cpu()
        es, ed = (nbr, seed_of_edge) if edge_dir == "in" else (seed_of_edge, nbr)
        # The edge ids name exactly these edges of the original graph.
        assert torch.equal(src_all[eid], es) and torch.equal(dst_all[eid], ed)
        # Every node beyond the dst nodes is some edge's neighbour.
        assert set(nodes[lay.num_dst:].tolist()) <= set(nbr.tolist())
    # The innermost layer used the last fanout (2 per seed at most).
    counts = torch.bincount(layers[-1].dst.cpu(), minlength=seeds.numel())
    assert int(counts.max()) <= 2


def test_one_layer_is_sample_neighbors_then_compact(rng):
    """sample_layers' first layer shares its kernels with sample_neighbors and compact."""
    indptr, indices = random_csr(rng)
    seeds = torch.randperm(indptr.numel() - 1, generator=rng)[:50]
    for replace in (False, True):
        (block,) = S.sample_layers((indptr, indices), seeds, [6], edge_dir="out", replace=replace, seed=5)
        one = S.sample_neighbors(indptr, indices, seeds, 6, replace=replace, seed=5)
        nodes, local = S.compact(seeds, one.neighbors)
        assert torch.equal(block.nodes, nodes) and torch.equal(block.src, local)
        assert torch.equal(block.dst, one.seed_index) and torch.equal(block.eids, one.edge_pos)


def test_fanout_all_matches_full_in_neighbourhood(rng):
    indptr, indices = random_csr(rng)
    dst_all = indices.long()
    seeds = torch.randperm(indptr.numel() - 1, generator=rng)[:30]
    (lay,) = S.sample_layers((indptr, indices), seeds, [-1], seed=1)
    want = torch.isin(dst_all, seeds).nonzero().flatten()
    assert sorted(lay.eids.tolist()) == want.tolist()


@pytest.mark.parametrize("replace", [False, True])
def test_sample_layers_deterministic_and_thread_independent(rng, replace):
    g = CSRGraph.from_csr(*random_csr(rng))
    seeds = torch.randperm(g.num_nodes, generator=rng)[:40]
    a = S.sample_layers(g, seeds, [5, 5], replace=replace, seed=17)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        b = S.sample_layers(g, seeds, [5, 5], replace=replace, seed=17)
    finally:
        torch.set_num_threads(threads)
    c = S.sample_layers(g, seeds, [5, 5], replace=replace, seed=18)
    for x, y in zip(a, b):
        for t in ("nodes", "src", "dst", "eids"):
            assert torch.equal(getattr(x, t), getattr(y, t))
    assert not torch.equal(a[0].eids, c[0].eids)


def weighted_case(rng, device):
    """A 300-node graph (its lists, the graph, and the graph on ``device``), edge weights by edge
    id with 30 % zeros, 25 seeds."""
    indptr, indices = random_csr(rng, num_nodes=300, max_deg=20)
    g = CSRGraph.from_csr(indptr, indices)
    probs = torch.rand(indices.numel(), generator=rng) + 0.05  # by edge id of g
    probs[torch.rand(indices.numel(), generator=rng) < 0.3] = 0.0
    seeds = torch.randperm(300, generator=rng)[:25]
    return indptr, indices, g, probs, seeds, g.to("cuda") if device == "cuda" else g


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[3, 5], [-1, 4]])
def test_sample_layers_weighted(rng, device, replace, fanouts):
    indptr, indices, g, probs, seeds, placed = weighted_case(rng, device)
    blocks = S.sample_layers(placed, seeds.to(device), fanouts, probs=probs.to(device), replace=replace, seed=4)
    src_all = torch.repeat_interleave(torch.arange(300), indptr[1:] - indptr[:-1])
    for block, fanout in zip(blocks, fanouts):
        eids = block.eids.cpu()
        assert bool((probs[eids] > 0).all()), "sampled an edge with probability 0"
        # edge_dir='in': the edge runs from the sampled neighbour to the seed.
        assert torch.equal(src_all[eids], block.nodes.cpu()[block.src.cpu()])
        assert torch.equal(indices[eids].long(), block.nodes.cpu()[block.dst.cpu()])
        per_seed = torch.bincount(block.dst.cpu(), minlength=block.num_dst)
        if fanout >= 0:
            assert int(per_seed.max()) <= fanout
        if not replace:
            assert eids.unique().numel() == eids.numel()
    if device == "cuda":  # the same sample as the CPU op, up to rounding of the weighted keys
        cpu = S.sample_layers(g, seeds, fanouts, probs=probs, replace=replace, seed=4)
        same = sum(int(torch.equal(a.eids.cpu(), b.eids)) for a, b in zip(blocks, cpu))
        assert same == len(fanouts)


def test_sample_layers_empty_seeds(device):
    g = CSRGraph.from_csr(torch.tensor([0, 1, 2]), torch.tensor([1, 0]))
    if device == "cuda":
        g = g.to("cuda")
    blocks = S.sample_layers(g, torch.empty(0, dtype=torch.int64, device=device), [2, 2], edge_dir="out")
    assert [b.num_edges() for b in blocks] == [0, 0] and [b.num_src for b in blocks] == [0, 0]


def test_sample_layers_async_equals_sync(rng, device):
    g = CSRGraph.from_csr(*random_csr(rng))
    if device == "cuda":
        g = g.to("cuda")
    seeds = torch.randperm(g.num_nodes, generator=rng)[:64].to(device)
    pending = S.sample_layers_async(g, seeds, [4, 6], seed=21)
    want = S.sample_layers(g, seeds, [4, 6], seed=21)
    got = pending.result()
    assert pending.ready() and pending.result() is got
    for a, b in zip(got, want):
        assert (a.num_src, a.num_dst) == (b.num_src, b.num_dst)
        for t in ("nodes", "src", "dst", "eids"):
            assert torch.equal(getattr(a, t), getattr(b, t))


@pytest.mark.cuda
def test_async_with_every_array_unified(rng):
    """The DGL loader's UVA placement maps indptr too: the op still runs on the GPU, asynchronously."""
    indptr, indices = random_csr(rng, index_dtype=torch.int32)
    g = CSRGraph(place(indptr, "unified"), place(indices, "unified"), placement="unified", validate=False)
    seeds = torch.randperm(g.num_nodes, generator=rng)[:64].cuda()
    pending = S.sample_layers_async(g, seeds, [4, 6], edge_dir="out", seed=21)
    assert pending.event is not None
    want = S.sample_layers(CSRGraph.from_csr(indptr, indices), seeds.cpu(), [4, 6], edge_dir="out", seed=21)
    for a, b in zip(pending.result(), want):
        assert a.src.is_cuda
        for t in ("nodes", "src", "dst", "eids"):
            assert torch.equal(getattr(a, t).cpu(), getattr(b, t))


@pytest.mark.parametrize("edge_dir", ["in", "out"])
def test_sample_layers_accepts_only_graphs(rng, edge_dir):
    indptr, indices = random_csr(rng, num_nodes=50)
    with pytest.raises(TypeError, match="graph must be a CSRGraph"):
        S.sample_layers(object(), torch.tensor([1]), [3], edge_dir=edge_dir)
    # Issue 15: a raw pair naming node 7 of a 2-node graph is refused, not sampled.
    with pytest.raises(ValueError, match=r"indices must be in \[0, 2\)"):
        S.sample_layers((torch.tensor([0, 1, 2]), torch.tensor([7, 0])), torch.tensor([0]), [2], edge_dir=edge_dir)


# ---------------------------------------------------------------------------------------------
# CUDA: exact agreement with the CPU op, and the host synchronisations.


def graph_on(indptr, indices, placement):
    g = CSRGraph.from_csr(indptr, indices)
    return g if placement == "cpu" else g.to(placement)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[10, 15], [25, 5, 3], [-1, 4], [3, -1]])
def test_cuda_sample_layers_matches_cpu(rng, placement, index_dtype, replace, fanouts):
    assert_cuda_layers_match_cpu(rng, placement, index_dtype, replace, fanouts)


def assert_cuda_layers_match_cpu(rng, placement, index_dtype, replace, fanouts, **options):
    """``sample_layers`` (``options``: its frontier rule) on the GPU, the graph in ``placement``,
    int32 and int64 seeds, both edge directions, into poisoned memory: the CPU's layers."""
    indptr, indices = random_csr(rng, num_nodes=3000, max_deg=60, index_dtype=index_dtype)
    seeds = torch.randperm(3000, generator=rng)[:400]
    for edge_dir in ("out", "in"):
        cpu = S.sample_layers(graph_on(indptr, indices, "cpu"), seeds, fanouts, edge_dir=edge_dir,
                              replace=replace, seed=1234, **options)
        g = graph_on(indptr, indices, placement)
        for seed_dtype in (torch.int32, torch.int64):
            poison_allocator("cuda")
            gpu = S.sample_layers(g, seeds.to(seed_dtype).cuda(), fanouts, edge_dir=edge_dir, replace=replace,
                                  seed=1234, **options)
            for a, b in zip(gpu, cpu, strict=True):
                assert a.src.is_cuda and (a.num_src, a.num_dst) == (b.num_src, b.num_dst)
                for t in ("nodes", "src", "dst", "eids"):
                    assert torch.equal(getattr(a, t).cpu(), getattr(b, t)), (edge_dir, t)


@pytest.mark.cuda
def test_cuda_sample_layers_large_batch_matches_cpu(rng):
    """Enough seeds for the multi-tile sort and several waves of warps."""
    indptr, indices = random_csr(rng, num_nodes=200_000, max_deg=30, index_dtype=torch.int32)
    seeds = torch.randperm(200_000, generator=rng)[:20_000]
    cpu = op_layers(indptr, indices, seeds, [10, 5], seed=3)
    poison_allocator("cuda", 1 << 28)
    gpu = op_layers(indptr.cuda(), indices.cuda(), seeds.cuda(), [10, 5], seed=3)
    assert_same_layers(gpu, cpu)


SYNC_WARNING = "called a synchronizing CUDA operation"  # torch's sync debug mode "warn"


def count_syncs(capfd, fn):
    """Runs fn under torch's sync debug mode "warn"; returns (result, synchronisations).

    A synchronisation made inside an op called through ``torch.ops`` (every op of this package)
    warns through the C++ warning handler, which writes to the process's stderr (torch routes
    those to Python's ``warnings`` only in later versions): both are counted."""
    torch.cuda.synchronize()
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            out = fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    _, err = capfd.readouterr()
    return out, sum(SYNC_WARNING in str(w.message) for w in caught) + err.count(SYNC_WARNING)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
@pytest.mark.parametrize("options", [{}, {"frontier": S.Frontier.NEW}], ids=["every-node", "new-frontier"])
def test_cuda_sample_layers_synchronises_once(rng, placement, options, capfd):
    # The counter sees a synchronisation inside an op called through torch.ops.
    one = torch.ones((), dtype=torch.int64, device="cuda")
    assert count_syncs(capfd, lambda: torch.ops.aten._local_scalar_dense.default(one)) == (1, 1)
    indptr, indices = random_csr(rng, num_nodes=5000, index_dtype=torch.int32)
    g = graph_on(indptr, indices, placement)
    g.csc()  # built once, on first use (host work and copies)
    seeds = torch.randperm(5000, generator=rng)[:1024].cuda()
    S.sample_layers(g, seeds, [15, 10], seed=1, **options)  # warm-up: allocator, cub
    _, syncs = count_syncs(capfd, lambda: S.sample_layers(g, seeds, [15, 10], seed=2, **options))
    assert syncs == 1
    _, syncs = count_syncs(capfd, lambda: S.sample_layers(g, seeds, [15, 10, 5], edge_dir="out", seed=2,
                                                          **options))
    assert syncs == 1
    _, syncs = count_syncs(capfd, lambda: S.sample_layers(g, seeds, [-1, 10], seed=2, **options))
    assert syncs == 2  # a fanout -1 layer reads its edge total
    pending, syncs = count_syncs(capfd, lambda: S.sample_layers_async(g, seeds, [15, 10], seed=2, **options))
    assert syncs == 0
    torch.cuda.set_sync_debug_mode("error")
    try:
        pending = S.sample_layers_async(g, seeds, [15, 10], seed=3, **options)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    want = S.sample_layers(g, seeds, [15, 10], seed=3, **options)
    for a, b in zip(pending.result(), want, strict=True):
        for t in ("nodes", "src", "dst", "eids"):
            assert torch.equal(getattr(a, t), getattr(b, t))


# ---------------------------------------------------------------------------------------------
# Bad input: a clear exception from the op, on every device, never a crash.


def bad_graph(device, indptr, indices, eids=None):
    """A graph that skips CSRGraph's own checks, so that the op's checks are what is tested."""
    placement = "cuda" if device == "cuda" else "cpu"
    return CSRGraph(indptr.to(device), indices.to(device), eids=None if eids is None else eids.to(device),
                    placement=placement, validate=False)


def expect(exc, pattern, fn):
    with pytest.raises(exc, match=pattern):
        fn()


def test_untrusted_indptr(device):
    """Issue 15: offsets that run backwards or past the end of indices are refused."""
    t = lambda *v: torch.tensor(v, device=device)  # noqa: E731
    pattern = r"indptr is not a valid offset array at node 0: indptr\[0\] = 0, indptr\[1\] = 5 with 2 entries"
    expect(ValueError, pattern, lambda: S.sample_neighbors(t(0, 5, 2), t(1, 0), t(0, 1), -1))
    expect(ValueError, pattern, lambda: op_layers(t(0, 5, 2), t(1, 0), t(0, 1), [-1]))
    pattern = r"at node 1: indptr\[1\] = 2, indptr\[2\] = 1000000000 with 2 entries"
    expect(ValueError, pattern, lambda: S.sample_neighbors(t(0, 2, 10**9), t(1, 0), t(1), 3))
    for replace in (False, True):
        g = bad_graph(device, t(0, 2, 10**9), t(1, 0))
        expect(ValueError, pattern, lambda: S.sample_layers(g, t(1), [3], edge_dir="out", replace=replace))
    # The seed's own list is fine; a neighbour's (a later layer) is not.
    g = bad_graph(device, t(0, 1, 1, -4), t(2))
    expect(ValueError, r"at node 2: indptr\[2\] = 1, indptr\[3\] = -4",
           lambda: S.sample_layers(g, t(0), [2, 2], edge_dir="out"))
    # A CSRGraph built with its checks on refuses the same arrays itself.
    with pytest.raises(ValueError, match="indptr"):
        S.sample_layers((t(0, 5, 2), t(1, 0)), t(0), [2], edge_dir="out")
    assert S.sample_neighbors(t(0, 1, 2), t(1, 0), t(0, 1), 1).neighbors.tolist() == [1, 0]  # still alive


def test_untrusted_neighbour_ids(device):
    t = lambda *v: torch.tensor(v, device=device)  # noqa: E731
    for dtype in (torch.int32, torch.int64):
        g = bad_graph(device, t(0, 1, 2), t(7, 0).to(dtype))
        expect(ValueError, r"indices\[0\] = 7 is out of range for a graph with 2 nodes",
               lambda: S.sample_layers(g, t(0), [2], edge_dir="out"))
        expect(ValueError, r"indices\[0\] = 7 is out of range",
               lambda: S.sample_neighbors(g.indptr, g.indices, t(0), 2))
        g = bad_graph(device, t(0, 1, 2), t(1, -3).to(dtype))
        expect(ValueError, r"indices\[1\] = -3 is out of range",
               lambda: S.sample_layers(g, t(0), [1, 1], edge_dir="out"))


@pytest.mark.parametrize("value", [float("nan"), -1.0, float("inf")])
def test_bad_probabilities(device, value):
    """Issue 15: NaN (and negative, infinite) probabilities are errors, not zeros."""
    indptr = torch.tensor([0, 2, 3], device=device)
    indices = torch.tensor([0, 1, 0], device=device)
    probs = torch.tensor([0.5, value, 1.0], device=device)
    pattern = r"probs\[1\] = (nan|-1|inf).*: sampling probabilities must be finite and >= 0"
    for fanout, replace in ((1, False), (1, True), (-1, False), (5, False)):
        expect(ValueError, pattern,
               lambda: S.sample_neighbors(indptr, indices, torch.tensor([0], device=device), fanout,
                                          replace=replace, probs=probs))
        g = bad_graph(device, indptr, indices)
        expect(ValueError, pattern,
               lambda: S.sample_layers(g, torch.tensor([0], device=device), [fanout], edge_dir="out",
                                       replace=replace, probs=probs))
    # Only the lists visited are checked: node 1's list is fine.
    out = S.sample_neighbors(indptr, indices, torch.tensor([1], device=device), 1, probs=probs)
    assert out.neighbors.tolist() == [0]


def test_bad_edge_ids(device):
    t = lambda *v: torch.tensor(v, device=device)  # noqa: E731
    g = bad_graph(device, t(0, 2, 3), t(1, 0, 0), eids=t(0, 9, 1))
    expect(ValueError, r"eids\[1\] = 9 is not an edge id of a graph with 3 edges",
           lambda: S.sample_layers(g, t(0), [-1], edge_dir="out"))
    expect(ValueError, r"eids\[1\] = 9 is not an edge id",
           lambda: S.sample_layers(g, t(0), [-1], edge_dir="out", probs=torch.ones(3, device=device)))


def test_bad_seeds(device):
    g = CSRGraph.from_csr(*random_csr(torch.Generator().manual_seed(0), num_nodes=50))
    if device == "cuda":
        g = g.to("cuda")
    t = lambda *v: torch.tensor(v, device=device)  # noqa: E731
    expect(IndexError, r"seeds\[1\] = 50 is out of range for a graph with 50 nodes",
           lambda: S.sample_layers(g, t(0, 50), [3], edge_dir="out"))
    expect(IndexError, r"seeds\[0\] = -1 is out of range",
           lambda: S.sample_layers(g, t(-1, 3), [3, 3]))
    expect(IndexError, r"seeds\[1\] = 50 is out of range for a graph with 50 nodes",
           lambda: S.sample_neighbors(g.indptr, g.indices, t(3, 50), 2))
    expect(ValueError, r"seeds must not repeat a node id .*seeds\[2\] = 4 repeats an earlier seed",
           lambda: S.sample_layers(g, t(4, 1, 4, 4), [3], edge_dir="out"))
    expect(ValueError, "must not repeat", lambda: S.sample_layers(g, t(4, 4).int(), [3, 2]))


def test_bad_arguments(rng):
    indptr, indices = random_csr(rng, num_nodes=50)
    ok = torch.tensor([1, 2])
    g = CSRGraph.from_csr(indptr, indices)
    with pytest.raises(ValueError, match="fanout must be -1"):
        S.sample_neighbors(indptr, indices, ok, -2)
    with pytest.raises(ValueError, match="fanout must be -1"):
        torch.ops.zerocopy.sample_neighbors.default(indptr, indices, ok, -3, False, None, 0)
    with pytest.raises(ValueError, match="probs must hold one value per edge"):
        S.sample_neighbors(indptr, indices, ok, 2, probs=torch.ones(indices.numel() + 1))
    with pytest.raises(ValueError, match="probs must hold one value per edge"):
        torch.ops.zerocopy.sample_neighbors.default(indptr, indices, ok, 2, False, torch.ones(3), 0)
    with pytest.raises(TypeError, match="seeds must be an int32 or int64"):
        S.sample_neighbors(indptr, indices, ok.float(), 2)
    with pytest.raises(TypeError, match="indices must be int32 or int64"):
        S.sample_neighbors(indptr, indices.float(), ok, 2)
    with pytest.raises(ValueError, match="indptr must be a 1-D tensor"):
        S.sample_neighbors(indptr.view(1, -1), indices, ok, 2)
    with pytest.raises(ValueError, match="at least one fanout"):
        S.sample_layers(g, ok, [])
    with pytest.raises(ValueError, match="at least one fanout"):
        op_layers(indptr, indices, ok, [])
    with pytest.raises(ValueError, match="fanouts must be ints"):
        S.sample_layers(g, ok, [3, -4])
    with pytest.raises(ValueError, match="fanouts must be -1"):
        op_layers(indptr, indices, ok, [3, -4])
    with pytest.raises(ValueError, match="probs must hold one value per edge"):
        S.sample_layers(g, ok, [3], probs=torch.ones(2))
    with pytest.raises(ValueError, match="eids must hold one edge id per position"):
        op_layers(indptr, indices, ok, [3], eids=torch.arange(3))
    with pytest.raises(ValueError, match="edge_dir must be 'in' or 'out'"):
        S.sample_layers(g, ok, [3], edge_dir="both")
    with pytest.raises(TypeError, match="seeds must be an int32 or int64"):
        S.sample_layers(g, ok.float(), [3])


# ---------------------------------------------------------------------------------------------
# The ops' schemas and fake kernels.


@pytest.mark.skipif(not has_opcheck(), reason="torch.library.opcheck needs torch >= 2.4")
def test_opcheck(rng, device):
    indptr, indices = random_csr(rng, num_nodes=60, index_dtype=torch.int32)
    indptr, indices = indptr.to(device), indices.to(device)
    seeds = torch.randperm(60, generator=rng)[:10].to(device)
    probs = torch.rand(indices.numel(), device=device)
    eids = torch.randperm(indices.numel(), device=device)
    utils = ("test_schema", "test_faketensor", "test_autograd_registration")
    torch.library.opcheck(torch.ops.zerocopy.sample_neighbors.default, (indptr, indices, seeds, 3, False, None, 5),
                          test_utils=utils)
    torch.library.opcheck(torch.ops.zerocopy.compact_ids.default,
                          (seeds, torch.randint(0, 60, (40,), generator=rng).to(device)), test_utils=utils)
    for args in ((indptr, indices, seeds, [3, 2], False, None, None, 5),
                 (indptr, indices, seeds, [-1, 2], True, probs, eids, 6)):
        for kwargs in ({}, {"frontier": int(S.Frontier.NEW)}):
            torch.library.opcheck(torch.ops.zerocopy.sample_layers.default, args, kwargs, test_utils=utils)
            if device == "cuda":
                torch.library.opcheck(torch.ops.zerocopy.sample_layers_launch.default, args, kwargs, test_utils=utils)


# ---------------------------------------------------------------------------------------------
# Frontier.NEW: PyG's hops in one call. Layer l samples only the nodes first reached in layer
# l - 1; nodes[l] lists every node reached so far, each keeping its index.

NEW = S.Frontier.NEW


def ref_sample_hops(indptr, indices, seeds, fanouts_applied, replace, seed, eids=None):
    """The kernels' contract under Frontier.NEW, draws included: per layer (nodes, src, dst,
    edge ids), as lists."""
    indptr, indices = indptr.tolist(), indices.tolist()
    eids = None if eids is None else eids.tolist()
    nodes = list(seeds.tolist())
    local = {v: i for i, v in enumerate(nodes)}
    first, layers = 0, []
    for layer, fanout in enumerate(fanouts_applied):
        s = layer_seed(seed, layer)
        before = len(nodes)
        src, dst, pos = [], [], []
        for i, v in enumerate(nodes[first:before]):
            start, end = indptr[v], indptr[v + 1]
            for r in ref_positions(s, v, end - start, fanout, replace):
                u = indices[start + r]
                if u not in local:
                    local[u] = len(nodes)
                    nodes.append(u)
                src.append(local[u])
                dst.append(first + i)
                pos.append(start + r)
        layers.append((list(nodes), src, dst, pos if eids is None else [eids[p] for p in pos]))
        first = before
    return layers


def pyg_hops_full(indptr, indices, seeds, hops):
    """PyG's semantics with every neighbour, from the definition alone (no draws): per hop the
    nodes first reached in it, and its edges (neighbour, frontier node, position), in frontier
    then list order."""
    indptr, indices = indptr.tolist(), indices.tolist()
    reached = list(seeds.tolist())
    seen = set(reached)
    frontier, new_per_hop, edges_per_hop = list(reached), [], []
    for _ in range(hops):
        new, edges = [], []
        for v in frontier:
            for p in range(indptr[v], indptr[v + 1]):
                u = indices[p]
                if u not in seen:
                    seen.add(u)
                    new.append(u)
                edges.append((u, v, p))
        new_per_hop.append(new)
        edges_per_hop.append(edges)
        frontier = new
    return new_per_hop, edges_per_hop


def check_hops(indptr, indices, seeds, fanouts_applied, replace, layers, eids=None):
    """What Frontier.NEW promises, checked from the definition (no draws): the nodes are the
    seeds then each layer's new nodes, in order of first appearance among the layer's edges;
    layer l's edges come from the nodes first reached in layer l - 1, each of them with
    min(fanout, degree) distinct edges (fanout with replacement, or the whole list for -1), every
    edge one of the graph's; no node is a frontier node twice."""
    nodes_l, src_l, dst_l, eid_l = ([t.cpu() for t in ts] for ts in layers)
    indptr, indices, seeds = indptr.cpu(), indices.cpu().long(), seeds.cpu().long()
    edge_src = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr.diff())  # the list owner
    pos_of = torch.arange(indices.numel()) if eids is None else torch.argsort(eids.cpu())  # edge id -> position
    deg = indptr.diff()
    before, first, sampled = seeds, 0, set()
    for fanout, nodes, src, dst, eid in zip(fanouts_applied, nodes_l, src_l, dst_l, eid_l, strict=True):
        assert nodes.dtype == src.dtype == dst.dtype == eid.dtype == torch.int64
        assert torch.equal(nodes[:before.numel()], before), "earlier nodes keep their place"
        assert nodes.unique().numel() == nodes.numel()
        frontier = torch.arange(first, before.numel())
        assert not sampled & set(nodes[frontier].tolist()), "a node was a frontier twice"
        sampled |= set(nodes[frontier].tolist())
        assert src.numel() == dst.numel() == eid.numel()
        if dst.numel():
            assert int(dst.min()) >= first and int(dst.max()) < before.numel()
            assert int(src.min()) >= 0 and int(src.max()) < nodes.numel()
        pos = pos_of[eid]
        # every edge is the graph's: position pos lists node dst's neighbour src
        assert torch.equal(edge_src[pos], before[dst]) and torch.equal(indices[pos], nodes[src])
        per_node = torch.bincount(dst - first, minlength=frontier.numel()) if dst.numel() else \
            torch.zeros(frontier.numel(), dtype=torch.int64)
        d = deg[before[frontier]]
        if fanout == -1:
            want = d
        elif replace:
            want = torch.where(d > 0, torch.full_like(d, fanout), 0)
        else:
            want = d.clamp(max=fanout)
        assert torch.equal(per_node, want)
        assert bool((dst.diff() >= 0).all()), "edges in frontier order"
        if not replace or fanout == -1:
            assert eid.unique().numel() == eid.numel(), "an edge sampled twice without replacement"
        # the new nodes: the sampled neighbours not reached before, in order of first appearance
        new, seen = [], set(before.tolist())
        for u in nodes[src].tolist():
            if u not in seen:
                seen.add(u)
                new.append(u)
        assert nodes[before.numel():].tolist() == new
        first, before = before.numel(), nodes


def blocks_as_layers(blocks):
    """sample_layers' blocks as the op's outputs: (nodes, src, dst, eids) lists, seeds' layer first."""
    layers = blocks[::-1]
    return tuple([getattr(b, t) for b in layers] for t in ("nodes", "src", "dst", "eids"))


def op_hops(indptr, indices, seeds, fanouts_applied, replace=False, probs=None, eids=None, seed=0):
    return torch.ops.zerocopy.sample_layers.default(indptr, indices, seeds, fanouts_applied, replace, probs, eids,
                                                    seed, frontier=int(NEW))


HOP_FANOUTS = [[4, 3, 2], [-1, 2], [3, -1], [0, 5], [2, 0, 3], [-1, -1], [6]]


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", HOP_FANOUTS)
def test_new_frontier_op_matches_reference(rng, index_dtype, replace, fanouts):
    indptr, indices = random_csr(rng, num_nodes=250, max_deg=12, index_dtype=index_dtype)
    seeds = torch.randperm(250, generator=rng)[:15].to(torch.int32)
    eids = torch.randperm(indices.numel(), generator=rng)
    seed = int(torch.randint(0, 2**62, (), generator=rng))
    for e in (None, eids):
        got = op_hops(indptr, indices, seeds, fanouts, replace, eids=e, seed=seed)
        want = ref_sample_hops(indptr, indices, seeds, fanouts, replace, seed, e)
        assert as_lists(got) == [tuple(x) for x in want]
        check_hops(indptr, indices, seeds, fanouts, replace, got, e)


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[5, 4, 3], [-1, 3], [2, -1, 2]])
def test_new_frontier_follows_pygs_rule(rng, placement, replace, fanouts):
    """The structure of PyG's hops, on each placement, outputs poisoned beforehand on a GPU."""
    indptr, indices = random_csr(rng, num_nodes=400, max_deg=15)
    seeds = torch.randperm(400, generator=rng)[:30]
    g = graph_on(indptr, indices, placement)
    if placement != "cpu" and gpu_backed():
        poison_allocator("cuda")
    blocks = S.sample_layers(g, seeds, fanouts[::-1], edge_dir="out", replace=replace,
                             seed=int(torch.randint(0, 2**62, (), generator=rng)), frontier=NEW)
    check_hops(indptr, indices, seeds, fanouts, replace, blocks_as_layers(blocks))


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_new_frontier_with_every_neighbour_is_pygs_hops(rng, placement):
    """fanout -1 is deterministic: exactly PyG's hops, from the definition."""
    indptr, indices = random_csr(rng, num_nodes=300, max_deg=6)
    seeds = torch.randperm(300, generator=rng)[:8]
    g = graph_on(indptr, indices, placement)
    blocks = S.sample_layers(g, seeds, [-1, -1, -1], edge_dir="out", frontier=NEW)
    new_per_hop, edges_per_hop = pyg_hops_full(indptr, indices, seeds, 3)
    nodes = blocks[0].nodes.cpu()
    assert nodes.tolist() == seeds.tolist() + [u for new in new_per_hop for u in new]
    for block, edges, new in zip(blocks[::-1], edges_per_hop, new_per_hop, strict=True):
        assert block.num_src - block.num_dst == len(new)
        got = list(zip(nodes[block.src.cpu()].tolist(), nodes[block.dst.cpu()].tolist(), block.eids.cpu().tolist()))
        assert got == edges


def test_new_frontier_first_layer_equals_all(rng):
    """Both rules sample the seeds alike: the first layers are identical."""
    indptr, indices = random_csr(rng)
    seeds = torch.randperm(indptr.numel() - 1, generator=rng)[:40]
    for replace in (False, True):
        a = op_layers(indptr, indices, seeds, [5, 3], replace, seed=9)
        b = op_hops(indptr, indices, seeds, [5, 3], replace, seed=9)
        assert_same_layers([t[:1] for t in a], [t[:1] for t in b])


@pytest.mark.parametrize("replace", [False, True])
def test_new_frontier_deterministic_and_thread_independent(rng, replace):
    g = CSRGraph.from_csr(*random_csr(rng))
    seeds = torch.randperm(g.num_nodes, generator=rng)[:40]
    a = S.sample_layers(g, seeds, [5, 5, 5], replace=replace, seed=17, frontier=NEW)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        b = S.sample_layers(g, seeds, [5, 5, 5], replace=replace, seed=17, frontier=NEW)
    finally:
        torch.set_num_threads(threads)
    c = S.sample_layers(g, seeds, [5, 5, 5], replace=replace, seed=18, frontier=NEW)
    for x, y in zip(a, b):
        for t in ("nodes", "src", "dst", "eids"):
            assert torch.equal(getattr(x, t), getattr(y, t))
    assert not torch.equal(a[0].eids, c[0].eids)


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[3, 5], [-1, 4], [2, 2, -1]])
def test_new_frontier_weighted(rng, device, replace, fanouts):
    indptr, indices, g, probs, seeds, placed = weighted_case(rng, device)
    blocks = S.sample_layers(placed, seeds.to(device), fanouts, probs=probs.to(device), replace=replace, seed=4,
                             frontier=NEW)
    src_all = torch.repeat_interleave(torch.arange(300), indptr[1:] - indptr[:-1])
    nodes = blocks[0].nodes.cpu()
    first = 0
    for block, fanout in zip(blocks[::-1], fanouts[::-1]):
        eids, dst = block.eids.cpu(), block.dst.cpu()
        assert bool((probs[eids] > 0).all()), "sampled an edge with probability 0"
        # edge_dir='in': the edge runs from the sampled neighbour to the frontier node
        assert torch.equal(src_all[eids], nodes[block.src.cpu()]) and torch.equal(indices[eids].long(), nodes[dst])
        assert dst.numel() == 0 or (int(dst.min()) >= first and int(dst.max()) < block.num_dst)
        if fanout >= 0 and dst.numel():
            assert int(torch.bincount(dst).max()) <= fanout
        if not replace:
            assert eids.unique().numel() == eids.numel()
        first = block.num_dst
    if device == "cuda":  # the same sample as the CPU op, up to rounding of the weighted keys
        cpu = S.sample_layers(g, seeds, fanouts, probs=probs, replace=replace, seed=4, frontier=NEW)
        same = sum(int(torch.equal(a.eids.cpu(), b.eids)) for a, b in zip(blocks, cpu))
        assert same == len(fanouts)


def test_new_frontier_empty_seeds_and_dead_ends(device):
    g = CSRGraph.from_csr(torch.tensor([0, 1, 2, 2]), torch.tensor([1, 0]))
    if device == "cuda":
        g = g.to("cuda")
    blocks = S.sample_layers(g, torch.empty(0, dtype=torch.int64, device=device), [2, 2], edge_dir="out",
                             frontier=NEW)
    assert [b.num_edges() for b in blocks] == [0, 0] and [b.num_src for b in blocks] == [0, 0]
    # 0 -> 1 -> 0: hop 2 samples node 1 only, whose edge leads back to a reached node; hop 3 has no
    # frontier; node 2 has no neighbour at all.
    blocks = S.sample_layers(g, torch.tensor([2, 0], device=device), [-1, -1, -1], edge_dir="out", frontier=NEW)
    assert blocks[0].nodes.tolist() == [2, 0, 1]
    assert [(b.num_src, b.num_dst, b.num_edges()) for b in blocks[::-1]] == [(3, 2, 1), (3, 3, 1), (3, 3, 0)]
    assert [b.src.tolist() for b in blocks[::-1]] == [[2], [1], []]
    assert [b.dst.tolist() for b in blocks[::-1]] == [[1], [2], []]


def test_new_frontier_async_equals_sync(rng, device):
    g = CSRGraph.from_csr(*random_csr(rng))
    if device == "cuda":
        g = g.to("cuda")
    seeds = torch.randperm(g.num_nodes, generator=rng)[:64].to(device)
    for fanouts in ([4, 6, 3], [-1, 3]):
        pending = S.sample_layers_async(g, seeds, fanouts, seed=21, frontier=NEW)
        want = S.sample_layers(g, seeds, fanouts, seed=21, frontier=NEW)
        got = pending.result()
        assert pending.ready() and pending.result() is got
        for a, b in zip(got, want, strict=True):
            assert (a.num_src, a.num_dst) == (b.num_src, b.num_dst)
            for t in ("nodes", "src", "dst", "eids"):
                assert torch.equal(getattr(a, t), getattr(b, t))


def test_pending_sample_then(rng, device):
    """then(): the result is what the function makes of the blocks, computed once."""
    g = CSRGraph.from_csr(*random_csr(rng))
    if device == "cuda":
        g = g.to("cuda")
    seeds = torch.randperm(g.num_nodes, generator=rng)[:32].to(device)
    calls = []

    def count_edges(blocks):
        calls.append(len(blocks))
        return [b.num_edges() for b in blocks]

    pending = S.sample_layers_async(g, seeds, [3, 4], seed=5, frontier=NEW).then(count_edges)
    pending = pending.then(sum)
    want = sum(b.num_edges() for b in S.sample_layers(g, seeds, [3, 4], seed=5, frontier=NEW))
    assert pending.result() == want and pending.result() == want
    assert calls == [2]


def test_new_frontier_bad_input(device):
    """Bad input under Frontier.NEW: the same exceptions, naming the argument, as Frontier.ALL."""
    def t(*v):
        return torch.tensor(v, device=device)

    # A node reached in hop 1 (node 2) has bad offsets: found in hop 2.
    g = bad_graph(device, t(0, 1, 1, -4), t(2))
    expect(ValueError, r"at node 2: indptr\[2\] = 1, indptr\[3\] = -4",
           lambda: S.sample_layers(g, t(0), [2, 2], edge_dir="out", frontier=NEW))
    # A neighbour id out of range in hop 2 (node 1's list).
    for dtype in (torch.int32, torch.int64):
        g = bad_graph(device, t(0, 1, 2), t(1, -3).to(dtype))
        expect(ValueError, r"indices\[1\] = -3 is out of range",
               lambda g=g: S.sample_layers(g, t(0), [1, 1], edge_dir="out", frontier=NEW))
    g = bad_graph(device, t(0, 2, 3), t(1, 0, 0), eids=t(0, 9, 1))
    expect(ValueError, r"eids\[1\] = 9 is not an edge id of a graph with 3 edges",
           lambda: S.sample_layers(g, t(0), [-1], edge_dir="out", frontier=NEW))
    g = bad_graph(device, t(0, 2, 3), t(1, 0, 0))
    probs = torch.tensor([0.5, 1.0, float("nan")], device=device)  # node 1's edge: reached in hop 2
    expect(ValueError, r"probs\[2\] = nan.*: sampling probabilities must be finite and >= 0",
           lambda: S.sample_layers(g, t(0), [1, -1], edge_dir="out", probs=probs, frontier=NEW))
    g = CSRGraph.from_csr(*random_csr(torch.Generator().manual_seed(0), num_nodes=50))
    if device == "cuda":
        g = g.to("cuda")
    expect(IndexError, r"seeds\[1\] = 50 is out of range for a graph with 50 nodes",
           lambda: S.sample_layers(g, t(0, 50), [3, 3], edge_dir="out", frontier=NEW))
    expect(ValueError, r"seeds must not repeat a node id .*seeds\[2\] = 4 repeats an earlier seed",
           lambda: S.sample_layers(g, t(4, 1, 4, 4), [3, 2], edge_dir="out", frontier=NEW))
    # The rule itself: checked where the op starts (a Frontier in Python, 0 or 1 in the op).
    seeds = t(1, 2)
    for bad in (2, -1):
        expect(ValueError, rf"frontier must be 0 \(every node of the previous layer\) or 1 .*got {bad}",
               lambda bad=bad: torch.ops.zerocopy.sample_layers.default(g.indptr, g.indices, seeds, [3], False,
                                                                        None, None, 0, frontier=bad))
        expect(ValueError, "frontier must be Frontier.ALL or Frontier.NEW",
               lambda bad=bad: S.sample_layers(g, seeds, [3], frontier=bad))
    expect(TypeError, "frontier must be a pytorch_zerocopy.sampling.Frontier",
           lambda: S.sample_layers(g, seeds, [3], frontier="new"))
    expect(TypeError, "frontier must be a pytorch_zerocopy.sampling.Frontier",
           lambda: S.sample_layers_async(g, seeds, [3], frontier=True))
    assert S.sample_layers(g, seeds, [3], frontier=1)[0].num_dst == 2  # an int naming a rule is accepted


@pytest.mark.cuda
def test_new_frontier_bad_rule_refused_by_the_launch():
    indptr, indices = (t.cuda() for t in random_csr(torch.Generator().manual_seed(1), num_nodes=30))
    with pytest.raises(ValueError, match="frontier must be 0"):
        torch.ops.zerocopy.sample_layers_launch.default(indptr, indices, torch.tensor([1, 2], device="cuda"), [3],
                                                        False, None, None, 0, frontier=7)


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["cuda", "unified"])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[10, 15], [25, 5, 3], [-1, 4], [3, -1], [4, -1, 3], [0, 5], [-1, -1]])
def test_cuda_new_frontier_matches_cpu(rng, placement, index_dtype, replace, fanouts):
    assert_cuda_layers_match_cpu(rng, placement, index_dtype, replace, fanouts, frontier=NEW)


@pytest.mark.cuda
def test_cuda_new_frontier_large_batch_matches_cpu(rng):
    """Frontiers past one block's counting sort (cub's radix sort orders them), several waves."""
    indptr, indices = random_csr(rng, num_nodes=200_000, max_deg=30, index_dtype=torch.int32)
    seeds = torch.randperm(200_000, generator=rng)[:20_000]
    cpu = op_hops(indptr, indices, seeds, [10, 5, 2], seed=3)
    assert cpu[0][0].numel() - seeds.numel() > 32 << 10  # layer 1's frontier
    poison_allocator("cuda", 1 << 28)
    gpu = op_hops(indptr.cuda(), indices.cuda(), seeds.cuda(), [10, 5, 2], seed=3)
    assert_same_layers(gpu, cpu)
    del gpu


def test_dynamic_graph_refuses_new_frontier(rng):
    from pytorch_zerocopy.graph import DynamicGraph

    dg = DynamicGraph.from_csr(CSRGraph.from_csr(*random_csr(rng, num_nodes=30)), page_size=4)
    with pytest.raises(NotImplementedError, match="Frontier.ALL only"):
        S.sample_layers(dg, torch.tensor([1, 2]), [2], edge_dir="out", frontier=NEW)
