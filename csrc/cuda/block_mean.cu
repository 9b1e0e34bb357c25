// zerocopy::block_mean and block_mean_backward on the GPU (see csrc/zerocopy.cpp for the
// contract).
//
// Both passes are one scatter kernel: a warp per edge adds a row of `in` (scaled, in backward,
// by the source row's inv_deg) into a row of an accumulator with atomics, its lanes striding
// over the features; forward also counts each destination's edges. Forward then runs one
// elementwise kernel that divides by the degree and writes inv_deg. Sums and inv_deg are in
// the op-math type (float32 for 16-bit inputs), the sums in the output itself when the types
// agree.
// Host cost: one dispatched op and at most four launches or memsets per pass; nothing reads
// back to the host, so a training step stays free of synchronisation. An edge whose ids are
// out of range is skipped without touching memory (the CPU kernel raises instead).

#include "block_mean.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/cuda/Atomic.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <type_traits>

namespace zerocopy {

namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;

// acc[to[e]] += in[from[e]] * (scale ? scale[from[e]] : 1) for every edge e whose ids lie in
// [0, in_rows) and [0, acc_rows); count[to[e]] += 1 when count is given.
template <typename scalar_t, typename acc_t, typename index_t>
__global__ void scatter_rows_kernel(const scalar_t* __restrict__ in, int64_t in_rows,
                                    const index_t* __restrict__ from, const index_t* __restrict__ to,
                                    int64_t edges, int64_t features, const acc_t* __restrict__ scale,
                                    acc_t* __restrict__ acc, int64_t acc_rows, float* __restrict__ count) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / kWarp);
  for (int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp; e < edges; e += warps) {
    const int64_t s = static_cast<int64_t>(from[e]);
    const int64_t d = static_cast<int64_t>(to[e]);
    if (s < 0 || s >= in_rows || d < 0 || d >= acc_rows) continue;
    const acc_t w = scale != nullptr ? scale[s] : acc_t(1);
    const scalar_t* row = in + s * features;
    acc_t* out = acc + d * features;
    for (int64_t f = lane; f < features; f += kWarp) gpuAtomicAdd(out + f, static_cast<acc_t>(row[f]) * w);
    if (count != nullptr && lane == 0) gpuAtomicAdd(count + d, 1.0f);
  }
}

// out[d, f] = acc[d, f] / max(count[d], 1); inv_deg[d] = 1 / max(count[d], 1). out may be acc.
template <typename scalar_t, typename acc_t>
__global__ void divide_by_degree_kernel(const acc_t* acc, const float* __restrict__ count, int64_t rows,
                                        int64_t features, scalar_t* out, acc_t* __restrict__ inv_deg) {
  const int64_t n = rows * features;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t d = i / features;
    const acc_t inv = acc_t(1) / static_cast<acc_t>(fmaxf(count[d], 1.0f));
    out[i] = static_cast<scalar_t>(acc[i] * inv);
    if (i % features == 0) inv_deg[d] = inv;
  }
}

unsigned blocks_for(int64_t threads_needed) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(kMaxBlocks, (threads_needed + kThreads - 1) / kThreads)));
}

void zero_async(const at::Tensor& t, cudaStream_t stream) {
  if (t.numel() > 0) C10_CUDA_CHECK(cudaMemsetAsync(t.data_ptr(), 0, t.nbytes(), stream));
}

template <typename scalar_t, typename acc_t>
void scatter_rows(const at::Tensor& in, const at::Tensor& from, const at::Tensor& to, const at::Tensor& scale,
                  const at::Tensor& acc, const at::Tensor& count, cudaStream_t stream) {
  const int64_t edges = from.numel();
  if (edges == 0) return;  // with no features the kernel still counts degrees
  AT_DISPATCH_INDEX_TYPES(from.scalar_type(), "block_mean", [&] {
    scatter_rows_kernel<scalar_t, acc_t, index_t><<<blocks_for(edges * kWarp), kThreads, 0, stream>>>(
        in.data_ptr<scalar_t>(), in.size(0), from.data_ptr<index_t>(), to.data_ptr<index_t>(), edges, in.size(1),
        scale.defined() ? scale.data_ptr<acc_t>() : nullptr, acc.data_ptr<acc_t>(), acc.size(0),
        count.defined() ? count.data_ptr<float>() : nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

std::tuple<at::Tensor, at::Tensor> block_mean_cuda(const at::Tensor& h_src_in, const at::Tensor& src_in,
                                                   const at::Tensor& dst_in, int64_t n_dst) {
  check_block_mean_args(h_src_in, src_in, dst_in, n_dst);
  const c10::cuda::OptionalCUDAGuard guard(h_src_in.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor h_src = h_src_in.contiguous(), src = src_in.contiguous(), dst = dst_in.contiguous();
  const int64_t features = h_src.size(1);
  at::Tensor out = at::empty({n_dst, features}, h_src.options());
  at::Tensor inv_deg = at::empty({n_dst}, h_src.options().dtype(h_src.scalar_type() == at::kDouble ? at::kDouble
                                                                                             : at::kFloat));
  at::Tensor count = at::empty({n_dst}, h_src.options().dtype(at::kFloat));
  zero_async(count, stream);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, h_src.scalar_type(), "block_mean", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    at::Tensor acc = std::is_same_v<scalar_t, acc_t> ? out : at::empty({n_dst, features}, h_src.options().dtype(
                                                                                 c10::CppTypeToScalarType<acc_t>::value));
    zero_async(acc, stream);
    scatter_rows<scalar_t, acc_t>(h_src, src, dst, at::Tensor(), acc, count, stream);
    if (n_dst > 0) {
      divide_by_degree_kernel<scalar_t, acc_t><<<blocks_for(std::max<int64_t>(n_dst * features, 1)), kThreads, 0,
                                                 stream>>>(acc.data_ptr<acc_t>(), count.data_ptr<float>(), n_dst,
                                                           features, out.data_ptr<scalar_t>(),
                                                           inv_deg.data_ptr<acc_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  if (features == 0 && n_dst > 0) {
    // No feature element carries inv_deg out of the divide kernel: compute it directly.
    inv_deg.copy_(count.clamp_min(1).reciprocal());
  }
  return {out, inv_deg};
}

at::Tensor block_mean_backward_cuda(const at::Tensor& grad_in, const at::Tensor& src_in, const at::Tensor& dst_in,
                                    const at::Tensor& inv_deg_in, int64_t n_src) {
  check_block_mean_backward_args(grad_in, src_in, dst_in, inv_deg_in, n_src);
  const c10::cuda::OptionalCUDAGuard guard(grad_in.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor grad_out = grad_in.contiguous(), src = src_in.contiguous(), dst = dst_in.contiguous();
  const int64_t features = grad_out.size(1);
  at::Tensor grad_h;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_out.scalar_type(), "block_mean_backward", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const auto acc_type = c10::CppTypeToScalarType<acc_t>::value;
    const at::Tensor inv_deg = inv_deg_in.to(acc_type).contiguous();
    at::Tensor acc = at::empty({n_src, features}, grad_out.options().dtype(acc_type));
    zero_async(acc, stream);
    // Edges run dst -> src here: rows of grad_out are read, rows of grad_h accumulated.
    scatter_rows<scalar_t, acc_t>(grad_out, dst, src, inv_deg, acc, at::Tensor(), stream);
    grad_h = std::is_same_v<scalar_t, acc_t> ? acc : acc.to(grad_out.scalar_type());
  });
  return grad_h;
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("block_mean", block_mean_cuda);
  m.impl("block_mean_backward", block_mean_backward_cuda);
}

}  // namespace zerocopy
