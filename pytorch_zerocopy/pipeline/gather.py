"""How the process that gathers reads the feature rows of a minibatch's input nodes, per mode,
and what a GPU cache of hot rows in front of the table served.

Every mode reads through one interface (:class:`~pytorch_zerocopy.feature_table.FeatureReader`):
the table is loaded by the gathering process itself, straight from the dataset's feature source
into the plan's ``table_in`` (a shared host tensor is mapped in place, not copied), and
wrapped in a :class:`~pytorch_zerocopy.feature_table.CachedTable` when the plan caches rows.
"""

from __future__ import annotations

import time
from typing import Callable, Dict, Optional, Tuple

import torch

from ..datasets.base import NodeDataset
from ..feature_table import CachedTable, FeatureReader, FeatureTable, cached_rows_for
from ..datasets.features import load_table
from ..placement import Placement
from ..unified import _C
from .messages import CacheChoice, CacheCounts, TableReady
from .plan import Mode, Phase, Plan


class IndexSelectReader:
    """The ``zerocopy-naive`` baseline (DGL's UVA mode): ``index_select`` on the shared table's
    mapping as a plain CUDA tensor, in the caller's order, with torch's kernel: no reordering,
    no aligned reads. Keeps the mapping alive for its own lifetime."""

    def __init__(self, mapped: torch.Tensor, device: torch.device):
        self.device = device
        self._mapped = mapped
        self.source = _C.device_alias(mapped, device)

    @property
    def shape(self) -> torch.Size:
        return self.source.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.source.dtype

    def read(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None, *,
             check_bounds: bool = True) -> torch.Tensor:
        from ..placement import to_device_async

        return torch.index_select(self.source, 0, to_device_async(ids, self.device), out=out)


def feature_reader(plan: Plan, ds: NodeDataset, device: torch.device,
                   cached_rows: Optional[torch.Tensor] = None) -> FeatureReader:
    """The reader of the process that gathers on ``device`` (the module docstring): the table in
    ``plan.table_in`` (loaded there now; ``zerocopy-naive``: the shared table mapped for
    ``index_select``), behind a cache of ``cached_rows`` when given (mode ``zerocopy`` only)."""
    if cached_rows is not None and plan.mode is not Mode.ZEROCOPY:
        raise ValueError(f"a feature cache applies to the 'zerocopy' gather, not {plan.mode.value!r}")
    if plan.mode is Mode.ZEROCOPY_NAIVE:
        return IndexSelectReader(load_table(ds.feature_source, Placement.MAPPED, device), device)
    table = FeatureTable.load(ds.feature_source, plan.table_in,
                              device=device if device.type == "cuda" else None, tuning=plan.gather_tuning)
    return table if cached_rows is None else CachedTable(table, cached_rows)


def table_ready(reader: FeatureReader) -> Optional[TableReady]:
    """What :func:`feature_reader` loaded for ``reader`` (None for a baseline's reader)."""
    table = reader.table if isinstance(reader, CachedTable) else reader
    if not isinstance(table, FeatureTable):
        return None
    return TableReady(table.placement, table.nbytes, table.load_seconds)


def gather_into(reader: FeatureReader, idx: torch.Tensor, out: torch.Tensor) -> None:
    """Writes rows ``idx`` (valid ids, on the CPU or the reader's device) into
    ``out[:len(idx)]``. No bounds check: sampled ids are valid by construction, and the check
    would cost a host synchronisation."""
    reader.read(idx, out[:idx.numel()], check_bounds=False)


def choose_cached_rows(plan: Plan, ds: NodeDataset,
                       on_choice: Optional[Callable[[CacheChoice], None]] = None) -> Optional[torch.Tensor]:
    """The ids of the rows ``plan.cache`` keeps in GPU memory for ``ds`` (None without a
    cache), in shared memory: chosen once, by the parent, from the dataset's host graph and
    training seeds (this process opens no GPU context), then handed to the process that
    gathers. ``on_choice`` hears what was chosen and how long choosing took."""
    if plan.cache is None:
        return None
    start = time.perf_counter()
    rows = cached_rows_for(ds.graph, plan.cache, ds.num_nodes, ds.row_bytes, seeds=ds.train_idx).share_memory_()
    if on_choice is not None:
        on_choice(CacheChoice(int(rows.numel()), ds.num_nodes, ds.row_bytes, plan.cache.policy.value,
                              time.perf_counter() - start))
    return rows


class CacheHits:
    """Counts, per ``(epoch, phase)``, the input rows that ``cache`` holds, on its device (adding
    a minibatch never synchronises); :meth:`take` reads a phase's counts once."""

    def __init__(self, cache: CachedTable):
        self.cache = cache
        self.counts: Dict[Tuple[int, Phase], Tuple[torch.Tensor, int]] = {}

    def add(self, epoch: int, phase: Phase, input_nodes: torch.Tensor) -> None:
        """One minibatch's ``input_nodes`` (valid ids, on the CPU or the cache's device)."""
        hits = self.cache.count_hits(input_nodes)
        key = (epoch, phase)
        if key in self.counts:
            total, lookups = self.counts[key]
            self.counts[key] = (total + hits, lookups + input_nodes.numel())
        else:
            self.counts[key] = (hits, input_nodes.numel())

    def take(self, epoch: int, phase: Phase) -> CacheCounts:
        """The counts of ``phase`` of ``epoch`` since the last take, forgotten here. Waits for
        the device (whichever stream counted): call it once per phase, not per minibatch."""
        hits, lookups = self.counts.pop((epoch, phase), (None, 0))
        if hits is None:
            return CacheCounts(0, lookups)
        if hits.is_cuda:
            torch.cuda.synchronize(hits.device)
        return CacheCounts(int(hits), lookups)
