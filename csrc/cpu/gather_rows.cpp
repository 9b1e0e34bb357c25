// CPU kernel of zerocopy::gather_rows: the gather stage of the DMA path (gather on the host
// into a buffer, usually pinned, then copy it to the GPU).
//
// Rows are copied with memcpy by all intra-op threads (at::parallel_for over output rows),
// prefetching a few rows ahead: random rows of a large table are bound by memory latency, so
// keeping several misses in flight per core is what matters. Indices are checked in the same
// pass; a bad index never reads memory, its output row is zero-filled, and with check_bounds
// the first bad one (in caller order) raises IndexError after the pass.
// zerocopy::gather_rows_cached runs the same loop, taking a row from the cache where slot_of
// names one.

#include "gather_rows.h"
#include "gather_rows_cached.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

namespace zerocopy {

namespace {

constexpr int64_t kPrefetchDistance = 8;  // rows ahead
constexpr int64_t kPrefetchLines = 4;     // cache lines per prefetched row, at most

// Where rows come from: the table, and optionally a cache of rows (slot_of[row] in
// [0, cache_rows) names the cache row holding table row `row`).
struct CpuSources {
  const char* table;
  int64_t rows;
  int64_t pitch;
  const char* cache = nullptr;
  int64_t cache_rows = 0;
  int64_t cache_pitch = 0;
  const int32_t* slot_of = nullptr;

  // The address of valid table row `row`'s bytes.
  const char* row(int64_t row) const {
    if (slot_of != nullptr) {
      const int64_t slot = slot_of[row];
      if (slot >= 0 && slot < cache_rows) return cache + slot * cache_pitch;
    }
    return table + row * pitch;
  }
};

template <typename index_t>
int64_t gather_rows_cpu_impl(const CpuSources& src, int64_t row_bytes, const index_t* index, int64_t n, char* out) {
  std::atomic<int64_t> first_bad{std::numeric_limits<int64_t>::max()};
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(row_bytes, 1));
  const int64_t lines = std::min<int64_t>(kPrefetchLines, (row_bytes + 63) / 64);
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    int64_t local_bad = std::numeric_limits<int64_t>::max();
    for (int64_t i = begin; i < end; ++i) {
      if (i + kPrefetchDistance < end) {
        const int64_t ahead = static_cast<int64_t>(index[i + kPrefetchDistance]);
        if (ahead >= 0 && ahead < src.rows) {
          const char* p = src.row(ahead);
          for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(p + l * 64, 0, 0);
        }
      }
      const int64_t row = static_cast<int64_t>(index[i]);
      char* dst = out + i * row_bytes;
      if (row < 0 || row >= src.rows) {
        local_bad = std::min(local_bad, i);
        std::memset(dst, 0, static_cast<size_t>(row_bytes));
        continue;
      }
      std::memcpy(dst, src.row(row), static_cast<size_t>(row_bytes));
    }
    int64_t seen = first_bad.load(std::memory_order_relaxed);
    while (local_bad < seen && !first_bad.compare_exchange_weak(seen, local_bad, std::memory_order_relaxed)) {
    }
  });
  return first_bad.load();
}

// Writes the gather into `out` (already checked: contiguous, right shape and dtype).
void gather_cpu_into(const CpuSources& src, int64_t row_bytes, const at::Tensor& index_in, bool check_bounds,
                     const at::Tensor& out) {
  const at::Tensor index = index_in.contiguous();
  const int64_t n = index.numel();
  if (n == 0) return;
  char* dst = static_cast<char*>(out.data_ptr());
  int64_t first_bad = 0;
  if (index.scalar_type() == at::kInt) {
    first_bad = gather_rows_cpu_impl(src, row_bytes, index.const_data_ptr<int32_t>(), n, dst);
  } else {
    first_bad = gather_rows_cpu_impl(src, row_bytes, index.const_data_ptr<int64_t>(), n, dst);
  }
  if (check_bounds && first_bad < n) {
    const int64_t value = index.scalar_type() == at::kInt ? index.const_data_ptr<int32_t>()[first_bad]
                                                          : index.const_data_ptr<int64_t>()[first_bad];
    throw_gather_rows_bad_index(value, first_bad, src.rows);
  }
}

// `table` comes from gather_rows_table.
CpuSources table_sources(const at::Tensor& table) {
  return CpuSources{static_cast<const char*>(table.const_data_ptr()), table.size(0), gather_rows_pitch_bytes(table)};
}

int64_t row_bytes_of(const at::Tensor& table) { return table.size(1) * static_cast<int64_t>(table.itemsize()); }

void gather_rows_cpu_into(const at::Tensor& table, const at::Tensor& index, bool check_bounds, const at::Tensor& out) {
  gather_cpu_into(table_sources(table), row_bytes_of(table), index, check_bounds, out);
}

void check_cpu_args(const at::Tensor& table, const at::Tensor& index) {
  check_device_type(table, c10::kCPU, "gather_rows: table");
  check_device_type(index, c10::kCPU, "gather_rows: index (for a CPU table)");
}

at::Tensor gather_rows_cpu(const at::Tensor& table, const at::Tensor& index, bool /*index_sorted*/,
                           bool check_bounds, int64_t blocks_per_sm, int64_t unroll) {
  check_gather_launch(blocks_per_sm, unroll, "gather_rows");
  check_cpu_args(table, index);
  const at::Tensor rows = gather_rows_table(table, index);
  at::Tensor out = at::empty({index.numel(), table.size(1)}, table.options());
  gather_rows_cpu_into(rows, index, check_bounds, out);
  return out;
}

void gather_rows_out_cpu(const at::Tensor& table, const at::Tensor& index, bool /*index_sorted*/,
                         bool check_bounds, int64_t blocks_per_sm, int64_t unroll, at::Tensor& out) {
  check_gather_launch(blocks_per_sm, unroll, "gather_rows");
  check_cpu_args(table, index);
  const at::Tensor rows = gather_rows_table(table, index);
  check_device_type(out, c10::kCPU, "gather_rows: out (for a CPU table)");
  check_gather_rows_out(out, table, index);
  gather_rows_cpu_into(rows, index, check_bounds, out);
}

// --- gather_rows_cached ---------------------------------------------------------------------

CpuSources cached_cpu_sources(const CachedLayout& layout, const at::Tensor& slot_of) {
  CpuSources src = table_sources(layout.table);
  src.cache = static_cast<const char*>(layout.cache.const_data_ptr());
  src.cache_rows = layout.cache.size(0);
  src.cache_pitch = gather_rows_pitch_bytes(layout.cache);
  src.slot_of = slot_of.const_data_ptr<int32_t>();
  return src;
}

void check_cached_cpu_args(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot_of,
                           const at::Tensor& index) {
  check_device_type(cache, c10::kCPU, "gather_rows_cached: cache (for a CPU table)");
  check_device_type(slot_of, c10::kCPU, "gather_rows_cached: slot_of (for a CPU table)");
  check_device_type(table, c10::kCPU, "gather_rows_cached: table (for a CPU cache)");
  check_device_type(index, c10::kCPU, "gather_rows_cached: index (for a CPU table)");
}

at::Tensor gather_rows_cached_cpu(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot_of,
                                  const at::Tensor& index, bool check_bounds, int64_t blocks_per_sm, int64_t unroll) {
  check_gather_launch(blocks_per_sm, unroll, "gather_rows_cached");
  const CachedLayout layout = check_gather_rows_cached(table, cache, slot_of, index);
  check_cached_cpu_args(table, cache, slot_of, index);
  const at::Tensor slots = slot_of.contiguous();
  at::Tensor out = at::empty({index.numel(), table.size(1)}, table.options());
  gather_cpu_into(cached_cpu_sources(layout, slots), row_bytes_of(layout.table), index, check_bounds, out);
  return out;
}

void gather_rows_cached_out_cpu(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot_of,
                                const at::Tensor& index, bool check_bounds, int64_t blocks_per_sm, int64_t unroll,
                                at::Tensor& out) {
  check_gather_launch(blocks_per_sm, unroll, "gather_rows_cached");
  const CachedLayout layout = check_gather_rows_cached(table, cache, slot_of, index);
  check_cached_cpu_args(table, cache, slot_of, index);
  check_device_type(out, c10::kCPU, "gather_rows_cached: out (for a CPU table)");
  check_gather_rows_cached_out(out, table, cache, slot_of, index);
  const at::Tensor slots = slot_of.contiguous();
  gather_cpu_into(cached_cpu_sources(layout, slots), row_bytes_of(layout.table), index, check_bounds, out);
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) {
  m.impl("gather_rows", gather_rows_cpu);
  m.impl("gather_rows.out", gather_rows_out_cpu);
  m.impl("gather_rows_cached", gather_rows_cached_cpu);
  m.impl("gather_rows_cached.out", gather_rows_cached_out_cpu);
}

}  // namespace zerocopy
