// Breadth-first search on the GPU, level-synchronous.
//
// Scan variants (naive, merged, aligned): the kernel of level L visits every vertex and
// expands those with depth == L (EMOGI's BFS). Frontier variant: the kernel of level L
// expands only the vertices queued by level L - 1, claiming each newly reached vertex with
// atomicCAS so it is queued exactly once; queues are pushed with one atomic per warp step.
// Queue order is arbitrary, and random-order reads of short lists from host memory are bound
// by address translation, so a level holding more than num_nodes / kScanDivisor vertices is
// expanded in id order instead (a scan of depth == L, decided on the device from the queue
// length): small levels, the many levels of a high-diameter graph, cost only their own work.
// Both stop through the device counter described in traversal_common.cuh.
//
// Device state: stats[0] counts the edges scanned, stats[1] is the last level known to have
// vertices (and becomes the number of levels at the end). Frontier queues (two of num_nodes
// ids) and a three-slot ring of queue lengths: level L reads slot L%3, appends to slot
// (L+1)%3 and clears slot (L+2)%3, which no kernel in flight uses.

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "traversal_common.cuh"

namespace zerocopy {
namespace traversal {
namespace {

__device__ __forceinline__ bool level_has_work(const long long* top, int64_t level) {
  return *reinterpret_cast<const volatile long long*>(top) >= level;
}

template <typename T>
__global__ void bfs_init_kernel(int32_t* depth, T* pred, T* queue, long long* counts, int64_t source) {
  depth[source] = 0;
  if (pred) pred[source] = static_cast<T>(source);
  if (queue) {
    queue[0] = static_cast<T>(source);
    counts[0] = 1;
    counts[1] = 0;
    counts[2] = 0;
  }
}

template <typename T>
__global__ void bfs_naive_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                 int32_t* depth, T* pred, long long* stats, int64_t level) {
  if (!level_has_work(stats + 1, level)) return;
  const int32_t cur = static_cast<int32_t>(level);
  bool found = false;
  unsigned long long edges = 0;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (depth[v] != cur) continue;
    const int64_t start = indptr[v], end = indptr[v + 1];
    edges += end - start;
    for (int64_t e = start; e < end; ++e) {
      const T u = indices[e];
      if (depth[u] == -1) {
        depth[u] = cur + 1;  // racing writers all store the same value
        if (pred) pred[u] = static_cast<T>(v);
        found = true;
      }
    }
  }
  add_block_count(edges, stats);
  mark_found(found, stats + 1, level);
}

template <bool kAlign, typename T>
__global__ void bfs_warp_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                int32_t* depth, T* pred, long long* stats, int64_t level) {
  if (!level_has_work(stats + 1, level)) return;
  const int32_t cur = static_cast<int32_t>(level);
  const int lane = threadIdx.x % kWarp;
  bool found = false;
  unsigned long long edges = 0;
  warp_for_each_active(n, lane, [&](int64_t v) { return depth[v] == cur; }, [&](int64_t v) {
    const int64_t start = indptr[v], end = indptr[v + 1];
    if (lane == 0) edges += end - start;
    warp_for_each<kAlign>(indices, start, end, lane, [&](int64_t e, bool valid) {
      if (!valid) return;
      const T u = indices[e];
      if (depth[u] == -1) {
        depth[u] = cur + 1;
        if (pred) pred[u] = static_cast<T>(v);
        found = true;
      }
    });
  });
  add_block_count(edges, stats);
  mark_found(found, stats + 1, level);
}

template <typename T>
__global__ void bfs_frontier_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                    int32_t* depth, T* pred, const T* __restrict__ queue_in, T* queue_out,
                                    long long* counts, long long* stats, int64_t level) {
  if (!level_has_work(stats + 1, level)) return;
  const int32_t cur = static_cast<int32_t>(level);
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const long long count_in = *reinterpret_cast<const volatile long long*>(counts + level % 3);
  long long* count_out = counts + (level + 1) % 3;
  if (blockIdx.x == 0 && threadIdx.x == 0) counts[(level + 2) % 3] = 0;
  bool found = false;
  unsigned long long edges = 0;
  auto expand = [&](int64_t v) {  // called by all lanes of a warp
    const int64_t start = indptr[v], end = indptr[v + 1];
    if (lane == 0) edges += end - start;
    warp_for_each<true>(indices, start, end, lane, [&](int64_t e, bool valid) {
      bool push = false;
      T u = 0;
      if (valid) {
        u = indices[e];
        if (depth[u] == -1 && atomicCAS(depth + u, -1, cur + 1) == -1) {
          push = true;
          if (pred) pred[u] = static_cast<T>(v);
        }
      }
      warp_push(push, u, queue_out, count_out, lane);
      found |= push;
    });
  };
  const int64_t first_warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (count_in > n / kScanDivisor) {
    // A large level: visit its vertices in id order (those with depth == level are exactly the
    // queued ones), so the lists are read in address order.
    warp_for_each_active(n, lane, [&](int64_t v) { return depth[v] == cur; }, expand);
  } else {
    for (int64_t w = first_warp; w < count_in; w += warps) expand(queue_in[w]);
  }
  add_block_count(edges, stats);
  mark_found(found, stats + 1, level);
}

template <typename T>
void bfs_run(const at::Tensor& indptr, const at::Tensor& indices, int64_t n, int64_t source, int64_t variant,
             at::Tensor& depth, at::Tensor& pred, at::Tensor& stats) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  int32_t* d = depth.data_ptr<int32_t>();
  T* p = pred.numel() ? pred.data_ptr<T>() : nullptr;
  auto* st = reinterpret_cast<long long*>(stats.data_ptr<int64_t>());
  at::Tensor queues, counts;
  T* q = nullptr;
  long long* cnt = nullptr;
  if (variant == kFrontier) {
    queues = at::empty({2, n}, indices.options());
    counts = at::empty({3}, stats.options());
    q = queues.data_ptr<T>();
    cnt = reinterpret_cast<long long*>(counts.data_ptr<int64_t>());
  }
  bfs_init_kernel<T><<<1, 1, 0, stream>>>(d, p, q, cnt, source);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto launch = [&](int64_t level) {
    switch (variant) {
      case kNaive:
        bfs_naive_kernel<T><<<grid_blocks(1, n), kBlock, 0, stream>>>(n, off, col, d, p, st, level);
        break;
      case kMerged:
        bfs_warp_kernel<false, T><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, d, p, st, level);
        break;
      case kAligned:
        bfs_warp_kernel<true, T><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, d, p, st, level);
        break;
      default:
        bfs_frontier_kernel<T><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(
            n, off, col, d, p, q + (level & 1) * n, q + ((level + 1) & 1) * n, cnt, st, level);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  run_steps(launch, st + 1, n + 1, stream);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bfs_cuda(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                                                       int64_t source, int64_t variant, bool predecessors) {
  check_variant(variant, "bfs");
  const int64_t n = check_cuda_csr(indptr_in, indices_in, "bfs");
  c10::cuda::OptionalCUDAGuard guard(indptr_in.device());
  check_source(source, n, "bfs");
  TORCH_CHECK_VALUE(n < (int64_t{1} << 31) - 1, "bfs: depths are int32, so num_nodes must be < 2^31 - 1, got ", n);
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  at::Tensor depth = at::full({n}, -1, indptr.options().dtype(at::kInt));
  at::Tensor pred = predecessors ? at::full({n}, -1, indices.options()) : at::empty({0}, indices.options());
  at::Tensor stats = at::zeros({2}, indptr.options());
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "bfs", [&] {
    bfs_run<index_t>(indptr, indices, n, source, variant, depth, pred, stats);
  });
  stats.select(0, 1).add_(1);  // last level with vertices -> number of levels
  return {depth, pred, stats};
}

}  // namespace
}  // namespace traversal

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("graph_bfs", traversal::bfs_cuda);
}

}  // namespace zerocopy
