"""Datasets: determinism and learnability of the generators, the OGB loader on tiny files."""

import gzip
import os

import numpy as np
import pytest
import torch

from pytorch_zerocopy.datasets import community_graph, load_dataset, load_ogb, papers_like, parse_dataset


def _neighbour_sets(indptr, indices):
    return [set(indices[indptr[v]:indptr[v + 1]].tolist()) for v in range(indptr.numel() - 1)]


def _check_csr(ds):
    assert ds.graph.indptr.dtype == torch.int64 and ds.graph.indices.dtype == torch.int64
    assert ds.graph.indptr[0] == 0 and int(ds.graph.indptr[-1]) == ds.graph.indices.numel()
    assert bool((ds.graph.indptr[1:] >= ds.graph.indptr[:-1]).all())
    assert int(ds.graph.indices.min()) >= 0 and int(ds.graph.indices.max()) < ds.num_nodes
    assert ds.features.shape[0] == ds.num_nodes and ds.labels.numel() == ds.num_nodes
    assert ds.features.is_shared() and ds.graph.indices.is_shared() and ds.graph.indptr.is_shared()


def test_community_graph_is_deterministic_and_structured():
    a = community_graph(num_nodes=6000, feature_dim=16, seed=3)
    b = community_graph(num_nodes=6000, feature_dim=16, seed=3)
    c = community_graph(num_nodes=6000, feature_dim=16, seed=4)
    _check_csr(a)
    assert torch.equal(a.graph.indptr, b.graph.indptr) and torch.equal(a.graph.indices, b.graph.indices)
    for name in ("features", "labels", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.graph.symmetric and a.graph.csc().indices is a.graph.indices  # in-lists are out-lists
    src, dst = a.edges()
    assert torch.equal(src, a.graph.indices) and dst.numel() == a.num_edges
    assert not torch.equal(a.features, c.features)
    # Undirected, no self loops, no duplicates.
    nbrs = _neighbour_sets(a.graph.indptr, a.graph.indices)
    assert sum(len(s) for s in nbrs) == a.num_edges
    assert all(v not in s for v, s in enumerate(nbrs))
    assert all(v in nbrs[u] for v in range(0, a.num_nodes, 97) for u in nbrs[v])
    # Community structure: most edges join nodes of one class.
    dst = torch.repeat_interleave(torch.arange(a.num_nodes), a.graph.indptr[1:] - a.graph.indptr[:-1])
    same = (a.labels[dst] == a.labels[a.graph.indices]).float().mean().item()
    assert same > 0.6
    # Splits are disjoint.
    allsplit = torch.cat([a.train_idx, a.val_idx, a.test_idx])
    assert allsplit.unique().numel() == allsplit.numel()


def test_community_graph_is_learnable_from_neighbours_not_from_one_node():
    ds = community_graph(num_nodes=8000, feature_dim=64, seed=1)
    x, y = ds.features, ds.labels
    means = torch.zeros(ds.num_classes, x.shape[1]).index_add_(0, y, x) / torch.bincount(y).unsqueeze(1)
    deg = ds.graph.indptr[1:] - ds.graph.indptr[:-1]
    dst = torch.repeat_interleave(torch.arange(ds.num_nodes), deg)
    agg = torch.zeros_like(x).index_add_(0, dst, x[ds.graph.indices]) / deg.clamp(min=1).unsqueeze(1)
    own = (torch.cdist(x, means).argmin(1) == y).float().mean().item()
    neigh = (torch.cdist(agg, means).argmin(1) == y).float().mean().item()
    assert own < 0.7  # a node alone is ambiguous...
    assert neigh > 0.8 and neigh > own + 0.2  # ...its neighbourhood is not


def test_papers_like_generator():
    a = papers_like(5000, avg_degree=6, feature_dim=24, dtype=torch.float16, num_classes=10, seed=2,
                    device="cpu", chunk_bytes=4096)
    b = papers_like(5000, avg_degree=6, feature_dim=24, dtype=torch.float16, num_classes=10, seed=2,
                    device="cpu", chunk_bytes=1 << 20)
    _check_csr(a)
    assert a.features.dtype == torch.float16
    # Chunking changes nothing about the graph or labels.
    assert torch.equal(a.graph.indptr, b.graph.indptr) and torch.equal(a.labels, b.labels)
    deg = (a.graph.indptr[1:] - a.graph.indptr[:-1]).float()
    assert 4.5 < deg.mean().item() < 7.5 and int(deg.min()) >= 1
    dst = torch.repeat_interleave(torch.arange(a.num_nodes), a.graph.indptr[1:] - a.graph.indptr[:-1])
    assert (a.labels[dst] == a.labels[a.graph.indices]).float().mean().item() > 0.6
    # Features carry the class: class means differ far more than noise / sqrt(n).
    f = a.features.float()
    means = torch.zeros(10, 24).index_add_(0, a.labels, f) / torch.bincount(a.labels).unsqueeze(1)
    assert torch.cdist(means, means).max() > 0.5
    assert f.std().item() > 0.5  # not zeros
    again = papers_like(5000, avg_degree=6, feature_dim=24, dtype=torch.float16, num_classes=10, seed=2,
                        device="cpu", chunk_bytes=4096)
    assert torch.equal(a.features, again.features) and torch.equal(a.graph.indices, again.graph.indices)


# sha256 (first 16 hex digits) of each table's bytes for the papers_like call in the test below,
# as the generator made them before its tables were allocated in shared memory.
_PAPERS_LIKE_DIGESTS = {"indptr": "f70374232e4439a9", "indices": "99a5cfaca30e5c9a", "labels": "17a6580bc19d6ae8",
                        "train": "0681f9499f6689ed", "val": "f933cfe25a00a1f2", "test": "a44164f06943b8f5",
                        "features": "4095b2e77b56b60f"}


def test_papers_like_tables_are_made_in_shared_memory_unchanged(monkeypatch):
    """The same seed gives the same bytes as before, and no table of a node's size is copied into
    shared memory afterwards (share_memory_ of a tensor not yet shared copies it)."""
    import hashlib

    copied = []
    share = torch.Tensor.share_memory_

    def recording_share(t):
        if not t.is_shared():
            copied.append(t.numel())
        return share(t)

    monkeypatch.setattr(torch.Tensor, "share_memory_", recording_share)
    ds = papers_like(6000, avg_degree=5, feature_dim=16, num_classes=12, seed=7, device="cpu", chunk_bytes=1 << 14,
                     train_fraction=0.05)
    tables = {"indptr": ds.graph.indptr, "indices": ds.graph.indices, "labels": ds.labels, "train": ds.train_idx,
              "val": ds.val_idx, "test": ds.test_idx, "features": ds.features}
    digests = {k: hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:16] for k, t in tables.items()}
    assert digests == _PAPERS_LIKE_DIGESTS
    assert all(t.is_shared() for t in tables.values())
    assert max(copied, default=0) < ds.num_nodes, copied  # only the small splits were copied


def test_papers_like_popularity_skew():
    """Cited nodes are drawn by popularity: with the default skew a few nodes are cited far more
    than under uniform draws, the top 10% of nodes hold about a third of the citations, and
    classes still agree."""
    n = 20_000
    flat = papers_like(n, avg_degree=8, feature_dim=4, num_classes=10, seed=5, device="cpu", popularity_skew=1.0)
    skewed = papers_like(n, avg_degree=8, feature_dim=4, num_classes=10, seed=5, device="cpu")
    assert skewed.name.endswith("-skew2") and flat.name.endswith("-skew1")
    for ds in (flat, skewed):
        _check_csr(ds)
        dst = torch.repeat_interleave(torch.arange(n), ds.graph.indptr[1:] - ds.graph.indptr[:-1])
        assert (ds.labels[dst] == ds.labels[ds.graph.indices]).float().mean().item() > 0.7
    cites = [torch.bincount(ds.graph.indices, minlength=n).sort(descending=True).values for ds in (flat, skewed)]
    top = [c[: n // 10].sum().item() / c.sum().item() for c in cites]
    assert top[0] < 0.2 and top[1] > 0.28, top  # skew 2: the top tenth of ranks draws sqrt(0.1) of the citations
    assert cites[1][0] > 10 * cites[0][0]
    # Hot nodes are spread over the id range, not packed at its start.
    hot = torch.bincount(skewed.graph.indices, minlength=n).topk(n // 100).indices.float()
    assert 0.3 * n < hot.mean().item() < 0.7 * n
    with pytest.raises(ValueError, match="popularity_skew"):
        papers_like(1000, num_classes=10, device="cpu", popularity_skew=0.5)


def test_papers_like_checks_room_before_drawing_anything():
    """A dataset larger than shared memory is refused at once (not after minutes of drawing),
    in one line with both figures in GiB and the most nodes that do fit."""
    import re
    import time

    from pytorch_zerocopy.unified import available_host_memory, free_shared_memory

    start = time.perf_counter()
    with pytest.raises(torch.OutOfMemoryError) as info:
        papers_like(10**12, device="cpu")
    assert time.perf_counter() - start < 2.0
    message = str(info.value)
    assert message.startswith("papers_like: 1,000,000,000,000 nodes with 128 float32 features") and "\n" not in message
    assert re.search(r"needs [\d,.]+ GiB of shared memory, but /dev/shm has [\d,.]+ GiB free", message), message
    fits = int(re.search(r"at most ([\d,]+) nodes", message).group(1).replace(",", ""))
    per_node = 128 * 4 + 8 * 15 + 3 * 8  # a feature row, its in-edges, offset, label and drawn degree
    room = min(free_shared_memory(), available_host_memory())  # both move a little while others run
    assert room / 2 < fits * per_node < room * 1.1, (fits, room)


def test_shared_host_tensor_too_large_says_gib():
    from pytorch_zerocopy.datasets import shared_host_tensor

    with pytest.raises(torch.OutOfMemoryError, match=r"needs [\d,.]+ GiB of shared memory, but /dev/shm has"):
        shared_host_tensor((1 << 40, 1 << 10), torch.float32)


def test_bucketed_csr_build_matches_the_direct_one():
    from pytorch_zerocopy.datasets.synthetic import _csr_from_edges

    g = torch.Generator().manual_seed(4)
    n = 500
    key = torch.randperm(n * n, generator=g)[:6000]  # distinct edges, some self loops
    src, dst = key % n, key // n
    assert bool((src == dst).any())
    direct = _csr_from_edges(src, dst, n)
    for chunk in (1, 7, 999):
        bucketed = _csr_from_edges(src, dst, n, chunk_edges=chunk)
        assert torch.equal(bucketed[0], direct[0]) and torch.equal(bucketed[1], direct[1]), chunk
        assert bucketed[1].is_shared()


def test_load_dataset_specs_and_errors(tmp_path):
    ds = load_dataset("papers-like:3k:4", feature_dim=8)
    assert ds.num_nodes == 3000 and ds.feature_dim == 8 and not ds.graph.symmetric
    spec = parse_dataset("papers-like:2.5M")
    assert (spec.kind, spec.nodes, spec.degree, spec.feature_dim, spec.row_bytes) == ("papers-like", 2_500_000, 15,
                                                                                     128, 512)
    assert parse_dataset("community").row_bytes == 256 and parse_dataset(str(tmp_path)).row_bytes is None
    for bad, message in (("no-such-dataset", "unknown dataset"), ("papers-like", "NODES"),
                         ("papers-like:abc", "NODES must be a positive whole number"),
                         ("papers-like:1.5", "NODES must be"), ("papers-like:0", "NODES must be"),
                         ("papers-like:5k:x", "DEGREE must be"), ("papers-like:5k:4:9", "NODES"),
                         ("papers-like:100", "at least 172"), ("", "unknown dataset")):
        with pytest.raises(ValueError, match=message):
            parse_dataset(bad)
    for width in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="feature_dim must be a positive int"):
            parse_dataset("community", feature_dim=width)
    with pytest.raises(ValueError, match="feature_dim applies to generated"):
        parse_dataset(str(tmp_path), feature_dim=8)
    with pytest.raises(ValueError, match="num_classes"):
        papers_like(5, num_classes=10, device="cpu")


def _write_csv_gz(path, array, fmt):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with gzip.open(path, "wt") as f:
        np.savetxt(f, array, fmt=fmt, delimiter=",")


def _tiny_graph(rng):
    n, e = 40, 120
    edges = rng.integers(0, n, size=(e, 2))
    feats = rng.standard_normal((n, 5)).astype(np.float32)
    labels = rng.integers(0, 4, size=n)
    perm = rng.permutation(n)
    return n, edges, feats, labels, perm[:20], perm[20:30], perm[30:]


def _expected_neighbours(n, edges, reverse):
    sets = [set() for _ in range(n)]
    for s, d in edges:
        if s != d:
            sets[d].add(int(s))
            if reverse:
                sets[s].add(int(d))
    return sets


def test_load_ogb_csv_layout(tmp_path):
    rng = np.random.default_rng(7)
    n, edges, feats, labels, tr, va, te = _tiny_graph(rng)
    root = tmp_path / "ogbn_products"
    _write_csv_gz(str(root / "raw" / "edge.csv.gz"), edges, "%d")
    _write_csv_gz(str(root / "raw" / "node-feat.csv.gz"), feats, "%.7e")
    _write_csv_gz(str(root / "raw" / "node-label.csv.gz"), labels.reshape(-1, 1), "%d")
    _write_csv_gz(str(root / "raw" / "num-node-list.csv.gz"), np.array([[n]]), "%d")
    for name, ids in (("train", tr), ("valid", va), ("test", te)):
        _write_csv_gz(str(root / "split" / "sales_ranking" / f"{name}.csv.gz"), ids.reshape(-1, 1), "%d")
    ds = load_ogb(root)
    _check_csr(ds)
    assert ds.num_nodes == n and ds.num_classes == int(labels.max()) + 1
    assert torch.allclose(ds.features, torch.from_numpy(feats))
    assert torch.equal(ds.labels, torch.from_numpy(labels))
    assert torch.equal(ds.train_idx, torch.from_numpy(tr)) and torch.equal(ds.test_idx, torch.from_numpy(te))
    assert _neighbour_sets(ds.graph.indptr, ds.graph.indices) == _expected_neighbours(n, edges, reverse=True)


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed], ids=["stored", "compressed"])
def test_load_ogb_binary_layout(tmp_path, save):
    rng = np.random.default_rng(8)
    n, edges, feats, labels, tr, va, te = _tiny_graph(rng)
    root = tmp_path / "ogbn_papers100M"
    (root / "raw").mkdir(parents=True)
    save(root / "raw" / "data.npz", edge_index=edges.T.copy(), node_feat=feats.astype(np.float16),
             num_nodes_list=np.array([n]), num_edges_list=np.array([len(edges)]))
    lab = labels.astype(np.float64).reshape(-1, 1)
    lab[3] = np.nan  # unlabelled node
    np.savez(root / "raw" / "node-label.npz", node_label=lab)
    for name, ids in (("train", tr), ("valid", va), ("test", te)):
        _write_csv_gz(str(root / "split" / "time" / f"{name}.csv.gz"), ids.reshape(-1, 1), "%d")
    ds = load_ogb(root)
    assert ds.features.dtype == torch.float16
    assert torch.equal(ds.features, torch.from_numpy(feats.astype(np.float16)))
    assert int(ds.labels[3]) == -1 and int(ds.labels[4]) == labels[4]
    # papers100M is directed: no reverse edges are added.
    assert _neighbour_sets(ds.graph.indptr, ds.graph.indices) == _expected_neighbours(n, edges, reverse=False)


def test_load_ogb_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="raw/"):
        load_ogb(tmp_path)
    (tmp_path / "raw").mkdir()
    with pytest.raises(FileNotFoundError, match="edge.csv.gz"):
        load_ogb(tmp_path)
