// The exceptions of the sampling ops, raised from the error words of csrc/sampling.h.
//
// Kernels never trust the graph: every seed they visit, every offset pair they read, every
// neighbour id, edge id and probability they use is checked, and the first offender of each
// kind is recorded (CPU: ErrorWords below; CUDA: the same words in device memory, read with the
// op's one host synchronisation). raise_first_sample_error then raises for the first kind that
// fired, reading the offending values from the inputs (a few small reads, on the error path
// only), with a message that names the argument.
#pragma once

#include "sampling.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

namespace zerocopy {

// The tensors an error message reads from (any device).
struct SampleInputs {
  const at::Tensor& indptr;
  const at::Tensor& indices;
  const at::Tensor& seeds;
  const std::optional<at::Tensor>& probs;
  const std::optional<at::Tensor>& eids;
};

namespace detail {

inline int64_t value_at(const at::Tensor& t, int64_t i) {
  return t.select(0, i).to(at::kLong).item<int64_t>();
}

}  // namespace detail

// Raises for node v whose offsets are not 0 <= indptr[v] <= indptr[v + 1] <= num_edges (the
// arrays' names as the op's arguments call them: "indptr"/"indices", or a transpose's).
[[noreturn]] inline void raise_bad_offsets(const char* op, int64_t v, const at::Tensor& indptr, int64_t num_edges,
                                           const char* indptr_name = "indptr", const char* indices_name = "indices") {
  TORCH_CHECK_VALUE(false, op, ": ", indptr_name, " is not a valid offset array at node ", v, ": ", indptr_name, "[",
                    v, "] = ", detail::value_at(indptr, v), ", ", indptr_name, "[", v + 1, "] = ",
                    detail::value_at(indptr, v + 1), " with ", num_edges, " entries in ", indices_name, " (need 0 <= ",
                    indptr_name, "[v] <= ", indptr_name, "[v + 1] <= len(", indices_name, "))");
}

// Raises for position e of an id array whose id is outside [0, num_nodes).
[[noreturn]] inline void raise_bad_neighbor(const char* op, int64_t e, const at::Tensor& indices, int64_t num_nodes,
                                            const char* indices_name = "indices") {
  TORCH_CHECK_VALUE(false, op, ": ", indices_name, "[", e, "] = ", detail::value_at(indices, e),
                    " is out of range for a graph with ", num_nodes, " nodes");
}

// Raises for a bad seed (kBadSeed: out of [0, num_nodes); kDuplicateSeed: repeats an earlier
// one) recorded at `where`.
[[noreturn]] inline void raise_seed_error(const char* op, int kind, int64_t where, const at::Tensor& seeds,
                                          int64_t num_nodes) {
  if (kind == sampling::kBadSeed) {
    TORCH_CHECK_INDEX(false, op, ": seeds[", where, "] = ", detail::value_at(seeds, where),
                      " is out of range for a graph with ", num_nodes, " nodes");
  }
  TORCH_CHECK_VALUE(false, op, ": seeds must not repeat a node id (a message flow graph numbers each node "
                    "once): seeds[", where, "] = ", detail::value_at(seeds, where), " repeats an earlier seed");
}

// Raises the exception of error `kind` recorded at `where` (see sampling::SampleError).
[[noreturn]] inline void raise_sample_error(const char* op, int kind, int64_t where, const SampleInputs& in) {
  using namespace sampling;
  const int64_t num_nodes = in.indptr.numel() - 1;
  const int64_t num_edges = in.indices.numel();
  switch (kind) {
    case kBadSeed:
    case kDuplicateSeed:
      raise_seed_error(op, kind, where, in.seeds, num_nodes);
    case kBadIndptr:
      raise_bad_offsets(op, where, in.indptr, num_edges);
    case kBadNeighbor:
      raise_bad_neighbor(op, where, in.indices, num_nodes);
    case kBadEdgeId:
      TORCH_CHECK_VALUE(false, op, ": eids[", where, "] = ", detail::value_at(*in.eids, where),
                        " is not an edge id of a graph with ", num_edges, " edges");
    case kBadProb:
      TORCH_CHECK_VALUE(false, op, ": probs[", where, "] = ", in.probs->select(0, where).item<float>(),
                        ": sampling probabilities must be finite and >= 0");
    default:
      TORCH_CHECK(false, op, ": internal error ", kind, " at ", where,
                  " (the graph must not change while it is sampled)");
  }
}

// The same for a sample of paged lists (a DynamicGraph, csrc/dynamic_graph.h): seed errors as
// above; anything else means the graph's state is not what its own ops wrote.
inline void raise_first_paged_sample_error(const char* op, const int64_t* words, const at::Tensor& seeds,
                                           int64_t num_nodes) {
  for (int k = 0; k < sampling::kNumSampleErrors; ++k) {
    if (words[k] < 0) continue;
    if (k == sampling::kBadSeed || k == sampling::kDuplicateSeed) raise_seed_error(op, k, words[k], seeds, num_nodes);
    TORCH_CHECK(false, op, ": the dynamic graph's state is inconsistent (sampling error ", k, " at ", words[k],
                "); was it changed other than by its own methods, or while it was sampled?");
  }
}

// Raises for the first kind whose word is set (words[k] < 0 read as int64: none).
inline void raise_first_sample_error(const char* op, const int64_t* words, const SampleInputs& in) {
  for (int k = 0; k < sampling::kNumSampleErrors; ++k) {
    if (words[k] >= 0) raise_sample_error(op, k, words[k], in);
  }
}

// Reads a host copy of zerocopy::sample_layers_launch's status (layout in csrc/zerocopy.cpp):
// raises the first recorded error, else returns the sizes (status[0 : 2L + 1]).
inline std::vector<int64_t> check_sample_status(const at::Tensor& status, const SampleInputs& in) {
  TORCH_CHECK_VALUE(status.device().is_cpu() && status.dim() == 1 && status.scalar_type() == at::kLong,
                    "sample_layers_check: status must be a 1-D int64 CPU tensor (a host copy of "
                    "sample_layers_launch's status), got ", status.scalar_type(), " of shape ", status.sizes(),
                    " on ", status.device());
  const int64_t n = status.numel() - sampling::kNumSampleErrors;
  TORCH_CHECK_VALUE(n >= 3 && n % 2 == 1, "sample_layers_check: status has ", status.numel(),
                    " entries, which is not 2 * layers + 1 + ", sampling::kNumSampleErrors);
  const at::Tensor host = status.contiguous();
  const int64_t* words = host.data_ptr<int64_t>();
  raise_first_sample_error("sample_layers", words + n, in);
  return std::vector<int64_t>(words, words + n);
}

// Error words for the CPU kernels: thread-safe, smallest `where` per kind.
class ErrorWords {
 public:
  ErrorWords() {
    for (auto& w : words_) w.store(-1, std::memory_order_relaxed);
  }
  void report(int kind, int64_t where) {
    // Unsigned order makes -1 (none) the largest value.
    auto& w = words_[kind];
    int64_t cur = w.load(std::memory_order_relaxed);
    while (static_cast<uint64_t>(where) < static_cast<uint64_t>(cur) &&
           !w.compare_exchange_weak(cur, where, std::memory_order_relaxed)) {
    }
  }
  bool any() const {
    for (const auto& w : words_)
      if (w.load(std::memory_order_relaxed) >= 0) return true;
    return false;
  }
  void raise_if_any(const char* op, const SampleInputs& in) const {
    int64_t host[sampling::kNumSampleErrors];
    for (int k = 0; k < sampling::kNumSampleErrors; ++k) host[k] = words_[k].load(std::memory_order_relaxed);
    raise_first_sample_error(op, host, in);
  }

 private:
  std::atomic<int64_t> words_[sampling::kNumSampleErrors];
};

}  // namespace zerocopy
