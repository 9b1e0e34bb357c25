// Connected components on the GPU: one pass of concurrent union-find over the edge list, so
// the edge list is read exactly once (for a symmetric graph each pair is united from its
// larger end only; the reverse copy is still read, as it lies in the same lines).
//
// Where the edge list lives in host memory, the staged variant keeps the union-find away from
// the host reads: the list crosses PCIe by DMA (cudaMemcpyAsync on a side stream, at the copy
// engine's rate and without using an SM) in chunks of `chunk_edges` into three GPU-memory
// buffers, and an edge-balanced union-find kernel runs on each chunk while the next ones are
// copied. GPU memory used: three chunks (3 x 2^26 ids by default), whatever the graph's size.
// On a graph already in GPU memory the same kernel runs over the list in place. In the
// zero-copy variants (naive ... frontier) each warp waits on a host read, then on a chain of
// dependent GPU-memory reads and CAS retries, then issues its next host read; the staged
// variant never mixes the two in one warp.
//
// parent[] starts as the identity and always satisfies parent[x] <= x. A union finds both
// roots and hooks the larger root under the smaller one with atomicCAS (retrying from the new
// root when another thread got there first), so the root of every set is its minimum vertex
// id. find() halves paths as it goes; its writes only shorten paths to an ancestor, so they
// race harmlessly. A final pass (a separate kernel, so after every union) points every vertex
// at its root: the minimum-id label.
//
// The frontier variant on an undirected graph reads far less than the edge list (the sampling
// idea of Afforest, Sutton et al., IPDPS 2018): it first unites each vertex with its first
// kSampleRounds neighbours only (read together, in vertex order, so adjacent threads read
// adjacent lines), compresses, and estimates the largest component from kGiantSamples vertices. The
// full pass then skips every vertex already in that component without reading its list. That
// is safe on an undirected graph: an edge (v, u) with v in the component and u outside it is
// also stored as (u, v), and u's list is read. Vertices outside the component unite with all
// their neighbours (no larger-end rule there, as the other end may have been skipped).
//
// Bad graphs: every read of the graph is checked (GraphGuard, traversal_common.cuh), and the
// variants whose edge-balanced sweep maps edges to vertices by binary search (frontier on a
// directed graph, staged) also check every vertex's offsets in the init kernel (indptr is in GPU
// memory; its n + 1 reads are small beside the edge list's). The staged copies take their
// bounds from len(indices) alone, and its kernel reads only its own chunk. The op has no step
// loop, so it reads the error words back once, after its kernels.

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/library.h>

#include "traversal_sweep.cuh"

namespace zerocopy {
namespace traversal {
namespace {

__device__ __forceinline__ int32_t cas_parent(int32_t* addr, int32_t expected, int32_t desired) {
  return atomicCAS(addr, expected, desired);
}

__device__ __forceinline__ int64_t cas_parent(int64_t* addr, int64_t expected, int64_t desired) {
  return static_cast<int64_t>(atomicCAS(reinterpret_cast<unsigned long long*>(addr),
                                        static_cast<unsigned long long>(expected),
                                        static_cast<unsigned long long>(desired)));
}

template <typename T>
__device__ __forceinline__ T find_root(T* parent_ptr, T x) {
  volatile T* parent = parent_ptr;
  T cur = parent[x];
  if (cur == x) return x;
  T prev = x;
  T next;
  while (cur > (next = parent[cur])) {
    parent[prev] = next;
    prev = cur;
    cur = next;
  }
  return cur;
}

// find without writes, for the final pass: there the only writer of parent[v] is v's own
// thread storing v's root, so a concurrent path-halving write can never replace a root label
// with a lower-level ancestor.
template <typename T>
__device__ __forceinline__ T find_root_readonly(const T* parent_ptr, T x) {
  const volatile T* parent = parent_ptr;
  T cur = x;
  T next;
  while (cur != (next = parent[cur])) cur = next;
  return cur;
}

template <typename T>
__device__ __forceinline__ void unite(T* parent, T a, T b) {
  T ra = find_root(parent, a);
  T rb = find_root(parent, b);
  while (ra != rb) {
    if (ra < rb) {
      const T t = ra;
      ra = rb;
      rb = t;
    }
    const T seen = cas_parent(parent + ra, ra, rb);
    if (seen == ra) return;
    ra = find_root(parent, seen);
    rb = find_root(parent, rb);
  }
}

// Unites v and u unless their parents already agree, which is the common case once most
// vertices hang directly under their root: two reads instead of two finds, and no read of the
// root's own entry, which every find in a large component would otherwise hit.
template <typename T>
__device__ __forceinline__ void link(T* parent, T v, T u) {
  const T pv = ld_volatile(parent + v);
  const T pu = ld_volatile(parent + u);
  if (pv != pu) unite(parent, pv, pu);
}

// parent = identity; with `indptr` (not null), also checks every vertex's offsets.
template <typename T>
__global__ void cc_init_kernel(int64_t n, T* parent, const int64_t* __restrict__ indptr, GraphGuard g) {
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    parent[v] = static_cast<T>(v);
    if (indptr) {
      int64_t start = indptr[v], end = indptr[v + 1];
      g.list(v, start, end);
    }
  }
}

template <int kVariant, typename T>
__global__ void cc_hook_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                               T* parent, bool symmetric, GraphGuard g, long long* stats) {
  unsigned long long edges = 0;
  sweep_edges<kVariant, T>(
      n, indptr, indices, g, [](int64_t) { return false; },
      [&](int64_t v, int64_t u) {
        if (u == v || (symmetric && u > v)) return;
        unite(parent, static_cast<T>(v), static_cast<T>(u));
      },
      edges);
  add_block_count(edges, stats);
}

template <typename T>
__global__ void cc_compress_kernel(int64_t n, T* parent) {
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const T root = find_root_readonly(parent, static_cast<T>(v));
    reinterpret_cast<volatile T*>(parent)[v] = root;
  }
}

constexpr int kSampleRounds = 2;
constexpr int kGiantSamples = 1024;

// Unites every vertex with its first kSampleRounds neighbours (thread per vertex, in vertex
// order; the neighbours are read together, as they share a sector of host memory).
template <typename T>
__global__ void cc_sample_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                 T* parent, GraphGuard g, long long* stats) {
  unsigned long long edges = 0;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t start = indptr[v], end = indptr[v + 1];
    g.list(v, start, end);
    const int64_t take = min(static_cast<int64_t>(kSampleRounds), end - start);
    T u[kSampleRounds];
#pragma unroll
    for (int r = 0; r < kSampleRounds; ++r) {
      u[r] = r < take ? indices[start + r] : static_cast<T>(v);
      if (r < take && !g.id(u[r], start + r)) u[r] = static_cast<T>(v);
    }
    edges += take;
#pragma unroll
    for (int r = 0; r < kSampleRounds; ++r) {
      if (static_cast<int64_t>(u[r]) != v) unite(parent, static_cast<T>(v), u[r]);
    }
  }
  add_block_count(edges, stats);
}

// One block of kGiantSamples threads: *giant = the most frequent root among kGiantSamples
// pseudo-random vertices (parent[] compressed: parent[v] is v's root).
template <typename T>
__global__ void __launch_bounds__(kGiantSamples) cc_giant_kernel(int64_t n, const T* parent, T* giant) {
  __shared__ T labels[kGiantSamples];
  __shared__ unsigned best[kGiantSamples];
  const int t = threadIdx.x;
  uint64_t h = (static_cast<uint64_t>(t) + 1) * 0x9E3779B97F4A7C15ull;  // splitmix64
  h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
  h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
  h ^= h >> 31;
  labels[t] = parent[static_cast<int64_t>(h % static_cast<uint64_t>(n))];
  __syncthreads();
  unsigned count = 0;
  for (int j = 0; j < kGiantSamples; ++j) count += labels[j] == labels[t];
  best[t] = (count << 10) | static_cast<unsigned>(t);  // count, ties to the lower slot
  __syncthreads();
  for (int stride = kGiantSamples / 2; stride > 0; stride /= 2) {
    if (t < stride && best[t + stride] > best[t]) best[t] = best[t + stride];
    __syncthreads();
  }
  if (t == 0) *giant = labels[best[0] & (kGiantSamples - 1)];
}

// The full pass of the sampled variant: vertices outside the giant component unite with
// every neighbour; the others are skipped before their list is read. Warp per vertex with
// aligned reads, so the skip is decided once per vertex, not once per edge.
template <typename T>
__global__ void cc_finish_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                 T* parent, const T* __restrict__ giant_ptr, GraphGuard g, long long* stats) {
  const T giant = *giant_ptr;
  const volatile T* labels = parent;
  unsigned long long read = 0, unused = 0;
  sweep_edges<kAligned, T>(
      n, indptr, indices, g, [&](int64_t v) { return labels[v] == giant; },
      [&](int64_t v, int64_t u) {
        ++read;
        if (u != v) unite(parent, static_cast<T>(v), static_cast<T>(u));
      },
      unused);
  add_block_count(read, stats);
}

// The staged variant's kernel: unites the edges [begin, end) of the list, read from src (a
// GPU-memory copy of them, or the list itself when it is in GPU memory).
template <typename T>
__global__ void cc_link_slices_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ src,
                                      int64_t begin, int64_t end, T* parent, bool symmetric, GraphGuard g,
                                      long long* stats) {
  unsigned long long edges = 0;
  sweep_edge_slices(
      n, indptr, src, begin, end, g, [](int64_t) { return false; },
      [&](int64_t v, int64_t u) {
        if (u == v || (symmetric && u > v)) return;
        link(parent, static_cast<T>(v), static_cast<T>(u));
      },
      edges);
  add_block_count(edges, stats);
}

constexpr int64_t kDefaultChunkEdges = int64_t{1} << 26;
constexpr int kStagingBuffers = 3;

// CUDA events destroyed on scope exit (cudaEventDestroy of a pending event is safe: it is
// released once the work it marks completes).
struct EventSet {
  cudaEvent_t events[2 * kStagingBuffers] = {};
  EventSet() {
    for (auto& e : events) C10_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~EventSet() {
    for (auto& e : events) {
      if (e) cudaEventDestroy(e);
    }
  }
  cudaEvent_t ready(int b) const { return events[b]; }
  cudaEvent_t consumed(int b) const { return events[kStagingBuffers + b]; }
};

template <typename T>
void cc_staged(const at::Tensor& indptr, const at::Tensor& indices, int64_t n, bool symmetric, T* parent,
               long long* st, const GraphGuard& g, int64_t chunk_edges, cudaStream_t stream) {
  const int64_t m = indices.numel();
  if (m == 0) return;
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  if (in_device_memory(col)) {
    cc_link_slices_kernel<T><<<grid_blocks(kWarp, m / kSliceEdges + 2), kBlock, 0, stream>>>(n, off, col, 0, m,
                                                                                         parent, symmetric, g, st);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return;
  }
  const int64_t chunk = std::min(chunk_edges > 0 ? chunk_edges : kDefaultChunkEdges, m);
  const int64_t buffers_used = std::min<int64_t>(kStagingBuffers, (m + chunk - 1) / chunk);
  at::Tensor buffers = at::empty({buffers_used, chunk}, indices.options());
  T* buf = buffers.data_ptr<T>();
  c10::cuda::CUDAStream copy_stream = c10::cuda::getStreamFromPool(false, indptr.device().index());
  EventSet events;
  // The copies read the edge list after whatever the caller queued before this op.
  C10_CUDA_CHECK(cudaEventRecord(events.consumed(0), stream));
  C10_CUDA_CHECK(cudaStreamWaitEvent(copy_stream.stream(), events.consumed(0), 0));
  int64_t k = 0;
  for (int64_t first = 0; first < m; first += chunk, ++k) {
    const int b = static_cast<int>(k % buffers_used);
    const int64_t len = std::min(chunk, m - first);  // 0 < len <= chunk, first + len <= m
    T* dst = buf + b * chunk;
    if (k >= buffers_used) C10_CUDA_CHECK(cudaStreamWaitEvent(copy_stream.stream(), events.consumed(b), 0));
    C10_CUDA_CHECK(cudaMemcpyAsync(dst, col + first, static_cast<size_t>(len) * sizeof(T), cudaMemcpyDefault,
                                   copy_stream.stream()));
    C10_CUDA_CHECK(cudaEventRecord(events.ready(b), copy_stream.stream()));
    C10_CUDA_CHECK(cudaStreamWaitEvent(stream, events.ready(b), 0));
    cc_link_slices_kernel<T><<<grid_blocks(kWarp, len / kSliceEdges + 2), kBlock, 0, stream>>>(
        n, off, dst, first, first + len, parent, symmetric, g, st);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    C10_CUDA_CHECK(cudaEventRecord(events.consumed(b), stream));
  }
  // Every copy is followed on `stream` by a kernel that waits for it, but the allocator must
  // also know the buffers were used on the copy stream before it hands their memory out again.
  c10::cuda::CUDACachingAllocator::recordStream(buffers.storage().data_ptr(), copy_stream);
}

template <typename T>
void cc_run(const at::Tensor& indptr, const at::Tensor& indices, int64_t n, int64_t variant, bool symmetric,
            int64_t chunk_edges, at::Tensor& labels, at::Tensor& stats) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  T* parent = labels.data_ptr<T>();
  auto* st = reinterpret_cast<long long*>(stats.data_ptr<int64_t>());
  // stats: [edges, iterations, error words...]
  const GraphGuard g{n, indices.numel(), reinterpret_cast<unsigned long long*>(st + 2)};
  const bool slices = variant == kStaged || (variant == kFrontier && !symmetric);
  cc_init_kernel<T><<<grid_blocks(1, n), kBlock, 0, stream>>>(n, parent, slices ? off : nullptr, g);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  switch (variant) {
    case kNaive:
      cc_hook_kernel<kNaive, T><<<grid_blocks(1, n), kBlock, 0, stream>>>(n, off, col, parent, symmetric, g, st);
      break;
    case kMerged:
      cc_hook_kernel<kMerged, T><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, parent, symmetric, g,
                                                                              st);
      break;
    case kAligned:
      cc_hook_kernel<kAligned, T><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, parent, symmetric, g,
                                                                               st);
      break;
    case kStaged:
      cc_staged<T>(indptr, indices, n, symmetric, parent, st, g, chunk_edges, stream);
      break;
    default: {
      const int64_t slice_count = indices.numel() / kSliceEdges + 2;
      if (!symmetric) {
        cc_hook_kernel<kFrontier, T><<<grid_blocks(kWarp, slice_count), kBlock, 0, stream>>>(n, off, col, parent,
                                                                                            symmetric, g, st);
        break;
      }
      cc_sample_kernel<T><<<grid_blocks(1, n), kBlock, 0, stream>>>(n, off, col, parent, g, st);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      cc_compress_kernel<T><<<grid_blocks(1, n), kBlock, 0, stream>>>(n, parent);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      at::Tensor giant = at::empty({1}, labels.options());
      cc_giant_kernel<T><<<1, kGiantSamples, 0, stream>>>(n, parent, giant.data_ptr<T>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      cc_finish_kernel<T><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, parent, giant.data_ptr<T>(),
                                                                       g, st);
    }
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  cc_compress_kernel<T><<<grid_blocks(1, n), kBlock, 0, stream>>>(n, parent);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  check_graph_errors("connected_components", read_graph_errors(st + 2, stream), indptr, indices);
}

std::tuple<at::Tensor, at::Tensor> cc_cuda(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                                           int64_t variant, bool symmetric, int64_t chunk_edges) {
  check_variant(variant, TraversalOp::kConnectedComponents);
  TORCH_CHECK_VALUE(chunk_edges >= 0, "connected_components: chunk_edges must be >= 0, got ", chunk_edges);
  const int64_t n = check_cuda_csr(indptr_in, indices_in, "connected_components");
  c10::cuda::OptionalCUDAGuard guard(indptr_in.device());
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  at::Tensor labels = at::empty({n}, indices.options());
  at::Tensor status = counters_and_errors(2, indptr.options());
  if (n > 0) {
    AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "connected_components", [&] {
      cc_run<index_t>(indptr, indices, n, variant, symmetric, chunk_edges, labels, status);
    });
  }
  at::Tensor stats = status.narrow(0, 0, 2).clone();
  stats.select(0, 1).fill_(1);
  return {labels, stats};
}

}  // namespace
}  // namespace traversal

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("graph_connected_components", traversal::cc_cuda);
}

}  // namespace zerocopy
