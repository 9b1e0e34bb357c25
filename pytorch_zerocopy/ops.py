"""Typed wrappers over the ``torch.ops.zerocopy`` operators, with their fake kernels beside them.

The fake (meta) kernels let ``torch.compile(fullgraph=True)`` trace the ops: they compute the
output's shape, dtype and device without touching data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from . import unified as _unified  # loads the compiled ops
from ._compat import register_fake
from .placement import op_device

__all__ = ["GatherTuning", "block_mean", "gather_rows"]

_INDEX_DTYPES = (torch.int32, torch.int64)


@dataclass(frozen=True)
class GatherTuning:
    """How the CUDA gather kernel is launched (the CPU kernel ignores it): ``unroll`` loads in
    flight per lane (4, 8 or 16; 0: the default, 8); ``blocks_per_sm`` > 0 runs a persistent grid
    of that many blocks per SM this process may use (an MPS client sees only its share of the
    SMs), leaving the rest of each SM to other work (0: a grid sized by the rows). Checked by the
    op, on every device."""

    blocks_per_sm: int = 0
    unroll: int = 0


DEFAULT_TUNING = GatherTuning()


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
    want_device = op_device(index, table)
    if out.device != want_device and out.device.type != _unified.DEVICE_TYPE:
        raise ValueError(f"gather_rows: out must be on {want_device}, got a tensor on {out.device}")


def gather_rows(
    table: torch.Tensor,
    index: torch.Tensor,
    out: Optional[torch.Tensor] = None,
    *,
    index_sorted: bool = False,
    check_bounds: bool = True,
    tuning: GatherTuning = DEFAULT_TUNING,
) -> torch.Tensor:
    """``table[index]`` for a 2-D table: row ``index[i]`` of ``table`` into row ``i`` of the result.

    Args:
        table: ``[rows, width]`` tensor of any dtype: unified (host memory read in place by the
            GPU), CUDA, or CPU; or a :class:`pytorch_zerocopy.FeatureTable` (a host table with a
            GPU cache of hot rows), which gathers through its cache. Rows may have any pitch; elements within a row must be
            contiguous, or the table is copied to make them so.
        index: int32 or int64, 1-D, any length (0 included), duplicates allowed; on the CPU or
            on the table's GPU. Rows count from 0 and ``index`` must lie in ``[0, rows)``: a
            negative index is out of range, as for ``torch.index_select`` (``u[idx]`` on a
            unified tensor keeps torch's indexing instead: ``-1`` is the last row).
        out: optional preallocated result, ``[len(index), width]``, the table's dtype,
            contiguous, on the device where the gather runs (see Returns). Written and returned.
        index_sorted: the caller promises ``index`` is ascending; the GPU kernel then skips the
            sort that makes it read host memory in address order. The result is the same either
            way; only speed depends on it.
        check_bounds: raise ``IndexError`` naming the first index (in ``index`` order) outside
            ``[0, rows)``. On the GPU this costs one small device-to-host read, a host
            synchronisation; without it the call is fully asynchronous. Out-of-range indices are
            never read in either case: without the check their rows come back as zeros.
        tuning: the CUDA kernel's launch (:class:`GatherTuning`); results never depend on it.

    Returns:
        ``[len(index), width]`` tensor in ``index`` order, on the index's GPU if it is a CUDA
        tensor, else the unified table's GPU (the CPU when no GPU serves unified tensors), else
        the table's device.
    """
    if not isinstance(table, torch.Tensor) and torch.overrides.has_torch_function((table,)):
        # A tensor-like table (pytorch_zerocopy.FeatureTable) gathers its own rows.
        return torch.overrides.handle_torch_function(gather_rows, (table,), table, index, out,
                                                     index_sorted=index_sorted, check_bounds=check_bounds,
                                                     tuning=tuning)
    _check_gather_args(table, index, out)
    launch = dict(blocks_per_sm=tuning.blocks_per_sm, unroll=tuning.unroll)
    if out is None:
        return torch.ops.zerocopy.gather_rows.default(
            table, index, index_sorted=index_sorted, check_bounds=check_bounds, **launch
        )
    torch.ops.zerocopy.gather_rows.out(table, index, index_sorted=index_sorted, check_bounds=check_bounds, out=out,
                                       **launch)
    return out


@register_fake("zerocopy::gather_rows")
def _gather_rows_fake(table, index, *, index_sorted=False, check_bounds=True, blocks_per_sm=0, unroll=0):
    torch._check(table.dim() == 2, lambda: f"gather_rows: table must be 2-D, got {table.dim()}-D")
    torch._check(index.dim() == 1, lambda: f"gather_rows: index must be 1-D, got {index.dim()}-D")
    return table.new_empty((index.shape[0], table.shape[1]), device=op_device(index, table))


@register_fake("zerocopy::gather_rows.out")
def _gather_rows_out_fake(table, index, *, index_sorted=False, check_bounds=True, blocks_per_sm=0, unroll=0, out):
    torch._check(table.dim() == 2, lambda: f"gather_rows: table must be 2-D, got {table.dim()}-D")
    torch._check(index.dim() == 1, lambda: f"gather_rows: index must be 1-D, got {index.dim()}-D")


def block_mean(h_src: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, num_dst: int, *,
               check_ids: bool = False) -> torch.Tensor:
    """GraphSAGE's mean aggregation over a block: row ``d`` of the result is the mean of
    ``h_src[src[e]]`` over the edges ``e`` with ``dst[e] == d`` (zeros where ``d`` has none).

    One fused op per pass (``torch.ops.zerocopy.block_mean``), differentiable in ``h_src``. On
    the GPU it never synchronises with the host, which keeps a training step's host time short.

    Args:
        h_src: ``[n_src, features]`` floating tensor (float32/64, float16, bfloat16; 16-bit
            inputs are summed in float32).
        src, dst: int32 or int64 edge lists of one length, local ids, any order, duplicates
            allowed, on ``h_src``'s device.
        num_dst: rows of the result.
        check_ids: check that every id lies in range (``src < n_src``, ``dst < num_dst``) and
            raise ``IndexError`` otherwise. The CPU always checks; on the GPU this costs one
            host synchronisation, and without it an edge with an id out of range is skipped
            (never read or written).
    """
    if not isinstance(h_src, torch.Tensor) or not isinstance(src, torch.Tensor) or not isinstance(dst, torch.Tensor):
        raise TypeError("block_mean: h_src, src and dst must be tensors")
    if check_ids and src.device.type != "cpu" and src.numel():
        bad_src = int(((src < 0) | (src >= h_src.shape[0])).sum())
        bad_dst = int(((dst < 0) | (dst >= num_dst)).sum())
        if bad_src or bad_dst:
            raise IndexError(f"block_mean: {bad_src} source ids outside [0, {h_src.shape[0]}) and {bad_dst} "
                             f"destination ids outside [0, {num_dst})")
    return torch.ops.zerocopy.block_mean.default(h_src, src, dst, int(num_dst))[0]


@register_fake("zerocopy::block_mean")
def _block_mean_fake(h_src, src, dst, n_dst):
    torch._check(h_src.dim() == 2, lambda: f"block_mean: h_src must be 2-D, got {h_src.dim()}-D")
    torch._check(src.dim() == 1 and dst.dim() == 1, lambda: "block_mean: src and dst must be 1-D")
    return h_src.new_empty((n_dst, h_src.shape[1])), h_src.new_empty((n_dst,), dtype=torch.float32)


@register_fake("zerocopy::block_mean_backward")
def _block_mean_backward_fake(grad_out, src, dst, inv_deg, n_src):
    torch._check(grad_out.dim() == 2, lambda: f"block_mean_backward: grad_out must be 2-D, got {grad_out.dim()}-D")
    return grad_out.new_empty((n_src, grad_out.shape[1]))
