"""The CPU neighbour-sampling adapter and the GraphSAGE layers."""

import pytest
import torch

from pytorch_zerocopy.datasets import community_graph
from pytorch_zerocopy.pipeline import GraphSAGE, sample_blocks
from pytorch_zerocopy.pipeline.model import mean_aggregate


@pytest.fixture
def rng(request):
    """A randomly seeded generator; the seed is in the test's name on failure via the id."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    print(f"generator seed {seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def graph():
    return community_graph(num_nodes=3000, feature_dim=8, seed=5)


def _neighbours(ds, v):
    return ds.indices[ds.indptr[v]:ds.indptr[v + 1]].tolist()


def test_blocks_are_valid_dgl_style(graph, rng):
    seeds = graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=rng)[:64]]
    fanouts = [4, 3]
    inp, out, blocks = sample_blocks(graph.indptr, graph.indices, seeds, fanouts, rng)
    assert torch.equal(out, seeds) and len(blocks) == 2
    assert torch.equal(blocks[-1].dstdata["_ID"], seeds)
    assert torch.equal(blocks[0].srcdata["_ID"], inp)
    for layer, (block, fanout) in enumerate(zip(blocks, fanouts)):
        src_ids, dst_ids = block.srcdata["_ID"], block.dstdata["_ID"]
        assert src_ids.unique().numel() == src_ids.numel() == block.num_src_nodes()
        assert torch.equal(src_ids[: block.num_dst_nodes()], dst_ids)  # destination nodes first
        if layer + 1 < len(blocks):
            assert torch.equal(blocks[layer + 1].srcdata["_ID"], dst_ids)
        s, d = block.edges()
        assert int(s.max()) < block.num_src_nodes() and int(d.max()) < block.num_dst_nodes()
        per_dst = torch.bincount(d, minlength=block.num_dst_nodes())
        for j in range(0, block.num_dst_nodes(), 7):
            v = int(dst_ids[j])
            nbrs = _neighbours(graph, v)
            got = src_ids[s[d == j]].tolist()
            assert len(got) == len(set(got)) == min(len(nbrs), fanout)  # without replacement
            assert set(got) <= set(nbrs)
            assert int(per_dst[j]) == len(got)
        # Every sampled source appears in some edge, or is a destination node.
        used = torch.zeros(block.num_src_nodes(), dtype=torch.bool)
        used[s] = True
        used[: block.num_dst_nodes()] = True
        assert bool(used.all())


def test_sampling_is_deterministic_and_uniform():
    # A star: node 0 has 20 in-neighbours; fanout 5 must pick each with probability 1/4.
    indptr = torch.tensor([0, 20] + [20] * 20)
    indices = torch.arange(1, 21)
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    a = sample_blocks(indptr, indices, torch.tensor([0]), [5], g1)
    b = sample_blocks(indptr, indices, torch.tensor([0]), [5], g2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[2][0].src, b[2][0].src)
    counts = torch.zeros(21)
    for trial in range(400):
        inp, _, _ = sample_blocks(indptr, indices, torch.tensor([0]), [5], g1)
        counts[inp[1:]] += 1
    freq = counts[1:] / 400
    assert float(freq.min()) > 0.15 and float(freq.max()) < 0.35
    assert counts[0] == 0


def test_fanout_minus_one_keeps_all(graph):
    v = int(graph.train_idx[0])
    _, _, blocks = sample_blocks(graph.indptr, graph.indices, torch.tensor([v]), [-1], torch.Generator())
    assert sorted(blocks[0].srcdata["_ID"][blocks[0].src].tolist()) == sorted(_neighbours(graph, v))


def test_sampler_rejects_bad_input(graph):
    g = torch.Generator()
    with pytest.raises(ValueError, match="fanouts"):
        sample_blocks(graph.indptr, graph.indices, torch.tensor([0]), [0], g)
    with pytest.raises(IndexError, match="seeds"):
        sample_blocks(graph.indptr, graph.indices, torch.tensor([graph.num_nodes]), [2], g)
    with pytest.raises(TypeError, match="int32/int64"):
        sample_blocks(graph.indptr.float(), graph.indices, torch.tensor([0]), [2], g)
    with pytest.raises(ValueError, match="seeds"):
        sample_blocks(graph.indptr, graph.indices, torch.tensor([[0]]), [2], g)


def test_mean_aggregate_matches_reference(rng):
    h = torch.randn(7, 3, generator=rng)
    src = torch.tensor([0, 1, 2, 3, 4, 6, 5])
    dst = torch.tensor([0, 0, 1, 1, 1, 2, 0])
    out = mean_aggregate(h, src, dst, 4)
    ref = torch.stack([h[[0, 1, 5]].mean(0), h[[2, 3, 4]].mean(0), h[6], torch.zeros(3)])
    assert torch.allclose(out, ref, atol=1e-6)


def test_graphsage_forward_shapes_and_layer_check(graph, rng):
    seeds = graph.train_idx[:16]
    inp, out, blocks = sample_blocks(graph.indptr, graph.indices, seeds, [3, 3], rng)
    model = GraphSAGE(graph.feature_dim, 16, graph.num_classes, num_layers=2)
    logits = model(blocks, graph.features[inp])
    assert logits.shape == (16, graph.num_classes) and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="layers"):
        model(blocks[:1], graph.features[inp])
