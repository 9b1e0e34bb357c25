// Shared contract of zerocopy::gather_rows for its CPU and CUDA kernels: argument checks, the
// table's row layout, and the IndexError raised for the first out-of-range index.
#pragma once

#include "checks.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <utility>

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

// The byte range [first, last) that a strided tensor's elements can occupy; empty (0, 0) for a
// tensor without elements. Spans are compared as addresses: unified tensors reach the kernels as
// CPU or CUDA aliases over the same (unified-addressed) bytes, so aliasing is seen whichever
// tensor object or storage each argument came through.
inline std::pair<uintptr_t, uintptr_t> gather_rows_byte_span(const at::Tensor& t) {
  if (t.numel() == 0) return {0, 0};
  int64_t lo = 0;
  int64_t hi = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t extent = (t.size(d) - 1) * t.stride(d);
    (extent < 0 ? lo : hi) += extent;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  const auto item = static_cast<int64_t>(t.itemsize());
  return {base + lo * item, base + (hi + 1) * item};
}

inline bool gather_rows_overlap(const at::Tensor& a, const at::Tensor& b) {
  const auto sa = gather_rows_byte_span(a);
  const auto sb = gather_rows_byte_span(b);
  return sa.first < sa.second && sb.first < sb.second && sa.first < sb.second && sb.first < sa.second;
}

// Checks a caller-provided output against the caller's table and index: the table's dtype,
// shape [index.numel(), width], contiguous, and sharing no memory with table or index (the
// kernels read those while writing out, so an overlap would return wrong rows silently).
inline void check_gather_rows_out(const at::Tensor& out, const at::Tensor& table, const at::Tensor& index) {
  const int64_t rows_out = index.numel();
  TORCH_CHECK_TYPE(out.scalar_type() == table.scalar_type(), "gather_rows: out must have the table's dtype ",
                   table.scalar_type(), ", got ", out.scalar_type());
  TORCH_CHECK_VALUE(out.dim() == 2 && out.size(0) == rows_out && out.size(1) == table.size(1),
                    "gather_rows: out must have shape [", rows_out, ", ", table.size(1), "], got ", out.sizes());
  TORCH_CHECK_VALUE(out.is_contiguous(), "gather_rows: out must be contiguous, got strides ", out.strides());
  TORCH_CHECK_VALUE(!gather_rows_overlap(out, table), "gather_rows: out overlaps table in memory (rows would be "
                    "overwritten while they are read); pass an out that shares no memory with table");
  TORCH_CHECK_VALUE(!gather_rows_overlap(out, index), "gather_rows: out overlaps index in memory (indices would "
                    "be overwritten while they are read); pass an out that shares no memory with index");
}

// The CUDA kernel's launch tuning (the schema's blocks_per_sm and unroll), checked by every
// kernel so that a bad value is the same ValueError on every device; the CPU kernel ignores it.
struct GatherLaunch {
  int blocks_per_sm;  // 0: a grid sized by the rows; > 0: that many blocks per usable SM
  int unroll;         // loads in flight per lane: 4, 8 or 16
};

inline GatherLaunch check_gather_launch(int64_t blocks_per_sm, int64_t unroll, const char* op) {
  TORCH_CHECK_VALUE(blocks_per_sm >= 0 && blocks_per_sm <= 32, op,
                    ": blocks_per_sm must be in [0, 32] (0: a grid sized by the rows), got ", blocks_per_sm);
  TORCH_CHECK_VALUE(unroll == 0 || unroll == 4 || unroll == 8 || unroll == 16, op,
                    ": unroll must be 4, 8 or 16 (0: the default, 8), got ", unroll);
  return GatherLaunch{static_cast<int>(blocks_per_sm), unroll == 0 ? 8 : static_cast<int>(unroll)};
}

// Raises the IndexError for the index at `position` (the first bad one in caller order).
[[noreturn]] inline void throw_gather_rows_bad_index(int64_t value, int64_t position, int64_t rows) {
  TORCH_CHECK_INDEX(false, "gather_rows: index ", value, " at position ", position,
                    " is out of bounds for a table with ", rows, " rows (valid: 0 to ", rows - 1, ")");
  TORCH_INTERNAL_ASSERT(false);
}

}  // namespace zerocopy
