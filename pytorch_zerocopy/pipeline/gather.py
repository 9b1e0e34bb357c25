"""How feature rows of a minibatch's input nodes reach the trainer, per mode, and what a GPU
cache of hot rows in front of the table served."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch

import pytorch_zerocopy

from ..datasets.base import NodeDataset
from ..feature_table import FeatureTable, HostMemory, cached_rows_for
from ..unified import gpu_backed, to_unified
from .messages import CacheCounts
from .plan import Mode, Phase, Plan


def to_device_async(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (a CPU tensor, typically in pageable shared memory) on ``device`` without making
    the host wait for the GPU: staged through torch's pinned-memory cache, whose blocks are
    reused only after the copy has run, then copied asynchronously."""
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


class FeatureGather:
    """Gathers rows of the shared host table ``features`` for ``device``, as ``mode`` does.

    ``ZEROCOPY``: the routed zero-copy gather (``gather_rows``) from the unified table (on the
    CPU: the CPU kernel on the host table). ``ZEROCOPY_NAIVE``: ``index_select`` on the table's
    plain CUDA alias (no reordering). ``GPU``: ``index_select`` on a copy of the table in GPU
    memory. ``DMA`` / ``CPU``: ``index_select`` on the host table, on the CPU, with this
    process's torch threads (the DMA path copies the result to the GPU afterwards).
    The object keeps the mapping (or the GPU copy) alive for its own lifetime.

    ``cached_rows`` (``ZEROCOPY`` only): ids of rows to hold in ``device``'s memory; the gather
    then runs through a :class:`~pytorch_zerocopy.feature_table.FeatureTable` (``cache``),
    which reads those rows from there and the rest from host memory, in one call.
    ``memory`` (``ZEROCOPY`` on a GPU): where uncached rows are read from; ``MANAGED`` gathers
    through a FeatureTable over this process's managed copy of the table, with or without a
    cache.
    """

    def __init__(self, features: torch.Tensor, mode: Mode, device: torch.device,
                 cached_rows: Optional[torch.Tensor] = None, memory: HostMemory = HostMemory.MAPPED):
        if not isinstance(mode, Mode):
            raise TypeError(f"FeatureGather: mode must be a Mode, got {mode!r}")
        if features.device.type != "cpu":
            raise ValueError(f"features must be the host table, got a tensor on {features.device}")
        self.mode = mode
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.host = features
        if mode in (Mode.ZEROCOPY_NAIVE, Mode.GPU) and self.device.type != "cuda":
            raise RuntimeError(f"the {mode.value!r} gather needs a CUDA device, got {self.device}")
        if cached_rows is not None and mode is not Mode.ZEROCOPY:
            raise ValueError(f"a feature cache applies to the 'zerocopy' gather, not {mode.value!r}")
        if memory is not HostMemory.MAPPED and (mode is not Mode.ZEROCOPY or self.device.type != "cuda"):
            raise ValueError(f"host memory {memory.value!r} applies to the 'zerocopy' gather on a GPU, not "
                             f"{mode.value!r} on {self.device}")
        self.cache: Optional[FeatureTable] = None
        if cached_rows is not None:
            self.cache = FeatureTable(features, cached_rows, device=self.device, memory=memory)
            self.table = self.cache
        elif memory is HostMemory.MANAGED:
            self.table = FeatureTable(features, None, device=self.device, memory=memory)
        elif mode is Mode.ZEROCOPY:
            # On the CPU the host table itself is the zero-copy source (gather_rows' CPU kernel).
            self.table = to_unified(features) if self.device.type == "cuda" else features
        elif mode is Mode.ZEROCOPY_NAIVE:
            from .. import unified

            self._unified = to_unified(features)
            if not gpu_backed():
                raise RuntimeError("the 'zerocopy-naive' gather needs a GPU-backed build")
            self.table = unified._C.device_alias(self._unified, self.device)
        elif mode is Mode.GPU:
            self.table = features.to(self.device)
        else:
            self.table = features

    @property
    def on_device(self) -> bool:
        """Whether the gather runs on (and writes to) ``device`` rather than the CPU."""
        return self.mode in (Mode.ZEROCOPY, Mode.ZEROCOPY_NAIVE, Mode.GPU) and self.device.type == "cuda"

    def _routed(self, idx: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The zero-copy gather: the library's ``gather_rows`` (no bounds check: sampled ids are
        valid by construction, and the check would cost a host synchronisation) where it
        exists, else ``table[idx]``, which the unified device routes to the same kernel. With a
        cache, ``gather_rows`` reaches the FeatureTable's cached gather."""
        idx = to_device_async(idx, self.device) if self.on_device else idx
        gather_rows = getattr(pytorch_zerocopy, "gather_rows", None)
        if gather_rows is not None:
            return gather_rows(self.table, idx, out=out, check_bounds=False)
        if out is None:
            return self.table[idx]
        return out.copy_(self.table[idx])

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        """Rows ``idx`` (int64 ids on the CPU, or on ``device`` for on-device modes) as a new
        tensor (on ``device`` for on-device modes)."""
        if self.mode is Mode.ZEROCOPY:
            return self._routed(idx)
        if self.on_device:
            return torch.index_select(self.table, 0, to_device_async(idx, self.device))
        return torch.index_select(self.table, 0, idx)

    def gather_into(self, idx: torch.Tensor, out: torch.Tensor) -> None:
        """Writes rows ``idx`` into ``out[:len(idx)]`` (``out`` on the gather's device)."""
        n = idx.numel()
        if self.mode is Mode.ZEROCOPY:
            self._routed(idx, out[:n])
        elif self.on_device:
            torch.index_select(self.table, 0, to_device_async(idx, self.device), out=out[:n])
        else:
            torch.index_select(self.table, 0, idx, out=out[:n])


def choose_cached_rows(plan: Plan, ds: NodeDataset) -> Optional[torch.Tensor]:
    """The ids of the rows ``plan.cache`` keeps in GPU memory for ``ds`` (None without a
    cache), in shared memory: chosen once, by the parent, from the dataset's host graph and
    training seeds (this process opens no GPU context), then handed to the process that
    gathers."""
    if plan.cache is None:
        return None
    return cached_rows_for(ds.graph, plan.cache, ds.num_nodes, ds.row_bytes, seeds=ds.train_idx).share_memory_()


class CacheHits:
    """Counts, per ``(epoch, phase)``, the input rows that ``cache`` holds, on its device (adding
    a minibatch never synchronises); :meth:`take` reads a phase's counts once."""

    def __init__(self, cache: FeatureTable):
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
