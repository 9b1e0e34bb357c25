"""Node renumbering (graph.reorder) and the power-law generator (graph.power_law_graph)."""

from __future__ import annotations

import pytest
import torch

import pytorch_zerocopy as zc
from pytorch_zerocopy.datasets import community_graph
from pytorch_zerocopy.graph import CSRGraph, NodeOrder, degree_order, power_law_graph, presample_order
from pytorch_zerocopy.hotness import degree_hotness


def random_graph(gen: torch.Generator, n: int = 300, m: int = 2500) -> CSRGraph:
    src = torch.randint(0, n, (m,), generator=gen)
    dst = (torch.rand(m, generator=gen) ** 3 * n).long()  # skewed: low ids are hot
    w = torch.rand(m, generator=gen)
    return CSRGraph.from_coo(src, dst, num_nodes=n, weights=w)


def edge_multiset(indptr, indices, weights=None):
    rows = torch.repeat_interleave(torch.arange(indptr.numel() - 1), indptr[1:] - indptr[:-1])
    cols = indices.long()
    w = weights.tolist() if weights is not None else [None] * cols.numel()
    return sorted(zip(rows.tolist(), cols.tolist(), w))


def test_node_order_validates_its_permutation():
    with pytest.raises(ValueError, match="permutation"):
        NodeOrder.from_permutation(torch.tensor([0, 0, 2]))
    with pytest.raises(ValueError, match="permutation"):
        NodeOrder.from_permutation(torch.tensor([0, 3, 1]))
    order = NodeOrder.from_permutation(torch.tensor([2, 0, 1]))
    assert order.new_id.tolist() == [1, 2, 0]
    assert order.to_old(order.to_new(torch.tensor([0, 1, 2]))).tolist() == [0, 1, 2]


def test_from_hotness_is_stable_descending():
    order = NodeOrder.from_hotness(torch.tensor([1, 5, 1, 7, 0, 5]))
    assert order.old_id.tolist() == [3, 1, 5, 0, 2, 4]


def test_graph_renumbered_edge_for_edge(gen):
    g = random_graph(gen)
    order = degree_order(g, "out")  # hottest by in-degree first
    h = order.graph(g)
    assert h.num_nodes == g.num_nodes and h.num_edges == g.num_edges
    # Every edge (u -> v, w) of g is (new u -> new v, w) of h.
    want = edge_multiset(g.indptr, g.indices, g.weights)
    renamed = sorted((int(order.old_id[u]), int(order.old_id[v]), w) for u, v, w in
                     edge_multiset(h.indptr, h.indices, h.weights))
    assert renamed == want
    # Rows keep their entries' order, and eids name the same edge of g.
    for new_row in (0, 5, 299):
        old_row = int(order.old_id[new_row])
        a, b = int(h.indptr[new_row]), int(h.indptr[new_row + 1])
        c, d = int(g.indptr[old_row]), int(g.indptr[old_row + 1])
        assert order.to_old(h.indices[a:b]).tolist() == g.indices[c:d].long().tolist()
        assert h.eids[a:b].tolist() == list(range(c, d))
    # Hot nodes come first: in-degree is non-increasing over the new ids.
    indeg = degree_hotness(h, "out")
    assert bool((indeg[:-1] >= indeg[1:]).all())


def test_rows_roundtrip_and_shared_memory(gen):
    order = NodeOrder.from_permutation(torch.randperm(50, generator=gen))
    feats = torch.randn(50, 7, generator=gen).share_memory_()
    moved = order.rows(feats)
    assert moved.is_shared()
    torch.testing.assert_close(moved[order.new_id], feats, rtol=0, atol=0)
    torch.testing.assert_close(order.restore_rows(moved), feats, rtol=0, atol=0)
    labels = torch.randint(0, 5, (50,), generator=gen)
    torch.testing.assert_close(order.rows(labels)[order.new_id], labels)
    u = zc.to_unified(feats.clone())
    torch.testing.assert_close(order.rows(u).cpu(), moved, rtol=0, atol=0)
    with pytest.raises(ValueError, match="one row per node"):
        order.rows(torch.zeros(49, 2))


def test_dataset_reordered():
    ds = community_graph(num_nodes=2000, num_classes=4, avg_degree=6, feature_dim=8, seed=1)
    order = degree_order(ds.graph, edge_dir="out")
    new = order.dataset(ds)
    torch.testing.assert_close(new.features[order.new_id], ds.features, rtol=0, atol=0)
    assert torch.equal(new.labels[order.new_id], ds.labels)
    assert torch.equal(new.train_idx, torch.sort(order.new_id[ds.train_idx]).values)
    assert new.features.is_shared()
    want = edge_multiset(ds.graph.indptr, ds.graph.indices)
    got = sorted((int(order.old_id[u]), int(order.old_id[v]), w)
                 for u, v, w in edge_multiset(new.graph.indptr, new.graph.indices))
    assert got == want


def test_presample_order_puts_read_rows_first(gen):
    g = random_graph(gen, 400, 3000)
    seeds = torch.arange(0, 400, 8)
    order = presample_order(g, seeds, [3, 2], batch_size=10, edge_dir="out", seed=2)
    # Seeds are read by every epoch's batches: they are among the hottest, ahead of unread nodes.
    assert bool((order.new_id[seeds] < 400 - 1).all())
    assert order.num_nodes == 400


def test_power_law_graph_shape_and_skew():
    g = power_law_graph(1 << 14, 12.0, seed=3, device="cpu")
    again = power_law_graph(1 << 14, 12.0, seed=3, device="cpu")
    assert torch.equal(g.indptr, again.indptr) and torch.equal(g.indices, again.indices)
    deg = (g.indptr[1:] - g.indptr[:-1]).float()
    assert 10.0 < float(deg.mean()) < 12.5 and g.indices.dtype == torch.int32
    assert int(g.indices.min()) >= 0 and int(g.indices.max()) < g.num_nodes
    counts = torch.bincount(g.indices.long(), minlength=g.num_nodes).sort(descending=True).values
    top = int(counts[: g.num_nodes // 100].sum()) / g.num_edges
    assert top > 0.15  # the hottest 1% of nodes fill over 15% of the lists (uniform: 1%)
    hot_ids = torch.bincount(g.indices.long(), minlength=g.num_nodes).topk(20).indices
    assert int(hot_ids.max()) > g.num_nodes // 4  # hot nodes are spread over the id range
    with pytest.raises(ValueError, match="alpha"):
        power_law_graph(100, alpha=1.0)
