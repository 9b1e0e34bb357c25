"""``DataLoader``: DGL's node data loader (same arguments, same batches), sampling with this
package's kernels.

Differences from DGL, all on the permissive side:

* ``use_uva=True`` works with ``num_workers > 0`` and with indices on the CPU or the GPU. DGL
  forbids workers in UVA mode because its workers would each sample from pinned memory in a
  forked process; here sampling always runs in the calling process (on the GPU, or on the CPU
  with all cores through at::parallel_for), so workers would add nothing: ``num_workers`` is
  accepted and ignored, with a warning once.
* ``use_uva=True`` on a machine without a GPU samples on the CPU from the same unified
  (host-mapped) structure instead of failing.
* The graph and the indices may be on different devices; indices are moved to where sampling
  runs.
* ``gpu_cache={"node": {name: rows}}`` keeps ``rows`` rows of node feature ``name`` in GPU
  memory: a static cache (:class:`~pytorch_zerocopy.FeatureTable`) of the nodes found in the
  most neighbour lists the sampler reads, filled once when the loader is built, where DGL's
  HugeCTR cache fills as batches arrive. Features prefetched through the sampler
  (``prefetch_node_feats``) are read from it, the rest from host memory in the same call.
  Without a GPU the cache is kept in host memory (same results). Edge-feature caches raise
  ``NotImplementedError``.

Shuffling draws from torch's default generator (``torch.manual_seed`` makes epochs
reproducible); with ``use_ddp`` each rank takes its share of a permutation seeded by
``ddp_seed`` and the epoch (``set_epoch``), padded by wrapping so all ranks get the same
number of batches, as DGL does.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterator, Optional, Union

import torch

from .. import unified as _unified
from ..feature_table import node_cache_configs
from ..graph import CSRGraph
from ..placement import Placement
from ._backend import is_dgl_graph
from .sampler import NeighborSampler, NodeCache, _graph_device


class DataLoader:
    """Iterates over ``(input_nodes, output_nodes, blocks)`` mini-batches of ``indices``.

    ``graph``: a :class:`~pytorch_zerocopy.graph.CSRGraph` (node and edge data in its
    ``ndata``/``edata``; :func:`pytorch_zerocopy.dgl.graph` builds one as ``dgl.graph`` does) or
    a ``dgl.DGLGraph``."""

    def __init__(
        self,
        graph: Any,
        indices: Any,
        graph_sampler: NeighborSampler,
        device: Optional[Union[str, int, torch.device]] = None,
        use_ddp: bool = False,
        ddp_seed: int = 0,
        batch_size: int = 1,
        drop_last: bool = False,
        shuffle: bool = False,
        use_prefetch_thread: Optional[bool] = None,
        use_alternate_streams: Optional[bool] = None,
        pin_prefetcher: Optional[bool] = None,
        use_uva: bool = False,
        gpu_cache: Any = None,
        num_workers: int = 0,
        **kwargs: Any,
    ):
        if not (isinstance(graph, CSRGraph) or is_dgl_graph(graph)):
            raise TypeError("graph must be a pytorch_zerocopy CSRGraph (build one from DGL's graph data with "
                            "pytorch_zerocopy.dgl.graph((src, dst))) or a dgl.DGLGraph, got "
                            f"{type(graph).__name__}")
        if not hasattr(graph_sampler, "sample_with"):
            raise TypeError("graph_sampler must be pytorch_zerocopy.dgl.NeighborSampler (or a subclass), "
                            f"got {type(graph_sampler).__name__}")
        if isinstance(indices, dict):
            raise NotImplementedError("index dicts are for heterogeneous graphs, which are not supported")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        cache_configs = node_cache_configs(gpu_cache)
        indices = torch.as_tensor(indices)
        if indices.dtype == torch.bool:
            indices = indices.nonzero().flatten()
        if indices.dtype not in (torch.int32, torch.int64) or indices.dim() != 1:
            raise TypeError(f"indices must be a 1-D tensor of node ids (int32/int64 or a bool mask), "
                            f"got {indices.dtype} with shape {tuple(indices.shape)}")
        if num_workers and num_workers > 0:
            warnings.warn("pytorch_zerocopy.dgl.DataLoader samples in the calling process (GPU, or all "
                          "CPU cores); num_workers is ignored", stacklevel=2)
        self.graph = graph
        self.indices = indices
        self.graph_sampler = graph_sampler
        self.use_ddp = use_ddp
        self.ddp_seed = ddp_seed
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.use_uva = use_uva
        self.num_workers = num_workers
        self.epoch = 0

        graph_device = _graph_device(graph)
        if device is None:
            if use_uva:
                device = torch.device("cuda", torch.cuda.current_device()) if _unified.gpu_backed() else torch.device("cpu")
            else:
                device = graph_device
        device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        if graph_device.type == "cuda":
            self.placement = Placement.GPU
        elif use_uva:
            self.placement = Placement.MAPPED
        else:
            self.placement = Placement.CPU
        # Where seeds live while sampling: the device the kernel runs on.
        if self.placement is Placement.GPU:
            self._seed_device = graph_device
        elif self.placement is Placement.MAPPED and _unified.gpu_backed():
            self._seed_device = device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
        else:
            self._seed_device = torch.device("cpu")

        self.node_caches = {}
        if cache_configs:
            self.node_caches = self._node_caches(cache_configs)

        self._rank, self._world = 0, 1
        if use_ddp:
            if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
                raise RuntimeError("use_ddp=True needs torch.distributed to be initialised first")
            self._rank, self._world = torch.distributed.get_rank(), torch.distributed.get_world_size()

    def _node_caches(self, configs) -> dict:
        """One :class:`NodeCache` per node feature named in ``gpu_cache`` that lives in host
        memory (a feature already in GPU memory is read from there: warned, not cached)."""
        if not hasattr(self.graph_sampler, "lists"):
            raise TypeError("gpu_cache needs pytorch_zerocopy.dgl.NeighborSampler (or a subclass) as graph_sampler")
        ndata = self.graph.ndata if hasattr(self.graph, "ndata") else {}
        # The cache lives on the GPU that gathers: the output device's, else the sampling one's.
        device = next((d for d in (self.device, self._seed_device) if d.type == "cuda"), torch.device("cpu"))
        caches = {}
        for name, config in configs.items():
            try:
                table = ndata[name]
            except KeyError:
                raise KeyError(f"gpu_cache: the graph has no node feature {name!r}") from None
            if table.device.type == "cuda":
                warnings.warn(f"gpu_cache: node feature {name!r} is already in GPU memory; it is not cached",
                              stacklevel=3)
                continue
            caches[name] = NodeCache(name, table, self.graph_sampler.lists(self.graph, self.placement), config,
                                     device)
        return caches

    def set_epoch(self, epoch: int) -> None:
        """The epoch whose permutation ``use_ddp`` shuffling uses (as DistributedSampler)."""
        self.epoch = int(epoch)

    def _epoch_indices(self) -> torch.Tensor:
        ids = self.indices.cpu()
        if self.use_ddp:
            if self.shuffle:
                gen = torch.Generator().manual_seed(self.ddp_seed + self.epoch)
                ids = ids[torch.randperm(ids.numel(), generator=gen)]
            per_rank = math.ceil(ids.numel() / self._world)
            if ids.numel() and per_rank * self._world > ids.numel():
                pad = per_rank * self._world - ids.numel()
                ids = torch.cat([ids, ids[:pad].repeat(math.ceil(pad / max(ids.numel(), 1)))[:pad]])
            return ids[self._rank::self._world]
        if self.shuffle:
            ids = ids[torch.randperm(ids.numel())]
        return ids

    def __len__(self) -> int:
        n = self._epoch_size()
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def _epoch_size(self) -> int:
        n = self.indices.numel()
        return math.ceil(n / self._world) if self.use_ddp else n

    def __iter__(self) -> Iterator:
        ids = self._epoch_indices().to(self._seed_device)
        for b in range(len(self)):
            seeds = ids[b * self.batch_size: (b + 1) * self.batch_size]
            out = self.graph_sampler.output_device or self.device
            yield self.graph_sampler.sample_with(self.graph, seeds, self.placement, out,
                                                 node_caches=self.node_caches)
