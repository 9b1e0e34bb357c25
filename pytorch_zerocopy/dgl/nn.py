"""GNN layers over this package's :class:`~pytorch_zerocopy.block.Block` (no DGL needed)."""

from __future__ import annotations

from typing import Callable, Optional, Tuple, Union

import torch
from torch import nn


class SAGEConv(nn.Module):
    """GraphSAGE with mean aggregation (DGL's ``SAGEConv(..., aggregator_type='mean')``):

    ``h_dst' = W_self h_dst + W_neigh mean_{u -> dst} h_u (+ bias)``, then ``norm`` and
    ``activation`` if given. ``feat`` is the source nodes' features (the destination nodes are
    the first ``num_dst_nodes()`` of them) or a ``(src_feat, dst_feat)`` pair. A destination
    without in-edges aggregates zeros.
    """

    def __init__(self, in_feats: int, out_feats: int, aggregator_type: str = "mean",
                 feat_drop: float = 0.0, bias: bool = True, norm: Optional[Callable] = None,
                 activation: Optional[Callable] = None):
        super().__init__()
        if aggregator_type != "mean":
            raise NotImplementedError(f"SAGEConv: only the 'mean' aggregator is implemented, got {aggregator_type!r}")
        self.in_feats, self.out_feats = in_feats, out_feats
        self.feat_drop = nn.Dropout(feat_drop)
        self.fc_self = nn.Linear(in_feats, out_feats, bias=False)
        self.fc_neigh = nn.Linear(in_feats, out_feats, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_feats)) if bias else None
        self.norm, self.activation = norm, activation
        gain = nn.init.calculate_gain("relu")
        nn.init.xavier_uniform_(self.fc_self.weight, gain=gain)
        nn.init.xavier_uniform_(self.fc_neigh.weight, gain=gain)

    def forward(self, block, feat: Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        if isinstance(feat, tuple):
            h_src, h_dst = self.feat_drop(feat[0]), self.feat_drop(feat[1])
        else:
            h_src = self.feat_drop(feat)
            h_dst = h_src[: block.num_dst_nodes()]
        if h_src.shape[0] != block.num_src_nodes():
            raise ValueError(f"SAGEConv: feat has {h_src.shape[0]} rows, the block has "
                             f"{block.num_src_nodes()} source nodes")
        src, dst = block.edges()
        n_dst = block.num_dst_nodes()
        summed = h_src.new_zeros((n_dst, h_src.shape[1])).index_add_(0, dst, h_src[src])
        deg = torch.bincount(dst, minlength=n_dst).clamp_(min=1).to(h_src.dtype).unsqueeze(1)
        out = self.fc_self(h_dst) + self.fc_neigh(summed / deg)
        if self.bias is not None:
            out = out + self.bias
        if self.norm is not None:
            out = self.norm(out)
        if self.activation is not None:
            out = self.activation(out)
        return out
