// Single-source shortest paths on the GPU: Bellman-Ford over the vertices whose distance
// dropped (EMOGI's SSSP), with non-negative weights.
//
// A vertex is active in step S when stamp[v] == S. Step S relaxes every edge of every active
// vertex with atomicMin on the neighbour's distance; a neighbour whose distance it lowered
// gets stamp S + 1. A vertex lowered again while step S is still running is simply stamped
// S + 1 and relaxed again in step S + 1 from its latest distance, so no flag has to be
// cleared. Scan variants test every vertex's stamp each step; the frontier variant queues a
// vertex the first time its stamp moves to S + 1 (atomicExch), so each step's queue holds each
// vertex at most once.
//
// Distances: float32 weights -> float32 (atomicMin on the bit pattern, which orders
// non-negative floats like integers), int32 or unit weights -> int64. Unreachable vertices keep
// the type's maximum. Termination and stats as in traversal_bfs.cu. The weights are trusted to
// be non-negative here (checking would cost a pass over a host-resident weight array per
// call): CSRGraph records their minimum once and the Python wrapper refuses negative ones.

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <limits>

#include "traversal_common.cuh"

namespace zerocopy {
namespace traversal {
namespace {

__device__ __forceinline__ bool step_has_work(const long long* top, int64_t step) {
  return *reinterpret_cast<const volatile long long*>(top) >= step;
}

__device__ __forceinline__ float atomic_min_dist(float* addr, float value) {
  return __int_as_float(atomicMin(reinterpret_cast<int*>(addr), __float_as_int(value)));
}

__device__ __forceinline__ int64_t atomic_min_dist(int64_t* addr, int64_t value) {
  return static_cast<int64_t>(atomicMin(reinterpret_cast<long long*>(addr), static_cast<long long>(value)));
}

// Relaxes edge e (to u) from a vertex at distance dv; true when it lowered dist[u].
template <typename W, typename D>
__device__ __forceinline__ bool relax(D* dist, const W* weights, int64_t e, int64_t u, D dv) {
  const D nd = dv + (weights ? static_cast<D>(weights[e]) : D(1));
  if (!(nd < dist[u])) return false;
  return nd < atomic_min_dist(dist + u, nd);
}

template <typename T, typename D>
__global__ void sssp_init_kernel(D* dist, int32_t* stamp, T* queue, long long* counts, int64_t source) {
  dist[source] = D(0);
  stamp[source] = 0;
  if (queue) {
    queue[0] = static_cast<T>(source);
    counts[0] = 1;
    counts[1] = 0;
    counts[2] = 0;
  }
}

template <typename T, typename W, typename D>
__global__ void sssp_naive_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                  const W* __restrict__ weights, D* dist, int32_t* stamp, long long* stats,
                                  int64_t step) {
  if (!step_has_work(stats + 1, step)) return;
  const int32_t cur = static_cast<int32_t>(step);
  bool found = false;
  unsigned long long edges = 0;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (reinterpret_cast<volatile int32_t*>(stamp)[v] != cur) continue;
    const D dv = reinterpret_cast<volatile D*>(dist)[v];
    const int64_t start = indptr[v], end = indptr[v + 1];
    edges += end - start;
    for (int64_t e = start; e < end; ++e) {
      const int64_t u = indices[e];
      if (relax(dist, weights, e, u, dv)) {
        stamp[u] = cur + 1;
        found = true;
      }
    }
  }
  add_block_count(edges, stats);
  mark_found(found, stats + 1, step);
}

template <bool kAlign, typename T, typename W, typename D>
__global__ void sssp_warp_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                 const W* __restrict__ weights, D* dist, int32_t* stamp, long long* stats,
                                 int64_t step) {
  if (!step_has_work(stats + 1, step)) return;
  const int32_t cur = static_cast<int32_t>(step);
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  bool found = false;
  unsigned long long edges = 0;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp; v < n; v += warps) {
    // Lane 0 decides for the warp: the stamp may move to cur + 1 between two lanes' reads.
    int32_t s = lane == 0 ? reinterpret_cast<volatile int32_t*>(stamp)[v] : 0;
    s = __shfl_sync(0xffffffffu, s, 0);
    if (s != cur) continue;
    D dv = lane == 0 ? reinterpret_cast<volatile D*>(dist)[v] : D(0);
    dv = __shfl_sync(0xffffffffu, dv, 0);
    const int64_t start = indptr[v], end = indptr[v + 1];
    if (lane == 0) edges += end - start;
    warp_for_each<kAlign>(indices, start, end, lane, [&](int64_t e, bool valid) {
      if (!valid) return;
      const int64_t u = indices[e];
      if (relax(dist, weights, e, u, dv)) {
        stamp[u] = cur + 1;
        found = true;
      }
    });
  }
  add_block_count(edges, stats);
  mark_found(found, stats + 1, step);
}

template <typename T, typename W, typename D>
__global__ void sssp_frontier_kernel(const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                     const W* __restrict__ weights, D* dist, int32_t* stamp,
                                     const T* __restrict__ queue_in, T* queue_out, long long* counts,
                                     long long* stats, int64_t step) {
  if (!step_has_work(stats + 1, step)) return;
  const int32_t cur = static_cast<int32_t>(step);
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const long long count_in = *reinterpret_cast<const volatile long long*>(counts + step % 3);
  long long* count_out = counts + (step + 1) % 3;
  if (blockIdx.x == 0 && threadIdx.x == 0) counts[(step + 2) % 3] = 0;
  bool found = false;
  unsigned long long edges = 0;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp; w < count_in;
       w += warps) {
    const int64_t v = queue_in[w];
    D dv = lane == 0 ? reinterpret_cast<volatile D*>(dist)[v] : D(0);
    dv = __shfl_sync(0xffffffffu, dv, 0);
    const int64_t start = indptr[v], end = indptr[v + 1];
    if (lane == 0) edges += end - start;
    warp_for_each<true>(indices, start, end, lane, [&](int64_t e, bool valid) {
      bool push = false;
      T u = 0;
      if (valid) {
        u = indices[e];
        if (relax(dist, weights, e, static_cast<int64_t>(u), dv)) push = atomicExch(stamp + u, cur + 1) != cur + 1;
      }
      warp_push(push, u, queue_out, count_out, lane);
      found |= push;
    });
  }
  add_block_count(edges, stats);
  mark_found(found, stats + 1, step);
}

template <typename T, typename W, typename D>
void sssp_run(const at::Tensor& indptr, const at::Tensor& indices, const W* w, int64_t n, int64_t source,
              int64_t variant, at::Tensor& dist, at::Tensor& stats) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  D* d = dist.data_ptr<D>();
  at::Tensor stamp = at::full({n}, -1, indptr.options().dtype(at::kInt));
  int32_t* sp = stamp.data_ptr<int32_t>();
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
  sssp_init_kernel<T, D><<<1, 1, 0, stream>>>(d, sp, q, cnt, source);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto launch = [&](int64_t step) {
    switch (variant) {
      case kNaive:
        sssp_naive_kernel<T, W, D><<<grid_blocks(1, n), kBlock, 0, stream>>>(n, off, col, w, d, sp, st, step);
        break;
      case kMerged:
        sssp_warp_kernel<false, T, W, D><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, w, d, sp, st,
                                                                                       step);
        break;
      case kAligned:
        sssp_warp_kernel<true, T, W, D><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, w, d, sp, st,
                                                                                      step);
        break;
      default:
        sssp_frontier_kernel<T, W, D><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(
            off, col, w, d, sp, q + (step & 1) * n, q + ((step + 1) & 1) * n, cnt, st, step);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  // After step k every vertex whose shortest path has at most k + 1 edges is final, so n
  // steps suffice (and bound the work even for weights that break the non-negative contract).
  run_steps(launch, st + 1, n + 1, stream);
}

std::tuple<at::Tensor, at::Tensor> sssp_cuda(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                                             const std::optional<at::Tensor>& weights_in, int64_t source,
                                             int64_t variant) {
  check_variant(variant, "sssp");
  c10::cuda::OptionalCUDAGuard guard(indptr_in.device());
  const int64_t n = check_cuda_csr(indptr_in, indices_in, "sssp");
  check_source(source, n, "sssp");
  TORCH_CHECK_VALUE(n < (int64_t{1} << 31) - 1, "sssp: num_nodes must be < 2^31 - 1, got ", n);
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  std::optional<at::Tensor> weights;
  if (weights_in.has_value()) {
    check_weights(*weights_in, indices);
    weights = weights_in->contiguous();
  }
  const at::ScalarType dt = sssp_dist_dtype(weights);
  at::Tensor stats = at::zeros({2}, indptr.options());
  at::Tensor dist;
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "sssp", [&] {
    using T = index_t;
    if (dt == at::kFloat) {
      dist = at::full({n}, std::numeric_limits<float>::max(), indptr.options().dtype(at::kFloat));
      sssp_run<T, float, float>(indptr, indices, weights->data_ptr<float>(), n, source, variant, dist, stats);
    } else {
      dist = at::full({n}, std::numeric_limits<int64_t>::max(), indptr.options().dtype(at::kLong));
      const int32_t* w = weights.has_value() ? weights->data_ptr<int32_t>() : nullptr;
      sssp_run<T, int32_t, int64_t>(indptr, indices, w, n, source, variant, dist, stats);
    }
  });
  stats.select(0, 1).add_(1);
  return {dist, stats};
}

}  // namespace
}  // namespace traversal

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("graph_sssp", traversal::sssp_cuda);
}

}  // namespace zerocopy
