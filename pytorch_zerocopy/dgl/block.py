"""Message flow graphs (blocks) and the graph container used when DGL is not installed."""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import torch

from .. import sampling as _sampling

NID = "_ID"  # DGL's names for the original node / edge ids of a block's nodes / edges
EID = "_ID"


class Block:
    """A bipartite message flow graph: ``num_src_nodes()`` source nodes, the first
    ``num_dst_nodes()`` of which are also the destination nodes, and edges from source to
    destination (local ids). The attributes mirror what DGL's GNN layers read from a DGL block.

    ``srcdata[NID]`` / ``dstdata[NID]`` hold the original node ids and ``edata[EID]`` the
    original edge ids, as in DGL.
    """

    is_block = True

    def __init__(self, src: torch.Tensor, dst: torch.Tensor, num_src: int, num_dst: int):
        self._src = src
        self._dst = dst
        self._num_src = int(num_src)
        self._num_dst = int(num_dst)
        self.srcdata: Dict[str, torch.Tensor] = {}
        self.dstdata: Dict[str, torch.Tensor] = {}
        self.edata: Dict[str, torch.Tensor] = {}

    @property
    def device(self) -> torch.device:
        return self._src.device

    def num_src_nodes(self) -> int:
        return self._num_src

    def num_dst_nodes(self) -> int:
        return self._num_dst

    def num_edges(self) -> int:
        return self._src.numel()

    def edges(self, form: str = "uv") -> Tuple[torch.Tensor, ...]:
        """``(src, dst)`` local ids (``form='all'`` adds the edge positions 0..E-1)."""
        if form == "uv":
            return self._src, self._dst
        if form == "all":
            return self._src, self._dst, torch.arange(self.num_edges(), device=self.device)
        raise ValueError(f"edges: form must be 'uv' or 'all', got {form!r}")

    def in_degrees(self) -> torch.Tensor:
        return torch.bincount(self._dst, minlength=self._num_dst)

    def to(self, device: Union[str, torch.device], non_blocking: bool = False) -> "Block":
        out = Block(self._src.to(device, non_blocking=non_blocking),
                    self._dst.to(device, non_blocking=non_blocking), self._num_src, self._num_dst)
        for mine, theirs in ((self.srcdata, out.srcdata), (self.dstdata, out.dstdata),
                             (self.edata, out.edata)):
            for k, v in mine.items():
                theirs[k] = v.to(device, non_blocking=non_blocking)
        return out

    def __repr__(self) -> str:
        return (f"Block(num_src_nodes={self._num_src}, num_dst_nodes={self._num_dst}, "
                f"num_edges={self.num_edges()}, device={self.device})")


class Graph:
    """A graph for the loader when DGL is absent: CSR structure (row ``v`` lists ``v``'s
    out-neighbours; edge id = CSR position) plus node and edge data dicts, as DGL's ``ndata``
    and ``edata``.

    ``csr`` is an ``(indptr, indices)`` pair or any object with ``indptr``/``indices``
    attributes (such as :class:`pytorch_zerocopy.graph.CSRGraph`). The in-neighbour lists that
    ``edge_dir='in'`` sampling needs are computed on first use and kept.
    """

    def __init__(self, csr, ndata: Optional[Dict[str, torch.Tensor]] = None,
                 edata: Optional[Dict[str, torch.Tensor]] = None):
        if isinstance(csr, (tuple, list)):
            self.indptr, self.indices = csr[0], csr[1]
        elif hasattr(csr, "indptr") and hasattr(csr, "indices"):
            self.indptr, self.indices = csr.indptr, csr.indices
        else:
            raise TypeError("Graph needs an (indptr, indices) pair or an object with indptr and "
                            f"indices attributes, got {type(csr).__name__}")
        self.source = csr
        self.ndata: Dict[str, torch.Tensor] = dict(ndata or getattr(csr, "ndata", None) or {})
        self.edata: Dict[str, torch.Tensor] = dict(edata or getattr(csr, "edata", None) or {})
        self._csc: Optional[_sampling.Adjacency] = None

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    def num_edges(self) -> int:
        return self.indices.numel()

    def csc(self) -> _sampling.Adjacency:
        """In-neighbour lists with ``eids`` mapping each position to the CSR edge id."""
        if self._csc is None:
            self._csc = _sampling.csr_to_csc(self.indptr, self.indices)
        return self._csc
