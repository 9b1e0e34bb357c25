// Argument checks of zerocopy::block_mean and block_mean_backward, shared by the CPU and CUDA
// kernels so both refuse the same calls with the same messages.
#pragma once

#include "checks.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

namespace zerocopy {

// src and dst: 1-D int32/int64 edge lists of one length, on `like`'s device.
inline void check_block_edges(const char* op, const at::Tensor& like, const char* like_name,
                              const at::Tensor& src, const at::Tensor& dst) {
  TORCH_CHECK_VALUE(src.dim() == 1, op, ": src must be a 1-D tensor of edge sources, got shape ", src.sizes());
  TORCH_CHECK_VALUE(dst.dim() == 1, op, ": dst must be a 1-D tensor of edge destinations, got shape ", dst.sizes());
  TORCH_CHECK_TYPE(src.scalar_type() == at::kInt || src.scalar_type() == at::kLong, op,
                   ": src must be int32 or int64, got ", src.scalar_type());
  TORCH_CHECK_TYPE(dst.scalar_type() == src.scalar_type(), op, ": dst must have src's dtype (",
                   src.scalar_type(), "), got ", dst.scalar_type());
  TORCH_CHECK_VALUE(src.numel() == dst.numel(), op, ": src and dst must have one length, got ", src.numel(),
                    " and ", dst.numel());
  TORCH_CHECK_VALUE(src.device() == like.device() && dst.device() == like.device(), op,
                    ": src and dst must be on ", like_name, "'s device (", like.device(), "), got ", src.device(),
                    " and ", dst.device());
}

inline void check_block_mean_args(const at::Tensor& h_src, const at::Tensor& src, const at::Tensor& dst,
                                  int64_t n_dst) {
  TORCH_CHECK_VALUE(h_src.dim() == 2, "block_mean: h_src must be a 2-D tensor [n_src, features], got shape ",
                    h_src.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(h_src.scalar_type()), "block_mean: h_src must be floating point, got ",
                   h_src.scalar_type());
  TORCH_CHECK_VALUE(n_dst >= 0, "block_mean: n_dst must be >= 0, got ", n_dst);
  check_block_edges("block_mean", h_src, "h_src", src, dst);
}

inline void check_block_mean_backward_args(const at::Tensor& grad_out, const at::Tensor& src,
                                           const at::Tensor& dst, const at::Tensor& inv_deg, int64_t n_src) {
  TORCH_CHECK_VALUE(grad_out.dim() == 2, "block_mean_backward: grad_out must be a 2-D tensor, got shape ",
                    grad_out.sizes());
  TORCH_CHECK_TYPE(at::isFloatingType(grad_out.scalar_type()),
                   "block_mean_backward: grad_out must be floating point, got ", grad_out.scalar_type());
  TORCH_CHECK_VALUE(n_src >= 0, "block_mean_backward: n_src must be >= 0, got ", n_src);
  TORCH_CHECK_VALUE(inv_deg.dim() == 1 && inv_deg.size(0) == grad_out.size(0),
                    "block_mean_backward: inv_deg must be 1-D with one entry per row of grad_out (",
                    grad_out.size(0), "), got shape ", inv_deg.sizes());
  TORCH_CHECK_TYPE(inv_deg.scalar_type() == at::kFloat || inv_deg.scalar_type() == at::kDouble,
                   "block_mean_backward: inv_deg must be float32 or float64, got ", inv_deg.scalar_type());
  TORCH_CHECK_VALUE(inv_deg.device() == grad_out.device(), "block_mean_backward: inv_deg must be on grad_out's ",
                    "device (", grad_out.device(), "), got ", inv_deg.device());
  check_block_edges("block_mean_backward", grad_out, "grad_out", src, dst);
}

}  // namespace zerocopy
