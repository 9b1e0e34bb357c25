"""``NeighborLoader``: PyG's loader, same arguments and same minibatches, sampling and gathering
zero-copy from host memory.

It is PyG's own :class:`torch_geometric.loader.NodeLoader` driving this package's
:class:`~pytorch_zerocopy.pyg.NeighborSampler` over this package's stores, so every minibatch is
assembled by PyG's code (``n_id``, ``e_id``, ``input_id``, ``batch_size``,
``num_sampled_nodes``/``num_sampled_edges``, ``transform``, ``custom_cls``). What differs is
where the work runs: the sampler reads the host-resident graph and the feature store gathers the
host-resident rows, both on the GPU where one serves unified tensors, without a CPU-side copy of
any row; the minibatch is then already on that GPU (``batch.to(device)`` costs nothing).

Differences from PyG's loader, all reported when asked for:

* sampling runs in the calling process (on the GPU, or on every CPU core): ``num_workers`` is
  accepted and ignored with a warning, and with it the worker-only options; ``pin_memory`` is
  dropped when minibatches are built on the GPU;
* temporal (``input_time``, ``time_attr``), weighted (``weight_attr``), ``disjoint`` and
  ``subgraph_type='induced'`` sampling and heterogeneous graphs raise ``NotImplementedError``;
* a ``(FeatureStore, GraphStore)`` pair need not be this package's: a PyG graph store is read
  once through its ``csc()`` into a host-resident :class:`~pytorch_zerocopy.pyg.GraphStore`;
  a foreign feature store receives node ids on the sampling device;
* minibatches are :class:`~pytorch_zerocopy.pyg.DeviceData` (PyG's ``Data``, whose ``to()`` the
  device they are on returns at once), unless ``custom_cls`` names a class.

Additions:

* On a GPU the loader reads node feature ``x`` the way ``zerocopy train``'s plan does: from the
  host memory kind this machine's GPU reads fastest (:func:`pytorch_zerocopy.feature_table.default_reading`;
  ``"managed"`` makes a private copy of ``x`` in managed memory kept on the host, the only
  copy the loader reads) behind a GPU cache of a tenth of its rows chosen by pre-sampling.
  ``feature_placement`` names the placement instead (``"unified"``: ``x`` mapped in place, no
  copy; ``"managed"``; ``"cuda"``: all of ``x`` in GPU memory), and a table the feature store
  was already told to read from a placement (:meth:`~pytorch_zerocopy.pyg.FeatureStore.read_from`)
  is kept so; either way no cache is added unless ``gpu_cache`` asks for one. On the CPU
  nothing changes: tables are read where they are, without a cache unless asked for.
* On a GPU the other node tables mapped for it (labels, masks: a few bytes a node) that name
  no placement are read from a copy in GPU memory while they are small
  (:func:`pytorch_zerocopy.feature_table.default_side_readings`): from host memory every row of
  each would cost a PCIe round trip of its own, every minibatch.
* ``gpu_cache``: ``"auto"`` (the default above), None (no cache), a share of the rows such as
  ``"10%"`` or a number of rows of ``x`` (both chosen by pre-sampling), a
  :class:`~pytorch_zerocopy.CacheConfig` for ``x``, or ``{feature name: CacheConfig}``: the
  hottest rows of those features kept in GPU memory
  (:meth:`~pytorch_zerocopy.pyg.FeatureStore.cache_rows`), chosen once when the loader is
  built: ``CachePolicy.DEGREE``, the nodes in the most in-neighbour lists, or
  ``CachePolicy.PRESAMPLE``, the nodes most often read by minibatches pre-sampled from
  ``input_nodes`` with ``num_neighbors`` and ``batch_size``.
* On a GPU the loader keeps work in flight (:mod:`pytorch_zerocopy.pipeline.ahead`): before it
  hands out minibatch ``i`` it has queued the sample of minibatch ``i + 2`` (without waiting for
  it) and gathered and built minibatch ``i + 1``, each minibatch on a side stream of its own.
  The host waits for the GPU once per minibatch, for the sizes of a sample queued one minibatch
  earlier (plus once per hop of fanout ``-1``, and in PyG's ``subgraph_type='bidirectional'``
  conversion). The epoch's seeds reach the GPU in one copy, which each minibatch's stream waits
  for (with torch's own shuffled or sequential batch sampler; other samplers' seeds reach the GPU
  per minibatch through pinned memory); rows of sampled nodes and edges are read without bounds
  checks (the sampler's ids are valid), so nothing else waits.
* ``pipeline=True`` runs the loader's stages the way ``zerocopy train`` runs them
  (:mod:`pytorch_zerocopy.pipeline.loader`): sampling and the gather of ``x`` in processes of
  their own (on a GPU the producer samples and gathers there), minibatches in flight while the
  training loop runs its step. The loop gets the same minibatches (the same seeds drawn from
  torch's generator in this process), and builds them here: ``x`` arrives gathered, and so do
  the integer and bool node tables (labels, masks) that fit a copy in GPU memory, packed with
  the minibatch's ids (:class:`~pytorch_zerocopy.pyg.sampler.CarriedTables`); the other node
  tables are read here, as in-process. The processes read ``x`` and those tables as they are
  when the first epoch starts: a minibatch after one of them was written in place raises.
  ``pipeline`` may also be a :class:`~pytorch_zerocopy.pipeline.Plan`
  (:func:`~pytorch_zerocopy.pipeline.make_plan`) whose ``gather_in`` is ``producer``; with
  ``gpu_cache`` a ``CacheConfig``, it is the plan's cache of ``x``. The processes start with the
  first epoch and end with :meth:`NeighborLoader.close` (or ``with``, or when the loader is
  collected); ``x`` is moved into shared memory (in place) so that they map it.
* ``stage_times``: set it to a :class:`~pytorch_zerocopy.pipeline.trace.StageTimes` and the
  loader records where each minibatch's time goes (sample, gather, build, deliver).
"""

from __future__ import annotations

import warnings
import weakref
from dataclasses import replace as _replace
from typing import Any, Callable, Dict, Iterator, NamedTuple, Optional, Tuple, Union

import torch
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
from torch.utils.data._utils.pin_memory import pin_memory
from torch_geometric.data import Data
from torch_geometric.data import FeatureStore as _PygFeatureStore
from torch_geometric.data import GraphStore as _PygGraphStore
from torch_geometric.loader import NodeLoader
from torch_geometric.sampler import NodeSamplerInput, SamplerOutput

from .. import unified as _unified
from ..feature_table import (AUTO, CacheConfig, cached_rows_for, default_reading, default_side_readings, loader_cache,
                             loader_placement)
from ..graph import CSRGraph
from ..pipeline.ahead import one_ahead
from ..pipeline.loader import (EpochBatches, LoaderProcesses, ProcessWay, check_plan, in_shared_memory,
                               loader_dataset, loader_plan)
from ..pipeline.plan import Plan
from ..pipeline.trace import UNTIMED, Stage, StageTimes, stage_timer
from ..placement import Placement, PlacementError, cat_to_device_async, op_device
from ..sampling import PendingSample, draw_seeds
from .data import DataExtras, DeviceData, stores_from_data
from .feature_store import FeatureStore
from .graph_store import GraphStore
from .sampler import CARRIED_DTYPES, CarriedTables, NeighborSampler, SampledHops, edge_index

_WORKER_ONLY_OPTIONS = ("persistent_workers", "prefetch_factor", "worker_init_fn", "multiprocessing_context")


def _graph_store_from_pyg(graph_store: _PygGraphStore) -> GraphStore:
    """A host-resident copy of another graph store's (homogeneous) edges, read through PyG's
    ``csc()``: its ``perm`` gives the edge ids."""
    attrs = graph_store.get_all_edge_attrs()
    if any(a.edge_type is not None for a in attrs) and len({a.edge_type for a in attrs}) > 1:
        raise NotImplementedError("heterogeneous graph stores are not supported")
    row, colptr, perm = graph_store.csc()
    if isinstance(row, dict):
        if len(row) != 1:
            raise NotImplementedError("heterogeneous graph stores are not supported")
        (key,) = row
        row, colptr, perm = row[key], colptr[key], perm[key]
    colptr, row = colptr.cpu().long(), row.cpu()
    eids = None if perm is None else perm.cpu().long()
    csc = CSRGraph(colptr.contiguous(), row.contiguous(), eids=eids)
    return GraphStore.from_csc(csc)


def _as_stores(data: Any, shared: bool = False):
    """``(feature_store, graph_store, extras)`` for a ``Data`` or a store pair. ``shared``: a
    ``Data``'s ``x`` and the node tables a sampling role reads (:func:`_carried_tables`) are
    moved into shared memory first (in place), so that processes map them."""
    if isinstance(data, Data):
        if shared:
            for name, value in data.items():
                if isinstance(value, torch.Tensor) and value.device.type == "cpu" and name != "edge_index" and \
                        (name == "x" or (value.dtype in CARRIED_DTYPES and data.is_node_attr(name))):
                    value.share_memory_()
        return stores_from_data(data)
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], _PygFeatureStore) \
            and isinstance(data[1], _PygGraphStore):
        feature_store, graph_store = data
        if not isinstance(graph_store, GraphStore):
            graph_store = _graph_store_from_pyg(graph_store)
        return feature_store, graph_store, None
    raise TypeError("data must be a torch_geometric.data.Data or a (FeatureStore, GraphStore) pair, got "
                    f"{type(data).__name__} (HeteroData is not supported)")


def _read_x(feature_store, placement: Optional[Placement], gpu_cache):
    """Where the loader on a GPU reads ``x`` from (module docstring): ``feature_store`` told to
    read it from ``placement`` (the plan's choice when None and the store names none); returns
    the cache to keep (``"auto"`` resolved: the plan's default cache where the placement is
    the loader's own choice, else none)."""
    if not isinstance(feature_store, FeatureStore) or feature_store.get_tensor_size(None, "x") is None:
        if placement is not None:
            raise ValueError("feature_placement needs a node feature table 'x' in this package's FeatureStore")
        return None if gpu_cache == AUTO else gpu_cache
    chosen = placement is not None or feature_store.placement_of("x") is not None
    table = feature_store.get_tensor(None, "x", None)
    if table.device.type == "cuda":  # in GPU memory already: read there, nothing to cache
        return None if gpu_cache == AUTO else gpu_cache
    auto_placement, auto_cache = default_reading(table.numel() * table.element_size())
    if feature_store.placement_of("x") is None:
        feature_store.read_from("x", placement or auto_placement)
    if gpu_cache != AUTO:
        return gpu_cache
    if chosen or feature_store.cache_of("x") is not None:
        return None
    return auto_cache


def _carried_tables(feature_store, device: torch.device) -> Tuple[Tuple[str, torch.Tensor], ...]:
    """The node tables of ``feature_store`` that the process way's sampling role reads and packs
    with each minibatch (:class:`~pytorch_zerocopy.pyg.sampler.CarriedTables`): those other than
    ``x`` in host memory, of a dtype it packs, with no placement named and no cache, and on a
    GPU ``device`` only those a loader reads from a copy in GPU memory
    (:func:`~pytorch_zerocopy.feature_table.default_side_readings`: the role keeps that copy);
    each as the host tensor it holds its rows in
    (:meth:`~pytorch_zerocopy.pyg.FeatureStore.host_of`)."""
    if not isinstance(feature_store, FeatureStore) or feature_store.get_tensor_size(None, "x") is None:
        return ()
    found = {}
    for group, name in feature_store.table_keys():
        if group is not None or name == "x" or feature_store.placement_of(name) is not None \
                or feature_store.cache_of(name) is not None:
            continue
        host = feature_store.host_of(name)
        if host is not None and host.dtype in CARRIED_DTYPES and host.dim() >= 1 and host[0].numel() > 0:
            found[name] = host
    if device.type == "cuda" and found:
        x = feature_store.get_tensor(None, "x", None)
        sizes = {name: t.numel() * t.element_size() for name, t in found.items()}
        where = default_side_readings(sizes, x.numel() * x.element_size(),
                                      torch.cuda.get_device_properties(device).total_memory)
        found = {name: t for name, t in found.items() if where[name] is Placement.GPU}
    return tuple(found.items())


def _read_side_tables(feature_store, device: torch.device, skip: Tuple[str, ...] = ()) -> None:
    """Reads each node table of ``feature_store`` other than ``x`` that is mapped for the GPU
    and names no placement (labels, masks) from where
    :func:`~pytorch_zerocopy.feature_table.default_side_readings` says: small ones from a copy
    in GPU memory, which a later in-place write to the host tensor makes refuse reads until
    ``feature_store.refresh(name)`` copies it again. ``skip``: tables read elsewhere."""
    if not isinstance(feature_store, FeatureStore) or feature_store.get_tensor_size(None, "x") is None:
        return
    x = feature_store.get_tensor(None, "x", None)
    sides = {}
    for attr in feature_store.get_all_tensor_attrs():
        named = feature_store.placement_of(attr.attr_name, attr.group_name) is not None
        if attr.group_name is not None or attr.attr_name == "x" or named or attr.attr_name in skip:
            continue
        table = feature_store.get_tensor(None, attr.attr_name, None)
        if _unified.is_unified(table):  # mapped for the GPU (a CUDA table is read where it is)
            sides[attr.attr_name] = table.numel() * table.element_size()
    gpu_bytes = torch.cuda.get_device_properties(device).total_memory
    for name, placement in default_side_readings(sides, x.numel() * x.element_size(), gpu_bytes).items():
        if placement is not Placement.MAPPED:
            feature_store.read_from(name, placement)


def _cache_features(feature_store, graph_store: GraphStore, gpu_cache, num_neighbors, input_nodes,
                    batch_size: int) -> None:
    """Caches the rows ``gpu_cache`` chooses of each named node feature (see the module docstring)."""
    configs = {"x": gpu_cache} if isinstance(gpu_cache, CacheConfig) else gpu_cache
    if not isinstance(configs, dict) or not all(isinstance(c, CacheConfig) for c in configs.values()):
        raise TypeError(f"gpu_cache must be a pytorch_zerocopy.CacheConfig or a dict of them by feature name, got "
                        f"{gpu_cache!r}")
    if not isinstance(feature_store, FeatureStore):
        raise TypeError("gpu_cache needs this package's FeatureStore (pytorch_zerocopy.pyg.FeatureStore), got "
                        f"{type(feature_store).__name__}")
    if isinstance(num_neighbors, dict):
        raise NotImplementedError("per-edge-type num_neighbors are for heterogeneous graphs, which are not supported")
    seeds = torch.as_tensor(input_nodes)
    if seeds.dtype == torch.bool:
        seeds = seeds.nonzero().flatten()
    graph = graph_store.csc_graph
    for name, config in configs.items():
        size = feature_store.get_tensor_size(attr_name=name, group_name=None)
        if size is None:
            raise KeyError(f"gpu_cache: the feature store has no node feature {name!r}")
        row_bytes = feature_store.get_tensor(attr_name=name, group_name=None, index=None).element_size()
        for d in size[1:]:
            row_bytes *= d
        # The sampler reads the in-neighbour lists as stored, with these fanouts and batches;
        # pre-sampling takes them input side first (PyG's list starts at the seeds).
        config = _replace(config, fanouts=tuple(reversed(num_neighbors)), batch_size=int(batch_size), edge_dir="out")
        rows = cached_rows_for(graph, config, int(size[0]), row_bytes, seeds=seeds.cpu())
        feature_store.cache_rows(name, rows)


def _epoch_order(batch_sampler) -> Optional[Callable[[], torch.Tensor]]:
    """For torch's ``BatchSampler`` over its ``RandomSampler`` (without replacement,
    ``num_samples`` or a generator of its own) or ``SequentialSampler``: a function returning
    the epoch's order of the input positions (int64) as that sampler draws it (a seed from
    torch's default generator, then ``randperm``; ``arange`` in order), to be called where the
    sampler draws it, at the epoch's first batch. None for any other batch sampler."""
    if type(batch_sampler) is not BatchSampler:
        return None
    sampler = batch_sampler.sampler
    if type(sampler) is SequentialSampler:
        return lambda: torch.arange(len(sampler.data_source))
    if type(sampler) is RandomSampler and not sampler.replacement and sampler._num_samples is None \
            and sampler.generator is None:
        def draw() -> torch.Tensor:  # RandomSampler.__iter__'s draws
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
            return torch.randperm(len(sampler.data_source), generator=torch.Generator().manual_seed(seed))
        return draw
    return None


def _cuts(n: int, batch_sampler: BatchSampler) -> Iterator[slice]:
    """The batches ``batch_sampler`` cuts from ``n`` positions, as slices."""
    size = batch_sampler.batch_size
    for start in range(0, _cut_end(n, batch_sampler), size):
        yield slice(start, start + size)


def _cut_end(n: int, batch_sampler: BatchSampler) -> int:
    """Where the batches ``batch_sampler`` cuts from ``n`` positions end (``drop_last`` drops
    a last partial batch)."""
    return n - n % batch_sampler.batch_size if batch_sampler.drop_last else n


def _index_batches(batch_sampler) -> Optional[Iterator[torch.Tensor]]:
    """The index batches of torch's batch sampler (see :func:`_epoch_order`) as int64 tensors
    cut from one order: the same batches in the same order, from the same draw of torch's
    default generator at the same point (the first batch), as the sampler's lists of Python
    ints, without building them. None for any other batch sampler."""
    draw = _epoch_order(batch_sampler)
    if draw is None:
        return None

    def batches() -> Iterator[torch.Tensor]:
        order = draw()
        for cut in _cuts(order.numel(), batch_sampler):
            yield order[cut]
    return batches()


def _set_attributes(data: Data, values: Dict[str, Any]) -> None:
    """Sets ``data``'s attributes ``values`` (None values: not set), as ``setattr`` does; a
    new ``Data`` or :class:`~.data.DeviceData` (neither has attribute setters of its own) gets
    them straight into its storage's mapping, where PyG's attribute setters put them (each after
    a dispatch that costs more than the store)."""
    values = {k: v for k, v in values.items() if v is not None}
    if type(data) in (Data, DeviceData) and not data._store._mapping:
        data._store._mapping.update(values)
        return
    for key, value in values.items():
        setattr(data, key, value)


class _TableVersions:
    """The host tables the process way's roles read from copies of their own (``x``, the
    carried tables), with their versions when the roles started: a minibatch built after one
    was written in place would mix old rows with new, so :meth:`check` refuses it."""

    def __init__(self, tables: Tuple[Tuple[str, torch.Tensor], ...]):
        self.tables = tables
        self.versions: Optional[Tuple[int, ...]] = None

    def remember(self) -> None:
        self.versions = tuple(t._version for _, t in self.tables)

    def check(self) -> None:
        if self.versions is None:
            return
        for (name, t), version in zip(self.tables, self.versions):
            if t._version != version:
                raise RuntimeError(f"NeighborLoader(pipeline=True): table {name!r} was written in place after the "
                                   "loader's processes started, and they read it as it was then; write tables "
                                   "before the first epoch, or make a new loader after writing")


class _Started(NamedTuple):
    """A minibatch whose sample has been started (:meth:`NeighborLoader._start`)."""

    sample: PendingSample  # its result: the SamplerOutput
    times: StageTimes  # what its stages record into
    sample_s: float  # host seconds spent starting the sample (counted in its sample time)


class NeighborLoader(ProcessWay, NodeLoader):
    """PyG's ``NeighborLoader`` (same signature, same minibatches; see the module docstring).

    ``data``: a PyG ``Data`` (its tables are used in place, see
    :func:`~pytorch_zerocopy.pyg.stores_from_data`) or a ``(FeatureStore, GraphStore)`` pair.
    ``num_neighbors[h]``: neighbours sampled per node in hop ``h`` (``-1``: all).
    ``input_nodes``: seed node ids or a boolean mask (default: every node). ``**kwargs``:
    ``batch_size``, ``shuffle``, ``drop_last``, ... of ``torch.utils.data.DataLoader``.
    ``gpu_cache``: GPU caches of hot feature rows; ``feature_placement``: where a GPU reads
    ``x`` from; ``pipeline``: the process way (see the module docstring).
    """

    stage_times: Optional[StageTimes] = None

    def __init__(
        self,
        data: Any,
        num_neighbors,
        input_nodes=None,
        input_time: Optional[torch.Tensor] = None,
        replace: bool = False,
        subgraph_type="directional",
        disjoint: bool = False,
        temporal_strategy: str = "uniform",
        time_attr: Optional[str] = None,
        weight_attr: Optional[str] = None,
        transform: Optional[Callable] = None,
        transform_sampler_output: Optional[Callable] = None,
        is_sorted: bool = False,
        filter_per_worker: Optional[bool] = None,
        neighbor_sampler: Optional[NeighborSampler] = None,
        directed: bool = True,
        gpu_cache: Union[str, int, None, CacheConfig, Dict[str, CacheConfig]] = AUTO,
        feature_placement: Optional[str] = None,
        pipeline: Union[bool, Plan] = False,
        **kwargs,
    ):
        if input_time is not None or time_attr is not None:
            raise NotImplementedError("temporal sampling (input_time, time_attr) is not supported by "
                                      "pytorch_zerocopy.pyg.NeighborLoader")
        if weight_attr is not None:
            raise NotImplementedError("weighted sampling (weight_attr) is not supported by "
                                      "pytorch_zerocopy.pyg.NeighborLoader")
        if disjoint:
            raise NotImplementedError("disjoint=True is not supported by pytorch_zerocopy.pyg.NeighborLoader")
        if not directed:
            warnings.warn("The usage of the 'directed' argument in 'NeighborLoader' is deprecated. Use "
                          "`subgraph_type='induced'` instead.", stacklevel=2)
            subgraph_type = "induced"
        if isinstance(input_nodes, (str, tuple)):
            raise NotImplementedError("input_nodes with a node type is for heterogeneous graphs, "
                                      "which are not supported")

        if not isinstance(pipeline, (bool, Plan)):
            raise TypeError(f"pipeline must be True, False or a pytorch_zerocopy.pipeline.Plan, got {pipeline!r}")
        if not isinstance(gpu_cache, dict):
            gpu_cache = loader_cache(gpu_cache)
        placement = loader_placement(feature_placement, pipeline, "x")
        if pipeline is not False and gpu_cache == AUTO:
            gpu_cache = None  # the plan's default cache
        if pipeline is not False and gpu_cache is not None and not isinstance(gpu_cache, CacheConfig):
            raise TypeError("with pipeline, gpu_cache is the plan's cache of x: a pytorch_zerocopy.CacheConfig, got "
                            f"{gpu_cache!r}")
        feature_store, graph_store, extras = _as_stores(data, shared=pipeline is not False)
        if neighbor_sampler is None:
            neighbor_sampler = NeighborSampler((feature_store, graph_store), num_neighbors, replace=replace,
                                               subgraph_type=subgraph_type)
        self.feature_store = feature_store
        self.graph_store = graph_store
        self.extras: Optional[DataExtras] = extras
        self.user_transform = transform

        self.device = op_device(graph_store.csc_graph.indptr)  # where sampling runs
        on_gpu = graph_store.csc_graph.indptr.device.type == "cuda"
        if kwargs.get("num_workers", 0):
            warnings.warn("pytorch_zerocopy.pyg.NeighborLoader samples in the calling process (on the GPU, "
                          "or on every CPU core); num_workers is ignored", stacklevel=2)
            kwargs["num_workers"] = 0
            for name in _WORKER_ONLY_OPTIONS:
                kwargs.pop(name, None)
        if on_gpu and kwargs.pop("pin_memory", False):
            warnings.warn("minibatches are built on the GPU: pin_memory is ignored", stacklevel=2)
        if input_nodes is None:
            input_nodes = torch.arange(graph_store.num_nodes)
        if pipeline is False and self.device.type == "cuda":
            gpu_cache = _read_x(feature_store, placement, gpu_cache)
            _read_side_tables(feature_store, self.device)
        elif placement is not None:
            raise PlacementError(f"feature_placement {placement.value!r}: sampling runs on the CPU here, where tables "
                                 "are read as they lie")
        elif gpu_cache == AUTO:
            gpu_cache = None
        # The process way's sampling role reads x and the tables it packs; this process the others.
        carried = _carried_tables(feature_store, self.device) if pipeline is not False else ()
        if pipeline is not False and self.device.type == "cuda":
            _read_side_tables(feature_store, self.device, skip=tuple(name for name, _ in carried))
        if gpu_cache is not None and pipeline is False:
            _cache_features(feature_store, graph_store, gpu_cache, num_neighbors, input_nodes,
                            kwargs.get("batch_size", 1))

        super().__init__(
            data=(feature_store, graph_store),
            node_sampler=neighbor_sampler,
            input_nodes=input_nodes,
            transform=self._complete,
            transform_sampler_output=transform_sampler_output,
            filter_per_worker=filter_per_worker,
            **kwargs,
        )

        self.processes: Optional[LoaderProcesses] = None
        self._carried: Optional[CarriedTables] = None
        self._read_there: Optional[_TableVersions] = None
        if pipeline is not False:
            self.processes = self._processes(pipeline, gpu_cache, carried)
            weakref.finalize(self, self.processes.close)

    def _processes(self, pipeline: Union[bool, Plan], cache: Optional[CacheConfig],
                   carried: Tuple[Tuple[str, torch.Tensor], ...]) -> LoaderProcesses:
        """The process way's roles over this loader's stores (started by the first epoch)."""
        if not isinstance(self.node_sampler, NeighborSampler):
            raise TypeError("pipeline needs pytorch_zerocopy.pyg.NeighborSampler (or a subclass) as neighbor_sampler, "
                            f"got {type(self.node_sampler).__name__}")
        if not isinstance(self.feature_store, FeatureStore) or self.feature_store.get_tensor_size(None, "x") is None:
            raise ValueError("pipeline needs a node feature table 'x' in this package's FeatureStore: its producer "
                             "process gathers x")
        x = self.feature_store.get_tensor(None, "x", None).cpu()
        watched_x = self.feature_store.host_of("x")
        ds = loader_dataset("pyg", self.graph_store.csc_graph.cpu(), x, self.input_data.node)
        fanouts = list(reversed(self.node_sampler.fanouts))
        plan = (loader_plan(fanouts, self.batch_size or 1, ds.row_bytes, ds.feature_source.nbytes, cache)
                if pipeline is True else check_plan(pipeline))
        shared = [(name, in_shared_memory(host)) for name, host in carried]  # a copy only where not shared
        self._carried = CarriedTables(shared) if carried else None
        self._read_there = _TableVersions(((("x", watched_x),) if watched_x is not None else ()) + tuple(carried))
        return LoaderProcesses(plan, ds, self.node_sampler.stage(self._carried))

    def __iter__(self) -> Iterator:
        if self.processes is None:
            return self._iter_here()
        return self._iter_processes()

    def _iter_here(self) -> Iterator:
        """The in-process epoch: each minibatch started (:meth:`_start`) and finished
        (:meth:`_finish`) by :func:`~pytorch_zerocopy.pipeline.ahead.one_ahead`, which on a GPU
        starts minibatch ``i + 2`` and finishes ``i + 1`` before it hands out ``i``, and on the
        CPU does one after the other: the minibatches PyG's iterator makes, in its order, pinned
        where it would pin them."""
        indices = torch.utils.data.DataLoader._get_iterator(self)
        seeds = self._epoch_seeds()
        if seeds is not None:
            batches = (self._start_seeds(input_id, node) for input_id, node in seeds)
        else:
            batches = (self._start(batch) for batch in self._input_batches(indices))
        if not getattr(indices, "_pin_memory", False):
            return one_ahead(batches, self.device, self._finish)
        device = getattr(indices, "_pin_memory_device", None)

        def finish_pinned(started: _Started) -> Any:
            return pin_memory(self._finish(started), device)
        return one_ahead(batches, self.device, finish_pinned)

    def _input_batches(self, indices=None) -> Iterator[NodeSamplerInput]:
        """The seed batches of one epoch, in the order of ``indices`` (torch's DataLoader
        iterator over this loader, made here when None: its base seed, then the batch
        sampler's order), each as PyG's ``collate_fn`` cuts it. Torch's own batch sampler over
        its random or sequential sampler is followed without its lists of Python ints
        (:func:`_index_batches`)."""
        if indices is None:
            indices = torch.utils.data.DataLoader._get_iterator(self)
        batches = _index_batches(self.batch_sampler) if self._auto_collation else None
        if batches is not None:
            for index in batches:
                yield self.input_data[index]
            return
        while True:
            try:
                index = indices._next_index()
            except StopIteration:
                return
            yield self.input_data[index]

    def _own_sampling(self) -> bool:
        """Whether the sampler is this package's, sampling as it does (its sample calls not
        overridden): then a sample is queued without the host waiting for it."""
        cls = type(self.node_sampler)
        return isinstance(self.node_sampler, NeighborSampler) and \
            cls.sample_from_nodes is NeighborSampler.sample_from_nodes and \
            cls.sample_from_nodes_async is NeighborSampler.sample_from_nodes_async and \
            cls.sample_seeds_async is NeighborSampler.sample_seeds_async

    def _epoch_seeds(self) -> Optional[Iterator[Tuple[torch.Tensor, torch.Tensor]]]:
        """``(input ids, seeds)`` of each minibatch of an epoch on the sampling device, where
        this package's sampler samples (:meth:`_own_sampling`) batches of torch's own batch
        sampler (:meth:`_epoch_slices`; on a GPU one copy and one wait per epoch instead of a
        staged copy per minibatch). None otherwise."""
        if not self._own_sampling():
            return None
        return self._epoch_slices(self.device)

    def _epoch_slices(self, device: torch.device) -> Optional[Iterator[Tuple[torch.Tensor, torch.Tensor]]]:
        """``(input ids, seeds)`` of each minibatch of an epoch of torch's own batch sampler
        (:func:`_epoch_order`), sliced from the epoch's input ids and seeds: the batches of
        :meth:`_input_batches` (the same draw of torch's generator, at the first minibatch)
        without indexing the input per minibatch. On a GPU ``device`` they are moved there
        first, once. None for any other batch sampler."""
        draw = _epoch_order(self.batch_sampler) if self._auto_collation else None
        if draw is None:
            return None
        source = self.input_data

        def epoch() -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
            order = draw()
            ids = order if source.input_id is None else source.input_id[order]
            nodes = source.node[order]
            copied = None
            if device.type == "cuda":
                n = order.numel()
                both = cat_to_device_async([ids, nodes], device, torch.int64)
                copied = torch.cuda.Event()
                copied.record(torch.cuda.current_stream(device))
                ids, nodes = both[:n], both[n:]
            for cut in _cuts(order.numel(), self.batch_sampler):
                if copied is not None:
                    # Each minibatch starts on a side stream of its own (the current one here):
                    # it waits for the copy, the host does not. Each sample keeps its slice alive
                    # until its kernels have run.
                    torch.cuda.current_stream(device).wait_event(copied)
                yield ids[cut], nodes[cut]
        return epoch()

    def _start(self, batch: NodeSamplerInput) -> _Started:
        """Starts sampling ``batch`` on the current stream: on a GPU this package's sampler
        queues it without the host waiting (its seed is drawn now); another sampler (one that
        overrides ``sample_from_nodes``) samples it now."""
        sampler = self.node_sampler
        if self._own_sampling():
            return self._timed_start(lambda: sampler.sample_from_nodes_async(batch))
        return self._timed_start(lambda: PendingSample.done(sampler.sample_from_nodes(batch)))

    def _start_seeds(self, input_id: torch.Tensor, node: torch.Tensor) -> _Started:
        """:meth:`_start` for the seeds of :meth:`_epoch_seeds`."""
        return self._timed_start(lambda: self.node_sampler.sample_seeds_async(node, input_id))

    def _timed_start(self, start: Callable[[], PendingSample]) -> _Started:
        times = stage_timer(self.stage_times)
        began = times.begin()
        pending = start()
        return _Started(pending, times, times.begin() - began)

    def _finish(self, started: _Started) -> Any:
        """The minibatch of a started sample, on the stream it was started on: takes the sample
        (waits for its GPU work only, once), then gathers and builds (:meth:`filter_fn`)."""
        times = started.times
        began = times.begin()
        out = started.sample.result()
        times.end(Stage.SAMPLE, began - started.sample_s)
        return self.filter_fn(out)

    def _iter_processes(self) -> Iterator[Data]:
        shape = tuple(self.feature_store.get_tensor_size(None, "x")[1:])
        carried, read_there = self._carried, self._read_there
        if self.processes.sup is None:  # the processes start now and read the tables as they are
            read_there.remember()
        # The labels part: the input ids, then the carried tables at the minibatch's nodes, a
        # piece per dtype (the ids' piece: what the labels part holds beyond the tables).
        label_sizes = (lambda n: ()) if carried is None else (lambda n: [-1] + carried.run_words(n))
        for mb, x, parts in self.processes.epoch(self._seed_batches(), self.stage_times, label_sizes):
            read_there.check()
            n = x.shape[0]
            gathered = {} if carried is None else carried.unpack(parts.labels[1:], n)
            gathered["x"] = x if x.shape[1:] == shape else x.view((n,) + shape)
            out = self.node_sampler.output(SampledHops.from_minibatch(mb, parts), parts.labels[0])
            yield self.filter_fn(out, gathered)

    def _seed_batches(self) -> EpochBatches:
        """An epoch's minibatches, drawn as the in-process loader draws them (one sampling seed
        per minibatch, drawn after the epoch's order), their input ids carried along. Where
        torch's own batch sampler cuts the epoch's order (:func:`_epoch_order`, the draw of
        :meth:`_epoch_slices`): the seeds and ids in that order, cut where it cuts, with no
        tensor per minibatch; else the batches of :meth:`_input_batches`."""
        indices = torch.utils.data.DataLoader._get_iterator(self)  # draws its base seed, as in-process
        draw = _epoch_order(self.batch_sampler) if self._auto_collation else None
        if draw is None:
            batches = [(batch.node, batch.input_id) for batch in self._input_batches(indices)]
            return EpochBatches.of(batches, draw_seeds(len(batches)))
        order = draw()
        order = order[:_cut_end(order.numel(), self.batch_sampler)]
        source = self.input_data
        ids = order if source.input_id is None else source.input_id[order]
        return EpochBatches.cut(source.node[order], self.batch_sampler.batch_size, ids)

    def collate_fn(self, index) -> Any:
        with stage_timer(self.stage_times).timed(Stage.SAMPLE):
            return super().collate_fn(index)

    def filter_fn(self, out: SamplerOutput, gathered: Optional[Dict[str, torch.Tensor]] = None) -> Data:
        """The minibatch of ``out`` as PyG's loader makes it from a store pair: every node table
        read at ``out.node`` (``gathered``: tables already read there, by name), ``n_id``,
        ``e_id``, ``input_id``, ``batch_size``, the per-hop counts; then the transforms. With
        ``gathered`` (the process way, whose producer gathers) all of it counts as build time
        in :attr:`stage_times`."""
        times = stage_timer(self.stage_times)
        if not gathered:
            return self._filter(out, {}, times)
        with times.timed(Stage.BUILD):
            return self._filter(out, gathered, UNTIMED)

    def _filter(self, out: SamplerOutput, gathered: Dict[str, torch.Tensor], times: StageTimes) -> Data:
        if self.transform_sampler_output:
            out = self.transform_sampler_output(out)
        if not isinstance(out, SamplerOutput):
            raise TypeError(f"{type(self).__name__} builds minibatches from a SamplerOutput, got {type(out).__name__}")
        with times.timed(Stage.GATHER):
            if isinstance(self.feature_store, FeatureStore):  # sampled ids: read without bounds checks
                tables = [(name, gathered[name] if name in gathered else
                           self.feature_store.read_rows(name, out.node, group)) for group, name in
                          self.feature_store.table_keys()]
            else:
                attrs = self.feature_store.get_all_tensor_attrs()
                for attr in attrs:
                    attr.index = out.node
                read = iter(self.feature_store.multi_get_tensor([a for a in attrs if a.attr_name not in gathered]))
                tables = [(a.attr_name, gathered[a.attr_name] if a.attr_name in gathered else next(read))
                          for a in attrs]
        with times.timed(Stage.BUILD):
            values = {"edge_index": edge_index(out.row, out.col)}
            if tables and (self.extras is None or self.extras.explicit_num_nodes):  # else PyG's has none
                values["num_nodes"] = out.node.size(0)
            values.update(tables)
            values["n_id"] = out.node
            if out.edge is not None:
                edge = out.edge if out.edge.dtype == torch.long else out.edge.to(torch.long)
                perm = self.node_sampler.edge_permutation
                values["e_id"] = perm[edge] if perm is not None else edge
            values.update(batch=out.batch, num_sampled_nodes=out.num_sampled_nodes,
                          num_sampled_edges=out.num_sampled_edges, input_id=out.metadata[0],
                          seed_time=out.metadata[1], batch_size=out.metadata[0].size(0))
            data = self.custom_cls() if self.custom_cls is not None else DeviceData()
            _set_attributes(data, values)
            if out.orig_row is not None and out.orig_col is not None:
                data._orig_edge_index = torch.stack([out.orig_row, out.orig_col], dim=0)
            return data if self.transform is None else self.transform(data)

    def _complete(self, batch: Data) -> Data:
        """What PyG's loader adds for a ``Data`` and a store pair lacks, then the user's
        transform."""
        if self.extras is not None:
            batch = self.extras.complete(batch)
        return batch if self.user_transform is None else self.user_transform(batch)

    def __repr__(self) -> str:
        if self.processes is not None:
            return f"{self.__class__.__name__}(in processes: {self.processes.plan.describe()})"
        return f"{self.__class__.__name__}(sampling on {self.graph_store.csc_graph.indptr.device})"
