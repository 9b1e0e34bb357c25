// zerocopy::block_mean and block_mean_backward on the CPU (see csrc/zerocopy.cpp for the
// contract). Built from ATen's index_select / index_add_, which are vectorised over the feature
// columns; sums are taken in the op-math type (float32 for 16-bit inputs). Ids are checked
// first: an id out of range raises IndexError naming it. inv_deg has the op-math type.

#include "block_mean.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

namespace zerocopy {

namespace {

void check_ids_in_range(const char* op, const at::Tensor& ids, const char* name, int64_t bound) {
  if (ids.numel() == 0) return;
  const int64_t lo = ids.min().item<int64_t>();
  const int64_t hi = ids.max().item<int64_t>();
  TORCH_CHECK_INDEX(lo >= 0 && hi < bound, op, ": ", name, " holds ids outside [0, ", bound, "): ",
                    lo < 0 ? lo : hi);
}

at::ScalarType accumulate_type(at::ScalarType t) {
  return t == at::kDouble ? at::kDouble : at::kFloat;
}

std::tuple<at::Tensor, at::Tensor> block_mean_cpu(const at::Tensor& h_src, const at::Tensor& src,
                                                  const at::Tensor& dst, int64_t n_dst) {
  check_block_mean_args(h_src, src, dst, n_dst);
  check_ids_in_range("block_mean", src, "src", h_src.size(0));
  check_ids_in_range("block_mean", dst, "dst", n_dst);
  const auto acc = accumulate_type(h_src.scalar_type());
  at::Tensor degree = at::zeros({n_dst}, h_src.options().dtype(acc));
  degree.index_add_(0, dst, at::ones({dst.numel()}, degree.options()));
  at::Tensor inv_deg = degree.clamp_min_(1).reciprocal_();
  at::Tensor sums = at::zeros({n_dst, h_src.size(1)}, h_src.options().dtype(acc));
  sums.index_add_(0, dst, h_src.index_select(0, src).to(acc));
  sums.mul_(inv_deg.unsqueeze(1));
  return {sums.to(h_src.scalar_type()), inv_deg};
}

at::Tensor block_mean_backward_cpu(const at::Tensor& grad_out, const at::Tensor& src, const at::Tensor& dst,
                                   const at::Tensor& inv_deg, int64_t n_src) {
  check_block_mean_backward_args(grad_out, src, dst, inv_deg, n_src);
  check_ids_in_range("block_mean_backward", src, "src", n_src);
  check_ids_in_range("block_mean_backward", dst, "dst", grad_out.size(0));
  const auto acc = accumulate_type(grad_out.scalar_type());
  at::Tensor scaled = grad_out.to(acc) * inv_deg.to(acc).unsqueeze(1);
  at::Tensor grad = at::zeros({n_src, grad_out.size(1)}, grad_out.options().dtype(acc));
  grad.index_add_(0, src, scaled.index_select(0, dst));
  return grad.to(grad_out.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) {
  m.impl("block_mean", block_mean_cpu);
  m.impl("block_mean_backward", block_mean_backward_cpu);
}

}  // namespace zerocopy
