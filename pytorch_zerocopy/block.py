"""The one block type of the package: a message flow graph between two layers of a minibatch.

:func:`pytorch_zerocopy.sampling.sample_layers` produces blocks; the training pipeline, the
DGL-compatible loader and the GraphSAGE layers consume them. The attributes and methods mirror
what DGL's GNN layers read from a DGL block, so a layer written for DGL blocks runs on these.

Conventions (DGL's): a block has ``num_src`` source nodes, the first ``num_dst`` of which are
also its destination nodes, in the same order; ``src``/``dst`` are the edges' local endpoints
(``src`` indexes the source nodes, ``dst`` the destination nodes). ``blocks[0]`` of a minibatch
is the layer nearest the input. ``srcdata[NID]`` / ``dstdata[NID]`` hold the nodes' global ids
and ``edata[EID]`` the edges' ids in the graph, when the producer of the block knows them.

Aliasing: a block holds references, not copies: ``dstdata[NID]`` is a view of
``srcdata[NID]``; :meth:`to` returns a new block whose tensors are on the target device
(the same tensors when they already are).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch

NID = "_ID"  # DGL's key of the original node ids in srcdata/dstdata
EID = "_ID"  # DGL's key of the original edge ids in edata

__all__ = ["Block", "EID", "NID"]


class Block:
    """A bipartite message flow graph (see the module docstring).

    ``src`` and ``dst``: local edge endpoints, one integer tensor each, of one length, on one
    device. ``nodes``: the global ids of the source nodes (optional); ``eids``: the graph's
    ids of the edges (optional). Neither is validated here: producers guarantee
    ``0 <= src < num_src`` and ``0 <= dst < num_dst``.
    """

    is_block = True

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int,
                 nodes: Optional[torch.Tensor] = None, eids: Optional[torch.Tensor] = None):
        self.src = src
        self.dst = dst
        self.num_src = int(num_src)
        self.num_dst = int(num_dst)
        if self.num_dst > self.num_src:
            raise ValueError(f"Block: num_dst ({self.num_dst}) cannot exceed num_src ({self.num_src}): "
                             "the destination nodes are the first source nodes")
        self.srcdata: Dict[str, torch.Tensor] = {}
        self.dstdata: Dict[str, torch.Tensor] = {}
        self.edata: Dict[str, torch.Tensor] = {}
        if nodes is not None:
            self.srcdata[NID] = nodes
            self.dstdata[NID] = nodes[: self.num_dst]
        if eids is not None:
            self.edata[EID] = eids

    # --- DGL's block interface ----------------------------------------------------------

    @property
    def device(self) -> torch.device:
        return self.src.device

    def num_src_nodes(self) -> int:
        return self.num_src

    def num_dst_nodes(self) -> int:
        return self.num_dst

    def num_edges(self) -> int:
        return int(self.src.numel())

    def edges(self, form: str = "uv") -> Tuple[torch.Tensor, ...]:
        """``(src, dst)`` local ids; ``form='all'`` adds the edge positions ``0..E-1``."""
        if form == "uv":
            return self.src, self.dst
        if form == "all":
            return self.src, self.dst, torch.arange(self.num_edges(), device=self.device)
        raise ValueError(f"edges: form must be 'uv' or 'all', got {form!r}")

    def in_degrees(self) -> torch.Tensor:
        """Sampled in-degree of each destination node (int64)."""
        return torch.bincount(self.dst, minlength=self.num_dst)

    # --- ids -----------------------------------------------------------------------------

    @property
    def nodes(self) -> Optional[torch.Tensor]:
        """Global ids of the source nodes (destination nodes first), or None."""
        return self.srcdata.get(NID)

    @property
    def eids(self) -> Optional[torch.Tensor]:
        """The graph's ids of the edges, or None."""
        return self.edata.get(EID)

    # --- placement -----------------------------------------------------------------------

    def to(self, device: Union[str, torch.device], non_blocking: bool = False) -> "Block":
        """The block with every tensor (edges and data) on ``device``."""
        out = Block(self.src.to(device, non_blocking=non_blocking),
                    self.dst.to(device, non_blocking=non_blocking), self.num_src, self.num_dst)
        for mine, theirs in ((self.srcdata, out.srcdata), (self.dstdata, out.dstdata),
                             (self.edata, out.edata)):
            for k, v in mine.items():
                theirs[k] = v.to(device, non_blocking=non_blocking)
        if NID in out.srcdata:  # keep dstdata[NID] a view of srcdata[NID]
            out.dstdata[NID] = out.srcdata[NID][: self.num_dst]
        return out

    def __repr__(self) -> str:
        return (f"Block(num_src_nodes={self.num_src}, num_dst_nodes={self.num_dst}, "
                f"num_edges={self.num_edges()}, device={self.device})")
