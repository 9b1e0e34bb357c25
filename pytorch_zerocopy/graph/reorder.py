"""Renumbering nodes so that the rows training reads most sit together in host memory.

A minibatch's feature gather from a large host table is bound by how many distinct regions of
host memory it touches (address translation), not by bytes. Renumbering nodes hottest first
(by degree, or by how often pre-sampled minibatches read them; :mod:`pytorch_zerocopy.hotness`)
packs the hot rows into the start of the table, so a gather touches far fewer regions, a GPU
cache of the first rows is one contiguous block, and huge pages on the hot region cover most
accesses (the page-size paper's degree-based grouping).

:class:`NodeOrder` is the permutation and applies it: to a :class:`CSRGraph` (or raw CSR
arrays), to per-node rows (features, labels), to id lists (splits), to a whole
:class:`~pytorch_zerocopy.datasets.NodeDataset`; and undoes it for results (``to_old``,
``restore_rows``). Ties keep their old relative order, so nodes of equal hotness keep whatever
locality the old numbering had.

Aliasing: every ``apply`` returns new tensors (the old ones are not modified); rows of a table
in shared memory are written to a new shared-memory table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence, Tuple

import torch

from ..placement import Placement

from .. import hotness as _hotness
from .. import unified as _unified
from .csr import CSRGraph

__all__ = ["NodeOrder", "degree_order", "presample_order"]

_ROWS_PER_CHUNK = 1 << 20


@dataclass(frozen=True)
class NodeOrder:
    """Node ``v`` becomes node ``new_id[v]``; new node ``r`` was ``old_id[r]`` (int64, CPU)."""

    new_id: torch.Tensor
    old_id: torch.Tensor
    _placed: Dict[Tuple[str, torch.device], torch.Tensor] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("new_id", "old_id"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype != torch.int64:
                raise TypeError(f"NodeOrder.{name} must be a 1-D int64 tensor")
        if self.new_id.numel() != self.old_id.numel():
            raise ValueError("NodeOrder: new_id and old_id must have the same length")

    @classmethod
    def from_permutation(cls, old_id: torch.Tensor) -> "NodeOrder":
        """The order whose new node ``r`` is old node ``old_id[r]`` (a permutation of 0..N-1)."""
        old_id = torch.as_tensor(old_id).cpu().long()
        n = old_id.numel()
        new_id = torch.full((n,), -1, dtype=torch.int64)
        if n and (int(old_id.min()) < 0 or int(old_id.max()) >= n):
            raise ValueError(f"NodeOrder: old_id must be a permutation of 0..{n - 1}")
        new_id[old_id] = torch.arange(n)
        if n and bool((new_id < 0).any()):
            raise ValueError(f"NodeOrder: old_id must be a permutation of 0..{n - 1} (it repeats an id)")
        return cls(new_id, old_id)

    @classmethod
    def from_hotness(cls, score: torch.Tensor) -> "NodeOrder":
        """Hottest node first (descending ``score``); ties keep their old relative order."""
        if score.dim() != 1:
            raise ValueError(f"score must be 1-D (one value per node), got shape {tuple(score.shape)}")
        return cls.from_permutation(torch.sort(score, descending=True, stable=True).indices.cpu())

    @property
    def num_nodes(self) -> int:
        return int(self.new_id.numel())

    # --- ids ----------------------------------------------------------------------------------

    def _on(self, name: str, device: torch.device) -> torch.Tensor:
        """``new_id`` / ``old_id`` on ``device``, copied there once and kept."""
        if device.type == "cpu":
            return getattr(self, name)
        key = (name, device)
        if key not in self._placed:
            self._placed[key] = getattr(self, name).to(device)
        return self._placed[key]

    def to_new(self, ids: torch.Tensor) -> torch.Tensor:
        """New ids of old node ids (same shape, int64, on ``ids``' device)."""
        return self._on("new_id", ids.device)[ids.long()]

    def to_old(self, ids: torch.Tensor) -> torch.Tensor:
        """Old ids of new node ids (results back in the caller's numbering)."""
        return self._on("old_id", ids.device)[ids.long()]

    def ids(self, ids: torch.Tensor) -> torch.Tensor:
        """A set of old ids (a split) as sorted new ids, in ``ids``' dtype."""
        return torch.sort(self.to_new(ids)).values.to(ids.dtype)

    # --- rows ---------------------------------------------------------------------------------

    def rows(self, table: torch.Tensor) -> torch.Tensor:
        """Per-node rows in the new order: ``out[new_id[v]] = table[v]`` (features, labels; any
        trailing shape). A CPU or unified table gives a CPU result, in shared memory when the
        table's host memory is shared; a CUDA table a CUDA result."""
        return self._permute(table, self.old_id)

    def restore_rows(self, table: torch.Tensor) -> torch.Tensor:
        """Per-node rows in the new order (model outputs) back in the old order."""
        return self._permute(table, self.new_id)

    def _permute(self, table: torch.Tensor, take: torch.Tensor) -> torch.Tensor:
        if table.dim() == 0 or table.shape[0] != self.num_nodes:
            raise ValueError(f"NodeOrder: expected one row per node ({self.num_nodes}), got shape {tuple(table.shape)}")
        if table.device.type == "cuda":
            return table.index_select(0, take.to(table.device))
        host = table.cpu() if _unified.is_unified(table) else table
        if host.is_shared():
            from ..datasets.base import shared_host_tensor

            out = shared_host_tensor(tuple(host.shape), host.dtype)
        else:
            out = torch.empty_like(host, memory_format=torch.contiguous_format)
        from ..ops import gather_rows

        src = host.reshape(host.shape[0], -1) if host.dim() != 2 or not host.is_contiguous() else host
        dst = out.view(out.shape[0], -1)
        for a in range(0, self.num_nodes, _ROWS_PER_CHUNK):
            b = min(self.num_nodes, a + _ROWS_PER_CHUNK)
            gather_rows(src, take[a:b], dst[a:b], check_bounds=False)
        return out

    # --- graphs -------------------------------------------------------------------------------

    def csr(self, indptr: torch.Tensor, indices: torch.Tensor,
            weights: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor],
                                                            torch.Tensor]:
        """CSR arrays (host) in the new numbering: row ``new_id[v]`` holds old row ``v``'s
        entries, each id renumbered, in their old order. Returns (indptr, indices, weights,
        source) where ``source[q]`` is the old position of new position ``q``."""
        indptr = (indptr.cpu() if indptr.device.type != "cpu" else indptr).long()
        indices = indices.cpu() if indices.device.type != "cpu" else indices
        n = self.num_nodes
        if indptr.numel() != n + 1:
            raise ValueError(f"NodeOrder: indptr must hold {n + 1} offsets for {n} nodes, got {indptr.numel()}")
        deg = indptr[1:] - indptr[:-1]
        new_indptr = torch.zeros(n + 1, dtype=torch.int64)
        torch.cumsum(deg[self.old_id], 0, out=new_indptr[1:])
        total = int(new_indptr[-1])
        new_indices = torch.empty(total, dtype=indices.dtype)
        source = torch.empty(total, dtype=torch.int64)
        for a in range(0, n, _ROWS_PER_CHUNK):
            b = min(n, a + _ROWS_PER_CHUNK)
            lo, hi = int(new_indptr[a]), int(new_indptr[b])
            if hi == lo:
                continue
            lengths = new_indptr[a + 1:b + 1] - new_indptr[a:b]
            row = torch.repeat_interleave(torch.arange(a, b), lengths)
            pos = indptr[self.old_id[row]] + (torch.arange(lo, hi) - new_indptr[row])
            source[lo:hi] = pos
            new_indices[lo:hi] = self.new_id[indices[pos].long()].to(indices.dtype)
        new_weights = None if weights is None else weights.cpu()[source]
        return new_indptr, new_indices, new_weights, source

    def graph(self, g: CSRGraph) -> CSRGraph:
        """``g`` renumbered, in ``g``'s placement. Edge ids follow the package's rule for a
        derived graph: ``eids[q]`` is the id in ``g``'s numbering of the edge now at position
        ``q``, so edge features of ``g`` stay valid."""
        if not isinstance(g, CSRGraph):
            raise TypeError(f"NodeOrder.graph takes a CSRGraph, got {type(g).__name__}")
        indptr, indices, weights, source = self.csr(g.indptr, g.indices, g.weights)
        old_eids = g.eids
        eids = source if old_eids is None else old_eids.cpu()[source]
        host = CSRGraph(indptr, indices, weights, symmetric=g.symmetric, validate=False, min_weight=g.min_weight,
                        mean_weight=g.mean_weight, eids=eids)
        if g.placement is Placement.CPU:
            return host
        device = g.indptr.device if g.indptr.device.type == "cuda" else None
        return host.to(g.placement, device)

    def dataset(self, ds):
        """A :class:`~pytorch_zerocopy.datasets.NodeDataset` renumbered: graph, features,
        labels and splits (new tensors; features in shared memory)."""
        from ..datasets.base import NodeDataset

        return NodeDataset(ds.name + "-reordered", self.graph(ds.graph), self.rows(ds.features),
                           self.rows(ds.labels), self.ids(ds.train_idx), self.ids(ds.val_idx),
                           self.ids(ds.test_idx), ds.num_classes).share_memory_()


def degree_order(graph, edge_dir: str = "in") -> NodeOrder:
    """Nodes renumbered by :func:`~pytorch_zerocopy.hotness.degree_hotness`, hottest first."""
    return NodeOrder.from_hotness(_hotness.degree_hotness(graph, edge_dir))


def presample_order(graph, seeds: torch.Tensor, fanouts: Sequence[int], **kwargs) -> NodeOrder:
    """Nodes renumbered by :func:`~pytorch_zerocopy.hotness.presample_hotness` (same keyword
    arguments), hottest first."""
    return NodeOrder.from_hotness(_hotness.presample_hotness(graph, seeds, fanouts, **kwargs))
