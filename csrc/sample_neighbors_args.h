// Argument checks of zerocopy::sample_neighbors shared by its CPU and CUDA kernels.
#pragma once

#include "checks.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <optional>

namespace zerocopy {

inline void check_sample_neighbors_args(const at::Tensor& indptr, const at::Tensor& indices,
                                        const at::Tensor& seeds, int64_t fanout,
                                        const std::optional<at::Tensor>& probs) {
  check_dim(indptr, 1, "indptr");
  check_dim(indices, 1, "indices");
  check_dim(seeds, 1, "seeds");
  check_dtype(indptr, at::kLong, "indptr");
  check_index_dtype(indices, "indices");
  check_index_dtype(seeds, "seeds");
  TORCH_CHECK_VALUE(indptr.numel() >= 1, "indptr must hold num_nodes + 1 >= 1 entries, got none");
  TORCH_CHECK_VALUE(fanout >= -1, "fanout must be -1 (all neighbours) or >= 0, got ", fanout);
  if (probs) {
    check_dim(*probs, 1, "probs");
    check_dtype(*probs, at::kFloat, "probs");
    TORCH_CHECK_VALUE(probs->numel() == indices.numel(), "probs must hold one value per edge (",
                      indices.numel(), " edges), got ", probs->numel());
  }
  check_same_device(indptr, "indptr", indices, "indices");
  check_same_device(indptr, "indptr", seeds, "seeds");
  if (probs) check_same_device(indptr, "indptr", *probs, "probs");
}

}  // namespace zerocopy
