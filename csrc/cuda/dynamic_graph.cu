// The dynamic_graph_* ops on the GPU. One batch at a time, on the current stream; within a
// batch every step is a flat set of independent items (csrc/dynamic_graph.h):
//
//   append   per-run page counts -> prefix sums -> content check and pool check (the one
//            synchronisation: nothing has been written yet) -> one thread per new page (take
//            a ticket, link into the tree) -> one thread per run (root, height, degree) -> one
//            lane per touched data page, kWarp pages a warp (copy the run's ids, coalesced).
//   remove   content check -> one thread per hole (move a tail entry into it) -> one thread
//            per freed page (push it on the ring) -> one thread per run.
//   clear    remove's last two steps for whole lists: nothing to compact, no positions.
//   contains / find: a Bloom filter per long run -> one warp per (run, data page): each entry
//            tested against its run's filter, then (if it passes) binary-searched in the run's
//            sorted destinations; find keeps a hit mask per 32 entries, scans the counts and
//            writes positions from the masks, so positions come out sorted.
//   sampling: the kernels of zerocopy::sample_layers over the paged lists (sample_layers.cu).
//   find_marked: find's items with a mask of vertex ids as the test (vertex deletion), behind a
//            coarse copy of the mask in each block's shared memory; a warp reads the data
//            pages under kWarp level-1 nodes as one sequence, so each run and node is looked
//            up once per 2^s data pages, not once per page.
//   mark_neighbours: find_marked's items, every entry's id marked (the lists a deletion reads).
//   find_touching / to_csr / bfs: sweeps over the page table; each lane tests one page, the
//            warp then walks the active pages one by one (whole pages: balanced by design).
//
// No item waits on another and no lock is taken: page tickets come from prefix sums over the
// ring, every item writes slots no other item reads or writes in the same kernel, and the
// kernels of a batch are ordered by the stream. Atomics are used only for first-bad-index
// reports, counters and BFS's visited marks (atomicCAS on depth). The pool may be host memory
// mapped for the GPU (a unified tensor reaches these kernels as a CUDA tensor over it).

#include "checks.h"
#include "dynamic_graph.h"
#include "dynamic_graph_checks.h"
#include "sampling.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <vector>

namespace zerocopy {
namespace {

using namespace dyngraph;

constexpr int kWarp = 32;
constexpr int kBlock = 256;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t thread_count() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }
__device__ __forceinline__ int64_t warp_index() { return thread_index() / kWarp; }
__device__ __forceinline__ int64_t warp_count() { return thread_count() / kWarp; }
__device__ __forceinline__ int lane_id() { return threadIdx.x % kWarp; }
__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }

// Blocks of kBlock threads for `threads` threads of a grid-stride kernel, capped at a full GPU
// (the current device's SMs times the blocks each can hold; computed once per device).
int blocks_for(int64_t threads) {
  static std::atomic<int64_t> cache[64];
  const int device = c10::cuda::current_device();
  int64_t full = device < 64 ? cache[device].load(std::memory_order_relaxed) : 0;
  if (full == 0) {
    int sms = 0, threads_per_sm = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
    full = std::max<int64_t>(1, static_cast<int64_t>(sms) * (threads_per_sm / kBlock));
    if (device < 64) cache[device].store(full, std::memory_order_relaxed);
  }
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((threads + kBlock - 1) / kBlock, full)));
}

// Threads for one warp per kWarp items.
int64_t chunk_threads(int64_t items) { return (items + kWarp - 1) / kWarp * kWarp; }

// Host copy of small int64 device tensors, concatenated: the ops' one synchronisation.
std::vector<int64_t> read_back(const std::vector<at::Tensor>& parts) {
  std::vector<at::Tensor> flat;
  for (const auto& p : parts) flat.push_back(p.reshape(-1).to(at::kLong));
  const at::Tensor host = at::cat(flat).cpu();
  const int64_t* h = host.data_ptr<int64_t>();
  return std::vector<int64_t>(h, h + host.numel());
}

// Exclusive prefix sum with the total appended: out[0] = 0, out[k + 1] = x[0] + .. + x[k].
at::Tensor offsets_of(const at::Tensor& counts) {
  at::Tensor out = at::zeros({counts.numel() + 1}, counts.options());
  if (counts.numel() > 0) out.slice(0, 1).copy_(counts.cumsum(0));
  return out;
}

constexpr c10::DeviceType kCuda = c10::DeviceType::CUDA;

// 32-bit words of a weights tensor (float32 or int32: kernels only copy them).
int32_t* weight_words(const std::optional<at::Tensor>& w) {
  return w ? static_cast<int32_t*>(w->data_ptr()) : nullptr;
}

// ---------------------------------------------------------------------------------------------
// The content check (dynamic_graph_checks.h): first bad index per BatchError, LLONG_MAX if none.

template <typename val_t>
__global__ void batch_check_kernel(const int64_t* __restrict__ vtx, int64_t runs, const int64_t* __restrict__ off,
                                   const val_t* __restrict__ vals, int64_t n, int64_t num_ids,
                                   const int64_t* __restrict__ degree, unsigned long long* __restrict__ first) {
  const int64_t span = runs + 1 > n ? runs + 1 : n;
  for (int64_t i = thread_index(); i < span; i += thread_count()) {
    if (i < runs && !vertex_ok(vtx, i, num_ids, true)) atomicMin(&first[kBadVertex], i);
    if (i <= runs && !offset_ok(off, i, runs, n)) atomicMin(&first[kBadOffset], i);
    if (i < n) {
      if (degree == nullptr) {
        if (!value_ok(vals, i, num_ids)) atomicMin(&first[kBadValue], i);
      } else if (!position_ok(reinterpret_cast<const int64_t*>(vals), off, runs, vtx, degree, num_ids, i)) {
        atomicMin(&first[kBadPosition], i);
      }
    }
  }
}

// Launches the check; the result (int64 [kNumBatchErrors]) is read with the op's other totals.
at::Tensor launch_batch_check(const at::Tensor& vertices, const at::Tensor& offsets, const at::Tensor& values,
                              int64_t num_ids, const int64_t* degree, cudaStream_t stream) {
  at::Tensor first = at::full({kNumBatchErrors}, LLONG_MAX, vertices.options());
  const int64_t runs = vertices.numel(), n = values.numel();
  auto* out = reinterpret_cast<unsigned long long*>(first.data_ptr<int64_t>());
  AT_DISPATCH_INDEX_TYPES(values.scalar_type(), "dynamic_graph_batch_check", [&] {
    batch_check_kernel<index_t><<<blocks_for(std::max(runs + 1, n)), kBlock, 0, stream>>>(
        vertices.data_ptr<int64_t>(), runs, offsets.data_ptr<int64_t>(), values.data_ptr<index_t>(), n, num_ids,
        degree, out);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return first;
}

// Raises for the first failed check; `first` points at the kNumBatchErrors values read back.
void raise_if_bad(const int64_t* first, const at::Tensor& vertices, const at::Tensor& offsets,
                  const at::Tensor& values, const char* offsets_name, const char* values_name, int64_t num_ids,
                  const char* op) {
  int64_t f[kNumBatchErrors];
  for (int k = 0; k < kNumBatchErrors; ++k) f[k] = first[k] == LLONG_MAX ? -1 : first[k];
  raise_batch_error(f, vertices, offsets, values, offsets_name, values_name, num_ids, true, op);
}

// Small kernels over runs.

__global__ void grow_counts_kernel(const int64_t* __restrict__ vtx, const int64_t* __restrict__ off, int64_t runs,
                                   const int64_t* __restrict__ degree, int64_t num_ids, int s,
                                   int64_t* __restrict__ pages, int64_t* __restrict__ chunks) {
  for (int64_t r = thread_index(); r < runs; r += thread_count()) {
    const int64_t v = vtx[r], add = off[r + 1] - off[r];
    if (v < 0 || v >= num_ids || add < 0) {  // reported by the content check
      pages[r] = chunks[r] = 0;
      continue;
    }
    const int64_t d0 = degree[v];
    pages[r] = tree_pages(d0 + add, s) - tree_pages(d0, s);
    chunks[r] = appended_chunks(d0, d0 + add, s);
  }
}

__global__ void shrink_counts_kernel(const int64_t* __restrict__ vtx, const int64_t* __restrict__ off, int64_t runs,
                                     const int64_t* __restrict__ degree, int64_t num_ids, int s,
                                     int64_t* __restrict__ pages) {
  for (int64_t r = thread_index(); r < runs; r += thread_count()) {
    const int64_t v = vtx[r], holes = off[r + 1] - off[r];
    const bool ok = v >= 0 && v < num_ids && holes >= 0 && holes <= degree[v];
    pages[r] = ok ? tree_pages(degree[v], s) - tree_pages(degree[v] - holes, s) : 0;
  }
}

__global__ void set_meta_kernel(int64_t* meta, int64_t head, int64_t tail, int64_t fresh) {
  meta[kHead] = head;
  meta[kTail] = tail;
  meta[kFresh] = fresh;
}

at::Tensor pages_needed_cuda(const at::Tensor& degree_in, const at::Tensor& vertices_in, const at::Tensor& offsets_in,
                             int64_t page_size) {
  constexpr const char* op = "dynamic_graph_pages_needed";
  const int s = page_shift(page_size, op);
  check_growth(degree_in, vertices_in, offsets_in, op);
  const c10::cuda::OptionalCUDAGuard guard(degree_in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor degree = degree_in.contiguous(), vertices = vertices_in.contiguous(), off = offsets_in.contiguous();
  const int64_t runs = vertices.numel();
  if (runs == 0) return at::zeros({}, degree.options());
  at::Tensor pages = at::empty({runs}, vertices.options()), chunks = at::empty({runs}, vertices.options());
  grow_counts_kernel<<<blocks_for(runs), kBlock, 0, stream>>>(vertices.data_ptr<int64_t>(), off.data_ptr<int64_t>(),
                                                              runs, degree.data_ptr<int64_t>(), degree.numel(), s,
                                                              pages.data_ptr<int64_t>(), chunks.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return pages.sum();
}

// ---------------------------------------------------------------------------------------------
// append

template <typename idx_t>
__global__ void grow_kernel(idx_t* pool, idx_t* __restrict__ owner, int32_t* __restrict__ rank,
                            const idx_t* __restrict__ root, const int64_t* __restrict__ degree,
                            const int64_t* __restrict__ vtx, const int64_t* __restrict__ off,
                            const int64_t* __restrict__ page_off, int64_t runs, int64_t total, Tickets<idx_t> tickets,
                            int s) {
  for (int64_t t = thread_index(); t < total; t += thread_count()) {
    const int64_t r = group_of(page_off, runs, t);
    const int64_t v = vtx[r];
    const int64_t d0 = degree[v];
    grow_item(pool, owner, rank, tickets, v, static_cast<int64_t>(root[v]), d0, d0 + off[r + 1] - off[r],
              page_off[r], t - page_off[r], s);
  }
}

template <typename idx_t>
__global__ void grown_roots_kernel(idx_t* __restrict__ root, int8_t* __restrict__ height, int64_t* __restrict__ degree,
                                   const int64_t* __restrict__ vtx, const int64_t* __restrict__ off,
                                   const int64_t* __restrict__ page_off, int64_t runs, Tickets<idx_t> tickets, int s) {
  for (int64_t r = thread_index(); r < runs; r += thread_count()) {
    const int64_t v = vtx[r];
    const int64_t d0 = degree[v], d1 = d0 + off[r + 1] - off[r];
    root[v] = static_cast<idx_t>(grown_root(tickets, static_cast<int64_t>(root[v]), d0, d1, page_off[r], s));
    height[v] = static_cast<int8_t>(tree_shape(d1, s).height);
    degree[v] = d1;
  }
}

// Touched data pages kWarp at a time per warp: lane l describes page first + l (its run, its
// pool page, the slots and batch entries it takes), then the warp copies the pages' entries as
// one flat range, lane by lane, so a batch of short runs (one new entry per list) keeps every
// lane busy and the pages' lookups in flight together. Writes of one page are coalesced.
template <typename idx_t, typename dst_t>
__global__ void fill_kernel(idx_t* pool, int32_t* __restrict__ weights, const idx_t* __restrict__ root,
                            const int8_t* __restrict__ height, const int64_t* __restrict__ degree,
                            const int64_t* __restrict__ vtx, const int64_t* __restrict__ off,
                            const int64_t* __restrict__ chunk_off, int64_t runs, int64_t total,
                            const dst_t* __restrict__ dst, const int32_t* __restrict__ run_w, int s) {
  const int lane = lane_id();
  for (int64_t first = warp_index() * kWarp; first < total; first += warp_count() * kWarp) {
    const int64_t c = first + lane;
    int64_t count = 0, slot = 0, from = 0;  // this lane's page: `count` entries, to slot.., from dst[from..]
    if (c < total) {
      const int64_t r = group_of(chunk_off, runs, c);
      const int64_t v = vtx[r];
      const int64_t d1 = degree[v], d0 = d1 - (off[r + 1] - off[r]);
      const int64_t i = (d0 >> s) + (c - chunk_off[r]);
      const int64_t page = node_page(pool, static_cast<int64_t>(root[v]), height[v], 0, i, s);
      const int64_t lo = (i << s) > d0 ? (i << s) : d0;
      const int64_t hi = ((i + 1) << s) < d1 ? ((i + 1) << s) : d1;
      count = hi > lo ? hi - lo : 0;
      slot = (page << s) + (lo - (i << s));
      from = off[r] + (lo - d0);
    }
    int64_t end = count;  // inclusive scan: lane l's entries are [end - count, end) of the warp's
#pragma unroll
    for (int d = 1; d < kWarp; d <<= 1) {
      const int64_t up = __shfl_up_sync(kFull, end, d);
      if (lane >= d) end += up;
    }
    const int64_t begin = end - count;
    const int64_t entries = __shfl_sync(kFull, end, kWarp - 1);
    for (int64_t base = 0; base < entries; base += kWarp) {
      const int64_t e = base + lane;
      int u = 0;  // the last lane whose range begins at or before e (its range holds e)
#pragma unroll
      for (int b = kWarp / 2; b > 0; b >>= 1) {
        const int64_t b_begin = __shfl_sync(kFull, begin, u + b);
        if (b_begin <= e) u += b;
      }
      const int64_t k = e - __shfl_sync(kFull, begin, u);
      const int64_t to = __shfl_sync(kFull, slot, u) + k, at = __shfl_sync(kFull, from, u) + k;
      if (e < entries) {
        pool[to] = static_cast<idx_t>(dst[at]);
        if (weights) weights[to] = run_w[at];
      }
    }
  }
}

void append_cuda(const at::Tensor& pool, const std::optional<at::Tensor>& weights, const at::Tensor& root,
                 const at::Tensor& height, const at::Tensor& degree, const at::Tensor& page_owner,
                 const at::Tensor& page_rank, const at::Tensor& page_ring, const at::Tensor& meta,
                 const at::Tensor& vertices_in, const at::Tensor& run_offsets_in, const at::Tensor& run_dst_in,
                 const std::optional<at::Tensor>& run_weights, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_append";
  const int s = page_shift(page_size, op);
  check_writer(pool, weights, root, height, degree, page_owner, page_rank, page_ring, meta, s, kCuda, op);
  check_runs(pool, vertices_in, run_offsets_in, run_dst_in, "run_offsets", "run_dst", op, /*any_index=*/true);
  const at::Tensor run_w = check_run_weights(weights, run_weights, run_dst_in, pool, op);
  const c10::cuda::OptionalCUDAGuard guard(pool.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor vertices = vertices_in.contiguous(), off = run_offsets_in.contiguous(),
                   dst = run_dst_in.contiguous();
  const int64_t runs = vertices.numel(), num_ids = root.numel(), num_pages = pool.numel() >> s;

  at::Tensor pages = at::empty({runs}, vertices.options()), chunks = at::empty({runs}, vertices.options());
  if (runs > 0) {
    grow_counts_kernel<<<blocks_for(runs), kBlock, 0, stream>>>(
        vertices.data_ptr<int64_t>(), off.data_ptr<int64_t>(), runs, degree.data_ptr<int64_t>(), num_ids, s,
        pages.data_ptr<int64_t>(), chunks.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const at::Tensor page_off = offsets_of(pages), chunk_off = offsets_of(chunks);
  const at::Tensor first = launch_batch_check(vertices, off, dst, num_ids, nullptr, stream);
  const std::vector<int64_t> h = read_back({first, page_off.slice(0, runs), chunk_off.slice(0, runs), meta});
  raise_if_bad(h.data(), vertices, off, dst, "run_offsets", "run_dst", num_ids, op);
  const int64_t need = h[kNumBatchErrors], total_chunks = h[kNumBatchErrors + 1];
  const int64_t head = h[kNumBatchErrors + 2 + kHead], tail = h[kNumBatchErrors + 2 + kTail];
  const int64_t fresh = h[kNumBatchErrors + 2 + kFresh];
  const int64_t queued = tail - head;
  TORCH_CHECK(need <= queued + (num_pages - fresh), op, ": the pool is full: the batch needs ", need,
              " pages and ", queued + (num_pages - fresh), " of its ", num_pages, " pages are free");
  if (runs == 0) return;

  const int32_t* rw = run_weights ? static_cast<const int32_t*>(run_w.data_ptr()) : nullptr;
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    using idx_t = index_t;
    const Tickets<idx_t> tickets{page_ring.data_ptr<idx_t>(), num_pages, head, queued, fresh};
    if (need > 0) {
      grow_kernel<idx_t><<<blocks_for(need), kBlock, 0, stream>>>(
          pool.data_ptr<idx_t>(), page_owner.data_ptr<idx_t>(), page_rank.data_ptr<int32_t>(),
          root.data_ptr<idx_t>(), degree.data_ptr<int64_t>(), vertices.data_ptr<int64_t>(), off.data_ptr<int64_t>(),
          page_off.data_ptr<int64_t>(), runs, need, tickets, s);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    grown_roots_kernel<idx_t><<<blocks_for(runs), kBlock, 0, stream>>>(
        root.data_ptr<idx_t>(), height.data_ptr<int8_t>(), degree.data_ptr<int64_t>(), vertices.data_ptr<int64_t>(),
        off.data_ptr<int64_t>(), page_off.data_ptr<int64_t>(), runs, tickets, s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (total_chunks > 0) {
      auto fill = [&](auto* dst_ptr) {
        using dst_t = std::remove_const_t<std::remove_pointer_t<decltype(dst_ptr)>>;
        fill_kernel<idx_t, dst_t><<<blocks_for(chunk_threads(total_chunks)), kBlock, 0, stream>>>(
            pool.data_ptr<idx_t>(), weight_words(weights), root.data_ptr<idx_t>(), height.data_ptr<int8_t>(),
            degree.data_ptr<int64_t>(), vertices.data_ptr<int64_t>(), off.data_ptr<int64_t>(),
            chunk_off.data_ptr<int64_t>(), runs, total_chunks, dst_ptr, rw, s);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      if (dst.scalar_type() == at::kInt) {
        fill(dst.data_ptr<int32_t>());
      } else {
        fill(dst.data_ptr<int64_t>());
      }
    }
  });
  set_meta_kernel<<<1, 1, 0, stream>>>(meta.data_ptr<int64_t>(), head + std::min(need, queued), tail,
                                       fresh + std::max<int64_t>(0, need - queued));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------
// contains, find
//
// A query batch is runs of sorted destinations, one run per source vertex; every entry of every
// queried list is tested for membership in its run. A run of at least kFilterMinRun
// destinations first gets a blocked Bloom filter (one 32-bit word per test, two bits per
// destination, 16 bits of filter per destination, pow2 words), so that an entry of a long list
// (a hub, which most of a batch's entries belong to) costs one load, and only the entries the
// filter passes pay the binary search in the run. The filters of a batch are one array of
// words, run r's at filter_off[r] .. filter_off[r + 1] (none for a short run).

constexpr int64_t kFilterMinRun = 32;

// Words of run r's filter for k destinations: 0 below kFilterMinRun, else the power of two at
// or above k / 2.
__host__ __device__ __forceinline__ int64_t filter_words(int64_t k) {
  if (k < kFilterMinRun) return 0;
  int64_t w = 1;
  while (w < (k + 1) / 2) w <<= 1;
  return w;
}

struct FilterTest {
  int64_t word;
  unsigned bits;
};

__device__ __forceinline__ FilterTest filter_test(int64_t x, int64_t words) {
  const uint64_t h = sampling::mix64(static_cast<uint64_t>(x));
  return {static_cast<int64_t>(h & static_cast<uint64_t>(words - 1)),
          (1u << ((h >> 32) & 31u)) | (1u << ((h >> 40) & 31u))};
}

// Whether x may be in the run whose filter is `f` (`words` long; 0: no filter, always maybe).
__device__ __forceinline__ bool filter_may_hold(const unsigned* f, int64_t words, int64_t x) {
  if (words == 0) return true;
  const FilterTest t = filter_test(x, words);
  return (f[t.word] & t.bits) == t.bits;
}

// One warp per run with a filter: sets the bits of each of its destinations.
__global__ void filter_build_kernel(const int64_t* __restrict__ off, int64_t runs, const int64_t* __restrict__ dst,
                                    const int64_t* __restrict__ filter_off, unsigned* __restrict__ filter) {
  const int lane = lane_id();
  for (int64_t r = warp_index(); r < runs; r += warp_count()) {
    const int64_t words = filter_off[r + 1] - filter_off[r];
    if (words == 0) continue;
    for (int64_t j = off[r] + lane; j < off[r + 1]; j += kWarp) {
      const FilterTest t = filter_test(dst[j], words);
      atomicOr(filter + filter_off[r] + t.word, t.bits);
    }
  }
}

// Per run: its data pages (leaves) and its filter's words.
__global__ void query_counts_kernel(const int64_t* __restrict__ vtx, const int64_t* __restrict__ off, int64_t runs,
                                    const int64_t* __restrict__ degree, int64_t num_ids, int s,
                                    int64_t* __restrict__ leaves, int64_t* __restrict__ words) {
  for (int64_t r = thread_index(); r < runs; r += thread_count()) {
    const int64_t v = vtx[r];
    leaves[r] = (v >= 0 && v < num_ids) ? ceil_shift(degree[v], s) : 0;
    words[r] = filter_words(off[r + 1] - off[r]);
  }
}

// A checked query batch and its items, one per (run, data page of the run's list): item_off
// (runs + 1) and the item count, read back with the content check; and the runs' filters.
struct Query {
  at::Tensor pool, root, height, degree, vertices, offsets, dst, item_off, filter_off, filter;
  int64_t runs, items;
};

// The read-only arguments of the query kernels.
template <typename idx_t>
struct QueryArgs {
  const idx_t* pool;
  const idx_t* root;
  const int8_t* height;
  const int64_t* degree;
  const int64_t* vtx;
  const int64_t* off;         // run offsets into dst
  const int64_t* item_off;    // run offsets into the items
  int64_t runs, items;
  const int64_t* dst;         // sorted within each run
  const int64_t* filter_off;  // run offsets into filter (words)
  const unsigned* filter;
  int s;
};

// Items are taken kWarp at a time: lane l first describes item first + l (its run, data page and
// filter, resolved by all lanes at once), then the warp tests the items' pages kItemGroup at a
// time, with their loads in flight together.
constexpr int kItemGroup = 4;

struct LaneItem {
  int64_t i = 0;      // data page index in the vertex's list
  int64_t page = 0;   // its pool page
  int64_t deg = 0;    // the list's length
  int64_t lo = 0, hi = 0;        // the run's destinations: dst[lo .. hi)
  int64_t fbase = 0, fwords = 0;  // the run's filter
};

template <typename idx_t>
__device__ __forceinline__ LaneItem describe_item(const QueryArgs<idx_t>& a, int64_t t) {
  LaneItem m;
  if (t >= a.items) return m;
  const int64_t r = group_of(a.item_off, a.runs, t);
  const int64_t v = a.vtx[r];
  m.i = t - a.item_off[r];
  m.deg = a.degree[v];
  m.page = node_page(a.pool, static_cast<int64_t>(a.root[v]), a.height[v], 0, m.i, a.s);
  m.lo = a.off[r];
  m.hi = a.off[r + 1];
  m.fbase = a.filter_off[r];
  m.fwords = a.filter_off[r + 1] - m.fbase;
  return m;
}

// Items j0 .. j0 + kItemGroup of the chunk (described by lanes j0.. of `mine`), entries k0 + lane
// of their pages: j[u] = the index in dst of the entry's id, -1 when not in the run (or no entry,
// or item j0 + u >= count). Warp-collective.
template <typename idx_t>
__device__ __forceinline__ void test_items(const QueryArgs<idx_t>& a, const LaneItem& mine, int j0, int count,
                                           int64_t k0, int lane, int64_t (&j)[kItemGroup]) {
  const int64_t size = int64_t(1) << a.s;
  int64_t x[kItemGroup], lo[kItemGroup], hi[kItemGroup], fbase[kItemGroup], fwords[kItemGroup];
  bool valid[kItemGroup];
#pragma unroll
  for (int u = 0; u < kItemGroup; ++u) {
    const int src = (j0 + u) & (kWarp - 1);
    const int64_t i = __shfl_sync(kFull, mine.i, src), page = __shfl_sync(kFull, mine.page, src);
    const int64_t deg = __shfl_sync(kFull, mine.deg, src);
    lo[u] = __shfl_sync(kFull, mine.lo, src);
    hi[u] = __shfl_sync(kFull, mine.hi, src);
    fbase[u] = __shfl_sync(kFull, mine.fbase, src);
    fwords[u] = __shfl_sync(kFull, mine.fwords, src);
    const int64_t k = k0 + lane;
    valid[u] = j0 + u < count && k < size && (i << a.s) + k < deg;
    x[u] = valid[u] ? static_cast<int64_t>(a.pool[(page << a.s) + k]) : 0;
  }
  bool maybe[kItemGroup];
#pragma unroll
  for (int u = 0; u < kItemGroup; ++u) maybe[u] = valid[u] && filter_may_hold(a.filter + fbase[u], fwords[u], x[u]);
#pragma unroll
  for (int u = 0; u < kItemGroup; ++u) j[u] = maybe[u] ? sorted_find(a.dst, lo[u], hi[u], x[u]) : -1;
}

template <typename idx_t>
__global__ void contains_kernel(const QueryArgs<idx_t> a, bool* __restrict__ found) {
  const int lane = lane_id();
  const int64_t size = int64_t(1) << a.s;
  for (int64_t first = warp_index() * kWarp; first < a.items; first += warp_count() * kWarp) {
    const LaneItem mine = describe_item(a, first + lane);
    const int count = static_cast<int>(imin(kWarp, a.items - first));
    for (int j0 = 0; j0 < count; j0 += kItemGroup) {
      for (int64_t k0 = 0; k0 < size; k0 += kWarp) {
        int64_t j[kItemGroup];
        test_items(a, mine, j0, count, k0, lane, j);
#pragma unroll
        for (int u = 0; u < kItemGroup; ++u)
          if (j[u] >= 0) found[j[u]] = true;
      }
    }
  }
}

// Steps of 32 entries per data page (one hit mask each).
__host__ __device__ __forceinline__ int64_t page_steps(int s) {
  return ((int64_t(1) << s) + kWarp - 1) / kWarp;
}

// find's first pass: masks[item * steps + step] = the entries of the step that are in the run;
// item_count[item] = their number.
template <typename idx_t>
__global__ void find_mask_kernel(const QueryArgs<idx_t> a, unsigned* __restrict__ masks,
                                 int64_t* __restrict__ item_count) {
  const int lane = lane_id();
  const int64_t size = int64_t(1) << a.s, steps = page_steps(a.s);
  for (int64_t first = warp_index() * kWarp; first < a.items; first += warp_count() * kWarp) {
    const LaneItem mine = describe_item(a, first + lane);
    const int count = static_cast<int>(imin(kWarp, a.items - first));
    for (int j0 = 0; j0 < count; j0 += kItemGroup) {
      int64_t hits[kItemGroup] = {};
      for (int64_t k0 = 0; k0 < size; k0 += kWarp) {
        int64_t j[kItemGroup];
        test_items(a, mine, j0, count, k0, lane, j);
#pragma unroll
        for (int u = 0; u < kItemGroup; ++u) {
          const unsigned m = __ballot_sync(kFull, j[u] >= 0);
          if (lane == 0 && j0 + u < count) masks[(first + j0 + u) * steps + k0 / kWarp] = m;
          hits[u] += __popc(m);
        }
      }
#pragma unroll
      for (int u = 0; u < kItemGroup; ++u)
        if (lane == 0 && j0 + u < count) item_count[first + j0 + u] = hits[u];
    }
  }
}

// find's second pass: the list positions of the masked entries, item by item, ascending
// (out[item_pos[item] ...]). Items kWarp at a time: each lane tells whether its item has hits
// (item_pos: item_count's exclusive sums, items + 1 of them) and finds its page index in its
// list (from item_page where the first pass wrote it for the items with hits, else by a search
// of item_off), then the warp writes the items with hits one by one, so items without any cost
// one load (a vertex deletion tests long lists that hold few of the deleted ids).
__global__ void find_write_kernel(const int64_t* __restrict__ item_off, int64_t runs, int64_t items,
                                  const unsigned* __restrict__ masks, const int64_t* __restrict__ item_pos,
                                  const int64_t* __restrict__ item_page, int64_t* __restrict__ out, int s) {
  const int lane = lane_id();
  const int64_t steps = page_steps(s);
  for (int64_t first = warp_index() * kWarp; first < items; first += warp_count() * kWarp) {
    const int64_t t = first + lane;
    const bool hits = t < items && item_pos[t + 1] > item_pos[t];
    const int64_t mine = !hits ? 0 : item_page ? item_page[t] : t - item_off[group_of(item_off, runs, t)];
    unsigned active = __ballot_sync(kFull, hits);
    while (active) {
      const int u = __ffs(active) - 1;
      active &= active - 1;
      const int64_t item = first + u;
      const int64_t i = __shfl_sync(kFull, mine, u);
      int64_t written = item_pos[item];
      for (int64_t step = 0; step < steps; ++step) {
        const unsigned m = masks[item * steps + step];
        if ((m >> lane) & 1u) out[written + __popc(m & ((1u << lane) - 1u))] = (i << s) + step * kWarp + lane;
        written += __popc(m);
      }
    }
  }
}

Query prepare_query(const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height,
                    const at::Tensor& degree, const at::Tensor& vertices, const at::Tensor& run_offsets,
                    const at::Tensor& run_dst, int s, cudaStream_t stream, const char* op) {
  check_reader(pool, root, height, degree, s, kCuda, op);
  check_runs(pool, vertices, run_offsets, run_dst, "run_offsets", "run_dst", op);
  Query q{pool.contiguous(),   root.contiguous(),        height.contiguous(),   degree.contiguous(),
          vertices.contiguous(), run_offsets.contiguous(), run_dst.contiguous(), at::Tensor(),
          at::Tensor(),        at::Tensor(),             vertices.numel(),      0};
  const int64_t num_ids = q.root.numel();
  at::Tensor leaves = at::zeros({q.runs}, q.vertices.options());
  at::Tensor words = at::zeros({q.runs}, q.vertices.options());
  if (q.runs > 0) {
    query_counts_kernel<<<blocks_for(q.runs), kBlock, 0, stream>>>(
        q.vertices.data_ptr<int64_t>(), q.offsets.data_ptr<int64_t>(), q.runs, q.degree.data_ptr<int64_t>(), num_ids,
        s, leaves.data_ptr<int64_t>(), words.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  q.item_off = offsets_of(leaves);
  q.filter_off = offsets_of(words);
  const at::Tensor first = launch_batch_check(q.vertices, q.offsets, q.dst, num_ids, nullptr, stream);
  const std::vector<int64_t> h = read_back({first, q.item_off.slice(0, q.runs), q.filter_off.slice(0, q.runs)});
  raise_if_bad(h.data(), q.vertices, q.offsets, q.dst, "run_offsets", "run_dst", num_ids, op);
  q.items = h[kNumBatchErrors];
  const int64_t filter_words_total = h[kNumBatchErrors + 1];
  q.filter = at::zeros({std::max<int64_t>(filter_words_total, 1)}, q.vertices.options().dtype(at::kInt));
  if (filter_words_total > 0) {
    filter_build_kernel<<<blocks_for(q.runs * kWarp), kBlock, 0, stream>>>(
        q.offsets.data_ptr<int64_t>(), q.runs, q.dst.data_ptr<int64_t>(), q.filter_off.data_ptr<int64_t>(),
        reinterpret_cast<unsigned*>(q.filter.data_ptr<int32_t>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return q;
}

template <typename idx_t>
QueryArgs<idx_t> query_args(const Query& q, int s) {
  return QueryArgs<idx_t>{q.pool.data_ptr<idx_t>(),
                          q.root.data_ptr<idx_t>(),
                          q.height.data_ptr<int8_t>(),
                          q.degree.data_ptr<int64_t>(),
                          q.vertices.data_ptr<int64_t>(),
                          q.offsets.data_ptr<int64_t>(),
                          q.item_off.data_ptr<int64_t>(),
                          q.runs,
                          q.items,
                          q.dst.data_ptr<int64_t>(),
                          q.filter_off.data_ptr<int64_t>(),
                          reinterpret_cast<const unsigned*>(q.filter.data_ptr<int32_t>()),
                          s};
}

at::Tensor contains_cuda(const at::Tensor& pool_in, const at::Tensor& root_in, const at::Tensor& height_in,
                         const at::Tensor& degree_in, const at::Tensor& vertices_in, const at::Tensor& run_offsets_in,
                         const at::Tensor& run_dst_in, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_contains";
  const int s = page_shift(page_size, op);
  const c10::cuda::OptionalCUDAGuard guard(pool_in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const Query q = prepare_query(pool_in, root_in, height_in, degree_in, vertices_in, run_offsets_in, run_dst_in, s,
                                stream, op);
  at::Tensor found = at::zeros({q.dst.numel()}, q.dst.options().dtype(at::kBool));
  if (q.items == 0) return found;
  AT_DISPATCH_INDEX_TYPES(q.pool.scalar_type(), op, [&] {
    contains_kernel<index_t><<<blocks_for(chunk_threads(q.items)), kBlock, 0, stream>>>(query_args<index_t>(q, s),
                                                                                      found.data_ptr<bool>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return found;
}

std::tuple<at::Tensor, at::Tensor> find_cuda(const at::Tensor& pool_in, const at::Tensor& root_in,
                                             const at::Tensor& height_in, const at::Tensor& degree_in,
                                             const at::Tensor& vertices_in, const at::Tensor& run_offsets_in,
                                             const at::Tensor& run_dst_in, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_find";
  const int s = page_shift(page_size, op);
  const c10::cuda::OptionalCUDAGuard guard(pool_in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const Query q = prepare_query(pool_in, root_in, height_in, degree_in, vertices_in, run_offsets_in, run_dst_in, s,
                                stream, op);
  const auto opts = q.vertices.options();
  if (q.items == 0) return {at::zeros({q.runs + 1}, opts), at::empty({0}, opts)};
  at::Tensor item_count = at::empty({q.items}, opts);
  at::Tensor masks = at::empty({q.items * page_steps(s)}, opts.dtype(at::kInt));
  auto* m = reinterpret_cast<unsigned*>(masks.data_ptr<int32_t>());
  AT_DISPATCH_INDEX_TYPES(q.pool.scalar_type(), op, [&] {
    find_mask_kernel<index_t><<<blocks_for(chunk_threads(q.items)), kBlock, 0, stream>>>(
        query_args<index_t>(q, s), m, item_count.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  const at::Tensor item_pos = offsets_of(item_count);
  at::Tensor positions = at::empty({item_pos.slice(0, q.items).item<int64_t>()}, opts);
  if (positions.numel() > 0) {
    find_write_kernel<<<blocks_for(chunk_threads(q.items)), kBlock, 0, stream>>>(
        q.item_off.data_ptr<int64_t>(), q.runs, q.items, m, item_pos.data_ptr<int64_t>(), nullptr,
        positions.data_ptr<int64_t>(), s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  // Run r's positions start where its first item's do.
  return {item_pos.index_select(0, q.item_off), positions};
}

// ---------------------------------------------------------------------------------------------
// find_marked: the items of find (one per (run, data page)), each entry tested against a mask
// of vertex ids (one load, no per-run search), or taken whole when the run's vertex is marked.

// Per run: its data pages and (`supers`, when given) its groups of up to 2^s data pages under
// one level-1 node, the whole list for a one-page list; the first vertex that is out of range
// or not above the previous one.
__global__ void marked_counts_kernel(const int64_t* __restrict__ vtx, int64_t runs, const int64_t* __restrict__ degree,
                                     int64_t num_ids, int s, int64_t* __restrict__ leaves,
                                     int64_t* __restrict__ supers, unsigned long long* __restrict__ first) {
  for (int64_t r = thread_index(); r < runs; r += thread_count()) {
    if (!vertex_ok(vtx, r, num_ids, true)) {
      atomicMin(&first[kBadVertex], r);
      leaves[r] = 0;
      if (supers) supers[r] = 0;
      continue;
    }
    leaves[r] = ceil_shift(degree[vtx[r]], s);
    if (supers) supers[r] = ceil_shift(leaves[r], s);
  }
}

// The items of a marked-vertex batch (one per (vertex, data page of its list)): item_off (runs
// + 1) and their number and, with `with_supers`, the same for the groups of data pages under
// one level-1 node (super_off, supers); read back with the check of the vertices (ascending,
// in range), which raises for the first bad one. The op's one synchronisation.
struct MarkedItems {
  at::Tensor item_off;
  int64_t items;
  at::Tensor super_off;
  int64_t supers;
};

MarkedItems marked_items(const at::Tensor& vertices, const at::Tensor& degree, int64_t num_ids, int s,
                         cudaStream_t stream, const char* op, bool with_supers = false) {
  const int64_t runs = vertices.numel();
  const auto opts = vertices.options();
  at::Tensor leaves = at::empty({runs}, opts);  // the counts kernel writes every entry
  at::Tensor supers = with_supers ? at::empty({runs}, opts) : at::Tensor();
  at::Tensor first = at::full({kNumBatchErrors}, LLONG_MAX, opts);
  if (runs > 0) {
    marked_counts_kernel<<<blocks_for(runs), kBlock, 0, stream>>>(
        vertices.data_ptr<int64_t>(), runs, degree.data_ptr<int64_t>(), num_ids, s, leaves.data_ptr<int64_t>(),
        with_supers ? supers.data_ptr<int64_t>() : nullptr,
        reinterpret_cast<unsigned long long*>(first.data_ptr<int64_t>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  at::Tensor item_off = offsets_of(leaves);
  at::Tensor super_off = with_supers ? offsets_of(supers) : at::Tensor();
  std::vector<at::Tensor> back{first, item_off.slice(0, runs)};
  if (with_supers) back.push_back(super_off.slice(0, runs));
  const std::vector<int64_t> h = read_back(back);
  raise_if_bad(h.data(), vertices, vertices, vertices, "pos_offsets", "positions", num_ids, op);
  return {item_off, h[kNumBatchErrors], super_off, with_supers ? h[kNumBatchErrors + 1] : 0};
}

// find_marked's coarse mask: bit b is set when an id in [b << shift, (b + 1) << shift) is
// marked. The mask kernel holds it in shared memory, so an entry costs a global load only when
// its bit is set; the shift is the smallest that fits the block's shared memory (0, exact,
// up to kCoarseBytesMax * 8 ids). That load reads the exact mask as bits (one bit per id, an
// eighth of the bool mask's bytes, so it stays in L2 beside the pages streaming past); at shift
// 0 the coarse words are those bits.
constexpr int kMarkedBlock = 1024;
constexpr int kMarkedGroup = 8;  // items whose page loads a warp keeps in flight together
static_assert((1 << kMaxPageShift) < (1 << 16), "find_marked packs a page's entry count in 16 bits");
constexpr int64_t kCoarseBytesMax = 192 * 1024;

struct CoarseMask {
  at::Tensor words;  // int32 bit words, (num_ids >> shift) bits rounded up
  int shift;
  int64_t bytes;
  at::Tensor exact;  // int32 bit words, one bit per id (num_ids bits rounded up); `words` at shift 0
};

__global__ void coarse_mask_kernel(const bool* __restrict__ mask, int64_t num_ids, int shift,
                                   unsigned* __restrict__ words, unsigned* __restrict__ exact) {
  for (int64_t id = thread_index(); id < num_ids; id += thread_count()) {
    if (mask[id]) {
      const int64_t b = id >> shift;
      atomicOr(&words[b >> 5], 1u << (b & 31));
      if (exact) atomicOr(&exact[id >> 5], 1u << (id & 31));
    }
  }
}

CoarseMask coarse_mask(const at::Tensor& mask, int64_t num_ids, cudaStream_t stream) {
  int device = 0, optin = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int64_t cap = std::min<int64_t>(kCoarseBytesMax, optin);
  int shift = 0;
  auto bytes_at = [&](int sh) { return std::max<int64_t>(1, ((num_ids >> sh) + 32) / 32) * 4; };
  while (bytes_at(shift) > cap) ++shift;
  const at::Tensor words = at::zeros({bytes_at(shift) / 4}, mask.options().dtype(at::kInt));
  CoarseMask c{words, shift, bytes_at(shift),
               shift == 0 ? words : at::zeros({bytes_at(0) / 4}, mask.options().dtype(at::kInt))};
  if (num_ids > 0) {
    coarse_mask_kernel<<<blocks_for(num_ids), kBlock, 0, stream>>>(
        mask.data_ptr<bool>(), num_ids, shift, reinterpret_cast<unsigned*>(c.words.data_ptr<int32_t>()),
        shift == 0 ? nullptr : reinterpret_cast<unsigned*>(c.exact.data_ptr<int32_t>()));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return c;
}

// masks[item * steps + step] = the entries of the step that are marked (all of them when the
// item's vertex is); item_count[item] = their number; item_page[item] = the item's page index
// in its list, for the items with hits only. A warp takes kWarp super items (groups of up to
// 2^s data pages under one level-1 node, see marked_items) at a time, the next kWarp not yet
// taken (`next`, a counter starting at 0: a hub's groups hold up to 2^s times the pages of a
// short list's, so a fixed share of groups per warp would leave the GPU waiting for the warps
// that drew hubs): lane l finds super item first + l
// (its run from super_run, its level-1 node by a walk of the tree), then the warp
// reads the groups' data pages as one flat sequence, kMarkedGroup pages in flight, each lane
// first reading the page id of one of them from its level-1 node. The items of consecutive
// super items are consecutive, so flat page q is item (first super item's first item) + q.
// An entry is looked up in `exact` (the mask's bits) only when its coarse bit (shared memory)
// is set; a step's lookups are issued together before its ballots.
template <typename idx_t>
__global__ void __launch_bounds__(kMarkedBlock) find_marked_mask_kernel(
    const idx_t* __restrict__ pool, const idx_t* __restrict__ root, const int8_t* __restrict__ height,
    const int64_t* __restrict__ degree, const int64_t* __restrict__ vtx, const int64_t* __restrict__ item_off,
    const int64_t* __restrict__ super_off, const int64_t* __restrict__ super_run, int64_t supers,
    const unsigned* __restrict__ exact, const unsigned* __restrict__ coarse, int64_t coarse_words, int coarse_shift,
    int64_t num_ids,
    unsigned* __restrict__ masks, int64_t* __restrict__ item_count, int64_t* __restrict__ item_page,
    unsigned long long* __restrict__ next, int s) {
  extern __shared__ unsigned shared_coarse[];
  for (int64_t w = threadIdx.x; w < coarse_words; w += blockDim.x) shared_coarse[w] = coarse[w];
  __syncthreads();
  const int lane = lane_id();
  const int64_t size = int64_t(1) << s, steps = page_steps(s);
  while (true) {
    unsigned long long taken = 0;
    if (lane == 0) taken = atomicAdd(next, 1ull);
    const int64_t first = static_cast<int64_t>(__shfl_sync(kFull, taken, 0)) * kWarp;
    if (first >= supers) break;
    // This lane's super item: its level-1 node (the root of a one-page list), its data pages,
    // the list index of the first, the first's item, the list's degree, whether it goes whole.
    int64_t node = 0, pages = 0, page0 = 0, item0 = 0, deg = 0;
    int flags = 0;  // 1: one-page list (node is the data page), 2: whole
    const int64_t t = first + lane;
    if (t < supers) {
      const int64_t r = super_run[t];
      const int64_t v = vtx[r], c = t - super_off[r];
      const int h = height[v];
      deg = degree[v];
      page0 = c << s;
      pages = imin(size, ceil_shift(deg, s) - page0);
      item0 = item_off[r] + page0;
      flags = (h == 0 ? 1 : 0) | (((exact[v >> 5] >> (v & 31)) & 1u) ? 2 : 0);
      node = h == 0 ? static_cast<int64_t>(root[v]) : node_page(pool, static_cast<int64_t>(root[v]), h, 1, c, s);
    }
    int64_t start = pages;  // inclusive scan of pages, then exclusive
#pragma unroll
    for (int d = 1; d < kWarp; d <<= 1) {
      const int64_t y = __shfl_up_sync(kFull, start, d);
      if (lane >= d) start += y;
    }
    const int64_t total = __shfl_sync(kFull, start, kWarp - 1);
    start -= pages;
    const int64_t base_item = __shfl_sync(kFull, item0, 0);
    for (int64_t q0 = 0; q0 < total; q0 += kWarp) {
      // This lane's flat page q: its owner (the last lane whose start is <= q, which has pages),
      // page id, list page index, entries on it and whether it goes whole.
      const int64_t q = q0 + lane;
      int owner = 0;
#pragma unroll
      for (int step = kWarp / 2; step > 0; step >>= 1) {
        const int64_t at = __shfl_sync(kFull, start, owner + step);
        if (at <= q) owner += step;
      }
      const int64_t o_start = __shfl_sync(kFull, start, owner), o_node = __shfl_sync(kFull, node, owner);
      const int64_t o_page0 = __shfl_sync(kFull, page0, owner), o_deg = __shfl_sync(kFull, deg, owner);
      const int o_flags = __shfl_sync(kFull, flags, owner);
      const int64_t j = q - o_start, i = o_page0 + j;
      // code: the entries on the page (at most 2^kMaxPageShift), bit 16 set when it goes whole.
      int64_t pid = 0;
      int code = 0;
      if (q < total) {
        code = static_cast<int>(imin(size, o_deg - (i << s))) | ((o_flags & 2) << 15);
        pid = (o_flags & 1) ? o_node : (o_flags & 2) ? 0 : static_cast<int64_t>(pool[(o_node << s) + j]);
      }
      const int nq = static_cast<int>(imin(kWarp, total - q0));
      for (int g0 = 0; g0 < nq; g0 += kMarkedGroup) {
        int my_count = 0;  // lanes u < kMarkedGroup: hits on flat page q0 + g0 + u
        for (int64_t k0 = 0; k0 < size; k0 += kWarp) {
          idx_t x[kMarkedGroup];
          unsigned valid = 0, whole = 0;  // bit u: page g0 + u
#pragma unroll
          for (int u = 0; u < kMarkedGroup; ++u) {
            const int src = (g0 + u) & (kWarp - 1);
            const int64_t page = __shfl_sync(kFull, pid, src);
            const int c = __shfl_sync(kFull, code, src);
            const bool ok = g0 + u < nq && k0 + lane < (c & 0xffff), w = (c >> 16) != 0;
            valid |= unsigned(ok) << u;
            whole |= unsigned(w) << u;
            x[u] = ok && !w ? pool[(page << s) + k0 + lane] : idx_t(-1);
          }
          bool hit[kMarkedGroup];
#pragma unroll
          for (int u = 0; u < kMarkedGroup; ++u) {
            const bool ok = (valid >> u) & 1u, w = (whole >> u) & 1u;
            hit[u] = ok && w;
            if (ok && !w && x[u] >= 0 && x[u] < num_ids) {
              const int64_t b = static_cast<int64_t>(x[u]) >> coarse_shift;
              if ((shared_coarse[b >> 5] >> (b & 31)) & 1u) {
                hit[u] = ((exact[static_cast<int64_t>(x[u]) >> 5] >> (x[u] & 31)) & 1u) != 0;
              }
            }
          }
          unsigned word = 0;
#pragma unroll
          for (int u = 0; u < kMarkedGroup; ++u) {
            const unsigned m = __ballot_sync(kFull, hit[u]);
            if (lane == u) {
              word = m;
              my_count += __popc(m);
            }
          }
          if (lane < kMarkedGroup && g0 + lane < nq) masks[(base_item + q0 + g0 + lane) * steps + k0 / kWarp] = word;
        }
        const int64_t my_i = __shfl_sync(kFull, i, (g0 + lane) & (kWarp - 1));
        if (lane < kMarkedGroup && g0 + lane < nq) {
          const int64_t item = base_item + q0 + g0 + lane;
          item_count[item] = my_count;
          if (my_count > 0) item_page[item] = my_i;
        }
      }
    }
  }
}

// run_of[t] = r for every t in [off[r], off[r + 1]): the run of each item, written once so that
// a kernel whose warps take consecutive items does not search `off` per lane (a search is a
// chain of dependent loads, which for one-page lists cost more than reading the page).
__global__ void runs_of_kernel(const int64_t* __restrict__ off, int64_t runs, int64_t* __restrict__ run_of) {
  for (int64_t r = thread_index(); r < runs; r += thread_count()) {
    const int64_t end = off[r + 1];
    for (int64_t t = off[r]; t < end; ++t) run_of[t] = r;
  }
}

// Blocks of the mask kernel: one per SM (each holds the coarse mask), fewer for few items.
int marked_blocks(int64_t items) {
  int device = 0, sms = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  const int64_t wanted = (chunk_threads(items) + kMarkedBlock - 1) / kMarkedBlock;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, sms)));
}

std::tuple<at::Tensor, at::Tensor> find_marked_cuda(const at::Tensor& pool_in, const at::Tensor& root_in,
                                                    const at::Tensor& height_in, const at::Tensor& degree_in,
                                                    const at::Tensor& vertices_in, const at::Tensor& mask_in,
                                                    int64_t page_size) {
  constexpr const char* op = "dynamic_graph_find_marked";
  const int s = page_shift(page_size, op);
  check_reader(pool_in, root_in, height_in, degree_in, s, kCuda, op);
  check_marked_vertices(pool_in, vertices_in);
  check_mask(mask_in, root_in, pool_in, op);
  const c10::cuda::OptionalCUDAGuard guard(pool_in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor pool = pool_in.contiguous(), root = root_in.contiguous(), height = height_in.contiguous(),
                   degree = degree_in.contiguous(), vertices = vertices_in.contiguous(), mask = mask_in.contiguous();
  const int64_t runs = vertices.numel(), num_ids = root.numel();
  const auto opts = vertices.options();
  const MarkedItems marked = marked_items(vertices, degree, num_ids, s, stream, op, /*with_supers=*/true);
  const at::Tensor& item_off = marked.item_off;
  const int64_t items = marked.items;
  if (items == 0) return {at::zeros({runs + 1}, opts), at::empty({0}, opts)};
  at::Tensor item_count = at::empty({items}, opts);
  at::Tensor item_page = at::empty({items}, opts);
  at::Tensor masks = at::empty({items * page_steps(s)}, opts.dtype(at::kInt));
  auto* m = reinterpret_cast<unsigned*>(masks.data_ptr<int32_t>());
  const CoarseMask coarse = coarse_mask(mask, num_ids, stream);
  at::Tensor next = at::zeros({1}, opts);
  at::Tensor super_run = at::empty({marked.supers}, opts);  // every entry written (the supers of every run)
  runs_of_kernel<<<blocks_for(runs), kBlock, 0, stream>>>(marked.super_off.data_ptr<int64_t>(), runs,
                                                           super_run.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    auto kernel = find_marked_mask_kernel<index_t>;
    C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(coarse.bytes)));
    kernel<<<marked_blocks(marked.supers), kMarkedBlock, coarse.bytes, stream>>>(
        pool.data_ptr<index_t>(), root.data_ptr<index_t>(), height.data_ptr<int8_t>(), degree.data_ptr<int64_t>(),
        vertices.data_ptr<int64_t>(), item_off.data_ptr<int64_t>(), marked.super_off.data_ptr<int64_t>(),
        super_run.data_ptr<int64_t>(), marked.supers,
        reinterpret_cast<const unsigned*>(coarse.exact.data_ptr<int32_t>()),
        reinterpret_cast<const unsigned*>(coarse.words.data_ptr<int32_t>()),
        coarse.bytes / 4, coarse.shift, num_ids, m, item_count.data_ptr<int64_t>(), item_page.data_ptr<int64_t>(),
        reinterpret_cast<unsigned long long*>(next.data_ptr<int64_t>()), s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  const at::Tensor item_pos = offsets_of(item_count);
  at::Tensor positions = at::empty({item_pos.slice(0, items).item<int64_t>()}, opts);
  if (positions.numel() > 0) {
    find_write_kernel<<<blocks_for(chunk_threads(items)), kBlock, 0, stream>>>(
        item_off.data_ptr<int64_t>(), runs, items, m, item_pos.data_ptr<int64_t>(), item_page.data_ptr<int64_t>(),
        positions.data_ptr<int64_t>(), s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {item_pos.index_select(0, item_off), positions};
}

// ---------------------------------------------------------------------------------------------
// mark_neighbours: the items of find_marked (one per (run, data page)); every entry's id is
// marked. Items kWarp at a time: lane l describes item first + l, then the warp reads the
// items' pages kItemGroup at a time, their loads in flight together.

template <typename idx_t>
__global__ void mark_neighbours_kernel(const idx_t* __restrict__ pool, const idx_t* __restrict__ root,
                                       const int8_t* __restrict__ height, const int64_t* __restrict__ degree,
                                       const int64_t* __restrict__ vtx, const int64_t* __restrict__ item_off,
                                       int64_t runs, int64_t items, int64_t num_ids, bool* __restrict__ marks, int s) {
  const int lane = lane_id();
  const int64_t size = int64_t(1) << s;
  for (int64_t first = warp_index() * kWarp; first < items; first += warp_count() * kWarp) {
    int64_t my_page = 0, my_len = 0;  // this lane's item: its pool page and the entries on it
    const int64_t t = first + lane;
    if (t < items) {
      const int64_t r = group_of(item_off, runs, t);
      const int64_t v = vtx[r];
      const int64_t i = t - item_off[r];
      my_len = imin(size, degree[v] - (i << s));
      my_page = node_page(pool, static_cast<int64_t>(root[v]), height[v], 0, i, s);
    }
    const int count = static_cast<int>(imin(kWarp, items - first));
    for (int j0 = 0; j0 < count; j0 += kItemGroup) {
      for (int64_t k0 = 0; k0 < size; k0 += kWarp) {
        int64_t x[kItemGroup];
#pragma unroll
        for (int u = 0; u < kItemGroup; ++u) {
          const int src = (j0 + u) & (kWarp - 1);
          const int64_t page = __shfl_sync(kFull, my_page, src), len = __shfl_sync(kFull, my_len, src);
          const int64_t k = k0 + lane;
          x[u] = j0 + u < count && k < len ? static_cast<int64_t>(pool[(page << s) + k]) : -1;
        }
#pragma unroll
        for (int u = 0; u < kItemGroup; ++u)
          if (x[u] >= 0 && x[u] < num_ids) marks[x[u]] = true;
      }
    }
  }
}

at::Tensor mark_neighbours_cuda(const at::Tensor& pool_in, const at::Tensor& root_in, const at::Tensor& height_in,
                                const at::Tensor& degree_in, const at::Tensor& vertices_in, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_mark_neighbours";
  const int s = page_shift(page_size, op);
  check_reader(pool_in, root_in, height_in, degree_in, s, kCuda, op);
  check_marked_vertices(pool_in, vertices_in);
  const c10::cuda::OptionalCUDAGuard guard(pool_in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor pool = pool_in.contiguous(), root = root_in.contiguous(), height = height_in.contiguous(),
                   degree = degree_in.contiguous(), vertices = vertices_in.contiguous();
  const int64_t runs = vertices.numel(), num_ids = root.numel();
  const MarkedItems marked = marked_items(vertices, degree, num_ids, s, stream, op);
  const at::Tensor& item_off = marked.item_off;
  const int64_t items = marked.items;
  at::Tensor marks = at::zeros({num_ids}, root.options().dtype(at::kBool));
  if (items == 0) return marks;
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    mark_neighbours_kernel<index_t><<<blocks_for(chunk_threads(items)), kBlock, 0, stream>>>(
        pool.data_ptr<index_t>(), root.data_ptr<index_t>(), height.data_ptr<int8_t>(), degree.data_ptr<int64_t>(),
        vertices.data_ptr<int64_t>(), item_off.data_ptr<int64_t>(), runs, items, num_ids, marks.data_ptr<bool>(), s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return marks;
}

// ---------------------------------------------------------------------------------------------
// Page sweeps: each lane tests one page of a 32-page tile, then the warp walks the active ones.

template <typename Active, typename Body>
__device__ __forceinline__ void for_each_active_page(int64_t pages, Active&& active, Body&& body) {
  const int lane = lane_id();
  for (int64_t base = warp_index() * kWarp; base < pages; base += warp_count() * kWarp) {
    const int64_t mine = base + lane;
    unsigned mask = __ballot_sync(kFull, mine < pages && active(mine));
    while (mask) {
      const int k = __ffs(mask) - 1;
      mask &= mask - 1;
      body(base + k, lane);
    }
  }
}

template <typename idx_t>
__device__ __forceinline__ bool data_page_of(const idx_t* owner, const int32_t* rank, int64_t p, int64_t num_ids) {
  const int64_t v = static_cast<int64_t>(owner[p]);
  return v >= 0 && v < num_ids && rank[p] >= 0;
}

// kCount: page_count[p] = hits on page p; else writes key (vertex << 32 | position) of each hit
// (list positions below 2^32).
template <typename idx_t, bool kCount>
__global__ void touching_kernel(const idx_t* __restrict__ pool, const int64_t* __restrict__ degree,
                                const idx_t* __restrict__ owner, const int32_t* __restrict__ rank,
                                const int64_t* __restrict__ meta, int64_t num_ids, const bool* __restrict__ mask,
                                int64_t* __restrict__ page_count, const int64_t* __restrict__ page_pos,
                                int64_t* __restrict__ keys, int s) {
  const int64_t size = int64_t(1) << s;
  for_each_active_page(
      meta[kFresh], [&](int64_t p) { return data_page_of(owner, rank, p, num_ids); },
      [&](int64_t p, int lane) {
        const int64_t v = static_cast<int64_t>(owner[p]);
        const int64_t i = rank[p];
        const int64_t deg = degree[v];
        const bool whole = mask[v];
        int64_t written = kCount ? 0 : page_pos[p];
        for (int64_t k0 = 0; k0 < size; k0 += kWarp) {
          const int64_t k = k0 + lane, pos = (i << s) + k;
          bool hit = false;
          if (k < size && pos < deg) {
            const int64_t x = static_cast<int64_t>(pool[(p << s) + k]);
            hit = whole || (x >= 0 && x < num_ids && mask[x]);
          }
          const unsigned m = __ballot_sync(kFull, hit);
          if (!kCount && hit) keys[written + __popc(m & ((1u << lane) - 1u))] = (v << 32) | pos;
          written += __popc(m);
        }
        if (kCount && lane == 0) page_count[p] = written;
      });
}

std::tuple<at::Tensor, at::Tensor> find_touching_cuda(const at::Tensor& pool_in, const at::Tensor& root_in,
                                                      const at::Tensor& height_in, const at::Tensor& degree_in,
                                                      const at::Tensor& page_owner_in, const at::Tensor& page_rank_in,
                                                      const at::Tensor& meta_in, const at::Tensor& mask_in,
                                                      int64_t page_size) {
  constexpr const char* op = "dynamic_graph_find_touching";
  const int s = page_shift(page_size, op);
  const int64_t num_pages =
      check_sweeper(pool_in, root_in, height_in, degree_in, page_owner_in, page_rank_in, meta_in, s, kCuda, op);
  check_mask(mask_in, root_in, pool_in, op);
  const c10::cuda::OptionalCUDAGuard guard(pool_in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor pool = pool_in.contiguous(), degree = degree_in.contiguous(), owner = page_owner_in.contiguous(),
                   rank = page_rank_in.contiguous(), meta = meta_in.contiguous(), mask = mask_in.contiguous();
  const int64_t num_ids = root_in.numel();
  TORCH_CHECK_VALUE(num_ids < (int64_t(1) << 31), op, ": supports up to 2^31 vertex ids, got ", num_ids);
  at::Tensor page_count = at::zeros({num_pages}, degree.options());
  at::Tensor keys;
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    auto launch = [&](auto counting, const int64_t* page_pos, int64_t* out) {
      if (num_pages == 0) return;
      touching_kernel<index_t, decltype(counting)::value><<<blocks_for(num_pages), kBlock, 0, stream>>>(
          pool.data_ptr<index_t>(), degree.data_ptr<int64_t>(), owner.data_ptr<index_t>(), rank.data_ptr<int32_t>(),
          meta.data_ptr<int64_t>(), num_ids, mask.data_ptr<bool>(), page_count.data_ptr<int64_t>(), page_pos, out, s);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    launch(std::true_type{}, nullptr, nullptr);
    const at::Tensor page_pos = offsets_of(page_count);
    keys = at::empty({page_pos.slice(0, num_pages).item<int64_t>()}, degree.options());
    launch(std::false_type{}, page_pos.data_ptr<int64_t>(), keys.data_ptr<int64_t>());
  });
  keys = std::get<0>(keys.sort());
  return {keys.bitwise_right_shift(32), keys.bitwise_and((int64_t(1) << 32) - 1)};
}

// ---------------------------------------------------------------------------------------------
// remove

template <typename idx_t>
__global__ void compact_kernel(idx_t* pool, int32_t* weights, const idx_t* __restrict__ root,
                               const int8_t* __restrict__ height, const int64_t* __restrict__ degree,
                               const int64_t* __restrict__ vtx, const int64_t* __restrict__ off, int64_t runs,
                               int64_t total, const int64_t* __restrict__ positions, int s) {
  for (int64_t t = thread_index(); t < total; t += thread_count()) {
    const int64_t r = group_of(off, runs, t);
    const int64_t v = vtx[r];
    const int64_t holes = off[r + 1] - off[r], k = t - off[r];
    const int64_t d1 = degree[v] - holes;
    const int64_t to = compaction_target(positions + off[r], holes, d1, k);
    if (to < 0) continue;
    const int64_t rt = static_cast<int64_t>(root[v]);
    const int64_t from_slot = entry_slot(pool, rt, height[v], d1 + k, s);
    const int64_t to_slot = entry_slot(pool, rt, height[v], to, s);
    pool[to_slot] = pool[from_slot];
    if (weights) weights[to_slot] = weights[from_slot];
  }
}

template <typename idx_t>
__global__ void shrink_kernel(const idx_t* pool, idx_t* __restrict__ owner, int32_t* __restrict__ rank,
                              idx_t* __restrict__ ring, int64_t num_pages, int64_t tail,
                              const idx_t* __restrict__ root, const int64_t* __restrict__ degree,
                              const int64_t* __restrict__ vtx, const int64_t* __restrict__ off,
                              const int64_t* __restrict__ page_off, int64_t runs, int64_t total, int s) {
  for (int64_t t = thread_index(); t < total; t += thread_count()) {
    const int64_t r = group_of(page_off, runs, t);
    const int64_t v = vtx[r];
    const int64_t d0 = degree[v];
    shrink_item(pool, owner, rank, ring, num_pages, tail, static_cast<int64_t>(root[v]), d0,
                d0 - (off[r + 1] - off[r]), page_off[r], t - page_off[r], s);
  }
}

template <typename idx_t>
__global__ void shrunk_roots_kernel(const idx_t* pool, idx_t* __restrict__ root, int8_t* __restrict__ height,
                                    int64_t* __restrict__ degree, const int64_t* __restrict__ vtx,
                                    const int64_t* __restrict__ off, int64_t runs, int s) {
  for (int64_t r = thread_index(); r < runs; r += thread_count()) {
    const int64_t v = vtx[r];
    const int64_t d0 = degree[v], d1 = d0 - (off[r + 1] - off[r]);
    root[v] = static_cast<idx_t>(shrunk_root(pool, static_cast<int64_t>(root[v]), d0, d1, s));
    height[v] = static_cast<int8_t>(tree_shape(d1, s).height);
    degree[v] = d1;
  }
}

// The last steps of remove and clear, on the stream: run r of `vertices` keeps the first
// degree - (off[r + 1] - off[r]) entries of its list (its tail already compacted), the pages
// left empty (page_off[r] .. page_off[r + 1] of the `freed`) join the free-page queue after
// `tail`, then its root, height and degree are set, then meta.
template <typename idx_t>
void shrink_lists(const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height, const at::Tensor& degree,
                  const at::Tensor& page_owner, const at::Tensor& page_rank, const at::Tensor& page_ring,
                  const at::Tensor& meta, const at::Tensor& vertices, const at::Tensor& off, const at::Tensor& page_off,
                  int64_t freed, int64_t head, int64_t tail, int64_t fresh, int s, cudaStream_t stream) {
  const int64_t runs = vertices.numel(), num_pages = pool.numel() >> s;
  if (freed > 0) {
    shrink_kernel<idx_t><<<blocks_for(freed), kBlock, 0, stream>>>(
        pool.data_ptr<idx_t>(), page_owner.data_ptr<idx_t>(), page_rank.data_ptr<int32_t>(),
        page_ring.data_ptr<idx_t>(), num_pages, tail, root.data_ptr<idx_t>(), degree.data_ptr<int64_t>(),
        vertices.data_ptr<int64_t>(), off.data_ptr<int64_t>(), page_off.data_ptr<int64_t>(), runs, freed, s);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  shrunk_roots_kernel<idx_t><<<blocks_for(runs), kBlock, 0, stream>>>(
      pool.data_ptr<idx_t>(), root.data_ptr<idx_t>(), height.data_ptr<int8_t>(), degree.data_ptr<int64_t>(),
      vertices.data_ptr<int64_t>(), off.data_ptr<int64_t>(), runs, s);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  set_meta_kernel<<<1, 1, 0, stream>>>(meta.data_ptr<int64_t>(), head, tail + freed, fresh);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void remove_cuda(const at::Tensor& pool, const std::optional<at::Tensor>& weights, const at::Tensor& root,
                 const at::Tensor& height, const at::Tensor& degree, const at::Tensor& page_owner,
                 const at::Tensor& page_rank, const at::Tensor& page_ring, const at::Tensor& meta,
                 const at::Tensor& vertices_in, const at::Tensor& pos_offsets_in, const at::Tensor& positions_in,
                 int64_t page_size) {
  constexpr const char* op = "dynamic_graph_remove";
  const int s = page_shift(page_size, op);
  check_writer(pool, weights, root, height, degree, page_owner, page_rank, page_ring, meta, s, kCuda, op);
  check_runs(pool, vertices_in, pos_offsets_in, positions_in, "pos_offsets", "positions", op);
  const c10::cuda::OptionalCUDAGuard guard(pool.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor vertices = vertices_in.contiguous(), off = pos_offsets_in.contiguous(),
                   positions = positions_in.contiguous();
  const int64_t runs = vertices.numel(), num_ids = root.numel();
  const int64_t holes = positions.numel();

  at::Tensor pages = at::zeros({runs}, vertices.options());
  if (runs > 0) {
    shrink_counts_kernel<<<blocks_for(runs), kBlock, 0, stream>>>(
        vertices.data_ptr<int64_t>(), off.data_ptr<int64_t>(), runs, degree.data_ptr<int64_t>(), num_ids, s,
        pages.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  const at::Tensor page_off = offsets_of(pages);
  const at::Tensor first = launch_batch_check(vertices, off, positions, num_ids, degree.data_ptr<int64_t>(), stream);
  const std::vector<int64_t> h = read_back({first, page_off.slice(0, runs), meta});
  raise_if_bad(h.data(), vertices, off, positions, "pos_offsets", "positions", num_ids, op);
  const int64_t freed = h[kNumBatchErrors];
  const int64_t head = h[kNumBatchErrors + 1 + kHead], tail = h[kNumBatchErrors + 1 + kTail];
  const int64_t fresh = h[kNumBatchErrors + 1 + kFresh];
  if (runs == 0) return;

  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    using idx_t = index_t;
    if (holes > 0) {
      compact_kernel<idx_t><<<blocks_for(holes), kBlock, 0, stream>>>(
          pool.data_ptr<idx_t>(), weight_words(weights), root.data_ptr<idx_t>(), height.data_ptr<int8_t>(),
          degree.data_ptr<int64_t>(), vertices.data_ptr<int64_t>(), off.data_ptr<int64_t>(), runs, holes,
          positions.data_ptr<int64_t>(), s);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    shrink_lists<idx_t>(pool, root, height, degree, page_owner, page_rank, page_ring, meta, vertices, off, page_off,
                        freed, head, tail, fresh, s, stream);
  });
}

// ---------------------------------------------------------------------------------------------
// clear: every page of each list back to the free-page queue (remove's shrink with nothing to
// compact).

// Per run: entries (the degree) and pages of its list; the first vertex out of range or not
// above the previous one.
__global__ void clear_counts_kernel(const int64_t* __restrict__ vtx, int64_t runs, const int64_t* __restrict__ degree,
                                    int64_t num_ids, int s, int64_t* __restrict__ entries,
                                    int64_t* __restrict__ pages, unsigned long long* __restrict__ first) {
  for (int64_t r = thread_index(); r < runs; r += thread_count()) {
    if (!vertex_ok(vtx, r, num_ids, true)) {
      atomicMin(&first[kBadVertex], r);
      entries[r] = pages[r] = 0;
      continue;
    }
    entries[r] = degree[vtx[r]];
    pages[r] = tree_pages(entries[r], s);
  }
}

at::Tensor clear_cuda(const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height, const at::Tensor& degree,
                   const at::Tensor& page_owner, const at::Tensor& page_rank, const at::Tensor& page_ring,
                   const at::Tensor& meta, const at::Tensor& vertices_in, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_clear";
  const int s = page_shift(page_size, op);
  check_writer(pool, std::nullopt, root, height, degree, page_owner, page_rank, page_ring, meta, s, kCuda, op);
  check_marked_vertices(pool, vertices_in);
  const c10::cuda::OptionalCUDAGuard guard(pool.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor vertices = vertices_in.contiguous();
  const int64_t runs = vertices.numel(), num_ids = root.numel();
  if (runs == 0) return at::scalar_tensor(int64_t(0), at::kLong);
  const auto opts = vertices.options();
  at::Tensor entries = at::empty({runs}, opts), pages = at::empty({runs}, opts);  // written whole below
  at::Tensor first = at::full({kNumBatchErrors}, LLONG_MAX, opts);
  clear_counts_kernel<<<blocks_for(runs), kBlock, 0, stream>>>(
      vertices.data_ptr<int64_t>(), runs, degree.data_ptr<int64_t>(), num_ids, s, entries.data_ptr<int64_t>(),
      pages.data_ptr<int64_t>(), reinterpret_cast<unsigned long long*>(first.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const at::Tensor off = offsets_of(entries), page_off = offsets_of(pages);
  const std::vector<int64_t> h = read_back({first, page_off.slice(0, runs), off.slice(0, runs), meta});
  raise_if_bad(h.data(), vertices, vertices, vertices, "pos_offsets", "positions", num_ids, op);
  const int64_t freed = h[kNumBatchErrors], removed = h[kNumBatchErrors + 1];
  const int64_t head = h[kNumBatchErrors + 2 + kHead], tail = h[kNumBatchErrors + 2 + kTail];
  const int64_t fresh = h[kNumBatchErrors + 2 + kFresh];
  const at::Tensor count = at::scalar_tensor(removed, at::kLong);
  if (freed == 0) return count;
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    shrink_lists<index_t>(pool, root, height, degree, page_owner, page_rank, page_ring, meta, vertices, off,
                          page_off, freed, head, tail, fresh, s, stream);
  });
  return count;
}

// ---------------------------------------------------------------------------------------------
// to_csr

template <typename idx_t>
__global__ void to_csr_kernel(const idx_t* __restrict__ pool, const int32_t* __restrict__ weights,
                              const int64_t* __restrict__ degree, const idx_t* __restrict__ owner,
                              const int32_t* __restrict__ rank, const int64_t* __restrict__ meta, int64_t num_ids,
                              const int64_t* __restrict__ indptr, idx_t* __restrict__ indices,
                              int32_t* __restrict__ w_out, int64_t* __restrict__ slots, int s) {
  const int64_t size = int64_t(1) << s;
  for_each_active_page(
      meta[kFresh], [&](int64_t p) { return data_page_of(owner, rank, p, num_ids); },
      [&](int64_t p, int lane) {
        const int64_t v = static_cast<int64_t>(owner[p]);
        const int64_t i = rank[p];
        const int64_t n = imin(size, degree[v] - (i << s));
        const int64_t base = indptr[v] + (i << s);
        for (int64_t k = lane; k < n; k += kWarp) {
          const int64_t slot = (p << s) + k;
          indices[base + k] = pool[slot];
          if (slots) slots[base + k] = slot;
          if (weights) w_out[base + k] = weights[slot];
        }
      });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> to_csr_cuda(
    const at::Tensor& pool_in, const std::optional<at::Tensor>& weights_in, const at::Tensor& root_in,
    const at::Tensor& height_in, const at::Tensor& degree_in, const at::Tensor& page_owner_in,
    const at::Tensor& page_rank_in, const at::Tensor& meta_in, int64_t page_size, bool with_slots) {
  constexpr const char* op = "dynamic_graph_to_csr";
  const int s = page_shift(page_size, op);
  const int64_t num_pages =
      check_sweeper(pool_in, root_in, height_in, degree_in, page_owner_in, page_rank_in, meta_in, s, kCuda, op);
  check_pool_weights(weights_in, pool_in);
  const c10::cuda::OptionalCUDAGuard guard(pool_in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor pool = pool_in.contiguous(), degree = degree_in.contiguous(), owner = page_owner_in.contiguous(),
                   rank = page_rank_in.contiguous(), meta = meta_in.contiguous();
  const at::Tensor w = weights_in ? weights_in->contiguous() : at::Tensor();
  const int64_t n = degree.numel();
  const at::Tensor indptr = offsets_of(degree);
  const int64_t edges = indptr.slice(0, n).item<int64_t>();
  at::Tensor indices = at::empty({edges}, pool.options());
  at::Tensor slots = at::empty({with_slots ? edges : 0}, degree.options());
  at::Tensor w_out = weights_in ? at::empty({edges}, w.options()) : at::empty({0}, pool.options().dtype(at::kFloat));
  if (num_pages > 0 && edges > 0) {
    AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
      to_csr_kernel<index_t><<<blocks_for(num_pages), kBlock, 0, stream>>>(
          pool.data_ptr<index_t>(), weights_in ? static_cast<const int32_t*>(w.data_ptr()) : nullptr,
          degree.data_ptr<int64_t>(), owner.data_ptr<index_t>(), rank.data_ptr<int32_t>(), meta.data_ptr<int64_t>(),
          n, indptr.data_ptr<int64_t>(), indices.data_ptr<index_t>(),
          weights_in ? static_cast<int32_t*>(w_out.data_ptr()) : nullptr,
          with_slots ? slots.data_ptr<int64_t>() : nullptr, s);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return {indptr, indices, w_out, slots};
}

// ---------------------------------------------------------------------------------------------
// bfs: level-synchronous; each level sweeps the pages of the vertices at that depth.

template <typename idx_t>
__global__ void bfs_level_kernel(const idx_t* __restrict__ pool, const int64_t* __restrict__ degree,
                                 const idx_t* __restrict__ owner, const int32_t* __restrict__ rank,
                                 const int64_t* __restrict__ meta, int64_t num_ids, int32_t level,
                                 int32_t* __restrict__ depth, idx_t* __restrict__ pred,
                                 unsigned long long* __restrict__ found, unsigned long long* __restrict__ edges,
                                 int s) {
  const int64_t size = int64_t(1) << s;
  bool any = false;
  unsigned long long scanned = 0;
  for_each_active_page(
      meta[kFresh],
      [&](int64_t p) {
        return data_page_of(owner, rank, p, num_ids) && depth[static_cast<int64_t>(owner[p])] == level;
      },
      [&](int64_t p, int lane) {
        const int64_t v = static_cast<int64_t>(owner[p]);
        const int64_t n = imin(size, degree[v] - (static_cast<int64_t>(rank[p]) << s));
        if (lane == 0) scanned += n;
        for (int64_t k = lane; k < n; k += kWarp) {
          const int64_t u = static_cast<int64_t>(pool[(p << s) + k]);
          if (u < 0 || u >= num_ids || depth[u] != -1) continue;
          if (atomicCAS(&depth[u], -1, level + 1) == -1) {
            if (pred) pred[u] = static_cast<idx_t>(v);
            any = true;
          }
        }
      });
  if (__syncthreads_or(any) && threadIdx.x == 0) atomicExch(found, 1ULL);
  if (scanned) atomicAdd(edges, scanned);
}

template <typename idx_t>
__global__ void bfs_start_kernel(int32_t* depth, idx_t* pred, int64_t source) {
  depth[source] = 0;
  if (pred) pred[source] = static_cast<idx_t>(source);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bfs_cuda(const at::Tensor& pool_in, const at::Tensor& root_in,
                                                       const at::Tensor& height_in, const at::Tensor& degree_in,
                                                       const at::Tensor& page_owner_in, const at::Tensor& page_rank_in,
                                                       const at::Tensor& meta_in, int64_t source, bool predecessors,
                                                       int64_t page_size) {
  constexpr const char* op = "dynamic_graph_bfs";
  const int s = page_shift(page_size, op);
  const int64_t num_pages =
      check_sweeper(pool_in, root_in, height_in, degree_in, page_owner_in, page_rank_in, meta_in, s, kCuda, op);
  const int64_t n = root_in.numel();
  check_bfs_source(source, n, op);
  TORCH_CHECK_VALUE(n < INT32_MAX, op, ": supports fewer than 2^31 vertex ids, got ", n);
  const c10::cuda::OptionalCUDAGuard guard(pool_in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor pool = pool_in.contiguous(), degree = degree_in.contiguous(), owner = page_owner_in.contiguous(),
                   rank = page_rank_in.contiguous(), meta = meta_in.contiguous();
  at::Tensor depth = at::full({n}, -1, degree.options().dtype(at::kInt));
  at::Tensor pred = predecessors ? at::full({n}, -1, pool.options()) : at::empty({0}, pool.options());
  at::Tensor counters = at::zeros({2}, degree.options());  // [found, edges]
  int64_t levels = 0;
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    index_t* p = predecessors ? pred.data_ptr<index_t>() : nullptr;
    bfs_start_kernel<index_t><<<1, 1, 0, stream>>>(depth.data_ptr<int32_t>(), p, source);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    auto* cnt = reinterpret_cast<unsigned long long*>(counters.data_ptr<int64_t>());
    for (int32_t level = 0;; ++level) {
      counters.select(0, 0).zero_();
      bfs_level_kernel<index_t><<<blocks_for(num_pages), kBlock, 0, stream>>>(
          pool.data_ptr<index_t>(), degree.data_ptr<int64_t>(), owner.data_ptr<index_t>(), rank.data_ptr<int32_t>(),
          meta.data_ptr<int64_t>(), n, level, depth.data_ptr<int32_t>(), p, cnt, cnt + 1, s);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      if (counters.select(0, 0).item<int64_t>() == 0) {
        levels = level + 1;
        break;
      }
    }
  });
  at::Tensor stats = at::empty({2}, degree.options());
  stats.select(0, 0).copy_(counters.select(0, 1));
  stats.select(0, 1).fill_(levels);
  return {depth, pred, stats};
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("dynamic_graph_append", append_cuda);
  m.impl("dynamic_graph_contains", contains_cuda);
  m.impl("dynamic_graph_find", find_cuda);
  m.impl("dynamic_graph_find_touching", find_touching_cuda);
  m.impl("dynamic_graph_find_marked", find_marked_cuda);
  m.impl("dynamic_graph_clear", clear_cuda);
  m.impl("dynamic_graph_mark_neighbours", mark_neighbours_cuda);
  m.impl("dynamic_graph_pages_needed", pages_needed_cuda);
  m.impl("dynamic_graph_remove", remove_cuda);
  m.impl("dynamic_graph_to_csr", to_csr_cuda);
  m.impl("dynamic_graph_bfs", bfs_cuda);
}

}  // namespace zerocopy
