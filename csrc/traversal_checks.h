// Argument checks and constants shared by the CPU and CUDA traversal kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include "checks.h"

namespace zerocopy {

// Traversal variants, as the `variant` argument of the graph_* ops carries them.
enum TraversalVariant : int64_t {
  kNaive = 0,     // thread per vertex
  kMerged = 1,    // warp per vertex, consecutive lanes read consecutive neighbours
  kAligned = 2,   // merged, first read moved back to the preceding 128-byte boundary
  kFrontier = 3,  // bfs/sssp: queue of active vertices; cc/pagerank: edge-balanced sweep
};

inline void check_variant(int64_t variant, const char* op) {
  TORCH_CHECK_VALUE(variant >= kNaive && variant <= kFrontier, op,
                    ": variant must be 0 (naive), 1 (merged), 2 (aligned) or 3 (frontier), got ",
                    variant);
}

// Checks the CSR arrays' dtypes, ranks and that they live on `device_type`; returns num_nodes.
inline int64_t check_csr(const at::Tensor& indptr, const at::Tensor& indices, const char* op) {
  check_dim(indptr, 1, "indptr");
  check_dim(indices, 1, "indices");
  check_dtype(indptr, at::kLong, "indptr");
  check_index_dtype(indices, "indices");
  TORCH_CHECK_VALUE(indptr.numel() >= 1, op, ": indptr must hold num_nodes + 1 >= 1 offsets, got ",
                    indptr.numel());
  check_same_device(indptr, "indptr", indices, "indices");
  return indptr.numel() - 1;
}

inline void check_source(int64_t source, int64_t num_nodes, const char* op) {
  TORCH_CHECK_INDEX(source >= 0 && source < num_nodes, op, ": source must be in [0, ", num_nodes,
                    "), got ", source);
}

inline void check_weights(const at::Tensor& weights, const at::Tensor& indices) {
  check_dim(weights, 1, "weights");
  TORCH_CHECK_TYPE(weights.scalar_type() == at::kFloat || weights.scalar_type() == at::kInt,
                   "weights must be float32 or int32, got ", weights.scalar_type());
  TORCH_CHECK_VALUE(weights.numel() == indices.numel(), "weights must have one entry per edge (",
                    indices.numel(), "), got ", weights.numel());
  check_same_device(weights, "weights", indices, "indices");
}

// Distance dtype of sssp: float32 for float32 weights, int64 for int32 or unit weights.
inline at::ScalarType sssp_dist_dtype(const std::optional<at::Tensor>& weights) {
  return (weights.has_value() && weights->scalar_type() == at::kFloat) ? at::kFloat : at::kLong;
}

}  // namespace zerocopy
