// CPU implementations of the graph traversal ops: the reference the GPU kernels are tested
// against and the fallback for graphs on the CPU (or unified graphs without a GPU).
//
// Every variant maps to the same sequential algorithm here (the variants differ only in how
// a GPU schedules the work and reads neighbour lists): a FIFO queue for bfs, Dijkstra with a
// binary heap for sssp, union-find with minimum-id roots for connected components, and power
// iteration in float64 for pagerank, stopped by the accuracy rule every pagerank variant shares
// (traversal_checks.h). Results are deterministic: bfs predecessors are the first parent
// discovered in queue order.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

#include "dynamic_graph_checks.h"
#include "traversal_checks.h"

namespace zerocopy {
namespace {

// The first position in [0, count) where bad(i) holds, or count: one parallel pass.
template <typename Bad>
int64_t first_bad(int64_t count, const Bad& bad) {
  std::atomic<int64_t> first{count};
  at::parallel_for(0, count, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end && i < first.load(std::memory_order_relaxed); ++i) {
      if (bad(i)) {
        int64_t seen = first.load();
        while (i < seen && !first.compare_exchange_weak(seen, i)) {
        }
        return;
      }
    }
  });
  return first.load();
}

// Checks a contiguous CPU graph in full before any list is followed, with the content-check
// predicates every offsets/ids pair of the package is held to (dynamic_graph_checks.h): offsets
// start at 0, never decrease and end at the number of edges, and every id names a vertex. One
// parallel pass over both arrays, so a malformed graph given to the raw op raises instead of
// reading out of bounds.
template <typename T>
void check_cpu_csr_contents(const at::Tensor& indptr, const at::Tensor& indices, int64_t n, const char* op) {
  const int64_t* off = indptr.data_ptr<int64_t>();
  const int64_t m = indices.numel();
  const int64_t r = first_bad(n + 1, [off, n, m](int64_t i) { return !dyngraph::offset_ok(off, i, n, m); });
  TORCH_CHECK_VALUE(r != 0 || off[0] == 0, op, ": indptr[0] must be 0, got ", off[0]);
  TORCH_CHECK_VALUE(r > n || r == 0 || off[r] >= off[r - 1], op, ": indptr must never decrease, but indptr[", r, "] = ",
                    r <= n ? off[r] : 0, " < indptr[", r - 1, "] = ", r <= n ? off[r - 1] : 0);
  TORCH_CHECK_VALUE(r > n, op, ": indptr[num_nodes] must equal the number of edges (", m, "), got ", off[n]);
  const T* col = indices.data_ptr<T>();
  const int64_t e = first_bad(m, [col, n](int64_t j) { return !dyngraph::value_ok(col, j, n); });
  TORCH_CHECK_INDEX(e == m, op, ": indices[", e, "] = ", e < m ? static_cast<int64_t>(col[e]) : 0,
                    " is not a vertex id in [0, ", n, ")");
}

// Contiguous CPU offsets and ids (the callers pass .contiguous() tensors), checked in full.
int64_t check_cpu_csr(const at::Tensor& indptr, const at::Tensor& indices, const char* op) {
  const int64_t n = check_csr(indptr, indices, op);
  check_device_type(indptr, c10::kCPU, "indptr");
  if (indices.scalar_type() == at::kInt) {
    check_cpu_csr_contents<int32_t>(indptr, indices, n, op);
  } else {
    check_cpu_csr_contents<int64_t>(indptr, indices, n, op);
  }
  return n;
}

at::Tensor stats_tensor(int64_t edges, int64_t iterations) {
  at::Tensor s = at::empty({2}, at::kLong);
  s[0] = edges;
  s[1] = iterations;
  return s;
}

template <typename T>
std::tuple<at::Tensor, at::Tensor, at::Tensor> bfs_impl(const at::Tensor& indptr, const at::Tensor& indices,
                                                       int64_t n, int64_t source, bool want_pred) {
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  at::Tensor depth = at::full({n}, -1, at::kInt);
  at::Tensor pred = want_pred ? at::full({n}, -1, indices.options()) : at::empty({0}, indices.options());
  int32_t* d = depth.data_ptr<int32_t>();
  T* p = want_pred ? pred.data_ptr<T>() : nullptr;
  std::vector<int64_t> queue;
  queue.reserve(1024);
  queue.push_back(source);
  d[source] = 0;
  if (p) p[source] = static_cast<T>(source);
  int64_t edges = 0;
  for (size_t head = 0; head < queue.size(); ++head) {
    const int64_t v = queue[head];
    edges += off[v + 1] - off[v];
    for (int64_t e = off[v]; e < off[v + 1]; ++e) {
      const int64_t u = col[e];
      if (d[u] != -1) continue;
      d[u] = d[v] + 1;
      if (p) p[u] = static_cast<T>(v);
      queue.push_back(u);
    }
  }
  const int64_t levels = queue.empty() ? 0 : d[queue.back()] + 1;
  return {depth, pred, stats_tensor(edges, levels)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bfs_cpu(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                                                      int64_t source, int64_t variant, bool predecessors,
                                                      const std::optional<at::Tensor>& in_indptr,
                                                      const std::optional<at::Tensor>& in_indices) {
  check_variant(variant, TraversalOp::kBfs);
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  const int64_t n = check_cpu_csr(indptr, indices, "bfs");
  check_in_lists(variant, in_indptr, in_indices, indptr, indices);
  check_source(source, n, "bfs");
  if (indices.scalar_type() == at::kInt) return bfs_impl<int32_t>(indptr, indices, n, source, predecessors);
  return bfs_impl<int64_t>(indptr, indices, n, source, predecessors);
}

// Dijkstra over non-negative weights. D is the distance type, W the weight type (void: unit).
template <typename T, typename W, typename D>
std::tuple<at::Tensor, at::Tensor> sssp_impl(const at::Tensor& indptr, const at::Tensor& indices,
                                             const W* w, int64_t n, int64_t source, at::ScalarType dist_dtype) {
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  const D inf = std::numeric_limits<D>::max();
  at::Tensor dist = at::full({n}, inf, at::TensorOptions().dtype(dist_dtype));
  D* dd = dist.data_ptr<D>();
  std::vector<char> done(n, 0);
  using Item = std::pair<D, int64_t>;
  std::priority_queue<Item, std::vector<Item>, std::greater<Item>> heap;
  dd[source] = 0;
  heap.push({D(0), source});
  int64_t edges = 0;
  while (!heap.empty()) {
    const auto [dv, v] = heap.top();
    heap.pop();
    if (done[v]) continue;
    done[v] = 1;
    edges += off[v + 1] - off[v];
    for (int64_t e = off[v]; e < off[v + 1]; ++e) {
      const int64_t u = col[e];
      const D nd = dv + (w ? static_cast<D>(w[e]) : D(1));
      if (nd < dd[u]) {
        dd[u] = nd;
        heap.push({nd, u});
      }
    }
  }
  return {dist, stats_tensor(edges, 1)};
}

template <typename T>
std::tuple<at::Tensor, at::Tensor> sssp_dispatch_weights(const at::Tensor& indptr, const at::Tensor& indices,
                                                         const std::optional<at::Tensor>& weights, int64_t n,
                                                         int64_t source) {
  const at::ScalarType dt = sssp_dist_dtype(weights);
  if (!weights.has_value()) return sssp_impl<T, int32_t, int64_t>(indptr, indices, nullptr, n, source, dt);
  if (weights->scalar_type() == at::kFloat)
    return sssp_impl<T, float, float>(indptr, indices, weights->data_ptr<float>(), n, source, dt);
  return sssp_impl<T, int32_t, int64_t>(indptr, indices, weights->data_ptr<int32_t>(), n, source, dt);
}

std::tuple<at::Tensor, at::Tensor> sssp_cpu(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                                            const std::optional<at::Tensor>& weights_in, int64_t source,
                                            int64_t variant, double /*delta*/) {
  check_variant(variant, TraversalOp::kSssp);
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  const int64_t n = check_cpu_csr(indptr, indices, "sssp");
  check_source(source, n, "sssp");
  std::optional<at::Tensor> weights;
  if (weights_in.has_value()) {
    check_weights(*weights_in, indices);
    weights = weights_in->contiguous();
    // min() propagates NaN, which fails the comparison: NaN weights are refused too.
    TORCH_CHECK_VALUE(weights->numel() == 0 || weights->min().item<double>() >= 0,
                      "sssp: weights must be non-negative numbers (no NaN)");
  }
  if (indices.scalar_type() == at::kInt) return sssp_dispatch_weights<int32_t>(indptr, indices, weights, n, source);
  return sssp_dispatch_weights<int64_t>(indptr, indices, weights, n, source);
}

// Union-find whose roots are the minimum vertex id of their set (larger roots hang under
// smaller ones), so the final root of every vertex is the minimum id of its component.
template <typename T>
std::tuple<at::Tensor, at::Tensor> cc_impl(const at::Tensor& indptr, const at::Tensor& indices, int64_t n) {
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  at::Tensor labels = at::arange(n, indices.options());
  T* parent = labels.data_ptr<T>();
  auto find = [parent](T x) {
    while (parent[x] != x) {
      parent[x] = parent[parent[x]];
      x = parent[x];
    }
    return x;
  };
  for (int64_t v = 0; v < n; ++v) {
    for (int64_t e = off[v]; e < off[v + 1]; ++e) {
      T a = find(static_cast<T>(v));
      T b = find(col[e]);
      if (a == b) continue;
      if (a < b) std::swap(a, b);
      parent[a] = b;
    }
  }
  for (int64_t v = 0; v < n; ++v) parent[v] = find(static_cast<T>(v));
  return {labels, stats_tensor(off[n], 1)};
}

std::tuple<at::Tensor, at::Tensor> cc_cpu(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                                          int64_t variant, bool /*symmetric*/, int64_t chunk_edges) {
  check_variant(variant, TraversalOp::kConnectedComponents);
  TORCH_CHECK_VALUE(chunk_edges >= 0, "connected_components: chunk_edges must be >= 0, got ", chunk_edges);
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  const int64_t n = check_cpu_csr(indptr, indices, "connected_components");
  if (indices.scalar_type() == at::kInt) return cc_impl<int32_t>(indptr, indices, n);
  return cc_impl<int64_t>(indptr, indices, n);
}

// Push-style power iteration: rank[u] <- (1 - alpha) / N + alpha * (sum over edges v->u of
// rank[v] / outdeg(v) + dangling / N), where dangling is the rank of vertices without out
// edges (every CSR entry counts, so duplicate edges weigh more). Stops after the first
// iteration whose L1 change is at most pagerank_change_threshold(alpha, tol), which bounds the
// L1 distance to the exact PageRank by tol, or after max_iter iterations.
template <typename T>
std::tuple<at::Tensor, at::Tensor> pagerank_impl(const at::Tensor& indptr, const at::Tensor& indices, int64_t n,
                                                 double alpha, double tol, int64_t max_iter) {
  const double threshold = pagerank_change_threshold(alpha, tol);
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  std::vector<double> rank(n, 1.0 / static_cast<double>(n)), acc(n);
  int64_t it = 0;
  while (it < max_iter) {
    std::fill(acc.begin(), acc.end(), 0.0);
    double dangling = 0;
    for (int64_t v = 0; v < n; ++v) {
      const int64_t deg = off[v + 1] - off[v];
      if (deg == 0) {
        dangling += rank[v];
        continue;
      }
      const double c = rank[v] / static_cast<double>(deg);
      for (int64_t e = off[v]; e < off[v + 1]; ++e) acc[col[e]] += c;
    }
    double diff = 0;
    const double base = (1.0 - alpha) / static_cast<double>(n) + alpha * dangling / static_cast<double>(n);
    for (int64_t u = 0; u < n; ++u) {
      const double r = base + alpha * acc[u];
      diff += std::abs(r - rank[u]);
      rank[u] = r;
    }
    ++it;
    if (diff <= threshold) break;
  }
  at::Tensor out = at::empty({n}, at::kFloat);
  float* o = out.data_ptr<float>();
  for (int64_t v = 0; v < n; ++v) o[v] = static_cast<float>(rank[v]);
  return {out, stats_tensor(off[n] * it, it)};
}

std::tuple<at::Tensor, at::Tensor> pagerank_cpu(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                                                double alpha, double tol, int64_t max_iter, int64_t variant) {
  check_variant(variant, TraversalOp::kPagerank);
  check_pagerank_args(alpha, tol, max_iter);
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  const int64_t n = check_cpu_csr(indptr, indices, "pagerank");
  if (n == 0) return {at::empty({0}, at::kFloat), stats_tensor(0, 0)};
  if (indices.scalar_type() == at::kInt) return pagerank_impl<int32_t>(indptr, indices, n, alpha, tol, max_iter);
  return pagerank_impl<int64_t>(indptr, indices, n, alpha, tol, max_iter);
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) {
  m.impl("graph_bfs", bfs_cpu);
  m.impl("graph_sssp", sssp_cpu);
  m.impl("graph_connected_components", cc_cpu);
  m.impl("graph_pagerank", pagerank_cpu);
}

}  // namespace zerocopy
