// Argument checks of zerocopy::gather_rows_cached shared by its CPU and CUDA kernels (device
// placement is checked by each kernel). The table's own checks are gather_rows'.
#pragma once

#include "checks.h"
#include "gather_rows.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <utility>

namespace zerocopy {

// Both tables with the elements of each row contiguous (rows may have any pitch), copied to
// make them so where they are not.
struct CachedLayout {
  at::Tensor table;
  at::Tensor cache;
};

// table [rows, width]; cache [cache_rows, width] of the table's dtype; slot_of int32 [rows]
// (a cache row, or anything outside [0, cache_rows) for a row read from the table); index as
// for gather_rows.
inline CachedLayout check_gather_rows_cached(const at::Tensor& table, const at::Tensor& cache,
                                             const at::Tensor& slot_of, const at::Tensor& index) {
  check_dim(table, 2, "gather_rows_cached: table");
  check_index_dtype(index, "gather_rows_cached: index");
  check_dim(index, 1, "gather_rows_cached: index");
  const at::Tensor rows = table.size(1) > 1 && table.stride(1) != 1 ? table.contiguous() : table;
  check_dim(cache, 2, "gather_rows_cached: cache");
  TORCH_CHECK_TYPE(cache.scalar_type() == table.scalar_type(), "gather_rows_cached: cache must have the table's dtype ",
                   table.scalar_type(), ", got ", cache.scalar_type());
  TORCH_CHECK_VALUE(cache.size(1) == table.size(1), "gather_rows_cached: cache rows must have the table's width ",
                    table.size(1), ", got ", cache.size(1));
  check_dim(slot_of, 1, "gather_rows_cached: slot_of");
  check_dtype(slot_of, at::kInt, "gather_rows_cached: slot_of");
  TORCH_CHECK_VALUE(slot_of.size(0) == table.size(0), "gather_rows_cached: slot_of must hold one entry per table row (",
                    table.size(0), "), got ", slot_of.size(0));
  const at::Tensor cache_rows = cache.size(1) > 1 && cache.stride(1) != 1 ? cache.contiguous() : cache;
  return {rows, cache_rows};
}

// A caller-provided output: the table's dtype, shape [index.numel(), width], contiguous, and
// sharing no memory with any input (the kernels read those while writing out).
inline void check_gather_rows_cached_out(const at::Tensor& out, const at::Tensor& table, const at::Tensor& cache,
                                         const at::Tensor& slot_of, const at::Tensor& index) {
  const int64_t rows_out = index.numel();
  TORCH_CHECK_TYPE(out.scalar_type() == table.scalar_type(), "gather_rows_cached: out must have the table's dtype ",
                   table.scalar_type(), ", got ", out.scalar_type());
  TORCH_CHECK_VALUE(out.dim() == 2 && out.size(0) == rows_out && out.size(1) == table.size(1),
                    "gather_rows_cached: out must have shape [", rows_out, ", ", table.size(1), "], got ",
                    out.sizes());
  TORCH_CHECK_VALUE(out.is_contiguous(), "gather_rows_cached: out must be contiguous, got strides ", out.strides());
  const std::pair<const at::Tensor*, const char*> inputs[] = {
      {&table, "table"}, {&cache, "cache"}, {&slot_of, "slot_of"}, {&index, "index"}};
  for (const auto& [input, name] : inputs) {
    TORCH_CHECK_VALUE(!gather_rows_overlap(out, *input), "gather_rows_cached: out overlaps ", name,
                      " in memory (it would be overwritten while it is read); pass an out that shares no "
                      "memory with ", name);
  }
}

}  // namespace zerocopy
