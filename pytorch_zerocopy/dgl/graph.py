"""``graph()``: a graph for the DGL-compatible loader, built as ``dgl.graph`` builds one.

The loader's graph is the package's one graph container, :class:`~pytorch_zerocopy.graph.CSRGraph`
(row ``u`` lists the destinations of ``u``'s out-edges) with DGL's node and edge data in its
``ndata`` / ``edata`` dicts. :func:`graph` builds it from DGL's graph data: edge ids are DGL's
(the position of each edge in the input), kept in ``eids``, so ``edata`` is indexed as in DGL.
"""

from __future__ import annotations

from typing import Dict, Optional

import numpy as np
import torch

from ..graph import CSRGraph


def _ids(x, name: str) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else torch.as_tensor(x)
    if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"graph: {name} must be a 1-D int32/int64 tensor of node ids, got {t.dtype} with "
                        f"shape {tuple(t.shape)}")
    return t.cpu().long()


def graph(data, num_nodes: Optional[int] = None, *, ndata: Optional[Dict[str, torch.Tensor]] = None,
          edata: Optional[Dict[str, torch.Tensor]] = None) -> CSRGraph:
    """A graph from DGL's graph data, as ``dgl.graph(data, num_nodes=...)``.

    ``data`` is ``(src, dst)`` or ``('coo', (src, dst))`` (edge ``i`` runs from ``src[i]`` to
    ``dst[i]`` and has id ``i``) or ``('csr', (indptr, indices, eids))`` (DGL's sparse form: row ``u`` of ``indices`` lists
    ``u``'s out-neighbours; ``eids`` the ids of those edges, or empty for their positions).
    ``num_nodes`` defaults to the largest id + 1. A ``(indptr, indices)`` pair is read as
    ``(src, dst)``, as DGL reads it: pass ``('csr', (indptr, indices, []))`` for CSR arrays.
    """
    if isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], str):
        fmt, arrays = data
        if fmt == "coo":
            return graph(tuple(arrays), num_nodes, ndata=ndata, edata=edata)
        if fmt != "csr":
            raise ValueError(f"graph: the sparse form {fmt!r} is not supported; use (src, dst), ('coo', (src, dst)) "
                             "or ('csr', (indptr, indices, eids))")
        if not isinstance(arrays, (tuple, list)) or len(arrays) != 3:
            raise ValueError("graph: the 'csr' form is ('csr', (indptr, indices, eids)); eids may be []")
        indptr, indices = _ids(arrays[0], "indptr"), _ids(arrays[1], "indices")
        eids = _ids(arrays[2], "eids") if len(arrays[2]) else None
        n = indptr.numel() - 1
        if num_nodes is not None and num_nodes != n:
            raise ValueError(f"graph: num_nodes={num_nodes} but indptr describes {n} nodes")
        if eids is not None and eids.numel() != indices.numel():
            raise ValueError(f"graph: eids must name every edge ({indices.numel()}), got {eids.numel()}")
        return CSRGraph(indptr, indices, eids=eids, ndata=ndata, edata=edata)
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError("graph: data must be (src, dst) or ('csr', (indptr, indices, eids)), "
                        f"got {type(data).__name__}")
    src, dst = _ids(data[0], "src"), _ids(data[1], "dst")
    if src.numel() != dst.numel():
        raise ValueError(f"graph: src and dst must list one node per edge, got {src.numel()} and {dst.numel()} ids "
                         "(for CSR arrays pass ('csr', (indptr, indices, eids)))")
    top = int(torch.maximum(src.max(), dst.max())) + 1 if src.numel() else 0
    if src.numel() and int(torch.minimum(src.min(), dst.min())) < 0:
        raise ValueError("graph: node ids must be >= 0")
    n = top if num_nodes is None else int(num_nodes)
    if top > n:
        raise ValueError(f"graph: node id {top - 1} is out of range for num_nodes={n}")
    order = torch.argsort(src, stable=True)  # row by row; edges of a row keep their input order
    indptr = torch.zeros(n + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(src, minlength=n), 0, out=indptr[1:])
    return CSRGraph(indptr, dst[order].contiguous(), eids=order, ndata=ndata, edata=edata, validate=False)
