"""pytorch_zerocopy.pyg against PyG: the stores, the sampler's PyG layout, and NeighborLoader
minibatches equal to an exact reference (and to PyG's own loader where PyG can sample here:
that needs pyg-lib or torch-sparse), trained on by PyG's GraphSAGE to the same accuracy band.

Skipped as a whole when torch_geometric is not installed."""

import gc
import os
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

if os.environ.get("ZEROCOPY_REQUIRE_PYG") == "1":  # CI installs PyG: fail rather than skip
    import torch_geometric  # noqa: F401
else:
    pytest.importorskip("torch_geometric", reason="needs torch_geometric (pip install torch-geometric)")

import torch_geometric.typing  # noqa: E402
from torch_geometric.data import Data  # noqa: E402
from torch_geometric.loader import NeighborLoader as PygNeighborLoader  # noqa: E402
from torch_geometric.loader import NodeLoader  # noqa: E402
from torch_geometric.nn import GraphSAGE  # noqa: E402
from torch_geometric.sampler import BaseSampler, SamplerOutput  # noqa: E402

import pytorch_zerocopy as zc  # noqa: E402
from pytorch_zerocopy.datasets import community_graph  # noqa: E402
from pytorch_zerocopy.graph import CSRGraph  # noqa: E402
from pytorch_zerocopy.pyg import (FeatureStore, GraphStore, NeighborLoader, data_from_dataset,  # noqa: E402
                                  sample_hops, stores_from_data)
from pytorch_zerocopy.pipeline import PipelineError, PlanError, make_plan  # noqa: E402
from pytorch_zerocopy.pipeline.plan import InjectedFailure  # noqa: E402
from pytorch_zerocopy.pipeline.trace import StageTimes  # noqa: E402
from pytorch_zerocopy.placement import Placement, PlacementError  # noqa: E402
from test_pipeline_failures import _assert_nothing_left, snapshot  # noqa: E402

PYG_CAN_SAMPLE = torch_geometric.typing.WITH_PYG_LIB or torch_geometric.typing.WITH_TORCH_SPARSE


def to_data(ds, gen=None) -> Data:
    """A PyG Data over a NodeDataset, features copied (tests write nothing into the dataset),
    edge columns shuffled so that edge ids differ from any sorted order, and edge features."""
    data = data_from_dataset(ds)
    perm = torch.randperm(data.num_edges, generator=gen)
    data.edge_index = data.edge_index[:, perm]
    data.x = data.x.clone()
    data.edge_attr = torch.randn(data.num_edges, 3, generator=gen)
    return data


@pytest.fixture(scope="module")
def small():
    gen = torch.Generator().manual_seed(7)
    return to_data(community_graph(num_nodes=1200, num_classes=8, avg_degree=8, feature_dim=16, seed=5), gen)


def reference_full(edge_index, num_nodes, seeds, hops):
    """Every in-neighbour, hop by hop, in PyG's layout, with Python lists: (node ids, per hop a
    list of (global src, global dst, edge id))."""
    in_lists = [[] for _ in range(num_nodes)]
    for e, (u, v) in enumerate(edge_index.t().tolist()):
        in_lists[v].append((u, e))
    nodes = [int(s) for s in seeds]
    seen = set(nodes)
    frontier, per_hop, counts = list(nodes), [], [len(nodes)]
    for _ in range(hops):
        new, edges = [], []
        for v in frontier:
            for u, e in in_lists[v]:
                if u not in seen:
                    seen.add(u)
                    new.append(u)
                edges.append((u, v, e))
        nodes += new
        per_hop.append(edges)
        counts.append(len(new))
        frontier = new
    return nodes, per_hop, counts


def assert_edge_ids_name_their_edges(batch, data):
    """Each of a minibatch's edges has the id of an edge of ``data`` between the same two nodes
    (either way), and the edge attributes of that id."""
    e_id = batch.e_id.cpu()
    src, dst = batch.n_id.cpu()[batch.edge_index.cpu()]
    ends = data.edge_index[:, e_id]
    assert bool((((ends[0] == src) & (ends[1] == dst)) | ((ends[0] == dst) & (ends[1] == src))).all())
    assert torch.equal(batch.edge_attr.cpu(), data.edge_attr[e_id])


def hop_edges(batch, hop):
    """(global src, global dst, e_id) of hop ``hop``'s edges of a minibatch."""
    start = sum(batch.num_sampled_edges[:hop])
    stop = start + batch.num_sampled_edges[hop]
    src = batch.n_id[batch.edge_index[0, start:stop]]
    dst = batch.n_id[batch.edge_index[1, start:stop]]
    return list(zip(src.tolist(), dst.tolist(), batch.e_id[start:stop].tolist()))


def all_edges(batch):
    """(global src, global dst, e_id) of every edge of a minibatch."""
    src, dst = batch.n_id[batch.edge_index[0]], batch.n_id[batch.edge_index[1]]
    return list(zip(src.tolist(), dst.tolist(), batch.e_id.tolist()))


def hop_nodes(batch, hop):
    start = sum(batch.num_sampled_nodes[:hop])
    return batch.n_id[start:start + batch.num_sampled_nodes[hop]].tolist()


# --- stores --------------------------------------------------------------------------------


def test_feature_store_round_trip_and_gather(gen):
    store = FeatureStore()
    x = torch.randn(50, 4, generator=gen)
    y = torch.randint(0, 5, (50,), generator=gen)
    mask = torch.rand(50, generator=gen) < 0.5
    store.put_tensor(x, group_name=None, attr_name="x", index=None)
    store.put_tensor(y, group_name=None, attr_name="y", index=None)
    store.put_tensor(mask, group_name=None, attr_name="mask", index=None)
    names = sorted(a.attr_name for a in store.get_all_tensor_attrs())
    assert names == ["mask", "x", "y"]
    assert store.get_tensor_size(group_name=None, attr_name="x") == (50, 4)
    idx = torch.randint(0, 50, (77,), generator=gen)  # repeats allowed
    got_x, got_y, got_m = store.multi_get_tensor([(None, "x", idx), (None, "y", idx), (None, "mask", idx)])
    assert torch.equal(got_x.cpu(), x[idx]) and torch.equal(got_y.cpu(), y[idx]) and torch.equal(got_m.cpu(), mask[idx])
    assert got_m.dtype == torch.bool and got_y.shape == (77,)
    assert torch.equal(store.get_tensor(None, "x", idx.tolist()).cpu(), x[idx])
    assert torch.equal(store.get_tensor(None, "x", slice(3, 9)).cpu(), x[3:9])
    # rows written through the store land in its table
    store.put_tensor(torch.full((2, 4), 7.0), group_name=None, attr_name="x", index=torch.tensor([1, 4]))
    assert bool((store.get_tensor(None, "x", torch.tensor([4, 1])).cpu() == 7).all())
    with pytest.raises(IndexError):
        store.get_tensor(None, "x", torch.tensor([0, 50]))
    with pytest.raises(TypeError, match="index"):
        store.get_tensor(None, "x", torch.tensor([0.5]))
    assert store.remove_tensor(group_name=None, attr_name="mask", index=None)
    assert store.get_tensor_size(group_name=None, attr_name="mask") is None
    with pytest.raises(KeyError):
        store.get_tensor(None, "mask", idx)


def test_feature_store_cache_rows(gen):
    """Rows kept in the store's cache read like the table (index order, repeats), writes
    through the store reach the cache, a table put again keeps its cached ids, None drops it."""
    store = FeatureStore()
    x = torch.randn(300, 4, generator=gen)
    store.put_tensor(x, group_name=None, attr_name="x", index=None)
    rows = torch.randperm(300, generator=gen)[:60]
    store.cache_rows("x", rows)
    cache = store.cache_of("x")
    assert cache is not None and cache.cache_rows == 60 and torch.equal(cache.cached_ids, rows.sort().values)
    assert cache.device.type == ("cuda" if zc.gpu_backed() else "cpu")
    idx = torch.cat([rows[:20], torch.randint(0, 300, (50,), generator=gen)])
    assert torch.equal(store.get_tensor(None, "x", idx).cpu(), x[idx])
    store.put_tensor(torch.full((2, 4), 9.0), group_name=None, attr_name="x", index=rows[:2])
    assert bool((store.get_tensor(None, "x", rows[:2]).cpu() == 9).all())
    store.put_tensor(x.clone(), group_name=None, attr_name="x", index=None)
    assert torch.equal(store.cache_of("x").cached_ids, cache.cached_ids)
    assert torch.equal(store.get_tensor(None, "x", idx).cpu(), x[idx])
    with pytest.raises(IndexError):
        store.get_tensor(None, "x", torch.tensor([0, 300]))
    store.cache_rows("x", None)
    assert store.cache_of("x") is None
    with pytest.raises(KeyError, match="no table 'nope'"):
        store.cache_rows("nope", rows)
    with pytest.raises(IndexError, match="out of range"):
        store.cache_rows("x", torch.tensor([300]))


@pytest.mark.parametrize("policy", ["degree", "presample"])
def test_neighbor_loader_gpu_cache(small, policy):
    """``NeighborLoader(..., gpu_cache=CacheConfig(...))`` caches the chosen rows of ``x``; the
    minibatches are those of the loader without a cache."""
    seeds = torch.nonzero(small.train_mask).flatten()
    config = zc.CacheConfig(policy=zc.CachePolicy(policy), rows=100)
    torch.manual_seed(3)
    cached = list(NeighborLoader(small, num_neighbors=[5, 3], batch_size=64, input_nodes=seeds, gpu_cache=config))
    torch.manual_seed(3)
    plain_loader = NeighborLoader(small, num_neighbors=[5, 3], batch_size=64, input_nodes=seeds, gpu_cache=None)
    plain = list(plain_loader)
    loader = NeighborLoader(small, num_neighbors=[5, 3], batch_size=64, input_nodes=seeds, gpu_cache=config)
    held = loader.feature_store.cache_of("x")
    assert held is not None and held.cache_rows == 100 and plain_loader.feature_store.cache_of("x") is None
    hits = 0
    for a, b in zip(cached, plain):
        assert torch.equal(a.n_id.cpu(), b.n_id.cpu()) and torch.equal(a.x.cpu(), b.x.cpu())
        assert torch.equal(a.x.cpu(), small.x[a.n_id.cpu()])
        hits += int(torch.isin(a.n_id.cpu(), held.cached_ids).sum())
    assert hits > 0
    with pytest.raises(TypeError, match="gpu_cache must be a pytorch_zerocopy.CacheConfig"):
        NeighborLoader(small, num_neighbors=[5], batch_size=8, gpu_cache={"x": 100})
    with pytest.raises(KeyError, match="no node feature 'h'"):
        NeighborLoader(small, num_neighbors=[5], batch_size=8, gpu_cache={"h": config})


def test_feature_store_maps_host_tables_only_where_a_gpu_reads_them():
    store = FeatureStore()
    x = torch.randn(10, 3)
    store.put_tensor(x, group_name=None, attr_name="x", index=None)
    table = store.get_tensor(None, "x", None)
    assert zc.is_unified(table) == zc.gpu_backed()
    assert table.cpu().data_ptr() == x.data_ptr(), "the table must be used in place, not copied"
    cpu_store = FeatureStore(map_host_tables=False)
    cpu_store.put_tensor(x, group_name=None, attr_name="x", index=None)
    assert cpu_store.get_tensor(None, "x", None) is x


@pytest.mark.parametrize("mapped", [None, True], ids=["default", "mapped"])
def test_feature_store_refresh_refills_a_cache_after_writes(mapped):
    """Also where the table is a unified mapping of the tensor put (a GPU's default; forced on
    the CPU with ``map_host_tables``): writes to the tensor reach the cache's staleness check."""
    store = FeatureStore(map_host_tables=mapped)
    x = torch.randn(50, 3)
    store.put_tensor(x, group_name=None, attr_name="x", index=None)
    store.cache_rows("x", torch.tensor([1, 4]))
    ids = torch.tensor([4, 5])
    x.mul_(2)
    with pytest.raises(RuntimeError, match="refresh"):
        store.read_rows("x", ids)
    store.refresh("x")
    assert torch.equal(store.read_rows("x", ids).cpu(), x[ids])
    with pytest.raises(KeyError, match="no table 'h'"):
        store.refresh("h")


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["x", "y", "train_mask"])
def test_gpu_copies_refuse_reads_after_writes_to_the_data_until_refreshed(name):
    """x copied into managed memory, labels and masks into GPU memory: an in-place write to the
    Data's tensor makes the next minibatch raise; the store's refresh() copies it again."""
    # 64 features: the labels and masks are small beside them, so the loader copies them to the GPU.
    data = to_data(community_graph(num_nodes=1000, num_classes=4, avg_degree=6, feature_dim=64, seed=2))
    loader = NeighborLoader(data, [4, 3], batch_size=100, feature_placement="managed", gpu_cache=None)
    assert loader.feature_store.placement_of(name) is (Placement.MANAGED if name == "x" else Placement.GPU)
    next(iter(loader))
    data[name][:10] = data[name][:10].logical_not() if name == "train_mask" else data[name][:10] + 1
    with pytest.raises(RuntimeError, match="refresh"):
        next(iter(loader))
    loader.feature_store.refresh(name)
    batch = next(iter(loader))
    assert torch.equal(batch[name].cpu(), data[name][batch.n_id.cpu()])


def test_graph_store_layouts_and_edge_ids(gen):
    n = 30
    ei = torch.randint(0, n, (2, 200), generator=gen)
    store = GraphStore()
    store.put_edge_index((ei[0], ei[1]), edge_type=None, layout="coo", size=(n, n))
    (attr,) = store.get_all_edge_attrs()
    assert attr.layout.value == "csc" and attr.size == (n, n)
    row, colptr = store.get_edge_index(None, "csc", size=(n, n))
    assert row.dtype == colptr.dtype == torch.int64  # what PyG's own samplers take
    eids = store.edge_ids()
    col = torch.repeat_interleave(torch.arange(n), colptr[1:] - colptr[:-1])
    # position p of the CSC is edge eids[p] of the edge_index it was built from
    assert torch.equal(torch.stack([row.long(), col]), ei[:, eids])
    assert torch.equal(eids.sort().values, torch.arange(200))
    # PyG's conversions report edge ids in `perm` (what PyG's own sampler turns into e_id)
    r, c, perm = store.csc()
    assert torch.equal(perm, eids)
    r, c, perm = store.coo()
    assert torch.equal(torch.stack([r.long(), c.long()]), ei[:, perm])
    rowptr, c, perm = store.csr()
    rr = torch.repeat_interleave(torch.arange(n), rowptr[1:] - rowptr[:-1])
    assert torch.equal(torch.stack([rr, c.long()]), ei[:, perm])
    # the same graph given as a CSRGraph of out-neighbours, or as CSR arrays
    g = CSRGraph.from_coo(ei[0], ei[1], num_nodes=n)
    for other in (GraphStore(g), ):
        r2, cp2 = other.get_edge_index(None, "csc", size=(n, n))
        assert torch.equal(cp2, colptr)
        assert sorted(zip(r2.tolist(), col.tolist())) == sorted(zip(row.tolist(), col.tolist()))
    csr_store = GraphStore()
    csr_store.put_edge_index((g.indptr, g.indices), edge_type=None, layout="csr", size=(n, n))
    r3, cp3 = csr_store.get_edge_index(None, "csc", size=(n, n))
    c3 = torch.repeat_interleave(torch.arange(n), cp3[1:] - cp3[:-1])
    # edge ids are the CSR positions: they name the CSR's edges
    src = torch.repeat_interleave(torch.arange(n), g.indptr[1:] - g.indptr[:-1])
    assert torch.equal(src[csr_store.edge_ids()], r3.long()) and torch.equal(g.indices.long()[csr_store.edge_ids()], c3)
    with pytest.raises(ValueError, match="size"):
        GraphStore().put_edge_index((ei[0], ei[1]), edge_type=None, layout="coo")
    with pytest.raises(ValueError, match="outside"):
        GraphStore().put_edge_index((ei[0], ei[1]), edge_type=None, layout="coo", size=(10, 10))
    with pytest.raises(RuntimeError, match="empty"):
        GraphStore().csc_graph


def test_edges_in_csc_order_need_no_edge_ids(gen):
    """An edge_index already sorted by target is CSC order: no id table, the position is the
    edge's column, and minibatches name the same edges as through a shuffled copy."""
    n = 40
    ei = torch.randint(0, n, (2, 300), generator=gen)
    ei = ei[:, torch.sort(ei[1], stable=True).indices]
    store = GraphStore()
    store.put_edge_index((ei[0], ei[1]), edge_type=None, layout="coo", size=(n, n))
    assert store.edge_ids() is None
    row, colptr = store.get_edge_index(None, "csc", size=(n, n))
    col = torch.repeat_interleave(torch.arange(n), colptr[1:] - colptr[:-1])
    assert torch.equal(torch.stack([row.long(), col]), ei)
    shuffle = torch.randperm(ei.shape[1], generator=gen)
    x = torch.randn(n, 4, generator=gen)
    for edge_index in (ei, ei[:, shuffle]):
        data = Data(x=x, edge_index=edge_index, num_nodes=n)
        loader = NeighborLoader(data, num_neighbors=[5, 3], batch_size=8, input_nodes=torch.arange(n))
        for batch in loader:
            # e_id names each sampled edge's column in the edge_index the data was built from
            got = batch.n_id[batch.edge_index.cpu()].cpu()
            assert torch.equal(got, edge_index[:, batch.e_id.cpu()])


# --- the sampler ---------------------------------------------------------------------------


def test_full_neighbourhoods_equal_the_reference(small):
    fs, gs, _ = stores_from_data(small)
    seeds = torch.tensor([5, 900, 17, 333, 1199, 0])
    hops = sample_hops(gs.csc_graph, seeds, [-1, -1, -1])
    nodes, per_hop, counts = reference_full(small.edge_index, small.num_nodes, seeds, 3)
    assert hops.node.tolist() == nodes
    assert hops.num_sampled_nodes == counts
    assert hops.num_sampled_edges == [len(e) for e in per_hop]
    node = hops.node.cpu()
    got = list(zip(node[hops.row.cpu()].tolist(), node[hops.col.cpu()].tolist(), hops.edge.cpu().tolist()))
    assert got == [e for edges in per_hop for e in edges]


@pytest.mark.parametrize("replace", [False, True])
def test_fanouts_sample_from_each_frontier_once(small, replace):
    fs, gs, _ = stores_from_data(small)
    ei = small.edge_index
    deg = torch.bincount(ei[1], minlength=small.num_nodes)
    seeds = torch.randperm(small.num_nodes)[:40]
    fanouts = [4, 3]
    hops = sample_hops(gs.csc_graph, seeds, fanouts, replace=replace)
    node, row, col, edge = hops.node.cpu(), hops.row.cpu(), hops.col.cpu(), hops.edge.cpu()
    assert torch.equal(node[:40], seeds)
    assert node.unique().numel() == node.numel()
    # every sampled edge is the graph's edge e_id, from the neighbour to the sampling node
    assert torch.equal(ei[0, edge], node[row]) and torch.equal(ei[1, edge], node[col])
    bounds = torch.tensor([0] + hops.num_sampled_nodes).cumsum(0)
    estart = 0
    for h, f in enumerate(fanouts):
        seg = slice(estart, estart + hops.num_sampled_edges[h])
        estart = seg.stop
        frontier = torch.arange(int(bounds[h]), int(bounds[h + 1]))
        # hop h samples the nodes first reached in hop h - 1, and only those
        per_node = torch.bincount(col[seg] - int(bounds[h]), minlength=frontier.numel())
        assert int(col[seg].min()) >= int(bounds[h]) and int(col[seg].max()) < int(bounds[h + 1])
        want = torch.where(deg[node[frontier]] > 0, torch.full_like(per_node, f), 0) if replace \
            else torch.clamp(deg[node[frontier]], max=f)
        assert torch.equal(per_node, want)
        # sources are nodes reached up to this hop
        assert int(row[seg].max()) < int(bounds[h + 2])
        if not replace:
            assert len(set(edge[seg].tolist())) == seg.stop - seg.start


def random_data(gen, num_nodes, num_edges) -> Data:
    """A fresh random graph with self-loops, repeated edges and isolated nodes."""
    ei = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
    ei[:, :5] = ei[:, 5:10]  # repeated edges
    ei[1, 10:15] = ei[0, 10:15]  # self-loops
    return Data(edge_index=ei, num_nodes=num_nodes)


def check_pyg_hops(hops, edge_index, num_nodes, seeds, fanouts, replace):
    """PyG's rules, from their definition (no random draws): the nodes are the seeds, then each
    hop's new nodes in order of first appearance among its edges' sources; hop h's edges go into
    the nodes first reached in hop h - 1, each of them sampling min(fanout, in-degree) distinct
    edges (fanout with replacement, every one for -1); every edge is the graph's, e_id its
    column; the counts add up."""
    node, row, col, edge = hops.node.cpu(), hops.row.cpu(), hops.col.cpu(), hops.edge.cpu()
    deg = torch.bincount(edge_index[1], minlength=num_nodes)
    assert torch.equal(node[:seeds.numel()], seeds)
    assert node.unique().numel() == node.numel()
    assert sum(hops.num_sampled_nodes) == node.numel() and sum(hops.num_sampled_edges) == edge.numel()
    assert len(hops.num_sampled_nodes) == len(fanouts) + 1 and len(hops.num_sampled_edges) == len(fanouts)
    assert torch.equal(edge_index[0, edge], node[row]) and torch.equal(edge_index[1, edge], node[col])
    bounds = torch.tensor([0] + hops.num_sampled_nodes).cumsum(0).tolist()
    estart = 0
    for h, f in enumerate(fanouts):
        seg = slice(estart, estart + hops.num_sampled_edges[h])
        estart = seg.stop
        frontier = node[bounds[h]:bounds[h + 1]]
        per_node = torch.bincount(col[seg] - bounds[h], minlength=frontier.numel())
        assert per_node.numel() == frontier.numel()
        assert seg.stop == seg.start or (int(col[seg].min()) >= bounds[h] and int(col[seg].max()) < bounds[h + 1])
        d = deg[frontier]
        want = d if f == -1 else (torch.where(d > 0, torch.full_like(d, f), 0) if replace else d.clamp(max=f))
        assert torch.equal(per_node, want)
        if not replace or f == -1:
            assert edge[seg].unique().numel() == seg.stop - seg.start
        new, seen = [], set(node[:bounds[h + 1]].tolist())
        for u in node[row[seg]].tolist():
            if u not in seen:
                seen.add(u)
                new.append(u)
        assert node[bounds[h + 1]:bounds[h + 2]].tolist() == new


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("fanouts", [[-1, -1, -1], [5, 3], [2, -1, 4], [0, 3], [6]])
def test_hops_on_fresh_random_graphs(gen, replace, fanouts):
    """PyG's rules on a fresh random graph; with every neighbour, exactly the reference."""
    data = random_data(gen, 600, 2400)
    _, gs, _ = stores_from_data(data, placement="cpu")
    seeds = torch.randperm(600, generator=gen)[:25]
    hops = sample_hops(gs.csc_graph, seeds, fanouts, replace=replace, seed=int(torch.randint(0, 2**62, (1,))))
    check_pyg_hops(hops, data.edge_index, 600, seeds, fanouts, replace)
    if all(f == -1 for f in fanouts):
        nodes, per_hop, counts = reference_full(data.edge_index, 600, seeds, len(fanouts))
        assert hops.node.tolist() == nodes and hops.num_sampled_nodes == counts
        got = list(zip(hops.node[hops.row].tolist(), hops.node[hops.col].tolist(), hops.edge.tolist()))
        assert got == [e for edges in per_hop for e in edges]


def test_hops_follow_the_seed(small):
    """One seed, one sample: the same hops again, other hops for another seed, and the hop stage
    of the process way packs the very sample sample_hops takes."""
    from types import SimpleNamespace

    from pytorch_zerocopy.pyg.sampler import HopStage

    _, gs, _ = stores_from_data(small, placement="cpu")
    seeds = torch.randperm(small.num_nodes)[:64]
    a = sample_hops(gs.csc_graph, seeds, [5, 4, 3], seed=123)
    b = sample_hops(gs.csc_graph, seeds, [5, 4, 3], seed=123)
    c = sample_hops(gs.csc_graph, seeds, [5, 4, 3], seed=124)
    for t in ("node", "row", "col", "edge"):
        assert torch.equal(getattr(a, t), getattr(b, t))
    assert not torch.equal(a.edge, c.edge)
    blocks = HopStage([5, 4, 3], False).start(gs.csc_graph, seeds, None, SimpleNamespace(sample_seed=123)).result()
    want = a.blocks()
    assert len(blocks) == len(want) == 3
    for x, y in zip(blocks, want):
        assert (x.num_src, x.num_dst) == (y.num_src, y.num_dst)
        assert torch.equal(x.src, y.src) and torch.equal(x.dst, y.dst) and torch.equal(x.eids, y.eids)
    assert torch.equal(blocks[0].nodes, a.node)


def test_empty_frontier_and_isolated_seeds():
    ei = torch.tensor([[1, 2], [0, 0]])  # 1 -> 0, 2 -> 0; nodes 3, 4 isolated
    data = Data(x=torch.randn(5, 2), edge_index=ei, num_nodes=5)
    fs, gs, _ = stores_from_data(data)
    hops = sample_hops(gs.csc_graph, torch.tensor([3, 0]), [-1, -1, 2])
    assert hops.node.tolist() == [3, 0, 1, 2]
    assert hops.num_sampled_nodes == [2, 2, 0, 0] and hops.num_sampled_edges == [2, 0, 0]


# --- the loader ----------------------------------------------------------------------------


def test_minibatches_equal_the_reference_with_every_neighbour(small):
    seeds = torch.nonzero(small.train_mask).flatten()
    loader = NeighborLoader(small, num_neighbors=[-1, -1], batch_size=37, input_nodes=small.train_mask)
    assert len(loader) == -(-seeds.numel() // 37)
    for b, batch in enumerate(loader):
        want_seeds = seeds[b * 37:(b + 1) * 37]
        nodes, per_hop, counts = reference_full(small.edge_index, small.num_nodes, want_seeds, 2)
        assert batch.batch_size == want_seeds.numel()
        assert torch.equal(batch.input_id.cpu(), want_seeds)  # a mask's input ids are the node ids
        assert batch.n_id.tolist() == nodes
        assert batch.num_sampled_nodes == counts and batch.num_sampled_edges == [len(e) for e in per_hop]
        for h in range(2):
            assert hop_edges(batch, h) == per_hop[h]
        n_id, e_id = batch.n_id.cpu(), batch.e_id.cpu()
        assert batch.num_nodes == len(nodes)
        assert torch.equal(batch.x.cpu(), small.x[n_id]) and torch.equal(batch.y.cpu(), small.y[n_id])
        assert torch.equal(batch.train_mask.cpu(), small.train_mask[n_id])
        assert torch.equal(batch.edge_attr.cpu(), small.edge_attr[e_id])
        assert batch.num_classes == small.num_classes
        assert "edge_index" in batch and batch.edge_index.dtype == torch.int64


def test_a_minibatch_moves_to_its_own_device_at_once(small, monkeypatch):
    """A minibatch is PyG's Data (a DeviceData) whose to() its own device returns it without
    PyG's visit of every attribute; a tensor elsewhere in it (also in a list), attribute names
    or another device take PyG's to, which moves what it holds."""
    from pytorch_zerocopy.pyg import DeviceData

    batch = next(iter(NeighborLoader(small, [2], batch_size=8)))
    assert isinstance(batch, Data) and type(batch) is DeviceData
    dev = batch.x.device
    assert batch.to(dev) is batch and batch.to(dev.type, non_blocking=True) is batch
    visits = []
    monkeypatch.setattr(Data, "to", lambda self, *args, **kwargs: visits.append(args) or self)
    for device in (dev, str(dev), dev.type):
        assert batch.to(device) is batch
    assert visits == []
    batch.to(dev, "x")
    batch.to("meta")
    batch.to(object())  # not a device: PyG's to says so
    batch.extra = [torch.zeros(1, device="meta")]
    batch.to(dev)
    assert [args[0] for args in visits] == [dev, "meta", visits[2][0], dev] and visits[0][1:] == ("x",)
    monkeypatch.undo()
    moved = batch.to("meta")
    assert moved is batch and batch.x.device.type == "meta" and batch.extra[0].device.type == "meta"


def test_same_attributes_as_pygs_loader(small):
    """The keys and types PyG's own loader puts in a minibatch, from PyG's filter path with a
    reference sampler (PyG's own sampling needs pyg-lib or torch-sparse)."""
    ours = next(iter(NeighborLoader(small, [-1, -1], batch_size=16)))
    theirs = next(iter(NodeLoader(small, ReferenceSampler(small, [-1, -1]), batch_size=16)))
    assert sorted(ours.keys()) == sorted(theirs.keys())
    for key in theirs.keys():
        a, b = ours[key], theirs[key]
        assert type(a) is type(b), key
        if isinstance(a, torch.Tensor):
            assert a.dtype == b.dtype and a.shape == b.shape, key
            if key not in ("edge_index",):
                assert torch.equal(a.cpu(), b), key
        else:
            assert a == b, key


@pytest.mark.skipif(not PYG_CAN_SAMPLE, reason="PyG's own NeighborLoader needs pyg-lib or torch-sparse to sample")
@pytest.mark.parametrize("as_stores", [False, True])
def test_subgraphs_equal_pygs_own_loader_with_every_neighbour(small, as_stores):
    theirs = PygNeighborLoader(small, num_neighbors=[-1, -1], batch_size=50, input_nodes=small.val_mask)
    data = small if not as_stores else stores_from_data(small)[:2]
    ours = NeighborLoader(data, num_neighbors=[-1, -1], batch_size=50, input_nodes=small.val_mask)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.batch_size == b.batch_size and torch.equal(a.input_id.cpu(), b.input_id)
        assert torch.equal(a.n_id[:a.batch_size].cpu(), b.n_id[:b.batch_size])
        if "num_sampled_nodes" not in b:  # PyG over torch-sparse alone keeps no per-hop counts
            assert set(a.n_id.tolist()) == set(b.n_id.tolist())
            assert Counter(all_edges(a)) == Counter(all_edges(b))
            continue
        assert a.num_sampled_nodes == list(b.num_sampled_nodes)
        assert a.num_sampled_edges == list(b.num_sampled_edges)
        for h in range(3):
            assert set(hop_nodes(a, h)) == set(hop_nodes(b, h))
        for h in range(2):
            assert Counter(hop_edges(a, h)) == Counter(hop_edges(b, h))


@pytest.mark.skipif(not PYG_CAN_SAMPLE, reason="PyG's own NeighborLoader needs pyg-lib or torch-sparse to sample")
def test_pygs_own_loader_reads_our_stores(small):
    fs, gs, _ = stores_from_data(small)
    theirs = PygNeighborLoader((fs, gs), num_neighbors=[-1], batch_size=64, input_nodes=torch.arange(64))
    batch = next(iter(theirs))
    assert torch.equal(batch.x.cpu(), small.x[batch.n_id.cpu()])
    src, dst = batch.n_id[batch.edge_index[0]], batch.n_id[batch.edge_index[1]]
    assert torch.equal(small.edge_index[:, batch.e_id], torch.stack([src, dst]))


def test_store_pair_input_and_foreign_graph_store(small):
    fs, gs, _ = stores_from_data(small)
    batch = next(iter(NeighborLoader((fs, gs), [3, 2], batch_size=20, input_nodes=torch.arange(100, 140))))
    assert batch.batch_size == 20 and torch.equal(batch.n_id[:20].cpu(), torch.arange(100, 120))
    assert torch.equal(batch.x.cpu(), small.x[batch.n_id.cpu()])
    assert "edge_attr" not in batch  # a store pair holds node tables only, as in PyG
    # a PyG graph store that is not ours: Data is one
    batch = next(iter(NeighborLoader((fs, small), [-1], batch_size=8)))
    src, dst = batch.n_id[batch.edge_index[0]].cpu(), batch.n_id[batch.edge_index[1]].cpu()
    assert torch.equal(small.edge_index[:, batch.e_id.cpu()], torch.stack([src, dst]))


def test_shuffle_transform_and_drop_last(small):
    torch.manual_seed(0)
    seen = []
    calls = []

    def transform(b):
        calls.append(b.batch_size)
        return b

    loader = NeighborLoader(small, [2, 2], batch_size=100, shuffle=True, drop_last=True, transform=transform)
    for batch in loader:
        seen.append(batch.input_id.cpu())
    seen = torch.cat(seen)
    assert seen.numel() == (small.num_nodes // 100) * 100 == sum(calls)
    assert seen.unique().numel() == seen.numel() and not torch.equal(seen, torch.arange(seen.numel()))


def test_bidirectional_subgraph(small):
    batch = next(iter(NeighborLoader(small, [3, 2], batch_size=30, subgraph_type="bidirectional")))
    pairs = set(zip(batch.edge_index[0].tolist(), batch.edge_index[1].tolist()))
    assert all((v, u) in pairs for u, v in pairs)


def test_unsupported_options_raise_clearly(small):
    with pytest.raises(NotImplementedError, match="temporal"):
        NeighborLoader(small, [2], time_attr="t")
    with pytest.raises(NotImplementedError, match="weight_attr"):
        NeighborLoader(small, [2], weight_attr="w")
    with pytest.raises(NotImplementedError, match="disjoint"):
        NeighborLoader(small, [2], disjoint=True)
    with pytest.raises(NotImplementedError, match="induced"):
        NeighborLoader(small, [2], subgraph_type="induced")
    with pytest.raises(NotImplementedError, match="heterogeneous"):
        NeighborLoader(small, {("a", "to", "b"): [2]})
    with pytest.raises(ValueError, match="num_neighbors"):
        NeighborLoader(small, [2, -3])
    with pytest.raises(ValueError, match="num_neighbors"):
        NeighborLoader(small, [])
    for not_a_list in (10, None, "ten", "10,10"):  # an int is not iterable, and a string's characters are no fanouts
        with pytest.raises(TypeError) as info:
            NeighborLoader(small, num_neighbors=not_a_list)
        assert str(info.value) == ("num_neighbors must be a list of fanouts, one per hop (e.g. [10, 10]), "
                                   f"got {not_a_list!r}")
    with pytest.raises(TypeError, match="Data"):
        NeighborLoader(torch.zeros(3), [2])
    with pytest.raises(IndexError):
        next(iter(NeighborLoader(small, [2], batch_size=2, input_nodes=torch.tensor([0, small.num_nodes]))))
    with pytest.warns(UserWarning, match="num_workers"):
        loader = NeighborLoader(small, [2], batch_size=8, num_workers=2, persistent_workers=True)
    assert loader.num_workers == 0 and next(iter(loader)).batch_size == 8


# --- the process way (pipeline=True) ----------------------------------------------------------


def assert_same_minibatch(a, b, skip=()):
    """Every attribute of two minibatches but ``skip``, equal (tensors on the CPU)."""
    assert sorted(a.keys()) == sorted(b.keys())
    for key in b.keys():
        if key in skip:
            continue
        if isinstance(b[key], torch.Tensor):
            assert a[key].dtype == b[key].dtype and torch.equal(a[key].cpu(), b[key].cpu()), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("cut", [dict(batch_size=100, shuffle=True), dict(batch_size=64, shuffle=True, drop_last=True),
                                 dict(batch_size=64, shuffle=False)])
def test_process_way_yields_the_in_process_minibatches(small, cut):
    """pipeline=True: the minibatches of the in-process loader (the same seeds and samples drawn
    from torch's generator, every attribute; batches cut as torch's batch sampler cuts them, a
    partial last one kept or dropped), epoch after epoch from the same processes; x, gathered by
    the producer process, is the table at n_id."""
    kwargs = dict(num_neighbors=[4, 3], input_nodes=small.train_mask, **cut)
    torch.manual_seed(5)
    with NeighborLoader(small, pipeline=True, **kwargs) as loader:
        got = [list(loader) for _ in range(2)]
        pids = loader.processes.sup.pids()
        # Labels and masks come packed with the minibatch (on a GPU the producer reads them from
        # copies in GPU memory): this process reads none of them itself.
        assert {"y", "train_mask", "val_mask", "test_mask"} <= set(loader._carried.names)
        assert all(loader.feature_store.placement_of(t) is None for t in ("y", "train_mask"))
    torch.manual_seed(5)
    here = NeighborLoader(small, **kwargs)
    want = [list(here) for _ in range(2)]
    # A sampler process on the CPU; on a GPU the producer samples (the plan starts no sampler).
    samplers = loader.processes.plan.sampler_processes
    assert set(pids) == ({"sampler0", "producer1"} if samplers else {"producer0"}) and samplers in (0, 1)
    assert [len(e) for e in got] == [len(e) for e in want] == [len(loader)] * 2
    assert torch.equal(got[0][0].input_id, got[1][0].input_id) != cut["shuffle"]  # reshuffled, or in order
    assert int(small.train_mask.sum()) % cut["batch_size"]  # a partial last batch, kept or dropped
    for a, b in zip(got[0] + got[1], want[0] + want[1]):
        assert_same_minibatch(a, b)
        assert torch.equal(a.x.cpu(), small.x[a.n_id.cpu()])  # x (and n_id) are on the GPU where one is
        assert max(a.num_sampled_edges) > 0


def test_carried_tables_pack_and_unpack_every_dtype_and_shape():
    """What the sampling role packs of the node tables (int64, as one tensor) and the training
    process unpacks: each table's rows at the nodes, in its own dtype and row shape, whatever
    order the tables come in; every value kept (extremes of each dtype included)."""
    from pytorch_zerocopy.pyg.sampler import CarriedTables

    gen = torch.Generator().manual_seed(11)
    n = 50
    tables = {
        "mask": torch.rand(n, generator=gen) < 0.5,
        "y": torch.randint(-(1 << 62), 1 << 62, (n,), generator=gen),
        "pair": torch.randint(-(1 << 31), (1 << 31) - 1, (n, 2), generator=gen, dtype=torch.int32),
        "tiles": torch.randint(0, 256, (n, 2, 3), generator=gen).to(torch.uint8),
        "other_mask": torch.rand(n, generator=gen) < 0.2,
    }
    tables["pair"][0] = torch.tensor([-(1 << 31), (1 << 31) - 1], dtype=torch.int32)
    carried = CarriedTables([(name, t.share_memory_()) for name, t in tables.items()])
    assert carried.width == 1 + 1 + 2 + 6 + 1
    nodes = torch.randint(0, n, (37,), generator=gen)
    packed = carried.read(nodes)
    # bytes per dtype, each run padded to whole int64s: int64 37, int32 37 * 2 * 4 B, uint8 37 * 6, bools 37 * 2
    assert packed.dtype == torch.int64 and packed.numel() == carried.words(37) == 37 + 37 + 28 + 10
    assert not packed[-10:].view(torch.uint8)[74:].any()  # the padding: zeros, not whatever the memory held
    assert carried.run_words(37) == [37, 37, 28, 10]
    got = carried.unpack(torch.cat([torch.full((5,), -7), packed])[5:].split(carried.run_words(37)), 37)
    assert sorted(got) == sorted(tables)
    for name, t in tables.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t[nodes]), name
    with pytest.raises(ValueError, match="one per dtype"):
        carried.unpack([packed], 37)
    with pytest.raises(ValueError, match="shared memory"):
        CarriedTables([("y", torch.arange(4))])


def test_process_way_carries_integer_tables_and_reads_the_others_here(small):
    """Node tables of every kind reach the minibatch as in-process: integer and bool ones packed
    by the sampling role, a float one read in this process; edge tables by e_id."""
    data = small.clone()
    gen = torch.Generator().manual_seed(2)
    data.weight = torch.rand(data.num_nodes, generator=gen)  # float: read here
    data.code = torch.randint(-5, 5, (data.num_nodes, 3), generator=gen, dtype=torch.int32)
    kwargs = dict(num_neighbors=[3, 2], batch_size=64, input_nodes=data.train_mask, shuffle=True)
    torch.manual_seed(9)
    with NeighborLoader(data, pipeline=True, **kwargs) as loader:
        names = set(loader._carried.names)
        assert {"y", "train_mask", "val_mask", "test_mask"} <= names and "weight" not in names
        # On a GPU only tables that fit a side table's share of x's bytes are carried; code does not.
        assert ("code" in names) == (loader.device.type == "cpu"), names
        got = list(loader)
    torch.manual_seed(9)
    want = list(NeighborLoader(data, **kwargs))
    assert len(got) == len(want) > 1
    for a, b in zip(got, want):
        assert_same_minibatch(a, b)
        assert a.code.dtype == torch.int32 and a.code.shape == (a.num_nodes, 3)
        assert torch.equal(a.weight.cpu(), data.weight[a.n_id.cpu()])


def test_process_way_refuses_tables_written_after_its_processes_started(small):
    """The roles read x and the carried tables from copies made when they start: a write
    before the first epoch is seen; one after it makes the next minibatch raise, naming the
    table, rather than mix old rows with new."""
    data = small.clone()
    with NeighborLoader(data, [2], batch_size=100, pipeline=True) as loader:
        data.y[:] = 3  # before the processes start: read as written
        first = next(iter(loader))
        assert bool((first.y == 3).all())
        data.y[0] = 4
        with pytest.raises(RuntimeError, match="table 'y' was written in place after the loader's processes started"):
            next(iter(loader))
    with NeighborLoader(data, [2], batch_size=100, pipeline=True) as loader:
        assert len(list(loader)) == len(loader)
        data.x.add_(1)
        with pytest.raises(RuntimeError, match="table 'x' was written"):
            list(loader)


def test_process_way_leaves_nothing_behind_after_an_early_break(small):
    """Leaving an epoch early drains it (the next epoch is whole); a collected loader ends its
    processes: no process, shared-memory segment or file descriptor is left."""
    import psutil

    # A first loader moves the data's tables into shared memory, in place (their descriptors are
    # the data's from then on), and starts this process's sharer of descriptors: before counting.
    with NeighborLoader(small, [3, 2], batch_size=50, pipeline=True) as first:
        next(iter(first))
    del first
    gc.collect()
    before, fds = snapshot(), psutil.Process().num_fds()
    loader = NeighborLoader(small, [3, 2], batch_size=50, pipeline=True)
    it = iter(loader)
    next(it)
    pids = loader.processes.sup.pids()
    del it
    assert len(list(loader)) == len(loader)
    for i, batch in enumerate(loader):
        if i == 2:
            break
    del loader, batch
    gc.collect()
    _assert_nothing_left(pids, before)
    assert psutil.Process().num_fds() <= fds


def test_process_way_failure_ends_every_role(small):
    """A role that dies raises PipelineError in the training loop, naming it, and the other
    roles are ended."""
    before = snapshot()
    # partition "none": on a GPU with MPS, partition 'auto' picks 'mps', which this process (no MPS client) refuses
    plan = make_plan("zerocopy", "none", fanouts=(2, 3), batch_size=50,
                     inject_failure=InjectedFailure("producer", "kill", 2))
    loader = NeighborLoader(small, [3, 2], batch_size=50, pipeline=plan)
    pids = {}
    with pytest.raises(PipelineError, match="producer"):
        for _ in loader:
            pids = pids or loader.processes.sup.pids()
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(loader))
    del loader  # its in-process stores map x for the GPU (registrations) while it lives
    _assert_nothing_left(pids, before)


def test_process_way_bad_arguments(small):
    with pytest.raises(TypeError, match="pipeline must be True, False or a pytorch_zerocopy.pipeline.Plan"):
        NeighborLoader(small, [2], pipeline="processes")
    with pytest.raises(PlanError, match="gather_in must be 'producer'"):
        NeighborLoader(small, [2], pipeline=make_plan("cpu"))
    with pytest.raises(TypeError, match="gpu_cache is the plan's cache of x"):
        NeighborLoader(small, [2], pipeline=True, gpu_cache={"x": zc.CacheConfig(rows=10)})
    no_x = Data(edge_index=small.edge_index, y=small.y, num_nodes=small.num_nodes)
    with pytest.raises(ValueError, match="node feature table 'x'"):
        NeighborLoader(no_x, [2], pipeline=True)
    with NeighborLoader(small, [2], batch_size=100, pipeline=True) as loader:
        with pytest.raises(TypeError, match="a loader's epoch is an EpochBatches, got list"):
            loader.processes.epoch([])
        first = iter(loader)
        next(first)
        with pytest.raises(RuntimeError, match="one epoch at a time"):
            next(iter(loader))
    with pytest.raises(RuntimeError, match="closed"):
        next(first)
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(loader))


@pytest.mark.parametrize("pipeline", [False, True])
def test_stage_times_cover_every_minibatch(small, pipeline):
    with NeighborLoader(small, [3, 2], batch_size=100, pipeline=pipeline) as loader:
        loader.stage_times = StageTimes()
        n = len(list(loader))
    summary = loader.stage_times.summary()
    for stage in ("sample", "gather", "build") + (("deliver",) if pipeline else ()):
        assert summary[stage]["n"] == n and summary[stage]["mean"] > 0, (stage, summary)


# --- training ------------------------------------------------------------------------------


class ReferenceSampler(BaseSampler):
    """Uniform neighbour sampling without replacement in PyG's layout, in plain torch (the
    reference loader's sampler where PyG cannot sample by itself)."""

    def __init__(self, data, fanouts):
        n = data.num_nodes
        order = torch.sort(data.edge_index[1], stable=True).indices
        self.row = data.edge_index[0, order]
        self.eid = order
        self.colptr = torch.zeros(n + 1, dtype=torch.long)
        self.colptr[1:] = torch.cumsum(torch.bincount(data.edge_index[1], minlength=n), 0)
        self.fanouts = fanouts

    def sample_from_nodes(self, index, **kwargs):
        nodes = index.node.tolist()
        local = {v: i for i, v in enumerate(nodes)}
        rows, cols, edges, n_nodes, n_edges = [], [], [], [len(nodes)], []
        start = 0
        for f in self.fanouts:
            stop, count = len(nodes), 0
            for v in nodes[start:stop]:
                lo, hi = int(self.colptr[v]), int(self.colptr[v + 1])
                pos = torch.arange(lo, hi)
                if 0 <= f < pos.numel():
                    pos = pos[torch.randperm(pos.numel())[:f]]
                for p in pos.tolist():
                    u = int(self.row[p])
                    if u not in local:
                        local[u] = len(nodes)
                        nodes.append(u)
                    rows.append(local[u])
                    cols.append(local[v])
                    edges.append(int(self.eid[p]))
                    count += 1
            n_nodes.append(len(nodes) - stop)
            n_edges.append(count)
            start = stop
        t = lambda x: torch.tensor(x, dtype=torch.long)  # noqa: E731
        return SamplerOutput(node=t(nodes), row=t(rows), col=t(cols), edge=t(edges), num_sampled_nodes=n_nodes,
                             num_sampled_edges=n_edges, metadata=(index.input_id, index.time))

    def sample_from_edges(self, index, neg_sampling=None):
        raise NotImplementedError


def batch_device(loader) -> torch.device:
    """Where ``loader``'s minibatches are built: ours on the GPU where one serves unified
    tensors (the sampler and the feature store work there), PyG's on the CPU."""
    if isinstance(loader, NeighborLoader):
        return loader.graph_store.csc_graph.indptr.device
    return torch.device("cpu")


def train_and_test(loader_for, data, epochs=4, seed=0):
    """PyG's GraphSAGE trained as PyG's example trains it, on the device the loader builds its
    minibatches on (the same initial weights wherever); returns test accuracy."""
    torch.manual_seed(seed)
    model = GraphSAGE(data.num_features, 64, num_layers=2, out_channels=data.num_classes)
    model = model.to(batch_device(loader_for(data.train_mask, True)))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(epochs):
        model.train()
        for batch in loader_for(data.train_mask, True):
            opt.zero_grad()
            # Trimmed per layer where the loader gives per-hop counts (PyG's own loader over
            # torch-sparse alone gives none).
            hops = dict(num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                        num_sampled_edges_per_hop=batch.num_sampled_edges) if "num_sampled_nodes" in batch else {}
            out = model(batch.x, batch.edge_index, **hops)[:batch.batch_size]
            F.cross_entropy(out, batch.y[:batch.batch_size]).backward()
            opt.step()
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in loader_for(data.test_mask, False):
            pred = model(batch.x, batch.edge_index)[:batch.batch_size].argmax(-1)
            correct += int((pred == batch.y[:batch.batch_size]).sum())
            total += batch.batch_size
    return correct / total


@pytest.fixture(scope="module")
def learnable():
    return to_data(community_graph(num_nodes=5000, num_classes=8, avg_degree=10, feature_dim=32, seed=11),
                   torch.Generator().manual_seed(1))


def test_graphsage_reaches_the_same_accuracy_band(learnable):
    fanouts = [10, 5]

    def ours(mask, shuffle):
        return NeighborLoader(learnable, fanouts, batch_size=128, input_nodes=mask, shuffle=shuffle)

    def reference(mask, shuffle):
        if PYG_CAN_SAMPLE:
            return PygNeighborLoader(learnable, fanouts, batch_size=128, input_nodes=mask, shuffle=shuffle)
        return NodeLoader(learnable, ReferenceSampler(learnable, fanouts), input_nodes=mask, batch_size=128,
                          shuffle=shuffle)

    acc_ours = train_and_test(ours, learnable)
    acc_ref = train_and_test(reference, learnable)
    # Without neighbours (num_neighbors=[0, 0]) this model scores ~0.35 here; with them ~0.82.
    assert acc_ours > 0.75 and acc_ref > 0.75, (acc_ours, acc_ref)
    assert abs(acc_ours - acc_ref) < 0.05, (acc_ours, acc_ref)


def test_trim_to_layer_changes_nothing_for_the_seeds(small):
    torch.manual_seed(0)
    loader = NeighborLoader(small, [4, 3], batch_size=64)
    model = GraphSAGE(small.num_features, 16, num_layers=2, out_channels=8).to(batch_device(loader)).eval()
    for batch in loader:
        assert batch.x.device == batch_device(loader)
        full = model(batch.x, batch.edge_index)[:batch.batch_size]
        trimmed = model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                        num_sampled_edges_per_hop=batch.num_sampled_edges)[:batch.batch_size]
        torch.testing.assert_close(trimmed, full)


@pytest.mark.cuda
def test_gpu_samples_and_gathers_from_host_memory(small):
    if not zc.gpu_backed():
        pytest.skip("this build serves unified tensors on the CPU")
    loader = NeighborLoader(small, num_neighbors=[-1, -1], batch_size=64, input_nodes=small.train_mask)
    assert zc.is_unified(loader.graph_store.csc_graph.indices)
    assert zc.is_unified(loader.feature_store.get_tensor(None, "x", None))
    seeds = torch.nonzero(small.train_mask).flatten()
    for b, batch in enumerate(loader):
        for key in ("x", "y", "edge_index", "n_id", "e_id", "input_id", "edge_attr"):
            assert batch[key].device.type == "cuda", key
        nodes, per_hop, counts = reference_full(small.edge_index, small.num_nodes, seeds[b * 64:(b + 1) * 64], 2)
        assert batch.n_id[:batch.batch_size].tolist() == nodes[:batch.batch_size]
        assert batch.num_sampled_nodes == counts
        bounds = [0, counts[0], counts[0] + counts[1], len(nodes)]
        for h in range(3):
            assert set(hop_nodes(batch, h)) == set(nodes[bounds[h]:bounds[h + 1]])
        for h in range(2):
            assert Counter(hop_edges(batch, h)) == Counter(per_hop[h])
        assert torch.equal(batch.x.cpu(), small.x[batch.n_id.cpu()])
        assert torch.equal(batch.edge_attr.cpu(), small.edge_attr[batch.e_id.cpu()])
    with pytest.warns(UserWarning, match="pin_memory"):
        loader = NeighborLoader(small, [5, 5], batch_size=256, pin_memory=True)
    batch = next(iter(loader))
    model = GraphSAGE(small.num_features, 32, num_layers=2, out_channels=8).cuda()
    out = model(batch.x, batch.edge_index, num_sampled_nodes_per_hop=batch.num_sampled_nodes,
                num_sampled_edges_per_hop=batch.num_sampled_edges)
    F.cross_entropy(out[:batch.batch_size], batch.y[:batch.batch_size]).backward()


@pytest.mark.cuda
@pytest.mark.parametrize("placement", ["unified", "cuda"])
def test_gpu_hops_equal_the_cpus_and_wait_once(small, placement, capfd):
    """The GPU takes the CPU's sample for the same seed, with one host synchronisation (the hop
    stage none: its result waits)."""
    from types import SimpleNamespace

    from test_sampling import count_syncs

    from pytorch_zerocopy.pyg.sampler import HopStage

    if placement == "unified" and not zc.gpu_backed():
        pytest.skip("this build serves unified tensors on the CPU")
    csc = stores_from_data(small, placement="cpu")[1].csc_graph
    graph = GraphStore.from_csc(csc, placement).csc_graph
    seeds = torch.randperm(small.num_nodes)[:256]
    for fanouts in ([10, 5], [4, 3, 2], [-1, 3]):
        want = sample_hops(csc, seeds, fanouts, seed=77)
        got = sample_hops(graph, seeds.cuda(), fanouts, seed=77)
        assert got.node.is_cuda
        for t in ("node", "row", "col", "edge"):
            assert torch.equal(getattr(got, t).cpu(), getattr(want, t)), (fanouts, t)
        assert got.num_sampled_nodes == want.num_sampled_nodes and got.num_sampled_edges == want.num_sampled_edges
    gpu_seeds = seeds.cuda()
    sample_hops(graph, gpu_seeds, [15, 10], seed=1)  # warm-up
    _, syncs = count_syncs(capfd, lambda: sample_hops(graph, gpu_seeds, [15, 10], seed=2))
    assert syncs == 1
    _, syncs = count_syncs(capfd, lambda: sample_hops(graph, gpu_seeds, [15, 10, 5], seed=2))
    assert syncs == 1
    batch = SimpleNamespace(sample_seed=3)
    pending, syncs = count_syncs(capfd, lambda: HopStage([15, 10], False).start(graph, gpu_seeds, None, batch))
    assert syncs == 0
    want = sample_hops(graph, gpu_seeds, [15, 10], seed=3).blocks()
    for x, y in zip(pending.result(), want, strict=True):
        assert (x.num_src, x.num_dst) == (y.num_src, y.num_dst)
        assert torch.equal(x.src, y.src) and torch.equal(x.dst, y.dst) and torch.equal(x.eids, y.eids)


def test_benchmark_quick_mode(tmp_path):
    """benchmarks/pyg_loader.py --quick: the GPU benchmark's code path, small, on this machine."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "pyg_loader.py"), "--quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((tmp_path / "pyg_loader.json").read_text())
    bars, modes = result["bars"], result["modes"]
    assert bars["pyg_own_loader_measured"] == PYG_CAN_SAMPLE
    assert bars["on_gpu"] is torch.cuda.is_available()
    assert set(modes) >= {"pyg", "pyg_pipeline", "dgl", "dgl_pipeline", "cpu_dma", "tuned_cpu"}
    assert not [name for name, m in modes.items() if "error" in m] and "error" not in result["pipeline"]
    for bar in ("pyg_loader_over_pipeline", "dgl_loader_over_pipeline", "pyg_train_over_max_stage",
                "pyg_speedup_over_tuned_cpu_loader"):
        assert bars[bar] > 0, bar
    assert set(modes["pyg_pipeline"]["stages_ms"]) == {"sample", "gather", "build", "deliver"}
    assert len(modes["pyg_pipeline"]["deliver_ms_all"]) == modes["pyg_pipeline"]["train"]["batches"]
    assert (tmp_path / "pyg_loader.md").read_text().startswith("# PyG and DGL loaders against the pipeline")


def test_benchmark_runs_the_variants_asked_for_beside_the_rows(tmp_path):
    """--variants rows run whatever --rows names, each compared with the step alone."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "pyg_loader.py"), "--quick", "--out", str(tmp_path),
                        "--rows", "pyg_pipeline", "--variants", "depth2:queue_depth=2"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    result = json.loads((tmp_path / "pyg_loader.json").read_text())
    assert set(result["modes"]) == {"pyg_pipeline", "pyg_pipeline_v_depth2"}
    assert result["bars"]["pyg_pipeline_v_depth2_train_over_max_stage"] > 0


# --- reading x as the plan does; one minibatch ahead ------------------------------------------


def test_first_hop_needs_no_compaction(small):
    """A one-layer block's nodes already are the compaction of its seeds and neighbours (seeds
    first): compacting them again changes nothing."""
    from pytorch_zerocopy.sampling import compact, sample_layers

    graph = GraphStore.from_csc(stores_from_data(small, placement="cpu")[1].csc_graph, "cpu").csc_graph
    seeds = torch.randperm(small.num_nodes)[:50]
    (block,) = sample_layers(graph, seeds, [4], edge_dir="out", seed=11)
    reached, position = compact(seeds.long(), block.nodes[block.num_dst:])
    assert torch.equal(reached, block.nodes)
    assert torch.equal(position, torch.arange(block.num_dst, block.num_src))


def test_cache_argument_is_parsed_once():
    from pytorch_zerocopy.feature_table import CachePolicy, loader_cache

    assert loader_cache("10%") == zc.CacheConfig(policy=CachePolicy.PRESAMPLE, fraction=0.1)
    assert loader_cache(" 2.5% ").fraction == pytest.approx(0.025)
    assert loader_cache(300) == zc.CacheConfig(policy=CachePolicy.PRESAMPLE, rows=300)
    assert loader_cache(None) is None and loader_cache("auto") == "auto"
    config = zc.CacheConfig(rows=5)
    assert loader_cache(config) is config
    for bad in ("ten", "150%", "-1%", -1, True, 1.5, ["x"]):
        with pytest.raises(ValueError, match="gpu_cache must be 'auto', None"):
            loader_cache(bad)


@pytest.mark.skipif(zc.gpu_backed(), reason="what the loader does where sampling runs on the CPU")
def test_cpu_loader_keeps_its_reading_and_refuses_placements(small):
    torch.manual_seed(3)
    default = list(NeighborLoader(small, [4, 3], batch_size=128, shuffle=True))
    torch.manual_seed(3)
    uncached = NeighborLoader(small, [4, 3], batch_size=128, shuffle=True, gpu_cache=None)
    assert uncached.feature_store.cache_of("x") is None
    for a, b in zip(default, uncached):
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index) and torch.equal(a.x, b.x)
    torch.manual_seed(3)
    cached = NeighborLoader(small, [4, 3], batch_size=128, shuffle=True, gpu_cache="10%")
    assert cached.feature_store.cache_of("x").cache_rows == round(0.1 * small.num_nodes)
    for a, b in zip(default, cached):
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.x, b.x) and torch.equal(a.y, b.y)
    with pytest.raises(PlacementError, match="sampling runs on the CPU here"):
        NeighborLoader(small, [4, 3], batch_size=128, feature_placement="managed")


def test_new_options_are_refused_clearly(small):
    with pytest.raises(PlacementError, match="feature_placement must be one of"):
        NeighborLoader(small, [4, 3], feature_placement="disk")
    with pytest.raises(PlacementError, match="feature_placement must be 'unified', 'managed' or 'cuda'"):
        NeighborLoader(small, [4, 3], feature_placement="cpu")
    with pytest.raises(ValueError, match="with pipeline, the plan says where x is read from"):
        NeighborLoader(small, [4, 3], feature_placement="managed", pipeline=True)
    with pytest.raises(ValueError, match="gpu_cache must be 'auto', None"):
        NeighborLoader(small, [4, 3], gpu_cache="lots")
    store = stores_from_data(small)[0]
    with pytest.raises(PlacementError, match="read_from placement must be 'unified', 'managed' or 'cuda'"):
        store.read_from("x", "cpu")
    with pytest.raises(KeyError, match="read_from: no table 'z'"):
        store.read_from("z", "managed")


def test_tensors_of_a_minibatch_and_one_ahead_without_gpu(small):
    from pytorch_zerocopy.block import Block
    from pytorch_zerocopy.pipeline.ahead import one_ahead, tensors_of

    batch = next(iter(NeighborLoader(small, [4, 3], batch_size=64)))
    found = {id(t) for t in tensors_of(batch)}
    assert {id(batch.x), id(batch.edge_index), id(batch.n_id), id(batch.e_id), id(batch.y)} <= found
    block = Block(torch.tensor([0, 1]), torch.tensor([0, 0]), 2, 1, nodes=torch.tensor([5, 6]))
    block.srcdata["feat"] = torch.randn(2, 3)
    assert {id(block.src), id(block.dst), id(block.srcdata["feat"])} <= {id(t) for t in tensors_of((None, [block]))}
    source = iter([1, 2, 3])
    assert one_ahead(source, torch.device("cpu")) is source


@pytest.mark.cuda
def test_gpu_default_reading_equals_the_mapped_uncached_reader():
    """On a GPU: x read from the plan's host memory kind behind the plan's cache, one minibatch
    ahead on side streams, gives the minibatches of the mapped, uncached reader (fresh random
    features; same seed)."""
    if not zc.gpu_backed():
        pytest.skip("this build serves unified tensors on the CPU")
    from pytorch_zerocopy.feature_table import default_reading

    data = to_data(community_graph(num_nodes=3000, num_classes=8, avg_degree=8, feature_dim=32, seed=9))
    data.x = torch.randn(data.num_nodes, 32)
    placement, _ = default_reading(data.x.numel() * 4)
    fast = NeighborLoader(data, [6, 4], batch_size=256, shuffle=True)
    assert fast.feature_store.placement_of("x") is placement
    assert fast.feature_store.cache_of("x").cache_rows == round(0.1 * data.num_nodes)
    for side in ("y", "train_mask", "val_mask", "test_mask"):  # a few bytes a node: read from GPU memory
        assert fast.feature_store.placement_of(side) is Placement.GPU, side
    mapped = NeighborLoader(data, [6, 4], batch_size=256, shuffle=True, feature_placement="unified", gpu_cache=None)
    assert mapped.feature_store.cache_of("x") is None

    def epoch(loader):  # each loader's epoch from the same seed (zip would interleave their draws)
        torch.manual_seed(5)
        batches = list(loader)
        torch.cuda.current_stream().synchronize()
        return batches

    n = 0
    for a, b in zip(epoch(fast), epoch(mapped), strict=True):
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
        assert torch.equal(a.x, b.x) and torch.equal(a.x.cpu(), data.x[a.n_id.cpu()])
        assert torch.equal(a.y.cpu(), data.y[a.n_id.cpu()]) and torch.equal(a.e_id, b.e_id)
        assert torch.equal(a.train_mask.cpu(), data.train_mask[a.n_id.cpu()]) and a.train_mask.dtype == torch.bool
        n += 1
    assert n == len(mapped)
    # The sample equals the CPU's (the kernels' draws match), here through the overlap.
    cpu = NeighborLoader(stores_from_data(data, placement="cpu")[:2], [6, 4], batch_size=256, shuffle=True,
                         input_nodes=torch.arange(data.num_nodes))
    gpu = NeighborLoader(data, [6, 4], batch_size=256, shuffle=True, input_nodes=torch.arange(data.num_nodes))
    for a, b in zip(epoch(cpu), epoch(gpu), strict=True):
        assert torch.equal(a.n_id, b.n_id.cpu()) and torch.equal(a.x, b.x.cpu())


# --- work in flight: samples started two ahead, minibatches finished one ahead --------------


def test_ahead_schedule_starts_two_and_finishes_one_ahead():
    """The lookahead's order of work, run on the host (no streams): every item comes out once,
    in order; item k + 2 is started and item k + 1 finished before item k is handed out. On
    the CPU, one_ahead finishes each item in turn."""
    from pytorch_zerocopy.pipeline.ahead import _ahead, one_ahead

    def source(n, log):
        for k in range(n):
            log.append(("start", k))
            yield k * 10

    for n in (0, 1, 2, 3, 7):
        log = []

        def finish(started, log=log):
            log.append(("finish", started // 10))
            return -started

        got = []
        for item in _ahead(source(n, log), finish, None):
            log.append(("got", -item // 10))
            got.append(item)
        assert got == [-10 * k for k in range(n)]
        for k in range(n):
            handed = log.index(("got", k))
            assert log.index(("finish", k)) < handed
            if k + 2 < n:
                assert log.index(("start", k + 2)) < handed < log.index(("finish", k + 2))
            if k + 1 < n:
                assert log.index(("finish", k + 1)) < handed
            if k + 3 < n:
                assert handed < log.index(("start", k + 3))
        # Without finish: each item made whole by the source, one ahead.
        log.clear()
        got = [item for item in _ahead((log.append(k) or k for k in range(n)), None, None)
               if not log.append(("got", item))]
        assert got == list(range(n))
        assert log == ([0] if n else []) + [x for k in range(n) for x in ([k + 1] if k + 1 < n else []) + [("got", k)]]
    log = []
    assert list(one_ahead((log.append(k) or k for k in range(3)), torch.device("cpu"), lambda k: log.append(-k) or k)) \
        == [0, 1, 2]
    assert log == [0, 0, 1, -1, 2, -2]


@pytest.fixture
def ahead_on_host(monkeypatch):
    """The in-process loader's GPU schedule (start two ahead, finish one ahead) run on the host:
    the same order of work, without streams, so that it runs here too."""
    import pytorch_zerocopy.pyg.loader as pyg_loader
    from pytorch_zerocopy.pipeline.ahead import _ahead

    monkeypatch.setattr(pyg_loader, "one_ahead", lambda source, device, finish=None: _ahead(source, finish, None))


def one_at_a_time(loader):
    """The loader's minibatches made as PyG's DataLoader makes them: each sampled, then
    gathered and built, on the current stream, before the next is drawn."""
    return torch.utils.data.DataLoader.__iter__(loader)


class _OwnSampler(zc.pyg.NeighborSampler):
    """A subclass that overrides sample_from_nodes: the loader must call it, one at a time."""

    def sample_from_nodes(self, index, **kwargs):
        out = super().sample_from_nodes(index, **kwargs)
        out.metadata = (out.metadata[0] + 0, "own")
        return out


@pytest.mark.parametrize("shuffle, drop_last, n, size", [(True, False, 1000, 64), (True, True, 1000, 64),
                                                         (False, False, 130, 64), (False, True, 130, 64),
                                                         (True, False, 10, 64), (True, True, 10, 64),
                                                         (True, False, 128, 64)])
def test_index_batches_follow_torch_batch_sampler(shuffle, drop_last, n, size):
    """The loader's seed batches cut from one permutation tensor equal torch's BatchSampler
    lists, batch for batch, and leave torch's default generator where those leave it."""
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    from pytorch_zerocopy.pyg.loader import _index_batches

    sampler = BatchSampler(RandomSampler(range(n)) if shuffle else SequentialSampler(range(n)), size, drop_last)
    torch.manual_seed(5)
    want = [torch.tensor(b) for b in sampler]
    want_next = torch.rand(3)
    torch.manual_seed(5)
    got = list(_index_batches(sampler))
    assert [g.tolist() for g in got] == [w.tolist() for w in want]
    assert all(g.dtype == torch.int64 for g in got)
    assert torch.equal(torch.rand(3), want_next)


def test_index_batches_leave_other_samplers_to_torch():
    from torch.utils.data import BatchSampler, RandomSampler, SubsetRandomSampler

    from pytorch_zerocopy.pyg.loader import _index_batches

    for sampler in (RandomSampler(range(10), replacement=True), RandomSampler(range(10), num_samples=4),
                    RandomSampler(range(10), generator=torch.Generator().manual_seed(1)),
                    SubsetRandomSampler([1, 2, 3])):
        assert _index_batches(BatchSampler(sampler, 4, False)) is None
    assert _index_batches([[0, 1], [2]]) is None


@pytest.mark.parametrize("case", ["shuffled", "bidirectional", "partial_last", "drop_last", "in_order", "generator",
                                  "own_sampler", "transforms"])
def test_lookahead_loader_equals_one_at_a_time(small, ahead_on_host, case):
    """Every minibatch of the lookahead schedule equals the one made one at a time from the same
    torch seed (shuffled seeds, so a minibatch out of place or built from another's sample
    differs), and every one is there."""
    kwargs = dict(batch_size=100, shuffle=True)
    if case == "bidirectional":
        kwargs["subgraph_type"] = "bidirectional"
    elif case == "partial_last":
        kwargs.update(batch_size=64, input_nodes=small.train_mask)
    elif case == "drop_last":
        kwargs.update(batch_size=64, input_nodes=small.train_mask, drop_last=True)
    elif case == "in_order":
        kwargs.update(batch_size=64, shuffle=False)
    elif case == "generator":  # torch's own batches (a generator of the loader's own): the same
        kwargs.update(generator=torch.Generator())
    elif case == "own_sampler":
        kwargs["neighbor_sampler"] = _OwnSampler(stores_from_data(small)[:2], [4, 3])
    elif case == "transforms":
        kwargs.update(transform=lambda d: d.update({"seen": d.n_id.numel()}),
                      transform_sampler_output=lambda out: out)
    loader = NeighborLoader(small, [4, 3], **kwargs)
    for epoch in range(2):
        torch.manual_seed(11 + epoch)
        if case == "generator":
            loader.generator.manual_seed(11 + epoch)
        got = list(loader)
        torch.manual_seed(11 + epoch)
        if case == "generator":
            loader.generator.manual_seed(11 + epoch)
        want = list(one_at_a_time(loader))
        assert len(got) == len(want) == len(loader) > 2
        # PyG's to_bidirectional keeps one id of each edge sampled both ways by a sort that is not
        # stable on CUDA: which id stays varies from run to run, so there each id is checked instead.
        unstable = ("e_id", "edge_attr") if case == "bidirectional" and got[0].e_id.is_cuda else ()
        for g, w in zip(got, want):
            assert_same_minibatch(g, w, skip=unstable)
            if case == "bidirectional":
                assert_edge_ids_name_their_edges(g, small)
        if case == "own_sampler":
            assert all(batch.seed_time == "own" for batch in got)
        torch.manual_seed(11 + epoch)
        if case == "generator":
            loader.generator.manual_seed(11 + epoch)
        seeds = loader.input_data.node[list(torch.utils.data.DataLoader._get_iterator(loader)._sampler_iter)[0]]
        assert torch.equal(got[0].n_id[:got[0].batch_size].cpu(), seeds)


@pytest.mark.parametrize("schedule", ["loader", "lookahead"])
def test_loader_samples_two_ahead_in_order(small, monkeypatch, request, schedule):
    """When minibatch i is handed out, the GPU schedule has started the samples of minibatches
    up to i + 2 (the CPU's, up to i), and minibatch i holds the i-th seeds sampled."""
    if schedule == "lookahead":
        request.getfixturevalue("ahead_on_host")
    started = []
    original = zc.pyg.NeighborSampler.sample_seeds_async  # where every sample of the sampler starts

    def counted(self, node, input_id):
        started.append(node.cpu().clone())
        return original(self, node, input_id)

    monkeypatch.setattr(zc.pyg.NeighborSampler, "sample_seeds_async", counted)
    loader = NeighborLoader(small, [4, 3], batch_size=100, shuffle=True)
    ahead = 2 if schedule == "lookahead" or loader.device.type == "cuda" else 0
    n = 0
    for i, batch in enumerate(loader):
        assert len(started) == min(i + 1 + ahead, len(loader)), i
        assert torch.equal(batch.n_id[:batch.batch_size].cpu(), started[i]), i
        n += 1
    assert n == len(started) == len(loader)


@pytest.mark.cuda
def test_gpu_lookahead_equals_one_at_a_time_under_load():
    """On a GPU, with side streams: every minibatch equals the one made one at a time on the
    current stream from the same seed and holds the rows of its ids, while the loop queues
    work of its own on the current stream and keeps every minibatch (memory reused too early,
    or a minibatch read before its gather ran, changes them)."""
    if not zc.gpu_backed():
        pytest.skip("this build serves unified tensors on the CPU")
    data = to_data(community_graph(num_nodes=4000, num_classes=8, avg_degree=10, feature_dim=64, seed=3))
    data.x = torch.randn(data.num_nodes, 64)
    loader = NeighborLoader(data, [8, 6], batch_size=128, shuffle=True, feature_placement="unified", gpu_cache=None)
    assert loader.device.type == "cuda"
    load = torch.randn(2048, 2048, device="cuda")
    torch.manual_seed(4)
    got = []
    for batch in loader:
        for _ in range(4):
            load = torch.tanh(load @ load)  # the loop's step, on the current stream
        batch.x.mul_(2)  # the loop writes what it was given, on the current stream
        got.append(batch)
    torch.cuda.synchronize()
    torch.manual_seed(4)
    want = list(one_at_a_time(loader))
    torch.cuda.synchronize()
    assert len(got) == len(want) == len(loader)
    for g, w in zip(got, want):
        w.x.mul_(2)
        assert_same_minibatch(g, w)
        assert torch.equal(g.x.cpu(), 2 * data.x[g.n_id.cpu()])
        assert torch.equal(g.edge_attr.cpu(), data.edge_attr[g.e_id.cpu()])


@pytest.mark.cuda
def test_gpu_loader_waits_for_the_gpu_only_on_samples(small, capfd):
    """An epoch of the in-process loader on a GPU makes no stream or device synchronisation
    (torch's sync debug mode counts them): the one wait per minibatch is on its sample's event,
    queued two minibatches earlier. A hop of fanout -1 adds one per minibatch (its size)."""
    from test_sampling import count_syncs

    if not zc.gpu_backed():
        pytest.skip("this build serves unified tensors on the CPU")
    for fanouts, per_minibatch in (([5, 5], 0), ([-1, 3], 1)):
        loader = NeighborLoader(small, fanouts, batch_size=100, shuffle=True)
        assert sum(1 for _ in loader) == len(loader)  # warm-up: allocator, pinned memory, cub
        n, syncs = count_syncs(capfd, lambda loader=loader: sum(1 for _ in loader))
        assert n == len(loader) and syncs == per_minibatch * n, (fanouts, syncs)


def test_edge_index_is_a_view_of_a_samples_pairs_and_a_copy_otherwise():
    from pytorch_zerocopy.pyg.sampler import edge_index

    pairs = torch.arange(10).reshape(2, 5)
    view = edge_index(pairs[0], pairs[1])
    assert torch.equal(view, pairs) and view.data_ptr() == pairs.data_ptr()
    for row, col in ((pairs[1], pairs[0]), (torch.arange(5), torch.arange(5, 10)), (pairs[0, :4], pairs[1, :4]),
                     (torch.arange(0, 20, 2), torch.arange(20, 40, 2))):
        got = edge_index(row, col)
        assert torch.equal(got, torch.stack([row, col])) and got.data_ptr() not in (row.data_ptr(), col.data_ptr())
    empty = torch.empty((2, 0), dtype=torch.long)
    assert edge_index(empty[0], empty[1]).shape == (2, 0)


def test_loader_edge_index_holds_the_samples_pairs(small):
    torch.manual_seed(0)
    batch = next(iter(NeighborLoader(small, [4, 3], batch_size=32)))
    assert batch.edge_index.shape == (2, sum(batch.num_sampled_edges))
    row, col = batch.edge_index
    assert int(col.max()) < sum(batch.num_sampled_nodes[:-1]) and int(row.max()) < batch.n_id.numel()
