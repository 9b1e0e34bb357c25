"""How often a training run reads each node's feature row: the scores that decide which rows a
GPU cache holds (:mod:`pytorch_zerocopy.feature_table`) and how nodes are renumbered so that
hot rows sit together in host memory (:mod:`pytorch_zerocopy.graph.reorder`).

Two scores, both one int64 count per node:

* :func:`degree_hotness`: how many neighbour lists of the sampled adjacency hold the node. A
  node in many lists is drawn as a neighbour often (PaGraph's and DGL's choice).
* :func:`presample_hotness`: how often the node is among the input nodes of minibatches drawn
  with the library's sampler from the training seeds (GNNLab's pre-sampling, which its authors
  found the best predictor of the rows training reads).

Both are deterministic for their arguments; counts live on the device where they are computed
(the GPU for a unified or CUDA graph, else the CPU).
"""

from __future__ import annotations

import math
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Deque, Iterable, Iterator, Optional, Sequence

import torch

from . import sampling as _sampling
from . import unified as _unified

__all__ = ["degree_hotness", "hottest", "presample_hotness"]

_CHUNK = 1 << 26  # ids per bincount, so int32 lists are never widened whole


def _count_ids(ids: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """int64 count of each id in ``ids`` (unified tensors are counted where they run)."""
    device = _sampling._compute_device(ids)
    if _unified.is_unified(ids):
        ids = _unified._C.device_alias(ids, device) if device.type == "cuda" else ids.cpu()
    counts = torch.zeros(num_nodes, dtype=torch.int64, device=ids.device)
    for a in range(0, ids.numel(), _CHUNK):
        counts += torch.bincount(ids[a:a + _CHUNK].long(), minlength=num_nodes)
    return counts


def degree_hotness(graph, edge_dir: str = "in") -> torch.Tensor:
    """int64 per node: the number of neighbour lists holding it in the adjacency that sampling
    with ``edge_dir`` reads (``'in'``: in-neighbour lists, so a node's out-degree; ``'out'``:
    its in-degree). ``graph`` is a :class:`~pytorch_zerocopy.graph.CSRGraph` or an
    ``(indptr, indices)`` pair (what :func:`pytorch_zerocopy.sampling.sample_layers` takes)."""
    if edge_dir not in ("in", "out"):
        raise ValueError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
    graph = _sampling.as_csr_graph(graph)
    num_nodes = graph.num_nodes
    if edge_dir == "out":
        return _count_ids(graph.indices, num_nodes)
    # In-neighbour lists hold each node once per out-edge: its out-degree, no transpose needed.
    indptr = graph.indptr.cpu() if _unified.is_unified(graph.indptr) else graph.indptr
    return (indptr[1:] - indptr[:-1]).long()


def presample_hotness(
    graph,
    seeds: torch.Tensor,
    fanouts: Sequence[int],
    *,
    batch_size: int = 1024,
    num_batches: Optional[int] = None,
    edge_dir: str = "in",
    seed: int = 0,
) -> torch.Tensor:
    """int64 per node: how many of ``num_batches`` pre-sampled minibatches (default: one epoch
    of ``seeds``, shuffled) read its feature row, i.e. hold it among their input nodes
    (``blocks[0].nodes`` of :func:`pytorch_zerocopy.sampling.sample_layers` with ``fanouts``).
    Deterministic for ``seed``. Runs where sampling runs (see :mod:`pytorch_zerocopy.sampling`)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    seeds = torch.as_tensor(seeds).reshape(-1)
    if seeds.numel() == 0:
        raise ValueError("presample_hotness needs at least one seed node")
    graph = _sampling.as_csr_graph(graph)
    epoch = math.ceil(seeds.numel() / batch_size)
    batches = epoch if num_batches is None else int(num_batches)
    if batches < 1:
        raise ValueError(f"num_batches must be >= 1, got {num_batches}")
    gen = torch.Generator().manual_seed(seed)
    host_seeds = seeds.cpu()

    def seed_batches():
        order = torch.randperm(host_seeds.numel(), generator=gen)
        for b in range(batches):
            k = b % epoch
            if k == 0 and b > 0:
                order = torch.randperm(host_seeds.numel(), generator=gen)
            yield b, host_seeds[order[k * batch_size:(k + 1) * batch_size]]

    def input_nodes(item) -> torch.Tensor:
        b, batch = item
        return _sampling.sample_layers(graph, batch, fanouts, edge_dir=edge_dir, seed=seed * 1_000_003 + b)[0].nodes

    counts: Optional[torch.Tensor] = None
    for nodes in _map_batches(input_nodes, seed_batches(), _sampling._compute_device(graph.indices).type == "cpu"):
        if counts is None:
            counts = torch.zeros(graph.num_nodes, dtype=torch.int64, device=nodes.device)
        counts.index_add_(0, nodes, torch.ones_like(nodes))
    return counts


def _map_batches(fn: Callable, items: Iterable, on_cpu: bool) -> Iterator:
    """``fn`` of each item, in order. On the CPU the items are spread over this process's torch
    threads, as that many threads of one torch thread each (a minibatch is too small for the
    sampling op's own threads to scale; the op releases the GIL), at most a few items per thread
    ahead of the caller; the process's thread count is restored after. Every batch's sample
    depends on its own seed only, so the results are the serial loop's."""
    workers = torch.get_num_threads() if on_cpu else 1
    if workers <= 1:
        yield from map(fn, items)
        return
    try:
        with ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,),
                                thread_name_prefix="zerocopy-presample") as pool:
            pending: Deque[Future] = deque()
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= 4 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
    finally:
        torch.set_num_threads(workers)  # torch.set_num_threads sets the default of every thread


def hottest(hotness: torch.Tensor, count: int) -> torch.Tensor:
    """The ids of the ``count`` hottest nodes with a positive score (fewer if fewer have one),
    hottest first; ties keep the lower id first. int64, on the CPU.

    Integer scores in a bounded range (every count this module makes) are ranked by a histogram
    of the scores: only the rows above the cut are sorted, by a key that is unique per row, so
    the result is the stable descending sort's, in a fraction of its time (a stable sort of a
    100M-node table is single-threaded and takes tens of seconds)."""
    if hotness.dim() != 1:
        raise ValueError(f"hotness must be 1-D (one score per node), got shape {tuple(hotness.shape)}")
    count = max(0, min(int(count), hotness.numel()))
    if count == 0:
        return torch.zeros(0, dtype=torch.int64)
    ranked = _hottest_by_histogram(hotness, count)
    if ranked is not None:
        return ranked.cpu()
    order = torch.sort(hotness, descending=True, stable=True).indices[:count]
    order = order[hotness[order] > 0]
    return order.cpu()


def _hottest_by_histogram(hotness: torch.Tensor, count: int) -> Optional[torch.Tensor]:
    """:func:`hottest` for integer scores in ``[0, top]`` with ``top * numel`` below 2**62; None
    for other scores (the caller sorts them). ``count`` is in ``[1, numel]``."""
    if hotness.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        return None
    n = hotness.numel()
    low, top = (int(v) for v in torch.aminmax(hotness))
    if low < 0 or top > max(_CHUNK, 4 * n) or (top + 1) * n >= 1 << 62:
        return None
    if top == 0:
        return torch.zeros(0, dtype=torch.int64, device=hotness.device)
    scores = hotness.long()
    # at_least[v]: how many rows score v or more; the cut is the highest score that, with every
    # score above it, reaches count rows.
    at_least = torch.bincount(scores, minlength=top + 1).flip(0).cumsum(0).flip(0)
    cut = int((at_least >= count).sum()) - 1
    above = (scores > max(cut, 0)).nonzero().squeeze(1)  # ascending ids
    # Unique keys (descending score, then ascending id) make an unstable sort the stable one.
    key = (top - scores[above]) * n + above
    ranked = above[torch.sort(key).indices]
    if cut <= 0:
        return ranked  # zero scores are never cached
    ties = (scores == cut).nonzero().squeeze(1)[:count - ranked.numel()]  # the lowest ids of the cut
    return torch.cat([ranked, ties])
