"""GraphSAGE (mean aggregation) over DGL-style blocks: PyTorch layers around the library's fused
mean-aggregation op."""

from __future__ import annotations

from typing import List, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from ..ops import block_mean


def mean_aggregate(h_src: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_dst: int) -> torch.Tensor:
    """Mean over each destination node's sampled in-neighbours (zero for none).

    One fused op per pass (:func:`pytorch_zerocopy.ops.block_mean`) instead of the nine small
    ones the same mean takes in ATen ops: a step is ~2 ms and paced by the trainer's host, which
    pays for every op it issues. Never synchronises with the device."""
    return block_mean(h_src, src, dst, num_dst)


class SAGEConv(nn.Module):
    """``h_dst' = W_self h_dst + W_neigh mean_{u in N(v)} h_u + b`` (GraphSAGE-mean).

    When the layer narrows (``out < in``), neighbours are projected before aggregating, which
    is the same function with fewer FLOPs (aggregation is linear).
    """

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.fc_self = nn.Linear(in_dim, out_dim, bias=True)
        self.fc_neigh = nn.Linear(in_dim, out_dim, bias=False)
        self.project_first = out_dim < in_dim

    def forward(self, block, h_src: torch.Tensor) -> torch.Tensor:
        src, dst = block.edges()
        n_dst = block.num_dst_nodes()
        h_dst = h_src[:n_dst]  # DGL convention: destination nodes come first among the sources
        if self.project_first:
            neigh = mean_aggregate(self.fc_neigh(h_src), src, dst, n_dst)
        else:
            neigh = self.fc_neigh(mean_aggregate(h_src, src, dst, n_dst))
        return self.fc_self(h_dst) + neigh


class GraphSAGE(nn.Module):
    """``len(blocks)`` SAGEConv layers with ReLU and dropout between them."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int, num_layers: int = 2, dropout: float = 0.3):
        super().__init__()
        dims: Sequence[int] = [in_dim] + [hidden] * (num_layers - 1) + [num_classes]
        self.layers = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = nn.Dropout(dropout)

    def forward(self, blocks: List, x: torch.Tensor) -> torch.Tensor:
        if len(blocks) != len(self.layers):
            raise ValueError(f"GraphSAGE has {len(self.layers)} layers but got {len(blocks)} blocks")
        h = x
        for i, (layer, block) in enumerate(zip(self.layers, blocks)):
            h = layer(block, h)
            if i + 1 < len(self.layers):
                h = self.dropout(F.relu(h))
        return h
