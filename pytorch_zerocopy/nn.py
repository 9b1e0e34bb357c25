"""GNN layers over :class:`~pytorch_zerocopy.block.Block` (or any object with DGL's block
interface: ``edges()``, ``num_src_nodes()``, ``num_dst_nodes()``), built on the fused
mean-aggregation op :func:`pytorch_zerocopy.ops.block_mean`.

:class:`SAGEConv` has the signature and parameters of DGL's ``dgl.nn.SAGEConv`` with the
``'mean'`` aggregator, so a model written for DGL runs on it (``pytorch_zerocopy.dgl.nn``
re-exports it). :class:`GraphSAGE` is the model the training pipeline trains.

Host cost: a layer issues a fixed number of ops and never synchronises with the device, so a
training step can be captured in a CUDA graph (:mod:`pytorch_zerocopy.pipeline.train_step`).
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn
from torch.nn import functional as F

from .ops import block_mean

__all__ = ["GraphSAGE", "SAGEConv"]

Feats = Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]


def _pair(x: Union[int, Tuple[int, int]], name: str) -> Tuple[int, int]:
    pair = tuple(x) if isinstance(x, (tuple, list)) else (x, x)
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in pair):
        raise ValueError(f"SAGEConv: {name} must be a positive int or a pair of them, got {x!r}")
    return pair


class SAGEConv(nn.Module):
    """GraphSAGE with mean aggregation, DGL's ``SAGEConv(in_feats, out_feats, 'mean', ...)``:

    ``h_dst' = W_self h_dst + W_neigh mean_{u -> dst} h_u + bias``, then ``norm`` and
    ``activation`` when given. A destination without in-edges aggregates zeros.

    ``in_feats`` is an int or a ``(source, destination)`` pair of widths. ``forward(block,
    feat)`` takes the source nodes' features (the destination nodes are the first
    ``num_dst_nodes()`` of them, DGL's convention) or a ``(src_feat, dst_feat)`` pair. Parameters
    are DGL's: ``fc_self.weight``, ``fc_neigh.weight`` and ``bias``, initialised as DGL does.

    When the layer narrows (``out_feats < source width``) neighbours are projected before they
    are aggregated: the same function (aggregation is linear) with fewer FLOPs, as DGL does.
    """

    def __init__(self, in_feats: Union[int, Tuple[int, int]], out_feats: int, aggregator_type: str = "mean",
                 feat_drop: float = 0.0, bias: bool = True, norm: Optional[Callable] = None,
                 activation: Optional[Callable] = None):
        super().__init__()
        if aggregator_type != "mean":
            raise NotImplementedError(f"SAGEConv: only the 'mean' aggregator is implemented, got {aggregator_type!r}")
        in_src, in_dst = _pair(in_feats, "in_feats")
        if isinstance(out_feats, bool) or not isinstance(out_feats, int) or out_feats < 1:
            raise ValueError(f"SAGEConv: out_feats must be a positive int, got {out_feats!r}")
        if not 0.0 <= float(feat_drop) < 1.0:
            raise ValueError(f"SAGEConv: feat_drop must be in [0, 1), got {feat_drop}")
        self.in_feats, self.out_feats = in_feats, out_feats
        self._aggre_type = aggregator_type
        self.feat_drop = nn.Dropout(feat_drop)
        self.fc_self = nn.Linear(in_dst, out_feats, bias=False)
        self.fc_neigh = nn.Linear(in_src, out_feats, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_feats)) if bias else None
        self.norm, self.activation = norm, activation
        self.project_first = out_feats < in_src
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """DGL's initialisation: Xavier-uniform weights (ReLU gain), zero bias."""
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _drop(self, h: torch.Tensor) -> torch.Tensor:
        return self.feat_drop(h) if self.feat_drop.p > 0 else h  # no op issued when off

    def forward(self, block, feat: Feats, edge_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        if edge_weight is not None:
            raise NotImplementedError("SAGEConv: edge_weight is not supported by the fused mean aggregation")
        n_src, n_dst = block.num_src_nodes(), block.num_dst_nodes()
        if isinstance(feat, (tuple, list)):
            h_src, h_dst = self._drop(feat[0]), self._drop(feat[1])
        else:
            h_src = self._drop(feat)
            h_dst = h_src[:n_dst]
        if h_src.shape[0] != n_src or h_dst.shape[0] != n_dst:
            raise ValueError(f"SAGEConv: got {h_src.shape[0]} source and {h_dst.shape[0]} destination feature rows "
                             f"for a block of {n_src} source and {n_dst} destination nodes")
        src, dst = block.edges()
        if self.project_first:
            neigh = block_mean(self.fc_neigh(h_src), src, dst, n_dst)
        else:
            neigh = self.fc_neigh(block_mean(h_src, src, dst, n_dst))
        # The bias rides on the self projection's matmul (one addmm, no separate add).
        out = F.linear(h_dst, self.fc_self.weight, self.bias) + neigh
        if self.norm is not None:
            out = self.norm(out)
        if self.activation is not None:
            out = self.activation(out)
        return out

    def extra_repr(self) -> str:
        return f"{self.in_feats}, {self.out_feats}, aggregator_type='mean', project_first={self.project_first}"


def _linear_init(conv: SAGEConv) -> None:
    """torch's ``nn.Linear`` initialisation for a layer's weights (Kaiming-uniform) and bias
    (uniform in +-1/sqrt(fan-in))."""
    conv.fc_self.reset_parameters()
    conv.fc_neigh.reset_parameters()
    if conv.bias is not None:
        bound = 1.0 / math.sqrt(conv.fc_self.in_features)
        nn.init.uniform_(conv.bias, -bound, bound)


class GraphSAGE(nn.Module):
    """``num_layers`` :class:`SAGEConv` layers, ReLU and dropout between them: ``forward(blocks,
    x)`` maps the input nodes' features ``x`` (rows of ``blocks[0]``'s source nodes) to one row
    of logits per output node (``blocks[-1]``'s destination nodes).

    Its layers start from torch's ``nn.Linear`` initialisation (Kaiming-uniform weights,
    uniform bias), not :class:`SAGEConv`'s DGL (Xavier) one."""

    def __init__(self, in_feats: int, hidden: int, num_classes: int, num_layers: int = 2, dropout: float = 0.3):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"GraphSAGE: num_layers must be >= 1, got {num_layers}")
        dims: Sequence[int] = [in_feats] + [hidden] * (num_layers - 1) + [num_classes]
        self.layers = nn.ModuleList(SAGEConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        for conv in self.layers:
            _linear_init(conv)
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
