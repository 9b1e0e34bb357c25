"""A feature table in host memory with a GPU cache of its hottest rows in front of it.

:class:`FeatureTable` keeps chosen rows of a host table (CPU tensor, ideally in shared memory,
or a unified tensor) in GPU memory and reads every other row from host memory in the same
call: ``ft.gather(idx)``, ``ft[idx]``, ``pytorch_zerocopy.gather_rows(ft, idx)``,
``torch.index_select(ft, 0, idx)`` and ``torch.nn.functional.embedding(idx, ft)`` all return
``table[idx]`` in index order, on the cache's GPU. One op does it,
``zerocopy::gather_rows_cached``: a device map from row to cache slot (-1: not cached) splits
hits from misses on the GPU, misses are read zero-copy in address order, hits from GPU memory,
in one sort and one kernel, with no host synchronisation unless bounds are checked.

Which rows: :meth:`FeatureTable.for_graph` scores rows with :mod:`pytorch_zerocopy.hotness`
(``CachePolicy.DEGREE``: how many neighbour lists hold the node; ``CachePolicy.PRESAMPLE``:
how often pre-sampled minibatches read it, GNNLab's choice) and caches the hottest rows that
fit ``rows``, ``cache_bytes`` or ``fraction`` of the table (:class:`CacheConfig`).

Staleness contract. Cached rows are a snapshot of the table taken when the cache is filled
(construction, :meth:`FeatureTable.refresh`). In-place writes through the tensor the object
was built from, or views of it, advance torch's version counter, and the next gather raises
``RuntimeError`` until :meth:`~FeatureTable.refresh` re-reads the cached rows. Writes torch
cannot see (another process, NumPy, another tensor over the same memory) are not detected:
call ``refresh()`` after them.

Host memory (:class:`HostMemory`): how a GPU reads the rows it does not cache.
``MAPPED`` (the default) reads the host table itself, mapped in place for every GPU (a unified
tensor): no copy, and every process mapping the same shared memory reads the same bytes.
``MANAGED`` reads a private copy of the table in CUDA managed memory that is kept in host memory
(:func:`to_managed_host`): still zero-copy over PCIe, but the GPU translates its addresses at the
driver's managed-memory granularity, so random reads of short rows touch far fewer translations
and run several times faster (``benchmarks/results/gather_minibatch.md``). It costs a second copy
of the table in host memory per process, made at construction and again by
:meth:`~FeatureTable.refresh`.

Processes. A FeatureTable pickles as its host table (which must be in shared memory), the
ids of its cached rows and its host memory kind; a ``torch.multiprocessing`` child rebuilds it on
its current GPU by gathering those rows once (and, for ``MANAGED``, copying the table once).
Without a GPU the cache is a CPU tensor and the same calls run on the CPU, on the host table,
whatever the host memory kind.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Union

import torch

from . import hotness as _hotness
from . import unified as _unified
from ._compat import register_fake

__all__ = ["CacheConfig", "CachePolicy", "FeatureTable", "HostMemory", "cached_rows_for", "gather_rows_cached",
           "node_cache_configs", "to_managed_host"]

DeviceLike = Union[str, int, torch.device, None]


class CachePolicy(enum.Enum):
    """Which rows a cache holds: the hottest by :func:`~pytorch_zerocopy.hotness.degree_hotness`
    or by :func:`~pytorch_zerocopy.hotness.presample_hotness`."""

    DEGREE = "degree"
    PRESAMPLE = "presample"


class HostMemory(enum.Enum):
    """Where a :class:`FeatureTable` on a GPU reads the rows it does not cache (module docstring):
    ``MAPPED``, the host table mapped in place; ``MANAGED``, a private copy in managed memory kept
    in host memory (:func:`to_managed_host`)."""

    MAPPED = "mapped"
    MANAGED = "managed"


def to_managed_host(table: torch.Tensor, device: DeviceLike = None) -> torch.Tensor:
    """A copy of the CPU or unified tensor ``table`` in CUDA managed memory that stays in host
    memory: a tensor on ``device`` (default: the current GPU) whose bytes are host memory, mapped
    for every GPU and read in place (no page migrates; GPU writes land in host memory too). Any
    CUDA op reads it; ``gather_rows`` reads it in address order. It is private to this process
    (it cannot be sent to another) and holds a second copy of ``table``'s bytes, so writes to
    ``table`` after the call are not seen. Raises ``torch.OutOfMemoryError`` before allocating
    when the host cannot back the copy; needs a CUDA build and a GPU."""
    if not isinstance(table, torch.Tensor):
        raise TypeError(f"to_managed_host: table must be a tensor, got {type(table).__name__}")
    if table.device.type not in ("cpu", _unified.DEVICE_TYPE):
        raise ValueError(f"to_managed_host: table must live in host memory (a CPU or unified tensor), got a tensor "
                         f"on {table.device}")
    if not _unified.gpu_backed():
        raise RuntimeError("to_managed_host needs a CUDA build of pytorch_zerocopy and a GPU; this process has none")
    dev = _cache_device(device)
    if dev.type != "cuda":
        raise ValueError(f"to_managed_host: device must be a GPU, got {dev}")
    host = table.cpu() if _unified.is_unified(table) else table
    return torch.ops.zerocopy.managed_copy.default(host, dev.index, on_host=True)


@dataclass(frozen=True)
class CacheConfig:
    """How big a cache is and which rows it holds. Exactly one of ``rows``, ``cache_bytes`` and
    ``fraction`` (of the table's rows) sizes it. ``fanouts``, ``batch_size``,
    ``presample_batches`` (default: one epoch of the seeds) and ``seed`` drive the
    pre-sampling pass of ``CachePolicy.PRESAMPLE``; ``edge_dir`` is the sampler's."""

    policy: CachePolicy = CachePolicy.DEGREE
    rows: Optional[int] = None
    cache_bytes: Optional[int] = None
    fraction: Optional[float] = None
    fanouts: Sequence[int] = (15, 10)
    batch_size: int = 1024
    presample_batches: Optional[int] = None
    edge_dir: str = "in"
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.policy, CachePolicy):
            raise TypeError(f"CacheConfig.policy must be a CachePolicy, got {self.policy!r}")
        given = [k for k in ("rows", "cache_bytes", "fraction") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"CacheConfig: give exactly one of rows, cache_bytes and fraction, got {given or 'none'}")
        for name in ("rows", "cache_bytes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"CacheConfig.{name} must be an int >= 0, got {v!r}")
        if self.fraction is not None and not (isinstance(self.fraction, (int, float)) and 0 <= self.fraction <= 1):
            raise ValueError(f"CacheConfig.fraction must be in [0, 1], got {self.fraction!r}")
        if self.edge_dir not in ("in", "out"):
            raise ValueError(f"CacheConfig.edge_dir must be 'in' or 'out', got {self.edge_dir!r}")
        object.__setattr__(self, "fanouts", tuple(int(f) for f in self.fanouts))

    def rows_for(self, num_rows: int, row_bytes: int) -> int:
        """The number of rows this config caches for a table of ``num_rows`` rows of ``row_bytes``."""
        if self.rows is not None:
            return min(self.rows, num_rows)
        if self.cache_bytes is not None:
            return min(num_rows, self.cache_bytes // max(1, row_bytes))
        return min(num_rows, int(round(self.fraction * num_rows)))


def gather_rows_cached(
    table: torch.Tensor,
    cache: torch.Tensor,
    slot_of: torch.Tensor,
    index: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    *,
    check_bounds: bool = True,
) -> torch.Tensor:
    """``table[index]`` with the rows that ``slot_of`` maps into ``cache`` read from there.

    ``cache[slot_of[r]]`` must equal ``table[r]`` wherever ``slot_of[r]`` lies in
    ``[0, len(cache))``; other slots read the table. ``table``: unified, CUDA or CPU, 2-D;
    ``cache``: the table's dtype and width, in GPU memory (CPU for a CPU table); ``slot_of``:
    int32, one entry per table row, on the cache's device; ``index``: int32/int64 on the CPU or
    the cache's device. Result in index order on the cache's device. ``check_bounds`` as in
    :func:`pytorch_zerocopy.gather_rows` (one host synchronisation on the GPU)."""
    for name, t in (("table", table), ("cache", cache), ("slot_of", slot_of), ("index", index)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gather_rows_cached: {name} must be a tensor, got {type(t).__name__}")
    if out is None:
        return torch.ops.zerocopy.gather_rows_cached.default(table, cache, slot_of, index, check_bounds=check_bounds)
    torch.ops.zerocopy.gather_rows_cached.out(table, cache, slot_of, index, check_bounds=check_bounds, out=out)
    return out


@register_fake("zerocopy::gather_rows_cached")
def _gather_rows_cached_fake(table, cache, slot_of, index, *, check_bounds=True):
    torch._check(table.dim() == 2, lambda: f"gather_rows_cached: table must be 2-D, got {table.dim()}-D")
    torch._check(index.dim() == 1, lambda: f"gather_rows_cached: index must be 1-D, got {index.dim()}-D")
    return cache.new_empty((index.shape[0], table.shape[1]))


@register_fake("zerocopy::gather_rows_cached.out")
def _gather_rows_cached_out_fake(table, cache, slot_of, index, *, check_bounds=True, out):
    torch._check(table.dim() == 2, lambda: f"gather_rows_cached: table must be 2-D, got {table.dim()}-D")


def cached_rows_for(graph: Any, config: CacheConfig, num_rows: int, row_bytes: int, *,
                    seeds: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The ids (int64, CPU) of the rows ``config`` caches for a table of ``num_rows`` rows of
    ``row_bytes`` whose rows are the nodes of ``graph`` (a
    :class:`~pytorch_zerocopy.graph.CSRGraph` or an ``(indptr, indices)`` pair). ``seeds`` (the training nodes) are
    needed by ``CachePolicy.PRESAMPLE``. Runs where sampling runs: a CPU graph keeps this
    process free of a GPU context, so a parent can choose the rows and hand ``(table, ids)``
    to the processes that build FeatureTables on their GPUs."""
    if not isinstance(config, CacheConfig):
        raise TypeError(f"config must be a CacheConfig, got {type(config).__name__}")
    if config.policy is CachePolicy.DEGREE:
        score = _hotness.degree_hotness(graph, config.edge_dir)
    else:
        if seeds is None:
            raise ValueError("CachePolicy.PRESAMPLE needs seeds (the training nodes) to pre-sample from")
        score = _hotness.presample_hotness(graph, seeds, config.fanouts, batch_size=config.batch_size,
                                           num_batches=config.presample_batches, edge_dir=config.edge_dir,
                                           seed=config.seed)
    if score.numel() != num_rows:
        raise ValueError(f"the graph has {score.numel()} nodes but the table {num_rows} rows")
    return _hotness.hottest(score, config.rows_for(num_rows, row_bytes))


def node_cache_configs(gpu_cache: Any, policy: CachePolicy = CachePolicy.DEGREE) -> Dict[str, CacheConfig]:
    """DGL's ``DataLoader(gpu_cache=...)`` argument, ``{"node": {feature name: rows}}``, as one
    CacheConfig per node feature (``{}`` for None). Edge-feature caches are not supported."""
    if gpu_cache is None:
        return {}
    if not isinstance(gpu_cache, dict) or set(gpu_cache) - {"node", "edge"}:
        raise ValueError("gpu_cache must be a dict like {'node': {'feat': rows_to_cache}}, got "
                         f"{gpu_cache!r}")
    if gpu_cache.get("edge"):
        raise NotImplementedError("gpu_cache: edge-feature caches are not supported; cache node features")
    nodes = gpu_cache.get("node") or {}
    if not isinstance(nodes, dict):
        raise ValueError(f"gpu_cache['node'] must map feature names to row counts, got {nodes!r}")
    return {name: CacheConfig(policy=policy, rows=rows) for name, rows in nodes.items()}


def _cache_device(device: DeviceLike) -> torch.device:
    """The device a cache lives on: the named device (a GPU, or the CPU), else the current GPU;
    the CPU without a GPU."""
    if device is not None and not isinstance(device, int):
        kind = torch.device(device).type
        if kind == "cpu":
            return torch.device("cpu")
        if kind != "cuda":
            raise ValueError(f"FeatureTable: device must be a GPU or the CPU, got {device}")
    if not _unified.gpu_backed():
        if device is not None and torch.device(device if not isinstance(device, int) else "cpu").type == "cuda":
            raise RuntimeError(f"FeatureTable: device {device} asked for, but unified tensors are not GPU-backed here")
        return torch.device("cpu")
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"FeatureTable: device must be a GPU or the CPU, got {dev}")
    return torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)


class FeatureTable:
    """A host feature table with a GPU cache of chosen rows (see the module docstring).

    ``table``: ``[rows, width]`` CPU tensor (shared memory to pickle it) or unified tensor,
    any dtype. ``cached_rows``: int64 ids of the rows to hold in GPU memory (unique, in range),
    or None for no cache. ``device``: the cache's GPU (default: the current one; the CPU where
    no GPU serves unified tensors), or ``"cpu"``: a cache in host memory, where the same calls
    run on the CPU (no faster than the table itself; for CPU runs of GPU code paths).
    ``memory``: a :class:`HostMemory` (or its value), where uncached rows are read from on a
    GPU. Raises ``torch.cuda.OutOfMemoryError`` before allocating anything when the cache and its
    slot map do not fit in the GPU's free memory (``torch.OutOfMemoryError`` when the host cannot
    back a ``MANAGED`` copy).
    """

    def __init__(self, table: torch.Tensor, cached_rows: Optional[torch.Tensor] = None, *,
                 device: DeviceLike = None, memory: Union[HostMemory, str] = HostMemory.MAPPED):
        if not isinstance(table, torch.Tensor):
            raise TypeError(f"FeatureTable: table must be a tensor, got {type(table).__name__}")
        if table.dim() != 2:
            raise ValueError(f"FeatureTable: table must be 2-D [rows, width], got shape {tuple(table.shape)}")
        if table.device.type not in ("cpu", _unified.DEVICE_TYPE):
            raise ValueError(f"FeatureTable: table must live in host memory (a CPU or unified tensor), got a tensor "
                             f"on {table.device}; a table in GPU memory needs no cache")
        try:
            self.memory = HostMemory(memory)
        except ValueError:
            raise ValueError(f"FeatureTable: memory must be a HostMemory or one of "
                             f"{[m.value for m in HostMemory]}, got {memory!r}") from None
        self._given = table
        self.host = table.cpu() if _unified.is_unified(table) else table
        self.cached_ids = self._check_ids(torch.zeros(0, dtype=torch.int64) if cached_rows is None
                                          else torch.as_tensor(cached_rows))
        self.device = _cache_device(device)
        self.table: torch.Tensor
        self._read: Optional[torch.Tensor] = None
        self._open_table()
        self.cache: torch.Tensor
        self.slot_of: Optional[torch.Tensor] = None
        self._allocate()
        self._fill_cache()

    def _open_table(self) -> None:
        """Sets ``table`` (what the rows are read from) and ``_read`` (the tensor the gather ops
        take): the host table on the CPU; on a GPU, the mapping (``MAPPED``) or a fresh managed
        copy (``MANAGED``, the previous one released first)."""
        if self.device.type != "cuda":
            self.table = self._read = self.host
        elif self.memory is HostMemory.MANAGED:
            self._read = None
            self.table = self._read = to_managed_host(self.host, self.device)
        else:
            given = self._given
            self.table = given if _unified.is_unified(given) else _unified.to_unified(
                self.host, f"unified:{self.device.index}")
            # The mapping as a CUDA tensor: gathers reach the CUDA kernel without the unified
            # device's fallback. It keeps the mapping alive as long as this object.
            self._read = _unified._C.device_alias(self.table, self.device)

    # --- construction -------------------------------------------------------------------------

    @classmethod
    def for_graph(cls, table: torch.Tensor, graph: Any, config: CacheConfig, *,
                  seeds: Optional[torch.Tensor] = None, device: DeviceLike = None,
                  memory: Union[HostMemory, str] = HostMemory.MAPPED) -> "FeatureTable":
        """A FeatureTable caching the rows :func:`cached_rows_for` picks (rows are node ids of
        ``graph``)."""
        ids = cached_rows_for(graph, config, table.shape[0], table.shape[1] * table.element_size(), seeds=seeds)
        return cls(table, ids, device=device, memory=memory)

    def with_cache(self, cached_rows: Optional[torch.Tensor]) -> "FeatureTable":
        """A FeatureTable over the same table, read the same way (the same mapping or managed copy:
        nothing is copied again), caching ``cached_rows`` instead (None: no cache). The two share
        the table's bytes; each has its own cache and its own :meth:`refresh`."""
        other = object.__new__(FeatureTable)
        other.__dict__.update(self.__dict__)
        other.cached_ids = other._check_ids(torch.zeros(0, dtype=torch.int64) if cached_rows is None
                                            else torch.as_tensor(cached_rows))
        other.slot_of = None
        other._allocate()
        other._fill_cache()
        return other

    def _check_ids(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int32, torch.int64) or ids.dim() != 1:
            raise TypeError(f"FeatureTable: cached_rows must be a 1-D int32/int64 tensor of row ids, got "
                            f"{ids.dtype} of shape {tuple(ids.shape)}")
        ids = ids.cpu().long()
        rows = self.num_rows
        if ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= rows:
                raise IndexError(f"FeatureTable: cached row {lo if lo < 0 else hi} is out of range for a table with "
                                 f"{rows} rows")
        ids = torch.sort(ids).values
        if ids.numel() > 1 and bool((ids[1:] == ids[:-1]).any()):
            raise ValueError("FeatureTable: cached_rows repeats a row id")
        return ids

    def _allocate(self) -> None:
        count = self.cached_ids.numel()
        cache_bytes = count * self.row_bytes
        map_bytes = self.num_rows * 4 if count else 0
        if self.device.type == "cuda" and count:
            free, total = torch.cuda.mem_get_info(self.device)
            # Blocks torch's caching allocator holds but does not use are free to this process too.
            free += torch.cuda.memory_reserved(self.device) - torch.cuda.memory_allocated(self.device)
            if cache_bytes + map_bytes > free:
                raise torch.cuda.OutOfMemoryError(
                    f"FeatureTable: a cache of {count} rows x {self.row_bytes} B = {_unified.format_bytes(cache_bytes)} plus "
                    f"its slot map ({_unified.format_bytes(map_bytes)}) needs {_unified.format_bytes(cache_bytes + map_bytes)} on "
                    f"{self.device}, which has {_unified.format_bytes(free)} free of {_unified.format_bytes(total)}; choose a smaller "
                    "cache (rows, cache_bytes or fraction)")
        self.cache = torch.empty((count, self.width), dtype=self.dtype, device=self.device)
        if count:
            slot_of = torch.full((self.num_rows,), -1, dtype=torch.int32, device=self.device)
            slot_of[self.cached_ids.to(self.device)] = torch.arange(count, dtype=torch.int32, device=self.device)
            self.slot_of = slot_of

    def refresh(self) -> None:
        """Re-reads the cached rows from the table (after writes to it; see the module doc); with
        ``HostMemory.MANAGED`` on a GPU, first copies the whole table again."""
        if self.device.type == "cuda" and self.memory is HostMemory.MANAGED:
            self._open_table()
        self._fill_cache()

    def _fill_cache(self) -> None:
        if self.cached_ids.numel():
            from .ops import gather_rows

            ids = self.cached_ids.to(self.device) if self.device.type == "cuda" else self.cached_ids
            gather_rows(self._read, ids, out=self.cache, index_sorted=True, check_bounds=False)
        self._version = self._given._version

    # --- reading ------------------------------------------------------------------------------

    def _check_fresh(self) -> None:
        if self._given._version != self._version:
            raise RuntimeError("FeatureTable: the table was written after its rows were cached, so cached rows may be "
                               "stale; call refresh() to re-read them")

    def gather(self, index: torch.Tensor, out: Optional[torch.Tensor] = None, *,
               check_bounds: bool = True) -> torch.Tensor:
        """``table[index]`` for a 1-D int32/int64 ``index`` (CPU or the cache's device), in index
        order, on the cache's device; ``out`` and ``check_bounds`` as in
        :func:`pytorch_zerocopy.gather_rows`."""
        self._check_fresh()
        if self.slot_of is None:
            from .ops import gather_rows

            if self.device.type == "cuda" and index.device.type == "cpu":
                index = index.to(self.device)
            return gather_rows(self._read, index, out, check_bounds=check_bounds)
        return gather_rows_cached(self._read, self.cache, self.slot_of, index, out, check_bounds=check_bounds)

    def __getitem__(self, key) -> torch.Tensor:
        """``ft[idx]``: rows for an integer tensor, list or int, as indexing a tensor would
        (negative ids count from the end; the result has ``idx.shape + (width,)``)."""
        if isinstance(key, bool) or not isinstance(key, (int, list, torch.Tensor)):
            raise TypeError(f"FeatureTable supports indexing by integer ids only, got {type(key).__name__}")
        idx = torch.as_tensor(key)
        if idx.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"FeatureTable: index must hold integers, got {idx.dtype}")
        n = self.num_rows
        idx = torch.where((idx < 0) & (idx >= -n), idx + n, idx)
        rows = self.gather(idx.reshape(-1))
        return rows.view(*idx.shape, self.width)

    def count_hits(self, index: torch.Tensor) -> torch.Tensor:
        """How many entries of ``index`` (valid row ids, CPU or the cache's device) the cache
        holds: a 0-d int64 tensor on the cache's device, computed without a host sync."""
        if self.slot_of is None or index.numel() == 0:
            return torch.zeros((), dtype=torch.int64, device=self.device)
        slots = torch.index_select(self.slot_of, 0, index.to(self.device, non_blocking=True))
        return (slots >= 0).sum()

    def hit_rate(self, index: torch.Tensor) -> float:
        """The share of ``index`` entries the cache holds (reads back one number: a host sync)."""
        if index.numel() == 0:
            return 0.0
        return int(self.count_hits(index)) / index.numel()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        """Row gathers on a FeatureTable: ``torch.index_select(ft, 0, idx)``,
        ``torch.nn.functional.embedding(idx, ft)`` and ``pytorch_zerocopy.gather_rows(ft, idx)``."""
        from .ops import gather_rows

        kwargs = dict(kwargs or {})
        # torch's own index_select, also where a library (PyG) has wrapped torch.index_select.
        if func is torch.index_select or func is torch._C._VariableFunctions.index_select:
            named = dict(zip(("input", "dim", "index"), args), **kwargs)
            table, index = named.get("input"), named.get("index")
            if isinstance(table, FeatureTable) and named.get("dim") in (0, -2) and index.dim() <= 1:
                return table.gather(index.reshape(-1), named.get("out"))
        elif func is torch.nn.functional.embedding:
            index, weight = args[0], args[1] if len(args) > 1 else kwargs.get("weight")
            if isinstance(weight, FeatureTable):
                return weight.gather(index.reshape(-1)).view(*index.shape, weight.width)
        elif func is gather_rows:
            table, index = args[0], args[1]
            out = args[2] if len(args) > 2 else kwargs.get("out")
            if isinstance(table, FeatureTable):
                return table.gather(index, out, check_bounds=kwargs.get("check_bounds", True))
        return NotImplemented

    # --- table-like attributes ------------------------------------------------------------------

    @property
    def shape(self) -> torch.Size:
        return self.host.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.host.dtype

    @property
    def num_rows(self) -> int:
        return int(self.host.shape[0])

    @property
    def width(self) -> int:
        return int(self.host.shape[1])

    @property
    def row_bytes(self) -> int:
        return self.width * self.host.element_size()

    @property
    def cache_rows(self) -> int:
        return int(self.cached_ids.numel())

    @property
    def cache_bytes(self) -> int:
        return self.cache_rows * self.row_bytes

    def size(self, dim: Optional[int] = None):
        return self.host.size() if dim is None else self.host.size(dim)

    def dim(self) -> int:
        return 2

    def element_size(self) -> int:
        return self.host.element_size()

    def __len__(self) -> int:
        return self.num_rows

    def cpu(self) -> torch.Tensor:
        """The host table (no copy)."""
        return self.host

    def __repr__(self) -> str:
        return (f"FeatureTable(rows={self.num_rows}, width={self.width}, dtype={self.dtype}, cached={self.cache_rows} "
                f"rows ({_unified.format_bytes(self.cache_bytes)}) on {self.device}, memory={self.memory.value})")

    # --- processes ------------------------------------------------------------------------------

    def __reduce__(self):
        if not self.host.is_shared():
            raise RuntimeError("a FeatureTable sent to another process must hold its table in shared memory; create "
                               "the table with pytorch_zerocopy.empty_shared / datasets' shared tables, or call "
                               ".share_memory_() on it before building the FeatureTable")
        return (_rebuild_feature_table, (self.host, self.cached_ids.share_memory_(), self.memory.value))


def _rebuild_feature_table(host: torch.Tensor, cached_ids: torch.Tensor, memory: str = "mapped") -> FeatureTable:
    """A FeatureTable in this process over the same host bytes, its cache on the current GPU."""
    return FeatureTable(host, cached_ids, memory=memory)
