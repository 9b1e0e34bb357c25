"""PyG's ``FeatureStore`` over host-resident tables read in place by the GPU (zero-copy).

A table is one tensor per ``(group_name, attr_name)``: node features ``x``, labels ``y``, masks.
Where a GPU serves unified tensors, a CPU tensor put here is mapped for it in place (no copy;
its memory becomes page-locked for as long as the store holds it) and rows are gathered by the
GPU straight from host memory; unified and CUDA tensors are kept as they are. Without such a
GPU, tables stay ordinary CPU tensors and are gathered on the CPU.

Reading rows: :meth:`FeatureStore.get_tensor` with an ``index`` returns those rows, on the GPU
for unified and CUDA tables (the CPU without a GPU), in index order. Every row read goes through
:meth:`FeatureStore._gather_rows`, the one place a table is read, so a table type with its own
gather (a GPU cache of hot rows) plugs in there.

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
from ..ops import gather_rows

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
        self.map_host_tables = _unified.gpu_backed() if map_host_tables is None else bool(map_host_tables)

    # --- PyG's interface ---------------------------------------------------------------

    def _put_tensor(self, tensor, attr: TensorAttr) -> bool:
        tensor = _as_tensor(tensor, "tensor")
        key = (attr.group_name, attr.attr_name)
        if attr.index is None:
            self._tables[key] = self._place(tensor)
            return True
        table = self._tables.get(key)
        if table is None:
            raise KeyError(f"put_tensor: no table {key} to write rows {attr.index!r} into; "
                           "put the whole table first (index=None)")
        index = _index_tensor(attr.index) if not isinstance(attr.index, slice) else attr.index
        host = table.cpu() if table.device.type != "cuda" else table
        host[index if isinstance(index, slice) else index.to(host.device).long()] = tensor.to(host.device, host.dtype)
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
        return self._gather_rows(table, _index_tensor(attr.index))

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        return self._tables.pop((attr.group_name, attr.attr_name), None) is not None

    def _get_tensor_size(self, attr: TensorAttr) -> Optional[Tuple[int, ...]]:
        table = self._tables.get((attr.group_name, attr.attr_name))
        return None if table is None else tuple(table.shape)

    def get_all_tensor_attrs(self) -> List[TensorAttr]:
        return [TensorAttr(group, name) for group, name in self._tables]

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

    def _gather_rows(self, table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        """Rows ``index`` of ``table`` in index order: the one place this store reads rows.

        Unified tables are read by the GPU from host memory (the index may be on the CPU or
        the GPU) or, without a GPU, on the CPU; CPU and CUDA tables on their own device, the
        index moved there. Out-of-range ids raise ``IndexError``.
        """
        if table.device.type == "cpu":
            index = index.cpu()
        elif table.device.type == "cuda":
            index = index.to(table.device)
        rows = table.reshape(table.shape[0], -1)
        out = gather_rows(rows, index)
        return out.view((index.numel(),) + tuple(table.shape[1:]))

    def __repr__(self) -> str:
        tables = ", ".join(f"{name}{'' if group is None else f'@{group}'}: {tuple(t.shape)} {t.device}"
                           for (group, name), t in self._tables.items())
        return f"FeatureStore({tables})"
