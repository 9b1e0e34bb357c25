// Shared contract of zerocopy::gather_rows for its CPU and CUDA kernels: argument checks, the
// table's row layout, and the IndexError raised for the first out-of-range index.
#pragma once

#include "checks.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>

namespace zerocopy {

// Checks table and index and returns the table in a layout the kernels read: rows may be
// strided (stride(0) is any pitch) but elements within a row must be contiguous; anything
// else is made contiguous (a copy of the table, documented in the Python wrapper).
inline at::Tensor gather_rows_table(const at::Tensor& table, const at::Tensor& index) {
  check_dim(table, 2, "gather_rows: table");
  check_index_dtype(index, "gather_rows: index");
  check_dim(index, 1, "gather_rows: index");
  if (table.size(1) > 1 && table.stride(1) != 1) return table.contiguous();
  return table;
}

// Bytes between the starts of consecutive rows of a table accepted by gather_rows_table.
inline int64_t gather_rows_pitch_bytes(const at::Tensor& table) {
  return table.stride(0) * static_cast<int64_t>(table.itemsize());
}

// Checks a caller-provided output: the table's dtype, shape [index.numel(), width], contiguous.
inline void check_gather_rows_out(const at::Tensor& out, const at::Tensor& table, int64_t rows_out) {
  TORCH_CHECK_TYPE(out.scalar_type() == table.scalar_type(), "gather_rows: out must have the table's dtype ",
                   table.scalar_type(), ", got ", out.scalar_type());
  TORCH_CHECK_VALUE(out.dim() == 2 && out.size(0) == rows_out && out.size(1) == table.size(1),
                    "gather_rows: out must have shape [", rows_out, ", ", table.size(1), "], got ", out.sizes());
  TORCH_CHECK_VALUE(out.is_contiguous(), "gather_rows: out must be contiguous, got strides ", out.strides());
}

// Raises the IndexError for the index at `position` (the first bad one in caller order).
[[noreturn]] inline void throw_gather_rows_bad_index(int64_t value, int64_t position, int64_t rows) {
  TORCH_CHECK_INDEX(false, "gather_rows: index ", value, " at position ", position,
                    " is out of bounds for a table with ", rows, " rows (valid: 0 to ", rows - 1, ")");
  TORCH_INTERNAL_ASSERT(false);
}

}  // namespace zerocopy
