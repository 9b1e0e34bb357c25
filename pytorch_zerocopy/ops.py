"""Typed wrappers over the ``torch.ops.zerocopy`` operators, with their fake kernels beside them.

The fake (meta) kernels let ``torch.compile(fullgraph=True)`` trace the ops: they compute the
output's shape, dtype and device without touching data.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import unified as _unified  # loads the compiled ops
from ._compat import register_fake

__all__ = ["gather_rows"]

_INDEX_DTYPES = (torch.int32, torch.int64)


def _gather_device(table: torch.Tensor, index: torch.Tensor) -> torch.device:
    """Where gather_rows runs and its output lives (the unified fallback's rule)."""
    if index.device.type == "cuda":
        return index.device
    if table.device.type == _unified.DEVICE_TYPE:
        if _unified.gpu_backed():
            return torch.device("cuda", table.device.index if table.device.index is not None else 0)
        return torch.device("cpu")
    return table.device


def _check_gather_args(table: torch.Tensor, index: torch.Tensor, out: Optional[torch.Tensor]) -> None:
    if not isinstance(table, torch.Tensor):
        raise TypeError(f"gather_rows: table must be a tensor, got {type(table).__name__}")
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"gather_rows: index must be a tensor, got {type(index).__name__}")
    if table.dim() != 2:
        raise ValueError(f"gather_rows: table must be a 2-D tensor [rows, row elements], got shape {tuple(table.shape)}")
    if index.dtype not in _INDEX_DTYPES:
        raise TypeError(f"gather_rows: index must be int32 or int64, got {index.dtype}")
    if index.dim() != 1:
        raise ValueError(f"gather_rows: index must be a 1-D tensor, got shape {tuple(index.shape)}")
    if table.device.type == "cpu" and index.device.type != "cpu":
        raise ValueError(
            f"gather_rows: index must be on the CPU for a CPU table, got an index on {index.device} "
            "(move the table to the GPU or make it unified)"
        )
    if table.device.type == "cuda" and index.device.type == "cuda" and index.device != table.device:
        raise ValueError(
            f"gather_rows: index must be on {table.device} (the table's device) or the CPU, got {index.device}"
        )
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"gather_rows: out must be a tensor, got {type(out).__name__}")
    want_shape = (index.shape[0], table.shape[1])
    if tuple(out.shape) != want_shape:
        raise ValueError(f"gather_rows: out must have shape {want_shape}, got {tuple(out.shape)}")
    if out.dtype != table.dtype:
        raise TypeError(f"gather_rows: out must have the table's dtype {table.dtype}, got {out.dtype}")
    if not out.is_contiguous():
        raise ValueError(f"gather_rows: out must be contiguous, got strides {out.stride()}")
    want_device = _gather_device(table, index)
    if out.device != want_device and out.device.type != _unified.DEVICE_TYPE:
        raise ValueError(f"gather_rows: out must be on {want_device}, got a tensor on {out.device}")


def gather_rows(
    table: torch.Tensor,
    index: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    *,
    index_sorted: bool = False,
    check_bounds: bool = True,
) -> torch.Tensor:
    """``table[index]`` for a 2-D table: row ``index[i]`` of ``table`` into row ``i`` of the result.

    Args:
        table: ``[rows, width]`` tensor of any dtype: unified (host memory read in place by the
            GPU), CUDA, or CPU. Rows may have any pitch; elements within a row must be
            contiguous, or the table is copied to make them so.
        index: int32 or int64, 1-D, any length (0 included), duplicates allowed; on the CPU or
            on the table's GPU.
        out: optional preallocated result, ``[len(index), width]``, the table's dtype,
            contiguous, on the device where the gather runs (see Returns). Written and returned.
        index_sorted: the caller promises ``index`` is ascending; the GPU kernel then skips the
            sort that makes it read host memory in address order. The result is the same either
            way; only speed depends on it.
        check_bounds: raise ``IndexError`` naming the first index (in ``index`` order) outside
            ``[0, rows)``. On the GPU this costs one small device-to-host read, a host
            synchronisation; without it the call is fully asynchronous. Out-of-range indices are
            never read in either case: without the check their rows come back as zeros.

    Returns:
        ``[len(index), width]`` tensor in ``index`` order, on the index's GPU if it is a CUDA
        tensor, else the unified table's GPU (the CPU when no GPU serves unified tensors), else
        the table's device.
    """
    _check_gather_args(table, index, out)
    if out is None:
        return torch.ops.zerocopy.gather_rows.default(
            table, index, index_sorted=index_sorted, check_bounds=check_bounds
        )
    torch.ops.zerocopy.gather_rows.out(table, index, index_sorted=index_sorted, check_bounds=check_bounds, out=out)
    return out


@register_fake("zerocopy::gather_rows")
def _gather_rows_fake(table, index, *, index_sorted=False, check_bounds=True):
    torch._check(table.dim() == 2, lambda: f"gather_rows: table must be 2-D, got {table.dim()}-D")
    torch._check(index.dim() == 1, lambda: f"gather_rows: index must be 1-D, got {index.dim()}-D")
    return table.new_empty((index.shape[0], table.shape[1]), device=_gather_device(table, index))


@register_fake("zerocopy::gather_rows.out")
def _gather_rows_out_fake(table, index, *, index_sorted=False, check_bounds=True, out):
    torch._check(table.dim() == 2, lambda: f"gather_rows: table must be 2-D, got {table.dim()}-D")
    torch._check(index.dim() == 1, lambda: f"gather_rows: index must be 1-D, got {index.dim()}-D")
