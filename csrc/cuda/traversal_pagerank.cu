// PageRank on the GPU: push-style power iteration, four kernels per iteration, all in GPU
// memory except the edge list:
//   contrib: c[v] = rank[v] / outdeg(v) (0 without out-edges), and the dangling rank sum;
//   sweep:   acc[u] += c[v] for every edge v -> u (float atomics), in the variant's read shape;
//   update:  rank[u] = (1 - alpha) / N + alpha * (acc[u] + dangling / N), the L1 change, acc = 0;
//   finish:  one thread counts the iteration and sets `done` when the change is below tol.
// Every kernel returns at once when `done` is set, so iterations are launched in batches and
// `done` is read back once per batch (see run_steps in traversal_common.cuh for the scheme).
// Float atomics make the last bits of the result vary from run to run.

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "traversal_sweep.cuh"

namespace zerocopy {
namespace traversal {
namespace {

// Per-iteration sums, reset by pr_finish_kernel. The done flag is a separate int64 and the
// iteration count lives in stats[1].
struct PageRankScalars {
  double dangling;
  double diff;
};

__device__ __forceinline__ bool pr_done(const long long* done) {
  return *reinterpret_cast<const volatile long long*>(done) != 0;
}

__device__ __forceinline__ void add_block_double(double mine, double* total) {
  __shared__ double block_sum;
  if (threadIdx.x == 0) block_sum = 0;
  __syncthreads();
  if (mine != 0) atomicAdd(&block_sum, mine);
  __syncthreads();
  if (threadIdx.x == 0 && block_sum != 0) atomicAdd(total, block_sum);
}

__global__ void pr_init_kernel(int64_t n, float* rank, float* acc) {
  const float r0 = 1.0f / static_cast<float>(n);
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    rank[v] = r0;
    acc[v] = 0.0f;
  }
}

__global__ void pr_contrib_kernel(int64_t n, const int64_t* __restrict__ indptr, const float* __restrict__ rank,
                                  float* contrib, PageRankScalars* scalars, const long long* done) {
  if (pr_done(done)) return;
  double dangling = 0;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t deg = indptr[v + 1] - indptr[v];
    if (deg == 0) {
      dangling += rank[v];
      contrib[v] = 0.0f;
    } else {
      contrib[v] = rank[v] / static_cast<float>(deg);
    }
  }
  add_block_double(dangling, &scalars->dangling);
}

template <int kVariant, typename T>
__global__ void pr_sweep_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                const float* __restrict__ contrib, float* acc, const long long* done,
                                long long* stats) {
  if (pr_done(done)) return;
  unsigned long long edges = 0;
  sweep_edges<kVariant, T>(
      n, indptr, indices, [](int64_t) { return false; },
      [&](int64_t v, int64_t u) { atomicAdd(acc + u, contrib[v]); }, edges);
  add_block_count(edges, stats);
}

__global__ void pr_update_kernel(int64_t n, float* rank, float* acc, double alpha, PageRankScalars* scalars,
                                 const long long* done) {
  if (pr_done(done)) return;
  const double inv_n = 1.0 / static_cast<double>(n);
  const float base = static_cast<float>((1.0 - alpha) * inv_n + alpha * scalars->dangling * inv_n);
  const float a = static_cast<float>(alpha);
  double diff = 0;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < n;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float r = base + a * acc[u];
    diff += fabs(static_cast<double>(r) - static_cast<double>(rank[u]));
    rank[u] = r;
    acc[u] = 0.0f;
  }
  add_block_double(diff, &scalars->diff);
}

__global__ void pr_finish_kernel(PageRankScalars* scalars, long long* done, long long* stats, double tol) {
  if (*done) return;
  stats[1] += 1;
  if (scalars->diff < tol) *done = 1;
  scalars->dangling = 0;
  scalars->diff = 0;
}

template <typename T>
void pagerank_run(const at::Tensor& indptr, const at::Tensor& indices, int64_t n, double alpha, double tol,
                  int64_t max_iter, int64_t variant, at::Tensor& rank, at::Tensor& stats) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  float* r = rank.data_ptr<float>();
  at::Tensor acc = at::empty({n}, rank.options());
  at::Tensor contrib = at::empty({n}, rank.options());
  at::Tensor scalars_t = at::zeros({2}, rank.options().dtype(at::kDouble));
  at::Tensor done_t = at::zeros({1}, stats.options());
  float* a = acc.data_ptr<float>();
  float* c = contrib.data_ptr<float>();
  auto* scalars = reinterpret_cast<PageRankScalars*>(scalars_t.data_ptr<double>());
  auto* done = reinterpret_cast<long long*>(done_t.data_ptr<int64_t>());
  auto* st = reinterpret_cast<long long*>(stats.data_ptr<int64_t>());
  const int64_t vertex_blocks = grid_blocks(1, n);
  const int64_t warp_blocks = grid_blocks(kWarp, n);
  const int64_t slice_blocks = grid_blocks(kWarp, indices.numel() / kSliceEdges + 2);
  pr_init_kernel<<<vertex_blocks, kBlock, 0, stream>>>(n, r, a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto launch = [&]() {
    pr_contrib_kernel<<<vertex_blocks, kBlock, 0, stream>>>(n, off, r, c, scalars, done);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    switch (variant) {
      case kNaive:
        pr_sweep_kernel<kNaive, T><<<vertex_blocks, kBlock, 0, stream>>>(n, off, col, c, a, done, st);
        break;
      case kMerged:
        pr_sweep_kernel<kMerged, T><<<warp_blocks, kBlock, 0, stream>>>(n, off, col, c, a, done, st);
        break;
      case kAligned:
        pr_sweep_kernel<kAligned, T><<<warp_blocks, kBlock, 0, stream>>>(n, off, col, c, a, done, st);
        break;
      default:
        pr_sweep_kernel<kFrontier, T><<<slice_blocks, kBlock, 0, stream>>>(n, off, col, c, a, done, st);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    pr_update_kernel<<<vertex_blocks, kBlock, 0, stream>>>(n, r, a, alpha, scalars, done);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    pr_finish_kernel<<<1, 1, 0, stream>>>(scalars, done, st, tol);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  at::Tensor pinned = at::empty({1}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  auto* host_done = reinterpret_cast<long long*>(pinned.data_ptr<int64_t>());
  int64_t launched = 0, batch = 1;
  while (launched < max_iter) {
    const int64_t stop = std::min(max_iter, launched + batch);
    for (; launched < stop; ++launched) launch();
    C10_CUDA_CHECK(cudaMemcpyAsync(host_done, done, sizeof(long long), cudaMemcpyDeviceToHost, stream));
    C10_CUDA_CHECK(cudaStreamSynchronize(stream));
    if (*host_done) break;
    batch = std::min<int64_t>(batch * 2, 16);
  }
}

std::tuple<at::Tensor, at::Tensor> pagerank_cuda(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                                                 double alpha, double tol, int64_t max_iter, int64_t variant) {
  check_variant(variant, "pagerank");
  TORCH_CHECK_VALUE(alpha >= 0 && alpha <= 1, "pagerank: alpha must be in [0, 1], got ", alpha);
  TORCH_CHECK_VALUE(tol >= 0, "pagerank: tol must be >= 0, got ", tol);
  TORCH_CHECK_VALUE(max_iter >= 0, "pagerank: max_iter must be >= 0, got ", max_iter);
  const int64_t n = check_cuda_csr(indptr_in, indices_in, "pagerank");
  c10::cuda::OptionalCUDAGuard guard(indptr_in.device());
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  at::Tensor rank = at::empty({n}, indptr.options().dtype(at::kFloat));
  at::Tensor stats = at::zeros({2}, indptr.options());
  if (n > 0) {
    AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "pagerank", [&] {
      pagerank_run<index_t>(indptr, indices, n, alpha, tol, max_iter, variant, rank, stats);
    });
  }
  return {rank, stats};
}

}  // namespace
}  // namespace traversal

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("graph_pagerank", traversal::pagerank_cuda);
}

}  // namespace zerocopy
