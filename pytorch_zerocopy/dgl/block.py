"""The graph container used when DGL is not installed (blocks: :mod:`pytorch_zerocopy.block`)."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from .. import sampling as _sampling
from ..graph.csr import CSRGraph

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
        self._csc: Optional[CSRGraph] = None

    @property
    def device(self) -> torch.device:
        return self.indptr.device

    def num_nodes(self) -> int:
        return self.indptr.numel() - 1

    def num_edges(self) -> int:
        return self.indices.numel()

    def csc(self) -> CSRGraph:
        """In-neighbour lists with ``eids`` mapping each position to the CSR edge id."""
        if self._csc is None:
            self._csc = _sampling.as_csr_graph((self.indptr, self.indices)).csc()
        return self._csc
