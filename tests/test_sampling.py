"""Neighbour sampling: every sampled edge checked against the graph, counts, distributions,
probabilities, determinism, multi-layer compaction and bad input, on CPU, unified and CUDA
placements of the adjacency."""


import pytest
import torch

import pytorch_zerocopy  # noqa: F401  (registers the unified device)
from pytorch_zerocopy import sampling as S

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
        gpu = S.sample_neighbors(place(indptr, placement), place(indices, placement), seeds.cuda(),
                                 fanout, replace=replace, seed=77)
        assert gpu.neighbors.is_cuda
        for x, y in zip(cpu, gpu):
            assert torch.equal(x, y.cpu())


# ---------------------------------------------------------------------------------------------
# Multi-layer sampling and compaction.


def edge_set(indptr, indices):
    src = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr[1:] - indptr[:-1])
    return src, indices.long()


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("edge_dir", ["in", "out"])
def test_layers_compact_and_map_back(rng, placement, edge_dir):
    indptr, indices = random_csr(rng, index_dtype=torch.int32)
    src_all, dst_all = edge_set(indptr, indices)
    adj = S.adjacency_of((indptr, indices), edge_dir)
    adj = S.Adjacency(place(adj.indptr, placement), place(adj.indices, placement),
                      None if adj.eids is None else place(adj.eids, placement))
    seeds = torch.randperm(indptr.numel() - 1, generator=rng)[:20]
    layers = S.sample_layers(adj, seeds, [4, 3, 2], edge_dir=edge_dir, seed=rng.initial_seed())
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


def test_compact_first_appearance_order():
    seeds = torch.tensor([7, 2, 9])
    nbrs = torch.tensor([5, 2, 5, 11, 7, 3], dtype=torch.int32)
    nodes, local = S.compact(seeds, nbrs)
    assert nodes.tolist() == [7, 2, 9, 5, 11, 3]
    assert local.tolist() == [3, 1, 3, 4, 0, 5]


@pytest.mark.parametrize("nbr_dtype", [torch.int32, torch.int64])
def test_compact_op_matches_torch_path(rng, nbr_dtype):
    seeds = torch.randperm(5000, generator=rng)[:700]
    nbrs = torch.randint(0, 5000, (20000,), generator=rng).to(nbr_dtype)
    nodes, local = S.compact(seeds, nbrs)
    want_nodes, want_local = S._compact_torch(seeds, nbrs)
    assert torch.equal(nodes, want_nodes) and torch.equal(local, want_local)
    assert torch.equal(nodes[:700], seeds) and torch.equal(nodes[local], nbrs.long())
    with pytest.raises(ValueError, match="node ids must be >= 0"):
        S.compact(seeds, torch.tensor([3, -2]))


def test_fanout_all_matches_full_in_neighbourhood(rng):
    indptr, indices = random_csr(rng)
    src_all, dst_all = edge_set(indptr, indices)
    seeds = torch.randperm(indptr.numel() - 1, generator=rng)[:30]
    (lay,) = S.sample_layers((indptr, indices), seeds, [-1], seed=1)
    want = torch.isin(dst_all, seeds).nonzero().flatten()
    assert sorted(lay.eids.tolist()) == want.tolist()


def test_layer_seeds_differ_per_layer():
    assert S.layer_seed(5, 0) != S.layer_seed(5, 1) != S.layer_seed(6, 1)


# ---------------------------------------------------------------------------------------------
# Bad input.


def test_bad_input_messages(rng):
    indptr, indices = random_csr(rng, num_nodes=50)
    ok = torch.tensor([1, 2])
    with pytest.raises(IndexError, match=r"seeds\[1\] = 50 is out of range for a graph with 50 nodes"):
        S.sample_neighbors(indptr, indices, torch.tensor([3, 50]), 2)
    with pytest.raises(IndexError, match="out of range"):
        S.sample_neighbors(indptr, indices, torch.tensor([-1]), 2)
    with pytest.raises(ValueError, match="fanout must be -1"):
        S.sample_neighbors(indptr, indices, ok, -2)
    with pytest.raises(ValueError, match="fanout must be -1"):
        torch.ops.zerocopy.sample_neighbors.default(indptr, indices, ok, -3, False, None, 0)
    with pytest.raises(ValueError, match="probs must hold one value per edge"):
        S.sample_neighbors(indptr, indices, ok, 2, probs=torch.ones(indices.numel() + 1))
    with pytest.raises(ValueError, match="probs must hold one value per edge"):
        torch.ops.zerocopy.sample_neighbors.default(indptr, indices, ok, 2, False,
                                                    torch.ones(3), 0)
    with pytest.raises(TypeError, match="seeds must be int32 or int64"):
        S.sample_neighbors(indptr, indices, ok.float(), 2)
    with pytest.raises(TypeError, match="indices must be int32 or int64"):
        S.sample_neighbors(indptr, indices.float(), ok, 2)
    with pytest.raises(ValueError, match="indptr must be a 1-D tensor"):
        S.sample_neighbors(indptr.view(1, -1), indices, ok, 2)
    with pytest.raises(ValueError, match="at least one fanout"):
        S.sample_layers((indptr, indices), ok, [])
    with pytest.raises(ValueError, match="fanouts must be ints"):
        S.sample_layers((indptr, indices), ok, [3, -4])
    with pytest.raises(IndexError, match="node id 50 is out of range"):
        S.sample_layers((indptr, indices), torch.tensor([0, 50]), [3])
    with pytest.raises(ValueError, match="must not repeat"):
        S.sample_layers((indptr, indices), torch.tensor([4, 4]), [3])
    with pytest.raises(ValueError, match="probs must hold one value per edge"):
        S.sample_layers((indptr, indices), ok, [3], probs=torch.ones(2))
    with pytest.raises(ValueError, match="edge_dir must be 'in' or 'out'"):
        S.sample_layers((indptr, indices), ok, [3], edge_dir="both")
    with pytest.raises(TypeError, match="graph must be"):
        S.sample_layers(object(), ok, [3])


@pytest.mark.cuda
def test_cuda_bad_seed_reports_index():
    indptr = torch.tensor([0, 1, 2], device="cuda")
    indices = torch.tensor([1, 0], device="cuda")
    with pytest.raises(IndexError, match=r"seeds\[2\] = 9 is out of range"):
        S.sample_neighbors(indptr, indices, torch.tensor([0, 1, 9], device="cuda"), 1)


def test_empty_seeds_and_zero_degree(rng):
    indptr, indices = random_csr(rng, num_nodes=40)
    out = S.sample_neighbors(indptr, indices, torch.empty(0, dtype=torch.int64), 3)
    assert out.offsets.tolist() == [0] and out.neighbors.numel() == 0
    lonely = int((indptr[1:] == indptr[:-1]).nonzero()[0])
    out = S.sample_neighbors(indptr, indices, torch.tensor([lonely]), 3, replace=True)
    assert out.offsets.tolist() == [0, 0]


def test_opcheck(rng):
    if not hasattr(torch.library, "opcheck"):
        pytest.skip("torch.library.opcheck needs torch >= 2.4")
    indptr, indices = random_csr(rng, num_nodes=60)
    args = (indptr, indices, torch.arange(10), 3, False, None, 5)
    torch.library.opcheck(torch.ops.zerocopy.sample_neighbors.default, args,
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.zerocopy.compact_ids.default,
                          (torch.arange(5), torch.randint(0, 60, (40,), generator=rng)),
                          test_utils=("test_schema", "test_faketensor"))
