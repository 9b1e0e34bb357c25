// The autograd kernel of zerocopy::block_mean, in C++ so that a training step pays no Python
// on either pass: forward calls the device kernel below autograd and saves the edges and
// inv_deg; backward is one call of zerocopy::block_mean_backward. Differentiable in h_src
// only; inv_deg is marked non-differentiable.

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <tuple>

namespace zerocopy {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::tuple<at::Tensor, at::Tensor> call_block_mean(const at::Tensor& h_src, const at::Tensor& src,
                                                   const at::Tensor& dst, int64_t n_dst) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("zerocopy::block_mean", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                                 const at::Tensor&, int64_t)>();
  return op.call(h_src, src, dst, n_dst);
}

at::Tensor call_block_mean_backward(const at::Tensor& grad_out, const at::Tensor& src, const at::Tensor& dst,
                                    const at::Tensor& inv_deg, int64_t n_src) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("zerocopy::block_mean_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, int64_t)>();
  return op.call(grad_out, src, dst, inv_deg, n_src);
}

class BlockMean : public torch::autograd::Function<BlockMean> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& h_src, const at::Tensor& src,
                               const at::Tensor& dst, int64_t n_dst) {
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto [out, inv_deg] = call_block_mean(h_src, src, dst, n_dst);
    ctx->save_for_backward({src, dst, inv_deg});
    ctx->saved_data["n_src"] = h_src.size(0);
    ctx->mark_non_differentiable({inv_deg});
    return {out, inv_deg};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    at::Tensor grad_h;
    if (grads[0].defined()) {
      grad_h = call_block_mean_backward(grads[0].contiguous(), saved[0], saved[1], saved[2],
                                        ctx->saved_data["n_src"].toInt());
    }
    return {grad_h, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> block_mean_autograd(const at::Tensor& h_src, const at::Tensor& src,
                                                       const at::Tensor& dst, int64_t n_dst) {
  auto outs = BlockMean::apply(h_src, src, dst, n_dst);
  return {outs[0], outs[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, Autograd, m) {
  m.impl("block_mean", block_mean_autograd);
}

}  // namespace zerocopy
