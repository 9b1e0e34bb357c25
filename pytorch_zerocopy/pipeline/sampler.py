"""Uniform neighbour sampling on the CPU with torch ops, producing DGL-style blocks.

This is a small adapter with a deliberately narrow interface, ``sample_blocks``, so that the
library's sampling op can take its place without touching the pipeline.

Conventions (DGL's): ``blocks[0]`` is the layer nearest the input. A block's source nodes are
its destination nodes first, in the same order, followed by the other sampled neighbours in
order of first appearance; its edges are local ids (``src`` indexes the source nodes, ``dst``
the destination nodes). ``input_nodes`` are the global ids of ``blocks[0]``'s source nodes,
``output_nodes`` the seeds.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from ..block import Block


def _check_csr(indptr: torch.Tensor, indices: torch.Tensor) -> None:
    if not isinstance(indptr, torch.Tensor) or indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError("sample_blocks: indptr must be a 1-D tensor of num_nodes + 1 offsets")
    if indptr.dtype not in (torch.int32, torch.int64) or indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"sample_blocks: indptr and indices must be int32/int64, got {indptr.dtype} and {indices.dtype}"
        )
    if indptr.device.type != "cpu" or indices.device.type != "cpu":
        raise ValueError(
            f"sample_blocks samples on the CPU: indptr is on {indptr.device}, indices on {indices.device}"
        )


def _sample_without_replacement(deg: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """For each row, ``k`` distinct offsets in ``[0, deg)`` (every ``deg > k``), uniformly.

    Floyd's algorithm, vectorised over rows: step ``j`` draws ``t`` in ``[0, deg - k + j]`` and
    keeps it unless already chosen, in which case it keeps ``deg - k + j`` itself.
    """
    n = deg.numel()
    chosen = torch.empty(n, k, dtype=torch.int64)
    for j in range(k):
        upper = deg - k + j  # inclusive bound of this step's draw
        t = (torch.rand(n, generator=generator, dtype=torch.float64) * (upper + 1).to(torch.float64)).long()
        t = torch.minimum(t, upper)
        if j > 0:
            seen = (chosen[:, :j] == t.unsqueeze(1)).any(dim=1)
            t = torch.where(seen, upper, t)
        chosen[:, j] = t
    return chosen


def _sample_layer(
    indptr: torch.Tensor, indices: torch.Tensor, dst_nodes: torch.Tensor, fanout: int, generator: torch.Generator
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sampled in-neighbours of ``dst_nodes``: (global source ids, local destination ids)."""
    start = indptr[dst_nodes].long()
    deg = indptr[dst_nodes + 1].long() - start
    local = torch.arange(dst_nodes.numel(), dtype=torch.int64)
    take_all = deg <= fanout if fanout >= 0 else torch.ones_like(deg, dtype=torch.bool)

    # Rows with at most `fanout` neighbours keep all of them.
    all_rows = local[take_all]
    all_deg = deg[take_all]
    rep_dst = torch.repeat_interleave(all_rows, all_deg)
    row_start = torch.repeat_interleave(start[take_all], all_deg)
    first = torch.repeat_interleave(torch.cumsum(all_deg, 0) - all_deg, all_deg)
    pos_all = row_start + (torch.arange(rep_dst.numel(), dtype=torch.int64) - first)

    # Rows with more keep `fanout` distinct neighbours chosen uniformly.
    some_rows = local[~take_all]
    if some_rows.numel() > 0:
        offs = _sample_without_replacement(deg[~take_all], fanout, generator)
        pos_some = (start[~take_all].unsqueeze(1) + offs).reshape(-1)
        dst_some = some_rows.repeat_interleave(fanout)
        pos = torch.cat([pos_all, pos_some])
        dst = torch.cat([rep_dst, dst_some])
    else:
        pos, dst = pos_all, rep_dst
    return indices[pos].long(), dst


def _relabel(dst_nodes: torch.Tensor, src_global: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Unique source nodes (destination nodes first, then first appearance) and local src ids.

    Sort-based: a stable sort groups equal ids with their first occurrence leading each group.
    """
    both = torch.cat([dst_nodes, src_global])
    values, order = torch.sort(both, stable=True)
    starts = torch.ones(both.numel(), dtype=torch.bool)
    starts[1:] = values[1:] != values[:-1]
    group = torch.cumsum(starts, 0) - 1  # group id of each sorted element
    first = order[starts]  # position of each unique id's first occurrence
    rank_of_group = torch.empty_like(first)
    by_first = torch.argsort(first)
    rank_of_group[by_first] = torch.arange(first.numel(), dtype=torch.int64)
    local = torch.empty_like(order)
    local[order] = rank_of_group[group]
    return both[first[by_first]], local[dst_nodes.numel():]


def sample_blocks(
    indptr: torch.Tensor,
    indices: torch.Tensor,
    seeds: torch.Tensor,
    fanouts: Sequence[int],
    generator: torch.Generator,
) -> Tuple[torch.Tensor, torch.Tensor, List[Block]]:
    """Samples a ``len(fanouts)``-layer neighbourhood of ``seeds`` over a CSR graph.

    ``indptr[v]:indptr[v+1]`` indexes ``indices`` for the (in-)neighbours of ``v``.
    ``fanouts[0]`` is the fan-out of the layer nearest the input (DGL's order); ``-1`` keeps every
    neighbour. Neighbours are chosen uniformly without replacement. Deterministic for a given
    generator state. Returns ``(input_nodes, output_nodes, blocks)``.
    """
    _check_csr(indptr, indices)
    if not isinstance(seeds, torch.Tensor) or seeds.dim() != 1:
        raise ValueError("sample_blocks: seeds must be a 1-D tensor of node ids")
    fanouts = [int(f) for f in fanouts]
    if not fanouts or any(f == 0 or f < -1 for f in fanouts):
        raise ValueError(f"sample_blocks: fanouts must be positive (or -1 for all), got {fanouts}")
    num_nodes = indptr.numel() - 1
    seeds = seeds.to("cpu", torch.int64)
    if seeds.numel() and (int(seeds.min()) < 0 or int(seeds.max()) >= num_nodes):
        raise IndexError(f"sample_blocks: seeds must lie in [0, {num_nodes})")

    blocks: List[Block] = []
    dst_nodes = seeds
    for fanout in reversed(fanouts):
        src_global, dst_local = _sample_layer(indptr, indices, dst_nodes, fanout, generator)
        src_nodes, src_local = _relabel(dst_nodes, src_global)
        blocks.insert(0, Block(src_local, dst_local, src_nodes.numel(), dst_nodes.numel(), nodes=src_nodes))
        dst_nodes = src_nodes
    return dst_nodes, seeds, blocks
