// Argument checks and constants shared by the CPU and CUDA traversal kernels.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <limits>
#include <optional>

#include "checks.h"

namespace zerocopy {

// Traversal variants, as the `variant` argument of the graph_* ops carries them. Which ops
// accept which variant: see variant_allowed.
enum TraversalVariant : int64_t {
  kNaive = 0,      // thread per vertex
  kMerged = 1,     // warp per vertex, consecutive lanes read consecutive neighbours
  kAligned = 2,    // merged, first read moved back to the preceding 128-byte boundary
  kFrontier = 3,   // bfs/sssp: queue of active vertices; cc: sampled; pagerank: edge-balanced sweep
  kDirection = 4,  // bfs: direction-optimizing (bottom-up steps read in-neighbour lists)
  kAsync = 5,      // bfs/sssp/pagerank: one persistent kernel over a device worklist
  kPush = 6,       // pagerank: residual push to a stated accuracy
  kStaged = 7,     // cc: edge list streamed through GPU memory in chunks by DMA
};

enum class TraversalOp { kBfs, kSssp, kConnectedComponents, kPagerank };

inline const char* traversal_op_name(TraversalOp op) {
  switch (op) {
    case TraversalOp::kBfs:
      return "bfs";
    case TraversalOp::kSssp:
      return "sssp";
    case TraversalOp::kConnectedComponents:
      return "connected_components";
    default:
      return "pagerank";
  }
}

inline bool variant_allowed(int64_t variant, TraversalOp op) {
  if (variant >= kNaive && variant <= kFrontier) return true;
  switch (op) {
    case TraversalOp::kBfs:
      return variant == kDirection || variant == kAsync;
    case TraversalOp::kSssp:
      return variant == kAsync;
    case TraversalOp::kConnectedComponents:
      return variant == kStaged;
    default:
      return variant == kPush || variant == kAsync;
  }
}

inline void check_variant(int64_t variant, TraversalOp op) {
  const char* allowed = "0 (naive), 1 (merged), 2 (aligned), 3 (frontier)";
  switch (op) {
    case TraversalOp::kBfs:
      allowed = "0 (naive), 1 (merged), 2 (aligned), 3 (frontier), 4 (direction), 5 (async)";
      break;
    case TraversalOp::kSssp:
      allowed = "0 (naive), 1 (merged), 2 (aligned), 3 (frontier), 5 (async)";
      break;
    case TraversalOp::kConnectedComponents:
      allowed = "0 (naive), 1 (merged), 2 (aligned), 3 (frontier), 7 (staged)";
      break;
    default:
      allowed = "0 (naive), 1 (merged), 2 (aligned), 3 (frontier), 5 (async), 6 (push)";
  }
  TORCH_CHECK_VALUE(variant_allowed(variant, op), traversal_op_name(op), ": variant must be one of ", allowed,
                    ", got ", variant);
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

// The in-neighbour lists (the transpose) bfs's direction variant reads in bottom-up steps: both
// or neither given, shaped like the graph (num_nodes + 1 offsets, one id per edge, the ids'
// dtype) and on its device. Their offsets are trusted like the graph's (CSRGraph builds them).
inline void check_in_lists(int64_t variant, const std::optional<at::Tensor>& in_indptr,
                           const std::optional<at::Tensor>& in_indices, const at::Tensor& indptr,
                           const at::Tensor& indices) {
  TORCH_CHECK_VALUE(variant != kDirection || in_indptr.has_value() || in_indices.has_value(),
                    "bfs: the direction variant reads in-neighbour lists: pass in_indptr and in_indices (the "
                    "graph itself when it is symmetric, else its transpose, CSRGraph.csc())");
  TORCH_CHECK_VALUE(in_indptr.has_value() == in_indices.has_value(),
                    "bfs: in_indptr and in_indices must be given together, got only ",
                    in_indptr.has_value() ? "in_indptr" : "in_indices");
  if (!in_indptr.has_value()) return;
  check_dim(*in_indptr, 1, "in_indptr");
  check_dim(*in_indices, 1, "in_indices");
  check_dtype(*in_indptr, at::kLong, "in_indptr");
  TORCH_CHECK_TYPE(in_indices->scalar_type() == indices.scalar_type(), "in_indices must have the dtype of indices (",
                   indices.scalar_type(), "), got ", in_indices->scalar_type());
  TORCH_CHECK_VALUE(in_indptr->numel() == indptr.numel(), "in_indptr must hold num_nodes + 1 = ", indptr.numel(),
                    " offsets, got ", in_indptr->numel());
  TORCH_CHECK_VALUE(in_indices->numel() == indices.numel(), "in_indices must hold one id per edge (",
                    indices.numel(), "), got ", in_indices->numel());
  check_same_device(*in_indptr, "in_indptr", indptr, "indptr");
  check_same_device(*in_indices, "in_indices", indices, "indices");
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

inline void check_pagerank_args(double alpha, double tol, int64_t max_iter) {
  TORCH_CHECK_VALUE(alpha >= 0 && alpha <= 1, "pagerank: alpha must be in [0, 1], got ", alpha);
  TORCH_CHECK_VALUE(tol >= 0, "pagerank: tol must be >= 0, got ", tol);
  TORCH_CHECK_VALUE(max_iter >= 0, "pagerank: max_iter must be >= 0, got ", max_iter);
}

// PageRank's accuracy contract: `tol` bounds the L1 distance of the result to the exact
// PageRank. The iteration x <- G(x) contracts L1 distances by alpha, so
// |x_{k+1} - x*| <= alpha / (1 - alpha) * |x_{k+1} - x_k|: power iteration stops once the change
// of an iteration is at most this threshold (infinite for alpha == 0, whose first iterate is
// exact).
inline double pagerank_change_threshold(double alpha, double tol) {
  return alpha > 0 ? tol * (1.0 - alpha) / alpha : std::numeric_limits<double>::infinity();
}

// Residual push keeps x* = x + (I - alpha M)^-1 r, and |(I - alpha M)^-1|_1 = 1 / (1 - alpha), so
// x is within tol once |r|_1 <= (1 - alpha) * tol (the async variant's target).
inline double pagerank_residual_target(double alpha, double tol) { return (1.0 - alpha) * tol; }

// The push variant returns x + r instead: x* - (x + r) = alpha M (I - alpha M)^-1 r, at most
// alpha / (1 - alpha) |r|_1 in L1, so it stops once |r|_1 is at most power iteration's change
// threshold (the same bound; a round sooner than x alone).
inline double pagerank_push_target(double alpha, double tol) { return pagerank_change_threshold(alpha, tol); }

// Distance dtype of sssp: float32 for float32 weights, int64 for int32 or unit weights.
inline at::ScalarType sssp_dist_dtype(const std::optional<at::Tensor>& weights) {
  return (weights.has_value() && weights->scalar_type() == at::kFloat) ? at::kFloat : at::kLong;
}

}  // namespace zerocopy
