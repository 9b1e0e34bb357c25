"""Generated graphs: the embedded default dataset and a papers100M-like generator.

Both plant a community structure (most edges join nodes of the same class) and give each node
its class mean plus Gaussian noise as features, so a GNN that aggregates neighbours learns the
task well beyond what the noisy features alone allow and accuracy is a meaningful check.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch

from ..unified import available_host_memory, free_shared_memory, require_shared_memory, to_unified
from .base import NodeDataset, in_neighbour_graph, shared_host_tensor
from .features import GeneratedFeatures


def _splits(num_nodes: int, train: float, val: float, test: float, gen: torch.Generator):
    perm = torch.randperm(num_nodes, generator=gen)
    n_train, n_val = int(num_nodes * train), int(num_nodes * val)
    n_test = min(num_nodes - n_train - n_val, int(num_nodes * test))
    return (perm[:n_train].sort().values, perm[n_train:n_train + n_val].sort().values,
            perm[n_train + n_val:n_train + n_val + n_test].sort().values)


def _csr_from_edges(src: torch.Tensor, dst: torch.Tensor, num_nodes: int, chunk_edges: int = 1 << 27):
    """CSR of in-neighbours without self loops, each row sorted by source id.

    Up to ``chunk_edges`` edges, duplicate edges are removed as well. Larger edge lists (OGB's
    big graphs, which hold no duplicates) are bucketed by destination in node ranges of about
    ``chunk_edges`` edges each and written straight into a shared-memory index array, so peak
    memory is the edge list plus one bucket rather than several copies of the edge list.
    """
    if src.numel() <= chunk_edges:
        keep = src != dst
        key = torch.unique(dst[keep] * num_nodes + src[keep])  # sorted
        indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
        torch.cumsum(torch.bincount(key // num_nodes, minlength=num_nodes), 0, out=indptr[1:])
        return indptr, key % num_nodes

    loops = src == dst
    deg = torch.bincount(dst, minlength=num_nodes)
    deg -= torch.bincount(dst[loops], minlength=num_nodes)
    del loops
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    torch.cumsum(deg, 0, out=indptr[1:])
    del deg
    indices = shared_host_tensor((int(indptr[-1]),), torch.int64)
    a = 0
    while a < num_nodes:
        # The node range [a, b) holds about chunk_edges edges (at least one node).
        b = int(torch.searchsorted(indptr, indptr[a] + chunk_edges, right=True)) - 1
        b = min(num_nodes, max(a + 1, b))
        sel = ((dst >= a) & (dst < b) & (src != dst)).nonzero().squeeze(1)
        key = (dst[sel] - a) * num_nodes + src[sel]
        del sel
        key = key.sort().values
        indices[int(indptr[a]):int(indptr[b])] = key % num_nodes
        a = b
    return indptr, indices


def community_graph(
    num_nodes: int = 120_000,
    num_classes: int = 16,
    avg_degree: int = 12,
    feature_dim: int = 64,
    p_in: float = 0.7,
    mean_scale: float = 0.2,
    seed: int = 0,
    name: str = "community",
    splits: Tuple[float, float, float] = (0.2, 0.05, 0.25),
) -> NodeDataset:
    """A symmetric stochastic-block-style graph with class-dependent features.

    Each node draws ``avg_degree / 2`` edges, each to a random node of its own class with
    probability ``p_in`` and to a uniformly random node otherwise; edges are then made
    undirected and deduplicated. Features are ``class_mean + N(0, 1)`` with class means drawn
    from ``N(0, mean_scale^2)`` per dimension, so one node's features identify its class only
    weakly while the mean over its neighbours identifies it well (with the defaults, the
    nearest class mean of a node's own features is right 46% of the time, of its neighbours'
    mean 91%; chance is 1/16). Deterministic for a seed:
    every tensor is the same on every machine (CPU generator only). ``splits``: the train /
    validation / test fractions of the nodes.
    """
    if num_nodes < num_classes or num_classes < 2:
        raise ValueError(f"community_graph: need num_nodes >= num_classes >= 2, got {num_nodes}, {num_classes}")
    if feature_dim < 1 or avg_degree < 1:
        raise ValueError(f"community_graph: feature_dim and avg_degree must be >= 1, got {feature_dim}, {avg_degree}")
    if len(splits) != 3 or min(splits) < 0 or sum(splits) > 1:
        raise ValueError(f"community_graph: splits must be three fractions summing to at most 1, got {splits}")
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, num_classes, (num_nodes,), generator=gen)
    by_class = torch.argsort(labels, stable=True)
    counts = torch.bincount(labels, minlength=num_classes)
    offsets = torch.cumsum(counts, 0) - counts

    per_node = max(1, avg_degree // 2)
    src = torch.arange(num_nodes).repeat_interleave(per_node)
    cls = labels[src]
    pick = (torch.rand(src.numel(), generator=gen, dtype=torch.float64) * counts[cls]).long()
    same = by_class[offsets[cls] + torch.minimum(pick, counts[cls] - 1)]
    other = torch.randint(0, num_nodes, (src.numel(),), generator=gen)
    dst = torch.where(torch.rand(src.numel(), generator=gen) < p_in, same, other)
    indptr, indices = _csr_from_edges(torch.cat([src, dst]), torch.cat([dst, src]), num_nodes)

    means = torch.randn(num_classes, feature_dim, generator=gen) * mean_scale
    features = shared_host_tensor((num_nodes, feature_dim), torch.float32)
    features.copy_(means[labels])
    features.add_(torch.randn(num_nodes, feature_dim, generator=gen))
    train, val, test = _splits(num_nodes, *splits, gen)
    graph = in_neighbour_graph(indptr, indices, symmetric=True)
    return NodeDataset(name, graph, features, labels, train, val, test, num_classes).share_memory_()


def embedded_default(feature_dim: int = 64) -> NodeDataset:
    """The dataset ``zerocopy train`` uses by default: 120k nodes, 16 classes, ~1.4M edges."""
    return community_graph(feature_dim=feature_dim, name="community-120k")


def _in_range(ids: torch.Tensor, num_nodes: int, num_classes: int) -> torch.Tensor:
    """Ids past the last node moved one class period down (same class)."""
    return torch.where(ids >= num_nodes, ids - num_classes, ids)


def _uniform_citations(v: torch.Tensor, num_nodes: int, num_classes: int, p_in: float,
                       gen: torch.Generator) -> torch.Tensor:
    """The node each entry of ``v`` cites: a uniform node of v's class with probability p_in,
    else a uniform node."""
    n, dev = v.numel(), v.device
    per_class = num_nodes // num_classes
    same = torch.randint(0, per_class, (n,), generator=gen, device=dev) * num_classes + v % num_classes
    other = torch.randint(0, num_nodes, (n,), generator=gen, device=dev)
    return torch.where(torch.rand(n, generator=gen, device=dev) < p_in, _in_range(same, num_nodes, num_classes),
                       other)


def _popular_citations(v: torch.Tensor, num_nodes: int, num_classes: int, p_in: float, skew: float,
                       slot: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The node each entry of ``v`` cites: v's class with probability p_in, else a uniform
    class; within it the node of rank ``floor(R * x ** skew)``, which is node
    ``slot[rank] * num_classes + class``."""
    n, dev = v.numel(), v.device
    cls = torch.where(torch.rand(n, generator=gen, device=dev) < p_in, v % num_classes,
                      torch.randint(0, num_classes, (n,), generator=gen, device=dev))
    x = torch.rand(n, generator=gen, device=dev, dtype=torch.float64)
    rank = (x.pow_(skew) * slot.numel()).long().clamp_(max=slot.numel() - 1)
    return _in_range(slot[rank] * num_classes + cls, num_nodes, num_classes)


def _fill_papers(indptr: torch.Tensor, indices: torch.Tensor, num_classes: int, p_in: float, skew: float, seed: int,
                 device: str, chunk_bytes: int) -> None:
    """Writes the edges of :func:`papers_like` into the preallocated shared index array."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    on_gpu = device.type == "cuda"
    # Mapping the array (kept alive until the end) makes each chunk's copy a full-speed DMA.
    mapped = [to_unified(indices)] if on_gpu else []
    num_nodes = indptr.numel() - 1
    deg = indptr[1:] - indptr[:-1]
    per_class = num_nodes // num_classes
    # With skew, the node of popularity rank r within its class is slot[r] * num_classes + class.
    slot = torch.randperm(per_class, generator=gen, device=device) if skew != 1.0 else None
    rows_per_chunk = max(1, chunk_bytes // (8 * max(1, int(deg.max()) if num_nodes else 1)))
    for a in range(0, num_nodes, rows_per_chunk):
        b = min(num_nodes, a + rows_per_chunk)
        lo, hi = int(indptr[a]), int(indptr[b])
        v = torch.arange(a, b, device=device).repeat_interleave(deg[a:b].to(device))
        if slot is None:
            chosen = _uniform_citations(v, num_nodes, num_classes, p_in, gen)
        else:
            chosen = _popular_citations(v, num_nodes, num_classes, p_in, skew, slot, gen)
        indices[lo:hi].copy_(chosen)
    if on_gpu:
        torch.cuda.synchronize()
    mapped.clear()


# The seed of the features' generator, apart from the graph's: the two are drawn independently.
_FEATURE_SEED_OFFSET = 0x5EED


def _require_room_for_papers(num_nodes: int, avg_degree: int, feature_dim: int, dtype: torch.dtype) -> None:
    """Raises ``torch.OutOfMemoryError`` (one line, in GiB, with the most nodes that fit) before
    anything is drawn when :func:`papers_like`'s tables would not fit shared memory. Per node
    they hold the feature row, ``avg_degree`` int64 in-neighbours on average, and an int64
    offset, label and drawn degree."""
    per_node = feature_dim * torch.empty(0, dtype=dtype).element_size() + 8 * avg_degree + 3 * 8
    room = [r for r in (free_shared_memory(), available_host_memory()) if r is not None]
    fits = min(room) // per_node if room else num_nodes
    require_shared_memory(num_nodes * per_node,
                          f"papers_like: {num_nodes:,} nodes with {feature_dim} {str(dtype).replace('torch.', '')} "
                          f"features and {avg_degree} in-edges each on average",
                          f"generate at most {fits:,} nodes")


def papers_like(
    num_nodes: int,
    avg_degree: int = 15,
    feature_dim: int = 128,
    dtype: torch.dtype = torch.float32,
    num_classes: int = 172,
    p_in: float = 0.8,
    mean_scale: float = 0.3,
    train_fraction: float = 0.012,
    popularity_skew: float = 2.0,
    seed: int = 0,
    device: Union[str, torch.device, None] = None,
    chunk_bytes: int = 512 << 20,
    name: Optional[str] = None,
) -> NodeDataset:
    """A papers100M-like directed graph of any size, generated in chunks, as in-neighbour lists.

    Node ``v`` has class ``v % num_classes`` and between 1 and ``2 * avg_degree - 1`` in-edges
    (uniform): each cites a node of its own class with probability ``p_in``, else of a random
    class. Within a class, nodes are cited by popularity, as papers are: the node of popularity
    rank ``r`` (of ``R`` per class) is drawn with probability ~ ``(r / R) ** (1 / s - 1)`` for
    ``s = popularity_skew``, the rank ``floor(R * x ** s)`` of a uniform ``x``; a node's citation
    count is then heavy-tailed with exponent ``1 + s / (s - 1)`` (3 at the default ``s = 2``,
    the exponent measured for citation counts). ``popularity_skew=1`` draws cited nodes
    uniformly (no hot rows). Ranks are spread over node ids by a random permutation, so hot
    nodes are not clustered by id, as in real graphs where the feature table is not ordered by
    popularity or community. The index array is written straight into shared memory
    (no temporary full copy), ``chunk_bytes`` at a time. The features are not made here: the
    dataset holds their :class:`~pytorch_zerocopy.datasets.features.GeneratedFeatures` source,
    which the process that reads them fills into the placement it reads (``ds.features``
    makes a shared-memory copy on first use).

    ``device`` is where random numbers are drawn (default: ``cuda`` when a GPU is visible, much
    faster for tables of tens of GiB). With ``cuda`` the tables are filled by a short-lived
    child process, so this process never creates a CUDA context (a later MPS partition then
    has the GPU to itself). The content is deterministic for a given seed and device. Splits:
    ``train_fraction`` / 0.1% / 0.2% of the nodes. A dataset that would not fit shared memory
    raises ``torch.OutOfMemoryError`` before anything is drawn, naming the most nodes that fit.
    """
    if num_nodes < num_classes:
        raise ValueError(f"papers_like: num_nodes ({num_nodes}) must be >= num_classes ({num_classes})")
    if avg_degree < 1 or feature_dim < 1:
        raise ValueError(f"papers_like: avg_degree and feature_dim must be positive, got {avg_degree}, {feature_dim}")
    if not popularity_skew >= 1.0:
        raise ValueError(f"papers_like: popularity_skew must be >= 1 (1: uniform), got {popularity_skew}")
    _require_room_for_papers(num_nodes, avg_degree, feature_dim, dtype)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    cpu_gen = torch.Generator().manual_seed(seed)

    deg = torch.randint(1, 2 * avg_degree, (num_nodes,), generator=cpu_gen)
    # Every table the dataset keeps is made in shared memory, so sharing it copies nothing.
    indptr = shared_host_tensor((num_nodes + 1,), torch.int64)
    indptr[0] = 0
    torch.cumsum(deg, 0, out=indptr[1:])
    del deg
    indices = shared_host_tensor((int(indptr[-1]),), torch.int64)
    args = (indptr, indices, num_classes, p_in, float(popularity_skew), seed, str(device), chunk_bytes)
    if device.type == "cuda":
        import torch.multiprocessing as mp

        child = mp.get_context("spawn").Process(target=_fill_papers, args=args, name="zerocopy-generate")
        child.start()
        child.join()
        if child.exitcode != 0:
            raise RuntimeError(f"papers_like: the generating process failed (exit code {child.exitcode})")
    else:
        _fill_papers(*args)

    features = GeneratedFeatures((num_nodes, feature_dim), dtype, num_classes, mean_scale,
                                 seed + _FEATURE_SEED_OFFSET, str(device), chunk_bytes)
    labels = shared_host_tensor((num_nodes,), torch.int64)
    torch.arange(num_nodes, out=labels).remainder_(num_classes)
    train, val, test = _splits(num_nodes, train_fraction, 0.001, 0.002, cpu_gen)
    name = name or f"papers-like-{num_nodes}x{feature_dim}-skew{popularity_skew:g}"
    return NodeDataset(name, in_neighbour_graph(indptr, indices), features, labels, train, val, test,
                       num_classes).share_memory_()
