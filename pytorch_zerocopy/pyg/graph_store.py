"""PyG's ``GraphStore`` over a host-resident :class:`~pytorch_zerocopy.graph.CSRGraph`.

The store holds one homogeneous edge set as its in-neighbour lists: a ``CSRGraph`` whose row
``v`` lists the sources of ``v``'s in-edges (PyG's CSC layout: ``colptr`` = its ``indptr``,
``row`` = its ``indices``) with ``eids`` mapping each position to the edge's id, the column of
the edge in the ``edge_index`` it was built from (``None``: the position is the id). That is
what a neighbour sampler reads, and what :meth:`CSRGraph.csc` returns.

Placement: ``"unified"`` (default where a GPU serves unified tensors: the lists stay in host
memory, mapped for the GPU, which samples them in place), ``"cpu"`` (sampled on the CPU) or
``"cuda"`` (copied into GPU memory). Whatever the placement, :meth:`get_edge_index` and the
layout conversions return int64 host tensors, as PyG's own samplers expect (views of the
stored arrays where those are int64 host arrays, copies otherwise).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch_geometric.data import EdgeAttr
from torch_geometric.data import GraphStore as _PygGraphStore
from torch_geometric.data.graph_store import EdgeLayout

from .. import unified as _unified
from ..graph import CSRGraph
from ..placement import Placement


def default_placement() -> Placement:
    """``"unified"`` where a GPU serves unified tensors, else ``"cpu"``."""
    return Placement.MAPPED if _unified.gpu_backed() else Placement.CPU


def _check_placement(placement) -> Placement:
    allowed = (Placement.CPU, Placement.MAPPED, Placement.GPU)
    try:
        parsed = Placement.parse(placement)
    except ValueError:
        parsed = None
    if parsed not in allowed:
        raise ValueError(f"placement must be 'cpu', 'unified' or 'cuda', got {placement!r}")
    return parsed


def _ids(t, name: str) -> torch.Tensor:
    t = torch.as_tensor(t)
    if t.dim() != 1 or t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be a 1-D int32/int64 tensor, got {t.dtype} with shape {tuple(t.shape)}")
    return t.cpu()  # a view for CPU and unified tensors


def csc_from_coo(row: torch.Tensor, col: torch.Tensor, num_nodes: int) -> CSRGraph:
    """In-neighbour lists of the edges ``row[i] -> col[i]`` (a CPU ``CSRGraph``): each list
    in edge order (a stable sort by target), ``eids`` the edge's column ``i``; None when the
    edges are already sorted by target (CSC order), where an edge's position is its column."""
    row, col = _ids(row, "edge_index[0]"), _ids(col, "edge_index[1]")
    if row.numel() != col.numel():
        raise ValueError(f"edge_index rows must have one length, got {row.numel()} and {col.numel()}")
    if row.numel():
        lo, hi = int(torch.minimum(row.min(), col.min())), int(torch.maximum(row.max(), col.max()))
        if lo < 0 or hi >= num_nodes:
            raise ValueError(f"edge_index holds node id {lo if lo < 0 else hi}, outside [0, {num_nodes})")
    in_order = row.numel() < 2 or bool((col[1:] >= col[:-1]).all())
    order = None if in_order else torch.sort(col, stable=True).indices
    indptr = torch.zeros(num_nodes + 1, dtype=torch.int64)
    torch.cumsum(torch.bincount(col.long(), minlength=num_nodes), 0, out=indptr[1:])
    index_dtype = torch.int32 if num_nodes <= 2**31 - 1 else torch.int64
    rows = row if order is None else row[order]
    return CSRGraph(indptr, rows.to(index_dtype).contiguous(), placement="cpu", validate=False, eids=order)


class GraphStore(_PygGraphStore):
    """One homogeneous edge set for PyG loaders (see the module docstring).

    ``graph``: a :class:`CSRGraph` of the edges (row ``v`` lists ``v``'s out-neighbours; its
    :meth:`~CSRGraph.csc` is what the store keeps), or ``None`` to fill the store with
    :meth:`put_edge_index`. ``placement``: where the in-neighbour lists live (see above;
    default :func:`default_placement`).
    """

    def __init__(self, graph: Optional[CSRGraph] = None, placement: Optional[str] = None):
        super().__init__()
        self.placement = _check_placement(placement or default_placement())
        self._csc: Optional[CSRGraph] = None
        if graph is not None:
            if not isinstance(graph, CSRGraph):
                raise TypeError(f"graph must be a pytorch_zerocopy.graph.CSRGraph, got {type(graph).__name__}")
            self._set(graph.csc())

    @classmethod
    def from_csc(cls, csc: CSRGraph, placement: Optional[str] = None) -> "GraphStore":
        """A store over in-neighbour lists given as they are (row ``v`` of ``csc`` lists the
        sources of ``v``'s in-edges; its ``eids`` the edges' ids)."""
        store = cls(placement=placement)
        store._set(csc)
        return store

    def _set(self, csc: CSRGraph) -> None:
        eids = csc.eids  # computed before placing, so the placed copy keeps them
        placed = csc if csc.placement == self.placement else csc.to(self.placement)
        if placed.eids is None and eids is not None:
            raise RuntimeError("GraphStore: the edge ids were lost when placing the graph")
        self._csc = placed

    # --- what samplers read ------------------------------------------------------------

    @property
    def csc_graph(self) -> CSRGraph:
        """The in-neighbour lists (a ``CSRGraph`` in the store's placement)."""
        if self._csc is None:
            raise RuntimeError("GraphStore is empty: construct it with a graph or call put_edge_index first")
        return self._csc

    @property
    def num_nodes(self) -> int:
        return self.csc_graph.num_nodes

    @property
    def num_edges(self) -> int:
        return self.csc_graph.num_edges

    def edge_ids(self) -> Optional[torch.Tensor]:
        """Host int64 edge ids of the CSC positions (None: the position is the id)."""
        eids = self.csc_graph.eids
        return None if eids is None else eids.cpu()

    # --- PyG's interface ---------------------------------------------------------------

    def _put_edge_index(self, edge_index, edge_attr: EdgeAttr) -> bool:
        if edge_attr.edge_type is not None and self._csc is not None:
            raise NotImplementedError("GraphStore holds one homogeneous edge set; heterogeneous graphs are not supported")
        if edge_attr.size is None:
            raise ValueError("put_edge_index: give size=(num_nodes, num_nodes)")
        num_src, num_dst = (int(s) for s in edge_attr.size)
        if num_src != num_dst:
            raise NotImplementedError(f"GraphStore holds a homogeneous graph; size {edge_attr.size} is bipartite")
        first, second = edge_index
        if edge_attr.layout == EdgeLayout.COO:
            csc = csc_from_coo(first, second, num_dst)
        elif edge_attr.layout == EdgeLayout.CSC:  # (row, colptr)
            csc = CSRGraph.from_csr(_ids(second, "colptr").long(), _ids(first, "row"))
        else:  # CSR: (rowptr, col)
            csc = CSRGraph.from_csr(_ids(first, "rowptr").long(), _ids(second, "col")).csc()
        if csc.num_nodes != num_dst:
            raise ValueError(f"put_edge_index: the pointer array describes {csc.num_nodes} nodes, size says {num_dst}")
        self._set(csc)
        return True

    def _get_edge_index(self, edge_attr: EdgeAttr) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        if self._csc is None or edge_attr.edge_type is not None:
            return None
        csc = self._csc
        row, colptr = csc.indices.cpu().long(), csc.indptr.cpu()
        if edge_attr.layout == EdgeLayout.CSC:
            return row, colptr
        if edge_attr.layout == EdgeLayout.COO:  # sorted by target, CSC order
            return row, torch.repeat_interleave(torch.arange(csc.num_nodes), colptr[1:] - colptr[:-1])
        return None

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        if self._csc is None or edge_attr.edge_type is not None:
            return False
        self._csc = None
        return True

    def get_all_edge_attrs(self) -> List[EdgeAttr]:
        if self._csc is None:
            return []
        n = self._csc.num_nodes
        return [EdgeAttr(None, EdgeLayout.CSC, size=(n, n))]

    def _edge_to_layout(self, attr: EdgeAttr, layout: EdgeLayout, store: bool = False):
        # PyG's conversion reports the permutation from the stored order; the stored order is
        # CSC order, whose positions map to edge ids through `eids`.
        row, col, perm = super()._edge_to_layout(attr, layout, store=False)
        eids = self.edge_ids()
        if eids is not None:
            perm = eids if perm is None else eids[perm]
        return row, col, perm

    def __repr__(self) -> str:
        if self._csc is None:
            return "GraphStore(empty)"
        return (f"GraphStore(num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"placement={self.placement.value!r})")
