"""Feature tables: one way to read rows (``read(ids, out=None)``), whatever holds them, and a
GPU cache of hot rows that wraps any reader.

:class:`FeatureTable` is a ``[rows, width]`` table in one
:class:`~pytorch_zerocopy.placement.Placement`: host memory read by the CPU (``CPU``), shared
host memory mapped for the GPU (``MAPPED``, a unified tensor), managed memory kept in host
memory (``MANAGED``: private to this process; on machines whose GPU translates managed memory
at a coarser granularity than registered host pages, random rows read several times faster,
see :mod:`pytorch_zerocopy.probe`), or GPU memory (``GPU``). ``table.read(ids)``,
``table[ids]``, ``pytorch_zerocopy.gather_rows(table, ids)``, ``torch.index_select(table, 0,
ids)`` and ``torch.nn.functional.embedding(ids, table)`` all return ``rows[ids]`` in ids order,
on :attr:`FeatureTable.device`, through the package's gather op (rows read in address order,
128 B-aligned). :meth:`FeatureTable.load` fills a table straight from a dataset's
:class:`~pytorch_zerocopy.datasets.features.FeatureSource`, so the process that reads the rows
owns the only copy of them.

:class:`CachedTable` keeps chosen rows of any reader in GPU memory and reads every other row
through the reader in the same call: over a :class:`FeatureTable`, one op does it
(``zerocopy::gather_rows_cached``: a device map from row to cache slot splits hits from misses on
the GPU, misses are read zero-copy in address order, hits from GPU memory, in one sort and one
kernel, with no host synchronisation unless bounds are checked). Which rows:
:func:`cached_rows_for` scores rows with :mod:`pytorch_zerocopy.hotness` (``CachePolicy.DEGREE``:
how many neighbour lists hold the node; ``CachePolicy.PRESAMPLE``: how often pre-sampled
minibatches read it, GNNLab's choice) and picks the hottest that fit :class:`CacheConfig`.

Staleness contract. Cached rows are a snapshot of the table taken when the cache is filled
(construction, :meth:`CachedTable.refresh`). In-place writes through the tensor the table was
built from, or views of it, advance torch's version counter, and the next read raises
``RuntimeError`` until :meth:`~CachedTable.refresh` re-reads the cached rows. Writes torch
cannot see (another process, NumPy, another tensor over the same memory) are not detected:
call ``refresh()`` after them. A ``MANAGED`` or ``GPU`` table made from a host tensor is a copy
of it: in-place writes to that host tensor that torch sees make the table's next read (and its
cache's) raise the same error until :meth:`FeatureTable.refresh` (or the cache's, which calls
it) copies the tensor again, so a copy never serves rows older than its tensor's silently.

Processes. A ``CPU`` or ``MAPPED`` table whose rows are in shared memory pickles as those rows
(and a CachedTable over it as the table and its cached ids): a ``torch.multiprocessing`` child
rebuilds it on its current GPU over the same bytes. ``MANAGED`` and ``GPU`` tables are private to
their process; send the dataset's feature source instead and load it there.

Without a GPU, ``MAPPED`` tables are shared host tensors read on the CPU, and a cache is a CPU
tensor: the same calls run on the CPU.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable

import torch

from . import hotness as _hotness
from . import unified as _unified
from ._compat import register_fake
from .ops import DEFAULT_TUNING, GatherTuning, gather_rows
from .placement import Placement, PlacementError, gpu, place, to_device_async

__all__ = ["CacheConfig", "CachePolicy", "CachedTable", "FeatureReader", "FeatureTable", "cached_rows_for",
           "default_reading", "gather_rows_cached", "loader_cache", "loader_placement", "node_cache_configs"]

DeviceLike = Union[str, int, torch.device, None]


@runtime_checkable
class FeatureReader(Protocol):
    """What reads feature rows: :class:`FeatureTable`, :class:`CachedTable`, or any object with
    these members. ``read`` returns ``rows[ids]`` (1-D int32/int64 ``ids`` on the CPU or on
    :attr:`device`) in ids order on :attr:`device`, into ``out`` when given."""

    device: torch.device

    @property
    def shape(self) -> torch.Size: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def read(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None, *,
             check_bounds: bool = True) -> torch.Tensor: ...


class CachePolicy(enum.Enum):
    """Which rows a cache holds: the hottest by :func:`~pytorch_zerocopy.hotness.degree_hotness`
    or by :func:`~pytorch_zerocopy.hotness.presample_hotness`."""

    DEGREE = "degree"
    PRESAMPLE = "presample"


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
    tuning: GatherTuning = DEFAULT_TUNING,
) -> torch.Tensor:
    """``table[index]`` with the rows that ``slot_of`` maps into ``cache`` read from there.

    ``cache[slot_of[r]]`` must equal ``table[r]`` wherever ``slot_of[r]`` lies in
    ``[0, len(cache))``; other slots read the table. ``table``: unified, CUDA or CPU, 2-D;
    ``cache``: the table's dtype and width, in GPU memory (CPU for a CPU table); ``slot_of``:
    int32, one entry per table row, on the cache's device; ``index``: int32/int64 on the CPU or
    the cache's device. Result in index order on the cache's device. ``check_bounds`` and
    ``tuning`` as in :func:`pytorch_zerocopy.gather_rows` (the check: one host synchronisation
    on the GPU)."""
    for name, t in (("table", table), ("cache", cache), ("slot_of", slot_of), ("index", index)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"gather_rows_cached: {name} must be a tensor, got {type(t).__name__}")
    launch = dict(blocks_per_sm=tuning.blocks_per_sm, unroll=tuning.unroll)
    if out is None:
        return torch.ops.zerocopy.gather_rows_cached.default(table, cache, slot_of, index, check_bounds=check_bounds,
                                                             **launch)
    torch.ops.zerocopy.gather_rows_cached.out(table, cache, slot_of, index, check_bounds=check_bounds, out=out,
                                              **launch)
    return out


@register_fake("zerocopy::gather_rows_cached")
def _gather_rows_cached_fake(table, cache, slot_of, index, *, check_bounds=True, blocks_per_sm=0, unroll=0):
    torch._check(table.dim() == 2, lambda: f"gather_rows_cached: table must be 2-D, got {table.dim()}-D")
    torch._check(index.dim() == 1, lambda: f"gather_rows_cached: index must be 1-D, got {index.dim()}-D")
    return cache.new_empty((index.shape[0], table.shape[1]))


@register_fake("zerocopy::gather_rows_cached.out")
def _gather_rows_cached_out_fake(table, cache, slot_of, index, *, check_bounds=True, blocks_per_sm=0, unroll=0, out):
    torch._check(table.dim() == 2, lambda: f"gather_rows_cached: table must be 2-D, got {table.dim()}-D")


class RowShape:
    """The size queries of anything that holds a ``[rows, width]`` table of one dtype (readers,
    feature sources), from its ``shape`` and ``dtype``."""

    shape: Any
    dtype: torch.dtype

    @property
    def num_rows(self) -> int:
        return int(self.shape[0])

    @property
    def width(self) -> int:
        return int(self.shape[1])

    @property
    def row_bytes(self) -> int:
        return self.width * self.element_size()

    @property
    def nbytes(self) -> int:
        return self.num_rows * self.row_bytes

    def element_size(self) -> int:
        return torch.empty(0, dtype=self.dtype).element_size()


class _TableLike(RowShape):
    """Tensor-like members shared by the readers: shape and size queries, ``reader[ids]`` and the
    torch functions that gather rows (``index_select`` on dim 0, ``embedding``,
    :func:`pytorch_zerocopy.gather_rows`), each routed to :meth:`read`."""

    device: torch.device

    def read(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None, *,
             check_bounds: bool = True) -> torch.Tensor:
        raise NotImplementedError

    def size(self, dim: Optional[int] = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, key) -> torch.Tensor:
        """``reader[ids]``: rows for an integer tensor, list or int, as indexing a tensor would
        (negative ids count from the end; the result has ``ids.shape + (width,)``)."""
        if isinstance(key, bool) or not isinstance(key, (int, list, torch.Tensor)):
            raise TypeError(f"{type(self).__name__} supports indexing by integer ids only, got {type(key).__name__}")
        idx = torch.as_tensor(key)
        if idx.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{type(self).__name__}: index must hold integers, got {idx.dtype}")
        n = self.num_rows
        idx = torch.where((idx < 0) & (idx >= -n), idx + n, idx)
        rows = self.read(idx.reshape(-1))
        return rows.view(*idx.shape, self.width)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        # torch's own index_select, also where a library (PyG) has wrapped torch.index_select.
        if func is torch.index_select or func is torch._C._VariableFunctions.index_select:
            named = dict(zip(("input", "dim", "index"), args), **kwargs)
            table, index = named.get("input"), named.get("index")
            if isinstance(table, _TableLike) and named.get("dim") in (0, -2) and index.dim() <= 1:
                return table.read(index.reshape(-1), named.get("out"))
        elif func is torch.nn.functional.embedding:
            index, weight = args[0], args[1] if len(args) > 1 else kwargs.get("weight")
            if isinstance(weight, _TableLike):
                return weight.read(index.reshape(-1)).view(*index.shape, weight.width)
        elif func is gather_rows:
            table, index = args[0], args[1]
            out = args[2] if len(args) > 2 else kwargs.get("out")
            if isinstance(table, _TableLike):
                return table.read(index, out, check_bounds=kwargs.get("check_bounds", True))
        return NotImplemented


def _read_device(placement: Placement, device: DeviceLike) -> torch.device:
    """Where reads of a table in ``placement`` run: the CPU for ``CPU`` (and for ``MAPPED``
    without a GPU-backed build), else ``device``'s GPU (default: the current one)."""
    if placement is Placement.CPU or (placement is Placement.MAPPED and not _unified.gpu_backed()):
        if device is not None and (isinstance(device, int) or torch.device(device).type == "cuda"):
            raise PlacementError(f"a {placement.value!r} table is read on the CPU here, but device {device} was "
                                 "asked for")
        return torch.device("cpu")
    if not _unified.gpu_backed():
        raise PlacementError(f"placement {placement.value!r} ({placement.describe}) needs a CUDA build of "
                             "pytorch_zerocopy and a GPU; this process has none")
    return gpu(device)


class FeatureTable(_TableLike):
    """A ``[rows, width]`` table in one placement, read with :meth:`read` (module docstring).

    ``data``: the rows: a CPU tensor (used in place by ``CPU``, mapped in place by ``MAPPED``,
    copied by ``MANAGED`` and ``GPU``), a unified tensor (``MAPPED``), or a CUDA tensor already
    in the placement given (``GPU``, or ``MANAGED`` for what :meth:`load` made). ``placement``
    (a :class:`~pytorch_zerocopy.placement.Placement` or its name; default: ``MAPPED`` for host
    data, ``GPU`` for CUDA data): where the rows are read from. ``device``: the GPU that reads
    them (default: the current one; ignored on the CPU). ``tuning``: the gather kernel's
    launch (:class:`~pytorch_zerocopy.ops.GatherTuning`), for a process that shares its GPU.
    ``watch``: the host tensor whose version :attr:`version` reports when ``data`` is a unified
    mapping of it (a mapping carries no version of its own: writes to the tensor it maps are
    seen only through this), so a cache over the table notices them.
    """

    def __init__(self, data: torch.Tensor, placement: Union[Placement, str, None] = None, *,
                 device: DeviceLike = None, tuning: GatherTuning = DEFAULT_TUNING,
                 watch: Optional[torch.Tensor] = None):
        if watch is not None and (not isinstance(watch, torch.Tensor) or watch.device.type != "cpu"):
            raise TypeError("FeatureTable: watch must be the CPU tensor that data maps")
        if not isinstance(data, torch.Tensor):
            raise TypeError(f"FeatureTable: data must be a tensor, got {type(data).__name__}")
        if data.dim() != 2:
            raise ValueError(f"FeatureTable: data must be 2-D [rows, width], got shape {tuple(data.shape)}")
        if not isinstance(tuning, GatherTuning):
            raise TypeError(f"FeatureTable: tuning must be a GatherTuning, got {type(tuning).__name__}")
        on_gpu = data.device.type == "cuda"
        if placement is None:
            placement = Placement.GPU if on_gpu else Placement.MAPPED
        self.placement = Placement.parse(placement, "FeatureTable placement")
        if self.placement is Placement.UVM:
            raise PlacementError("FeatureTable: placement 'uvm' migrates pages into GPU memory; a feature table is "
                                 "read in place ('unified', 'managed') or copied there ('cuda')")
        if on_gpu and self.placement not in (Placement.GPU, Placement.MANAGED):
            raise PlacementError(f"FeatureTable: a CUDA tensor is in GPU or managed memory, not "
                                 f"{self.placement.value!r}; pass a host tensor to read it from host memory")
        self.device = data.device if on_gpu else _read_device(self.placement, device)
        self.tuning = tuning
        self.load_seconds = 0.0  # how long load() took to make the table (0: built over given rows)
        self._given = data
        self._watched = data if watch is None else watch
        self._data = data if on_gpu else place(data, self.placement, self.device)
        # The given host tensor's version when a MANAGED or GPU table copied it (None: the
        # table reads the given bytes themselves).
        copied = not on_gpu and self.placement in (Placement.MANAGED, Placement.GPU)
        self._copied_version: Optional[int] = data._version if copied else None
        # What the gather op reads: a mapping as a CUDA tensor reaches the CUDA kernel without the
        # unified device's fallback; it keeps the mapping alive as long as this object.
        self.source = (_unified._C.device_alias(self._data, self.device)
                       if _unified.is_unified(self._data) and self.device.type == "cuda" else
                       self._data.cpu() if _unified.is_unified(self._data) else self._data)

    @classmethod
    def load(cls, source: Any, placement: Union[Placement, str], *, device: DeviceLike = None,
             tuning: GatherTuning = DEFAULT_TUNING) -> "FeatureTable":
        """A table over ``source``'s rows (a
        :class:`~pytorch_zerocopy.datasets.features.FeatureSource`) in ``placement``, filled
        straight from it: no other copy of the table is made (a host tensor source is used in
        place for ``CPU`` and ``MAPPED``)."""
        from .datasets.features import load_table

        placement = Placement.parse(placement, "FeatureTable placement")
        start = time.perf_counter()
        table = cls(load_table(source, placement, _read_device(placement, device)), placement, device=device,
                    tuning=tuning)
        table.load_seconds = time.perf_counter() - start
        return table

    @property
    def shape(self) -> torch.Size:
        return self._data.shape

    @property
    def dtype(self) -> torch.dtype:
        return self._data.dtype

    @property
    def version(self) -> int:
        """torch's version counter of the tensor the table was built from (for a copy, the host
        tensor it copied; for a mapping, the tensor given as ``watch``: see the module
        docstring's staleness contract)."""
        return self._watched._version

    def refresh(self) -> None:
        """Copies the host tensor a ``MANAGED`` or ``GPU`` table was made from again (after
        in-place writes to it); a table that reads its given bytes in place has nothing to do.
        Synchronous: the new rows are in place on return."""
        if self._copied_version is None:
            return
        self._data.copy_(self._given)
        torch.cuda.synchronize(self.device)
        self._copied_version = self._given._version

    def _check_copy_fresh(self) -> None:
        if self._copied_version is not None and self._given._version != self._copied_version:
            raise RuntimeError(f"FeatureTable: the host tensor this {self.placement.value!r} table copied was written "
                               "after the copy, so its rows may be stale; call refresh() to copy it again")

    @property
    def host(self) -> Optional[torch.Tensor]:
        """The rows as a CPU tensor over the same bytes (``CPU``, ``MAPPED``), else None."""
        return self._data.cpu() if self.placement in (Placement.CPU, Placement.MAPPED) else None

    def read(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None, *, check_bounds: bool = True,
             ids_sorted: bool = False) -> torch.Tensor:
        """``rows[ids]`` for a 1-D int32/int64 ``ids`` (CPU or :attr:`device`), in ids order, on
        :attr:`device`; ``out``, ``check_bounds`` (a host synchronisation on the GPU) and
        ``ids_sorted`` (the caller promises ascending ids) as in
        :func:`pytorch_zerocopy.gather_rows`."""
        self._check_copy_fresh()
        if self.device.type == "cuda" and ids.device.type == "cpu":
            ids = to_device_async(ids, self.device)
        return gather_rows(self.source, ids, out, index_sorted=ids_sorted, check_bounds=check_bounds,
                           tuning=self.tuning)

    def for_device(self, device: DeviceLike) -> "FeatureTable":
        """This table read by ``device``, another GPU of this process, over the same memory (no
        copy): host memory is one address every GPU of the process reads (``MAPPED`` tables
        are registered for every GPU, ``MANAGED`` ones advised for every GPU when made). The
        view keeps this table's memory alive. ``CPU`` tables, and a ``device`` that is already
        the table's, give the table itself; a ``GPU`` table is in one GPU's memory only."""
        if self.device.type == "cpu":
            return self
        dev = gpu(device)
        if dev == self.device:
            return self
        if self.placement is Placement.GPU:
            raise PlacementError(f"FeatureTable: a table in {self.device}'s memory cannot be read by {dev} in place; "
                                 "copy it there (placement 'cuda' on that device) or hold it in host memory")
        view = object.__new__(FeatureTable)  # not copy.copy: pickling refuses private tables
        view.__dict__.update(self.__dict__)
        view.device = dev
        if self.placement is Placement.MAPPED:
            view.source = _unified._C.device_alias(self._data, dev)
        else:  # managed memory: the same address, as a tensor of the other device
            storage = torch._C._construct_storage_from_data_pointer(self.source.data_ptr(), dev, self.source.nbytes)
            view.source = torch.empty(0, dtype=self.dtype, device=dev).set_(storage, 0, self.source.shape,
                                                                           self.source.stride())
        return view

    def with_cache(self, cached_rows: Optional[torch.Tensor]) -> "CachedTable":
        """A :class:`CachedTable` holding ``cached_rows`` of this table in GPU memory."""
        return CachedTable(self, cached_rows)

    def __repr__(self) -> str:
        return (f"FeatureTable(rows={self.num_rows}, width={self.width}, dtype={self.dtype}, "
                f"placement={self.placement.value}, device={self.device})")

    def __reduce__(self):
        host = self.host
        if host is None or not host.is_shared():
            raise RuntimeError(f"a FeatureTable sent to another process must hold its rows in shared memory (placement "
                               f"'cpu' or 'unified' over a shared tensor), not {self.placement.value!r}"
                               + ("" if host is None else " over private memory")
                               + "; create the table with pytorch_zerocopy.empty_shared / datasets' shared tables, call "
                                 ".share_memory_() on it first, or send the dataset's feature source and load it there")
        return (_rebuild_table, (host, self.placement.value, self.tuning))


def _rebuild_table(host: torch.Tensor, placement: str, tuning: GatherTuning) -> FeatureTable:
    """A FeatureTable in this process over the same host bytes, read by its current GPU."""
    return FeatureTable(host, placement, tuning=tuning)


class CachedTable(_TableLike):
    """A GPU cache of chosen rows in front of any :class:`FeatureReader` (module docstring).

    ``table``: the reader (a :class:`FeatureTable` reads hits and misses in one op; any other
    reader reads its misses through its own ``read``). ``cached_rows``: int64 ids of the rows to
    hold (unique, in range), or None for no cache. The cache lives on the reader's device (the
    CPU for a CPU table: the same calls, for CPU runs of GPU code paths). Raises
    ``torch.cuda.OutOfMemoryError`` before allocating anything when the cache and its slot map
    do not fit in the GPU's free memory.
    """

    def __init__(self, table: Any, cached_rows: Optional[torch.Tensor] = None):
        if not isinstance(table, FeatureReader) or isinstance(table, CachedTable):
            raise TypeError(f"CachedTable: table must be a feature reader (a FeatureTable), got {type(table).__name__}")
        self.table = table
        self.device = table.device
        self.cached_ids = self._check_ids(torch.zeros(0, dtype=torch.int64) if cached_rows is None
                                          else torch.as_tensor(cached_rows))
        self.cache: torch.Tensor
        self.slot_of: Optional[torch.Tensor] = None
        self._allocate()
        self._fill_cache()

    @classmethod
    def for_graph(cls, table: Any, graph: Any, config: "CacheConfig", *,
                  seeds: Optional[torch.Tensor] = None) -> "CachedTable":
        """``table`` (a reader) caching the rows :func:`cached_rows_for` picks (rows are node ids of
        ``graph``)."""
        ids = cached_rows_for(graph, config, table.shape[0], table.shape[1] * table.element_size(), seeds=seeds)
        return cls(table, ids)

    @property
    def shape(self) -> torch.Size:
        return self.table.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.table.dtype

    @property
    def placement(self) -> Optional[Placement]:
        return getattr(self.table, "placement", None)

    @property
    def cache_rows(self) -> int:
        return int(self.cached_ids.numel())

    @property
    def cache_bytes(self) -> int:
        return self.cache_rows * self.row_bytes

    def _check_ids(self, ids: torch.Tensor) -> torch.Tensor:
        if ids.dtype not in (torch.int32, torch.int64) or ids.dim() != 1:
            raise TypeError(f"CachedTable: cached_rows must be a 1-D int32/int64 tensor of row ids, got "
                            f"{ids.dtype} of shape {tuple(ids.shape)}")
        ids = ids.cpu().long()
        rows = self.num_rows
        if ids.numel():
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= rows:
                raise IndexError(f"CachedTable: cached row {lo if lo < 0 else hi} is out of range for a table with "
                                 f"{rows} rows")
        ids = torch.sort(ids).values
        if ids.numel() > 1 and bool((ids[1:] == ids[:-1]).any()):
            raise ValueError("CachedTable: cached_rows repeats a row id")
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
                fmt = _unified.format_bytes
                raise torch.cuda.OutOfMemoryError(
                    f"CachedTable: a cache of {count} rows x {self.row_bytes} B = {fmt(cache_bytes)} plus its slot map "
                    f"({fmt(map_bytes)}) needs {fmt(cache_bytes + map_bytes)} on {self.device}, which has "
                    f"{fmt(free)} free of {fmt(total)}; choose a smaller cache (rows, cache_bytes or fraction)")
        self.cache = torch.empty((count, self.width), dtype=self.dtype, device=self.device)
        if count:
            slot_of = torch.full((self.num_rows,), -1, dtype=torch.int32, device=self.device)
            slot_of[self.cached_ids.to(self.device)] = torch.arange(count, dtype=torch.int32, device=self.device)
            self.slot_of = slot_of

    def refresh(self) -> None:
        """Refreshes the table where it has a ``refresh`` (a copy of a host tensor copies it
        again), then re-reads the cached rows from it (after writes; see the module doc)."""
        refresh_table = getattr(self.table, "refresh", None)
        if refresh_table is not None:
            refresh_table()
        self._fill_cache()

    def _fill_cache(self) -> None:
        if self.cached_ids.numel():
            self.table.read(self.cached_ids.to(self.device), self.cache, check_bounds=False)
        self._version = getattr(self.table, "version", None)

    def _check_fresh(self) -> None:
        if getattr(self.table, "version", None) != self._version:
            raise RuntimeError("CachedTable: the table was written after its rows were cached, so cached rows may be "
                               "stale; call refresh() to re-read them")

    def read(self, ids: torch.Tensor, out: Optional[torch.Tensor] = None, *,
             check_bounds: bool = True) -> torch.Tensor:
        """``rows[ids]`` (1-D int32/int64 on the CPU or the cache's device) in ids order, on the
        cache's device; ``out`` and ``check_bounds`` as in :func:`pytorch_zerocopy.gather_rows`."""
        self._check_fresh()
        if self.slot_of is None:
            return self.table.read(ids, out, check_bounds=check_bounds)
        if self.device.type == "cuda" and ids.device.type == "cpu":
            ids = to_device_async(ids, self.device)
        if isinstance(self.table, FeatureTable):
            return gather_rows_cached(self.table.source, self.cache, self.slot_of, ids, out, check_bounds=check_bounds,
                                      tuning=self.table.tuning)
        return self._read_split(ids, out, check_bounds)

    def _read_split(self, ids: torch.Tensor, out: Optional[torch.Tensor], check_bounds: bool) -> torch.Tensor:
        """Hits from the cache, misses through the wrapped reader (a reader without the fused op)."""
        if check_bounds and ids.numel() and bool(((ids < 0) | (ids >= self.num_rows)).any()):
            bad = int(torch.nonzero((ids < 0) | (ids >= self.num_rows))[0])
            raise IndexError(f"CachedTable: index {int(ids[bad])} at position {bad} is out of bounds for a table with "
                             f"{self.num_rows} rows")
        ids = ids.long().clamp(0, max(0, self.num_rows - 1))
        slots = self.slot_of.index_select(0, ids)
        hit = slots >= 0
        result = out if out is not None else torch.empty((ids.numel(), self.width), dtype=self.dtype,
                                                         device=self.device)
        result[hit] = self.cache.index_select(0, slots[hit].long())
        miss = torch.nonzero(~hit).squeeze(1)
        result[miss] = self.table.read(ids.index_select(0, miss), check_bounds=False).to(self.device)
        return result

    def count_hits(self, ids: torch.Tensor) -> torch.Tensor:
        """How many entries of ``ids`` (valid row ids, CPU or the cache's device) the cache holds:
        a 0-d int64 tensor on the cache's device, computed without a host sync."""
        if self.slot_of is None or ids.numel() == 0:
            return torch.zeros((), dtype=torch.int64, device=self.device)
        slots = torch.index_select(self.slot_of, 0, ids.to(self.device, non_blocking=True))
        return (slots >= 0).sum()

    def hit_rate(self, ids: torch.Tensor) -> float:
        """The share of ``ids`` entries the cache holds (reads back one number: a host sync)."""
        if ids.numel() == 0:
            return 0.0
        return int(self.count_hits(ids)) / ids.numel()

    def __repr__(self) -> str:
        return (f"CachedTable({self.table!r}, cached={self.cache_rows} rows "
                f"({_unified.format_bytes(self.cache_bytes)}) on {self.device})")

    def __reduce__(self):
        return (CachedTable, (self.table, self.cached_ids.share_memory_()))


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


AUTO = "auto"
# A loader's private managed copy of a table may take at most this share of the host memory
# still available; a larger table is read where it is (mapped).
COPY_SHARE_OF_FREE_HOST = 0.5


def loader_cache(cache: Any, setting: str = "gpu_cache") -> Union[str, CacheConfig, None]:
    """A loader's cache argument, parsed once where the user gives it: ``"auto"`` (the default:
    on a GPU, the cache a plan keeps, :func:`default_reading`), None (no cache), a share of the
    rows such as ``"10%"`` or a number of rows (both chosen by pre-sampling), or a
    :class:`CacheConfig` (used as given). ``setting`` names the argument in the error."""
    if cache is None or isinstance(cache, CacheConfig):
        return cache
    if isinstance(cache, str):
        text = cache.strip().lower()
        if text == AUTO:
            return AUTO
        if text.endswith("%"):
            try:
                share = float(text[:-1])
            except ValueError:
                share = -1.0
            if 0 <= share <= 100:
                return CacheConfig(policy=CachePolicy.PRESAMPLE, fraction=share / 100)
    elif isinstance(cache, int) and not isinstance(cache, bool) and cache >= 0:
        return CacheConfig(policy=CachePolicy.PRESAMPLE, rows=cache)
    raise ValueError(f"{setting} must be 'auto', None (no cache), a share of the rows such as '10%', a number of "
                     f"rows >= 0 or a pytorch_zerocopy.CacheConfig, got {cache!r}")


def loader_placement(value: Any, pipeline: Any, what: str) -> Optional[Placement]:
    """A loader's ``feature_placement`` argument, parsed once where the user gives it: None
    (the loader's default, :func:`default_reading`) or where a GPU reads ``what`` from:
    ``'unified'``, ``'managed'`` or ``'cuda'``. Refused with the process way (``pipeline`` not
    False), whose plan says where the feature is read from."""
    if value is None:
        return None
    placement = Placement.parse(value, "feature_placement")
    if placement not in (Placement.MAPPED, Placement.MANAGED, Placement.GPU):
        raise PlacementError(f"feature_placement must be 'unified', 'managed' or 'cuda' (where a GPU reads {what} "
                             f"from), got {value!r}")
    if pipeline is not False:
        raise ValueError(f"with pipeline, the plan says where {what} is read from: pass "
                         "pipeline=make_plan(..., feature_placement=...) instead of feature_placement")
    return placement


SIDE_TABLE_SHARE = 1 / 8
"""A node table other than the features is a side table (labels, masks) when it holds at most
this share of the feature table's bytes."""
SIDE_TABLES_GPU_SHARE = 0.02
"""The share of the GPU's memory that a loader's side tables may take there, together."""


def default_side_readings(side_bytes: Mapping[str, int], features_bytes: int,
                          gpu_bytes: int) -> Dict[str, Placement]:
    """Where a loader on a GPU reads each node table other than its features (by name, its
    bytes in ``side_bytes``) when the user names none: ``GPU`` (a private copy in GPU memory)
    for tables of at most :data:`SIDE_TABLE_SHARE` of the features' ``features_bytes``, smallest
    first, while together they take at most :data:`SIDE_TABLES_GPU_SHARE` of ``gpu_bytes``;
    ``MAPPED`` for the others. A minibatch reads a few bytes of each such table per node: from
    host memory each row costs a PCIe round trip of its own, from GPU memory next to nothing."""
    budget = SIDE_TABLES_GPU_SHARE * gpu_bytes
    readings: Dict[str, Placement] = {}
    for name, nbytes in sorted(side_bytes.items(), key=lambda item: (item[1], item[0])):
        small = nbytes <= SIDE_TABLE_SHARE * features_bytes and nbytes <= budget
        readings[name] = Placement.GPU if small else Placement.MAPPED
        budget -= nbytes if small else 0
    return readings


def default_reading(table_bytes: int) -> Tuple[Placement, CacheConfig]:
    """Where a loader on a GPU reads a feature table of ``table_bytes`` from, and the cache it
    keeps in front of it, when the user names neither: what a ``zerocopy`` plan chooses
    (:func:`pytorch_zerocopy.pipeline.make_plan`): the host memory kind this machine's GPU
    reads fastest (:func:`pytorch_zerocopy.probe.host_read_rates`, measured once per machine;
    ``MAPPED`` where it cannot be measured, where several processes of this machine load,
    ``LOCAL_WORLD_SIZE > 1``, so that they share one copy, or where the private copy would take
    more than half the host memory still available) and
    :func:`pytorch_zerocopy.pipeline.plan.default_cache`."""
    import os

    from .pipeline.plan import default_cache
    from .probe import host_read_rates

    rates = host_read_rates()
    shared = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1) > 1
    placement = Placement.MAPPED if rates is None or shared else rates.fastest
    available = _unified.available_host_memory()
    if placement is Placement.MANAGED and available is not None and table_bytes > COPY_SHARE_OF_FREE_HOST * available:
        placement = Placement.MAPPED  # a private copy would crowd the host: read the table in place
    return placement, default_cache(table_bytes, None if rates is None else rates.gpu_memory_bytes)
