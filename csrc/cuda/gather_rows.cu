// CUDA kernel of zerocopy::gather_rows, written for tables whose bytes are host memory mapped
// into the GPU's address space (unified tensors); it serves tables in GPU memory as well.
//
// What decides zero-copy throughput (see MEASUREMENTS.md):
// 1. Order of visits. Random rows of a large host table are bound by address translation
//    (~30 M rows/s). Unless the caller says the index is sorted, the index is sorted on the GPU
//    together with each entry's position (radix sort on the fewest key bits that hold the
//    table's row count), rows are read in address order and each is written to its caller-order
//    position. Tables in GPU memory, and short indices, skip the sort. Order inside a granule
//    of PYTORCH_ZEROCOPY_GATHER_SORT_GRANULE bytes of the table (default 1: a full sort) is
//    left as it comes: the sort then skips the key bits below the granule, one radix pass per
//    8 bits fewer (benchmarks/gather_bandwidth.py --granules measures what it buys).
// 2. Whole cache lines. Each row is read by a group of lanes (a power of two, up to a warp)
//    with the widest vector loads (16/8/4/2/1 bytes) that the row size, row pitch and the base
//    addresses allow. Lanes start at the row's first 128 B boundary and wrap around to the head
//    of the row (the circular shift of PyTorch-Direct, Listing 2), so each group-wide load
//    covers whole lines instead of straddling two.
// 3. Requests in flight. Each lane issues kUnroll independent loads before it stores, across
//    rows for short rows and across a row's chunks for long rows, so short rows keep many PCIe
//    reads outstanding per SM.
//
// Bounds: an index outside [0, rows) is never read; its output row is zero-filled and its
// position is recorded with atomicMin in a device word. With check_bounds that word is read
// back after the kernel (the op's only host synchronisation) and the first bad index, in
// caller order, raises IndexError. Work is queued on the current stream.

#include "gather_rows.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cub/device/device_radix_sort.cuh>
#include <torch/library.h>

#include <cstdint>
#include <cstdlib>
#include <limits>

namespace zerocopy {

namespace {

constexpr int kThreads = 256;
constexpr int kLineBytes = 128;
constexpr int kUnroll = 8;             // independent loads per lane before its stores
constexpr int kStepsPerGroup = 16;     // (row, chunk-iteration) steps per lane group
constexpr int64_t kSortMinRows = 1024; // shorter indices are gathered in caller order

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

struct GatherShape {
  int64_t table_rows;  // rows of the table: valid keys are [0, table_rows)
  int64_t pitch;       // bytes between consecutive table rows
  int64_t n;           // output rows (slots)
  int chunks;          // vectors per row
  int group;           // lanes per row: a power of two, at most 32
  int log_group;
  int iters;           // ceil(chunks / group): group-wide loads per row
  int rows_per_group;  // consecutive slots handled by one group
};

// Slot s (0 <= s < n) gathers table row keys[s] into output row positions[s] (s when positions
// is null). Keys in [0, table_rows) are read; any other key zero-fills its output row and, when
// first_bad is given, lowers *first_bad to its position.
template <typename Vec, typename key_t>
__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const char* __restrict__ table, const key_t* __restrict__ keys,
                       const int32_t* __restrict__ positions, char* __restrict__ out, GatherShape s,
                       unsigned long long* __restrict__ first_bad) {
  constexpr int V = sizeof(Vec);
  const int lane = static_cast<int>(threadIdx.x) & (s.group - 1);
  const int64_t group_id = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> s.log_group;
  const int64_t slot0 = group_id * s.rows_per_group;
  if (slot0 >= s.n) return;
  const int slots = static_cast<int>(min(static_cast<int64_t>(s.rows_per_group), s.n - slot0));
  const int steps = slots * s.iters;
  const int64_t row_bytes = static_cast<int64_t>(s.chunks) * V;

  for (int step0 = 0; step0 < steps; step0 += kUnroll) {
    Vec buf[kUnroll];
    char* dst[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      dst[u] = nullptr;
      const int step = step0 + u;
      if (step >= steps) continue;
      const int row_in_group = step / s.iters;
      const int it = step - row_in_group * s.iters;
      const int chunk = it * s.group + lane;
      const int64_t slot = slot0 + row_in_group;
      const int64_t row = static_cast<int64_t>(keys[slot]);
      const int64_t pos = positions != nullptr ? static_cast<int64_t>(positions[slot]) : slot;
      const bool valid = row >= 0 && row < s.table_rows;
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
      const char* src_row = table + row * s.pitch;
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
    for (int u = 0; u < kUnroll; ++u) {
      if (dst[u] != nullptr) *reinterpret_cast<Vec*>(dst[u]) = buf[u];
    }
  }
}

// keys[i] = index[i] when it is a valid row, else table_rows (sorts last, never read);
// positions[i] = i.
template <typename in_t, typename key_t>
__global__ void prepare_sort_kernel(const in_t* __restrict__ index, int64_t n, int64_t table_rows,
                                    key_t* __restrict__ keys, int32_t* __restrict__ positions) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = static_cast<int64_t>(index[i]);
    keys[i] = static_cast<key_t>(v >= 0 && v < table_rows ? v : table_rows);
    positions[i] = static_cast<int32_t>(i);
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

// Key bits below which the sort leaves order alone: rows within one granule of the table
// (PYTORCH_ZEROCOPY_GATHER_SORT_GRANULE bytes, read per call) share a sort key.
int sort_begin_bit(int64_t pitch, int end_bit) {
  const char* env = std::getenv("PYTORCH_ZEROCOPY_GATHER_SORT_GRANULE");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  const long long granule = std::strtoll(env, &end, 10);
  TORCH_CHECK_VALUE(end != nullptr && *end == '\0' && granule >= 1,
                    "PYTORCH_ZEROCOPY_GATHER_SORT_GRANULE must be a positive number of bytes, got '", env, "'");
  int bits = 0;
  while (bits + 1 < end_bit && (pitch << (bits + 1)) <= granule) ++bits;
  return bits;
}

// Vector width: the widest of 16/8/4/2/1 bytes dividing the row size, the pitch and both bases.
int vector_bytes(int64_t row_bytes, int64_t pitch, const void* table, const void* out) {
  int v = 16;
  const auto t = reinterpret_cast<uintptr_t>(table);
  const auto o = reinterpret_cast<uintptr_t>(out);
  while (v > 1 && (row_bytes % v != 0 || pitch % v != 0 || t % v != 0 || o % v != 0)) v /= 2;
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

template <typename Vec, typename key_t>
void launch_gather(const char* table, const key_t* keys, const int32_t* positions, char* out,
                   const GatherShape& s, unsigned long long* first_bad, cudaStream_t stream) {
  const int64_t groups = (s.n + s.rows_per_group - 1) / s.rows_per_group;
  const int64_t blocks = (groups * s.group + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks <= std::numeric_limits<int32_t>::max(), "gather_rows: index too long (", s.n, " rows)");
  gather_rows_kernel<Vec, key_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(table, keys, positions, out,
                                                                                        s, first_bad);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename key_t>
void launch_gather_vec(int vec, const char* table, const key_t* keys, const int32_t* positions, char* out,
                       const GatherShape& s, unsigned long long* first_bad, cudaStream_t stream) {
  switch (vec) {
    case 16: return launch_gather<VecOf<16>::type>(table, keys, positions, out, s, first_bad, stream);
    case 8: return launch_gather<VecOf<8>::type>(table, keys, positions, out, s, first_bad, stream);
    case 4: return launch_gather<VecOf<4>::type>(table, keys, positions, out, s, first_bad, stream);
    case 2: return launch_gather<VecOf<2>::type>(table, keys, positions, out, s, first_bad, stream);
    default: return launch_gather<VecOf<1>::type>(table, keys, positions, out, s, first_bad, stream);
  }
}

// Sorts (key, position) pairs on `stream`; keys are non-negative and below 2^end_bit.
template <typename key_t>
void sort_pairs(at::Tensor& keys, at::Tensor& positions, int begin_bit, int end_bit, cudaStream_t stream) {
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
      cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, kin, kout, pin, pout, n, begin_bit, end_bit, stream));
  at::Tensor temp = at::empty({static_cast<int64_t>(std::max<size_t>(temp_bytes, 1))},
                              keys.options().dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.mutable_data_ptr(), temp_bytes, kin, kout, pin, pout, n,
                                                 begin_bit, end_bit, stream));
  keys = keys_out;
  positions = positions_out;
}

template <typename key_t>
void gather_sorted_by_address(const at::Tensor& index, const char* table, char* out, const GatherShape& s,
                              int vec, unsigned long long* first_bad, cudaStream_t stream) {
  const auto key_dtype = sizeof(key_t) == 4 ? at::kInt : at::kLong;
  at::Tensor keys = at::empty({s.n}, index.options().dtype(key_dtype));
  at::Tensor positions = at::empty({s.n}, index.options().dtype(at::kInt));
  const int blocks = static_cast<int>(std::min<int64_t>((s.n + kThreads - 1) / kThreads, 65535));
  if (index.scalar_type() == at::kInt) {
    prepare_sort_kernel<int32_t, key_t><<<blocks, kThreads, 0, stream>>>(
        index.const_data_ptr<int32_t>(), s.n, s.table_rows, keys.mutable_data_ptr<key_t>(),
        positions.mutable_data_ptr<int32_t>());
  } else {
    prepare_sort_kernel<int64_t, key_t><<<blocks, kThreads, 0, stream>>>(
        index.const_data_ptr<int64_t>(), s.n, s.table_rows, keys.mutable_data_ptr<key_t>(),
        positions.mutable_data_ptr<int32_t>());
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int end_bit = std::max(1, bit_width(static_cast<uint64_t>(s.table_rows)));
  sort_pairs<key_t>(keys, positions, sort_begin_bit(s.pitch, end_bit), end_bit, stream);
  launch_gather_vec<key_t>(vec, table, keys.const_data_ptr<key_t>(), positions.const_data_ptr<int32_t>(), out, s,
                           first_bad, stream);
}

// Gathers into `out` (checked: CUDA, contiguous, right shape and dtype, table's device).
void gather_rows_cuda_into(const at::Tensor& table, const at::Tensor& index, bool index_sorted, bool check_bounds,
                           const at::Tensor& out) {
  const int64_t n = index.numel();
  const int64_t width = table.size(1);
  const int64_t row_bytes = width * static_cast<int64_t>(table.itemsize());
  if (n == 0) return;
  const int64_t pitch = gather_rows_pitch_bytes(table);
  const char* base = static_cast<const char*>(table.const_data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  const int vec = vector_bytes(row_bytes, pitch, base, dst);

  GatherShape s{};
  s.table_rows = table.size(0);
  s.pitch = pitch;
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
  s.rows_per_group = std::max(1, kStepsPerGroup / s.iters);

  at::Tensor bad;
  unsigned long long* first_bad = nullptr;
  if (check_bounds) {
    bad = at::full({1}, std::numeric_limits<int64_t>::max(), index.options().dtype(at::kLong));
    first_bad = reinterpret_cast<unsigned long long*>(bad.mutable_data_ptr<int64_t>());
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  // Address order pays off for host memory; the positions are int32, which bounds n.
  const bool sort = !index_sorted && n >= kSortMinRows && n <= std::numeric_limits<int32_t>::max() &&
                    !is_device_memory(base);
  if (sort) {
    if (s.table_rows < std::numeric_limits<int32_t>::max()) {
      gather_sorted_by_address<int32_t>(index, base, dst, s, vec, first_bad, stream);
    } else {
      gather_sorted_by_address<int64_t>(index, base, dst, s, vec, first_bad, stream);
    }
  } else if (index.scalar_type() == at::kInt) {
    launch_gather_vec<int32_t>(vec, base, index.const_data_ptr<int32_t>(), nullptr, dst, s, first_bad, stream);
  } else {
    launch_gather_vec<int64_t>(vec, base, index.const_data_ptr<int64_t>(), nullptr, dst, s, first_bad, stream);
  }

  if (check_bounds) {
    const int64_t first = bad.item<int64_t>();
    if (first < n) throw_gather_rows_bad_index(index[first].item<int64_t>(), first, s.table_rows);
  }
}

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

at::Tensor gather_rows_cuda(const at::Tensor& table, const at::Tensor& index, bool index_sorted, bool check_bounds) {
  auto [rows, idx] = cuda_args(table, index);
  const c10::cuda::CUDAGuard guard(rows.device());
  at::Tensor out = at::empty({idx.numel(), rows.size(1)}, rows.options().memory_format(at::MemoryFormat::Contiguous));
  gather_rows_cuda_into(rows, idx, index_sorted, check_bounds, out);
  return out;
}

void gather_rows_out_cuda(const at::Tensor& table, const at::Tensor& index, bool index_sorted, bool check_bounds,
                          at::Tensor& out) {
  auto [rows, idx] = cuda_args(table, index);
  const c10::cuda::CUDAGuard guard(rows.device());
  TORCH_CHECK_VALUE(out.device() == table.device(), "gather_rows: out must be on ", table.device(),
                    " (the table's device), got ", out.device());
  check_gather_rows_out(out, table, index);
  gather_rows_cuda_into(rows, idx, index_sorted, check_bounds, out);
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("gather_rows", gather_rows_cuda);
  m.impl("gather_rows.out", gather_rows_out_cuda);
}

}  // namespace zerocopy
