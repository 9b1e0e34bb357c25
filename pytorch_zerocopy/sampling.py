"""Neighbour sampling over a CSR/CSC adjacency held in CPU, GPU or unified (host-mapped) memory.

One layer: :func:`sample_neighbors` picks, for every seed node, up to ``fanout`` entries of its
neighbour list (``indices[indptr[v]:indptr[v+1]]``). With a CSC adjacency (DGL's default
``edge_dir='in'``) the list holds in-neighbours; with a CSR one, out-neighbours. Several layers:
:func:`sample_layers` samples outward from the seeds with one fanout per layer and compacts each
layer into a message flow graph (unique nodes, destination nodes first; relabelled edges).

Where it runs. On the GPU when the adjacency is a CUDA tensor or a unified tensor on a machine
with a GPU (the kernel reads the neighbour lists from host memory over PCIe: DGL's "UVA
sampling"); on the CPU otherwise, multithreaded. Seeds are moved to that device.

Determinism. Every random draw is a hash of ``(seed, seed node id, draw number)``: a given seed
gives the same sample on every run and every thread count, and the CPU and CUDA kernels give
identical uniform samples. Layer ``l`` uses a seed derived from ``(seed, l)``, so a node that is a
seed in two layers gets independent samples in each.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

import torch

from . import unified as _unified
from .block import Block
from ._compat import register_fake

__all__ = [
    "Adjacency",
    "Block",
    "SampledNeighbors",
    "adjacency_of",
    "compact",
    "csr_to_csc",
    "sample_layers",
    "sample_neighbors",
]

_MASK64 = (1 << 64) - 1


class SampledNeighbors(NamedTuple):
    """One layer's raw sample. Seed ``i`` got ``neighbors[offsets[i]:offsets[i+1]]``, found at
    positions ``edge_pos[...]`` of the adjacency's ``indices``."""

    offsets: torch.Tensor  # int64, len(seeds) + 1
    neighbors: torch.Tensor  # dtype of indices
    edge_pos: torch.Tensor  # int64
    seed_index: torch.Tensor  # int64: the i of the seed each sampled edge belongs to


class Adjacency(NamedTuple):
    """A neighbour-list view of a graph.

    ``indptr`` (int64, num_nodes + 1) and ``indices`` list each node's neighbours; ``eids``, if
    given, maps a position in ``indices`` to the graph's edge id (absent: the position is the
    id); ``probs``, if given, holds one sampling weight per position of ``indices``.
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    eids: Optional[torch.Tensor] = None
    probs: Optional[torch.Tensor] = None

    @property
    def num_nodes(self) -> int:
        return self.indptr.numel() - 1


def _compute_device(t: torch.Tensor) -> torch.device:
    """Where an op on ``t`` runs: its own device; for a unified tensor, its GPU or the CPU."""
    if _unified.is_unified(t):
        if not _unified.gpu_backed():
            return torch.device("cpu")
        index = t.device.index if t.device.index is not None else torch.cuda.current_device()
        return torch.device("cuda", index)
    return t.device


def sample_neighbors(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    seeds: torch.Tensor,
    fanout: int,
    *,
    replace: bool = False,
    probs: Optional[torch.Tensor] = None,
    seed: Optional[int] = None,
) -> SampledNeighbors:
    """Samples up to ``fanout`` neighbours of every node in ``seeds`` (see the module doc).

    ``fanout=-1`` takes every neighbour (every one with a positive probability when ``probs``
    is given). Without replacement a seed gets ``min(fanout, degree)`` distinct edges; with
    replacement exactly ``fanout`` (none when it has no neighbour). Edges with probability
    ``<= 0`` are never sampled. ``seed=None`` draws one from torch's default generator.
    """
    for name, t in (("indptr", indptr), ("indices", indices), ("seeds", seeds)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"sample_neighbors: {name} must be a tensor, got {type(t).__name__}")
    if isinstance(fanout, bool) or not isinstance(fanout, int):
        raise TypeError(f"sample_neighbors: fanout must be an int, got {type(fanout).__name__}")
    if fanout < -1:
        raise ValueError(f"sample_neighbors: fanout must be -1 (all neighbours) or >= 0, got {fanout}")
    if indptr.dtype != torch.int64:
        indptr = indptr.long()
    if probs is not None:
        if not isinstance(probs, torch.Tensor):
            raise TypeError(f"sample_neighbors: probs must be a tensor, got {type(probs).__name__}")
        if probs.dim() != 1 or probs.numel() != indices.numel():
            raise ValueError(
                f"sample_neighbors: probs must hold one value per edge ({indices.numel()} edges), "
                f"got shape {tuple(probs.shape)}"
            )
        if probs.dtype != torch.float32:
            if not probs.is_floating_point():
                raise TypeError(f"sample_neighbors: probs must be a floating tensor, got {probs.dtype}")
            probs = probs.float()
    if seeds.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"sample_neighbors: seeds must be int32 or int64, got {seeds.dtype}")
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    device = _compute_device(indptr)
    seeds = seeds.reshape(-1).to(device)
    out = torch.ops.zerocopy.sample_neighbors.default(
        indptr, indices, seeds, int(fanout), bool(replace), probs, _signed64(int(seed))
    )
    return SampledNeighbors(*out)


def _signed64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= (1 << 63) else x


def _mix64(z: int) -> int:
    """splitmix64's finaliser (the same mixer the kernels use), on Python ints."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def layer_seed(seed: int, layer: int) -> int:
    """The seed of layer ``layer`` of a multi-layer sample drawn with ``seed``."""
    return _mix64((seed & _MASK64) ^ _mix64(layer + 1))


@register_fake("zerocopy::sample_neighbors")
def _sample_neighbors_fake(indptr, indices, seeds, fanout, replace, probs, seed):
    ctx = torch.library.get_ctx()
    total = ctx.new_dynamic_size()
    offsets = seeds.new_empty((seeds.shape[0] + 1,), dtype=torch.int64)
    return (offsets, indices.new_empty((total,)), indptr.new_empty((total,)),
            indptr.new_empty((total,)))


# ----------------------------------------------------------------------------------------------
# Compaction (message flow graphs).


@register_fake("zerocopy::compact_ids")
def _compact_ids_fake(seeds, neighbors):
    ctx = torch.library.get_ctx()
    nodes = seeds.new_empty((ctx.new_dynamic_size(),), dtype=torch.int64)
    return nodes, neighbors.new_empty(neighbors.shape, dtype=torch.int64)


def compact(seeds: torch.Tensor, neighbors: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Unique node ids of ``cat(seeds, neighbors)`` in order of first appearance, and the
    position of each neighbour in that list.

    With unique seeds the list starts with the seeds themselves, in order (the destination
    nodes of a message flow graph come first), so seed ``i`` has local id ``i``. On the CPU a
    parallel hash-table op (``zerocopy::compact_ids``); elsewhere torch ops on the tensors'
    device.
    """
    if seeds.device.type == "cpu" and neighbors.device.type == "cpu":
        nodes, local = torch.ops.zerocopy.compact_ids.default(seeds, neighbors)
        return nodes, local
    return _compact_torch(seeds, neighbors)


def _compact_torch(seeds: torch.Tensor, neighbors: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`compact` with torch ops (sort-based unique; fast on the GPU)."""
    seeds = seeds.long()
    all_ids = torch.cat([seeds, neighbors.to(device=seeds.device, dtype=torch.int64)])
    uniq, inverse = torch.unique(all_ids, return_inverse=True)
    positions = torch.arange(all_ids.numel(), device=all_ids.device)
    first = torch.full((uniq.numel(),), all_ids.numel(), dtype=torch.int64, device=all_ids.device)
    first.scatter_reduce_(0, inverse, positions, reduce="amin")
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    local = rank[inverse]
    return uniq[order], local[seeds.numel():]


def csr_to_csc(indptr: torch.Tensor, indices: torch.Tensor, num_nodes: Optional[int] = None) -> Adjacency:
    """The transpose of a CSR adjacency, with ``eids`` mapping each CSC position to the CSR
    position (the edge id) it came from. Runs with torch ops where the inputs are."""
    if _unified.is_unified(indptr) or _unified.is_unified(indices):
        indptr, indices = indptr.cpu(), indices.cpu()
    n = indptr.numel() - 1 if num_nodes is None else num_nodes
    indptr = indptr.long()
    deg = indptr[1:] - indptr[:-1]
    src = torch.repeat_interleave(torch.arange(n, device=indptr.device), deg)
    dst = indices.long()
    order = torch.argsort(dst, stable=True)
    counts = torch.bincount(dst, minlength=n)
    t_indptr = torch.zeros(n + 1, dtype=torch.int64, device=indptr.device)
    torch.cumsum(counts, 0, out=t_indptr[1:])
    return Adjacency(t_indptr, src[order].to(indices.dtype), order)


def adjacency_of(graph, edge_dir: str = "in") -> Adjacency:
    """The neighbour lists to sample from for ``edge_dir``.

    ``graph`` is an :class:`Adjacency`, a ``(indptr, indices)`` pair, or an object with
    ``indptr``/``indices`` attributes (a CSR graph: row ``v`` lists ``v``'s out-neighbours).
    ``edge_dir='out'`` uses those lists as they are; ``'in'`` needs in-neighbours: an object's
    ``csc()`` method if it has one, else the transpose computed here.
    """
    if edge_dir not in ("in", "out"):
        raise ValueError(f"edge_dir must be 'in' or 'out', got {edge_dir!r}")
    if isinstance(graph, Adjacency):
        return graph
    if isinstance(graph, (tuple, list)) and len(graph) in (2, 3):
        indptr, indices = graph[0], graph[1]
        eids = graph[2] if len(graph) == 3 else None
    elif hasattr(graph, "indptr") and hasattr(graph, "indices"):
        if edge_dir == "in" and callable(getattr(graph, "csc", None)):
            return adjacency_of(graph.csc(), "out")
        indptr, indices, eids = graph.indptr, graph.indices, getattr(graph, "eids", None)
    else:
        raise TypeError(
            "graph must be an Adjacency, an (indptr, indices) pair or an object with indptr and "
            f"indices attributes, got {type(graph).__name__}"
        )
    if edge_dir == "out":
        return Adjacency(indptr, indices, eids)
    csc = csr_to_csc(indptr, indices)
    ceids = csc.eids if eids is None else eids.cpu()[csc.eids]
    return Adjacency(csc.indptr, csc.indices, ceids)


def _check_seeds(seeds: torch.Tensor, num_nodes: int) -> torch.Tensor:
    if not isinstance(seeds, torch.Tensor):
        seeds = torch.as_tensor(seeds)
    if seeds.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"seeds must be an int32 or int64 tensor, got {seeds.dtype}")
    seeds = seeds.reshape(-1)
    if seeds.numel():
        lo, hi = int(seeds.min()), int(seeds.max())
        if lo < 0 or hi >= num_nodes:
            bad = lo if lo < 0 else hi
            raise IndexError(f"seeds: node id {bad} is out of range for a graph with {num_nodes} nodes")
        if torch.unique(seeds).numel() != seeds.numel():
            raise ValueError("seeds must not repeat a node id (message flow graphs number each once)")
    return seeds


def sample_layers(
    graph,
    seeds: torch.Tensor,
    fanouts: Sequence[int],
    *,
    edge_dir: str = "in",
    replace: bool = False,
    probs: Optional[torch.Tensor] = None,
    seed: Optional[int] = None,
) -> List[Block]:
    """Multi-layer neighbour sampling, DGL's NeighborSampler order.

    ``fanouts[i]`` is the fanout of layer ``i`` counted from the input side: the last fanout is
    applied to ``seeds`` first, and the returned list of :class:`~pytorch_zerocopy.block.Block`
    starts with the layer farthest from the seeds (``result[0].nodes`` are the input nodes,
    ``result[-1].nodes[:len(seeds)]`` the seeds). Block ``l``'s edges run from the sampled
    neighbour (``src``) to the seed that sampled it (``dst``), whatever ``edge_dir``; its
    ``eids`` are the graph's ids of those edges.
    ``graph`` is anything :func:`adjacency_of` accepts (for ``edge_dir='in'`` pass an
    :class:`Adjacency` over the CSC to avoid recomputing the transpose); ``probs`` is one weight
    per edge id (or use ``Adjacency.probs``, one per position).
    """
    fanouts = list(fanouts)
    if not fanouts:
        raise ValueError("fanouts must hold at least one fanout (one per layer)")
    for f in fanouts:
        if isinstance(f, bool) or not isinstance(f, int) or f < -1:
            raise ValueError(f"fanouts must be ints >= 0 or -1 (all neighbours), got {fanouts}")
    adj = adjacency_of(graph, edge_dir)
    pos_probs = adj.probs
    if probs is not None:
        if probs.numel() != adj.indices.numel():
            raise ValueError(
                f"probs must hold one value per edge ({adj.indices.numel()} edges), got {probs.numel()}"
            )
        pos_probs = probs if adj.eids is None else probs[adj.eids.to(probs.device)]
    device = _compute_device(adj.indptr)
    if pos_probs is not None and not _unified.is_unified(pos_probs):
        pos_probs = pos_probs.to(device)
    seeds = _check_seeds(seeds, adj.num_nodes).to(device).long()
    if seed is None:
        seed = int(torch.randint(0, 2**62, ()).item())
    layers: List[Block] = []
    for depth, fanout in enumerate(reversed(fanouts)):
        s = sample_neighbors(adj.indptr, adj.indices, seeds, fanout, replace=replace,
                             probs=pos_probs, seed=layer_seed(seed, depth))
        nodes, src_local = compact(seeds, s.neighbors)
        eids = s.edge_pos if adj.eids is None else adj.eids[s.edge_pos.to(_compute_device(adj.eids))]
        layers.append(Block(src_local, s.seed_index, nodes.numel(), seeds.numel(), nodes=nodes,
                            eids=eids.to(device)))
        seeds = nodes
    layers.reverse()
    return layers
