// Argument checks of the dynamic_graph_* ops, shared by their CPU and CUDA kernels. Shapes,
// dtypes and devices are checked here; the contents of batches (vertex ids, run offsets, list
// positions) are checked by each device's kernels before anything is written.
#pragma once

#include "checks.h"
#include "dynamic_graph.h"

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <c10/core/DeviceType.h>

#include <initializer_list>
#include <optional>
#include <utility>

namespace zerocopy {
namespace dyngraph {

// log2(page_size), after checking that it is a power of two in the accepted range.
inline int page_shift(int64_t page_size, const char* op) {
  TORCH_CHECK_VALUE(page_size >= (int64_t(1) << kMinPageShift) && page_size <= (int64_t(1) << kMaxPageShift) &&
                        (page_size & (page_size - 1)) == 0,
                    op, ": page_size must be a power of two in [", int64_t(1) << kMinPageShift, ", ",
                    int64_t(1) << kMaxPageShift, "], got ", page_size);
  int s = 0;
  while ((int64_t(1) << s) < page_size) ++s;
  return s;
}

inline void check_all_on(const at::Tensor& first, const char* first_name,
                         std::initializer_list<std::pair<const at::Tensor*, const char*>> rest) {
  for (const auto& [t, name] : rest) {
    if (t->defined()) check_same_device(first, first_name, *t, name);
  }
}

// The per-vertex state and the pool; returns the number of pages.
inline int64_t check_lists(const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height,
                           const at::Tensor& degree, int s, const char* op) {
  check_dim(pool, 1, "pool");
  check_index_dtype(pool, "pool");
  check_dim(root, 1, "root");
  check_dtype(root, pool.scalar_type(), "root");
  check_dim(height, 1, "height");
  check_dtype(height, at::kChar, "height");
  check_dim(degree, 1, "degree");
  check_dtype(degree, at::kLong, "degree");
  TORCH_CHECK_VALUE(pool.numel() % (int64_t(1) << s) == 0, op, ": pool must hold whole pages of ",
                    int64_t(1) << s, " slots, got ", pool.numel(), " slots");
  TORCH_CHECK_VALUE(height.numel() == root.numel() && degree.numel() == root.numel(), op,
                    ": root, height and degree must have one entry per vertex id, got ", root.numel(), ", ",
                    height.numel(), " and ", degree.numel());
  check_all_on(pool, "pool", {{&root, "root"}, {&height, "height"}, {&degree, "degree"}});
  return pool.numel() >> s;
}

// The per-page tables and the queue counters.
inline void check_page_tables(const at::Tensor& pool, int64_t num_pages, const at::Tensor& page_owner,
                              const at::Tensor& page_rank, const at::Tensor& meta, const char* op) {
  check_dim(page_owner, 1, "page_owner");
  check_dtype(page_owner, pool.scalar_type(), "page_owner");
  check_dim(page_rank, 1, "page_rank");
  check_dtype(page_rank, at::kInt, "page_rank");
  check_dim(meta, 1, "meta");
  check_dtype(meta, at::kLong, "meta");
  TORCH_CHECK_VALUE(page_owner.numel() == num_pages && page_rank.numel() == num_pages, op,
                    ": page_owner and page_rank must have one entry per page (", num_pages, "), got ",
                    page_owner.numel(), " and ", page_rank.numel());
  TORCH_CHECK_VALUE(meta.numel() == kMetaSize, op, ": meta must hold [head, tail, fresh], got ", meta.numel(),
                    " entries");
  check_all_on(pool, "pool", {{&page_owner, "page_owner"}, {&page_rank, "page_rank"}, {&meta, "meta"}});
}

inline void check_ring(const at::Tensor& pool, int64_t num_pages, const at::Tensor& page_ring, const char* op) {
  check_dim(page_ring, 1, "page_ring");
  check_dtype(page_ring, pool.scalar_type(), "page_ring");
  TORCH_CHECK_VALUE(page_ring.numel() == num_pages, op, ": page_ring must have one entry per page (", num_pages,
                    "), got ", page_ring.numel());
  check_same_device(pool, "pool", page_ring, "page_ring");
}

inline void check_pool_weights(const std::optional<at::Tensor>& weights, const at::Tensor& pool) {
  if (!weights) return;
  check_dim(*weights, 1, "weights");
  TORCH_CHECK_TYPE(weights->scalar_type() == at::kFloat || weights->scalar_type() == at::kInt,
                   "weights must be float32 or int32, got ", weights->scalar_type());
  TORCH_CHECK_VALUE(weights->numel() == pool.numel(), "weights must have one entry per pool slot (", pool.numel(),
                    "), got ", weights->numel());
  check_same_device(pool, "pool", *weights, "weights");
}

// The pool and per-vertex state of an op that reads lists, on `device`; returns the pages.
inline int64_t check_reader(const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height,
                            const at::Tensor& degree, int s, c10::DeviceType device, const char* op) {
  const int64_t pages = check_lists(pool, root, height, degree, s, op);
  check_device_type(pool, device, "pool");
  return pages;
}

// check_reader plus the page table, for the ops that sweep it.
inline int64_t check_sweeper(const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height,
                             const at::Tensor& degree, const at::Tensor& page_owner, const at::Tensor& page_rank,
                             const at::Tensor& meta, int s, c10::DeviceType device, const char* op) {
  const int64_t pages = check_reader(pool, root, height, degree, s, device, op);
  check_page_tables(pool, pages, page_owner, page_rank, meta, op);
  return pages;
}

// Every state tensor of a mutating op: written in place, so also contiguous.
inline void check_writer(const at::Tensor& pool, const std::optional<at::Tensor>& weights, const at::Tensor& root,
                         const at::Tensor& height, const at::Tensor& degree, const at::Tensor& page_owner,
                         const at::Tensor& page_rank, const at::Tensor& page_ring, const at::Tensor& meta, int s,
                         c10::DeviceType device, const char* op) {
  const int64_t pages = check_sweeper(pool, root, height, degree, page_owner, page_rank, meta, s, device, op);
  check_ring(pool, pages, page_ring, op);
  check_pool_weights(weights, pool);
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&pool, "pool"}, {&root, "root"},
                                {&height, "height"}, {&degree, "degree"}, {&page_owner, "page_owner"},
                                {&page_rank, "page_rank"}, {&page_ring, "page_ring"}, {&meta, "meta"},
                                {weights ? &*weights : &pool, "weights"}}) {
    TORCH_CHECK_VALUE(t->is_contiguous(), op, ": ", name, " is written in place and must be contiguous");
  }
}

// run_weights of an append: given exactly when the graph has weights, one per run_dst, of the
// weights' dtype. Returns them contiguous (undefined without weights).
inline at::Tensor check_run_weights(const std::optional<at::Tensor>& weights,
                                    const std::optional<at::Tensor>& run_weights, const at::Tensor& run_dst,
                                    const at::Tensor& pool, const char* op) {
  TORCH_CHECK_VALUE(weights.has_value() == run_weights.has_value(), op,
                    ": run_weights must be given exactly when the graph has weights");
  if (!run_weights) return at::Tensor();
  check_dim(*run_weights, 1, "run_weights");
  check_dtype(*run_weights, weights->scalar_type(), "run_weights");
  TORCH_CHECK_VALUE(run_weights->numel() == run_dst.numel(), op, ": run_weights must have one entry per run_dst (",
                    run_dst.numel(), "), got ", run_weights->numel());
  check_same_device(pool, "pool", *run_weights, "run_weights");
  return run_weights->contiguous();
}

inline void check_mask(const at::Tensor& mask, const at::Tensor& root, const at::Tensor& pool, const char* op) {
  check_dim(mask, 1, "mask");
  check_dtype(mask, at::kBool, "mask");
  TORCH_CHECK_VALUE(mask.numel() == root.numel(), op, ": mask must have one entry per vertex id (", root.numel(),
                    "), got ", mask.numel());
  check_same_device(pool, "pool", mask, "mask");
}

// The listed vertices of find_marked: int64, one dimension, on the pool's device (their values
// are checked with the batch's contents).
inline void check_marked_vertices(const at::Tensor& pool, const at::Tensor& vertices) {
  check_dim(vertices, 1, "vertices");
  check_dtype(vertices, at::kLong, "vertices");
  check_same_device(pool, "pool", vertices, "vertices");
}

// The arguments of pages_needed: per-vertex degrees and a batch of runs (vertices and their
// offsets, int64, one dimension, on the degrees' device; contents are not checked).
inline void check_growth(const at::Tensor& degree, const at::Tensor& vertices, const at::Tensor& offsets,
                         const char* op) {
  check_dim(degree, 1, "degree");
  check_dtype(degree, at::kLong, "degree");
  check_dim(vertices, 1, "vertices");
  check_dtype(vertices, at::kLong, "vertices");
  check_dim(offsets, 1, "run_offsets");
  check_dtype(offsets, at::kLong, "run_offsets");
  TORCH_CHECK_VALUE(offsets.numel() == vertices.numel() + 1, op,
                    ": run_offsets must have one more entry than vertices (", vertices.numel() + 1, "), got ",
                    offsets.numel());
  check_all_on(degree, "degree", {{&vertices, "vertices"}, {&offsets, "run_offsets"}});
}

inline void check_seeds(const at::Tensor& seeds, const at::Tensor& pool, int64_t fanout, const char* op) {
  check_dim(seeds, 1, "seeds");
  check_dtype(seeds, at::kLong, "seeds");
  check_same_device(pool, "pool", seeds, "seeds");
  TORCH_CHECK_VALUE(fanout >= -1, op, ": fanout must be -1 (all neighbours) or >= 0, got ", fanout);
}

inline void check_bfs_source(int64_t source, int64_t num_ids, const char* op) {
  TORCH_CHECK_INDEX(source >= 0 && source < num_ids, op, ": source must be in [0, ", num_ids, "), got ", source);
}

// A batch of runs: `vertices` (int64) and `offsets` (int64, one more entry) delimiting each
// vertex's slice of `values` (named `values_name`; int64, or int32 too when `any_index`).
inline void check_runs(const at::Tensor& pool, const at::Tensor& vertices, const at::Tensor& offsets,
                       const at::Tensor& values, const char* offsets_name, const char* values_name, const char* op,
                       bool any_index = false) {
  check_dim(vertices, 1, "vertices");
  check_dtype(vertices, at::kLong, "vertices");
  check_dim(offsets, 1, offsets_name);
  check_dtype(offsets, at::kLong, offsets_name);
  check_dim(values, 1, values_name);
  if (any_index) {
    check_index_dtype(values, values_name);
  } else {
    check_dtype(values, at::kLong, values_name);
  }
  TORCH_CHECK_VALUE(offsets.numel() == vertices.numel() + 1, op, ": ", offsets_name,
                    " must have one more entry than vertices (", vertices.numel() + 1, "), got ", offsets.numel());
  check_all_on(pool, "pool", {{&vertices, "vertices"}, {&offsets, offsets_name}, {&values, values_name}});
}

// Error codes of a batch's content check, reported by the index of the first bad element.
enum BatchError : int {
  kBadVertex = 0,    // vertices[r] out of [0, num_ids), or (strict) not above vertices[r - 1]
  kBadOffset = 1,    // offsets[0] != 0, offsets[r + 1] < offsets[r], or offsets[R] != #values
  kBadValue = 2,     // values[j] out of [0, num_ids) (destinations)
  kBadPosition = 3,  // positions[j] not in [0, degree) or not above the previous one of its run
  kNumBatchErrors = 4,
};

// Element predicates of the content check (CPU loops and CUDA kernels call the same ones).
// offsets_ok is checked for every r in [0, R].
ZC_DG_HD bool vertex_ok(const int64_t* vertices, int64_t r, int64_t num_ids, bool strict) {
  const int64_t v = vertices[r];
  return v >= 0 && v < num_ids && (!strict || r == 0 || v > vertices[r - 1]);
}

ZC_DG_HD bool offset_ok(const int64_t* offsets, int64_t r, int64_t runs, int64_t num_values) {
  if (r == 0 && offsets[0] != 0) return false;
  if (r > 0 && offsets[r] < offsets[r - 1]) return false;
  return r != runs || offsets[runs] == num_values;
}

template <typename T>
ZC_DG_HD bool value_ok(const T* values, int64_t j, int64_t num_ids) {
  return values[j] >= 0 && static_cast<int64_t>(values[j]) < num_ids;
}

// positions[j] lies in its run's list and above the previous position of the run. Safe to call
// with bad offsets or vertices (reads stay in bounds); the report then names those first.
ZC_DG_HD bool position_ok(const int64_t* positions, const int64_t* offsets, int64_t runs, const int64_t* vertices,
                          const int64_t* degree, int64_t num_ids, int64_t j) {
  if (runs == 0) return true;
  const int64_t r = group_of(offsets, runs, j);
  const int64_t v = vertices[r];
  if (v < 0 || v >= num_ids) return true;
  const int64_t p = positions[j];
  if (p < 0 || p >= degree[v]) return false;
  return j == offsets[r] || p > positions[j - 1];
}

// Raises for the first bad element found by a content check: first[k] is the index of the
// first element failing check k (BatchError), or -1.
inline void raise_batch_error(const int64_t* first, const at::Tensor& vertices, const at::Tensor& offsets,
                              const at::Tensor& values, const char* offsets_name, const char* values_name,
                              int64_t num_ids, bool strict, const char* op) {
  auto at_ = [](const at::Tensor& t, int64_t i) { return t.select(0, i).item<int64_t>(); };
  if (first[kBadVertex] >= 0) {
    const int64_t r = first[kBadVertex];
    const int64_t v = at_(vertices, r);
    TORCH_CHECK_INDEX(v >= 0 && v < num_ids, op, ": vertices[", r, "] = ", v, " is out of range for ", num_ids,
                      " vertex ids");
    TORCH_CHECK_VALUE(!strict, op, ": vertices must be strictly ascending, got vertices[", r, "] = ", v,
                      " after ", at_(vertices, r - 1));
  }
  if (first[kBadOffset] >= 0) {
    const int64_t r = first[kBadOffset];
    TORCH_CHECK_VALUE(false, op, ": ", offsets_name, " must start at 0, never decrease and end at ",
                      values.numel(), " (the number of ", values_name, "); ", offsets_name, "[", r, "] = ",
                      at_(offsets, r), " breaks that");
  }
  if (first[kBadValue] >= 0) {
    const int64_t j = first[kBadValue];
    TORCH_CHECK_INDEX(false, op, ": ", values_name, "[", j, "] = ", at_(values, j), " is out of range for ",
                      num_ids, " vertex ids");
  }
  if (first[kBadPosition] >= 0) {
    const int64_t j = first[kBadPosition];
    TORCH_CHECK_INDEX(false, op, ": ", values_name, "[", j, "] = ", at_(values, j),
                      " is not a position of its vertex's list above the run's previous one (positions "
                      "must be distinct, ascending per vertex and below the degree)");
  }
}

}  // namespace dyngraph
}  // namespace zerocopy
