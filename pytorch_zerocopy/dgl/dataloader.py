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
* On a GPU reading a host graph (``use_uva``), the first feature of the sampler's
  ``prefetch_node_feats`` is read the way ``zerocopy train``'s plan reads features: from the host
  memory kind this machine's GPU reads fastest
  (:func:`pytorch_zerocopy.feature_table.default_reading`; ``"managed"`` is a private copy of
  the feature in managed memory kept on the host) behind a GPU cache of a tenth of its rows
  chosen by pre-sampling the loader's seeds. ``feature_placement`` names the placement instead
  (``"unified"``: mapped in place, no copy; ``"managed"``; ``"cuda"``), without a cache unless
  ``gpu_cache`` asks for one; ``gpu_cache=None`` keeps the placement and drops the cache. On the
  CPU nothing changes.
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
number of batches, as DGL does. Each minibatch's sample draws one seed from the same generator.

The process way: ``pipeline=True`` runs the loader's stages the way ``zerocopy train`` runs
them (:mod:`pytorch_zerocopy.pipeline.loader`): sampling, and the gather of the first feature
in ``prefetch_node_feats``, in processes of their own (on a GPU the producer samples and
gathers there), minibatches in flight while the training loop runs its step. The loop gets the
same minibatches as in-process (the same seeds, drawn in this process); the blocks and the other
prefetched data are made here. ``pipeline`` may also be a
:class:`~pytorch_zerocopy.pipeline.Plan` whose ``gather_in`` is ``producer``. The processes
start with the first epoch and end with :meth:`DataLoader.close` (or ``with``, or when the
loader is collected); the graph's lists and the gathered feature are copied into shared memory
once, unless they are there already. ``stage_times`` (a
:class:`~pytorch_zerocopy.pipeline.trace.StageTimes`) records where each minibatch's time goes.
"""

from __future__ import annotations

import math
import warnings
import weakref
from typing import Any, Iterator, Optional, Union

import torch

from .. import unified as _unified
from dataclasses import replace as _replace

from ..feature_table import AUTO, CacheConfig, default_reading, loader_placement, node_cache_configs
from ..graph import CSRGraph
from ..pipeline.ahead import one_ahead
from ..pipeline.loader import EpochBatches, LoaderProcesses, ProcessWay, check_plan, loader_dataset, loader_plan
from ..pipeline.plan import Plan
from ..pipeline.trace import StageTimes
from ..placement import Placement, PlacementError
from ._backend import is_dgl_graph
from .sampler import NeighborSampler, NodeCache, _graph_device, _lookup


class DataLoader(ProcessWay):
    """Iterates over ``(input_nodes, output_nodes, blocks)`` mini-batches of ``indices``.

    ``graph``: a :class:`~pytorch_zerocopy.graph.CSRGraph` (node and edge data in its
    ``ndata``/``edata``; :func:`pytorch_zerocopy.dgl.graph` builds one as ``dgl.graph`` does) or
    a ``dgl.DGLGraph``. ``pipeline``: the process way (see the module docstring)."""

    stage_times: Optional[StageTimes] = None

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
        gpu_cache: Any = AUTO,
        feature_placement: Optional[str] = None,
        num_workers: int = 0,
        pipeline: Union[bool, Plan] = False,
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
        auto_cache = isinstance(gpu_cache, str) and gpu_cache.strip().lower() == AUTO
        cache_configs = {} if auto_cache else node_cache_configs(gpu_cache)
        placement = loader_placement(feature_placement, pipeline, "the prefetched feature")
        indices = torch.as_tensor(indices)
        if indices.dtype == torch.bool:
            indices = indices.nonzero().flatten()
        if indices.dtype not in (torch.int32, torch.int64) or indices.dim() != 1:
            raise TypeError(f"indices must be a 1-D tensor of node ids (int32/int64 or a bool mask), "
                            f"got {indices.dtype} with shape {tuple(indices.shape)}")
        if not isinstance(pipeline, (bool, Plan)):
            raise TypeError(f"pipeline must be True, False or a pytorch_zerocopy.pipeline.Plan, got {pipeline!r}")
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
        gpu_reads_host = self.placement is Placement.MAPPED and self._seed_device.type == "cuda"
        if placement is not None and not gpu_reads_host:
            raise PlacementError(f"feature_placement {placement.value!r} is for a GPU reading a host graph's features "
                                 "(use_uva=True on a GPU); this loader reads them where they lie")
        placements = {}
        if gpu_reads_host and pipeline is False:
            placements, cache_configs = self._reading(placement, auto_cache, cache_configs)
        if cache_configs or placements:
            self.node_caches = self._node_caches(cache_configs, placements)

        self._rank, self._world = 0, 1
        if use_ddp:
            if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
                raise RuntimeError("use_ddp=True needs torch.distributed to be initialised first")
            self._rank, self._world = torch.distributed.get_rank(), torch.distributed.get_world_size()

        self.processes: Optional[LoaderProcesses] = None
        if pipeline is not False:
            self.processes = self._processes(pipeline, cache_configs)
            weakref.finalize(self, self.processes.close)

    def _processes(self, pipeline: Union[bool, Plan], cache_configs: dict) -> LoaderProcesses:
        """The process way's roles over this loader's graph (started by the first epoch)."""
        sampler = self.graph_sampler
        if not isinstance(sampler, NeighborSampler):
            raise TypeError("pipeline needs pytorch_zerocopy.dgl.NeighborSampler (or a subclass) as graph_sampler, got "
                            f"{type(sampler).__name__}")
        if not sampler.prefetch_node_feats:
            raise ValueError("pipeline gathers the first of the sampler's prefetch_node_feats in its producer process: "
                             "name one (e.g. NeighborSampler(fanouts, prefetch_node_feats=['feat']))")
        name = sampler.prefetch_node_feats[0]
        table = _lookup(self.graph.ndata if hasattr(self.graph, "ndata") else {}, name, "node")
        ds = loader_dataset("dgl", sampler.lists(self.graph, Placement.CPU), table, self.indices)
        plan = (loader_plan(sampler.fanouts, self.batch_size, ds.row_bytes, ds.feature_source.nbytes,
                            cache_configs.get(name)) if pipeline is True else check_plan(pipeline))
        self.node_caches.pop(name, None)  # the producer gathers it (through the plan's cache)
        return LoaderProcesses(plan, ds, sampler.stage(self.graph))

    def _reading(self, placement: Optional[Placement], auto_cache: bool, configs: dict):
        """On a GPU reading host features: ``({name: placement}, cache configs)`` for the first
        prefetched node feature (module docstring), the other configs as given."""
        names = getattr(self.graph_sampler, "prefetch_node_feats", None) or []
        ndata = self.graph.ndata if hasattr(self.graph, "ndata") else {}
        if not names or names[0] not in ndata or ndata[names[0]].device.type == "cuda" \
                or not hasattr(self.graph_sampler, "lists"):
            if placement is not None:
                raise ValueError("feature_placement needs the sampler's first prefetch_node_feats to name a node "
                                 "feature in host memory")
            return {}, configs
        name, table = names[0], ndata[names[0]]
        fast, cache = default_reading(table.numel() * table.element_size())
        configs = dict(configs)
        if auto_cache and placement is None and name not in configs:
            configs[name] = _replace(cache, fanouts=tuple(self.graph_sampler.fanouts), batch_size=self.batch_size,
                                     edge_dir="out")
        return {name: placement or fast}, configs

    def _node_caches(self, configs, placements=None) -> dict:
        """One :class:`NodeCache` per node feature named in ``gpu_cache`` (or given a placement
        to read from) that lives in host memory (a feature already in GPU memory is read from
        there: warned, not cached)."""
        if not hasattr(self.graph_sampler, "lists"):
            raise TypeError("gpu_cache needs pytorch_zerocopy.dgl.NeighborSampler (or a subclass) as graph_sampler")
        ndata = self.graph.ndata if hasattr(self.graph, "ndata") else {}
        # The cache lives on the GPU that gathers: the output device's, else the sampling one's.
        device = next((d for d in (self.device, self._seed_device) if d.type == "cuda"), torch.device("cpu"))
        caches = {}
        placements = placements or {}
        for name in placements:
            configs.setdefault(name, CacheConfig(rows=0))
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
                                     device, placements.get(name), seeds=self.indices.cpu())
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
        if self.processes is not None:
            return self._iter_processes()
        return self._iter_here()

    def _iter_here(self) -> Iterator:
        ids = self._epoch_indices().to(self._seed_device)
        out = self.graph_sampler.output_device or self.device
        batches = (self.graph_sampler.sample_with(self.graph, ids[b * self.batch_size: (b + 1) * self.batch_size],
                                                  self.placement, out, node_caches=self.node_caches,
                                                  times=self.stage_times)
                   for b in range(len(self)))
        yield from one_ahead(batches, self._seed_device)

    def _iter_processes(self) -> Iterator:
        sampler = self.graph_sampler
        out = sampler.output_device or self.device
        gathered = sampler.prefetch_node_feats[0]
        for mb, feats, _ in self.processes.epoch(self._seed_batches(), self.stage_times):
            # The seeds are the last block's destinations, which lead the input nodes (every
            # block's destinations lead its sources), already where the minibatch is. The CPU
            # state's readers: the lists this process prepared for the stage, no others.
            blocks = mb.blocks
            yield sampler.deliver(self.graph, blocks, mb.input_nodes[:blocks[-1].num_dst], Placement.CPU, out,
                                  self.node_caches, {gathered: feats}, times=self.stage_times)

    def _seed_batches(self) -> EpochBatches:
        """An epoch's minibatches, drawn as in-process (the epoch's order, then one sampling
        seed per minibatch)."""
        return EpochBatches.cut(self._epoch_indices()[:len(self) * self.batch_size], self.batch_size)
