// Shared pieces of the CUDA traversal kernels: how a worker walks a neighbour list in each
// variant, block-level counters, launch geometry and the host loop that runs levels until
// the device says there is no more work.
//
// Read shapes (EMOGI §4.3). naive: one thread walks a whole list, so a warp's 32 lanes touch
// 32 unrelated lists (32-byte requests). merged: a warp walks one list, lane k reading
// element start + k + 32 j, so each step is one contiguous request. aligned: as merged, but
// the first step starts at the 128-byte boundary at or before the list's first element (the
// lanes before the list stay idle), so every later step covers whole 128-byte lines. The
// boundary is computed from the array's real address, so it holds for any base alignment.
//
// Convergence. A warp's 32 loads of one step become one request only when the 32 lanes issue
// the load together. Since Volta, lanes that diverged (in a union-find loop, a CAS retry, a
// vertex walk) are not guaranteed to reconverge before the next load, and a warp that stays
// diverged issues up to 32 separate 32-byte requests per line: host reads then run at the
// GPU's request rate, not at PCIe bandwidth. Every warp-cooperative read loop here therefore
// starts each step with __syncwarp(), so each step's load is issued once, by the whole warp.
//
// Bad graphs. The offsets and ids are not validated on the host (that would be a pass over an
// edge list that may be billions of entries in host memory). Instead every kernel checks what
// it reads, with compares on values already in registers (GraphGuard): a list whose offsets are
// not 0 <= indptr[v] <= indptr[v + 1] <= len(indices) is read as empty, an id outside
// [0, num_nodes) is skipped, and each is recorded in an error word (the smallest v or position
// per kind, as the sampling kernels record theirs: csrc/sampling_errors.h). The error words sit
// right after the step counter the host already copies back (run_steps), or are read once at
// the end where an op has no step loop; the op then raises with the offending values. A bad
// graph thus gives an exception and leaves the CUDA context usable.
#pragma once

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "sampling_errors.h"
#include "traversal_checks.h"

namespace zerocopy {
namespace traversal {

constexpr int kWarp = 32;
constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarp;
// Frontier variants expand a step in vertex-id order (a scan) instead of queue order once the
// step holds more than num_nodes / kScanDivisor vertices: address-ordered reads of host memory
// keep near the copy ceiling, random-order reads of short lists do not.
constexpr int64_t kScanDivisor = 128;

// The error words of a traversal: one int64 each, the smallest offender of its kind recorded so
// far, -1 (all ones) for none. kBadOffsets / kBadInOffsets: vertex v whose offsets in indptr /
// in_indptr do not bound a list of the edge array; kBadId / kBadInId: position e of indices /
// in_indices whose id is not a vertex. kOverlappingLists: a kernel found the lists it read to
// hold more entries than the edge array (any value: the host then names the first decreasing
// offset, which such lists imply, since in-bounds lists of non-decreasing offsets are disjoint).
enum GraphErrorWord : int {
  kBadOffsets = 0,
  kBadId = 1,
  kBadInOffsets = 2,
  kBadInId = 3,
  kOverlappingLists = 4,
  kGraphErrorWords = 5
};

// What a kernel checks its reads of the graph against, and where it records a violation. Passed
// by value; `errors` points at kGraphErrorWords words in GPU memory.
struct GraphGuard {
  int64_t n;  // vertices: ids must be in [0, n)
  int64_t m;  // entries of the edge array (of indices, and of in_indices, which has as many)
  unsigned long long* errors;

  __device__ __forceinline__ void report(int kind, int64_t where) const {
    atomicMin(errors + kind, static_cast<unsigned long long>(where));
  }

  // Whether [start, end) is a list of the edge array: 0 <= start <= end <= m (unsigned compares
  // also refuse negative offsets). The benchmark-only build ZEROCOPY_UNGUARDED_TRAVERSAL (setup.py)
  // trusts every list and id, so the compiler drops the checks: guard_overhead.py's baseline.
  __device__ __forceinline__ bool list_ok(int64_t start, int64_t end) const {
#ifdef ZEROCOPY_UNGUARDED_TRAVERSAL
    return true;
#else
    return static_cast<uint64_t>(start) <= static_cast<uint64_t>(end) &&
           static_cast<uint64_t>(end) <= static_cast<uint64_t>(m);
#endif
  }

  // Checks v's list [start, end) as read from the offsets; a bad one is reported as v's and
  // made empty, so the caller reads nothing of it. Every lane that read the same offsets makes
  // the same decision, so warp-uniform loops stay uniform.
  __device__ __forceinline__ bool list(int64_t v, int64_t& start, int64_t& end, int kind = kBadOffsets) const {
    if (list_ok(start, end)) return true;
    report(kind, v);
    start = 0;
    end = 0;
    return false;
  }

  // Whether id u is a vertex (unsigned compare: negative ids are not).
  template <typename T>
  __device__ __forceinline__ bool is_vertex(T u) const {
#ifdef ZEROCOPY_UNGUARDED_TRAVERSAL
    return true;
#else
    return static_cast<uint64_t>(static_cast<int64_t>(u)) < static_cast<uint64_t>(n);
#endif
  }

  // Whether id u, read at position e, is a vertex; reports e when not.
  template <typename T>
  __device__ __forceinline__ bool id(T u, int64_t e, int kind = kBadId) const {
    if (is_vertex(u)) return true;
    report(kind, e);
    return false;
  }
};

// A thread's smallest offenders of the out-lists (kBadOffsets: a vertex, kBadId: a position),
// kept in registers and reported through a GraphGuard once, by flush(). For loops whose loads
// must not wait behind a conditional atomic per check (the persistent async kernel): it records
// every offender the immediate GraphGuard calls would, and the error words end with the same
// minima once every thread has flushed, so a caller must flush on every path out of its kernel
// after its last read of the graph, and the host must read the words only after the kernel.
struct GraphFaults {
  unsigned long long offsets = ~0ull;  // smallest vertex whose offsets bound no list; ~0: none
  unsigned long long ids = ~0ull;      // smallest position holding an id that is not a vertex; ~0: none

  // Checks v's list [start, end) as GraphGuard::list does (a bad one is noted and made empty),
  // with no atomic; returns whether it was a list.
  __device__ __forceinline__ bool list(const GraphGuard& g, int64_t v, int64_t& start, int64_t& end) {
    const bool ok = g.list_ok(start, end);
    if (!ok) {
      offsets = min(offsets, static_cast<unsigned long long>(v));
      start = 0;
      end = 0;
    }
    return ok;
  }

  // Notes position e as holding a bad id.
  __device__ __forceinline__ void bad_id(int64_t e) { ids = min(ids, static_cast<unsigned long long>(e)); }

  // Notes positions first + j for the set bits j of `bad` (the smallest is first + the lowest bit).
  __device__ __forceinline__ void bad_ids(int64_t first, unsigned bad) {
    if (bad) bad_id(first + __ffs(bad) - 1);
  }

  __device__ __forceinline__ void flush(const GraphGuard& g) const {
    if (offsets != ~0ull) g.report(kBadOffsets, static_cast<int64_t>(offsets));
    if (ids != ~0ull) g.report(kBadId, static_cast<int64_t>(ids));
  }
};

// Host copies of the error words.
struct GraphErrors {
  int64_t words[kGraphErrorWords];

  bool any() const {
    for (int64_t w : words)
      if (w >= 0) return true;
    return false;
  }
};

// Raises for the first kind of error recorded (offsets before ids, the graph before the
// in-neighbour lists), with the offending values read from the arrays (on the error path only).
inline void check_graph_errors(const char* op, const GraphErrors& errors, const at::Tensor& indptr,
                               const at::Tensor& indices, const at::Tensor* in_indptr = nullptr,
                               const at::Tensor* in_indices = nullptr) {
  if (!errors.any()) return;
  const int64_t n = indptr.numel() - 1, m = indices.numel();
  const int64_t* w = errors.words;
  if (w[kBadOffsets] >= 0) raise_bad_offsets(op, w[kBadOffsets], indptr, m);
  if (w[kBadId] >= 0) raise_bad_neighbor(op, w[kBadId], indices, n);
  if (w[kOverlappingLists] >= 0) {
    const at::Tensor falls = at::nonzero(indptr.slice(0, 1).lt(indptr.slice(0, 0, n))).flatten();
    TORCH_CHECK(falls.numel() > 0, op, ": internal error: lists overlap, yet indptr never decreases");
    raise_bad_offsets(op, falls.select(0, 0).item<int64_t>(), indptr, m);
  }
  TORCH_CHECK(in_indptr != nullptr && in_indices != nullptr, op, ": internal error: an error in the in-neighbour "
              "lists, which this op does not read");
  if (w[kBadInOffsets] >= 0) raise_bad_offsets(op, w[kBadInOffsets], *in_indptr, m, "in_indptr", "in_indices");
  raise_bad_neighbor(op, w[kBadInId], *in_indices, n, "in_indices");
}

// A block of `counters` int64 counters (zero) followed by the kGraphErrorWords error words (-1),
// in GPU memory with `options`.
inline at::Tensor counters_and_errors(int64_t counters, const at::TensorOptions& options) {
  at::Tensor block = at::full({counters + kGraphErrorWords}, -1, options.dtype(at::kLong));
  block.narrow(0, 0, counters).zero_();
  return block;
}

// The error words at `words_dev` (GPU memory), read with one small copy and a sync of `stream`:
// for ops without a step loop to carry them back.
inline GraphErrors read_graph_errors(const long long* words_dev, cudaStream_t stream) {
  at::Tensor pinned = at::empty({kGraphErrorWords}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  C10_CUDA_CHECK(cudaMemcpyAsync(pinned.data_ptr<int64_t>(), words_dev, kGraphErrorWords * sizeof(long long),
                                 cudaMemcpyDeviceToHost, stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  GraphErrors errors;
  for (int k = 0; k < kGraphErrorWords; ++k) errors.words[k] = pinned.data_ptr<int64_t>()[k];
  return errors;
}

// The first index at or before `start` whose element starts a kBytes-aligned block of `base`
// (kBytes a power of two and a multiple of sizeof(T)).
template <int kBytes, typename T>
__device__ __forceinline__ int64_t aligned_start_to(const T* base, int64_t start) {
  constexpr int64_t per_block = kBytes / static_cast<int64_t>(sizeof(T));
  const int64_t shift = static_cast<int64_t>((reinterpret_cast<uintptr_t>(base) % kBytes) / sizeof(T));
  return ((start + shift) & ~(per_block - 1)) - shift;
}

// The first index at or before `start` whose element starts a 128-byte line of `base`.
template <typename T>
__device__ __forceinline__ int64_t aligned_start(const T* base, int64_t start) {
  return aligned_start_to<128>(base, start);
}

// Calls fn(e) for every e in [start, end), spread over a warp as the variant says. The loop
// trip count is the same for every lane of the warp (warp-uniform), so fn may use warp
// collectives on `active` lanes via the mask it is given: fn(e, valid) is called on every lane
// at every step, with valid false for lanes outside the list.
template <bool kAlign, typename T, typename Fn>
__device__ __forceinline__ void warp_for_each(const T* base, int64_t start, int64_t end, int lane, Fn&& fn) {
  const int64_t first = kAlign ? aligned_start(base, start) : start;
  for (int64_t i = first; i < end; i += kWarp) {
    __syncwarp();
    const int64_t e = i + lane;
    fn(e, e >= start && e < end);
  }
}

// Lanes below `lane`, as a mask.
__device__ __forceinline__ unsigned lanemask_lt(int lane) { return (1u << lane) - 1u; }

// Acquire / release accesses at GPU scope for flags and sequence numbers that other blocks
// poll. An acquire load orders every later access of the thread after it; a release store
// orders every earlier access (loads included) before it.
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_release(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

template <typename T>
__device__ __forceinline__ T ld_volatile(const T* p) {
  return *reinterpret_cast<const volatile T*>(p);
}

// Calls body(v) on all lanes of the warp for every v in [0, n) with active(v), in ascending
// order within tiles of 32 vertices spread over the grid's warps. Each lane tests one vertex
// of the tile and a ballot collects the active ones, so a warp pays one state load per 32
// vertices rather than one dependent load per vertex (which made scans of a large, mostly
// idle vertex set latency-bound).
template <typename Active, typename Body>
__device__ __forceinline__ void warp_for_each_active(int64_t n, int lane, Active&& active, Body&& body) {
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t base = warp * kWarp; base < n; base += warps * kWarp) {
    const int64_t mine = base + lane;
    unsigned mask = __ballot_sync(0xffffffffu, mine < n && active(mine));
    while (mask) {
      const int k = __ffs(mask) - 1;
      mask &= mask - 1;
      body(base + k);
    }
  }
}

// Block-wide sum of a per-thread edge count, added to *total by one thread per block.
__device__ __forceinline__ void add_block_count(unsigned long long mine, long long* total) {
  __shared__ unsigned long long block_sum;
  if (threadIdx.x == 0) block_sum = 0;
  __syncthreads();
  if (mine) atomicAdd(&block_sum, mine);
  __syncthreads();
  if (threadIdx.x == 0 && block_sum) {
    atomicAdd(reinterpret_cast<unsigned long long*>(total), block_sum);
  }
}

// Marks that the step `step` found work: top = max(top, step + 1), once per block.
__device__ __forceinline__ void mark_found(bool found, long long* top, long long step) {
  if (__syncthreads_or(found) && threadIdx.x == 0) atomicMax(top, step + 1);
}

// Warp-aggregated push of the lanes with `push` set onto queue[*count ...].
template <typename Q>
__device__ __forceinline__ void warp_push(bool push, Q value, Q* queue, long long* count, int lane) {
  const unsigned mask = __ballot_sync(0xffffffffu, push);
  if (!mask) return;
  long long base = 0;
  const int leader = __ffs(mask) - 1;
  if (lane == leader) {
    base = static_cast<long long>(atomicAdd(reinterpret_cast<unsigned long long*>(count),
                                            static_cast<unsigned long long>(__popc(mask))));
  }
  base = __shfl_sync(0xffffffffu, base, leader);
  if (push) queue[base + __popc(mask & ((1u << lane) - 1u))] = value;
}

// Blocks for a grid-stride kernel of `kBlock` threads: enough to fill the GPU, no more than the
// work needs.
inline int64_t full_grid_blocks() {
  // Per device, computed once (levels are launched thousands of times on high-diameter graphs).
  static std::atomic<int64_t> cache[256];
  const int device = c10::cuda::current_device();
  int64_t full = (device >= 0 && device < 256) ? cache[device].load(std::memory_order_relaxed) : 0;
  if (full > 0) return full;
  int sms = 0, threads_per_sm = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  full = static_cast<int64_t>(sms) * std::max<int64_t>(1, threads_per_sm / kBlock);
  if (device >= 0 && device < 256) cache[device].store(full, std::memory_order_relaxed);
  return full;
}

// Blocks of `block` threads of `kernel` that are resident on the device at once, at most
// `max_per_sm` per SM: a persistent kernel launched with this many blocks has all of them
// running together.
template <typename Kernel>
int64_t resident_blocks(Kernel kernel, int block, int max_per_sm) {
  const int device = c10::cuda::current_device();
  int sms = 0, per_sm = 0;
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block, 0));
  return std::max<int64_t>(1, static_cast<int64_t>(sms) * std::min(per_sm, max_per_sm));
}

inline int64_t grid_blocks(int64_t workers_per_item, int64_t items) {
  const int64_t full = full_grid_blocks();
  const int64_t needed = (std::max<int64_t>(items, 1) * workers_per_item + kBlock - 1) / kBlock;
  return std::max<int64_t>(1, std::min(full, needed));
}

// Runs launch(step) for step = 0, 1, 2, ... until the device counter *top_dev (the last step
// known to have work) falls behind the steps launched, or max_steps, or a kernel records a bad
// graph. A step's kernel returns at once when *top_dev < step, so steps are launched in batches
// of 1, 2, 4, ... 64 with one device-to-host copy into pinned memory and one stream sync per
// batch. The kGraphErrorWords error words follow *top_dev in memory and come back in the same
// copy, into `errors`.
template <typename Launch>
int64_t run_steps(Launch&& launch, const long long* top_dev, int64_t max_steps, cudaStream_t stream,
                  GraphErrors& errors) {
  at::Tensor pinned = at::empty({1 + kGraphErrorWords}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  auto* host = reinterpret_cast<long long*>(pinned.data_ptr<int64_t>());
  int64_t next = 0, batch = 1;
  for (int k = 0; k < kGraphErrorWords; ++k) errors.words[k] = -1;
  while (next < max_steps) {
    const int64_t stop = std::min(max_steps, next + batch);
    for (int64_t step = next; step < stop; ++step) launch(step);
    next = stop;
    C10_CUDA_CHECK(cudaMemcpyAsync(host, top_dev, (1 + kGraphErrorWords) * sizeof(long long),
                                   cudaMemcpyDeviceToHost, stream));
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (int k = 0; k < kGraphErrorWords; ++k) errors.words[k] = host[1 + k];
    if (errors.any() || host[0] < next) break;
    batch = std::min<int64_t>(batch * 2, 64);
  }
  return next;
}

// Whether `p` points at GPU memory (not host memory mapped for the GPU, not managed memory).
inline bool in_device_memory(const void* p) {
  cudaPointerAttributes attr{};
  C10_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  return attr.type == cudaMemoryTypeDevice;
}

// Checks shared by the CUDA entry points; returns num_nodes.
inline int64_t check_cuda_csr(const at::Tensor& indptr, const at::Tensor& indices, const char* op) {
  const int64_t n = check_csr(indptr, indices, op);
  check_device_type(indptr, c10::kCUDA, "indptr");
  return n;
}

}  // namespace traversal
}  // namespace zerocopy
