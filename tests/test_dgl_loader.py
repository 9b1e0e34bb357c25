"""The DGL-compatible loader without DGL: the graph built as dgl.graph builds it, batches,
blocks, prefetching, bad input, and a GraphSAGE model built from pytorch_zerocopy.dgl.nn trained
through it."""

import gc
import warnings

import pytest
import torch
import torch.nn.functional as F

import pytorch_zerocopy as zc
from pytorch_zerocopy.datasets import community_graph
from pytorch_zerocopy.dgl import (NID, EID, Block, CSRGraph, DataLoader, MultiLayerFullNeighborSampler,
                                  NeighborSampler, graph as make_graph)
from pytorch_zerocopy.dgl.nn import SAGEConv
from pytorch_zerocopy.pipeline import PlanError, make_plan
from pytorch_zerocopy.pipeline.trace import StageTimes
from pytorch_zerocopy.placement import PlacementError
from test_pipeline_failures import _assert_nothing_left, snapshot


class Data:
    """A small learnable dataset as DGL users hold one: an edge list in its own order (edge
    ``i`` is ``src[i] -> dst[i]``), features, labels, splits."""

    def __init__(self, num_nodes, seed):
        ds = community_graph(num_nodes=num_nodes, num_classes=4, feature_dim=16, mean_scale=0.35, seed=seed,
                             splits=(0.6, 0.0, 0.4))
        src, dst = ds.edges()
        perm = torch.randperm(src.numel(), generator=torch.Generator().manual_seed(seed))
        self.src, self.dst = src[perm], dst[perm]  # not in CSR order: edge ids must survive
        self.feat, self.label = ds.features.clone(), ds.labels.clone()
        self.train_idx, self.test_idx = ds.train_idx, ds.test_idx
        self.num_nodes = ds.num_nodes


@pytest.fixture(scope="module")
def data():
    cg = Data(1500, seed=3)
    graph = make_graph((cg.src, cg.dst), num_nodes=cg.num_nodes, ndata={"feat": cg.feat, "label": cg.label},
                       edata={"w": torch.rand(cg.src.numel()) + 0.1})
    return cg, graph


def edges_of(data):
    """``(src, dst)`` indexed by edge id (the input order, as in DGL)."""
    return data[0].src, data[0].dst


def test_graph_is_built_as_dgl_builds_it(data):
    cg, g = data
    assert isinstance(g, CSRGraph) and g.num_nodes == cg.num_nodes and g.num_edges == cg.src.numel()
    # Row u lists u's out-neighbours; eids name each position by its edge's input position.
    rows = torch.repeat_interleave(torch.arange(g.num_nodes), g.indptr[1:] - g.indptr[:-1])
    assert torch.equal(cg.src[g.eids], rows) and torch.equal(cg.dst[g.eids], g.indices.long())
    # The transpose keeps the same edge ids.
    t = g.csc()
    cols = torch.repeat_interleave(torch.arange(g.num_nodes), t.indptr[1:] - t.indptr[:-1])
    assert torch.equal(cg.dst[t.eids], cols) and torch.equal(cg.src[t.eids], t.indices.long())
    # DGL's sparse form, and the refusals.
    csr = make_graph(("csr", (g.indptr, g.indices, g.eids)))
    assert torch.equal(csr.indices, g.indices) and torch.equal(csr.eids, g.eids)
    with pytest.raises(ValueError, match="one node per edge.*'csr'"):
        make_graph((g.indptr, g.indices))  # CSR arrays passed as (src, dst): refused, not misread
    with pytest.raises(ValueError, match="out of range"):
        make_graph((torch.tensor([0, 5]), torch.tensor([1, 2])), num_nodes=4)
    with pytest.raises(TypeError, match="src and dst|data must be"):
        make_graph(torch.tensor([[0, 1], [1, 0]]))
    coo = make_graph(("coo", (cg.src, cg.dst)), num_nodes=cg.num_nodes)
    assert torch.equal(coo.indices, g.indices) and torch.equal(coo.eids, g.eids)
    with pytest.raises(ValueError, match="sparse form 'csc'"):
        make_graph(("csc", (g.indptr, g.indices, g.eids)))
    with pytest.raises(TypeError, match="CSRGraph"):
        DataLoader((g.indptr, g.indices), cg.train_idx, NeighborSampler([2]))


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_cover_indices_once_per_epoch(data, shuffle, drop_last):
    cg, graph = data
    idx = cg.train_idx
    loader = DataLoader(graph, idx, NeighborSampler([2]), batch_size=64, shuffle=shuffle, drop_last=drop_last)
    n_full = idx.numel() // 64
    assert len(loader) == (n_full if drop_last else n_full + (idx.numel() % 64 > 0))
    epochs = []
    for _ in range(2):
        seen = [out for _, out, _ in loader]
        assert len(seen) == len(loader)
        assert all(s.numel() == 64 for s in seen[:n_full])
        seen = torch.cat(seen)
        if drop_last:
            assert seen.numel() == n_full * 64 and seen.unique().numel() == seen.numel()
            assert bool(torch.isin(seen, idx).all())
        else:
            assert torch.equal(seen.sort().values, idx.sort().values)
        epochs.append(seen)
    if shuffle:
        assert not torch.equal(epochs[0], epochs[1]), "shuffle must give a new order each epoch"
        assert not torch.equal(epochs[0][: idx.numel() // 2], idx[: idx.numel() // 2])
    else:
        assert torch.equal(epochs[0], idx[: epochs[0].numel()])


@pytest.mark.parametrize("use_uva", [False, True])
def test_block_attributes_and_prefetch(data, use_uva):
    cg, graph = data
    src_all, dst_all = edges_of(data)
    sampler = NeighborSampler([4, 3], prefetch_node_feats=["feat"], prefetch_labels=["label"],
                              prefetch_edge_feats=["w"])
    loader = DataLoader(graph, cg.train_idx, sampler, batch_size=100, shuffle=True, use_uva=use_uva)
    input_nodes, output_nodes, blocks = next(iter(loader))
    assert len(blocks) == 2 and all(isinstance(b, Block) for b in blocks)
    assert torch.equal(blocks[0].srcdata[NID], input_nodes)
    assert torch.equal(blocks[-1].dstdata[NID], output_nodes)
    assert blocks[-1].num_dst_nodes() == output_nodes.numel() == 100
    for inner, outer in zip(blocks, blocks[1:]):
        assert inner.num_dst_nodes() == outer.num_src_nodes()
        assert torch.equal(inner.dstdata[NID], outer.srcdata[NID])
    # DGL's rule: with UVA the blocks are made on the GPU, otherwise on the graph's device.
    expect_device = torch.device("cuda", torch.cuda.current_device()) if use_uva and zc.gpu_backed() else torch.device("cpu")
    for b, fanout in zip(blocks, [4, 3]):
        src, dst = b.edges()
        assert b.device == expect_device
        assert bool((src < b.num_src_nodes()).all()) and bool((dst < b.num_dst_nodes()).all())
        assert int(b.in_degrees().max()) <= fanout
        # Edges are in-edges of the original graph: source -> destination, named by edge id.
        eid, src, dst = b.edata[EID].cpu(), src.cpu(), dst.cpu()
        assert torch.equal(src_all[eid], b.srcdata[NID].cpu()[src])
        assert torch.equal(dst_all[eid], b.srcdata[NID].cpu()[dst])
        assert torch.equal(b.edata["w"].cpu(), graph.edata["w"][eid])
    assert torch.equal(blocks[0].srcdata["feat"].cpu(), cg.feat[input_nodes.cpu()])
    assert torch.equal(blocks[-1].dstdata["label"].cpu(), cg.label[output_nodes.cpu()])


@pytest.mark.parametrize("use_uva", [False, True])
def test_gpu_cache_serves_prefetched_features(data, use_uva):
    """DGL's ``gpu_cache={"node": {name: rows}}``: that many rows of the feature, the nodes in
    the most in-neighbour lists, held by a FeatureTable (in GPU memory where one serves the
    loader, else in host memory); prefetched features read through it equal the table's rows."""
    cg, graph = data
    sampler = NeighborSampler([4, 3], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    loader = DataLoader(graph, cg.train_idx, sampler, batch_size=100, use_uva=use_uva,
                        gpu_cache={"node": {"feat": 200}})
    cache = loader.node_caches["feat"].features
    assert set(loader.node_caches) == {"feat"} and cache.cache_rows == 200
    assert cache.device.type == ("cuda" if use_uva and zc.gpu_backed() else "cpu")
    # The nodes in the most in-neighbour lists: those with the most out-edges.
    out_degree = torch.bincount(cg.src, minlength=cg.num_nodes)
    held = torch.zeros(cg.num_nodes, dtype=torch.bool)
    held[cache.cached_ids] = True
    assert int(out_degree[held].min()) >= int(out_degree[~held].max())
    hits = 0
    for input_nodes, output_nodes, blocks in loader:
        assert torch.equal(blocks[0].srcdata["feat"].cpu(), cg.feat[input_nodes.cpu()])
        assert torch.equal(blocks[-1].dstdata["label"].cpu(), cg.label[output_nodes.cpu()])
        hits += int(held[input_nodes.cpu()].sum())
    assert hits > 0
    # In-place writes to the cached table are detected; a replaced table is refused.
    graph.ndata["feat"][0] += 1
    try:
        with pytest.raises(RuntimeError, match="refresh"):
            next(iter(loader))
    finally:
        graph.ndata["feat"][0] -= 1
    loader.node_caches["feat"].features.refresh()
    saved = graph.ndata["feat"]
    graph.ndata["feat"] = saved.clone()
    try:
        with pytest.raises(RuntimeError, match="was replaced"):
            next(iter(loader))
    finally:
        graph.ndata["feat"] = saved


def test_gpu_cache_bad_arguments(data):
    cg, graph = data
    sampler = NeighborSampler([3], prefetch_node_feats=["feat"])
    with pytest.raises(KeyError, match="gpu_cache: the graph has no node feature 'nope'"):
        DataLoader(graph, cg.train_idx, sampler, gpu_cache={"node": {"nope": 10}})
    with pytest.raises(NotImplementedError, match="edge-feature caches"):
        DataLoader(graph, cg.train_idx, sampler, gpu_cache={"edge": {"w": 10}})
    with pytest.raises(ValueError, match="gpu_cache must be a dict"):
        DataLoader(graph, cg.train_idx, sampler, gpu_cache=["feat"])
    with pytest.raises(ValueError, match="rows must be an int"):
        DataLoader(graph, cg.train_idx, sampler, gpu_cache={"node": {"feat": -1}})


def test_uva_and_cpu_sampling_agree(data):
    cg, graph = data
    outs = []
    for use_uva in (False, True):
        torch.manual_seed(5)
        loader = DataLoader(graph, cg.train_idx, NeighborSampler([5, 5]), batch_size=50, use_uva=use_uva)
        outs.append(next(iter(loader)))
    (a_in, a_out, a_blocks), (b_in, b_out, b_blocks) = outs
    assert torch.equal(a_in.cpu(), b_in.cpu()) and torch.equal(a_out.cpu(), b_out.cpu())
    for x, y in zip(a_blocks, b_blocks):
        assert all(torch.equal(p.cpu(), q.cpu()) for p, q in zip(x.edges(), y.edges()))


def test_full_neighbour_sampler_takes_every_in_edge(data):
    cg, graph = data
    _, dst_all = edges_of(data)
    loader = DataLoader(graph, cg.test_idx[:30], MultiLayerFullNeighborSampler(1), batch_size=30)
    _, out, (block,) = next(iter(loader))
    want = torch.isin(dst_all, out).nonzero().flatten()
    assert torch.equal(block.edata[EID].sort().values, want)


def test_edge_probabilities_exclude_zero_weight_edges(data):
    cg, graph = data
    keep = torch.rand(graph.num_edges) < 0.5
    g2 = make_graph((cg.src, cg.dst), num_nodes=cg.num_nodes, ndata=graph.ndata, edata={"p": keep.float()})
    loader = DataLoader(g2, cg.train_idx, NeighborSampler([3, 3], prob="p"), batch_size=200)
    n_edges = 0
    for _, _, blocks in loader:
        for b in blocks:
            assert bool(keep[b.edata[EID]].all())
            n_edges += b.num_edges()
    assert n_edges > 0


def test_out_edges(data):
    cg, graph = data
    src_all, dst_all = edges_of(data)
    loader = DataLoader(graph, cg.train_idx, NeighborSampler([3], edge_dir="out"), batch_size=40)
    _, out, (b,) = next(iter(loader))
    src, dst = b.edges()
    eid = b.edata[EID]
    # Messages flow from the sampled out-neighbour to the seed; edge ids name seed -> neighbour.
    assert torch.equal(src_all[eid], b.srcdata[NID][dst])
    assert torch.equal(dst_all[eid], b.srcdata[NID][src])


def test_bad_input(data):
    cg, graph = data
    s = NeighborSampler([3])
    with pytest.raises(ValueError, match="at least one fanout"):
        NeighborSampler([])
    with pytest.raises(ValueError, match="fanouts must be ints"):
        NeighborSampler([3, -2])
    with pytest.raises(TypeError, match="one fanout per layer"):
        NeighborSampler(5)
    with pytest.raises(ValueError, match="mutually exclusive"):
        NeighborSampler([3], prob="w", mask="w")
    with pytest.raises(ValueError, match="edge_dir"):
        NeighborSampler([3], edge_dir="up")
    with pytest.raises(ValueError, match="batch_size"):
        DataLoader(graph, cg.train_idx, s, batch_size=0)
    with pytest.raises(TypeError, match="indices must be"):
        DataLoader(graph, cg.train_idx.float(), s)
    with pytest.raises(NotImplementedError, match="heterogeneous"):
        DataLoader(graph, {"user": cg.train_idx}, s)
    with pytest.raises(IndexError, match="out of range"):
        next(iter(DataLoader(graph, torch.tensor([0, graph.num_nodes]), s, batch_size=2)))
    with pytest.raises(KeyError, match="no node feature 'nope'"):
        next(iter(DataLoader(graph, cg.train_idx, NeighborSampler([2], prefetch_node_feats=["nope"]))))
    with pytest.raises(KeyError, match="no edge feature 'nope'"):
        next(iter(DataLoader(graph, cg.train_idx, NeighborSampler([2], prob="nope"))))
    with pytest.raises(RuntimeError, match="torch.distributed"):
        DataLoader(graph, cg.train_idx, s, use_ddp=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        DataLoader(graph, cg.train_idx, s, num_workers=4, use_uva=True)
    assert any("num_workers is ignored" in str(w.message) for w in caught)


class SAGE(torch.nn.Module):
    def __init__(self, in_feats, hidden, classes):
        super().__init__()
        self.layers = torch.nn.ModuleList([SAGEConv(in_feats, hidden), SAGEConv(hidden, classes)])

    def forward(self, blocks, x):
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i < len(self.layers) - 1:
                h = F.relu(h)
        return h


def test_sage_conv_matches_dense_mean():
    torch.manual_seed(0)
    src = torch.tensor([0, 2, 3, 3, 1])
    dst = torch.tensor([0, 0, 1, 2, 2])
    block = Block(src, dst, num_src=4, num_dst=3)
    x = torch.randn(4, 5)
    for conv in (SAGEConv(5, 2), SAGEConv(5, 8)):  # narrowing projects first; widening aggregates first
        torch.nn.init.normal_(conv.bias)
        mean = torch.stack([(x[0] + x[2]) / 2, x[3], (x[3] + x[1]) / 2])
        want = conv.fc_self(x[:3]) + conv.fc_neigh(mean) + conv.bias
        assert torch.allclose(conv(block, x), want, atol=1e-6)
        # DGL's (src_feat, dst_feat) pair: the destination rows need not be the first source rows.
        h_dst = torch.randn(3, 5)
        want = conv.fc_self(h_dst) + conv.fc_neigh(mean) + conv.bias
        assert torch.allclose(conv(block, (x, h_dst)), want, atol=1e-6)
    # DGL's options: bipartite widths, norm and activation, no bias; DGL's parameter names.
    conv = SAGEConv((5, 3), 4, "mean", bias=False, norm=torch.nn.LayerNorm(4), activation=torch.relu)
    assert {n for n, _ in conv.named_parameters()} == {"fc_self.weight", "fc_neigh.weight", "norm.weight", "norm.bias"}
    h_dst = torch.randn(3, 3)
    want = torch.relu(conv.norm(conv.fc_self(h_dst) + conv.fc_neigh(mean)))
    assert torch.allclose(conv(block, (x, h_dst)), want, atol=1e-6)
    with pytest.raises(ValueError, match="feature rows"):
        conv(block, (x[:3], h_dst))
    with pytest.raises(NotImplementedError, match="'pool'"):
        SAGEConv(5, 2, "pool")
    with pytest.raises(ValueError, match="out_feats"):
        SAGEConv(5, 0)


def test_graphsage_trains_well_above_chance(data):
    cg, graph = data
    torch.manual_seed(0)
    model = SAGE(cg.feat.shape[1], 32, 4)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = NeighborSampler([8, 8], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    train = DataLoader(graph, cg.train_idx, sampler, batch_size=128, shuffle=True)
    for _ in range(6):
        for _, _, blocks in train:
            loss = F.cross_entropy(model(blocks, blocks[0].srcdata["feat"]), blocks[-1].dstdata["label"])
            opt.zero_grad()
            loss.backward()
            opt.step()
    test = DataLoader(graph, cg.test_idx, MultiLayerFullNeighborSampler(2, prefetch_node_feats=["feat"],
                                                                        prefetch_labels=["label"]),
                      batch_size=500)
    correct = 0
    with torch.no_grad():
        for _, out, blocks in test:
            pred = model(blocks, blocks[0].srcdata["feat"]).argmax(1)
            correct += int((pred == blocks[-1].dstdata["label"]).sum())
    acc = correct / cg.test_idx.numel()
    assert acc > 0.8, f"test accuracy {acc:.3f} (chance is 0.25)"


def test_ddp_split_gives_every_rank_an_equal_share(data):
    cg, graph = data
    idx = cg.train_idx[:899]  # not a multiple of 3: the last rank is padded
    shares = []
    for rank in range(3):
        loader = DataLoader(graph, idx, NeighborSampler([2]), batch_size=50, shuffle=True, ddp_seed=4)
        loader.use_ddp, loader._rank, loader._world = True, rank, 3  # as torch.distributed would set
        loader.set_epoch(2)
        shares.append(torch.cat([out for _, out, _ in loader]))
    assert len({s.numel() for s in shares}) == 1 and shares[0].numel() == 300
    assert set(torch.cat(shares).tolist()) == set(idx.tolist())


# --- the process way (pipeline=True) ----------------------------------------------------------


def assert_same_batch(a, b):
    """Two ``(input_nodes, output_nodes, blocks)`` minibatches, equal: ids, edges and every
    data table of every block."""
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert len(a[2]) == len(b[2])
    for x, y in zip(a[2], b[2]):
        assert (x.num_src_nodes(), x.num_dst_nodes()) == (y.num_src_nodes(), y.num_dst_nodes())
        assert all(torch.equal(u, v) for u, v in zip(x.edges(), y.edges()))
        for mine, theirs in ((x.srcdata, y.srcdata), (x.dstdata, y.dstdata), (x.edata, y.edata)):
            assert sorted(mine) == sorted(theirs)
            assert all(torch.equal(mine[k], theirs[k]) for k in theirs), sorted(theirs)


@pytest.mark.parametrize("kwargs", [dict(batch_size=128, shuffle=True), dict(batch_size=64, shuffle=True, drop_last=True)])
def test_process_way_yields_the_in_process_blocks(data, kwargs):
    """pipeline=True: the batches of the in-process loader (same seeds and samples, weighted
    sampling, prefetched features, labels and edge data; a partial last batch kept or
    dropped), epoch after epoch from the same processes, and nothing left once the loader is
    collected after an early break."""
    cg, graph = data
    assert cg.train_idx.numel() % kwargs["batch_size"]  # a partial last batch
    before = snapshot()
    sampler = NeighborSampler([4, 3], prob="w", prefetch_node_feats=["feat"], prefetch_labels=["label"],
                              prefetch_edge_feats=["w"])
    torch.manual_seed(2)
    loader = DataLoader(graph, cg.train_idx, sampler, pipeline=True, **kwargs)
    got = list(loader) + list(loader)
    pids = loader.processes.sup.pids()
    torch.manual_seed(2)
    here = DataLoader(graph, cg.train_idx, sampler, **kwargs)
    want = list(here) + list(here)
    assert len(got) == len(want) == 2 * len(loader)
    for a, b in zip(got, want):
        assert_same_batch(a, b)
        assert torch.equal(a[2][0].srcdata["feat"], cg.feat[a[0]])
    for i, _ in enumerate(loader):
        if i == 1:
            break
    del loader, got, _
    gc.collect()
    _assert_nothing_left(pids, before)


def test_process_way_bad_arguments_and_stage_times(data):
    cg, graph = data
    with pytest.raises(TypeError, match="pipeline must be True, False or a pytorch_zerocopy.pipeline.Plan"):
        DataLoader(graph, cg.train_idx, NeighborSampler([2], prefetch_node_feats=["feat"]), pipeline=1)
    with pytest.raises(ValueError, match="prefetch_node_feats"):
        DataLoader(graph, cg.train_idx, NeighborSampler([2]), pipeline=True)
    with pytest.raises(KeyError, match="no node feature 'nope'"):
        DataLoader(graph, cg.train_idx, NeighborSampler([2], prefetch_node_feats=["nope"]), pipeline=True)
    with pytest.raises(PlanError, match="gather_in must be 'producer'"):
        DataLoader(graph, cg.train_idx, NeighborSampler([2], prefetch_node_feats=["feat"]), pipeline=make_plan("cpu"))
    sampler = NeighborSampler([3, 2], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    with DataLoader(graph, cg.train_idx, sampler, batch_size=200, pipeline=True) as loader:
        loader.stage_times = StageTimes()
        n = len(list(loader))
    summary = loader.stage_times.summary()
    assert all(summary[stage]["n"] == n for stage in ("sample", "gather", "build", "deliver")), summary


def test_feature_placement_is_for_a_gpu_reading_host_features(data):
    cg, graph = data
    sampler = NeighborSampler([4, 3], prefetch_node_feats=["feat"])
    with pytest.raises(PlacementError, match="feature_placement must be one of"):
        DataLoader(graph, cg.train_idx, sampler, feature_placement="disk")
    with pytest.raises(PlacementError, match="feature_placement must be 'unified', 'managed' or 'cuda'"):
        DataLoader(graph, cg.train_idx, sampler, feature_placement="cpu")
    with pytest.raises(ValueError, match="with pipeline, the plan says where the prefetched feature is read from"):
        DataLoader(graph, cg.train_idx, sampler, feature_placement="managed", pipeline=True)
    if not zc.gpu_backed():
        with pytest.raises(PlacementError, match="for a GPU reading a host graph's features"):
            DataLoader(graph, cg.train_idx, sampler, use_uva=True, feature_placement="managed")
        # The CPU loader reads as it did: no cache unless asked for.
        assert DataLoader(graph, cg.train_idx, sampler, use_uva=True).node_caches == {}


@pytest.mark.cuda
def test_gpu_default_reading_equals_the_table(data):
    """On a GPU reading host features: the plan's placement and default cache for the first
    prefetched feature; minibatches equal the mapped, uncached loader's under the same seed."""
    if not zc.gpu_backed():
        pytest.skip("this build serves unified tensors on the CPU")
    from pytorch_zerocopy.feature_table import default_reading

    cg, _ = data
    feat = torch.randn(cg.num_nodes, 24)
    graph = make_graph((cg.src, cg.dst), num_nodes=cg.num_nodes, ndata={"feat": feat, "label": cg.label})
    sampler = NeighborSampler([4, 3], prefetch_node_feats=["feat"], prefetch_labels=["label"])
    fast = DataLoader(graph, cg.train_idx, sampler, batch_size=100, use_uva=True, shuffle=True)
    cache = fast.node_caches["feat"].features
    assert cache.placement is default_reading(feat.numel() * 4)[0]
    assert cache.cache_rows == round(0.1 * cg.num_nodes)
    mapped = DataLoader(graph, cg.train_idx, sampler, batch_size=100, use_uva=True, shuffle=True,
                        feature_placement="unified", gpu_cache=None)
    assert mapped.node_caches["feat"].features.cache_rows == 0

    def epoch(loader):  # each loader's epoch from the same seed (zip would interleave their draws)
        torch.manual_seed(2)
        batches = list(loader)
        torch.cuda.current_stream().synchronize()
        return batches

    for (ia, oa, ba), (ib, ob, bb) in zip(epoch(fast), epoch(mapped), strict=True):
        assert torch.equal(ia, ib) and torch.equal(oa, ob)
        assert torch.equal(ba[0].srcdata["feat"], bb[0].srcdata["feat"])
        assert torch.equal(ba[0].srcdata["feat"].cpu(), feat[ia.cpu()])
        assert torch.equal(ba[-1].dstdata["label"].cpu(), cg.label[oa.cpu()])
