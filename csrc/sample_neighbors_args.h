// Argument checks of the sampling ops (zerocopy::sample_neighbors, compact_ids, sample_layers),
// shared by their CPU and CUDA kernels. These check what is O(1) to check; the contents of the
// graph (offsets, neighbour ids, edge ids, probabilities) are checked by the kernels on the data
// they visit (csrc/sampling_errors.h).
#pragma once

#include "checks.h"
#include "sampling.h"

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
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

// Also returns the checked `frontier` argument as the rule it names.
inline sampling::Frontier check_sample_layers_args(const at::Tensor& indptr, const at::Tensor& indices,
                                                   const at::Tensor& seeds, c10::IntArrayRef fanouts,
                                                   const std::optional<at::Tensor>& probs,
                                                   const std::optional<at::Tensor>& eids, int64_t frontier) {
  TORCH_CHECK_VALUE(frontier == static_cast<int64_t>(sampling::Frontier::kAll) ||
                        frontier == static_cast<int64_t>(sampling::Frontier::kNew),
                    "frontier must be 0 (every node of the previous layer) or 1 (the nodes first reached in the "
                    "previous layer), got ", frontier);
  TORCH_CHECK_VALUE(!fanouts.empty(), "fanouts must hold at least one fanout (one per layer)");
  for (const int64_t f : fanouts) {
    TORCH_CHECK_VALUE(f >= -1, "fanouts must be -1 (all neighbours) or >= 0, got ", fanouts);
  }
  check_sample_neighbors_args(indptr, indices, seeds, 0, probs);
  if (eids) {
    check_dim(*eids, 1, "eids");
    check_dtype(*eids, at::kLong, "eids");
    TORCH_CHECK_VALUE(eids->numel() == indices.numel(), "eids must hold one edge id per position of indices (",
                      indices.numel(), "), got ", eids->numel());
    check_same_device(indptr, "indptr", *eids, "eids");
  }
  return static_cast<sampling::Frontier>(frontier);
}

inline void check_compact_ids_args(const at::Tensor& seeds, const at::Tensor& neighbors) {
  check_dim(seeds, 1, "seeds");
  check_dim(neighbors, 1, "neighbors");
  check_index_dtype(seeds, "seeds");
  check_index_dtype(neighbors, "neighbors");
  check_same_device(seeds, "seeds", neighbors, "neighbors");
}

}  // namespace zerocopy
