"""PyG's ``FeatureStore`` over host-resident tables read in place by the GPU (zero-copy).

A table is one tensor per ``(group_name, attr_name)``: node features ``x``, labels ``y``, masks.
Where a GPU serves unified tensors, a CPU tensor put here is mapped for it in place (no copy;
its memory becomes page-locked for as long as the store holds it) and rows are gathered by the
GPU straight from host memory; unified and CUDA tensors are kept as they are. Without such a
GPU, tables stay ordinary CPU tensors and are gathered on the CPU.

Reading rows: :meth:`FeatureStore.get_tensor` with an ``index`` returns those rows, on the GPU
for unified and CUDA tables (the CPU without a GPU), in index order. Every row read goes through
the table's reader (a :class:`~pytorch_zerocopy.FeatureTable`, the package's one way to read
rows), in :meth:`FeatureStore._gather_rows`.

GPU cache: :meth:`FeatureStore.cache_rows` keeps chosen rows of a host table in GPU memory (a
:class:`~pytorch_zerocopy.CachedTable` around its reader); reads of that table then take those
rows from there and the rest from host memory in the same call. ``NeighborLoader(..., gpu_cache=CacheConfig(...))``
chooses the rows (highest degree, or most often pre-sampled) and caches them. Rows written with
``put_tensor(..., index=...)`` are re-read into the cache; a table put again whole keeps the
same cached ids.

Where rows are read from: by default a GPU reads a host table where it lies, mapped in place.
:meth:`FeatureStore.read_from` names another placement for one table (``"managed"``: a copy in
managed memory kept on the host, which some GPUs read several times faster; ``"cuda"``: a copy in
GPU memory); ``NeighborLoader`` does it for ``x`` on a GPU, with the placement a plan chooses,
unless the table was given one here. Such a copy is private to this process and is made again
when rows are written with ``put_tensor``.

Aliasing: :meth:`get_tensor` without an index returns the stored table itself (not a copy);
writing into it changes the store.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from torch_geometric.data import FeatureStore as _PygFeatureStore
from torch_geometric.data import TensorAttr

from .. import unified as _unified
from ..feature_table import CachedTable, FeatureReader, FeatureTable
from ..placement import Placement, PlacementError

Key = Tuple[Optional[str], str]


def _as_tensor(value, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    raise TypeError(f"{what} must be a torch.Tensor or a NumPy array, got {type(value).__name__}")


def _index_tensor(index) -> torch.Tensor:
    if isinstance(index, torch.Tensor):
        t = index
    elif isinstance(index, np.ndarray):
        t = torch.from_numpy(index)
    elif isinstance(index, (list, tuple, range)):
        t = torch.as_tensor(list(index), dtype=torch.int64)
    elif isinstance(index, int):
        t = torch.tensor([index], dtype=torch.int64)
    else:
        raise TypeError(f"index must be a tensor, a NumPy array, a list or an int, got {type(index).__name__}")
    if t.dtype == torch.bool:
        t = t.nonzero().flatten()
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"index must hold int32 or int64 node ids (or be a bool mask), got {t.dtype}")
    return t.reshape(-1)


class FeatureStore(_PygFeatureStore):
    """Node tables for PyG loaders (see the module docstring).

    ``map_host_tables``: map CPU tensors put here for the GPU (default: where a GPU serves
    unified tensors). ``False`` keeps them as CPU tensors, gathered on the CPU.
    """

    def __init__(self, map_host_tables: Optional[bool] = None):
        super().__init__()
        self._tables: Dict[Key, torch.Tensor] = {}
        self._readers: Dict[Key, FeatureTable] = {}
        self._caches: Dict[Key, CachedTable] = {}
        self._placements: Dict[Key, Placement] = {}  # tables read from a placement named by read_from
        # The CPU tensor each table was put as, where the table maps its bytes: copies
        # (``MANAGED``, ``GPU``) are made from it, so that torch sees in-place writes to it and
        # the copy refuses reads until refresh() (FeatureTable's staleness contract).
        self._put: Dict[Key, torch.Tensor] = {}
        self.map_host_tables = _unified.gpu_backed() if map_host_tables is None else bool(map_host_tables)

    # --- PyG's interface ---------------------------------------------------------------

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        tensor = _as_tensor(tensor, "tensor")
        key = (attr.group_name, attr.attr_name)
        if attr.index is None:
            self._tables[key] = self._place(tensor)
            self._put.pop(key, None)
            if tensor.device.type == "cpu" and not _unified.is_unified(tensor) and tensor.is_contiguous():
                self._put[key] = tensor
            self._readers[key] = self._reader(key, self._placements.get(key))
            cache = self._caches.pop(key, None)
            if cache is not None and self._tables[key].shape[0] == cache.num_rows:
                self._caches[key] = self._cached(key, cache.cached_ids)
            return True
        table = self._tables.get(key)
        if table is None:
            raise KeyError(f"put_tensor: no table {key} to write rows {attr.index!r} into; "
                           "put the whole table first (index=None)")
        index = _index_tensor(attr.index) if not isinstance(attr.index, slice) else attr.index
        host = table.cpu() if table.device.type != "cuda" else table
        host[index if isinstance(index, slice) else index.to(host.device).long()] = tensor.to(host.device, host.dtype)
        if self._placements.get(key) in (Placement.MANAGED, Placement.GPU):  # a copy: made again
            self._readers[key] = self._reader(key, self._placements[key])
            if key in self._caches:
                self._caches[key] = self._cached(key, self._caches[key].cached_ids)
        if key in self._caches:
            self._caches[key].refresh()
        return True

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        table = self._tables.get((attr.group_name, attr.attr_name))
        if table is None:
            raise KeyError(f"no table {attr.attr_name!r} (group {attr.group_name!r}) in this FeatureStore; "
                           f"it holds {[name for _, name in self._tables]}")
        if attr.index is None:
            return table
        if isinstance(attr.index, slice):
            return table[attr.index]
        key = (attr.group_name, attr.attr_name)
        reader = self._caches.get(key)
        return self._gather_rows(table, _index_tensor(attr.index), self._readers[key] if reader is None else reader)

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        self._caches.pop((attr.group_name, attr.attr_name), None)
        self._placements.pop((attr.group_name, attr.attr_name), None)
        self._put.pop((attr.group_name, attr.attr_name), None)
        self._readers.pop((attr.group_name, attr.attr_name), None)
        return self._tables.pop((attr.group_name, attr.attr_name), None) is not None

    def _get_tensor_size(self, attr: TensorAttr) -> Optional[Tuple[int, ...]]:
        table = self._tables.get((attr.group_name, attr.attr_name))
        return None if table is None else tuple(table.shape)

    def get_all_tensor_attrs(self) -> List[TensorAttr]:
        return [TensorAttr(group, name) for group, name in self._tables]

    def table_keys(self) -> Tuple[Key, ...]:
        """Every table's ``(group_name, attr_name)``, in the order they were put (what
        :meth:`get_all_tensor_attrs` lists, without making its attributes)."""
        return tuple(self._tables)

    # --- tables ------------------------------------------------------------------------

    def _place(self, tensor: torch.Tensor) -> torch.Tensor:
        """Where a table put here lives: unified and CUDA tensors as given; CPU tensors mapped
        in place for the GPU when ``map_host_tables``, else as given (contiguous)."""
        if tensor.dim() == 0:
            raise ValueError("put_tensor: a table needs one row per node, got a 0-d tensor")
        if _unified.is_unified(tensor) or tensor.device.type == "cuda":
            return tensor
        tensor = tensor.contiguous()
        return _unified.to_unified(tensor) if self.map_host_tables else tensor

    def _reader(self, key: Key, placement: Optional[Placement] = None) -> FeatureTable:
        """The reader of table ``key`` (rows: its first dimension): over the same bytes, or
        over a copy in ``placement`` (``MANAGED``, ``GPU``) when given, made from the tensor put."""
        table = self._tables[key]
        rows = table.reshape(table.shape[0], -1)
        if table.device.type == "cuda":
            return FeatureTable(rows, Placement.GPU)
        put = self._put.get(key)
        put_rows = None if put is None else put.reshape(put.shape[0], -1)
        mapped = _unified.is_unified(table)
        if placement in (Placement.MANAGED, Placement.GPU):
            source = put_rows if put_rows is not None else rows.cpu() if mapped else rows
            return FeatureTable(source, placement)
        return FeatureTable(rows, Placement.MAPPED if mapped else Placement.CPU, watch=put_rows if mapped else None)

    def refresh(self, attr_name: str, group_name: Optional[str] = None) -> None:
        """Copies table ``attr_name`` into its placement again and refills its cache, after
        in-place writes to the tensor put (which make a copy's reads raise until then); a table
        read in place only refills its cache."""
        key = (group_name, attr_name)
        if key not in self._tables:
            raise KeyError(f"refresh: no table {attr_name!r} (group {group_name!r}) in this FeatureStore")
        cache = self._caches.get(key)
        if cache is not None:
            cache.refresh()  # refreshes the reader under it first
        else:
            self._readers[key].refresh()

    def read_from(self, attr_name: str, placement, group_name: Optional[str] = None) -> None:
        """Reads table ``attr_name`` from ``placement`` from now on: ``"managed"`` (a copy in
        managed memory kept on the host) or ``"cuda"`` (a copy in GPU memory), both private to
        this process, or ``"unified"`` (the table mapped in place, the default on a GPU). A
        cache of the table is kept (refilled from the new reader). Needs a GPU that reads the
        table: a table kept on the CPU (``map_host_tables=False``) raises ``PlacementError``."""
        key = (group_name, attr_name)
        if key not in self._tables:
            raise KeyError(f"read_from: no table {attr_name!r} (group {group_name!r}) in this FeatureStore")
        parsed = Placement.parse(placement, "read_from placement")
        allowed = (Placement.MAPPED, Placement.MANAGED, Placement.GPU)
        if parsed not in allowed:
            raise PlacementError(f"read_from placement must be 'unified', 'managed' or 'cuda', got {placement!r}")
        table = self._tables[key]
        if table.device.type == "cuda":
            raise PlacementError(f"read_from: table {attr_name!r} is already in GPU memory, where it is read")
        if not _unified.is_unified(table) or not _unified.gpu_backed():
            raise PlacementError(f"read_from: table {attr_name!r} is read on the CPU here (no GPU reads it); "
                                 "placements are for tables a GPU reads")
        self._readers[key] = self._reader(key, parsed)
        self._placements[key] = parsed
        cache = self._caches.get(key)
        if cache is not None:
            self._caches[key] = self._cached(key, cache.cached_ids)

    def host_of(self, attr_name: str, group_name: Optional[str] = None) -> Optional[torch.Tensor]:
        """The CPU tensor table ``attr_name`` holds its rows in: the tensor put, where the table
        maps it (its version counts in-place writes to it), else the table's own host view;
        None for a table in GPU memory."""
        key = (group_name, attr_name)
        if key not in self._tables:
            raise KeyError(f"host_of: no table {attr_name!r} (group {group_name!r}) in this FeatureStore")
        table = self._tables[key]
        if table.device.type == "cuda":
            return None
        put = self._put.get(key)
        return put if put is not None else table.cpu() if _unified.is_unified(table) else table

    def placement_of(self, attr_name: str, group_name: Optional[str] = None) -> Optional[Placement]:
        """The placement :meth:`read_from` named for table ``attr_name`` (None: none named)."""
        return self._placements.get((group_name, attr_name))

    def read_rows(self, attr_name: str, index: torch.Tensor, group_name: Optional[str] = None) -> torch.Tensor:
        """Rows ``index`` of table ``attr_name`` through its reader (and cache), without the
        bounds check that costs a GPU a host synchronisation: ``index`` must hold valid node
        ids, as a sampler's nodes do (the loader's read of every minibatch)."""
        key = (group_name, attr_name)
        table = self._tables[key]
        reader = self._caches.get(key) or self._readers[key]
        return self._gather_rows(table, index.reshape(-1), reader, check_bounds=False)

    # --- GPU cache -----------------------------------------------------------------------

    def cache_rows(self, attr_name: str, rows: Optional[torch.Tensor], group_name: Optional[str] = None) -> None:
        """Keeps rows ``rows`` (int64 ids) of table ``attr_name`` in GPU memory: later reads of
        the table take them from there and the others from host memory, in one call (same
        results). ``rows=None`` drops the cache. The table must be in host memory (unified,
        or CPU: then the cache is in host memory too, where reads of the table run).
        :func:`pytorch_zerocopy.feature_table.cached_rows_for` chooses rows from a graph."""
        key = (group_name, attr_name)
        if key not in self._tables:
            raise KeyError(f"cache_rows: no table {attr_name!r} (group {group_name!r}) in this FeatureStore")
        if rows is None:
            self._caches.pop(key, None)
            return
        self._caches[key] = self._cached(key, rows)

    def cache_of(self, attr_name: str, group_name: Optional[str] = None) -> Optional[CachedTable]:
        """The :class:`~pytorch_zerocopy.CachedTable` reads of table ``attr_name`` go through
        (its ``cached_ids``, ``hit_rate``), or None."""
        return self._caches.get((group_name, attr_name))

    def _cached(self, key: Key, rows: torch.Tensor) -> CachedTable:
        table = self._tables[key]
        if table.device.type == "cuda":
            raise ValueError("cache_rows: the table is already in GPU memory; there is nothing to cache")
        if not table.is_contiguous():
            raise ValueError("cache_rows: the table must be contiguous to be cached in place")
        # A unified table's cache lives on its GPU (the CPU without one); a CPU table is read on
        # the CPU, and so is its cache.
        return CachedTable(self._readers[key], rows)

    def _gather_rows(self, table: torch.Tensor, index: torch.Tensor, reader: FeatureReader,
                     check_bounds: bool = True) -> torch.Tensor:
        """Rows ``index`` of ``table`` in index order, through its ``reader``: the one place this
        store reads rows. Unified tables are read by the GPU from host memory (the index may be
        on the CPU or the GPU) or, without a GPU, on the CPU; CPU and CUDA tables on their own
        device, the index moved there. Out-of-range ids raise ``IndexError`` (``check_bounds``)."""
        if reader.device.type == "cpu":
            index = index.cpu()
        out = reader.read(index, check_bounds=check_bounds)
        return out.view((index.numel(),) + tuple(table.shape[1:]))

    def __repr__(self) -> str:
        tables = ", ".join(f"{name}{'' if group is None else f'@{group}'}: {tuple(t.shape)} {t.device}"
                           for (group, name), t in self._tables.items())
        return f"FeatureStore({tables})"
