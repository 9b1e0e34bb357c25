"""CSRGraph: a graph in compressed sparse row form, placed where the traversal ops read it.

Layout. ``indptr`` (int64, ``num_nodes + 1`` offsets) holds the row offsets: the neighbours of
vertex ``v`` are ``indices[indptr[v]:indptr[v + 1]]``, with edge weights at the same positions
of ``weights`` (float32 or int32, optional). Column ids are int32 when every id fits, else
int64 (or as asked).

Placement (a :class:`~pytorch_zerocopy.placement.Placement`, or its name: where the edge list,
i.e. ``indices`` and ``weights``, lives; EMOGI keeps the row offsets and every per-vertex array
in GPU memory and only the edge list in host memory):

* ``"cpu"``      everything in ordinary host memory; ops run the CPU implementation.
* ``"unified"``  the edge list in host memory mapped for the GPU (zero-copy); ``indptr`` on the
                 GPU. Without a GPU the same graph runs on the CPU.
* ``"cuda"``     everything in GPU memory.
* ``"uvm"``      the edge list in CUDA managed memory advised read-mostly (the UVM baseline):
                 pages migrate to the GPU on first touch. Each ``to("uvm")`` makes a fresh
                 allocation, so a new copy starts cold, as EMOGI re-allocates between runs.
* ``"managed"``  the edge list in CUDA managed memory kept in host memory (preferred location:
                 the CPU; every GPU maps it): zero-copy reads like ``"unified"``, from a private
                 copy the GPU may translate at a coarser granularity (see
                 :mod:`pytorch_zerocopy.probe`). ``indptr`` on the GPU.

Aliasing. ``to("unified")`` maps the host edge list in place: the unified graph and the CPU
graph it came from share their bytes, so writing one changes the other. ``to("cpu")`` of a
unified graph returns host views of the same bytes. Other placements copy.

Edge ids. An edge's id is its position in the CSR arrays. A graph derived from another (its
transpose, :meth:`CSRGraph.csc`) keeps the ids of the graph it came from in ``eids``: the edge
at position ``p`` has id ``eids[p]`` (``eids is None``: the position is the id).

In-neighbours. :meth:`CSRGraph.csc` is the transpose (row ``v`` lists ``v``'s in-neighbours),
computed once on the host and kept, in the graph's placement. For a symmetric graph the
in-neighbour lists are the out-neighbour lists, so the transpose of an unweighted symmetric
graph shares ``indptr``/``indices`` with it and only its ``eids`` (the position of each edge's
reverse) are computed, on first use.

Node and edge data. ``ndata`` and ``edata`` are dicts of tensors keyed by name, indexed by node
id and by edge id (DGL's ``ndata``/``edata``; the DGL-compatible loader prefetches from them).
They stay where they are when the graph is placed; a derived graph (:meth:`CSRGraph.to`,
:meth:`CSRGraph.csc`) starts with shallow copies of them, which remain valid because node and
edge ids are the same in every view of a graph.

Validation. Built from CSR arrays the graph checks, once, that offsets start at 0, never
decrease and end at the number of edges, that ids are in range and that dtypes are as above;
the traversal ops then trust the arrays.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple, Union

import numpy as np
import torch

from .. import unified as _unified
from ..placement import Placement, place
ArrayLike = Union[torch.Tensor, np.ndarray, list]

_INT32_MAX = 2**31 - 1
_COMPOSITE_KEY_MAX_NODES = 3_037_000_499  # largest n with n * n < 2**63


def _as_tensor(x: ArrayLike, name: str) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x
    elif isinstance(x, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(x))
    elif isinstance(x, (list, tuple)):
        t = torch.as_tensor(x) if len(x) else torch.zeros(0, dtype=torch.int64)
    else:
        raise TypeError(f"{name} must be a tensor, a NumPy array or a list, got {type(x).__name__}")
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    return t


def _host(t: torch.Tensor) -> torch.Tensor:
    """The host tensor over ``t``: a view for CPU and unified tensors, a copy otherwise."""
    return t.cpu()


def _check_ids(t: torch.Tensor, name: str) -> None:
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")


def _check_weights_dtype(w: torch.Tensor) -> None:
    if w.dtype not in (torch.float32, torch.int32):
        raise TypeError(f"weights must be float32 or int32, got {w.dtype}")


def _index_dtype(num_nodes: int, index_dtype: Optional[torch.dtype]) -> torch.dtype:
    if index_dtype is None:
        return torch.int32 if num_nodes <= _INT32_MAX else torch.int64
    if index_dtype not in (torch.int32, torch.int64):
        raise TypeError(f"index_dtype must be torch.int32 or torch.int64, got {index_dtype}")
    if index_dtype == torch.int32 and num_nodes > _INT32_MAX:
        raise ValueError(f"index_dtype=torch.int32 cannot hold ids of a graph with {num_nodes} vertices")
    return index_dtype


class CSRGraph:
    """A CSR graph and where its arrays live (see the module docstring)."""

    indptr: torch.Tensor
    indices: torch.Tensor
    weights: Optional[torch.Tensor]
    num_nodes: int
    num_edges: int
    symmetric: bool
    placement: Placement

    def __init__(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        weights: Optional[torch.Tensor] = None,
        *,
        symmetric: bool = False,
        placement: Union[Placement, str] = Placement.CPU,
        validate: bool = True,
        min_weight: Optional[float] = None,
        mean_weight: Optional[float] = None,
        eids: Optional[torch.Tensor] = None,
        ndata: Optional[Dict[str, torch.Tensor]] = None,
        edata: Optional[Dict[str, torch.Tensor]] = None,
    ) -> None:
        """Wraps existing arrays without copying; prefer :meth:`from_csr` / :meth:`from_coo`.

        ``validate=False`` skips the O(edges) checks for arrays known to be well formed (the
        generators' output). ``min_weight`` / ``mean_weight`` are the smallest / mean weight
        when already known (otherwise computed here, once, from the host copy). ``eids``: int64
        edge ids of the positions (see the module docstring), placed like ``indices``.
        ``ndata`` / ``edata``: node and edge data (see the module docstring).
        """
        self.placement = Placement.parse(placement)
        self.indptr = indptr
        self.indices = indices
        self.weights = weights
        self.num_nodes = int(indptr.numel()) - 1
        self.num_edges = int(indices.numel())
        self.symmetric = bool(symmetric)
        self._eids = eids
        self._reverse_of: Optional["CSRGraph"] = None  # set on a symmetric graph's transpose
        self._csc: Optional["CSRGraph"] = None
        self.ndata: Dict[str, torch.Tensor] = dict(ndata or {})
        self.edata: Dict[str, torch.Tensor] = dict(edata or {})
        if validate:
            self._validate()
        if weights is not None and self.num_edges > 0 and (min_weight is None or mean_weight is None):
            host = _host(weights)
            min_weight = float(host.min()) if min_weight is None else min_weight
            mean_weight = float(host.sum(dtype=torch.float64)) / self.num_edges if mean_weight is None else mean_weight
        self.min_weight = min_weight
        self.mean_weight = mean_weight

    # --- construction ----------------------------------------------------------------

    @classmethod
    def from_csr(
        cls,
        indptr: ArrayLike,
        indices: ArrayLike,
        weights: Optional[ArrayLike] = None,
        *,
        symmetric: bool = False,
        validate: bool = True,
    ) -> "CSRGraph":
        """A CPU graph over the given CSR arrays (int64 offsets; int32/int64 ids; float32/int32
        weights). CPU tensors of the right dtype are used without a copy."""
        indptr_t = _as_tensor(indptr, "indptr")
        if indptr_t.dtype != torch.int64:
            raise TypeError(f"indptr must be int64, got {indptr_t.dtype}")
        indices_t = _as_tensor(indices, "indices")
        _check_ids(indices_t, "indices")
        weights_t = None
        if weights is not None:
            weights_t = _as_tensor(weights, "weights")
            _check_weights_dtype(weights_t)
        return cls(
            _host(indptr_t).contiguous(),
            _host(indices_t).contiguous(),
            None if weights_t is None else _host(weights_t).contiguous(),
            symmetric=symmetric,
            validate=validate,
        )

    @classmethod
    def from_coo(
        cls,
        src: ArrayLike,
        dst: ArrayLike,
        num_nodes: Optional[int] = None,
        weights: Optional[ArrayLike] = None,
        *,
        symmetrize: bool = False,
        drop_self_loops: bool = False,
        drop_duplicates: bool = False,
        index_dtype: Optional[torch.dtype] = None,
    ) -> "CSRGraph":
        """A CPU graph from edge pairs ``src[i] -> dst[i]``.

        ``num_nodes`` defaults to ``max id + 1``. ``symmetrize`` adds every reverse edge (with
        the same weight) and marks the graph symmetric; ``drop_duplicates`` keeps the first
        occurrence of each (src, dst) pair in input order (the forward copy after
        ``symmetrize``). Neighbour lists come out sorted by id.
        """
        s = _as_tensor(src, "src").cpu()
        d = _as_tensor(dst, "dst").cpu()
        _check_ids(s, "src")
        _check_ids(d, "dst")
        if s.numel() != d.numel():
            raise ValueError(f"src and dst must have the same length, got {s.numel()} and {d.numel()}")
        w = None
        if weights is not None:
            w = _as_tensor(weights, "weights").cpu()
            _check_weights_dtype(w)
            if w.numel() != s.numel():
                raise ValueError(f"weights must have one entry per edge ({s.numel()}), got {w.numel()}")
        s = s.long()
        d = d.long()
        if s.numel() > 0:
            lo = min(int(s.min()), int(d.min()))
            if lo < 0:
                raise ValueError(f"src/dst: vertex ids must be >= 0, got {lo}")
        top = max(int(s.max()), int(d.max())) + 1 if s.numel() else 0
        implied = num_nodes is None
        if implied:
            num_nodes = top
        num_nodes = int(num_nodes)
        if num_nodes < 0:
            raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
        if top > num_nodes:
            raise ValueError(f"src/dst: vertex id {top - 1} is out of range for num_nodes={num_nodes}")
        idx_dtype = _index_dtype(num_nodes, index_dtype)
        # The offsets and the per-vertex counts they are summed from: checked before allocating.
        _unified.require_host_memory(
            16 * (num_nodes + 1),
            f"CSRGraph.from_coo: a CSR of {num_nodes} vertices"
            + (f" (vertex id {top - 1} implies that many)" if implied else ""),
            "renumber the vertex ids densely" + (", or pass a smaller num_nodes" if not implied else ""))
        if drop_self_loops:
            keep = s != d
            s, d = s[keep], d[keep]
            w = None if w is None else w[keep]
        if symmetrize:
            s, d = torch.cat([s, d]), torch.cat([d, s])
            w = None if w is None else torch.cat([w, w])
        indptr, indices, weights = coo_to_csr(s, d, num_nodes, w, drop_duplicates=drop_duplicates,
                                              index_dtype=idx_dtype)
        return cls(indptr, indices, weights, symmetric=symmetrize, validate=False)

    def _validate(self) -> None:
        indptr, indices = self.indptr, self.indices
        if indptr.dim() != 1 or indptr.dtype != torch.int64:
            raise TypeError(f"indptr must be a 1-D int64 tensor, got {indptr.dtype} of shape {tuple(indptr.shape)}")
        if indptr.numel() < 1:
            raise ValueError("indptr must hold num_nodes + 1 >= 1 offsets, got an empty tensor")
        if indices.dim() != 1:
            raise ValueError(f"indices must be 1-D, got shape {tuple(indices.shape)}")
        _check_ids(indices, "indices")
        off = _host(indptr)
        if int(off[0]) != 0:
            raise ValueError(f"indptr[0] must be 0, got {int(off[0])}")
        if int(off[-1]) != self.num_edges:
            raise ValueError(f"indptr[-1] must equal the number of edges ({self.num_edges}), got {int(off[-1])}")
        if self.num_nodes > 0:
            step = off[1:] - off[:-1]
            if bool((step < 0).any()):
                bad = int(torch.nonzero(step < 0)[0])
                raise ValueError(f"indptr must be non-decreasing: indptr[{bad + 1}]={int(off[bad + 1])} < "
                                 f"indptr[{bad}]={int(off[bad])}")
        if self.num_edges > 0:
            ids = _host(indices)
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.num_nodes:
                raise ValueError(f"indices must be in [0, {self.num_nodes}), got values in [{lo}, {hi}]")
        if self.weights is not None:
            _check_weights_dtype(self.weights)
            if self.weights.dim() != 1 or self.weights.numel() != self.num_edges:
                raise ValueError(f"weights must be 1-D with one entry per edge ({self.num_edges}), "
                                 f"got shape {tuple(self.weights.shape)}")

    # --- placement -------------------------------------------------------------------

    @property
    def device(self) -> torch.device:
        """Where ops on this graph run: the device of ``indptr``."""
        return self.indptr.device

    def _like(self, indptr, indices, weights, placement, eids=None) -> "CSRGraph":
        return CSRGraph(indptr, indices, weights, symmetric=self.symmetric, placement=placement,
                        validate=False, min_weight=self.min_weight, mean_weight=self.mean_weight,
                        eids=eids, ndata=self.ndata, edata=self.edata)

    def _placed_like_indices(self, t: Optional[torch.Tensor], placement: Placement,
                             device) -> Optional[torch.Tensor]:
        """``t`` (a per-position array) in ``placement``, as :meth:`to` places ``indices``."""
        if t is None:
            return None
        if placement is Placement.CPU:
            return _host(t)
        if placement is Placement.GPU and t.is_cuda:
            return t.to(_cuda_device(device))
        return place(t if _unified.is_unified(t) else _host(t).contiguous(), placement, _gpu_or_none(device))

    # --- edge ids and the transpose ------------------------------------------------------

    @property
    def eids(self) -> Optional[torch.Tensor]:
        """Edge ids of the positions (None: the position is the id); see the module docstring."""
        if self._eids is None and self._reverse_of is not None:
            source = self._reverse_of
            rev = _reverse_positions(source)
            if source.eids is not None:  # a derived graph: ids of the graph it came from
                rev = _host(source.eids)[rev]
            self._eids = self._placed_like_indices(rev, self.placement,
                                                   self.indptr.device if self.placement is not Placement.CPU else None)
        return self._eids

    def csc(self) -> "CSRGraph":
        """The transpose: row ``v`` lists the sources of ``v``'s in-edges, ``eids`` their edge ids
        in this graph. Computed once (on the host, O(edges log edges)) and kept; placed like this
        graph. Weights travel with their edges."""
        if self._csc is None:
            self._csc = self._transpose()
        return self._csc

    def _transpose(self) -> "CSRGraph":
        if self.symmetric and self.weights is None:
            t = self._like(self.indptr, self.indices, None, self.placement)
            t._reverse_of = self
            return t
        indptr, indices = _host(self.indptr), _host(self.indices)
        n = self.num_nodes
        src = torch.repeat_interleave(torch.arange(n, dtype=indices.dtype), indptr[1:] - indptr[:-1])
        order = torch.argsort(indices, stable=True)
        t_indptr = torch.zeros(n + 1, dtype=torch.int64)
        if self.num_edges:
            torch.cumsum(torch.bincount(indices.long(), minlength=n), 0, out=t_indptr[1:])
        eids = order if self._eids is None else _host(self._eids)[order]
        weights = None if self.weights is None else _host(self.weights)[order]
        host = CSRGraph(t_indptr, src[order].contiguous(), weights, placement=Placement.CPU, validate=False,
                        min_weight=self.min_weight, mean_weight=self.mean_weight, eids=eids,
                        ndata=self.ndata, edata=self.edata)
        if self.placement is Placement.CPU:
            return host
        device = self.indptr.device if self.indptr.device.type == "cuda" else None
        placed = host.to(self.placement, device)
        placed._eids = self._placed_like_indices(eids, self.placement, device)
        return placed

    def to(self, placement: Union[Placement, str], device: Union[int, str, torch.device, None] = None) -> "CSRGraph":
        """The graph with its edge list in ``placement`` (see the module docstring).

        ``device`` names the GPU for every placement but ``"cpu"`` (default: the current one).
        ``"uvm"`` needs a CUDA build and a GPU with enough free memory for the edge list,
        ``"managed"`` a CUDA build and host memory for a copy of it; each raises a clear error
        otherwise.
        """
        placement = Placement.parse(placement)
        eids = self._placed_like_indices(self._eids, placement, device)
        if placement is Placement.CPU:
            return self._like(_host(self.indptr), _host(self.indices),
                              None if self.weights is None else _host(self.weights), placement, eids)
        if placement is Placement.MAPPED and not _unified.gpu_backed():
            dev = torch.device("cpu")
        else:
            dev = _cuda_device(device)
        indices = self._placed_like_indices(self.indices, placement, dev if dev.type == "cuda" else None)
        weights = self._placed_like_indices(self.weights, placement, dev if dev.type == "cuda" else None)
        return self._like(self.indptr.to(dev), indices, weights, placement, eids)

    def cpu(self) -> "CSRGraph":
        return self.to("cpu")

    # --- queries ---------------------------------------------------------------------

    def out_degree(self) -> torch.Tensor:
        """int64 number of out-edges per vertex, on the device of ``indptr``."""
        return self.indptr[1:] - self.indptr[:-1]

    @property
    def edge_list_bytes(self) -> int:
        """Bytes of the edge list (ids plus weights): what a full sweep reads from its placement."""
        n = self.num_edges * self.indices.element_size()
        if self.weights is not None:
            n += self.num_edges * self.weights.element_size()
        return n

    def __repr__(self) -> str:
        w = "none" if self.weights is None else str(self.weights.dtype).replace("torch.", "")
        return (f"CSRGraph(num_nodes={self.num_nodes}, num_edges={self.num_edges}, "
                f"ids={str(self.indices.dtype).replace('torch.', '')}, weights={w}, "
                f"symmetric={self.symmetric}, placement={self.placement.value!r}, device={self.device})")


def coo_to_csr(
    src: torch.Tensor,
    dst: torch.Tensor,
    num_nodes: int,
    weights: Optional[torch.Tensor] = None,
    *,
    drop_duplicates: bool = False,
    index_dtype: torch.dtype = torch.int64,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """CSR arrays ``(indptr, indices, weights)`` of the edges ``src[i] -> dst[i]``, computed on
    the device the inputs are on (CPU or GPU) with a whole-graph sort.

    ``src`` / ``dst``: int64 ids in ``[0, num_nodes)`` (trusted: :meth:`CSRGraph.from_coo` is the
    checked entry point), on one device, with ``weights`` (optional) beside them. Rows come out
    sorted by destination; parallel edges stay, in input order, unless ``drop_duplicates``, which
    keeps the first occurrence of each pair (and its weight). ``indptr`` is int64, ``indices``
    ``index_dtype``. Peak memory: a few int64 arrays of the edge count on that device.
    """
    n = int(num_nodes)
    if n <= _COMPOSITE_KEY_MAX_NODES:
        key = src * max(n, 1) + dst
        if weights is None:  # equal keys are the same edge: no order to keep
            key = torch.sort(key).values
            if drop_duplicates:
                key = torch.unique_consecutive(key)
        else:
            key, order = torch.sort(key, stable=True)
            weights = weights[order]
            del order
            if drop_duplicates and key.numel() > 1:
                first = torch.ones_like(key, dtype=torch.bool)
                first[1:] = key[1:] != key[:-1]
                key, weights = key[first], weights[first]
        s = torch.div(key, max(n, 1), rounding_mode="floor")
        d = key - s * max(n, 1)
        del key
    else:  # src * num_nodes would overflow int64: sort by dst, then stably by src
        by_dst = torch.sort(dst, stable=True).indices
        order = by_dst[torch.sort(src[by_dst], stable=True).indices]
        s, d = src[order], dst[order]
        weights = None if weights is None else weights[order]
        if drop_duplicates and s.numel() > 1:
            first = torch.ones_like(s, dtype=torch.bool)
            first[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
            s, d = s[first], d[first]
            weights = None if weights is None else weights[first]
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=s.device)
    if s.numel():
        torch.cumsum(torch.bincount(s, minlength=n), 0, out=indptr[1:])
    return indptr, d.to(index_dtype).contiguous(), None if weights is None else weights.contiguous()


def _reverse_positions(g: "CSRGraph") -> torch.Tensor:
    """For a symmetric graph: the position of each edge's reverse (``u -> v`` at position ``p``
    gives the position of ``v -> u``), int64 on the host. Rows need not be sorted.

    The k-th edge in (row, column) order and the k-th in (column, row) order are reverses of
    each other, because a symmetric graph's edge multiset equals its reverse's."""
    indptr, indices = _host(g.indptr), _host(g.indices)
    rows = torch.repeat_interleave(torch.arange(g.num_nodes, dtype=indices.dtype), indptr[1:] - indptr[:-1])
    by_row_col = torch.argsort(indices, stable=True)
    by_row_col = by_row_col[torch.argsort(rows[by_row_col], stable=True)]
    by_col_row = torch.argsort(rows, stable=True)
    by_col_row = by_col_row[torch.argsort(indices[by_col_row], stable=True)]
    rev = torch.empty(g.num_edges, dtype=torch.int64)
    rev[by_col_row] = by_row_col
    return rev


def _cuda_device(device) -> torch.device:
    if not torch.cuda.is_available():
        raise RuntimeError("this placement needs a CUDA GPU, and none is available")
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    if isinstance(device, int):
        return torch.device("cuda", device)
    dev = torch.device(device)
    if dev.type not in ("cuda", _unified.DEVICE_TYPE):
        raise ValueError(f"device must name a GPU, got {dev}")
    return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)


def _gpu_or_none(device) -> Optional[torch.device]:
    """``device`` as a GPU for the placement functions (None: the current one), or None when
    unified tensors are host tensors here."""
    if not _unified.gpu_backed():
        return None
    return _cuda_device(device)
