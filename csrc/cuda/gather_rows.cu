// CUDA kernels of zerocopy::gather_rows and zerocopy::gather_rows_cached, written for tables
// whose bytes are host memory mapped into the GPU's address space (unified tensors); they
// serve tables in GPU memory as well.
//
// What decides zero-copy throughput (see MEASUREMENTS.md):
// 1. Order of visits. Random rows of a large host table are bound by address translation.
//    Unless the caller says the index is sorted, the index is sorted on the GPU together with
//    each entry's position (radix sort on the fewest key bits that hold the keys), rows are
//    read in address order and each is written to its caller-order position. Tables in GPU
//    memory, and short indices, skip the sort.
// 2. Whole cache lines. Each row is read by a group of lanes (a power of two, up to a warp)
//    with the widest vector loads (16/8/4/2/1 bytes) that the row size, row pitch and the base
//    addresses allow. Lanes start at the row's first 128 B boundary and wrap around to the head
//    of the row (the circular shift of PyTorch-Direct, Listing 2), so each group-wide load
//    covers whole lines instead of straddling two.
// 3. Requests in flight. Each lane issues Unroll independent loads before it stores, across
//    rows for short rows and across a row's chunks for long rows.
//
// The cached gather reads rows held in a GPU-memory cache from there and the others from the
// table, in one sort and one gather kernel: a key encodes where its row comes from (see
// RowSources), so cache rows sort after table rows and the table rows keep address order.
//
// Bounds: an index outside [0, table rows) is never read; its output row is zero-filled and
// its position is recorded with atomicMin in a device word. With check_bounds that word is
// read back after the kernel (the op's only host synchronisation) and the first bad index, in
// caller order, raises IndexError. Work is queued on the current stream.
//
// Launch tuning comes from the caller as op arguments (GatherLaunch, checked in gather_rows.h):
// the loads each lane keeps in flight, and optionally a persistent grid of a few blocks per SM
// this process may use, which the pipeline's producer runs beside training under MPS
// (pipeline/plan.py decides both).

#include "gather_rows.h"
#include "gather_rows_cached.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cub/device/device_radix_sort.cuh>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace zerocopy {

namespace {

constexpr int kThreads = 256;
constexpr int kLineBytes = 128;
constexpr int64_t kSortMinRows = 1024;  // shorter indices are gathered in caller order

template <int Bytes>
struct VecOf;
template <>
struct VecOf<16> { using type = uint4; };
template <>
struct VecOf<8> { using type = uint2; };
template <>
struct VecOf<4> { using type = uint32_t; };
template <>
struct VecOf<2> { using type = uint16_t; };
template <>
struct VecOf<1> { using type = uint8_t; };

// Where a key's row comes from: a key k in [0, table_rows) is table row k; k in
// [table_rows + 1, table_rows + 1 + cache_rows) is cache row k - table_rows - 1; any other key
// (table_rows itself marks a bad index) is a bad index. Without a cache, cache_rows is 0.
struct RowSources {
  const char* table;
  int64_t table_rows;
  int64_t table_pitch;  // bytes between consecutive table rows
  const char* cache;
  int64_t cache_rows;
  int64_t cache_pitch;
};

struct GatherShape {
  int64_t n;           // output rows (slots)
  int chunks;          // vectors per row
  int group;           // lanes per row: a power of two, at most 32
  int log_group;
  int iters;           // ceil(chunks / group): group-wide loads per row
  int rows_per_group;  // consecutive slots handled by one group
};

constexpr int kSteps = 16;  // (row, chunk-iteration) steps per lane group of a grid sized by the rows

// A call's launch: loads per lane, and the grid's blocks (0: sized by the rows).
struct GatherTuning {
  int unroll;
  int grid_blocks;
};

GatherTuning tuning_for(const GatherLaunch& launch) {
  GatherTuning t{launch.unroll, 0};
  if (launch.blocks_per_sm > 0) {
    // Blocks per SM this process may use: an MPS client sees only its share of the SMs.
    int sms = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c10::cuda::current_device()));
    t.grid_blocks = launch.blocks_per_sm * std::max(1, sms);
  }
  return t;
}

// Whether `key` names a row, and where that row starts. Validity comes from the key alone, never
// from the address: a table without elements (no columns) has a null data pointer, yet its rows
// are valid (and empty).
__device__ __forceinline__ bool row_address(const RowSources& src, int64_t key, const char** row) {
  if (key >= 0 && key < src.table_rows) {
    *row = src.table + key * src.table_pitch;
    return true;
  }
  const int64_t c = key - src.table_rows - 1;
  if (c >= 0 && c < src.cache_rows) {
    *row = src.cache + c * src.cache_pitch;
    return true;
  }
  return false;
}

// Slot s (0 <= s < n) gathers the row of keys[s] into output row positions[s] (s when
// positions is null). A bad key zero-fills its output row and, when first_bad is given,
// lowers *first_bad to its position.
template <typename Vec, typename key_t, int Unroll>
__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(RowSources src, const key_t* __restrict__ keys, const int32_t* __restrict__ positions,
                       char* __restrict__ out, GatherShape s, unsigned long long* __restrict__ first_bad) {
  constexpr int V = sizeof(Vec);
  const int lane = static_cast<int>(threadIdx.x) & (s.group - 1);
  const int64_t group_id = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> s.log_group;
  const int64_t slot0 = group_id * s.rows_per_group;
  if (slot0 >= s.n) return;
  const int slots = static_cast<int>(min(static_cast<int64_t>(s.rows_per_group), s.n - slot0));
  const int steps = slots * s.iters;
  const int64_t row_bytes = static_cast<int64_t>(s.chunks) * V;

  for (int step0 = 0; step0 < steps; step0 += Unroll) {
    Vec buf[Unroll];
    char* dst[Unroll];
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      dst[u] = nullptr;
      const int step = step0 + u;
      if (step >= steps) continue;
      const int row_in_group = step / s.iters;
      const int it = step - row_in_group * s.iters;
      const int chunk = it * s.group + lane;
      const int64_t slot = slot0 + row_in_group;
      const int64_t pos = positions != nullptr ? static_cast<int64_t>(positions[slot]) : slot;
      const char* src_row = nullptr;
      const bool valid = row_address(src, static_cast<int64_t>(keys[slot]), &src_row);
      if (!valid && first_bad != nullptr && chunk == 0) {
        atomicMin(first_bad, static_cast<unsigned long long>(pos));
      }
      if (chunk >= s.chunks) continue;
      char* out_row = out + pos * row_bytes;
      if (!valid) {
        buf[u] = Vec{};
        dst[u] = out_row + static_cast<int64_t>(chunk) * V;
        continue;
      }
      // Circular shift: start at the row's first 128 B boundary, wrap to its head.
      int shift = static_cast<int>(((kLineBytes - (reinterpret_cast<uintptr_t>(src_row) & (kLineBytes - 1))) &
                                    (kLineBytes - 1)) / V);
      if (shift >= s.chunks) shift = 0;
      int j = chunk + shift;
      if (j >= s.chunks) j -= s.chunks;
      buf[u] = *reinterpret_cast<const Vec*>(src_row + static_cast<int64_t>(j) * V);
      dst[u] = out_row + static_cast<int64_t>(j) * V;
    }
#pragma unroll
    for (int u = 0; u < Unroll; ++u) {
      if (dst[u] != nullptr) *reinterpret_cast<Vec*>(dst[u]) = buf[u];
    }
  }
}

// keys[i]: the RowSources key of index[i] (table_rows for an index outside [0, table_rows); a
// cache key where slot_of names a cache row); positions[i] = i when positions is given.
template <typename in_t, typename key_t>
__global__ void prepare_keys_kernel(const in_t* __restrict__ index, int64_t n, int64_t table_rows,
                                    const int32_t* __restrict__ slot_of, int64_t cache_rows,
                                    key_t* __restrict__ keys, int32_t* __restrict__ positions) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = static_cast<int64_t>(index[i]);
    int64_t key = table_rows;
    if (v >= 0 && v < table_rows) {
      const int64_t slot = slot_of != nullptr ? static_cast<int64_t>(slot_of[v]) : -1;
      key = slot >= 0 && slot < cache_rows ? table_rows + 1 + slot : v;
    }
    keys[i] = static_cast<key_t>(key);
    if (positions != nullptr) positions[i] = static_cast<int32_t>(i);
  }
}

int bit_width(uint64_t v) {
  int bits = 0;
  while (v != 0) {
    ++bits;
    v >>= 1;
  }
  return bits;
}

// Vector width: the widest of 16/8/4/2/1 bytes dividing the row size and every pitch and base.
int vector_bytes(int64_t row_bytes, const RowSources& src, const void* out) {
  int v = 16;
  const auto fits = [&](int w) {
    if (row_bytes % w != 0 || src.table_pitch % w != 0 || reinterpret_cast<uintptr_t>(src.table) % w != 0 ||
        reinterpret_cast<uintptr_t>(out) % w != 0) {
      return false;
    }
    return src.cache_rows == 0 || (src.cache_pitch % w == 0 && reinterpret_cast<uintptr_t>(src.cache) % w == 0);
  };
  while (v > 1 && !fits(v)) v /= 2;
  return v;
}

bool is_device_memory(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error this query may leave
    return false;
  }
  return attr.type == cudaMemoryTypeDevice;
}

template <typename Vec, typename key_t, int Unroll>
void launch_gather(const RowSources& src, const key_t* keys, const int32_t* positions, char* out,
                   const GatherShape& s, unsigned long long* first_bad, cudaStream_t stream) {
  const int64_t groups = (s.n + s.rows_per_group - 1) / s.rows_per_group;
  const int64_t blocks = (groups * s.group + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "gather_rows: index too long (", s.n, " rows)");
  gather_rows_kernel<Vec, key_t, Unroll>
      <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(src, keys, positions, out, s, first_bad);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename key_t, int Unroll>
void launch_vec(int vec, const RowSources& src, const key_t* keys, const int32_t* positions, char* out,
                const GatherShape& s, unsigned long long* first_bad, cudaStream_t stream) {
  switch (vec) {
    case 16: return launch_gather<uint4, key_t, Unroll>(src, keys, positions, out, s, first_bad, stream);
    case 8: return launch_gather<uint2, key_t, Unroll>(src, keys, positions, out, s, first_bad, stream);
    case 4: return launch_gather<uint32_t, key_t, Unroll>(src, keys, positions, out, s, first_bad, stream);
    case 2: return launch_gather<uint16_t, key_t, Unroll>(src, keys, positions, out, s, first_bad, stream);
    default: return launch_gather<uint8_t, key_t, Unroll>(src, keys, positions, out, s, first_bad, stream);
  }
}

template <typename key_t>
void launch_tuned(const GatherTuning& t, int vec, const RowSources& src, const key_t* keys, const int32_t* positions,
                  char* out, const GatherShape& s, unsigned long long* first_bad, cudaStream_t stream) {
  switch (t.unroll) {
    case 4: return launch_vec<key_t, 4>(vec, src, keys, positions, out, s, first_bad, stream);
    case 16: return launch_vec<key_t, 16>(vec, src, keys, positions, out, s, first_bad, stream);
    default: return launch_vec<key_t, 8>(vec, src, keys, positions, out, s, first_bad, stream);
  }
}

// Sorts (key, position) pairs on `stream`; keys are non-negative and below 2^end_bit.
template <typename key_t>
void sort_pairs(at::Tensor& keys, at::Tensor& positions, int end_bit, cudaStream_t stream) {
  using ukey_t = std::conditional_t<sizeof(key_t) == 4, uint32_t, unsigned long long>;
  const int n = static_cast<int>(keys.numel());
  at::Tensor keys_out = at::empty_like(keys);
  at::Tensor positions_out = at::empty_like(positions);
  auto* kin = reinterpret_cast<const ukey_t*>(keys.const_data_ptr<key_t>());
  auto* kout = reinterpret_cast<ukey_t*>(keys_out.mutable_data_ptr<key_t>());
  const int32_t* pin = positions.const_data_ptr<int32_t>();
  int32_t* pout = positions_out.mutable_data_ptr<int32_t>();
  size_t temp_bytes = 0;
  C10_CUDA_CHECK(
      cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, kin, kout, pin, pout, n, 0, end_bit, stream));
  at::Tensor temp = at::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))},
                              keys.options().dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.mutable_data_ptr(), temp_bytes, kin, kout, pin, pout, n,
                                                 0, end_bit, stream));
  keys = keys_out;
  positions = positions_out;
}

// Keys (and, when `sort`, positions) for every index entry, in key_t; sorted by address when
// `sort`. Returned tensors are on the index's device.
template <typename key_t>
std::pair<at::Tensor, at::Tensor> prepare_keys(const at::Tensor& index, const RowSources& src,
                                               const int32_t* slot_of, bool sort, cudaStream_t stream) {
  const int64_t n = index.numel();
  const auto key_dtype = sizeof(key_t) == 4 ? at::kInt : at::kLong;
  at::Tensor keys = at::empty({n}, index.options().dtype(key_dtype));
  at::Tensor positions;
  if (sort) positions = at::empty({n}, index.options().dtype(at::kInt));
  int32_t* pos = sort ? positions.mutable_data_ptr<int32_t>() : nullptr;
  const int blocks = static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65535));
  if (index.scalar_type() == at::kInt) {
    prepare_keys_kernel<int32_t, key_t><<<blocks, kThreads, 0, stream>>>(
        index.const_data_ptr<int32_t>(), n, src.table_rows, slot_of, src.cache_rows, keys.mutable_data_ptr<key_t>(),
        pos);
  } else {
    prepare_keys_kernel<int64_t, key_t><<<blocks, kThreads, 0, stream>>>(
        index.const_data_ptr<int64_t>(), n, src.table_rows, slot_of, src.cache_rows, keys.mutable_data_ptr<key_t>(),
        pos);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (sort) {
    const int end_bit = std::max(1, bit_width(static_cast<uint64_t>(src.table_rows + src.cache_rows)));
    sort_pairs<key_t>(keys, positions, end_bit, stream);
  }
  return {keys, positions};
}

GatherShape shape_for(int64_t n, int64_t row_bytes, int vec, const GatherTuning& t) {
  GatherShape s{};
  s.n = n;
  const int64_t chunks = row_bytes / vec;
  TORCH_CHECK(chunks <= (int64_t{1} << 30), "gather_rows: rows of ", row_bytes, " bytes are too wide");
  s.chunks = static_cast<int>(chunks);
  s.group = 1;
  s.log_group = 0;
  while (s.group < 32 && s.group < s.chunks) {
    s.group *= 2;
    ++s.log_group;
  }
  s.iters = std::max(1, (s.chunks + s.group - 1) / s.group);  // 1 for empty rows: keys are still checked
  s.rows_per_group = std::max(1, kSteps / s.iters);
  if (t.grid_blocks > 0) {
    const int64_t groups = static_cast<int64_t>(t.grid_blocks) * (kThreads / s.group);
    s.rows_per_group = static_cast<int>(std::max<int64_t>(1, (n + groups - 1) / groups));
  }
  return s;
}

// Gathers `index` into `out` (checked: CUDA, contiguous, right shape and dtype, the index's
// device). `slot_of` is null without a cache.
void gather_cuda_into(const RowSources& src, const at::Tensor& index, const int32_t* slot_of, bool index_sorted,
                      bool check_bounds, const GatherLaunch& launch, int64_t row_bytes, const at::Tensor& out) {
  const int64_t n = index.numel();
  if (n == 0) return;
  char* dst = static_cast<char*>(out.data_ptr());
  const int vec = vector_bytes(row_bytes, src, dst);
  const GatherTuning tuning = tuning_for(launch);
  const GatherShape s = shape_for(n, row_bytes, vec, tuning);

  at::Tensor bad;
  unsigned long long* first_bad = nullptr;
  if (check_bounds) {
    bad = at::full({1}, std::numeric_limits<int64_t>::max(), index.options().dtype(at::kLong));
    first_bad = reinterpret_cast<unsigned long long*>(bad.mutable_data_ptr<int64_t>());
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  // Address order pays off for host memory; the positions are int32, which bounds n.
  const bool sort = !index_sorted && n >= kSortMinRows && n <= std::numeric_limits<int32_t>::max() &&
                    !is_device_memory(src.table);
  const bool narrow_keys = src.table_rows + src.cache_rows < std::numeric_limits<int32_t>::max();
  if (sort || slot_of != nullptr) {
    if (narrow_keys) {
      auto [keys, positions] = prepare_keys<int32_t>(index, src, slot_of, sort, stream);
      launch_tuned<int32_t>(tuning, vec, src, keys.const_data_ptr<int32_t>(),
                            sort ? positions.const_data_ptr<int32_t>() : nullptr, dst, s, first_bad, stream);
    } else {
      auto [keys, positions] = prepare_keys<int64_t>(index, src, slot_of, sort, stream);
      launch_tuned<int64_t>(tuning, vec, src, keys.const_data_ptr<int64_t>(),
                            sort ? positions.const_data_ptr<int32_t>() : nullptr, dst, s, first_bad, stream);
    }
  } else if (index.scalar_type() == at::kInt) {
    launch_tuned<int32_t>(tuning, vec, src, index.const_data_ptr<int32_t>(), nullptr, dst, s, first_bad, stream);
  } else {
    launch_tuned<int64_t>(tuning, vec, src, index.const_data_ptr<int64_t>(), nullptr, dst, s, first_bad, stream);
  }

  if (check_bounds) {
    const int64_t first = bad.item<int64_t>();
    if (first < n) throw_gather_rows_bad_index(index[first].item<int64_t>(), first, src.table_rows);
  }
}

RowSources table_source(const at::Tensor& rows) {
  RowSources src{};
  src.table = static_cast<const char*>(rows.const_data_ptr());
  src.table_rows = rows.size(0);
  src.table_pitch = gather_rows_pitch_bytes(rows);
  return src;
}

int64_t row_bytes_of(const at::Tensor& table) { return table.size(1) * static_cast<int64_t>(table.itemsize()); }

// Checks devices and returns (table in kernel layout, index on the table's device).
std::pair<at::Tensor, at::Tensor> cuda_args(const at::Tensor& table, const at::Tensor& index) {
  TORCH_CHECK_VALUE(table.is_cuda(), "gather_rows: table must be a CUDA or unified tensor when index is on ",
                    index.device(), ", got a table on ", table.device(),
                    " (move the index to the CPU for a CPU table)");
  const at::Tensor rows = gather_rows_table(table, index);
  TORCH_CHECK_VALUE(index.is_cpu() || index.device() == table.device(), "gather_rows: index must be on ",
                    table.device(), " (the table's device) or the CPU, got ", index.device());
  return {rows, index.to(table.device()).contiguous()};
}

at::Tensor gather_rows_cuda(const at::Tensor& table, const at::Tensor& index, bool index_sorted, bool check_bounds,
                            int64_t blocks_per_sm, int64_t unroll) {
  const GatherLaunch launch = check_gather_launch(blocks_per_sm, unroll, "gather_rows");
  auto [rows, idx] = cuda_args(table, index);
  const c10::cuda::CUDAGuard guard(rows.device());
  at::Tensor out = at::empty({idx.numel(), rows.size(1)}, rows.options().memory_format(at::MemoryFormat::Contiguous));
  gather_cuda_into(table_source(rows), idx, nullptr, index_sorted, check_bounds, launch, row_bytes_of(rows), out);
  return out;
}

void gather_rows_out_cuda(const at::Tensor& table, const at::Tensor& index, bool index_sorted, bool check_bounds,
                          int64_t blocks_per_sm, int64_t unroll, at::Tensor& out) {
  const GatherLaunch launch = check_gather_launch(blocks_per_sm, unroll, "gather_rows");
  auto [rows, idx] = cuda_args(table, index);
  const c10::cuda::CUDAGuard guard(rows.device());
  TORCH_CHECK_VALUE(out.device() == table.device(), "gather_rows: out must be on ", table.device(),
                    " (the table's device), got ", out.device());
  check_gather_rows_out(out, table, index);
  gather_cuda_into(table_source(rows), idx, nullptr, index_sorted, check_bounds, launch, row_bytes_of(rows), out);
}

// --- gather_rows_cached ---------------------------------------------------------------------

struct CachedArgs {
  at::Tensor rows;   // the table in kernel layout
  at::Tensor cache;  // the cache in kernel layout
  at::Tensor slot_of;
  at::Tensor index;  // on the cache's device, contiguous
};

CachedArgs cached_cuda_args(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot_of,
                            const at::Tensor& index) {
  const CachedLayout layout = check_gather_rows_cached(table, cache, slot_of, index);
  TORCH_CHECK_VALUE(cache.is_cuda(), "gather_rows_cached: cache must be a CUDA tensor, got a tensor on ",
                    cache.device());
  TORCH_CHECK_VALUE(table.is_cuda() && table.device() == cache.device(),
                    "gather_rows_cached: table must be unified or on ", cache.device(),
                    " (the cache's device), got a table on ", table.device());
  check_same_device(slot_of, "gather_rows_cached: slot_of", cache, "cache");
  TORCH_CHECK_VALUE(index.is_cpu() || index.device() == cache.device(), "gather_rows_cached: index must be on ",
                    cache.device(), " (the cache's device) or the CPU, got ", index.device());
  return {layout.table, layout.cache, slot_of.contiguous(), index.to(cache.device()).contiguous()};
}

void gather_cached_into(const CachedArgs& a, bool check_bounds, const GatherLaunch& launch, const at::Tensor& out) {
  RowSources src = table_source(a.rows);
  src.cache = static_cast<const char*>(a.cache.const_data_ptr());
  src.cache_rows = a.cache.size(0);
  src.cache_pitch = gather_rows_pitch_bytes(a.cache);
  gather_cuda_into(src, a.index, a.slot_of.const_data_ptr<int32_t>(), /*index_sorted=*/false, check_bounds, launch,
                   row_bytes_of(a.rows), out);
}

at::Tensor gather_rows_cached_cuda(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot_of,
                                   const at::Tensor& index, bool check_bounds, int64_t blocks_per_sm, int64_t unroll) {
  const GatherLaunch launch = check_gather_launch(blocks_per_sm, unroll, "gather_rows_cached");
  const CachedArgs a = cached_cuda_args(table, cache, slot_of, index);
  const c10::cuda::CUDAGuard guard(a.cache.device());
  at::Tensor out = at::empty({a.index.numel(), a.rows.size(1)}, a.cache.options());
  gather_cached_into(a, check_bounds, launch, out);
  return out;
}

void gather_rows_cached_out_cuda(const at::Tensor& table, const at::Tensor& cache, const at::Tensor& slot_of,
                                 const at::Tensor& index, bool check_bounds, int64_t blocks_per_sm, int64_t unroll,
                                 at::Tensor& out) {
  const GatherLaunch launch = check_gather_launch(blocks_per_sm, unroll, "gather_rows_cached");
  const CachedArgs a = cached_cuda_args(table, cache, slot_of, index);
  const c10::cuda::CUDAGuard guard(a.cache.device());
  TORCH_CHECK_VALUE(out.device() == cache.device(), "gather_rows_cached: out must be on ", cache.device(),
                    " (the cache's device), got ", out.device());
  check_gather_rows_cached_out(out, table, cache, slot_of, index);
  gather_cached_into(a, check_bounds, launch, out);
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("gather_rows", gather_rows_cuda);
  m.impl("gather_rows.out", gather_rows_out_cuda);
  m.impl("gather_rows_cached", gather_rows_cached_cuda);
  m.impl("gather_rows_cached.out", gather_rows_cached_out_cuda);
}

}  // namespace zerocopy
