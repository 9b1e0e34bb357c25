// The dynamic_graph_* ops on the CPU: the reference the CUDA kernels are compared with, and the
// implementation for graphs whose state lives in host memory. Every op processes one batch:
// contents checked first (nothing is written when a check fails), then runs (one vertex each)
// in parallel with at::parallel_for. Page assignment follows csrc/dynamic_graph.h, so the
// pool, the page tables and the free-page queue end up identical to the CUDA kernels'.

#include "checks.h"
#include "cpu/sampling_cpu.h"
#include "dynamic_graph.h"
#include "dynamic_graph_checks.h"
#include "sampling.h"
#include "sampling_errors.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <functional>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <unordered_set>
#include <utility>
#include <vector>

namespace zerocopy {
namespace {

using namespace dyngraph;

constexpr c10::DeviceType kCpu = c10::DeviceType::CPU;

// The content check of a batch (see dynamic_graph_checks.h). `degree` non-null: `values` are
// list positions of the runs' vertices, else destination ids.
void check_batch(const at::Tensor& vertices, const at::Tensor& offsets, const at::Tensor& values,
                 const char* offsets_name, const char* values_name, int64_t num_ids, const int64_t* degree,
                 const char* op) {
  int64_t first[kNumBatchErrors] = {-1, -1, -1, -1};
  const int64_t runs = vertices.numel(), n = values.numel();
  const int64_t* vtx = vertices.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  for (int64_t r = 0; r < runs && first[kBadVertex] < 0; ++r)
    if (!vertex_ok(vtx, r, num_ids, true)) first[kBadVertex] = r;
  for (int64_t r = 0; r <= runs && first[kBadOffset] < 0; ++r)
    if (!offset_ok(off, r, runs, n)) first[kBadOffset] = r;
  if (degree == nullptr) {
    AT_DISPATCH_INDEX_TYPES(values.scalar_type(), "dynamic_graph_batch_check", [&] {
      const index_t* val = values.data_ptr<index_t>();
      for (int64_t j = 0; j < n && first[kBadValue] < 0; ++j)
        if (!value_ok(val, j, num_ids)) first[kBadValue] = j;
    });
  } else if (first[kBadVertex] < 0 && first[kBadOffset] < 0) {
    const int64_t* val = values.data_ptr<int64_t>();
    for (int64_t j = 0; j < n && first[kBadPosition] < 0; ++j)
      if (!position_ok(val, off, runs, vtx, degree, num_ids, j)) first[kBadPosition] = j;
  }
  raise_batch_error(first, vertices, offsets, values, offsets_name, values_name, num_ids, true, op);
}

// Calls fn(pos, slot) for every entry of a list, in list order.
template <typename idx_t, typename Fn>
void for_each_entry(const idx_t* pool, int64_t root, int h, int64_t deg, int s, Fn&& fn) {
  const int64_t size = int64_t(1) << s;
  for (int64_t i = 0; (i << s) < deg; ++i) {
    const int64_t base = node_page(pool, root, h, 0, i, s) << s;
    const int64_t n = std::min(size, deg - (i << s));
    for (int64_t k = 0; k < n; ++k) fn((i << s) + k, base + k);
  }
}

template <typename idx_t>
struct Lists {
  idx_t* pool;
  idx_t* root;
  int8_t* height;
  int64_t* degree;
  int64_t num_ids;
  int s;

  Lists(const at::Tensor& pool_t, const at::Tensor& root_t, const at::Tensor& height_t, const at::Tensor& degree_t,
        int shift)
      : pool(pool_t.data_ptr<idx_t>()),
        root(root_t.data_ptr<idx_t>()),
        height(height_t.data_ptr<int8_t>()),
        degree(degree_t.data_ptr<int64_t>()),
        num_ids(root_t.numel()),
        s(shift) {}

  template <typename Fn>
  void each(int64_t v, Fn&& fn) const {
    for_each_entry(pool, static_cast<int64_t>(root[v]), height[v], degree[v], s, fn);
  }
};

// Copies a slot's id and weight to another slot.
template <typename idx_t>
void move_slot(idx_t* pool, const std::optional<at::Tensor>& weights, int64_t from, int64_t to) {
  pool[to] = pool[from];
  if (!weights) return;
  if (weights->scalar_type() == at::kFloat) {
    float* w = weights->data_ptr<float>();
    w[to] = w[from];
  } else {
    int32_t* w = weights->data_ptr<int32_t>();
    w[to] = w[from];
  }
}

// ---------------------------------------------------------------------------------------------
// append

template <typename idx_t, typename dst_t>
void append_typed(const at::Tensor& pool_t, const std::optional<at::Tensor>& weights, const at::Tensor& root_t,
                  const at::Tensor& height_t, const at::Tensor& degree_t, const at::Tensor& owner_t,
                  const at::Tensor& rank_t, const at::Tensor& ring_t, const at::Tensor& meta_t,
                  const at::Tensor& vertices, const at::Tensor& offsets, const at::Tensor& dst,
                  const at::Tensor& run_w, int s) {
  const Lists<idx_t> g(pool_t, root_t, height_t, degree_t, s);
  const int64_t runs = vertices.numel();
  const int64_t num_pages = pool_t.numel() >> s;
  const int64_t* vtx = vertices.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const dst_t* dv = dst.data_ptr<dst_t>();
  idx_t* owner = owner_t.data_ptr<idx_t>();
  int32_t* rank = rank_t.data_ptr<int32_t>();
  int64_t* meta = meta_t.data_ptr<int64_t>();

  std::vector<int64_t> base(static_cast<size_t>(runs) + 1, 0);
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t d0 = g.degree[vtx[r]];
    base[r + 1] = base[r] + tree_pages(d0 + off[r + 1] - off[r], s) - tree_pages(d0, s);
  }
  const int64_t need = base[runs];
  const int64_t head = meta[kHead], queued = meta[kTail] - meta[kHead], fresh = meta[kFresh];
  TORCH_CHECK(need <= queued + (num_pages - fresh), "dynamic_graph_append: the pool is full: the batch needs ",
              need, " pages and ", queued + (num_pages - fresh), " of its ", num_pages, " pages are free");
  const Tickets<idx_t> tickets{ring_t.data_ptr<idx_t>(), num_pages, head, queued, fresh};
  const bool fw = weights && weights->scalar_type() == at::kFloat;
  float* wf = fw ? weights->data_ptr<float>() : nullptr;
  const float* rwf = fw ? run_w.data_ptr<float>() : nullptr;
  int32_t* wi = weights && !fw ? weights->data_ptr<int32_t>() : nullptr;
  const int32_t* rwi = weights && !fw ? run_w.data_ptr<int32_t>() : nullptr;

  at::parallel_for(0, runs, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t v = vtx[r];
      const int64_t d0 = g.degree[v], d1 = d0 + off[r + 1] - off[r];
      const int64_t root0 = g.root[v];
      for (int64_t t = 0; t < base[r + 1] - base[r]; ++t)
        grow_item(g.pool, owner, rank, tickets, v, root0, d0, d1, base[r], t, s);
      const int64_t root1 = grown_root(tickets, root0, d0, d1, base[r], s);
      const int h1 = tree_shape(d1, s).height;
      g.root[v] = static_cast<idx_t>(root1);
      g.height[v] = static_cast<int8_t>(h1);
      g.degree[v] = d1;
      for (int64_t k = 0; k < d1 - d0; ++k) {
        const int64_t slot = entry_slot(g.pool, root1, h1, d0 + k, s);
        g.pool[slot] = static_cast<idx_t>(dv[off[r] + k]);
        if (wf) wf[slot] = rwf[off[r] + k];
        if (wi) wi[slot] = rwi[off[r] + k];
      }
    }
  });
  meta[kHead] = head + std::min(need, queued);
  meta[kFresh] = fresh + std::max<int64_t>(0, need - queued);
}

void append_cpu(const at::Tensor& pool, const std::optional<at::Tensor>& weights, const at::Tensor& root,
                const at::Tensor& height, const at::Tensor& degree, const at::Tensor& page_owner,
                const at::Tensor& page_rank, const at::Tensor& page_ring, const at::Tensor& meta,
                const at::Tensor& vertices, const at::Tensor& run_offsets, const at::Tensor& run_dst,
                const std::optional<at::Tensor>& run_weights, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_append";
  const int s = page_shift(page_size, op);
  check_writer(pool, weights, root, height, degree, page_owner, page_rank, page_ring, meta, s, kCpu, op);
  check_runs(pool, vertices, run_offsets, run_dst, "run_offsets", "run_dst", op, /*any_index=*/true);
  const at::Tensor run_w = check_run_weights(weights, run_weights, run_dst, pool, op);
  const at::Tensor vtx = vertices.contiguous(), off = run_offsets.contiguous(), dst = run_dst.contiguous();
  check_batch(vtx, off, dst, "run_offsets", "run_dst", root.numel(), nullptr, op);
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    if (dst.scalar_type() == at::kInt) {
      append_typed<index_t, int32_t>(pool, weights, root, height, degree, page_owner, page_rank, page_ring, meta, vtx,
                                     off, dst, run_w, s);
    } else {
      append_typed<index_t, int64_t>(pool, weights, root, height, degree, page_owner, page_rank, page_ring, meta, vtx,
                                     off, dst, run_w, s);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// contains, find, find_touching

void check_query_cpu(const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height,
                     const at::Tensor& degree, const at::Tensor& vertices, const at::Tensor& run_offsets,
                     const at::Tensor& run_dst, int s, const char* op) {
  check_reader(pool, root, height, degree, s, kCpu, op);
  check_runs(pool, vertices, run_offsets, run_dst, "run_offsets", "run_dst", op);
  check_batch(vertices.contiguous(), run_offsets.contiguous(), run_dst.contiguous(), "run_offsets", "run_dst",
              root.numel(), nullptr, op);
}

at::Tensor contains_cpu(const at::Tensor& pool_in, const at::Tensor& root_in, const at::Tensor& height_in,
                        const at::Tensor& degree_in, const at::Tensor& vertices, const at::Tensor& run_offsets,
                        const at::Tensor& run_dst, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_contains";
  const int s = page_shift(page_size, op);
  check_query_cpu(pool_in, root_in, height_in, degree_in, vertices, run_offsets, run_dst, s, op);
  const at::Tensor pool = pool_in.contiguous(), root = root_in.contiguous(), height = height_in.contiguous(),
                   degree = degree_in.contiguous();
  const at::Tensor vtx = vertices.contiguous(), off_t = run_offsets.contiguous(), dst_t = run_dst.contiguous();
  at::Tensor found = at::zeros({run_dst.numel()}, run_dst.options().dtype(at::kBool));
  bool* fd = found.data_ptr<bool>();
  const int64_t* vv = vtx.data_ptr<int64_t>();
  const int64_t* off = off_t.data_ptr<int64_t>();
  const int64_t* dst = dst_t.data_ptr<int64_t>();
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    const Lists<index_t> g(pool, root, height, degree, s);
    at::parallel_for(0, vtx.numel(), 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        g.each(vv[r], [&](int64_t, int64_t slot) {
          const int64_t j = sorted_find(dst, off[r], off[r + 1], static_cast<int64_t>(g.pool[slot]));
          if (j >= 0) fd[j] = true;
        });
      }
    });
  });
  return found;
}

std::tuple<at::Tensor, at::Tensor> find_cpu(const at::Tensor& pool_in, const at::Tensor& root_in,
                                            const at::Tensor& height_in, const at::Tensor& degree_in,
                                            const at::Tensor& vertices, const at::Tensor& run_offsets,
                                            const at::Tensor& run_dst, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_find";
  const int s = page_shift(page_size, op);
  check_query_cpu(pool_in, root_in, height_in, degree_in, vertices, run_offsets, run_dst, s, op);
  const at::Tensor pool = pool_in.contiguous(), root = root_in.contiguous(), height = height_in.contiguous(),
                   degree = degree_in.contiguous();
  const at::Tensor vtx = vertices.contiguous(), off_t = run_offsets.contiguous(), dst_t = run_dst.contiguous();
  const int64_t runs = vtx.numel();
  const int64_t* vv = vtx.data_ptr<int64_t>();
  const int64_t* off = off_t.data_ptr<int64_t>();
  const int64_t* dst = dst_t.data_ptr<int64_t>();
  at::Tensor pos_offsets = at::zeros({runs + 1}, vertices.options());
  at::Tensor positions;
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    const Lists<index_t> g(pool, root, height, degree, s);
    auto matches = [&](int64_t r, int64_t slot) {
      return sorted_find(dst, off[r], off[r + 1], static_cast<int64_t>(g.pool[slot])) >= 0;
    };
    int64_t* po = pos_offsets.data_ptr<int64_t>();
    at::parallel_for(0, runs, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        int64_t count = 0;
        g.each(vv[r], [&](int64_t, int64_t slot) { count += matches(r, slot); });
        po[r + 1] = count;
      }
    });
    for (int64_t r = 0; r < runs; ++r) po[r + 1] += po[r];
    positions = at::empty({po[runs]}, vertices.options());
    int64_t* out = positions.data_ptr<int64_t>();
    at::parallel_for(0, runs, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        int64_t k = po[r];
        g.each(vv[r], [&](int64_t pos, int64_t slot) {
          if (matches(r, slot)) out[k++] = pos;
        });
      }
    });
  });
  return {pos_offsets, positions};
}

// Raises for the first of the listed vertices (a marked-vertex batch) out of range or not
// above the one before.
void check_marked_runs(const at::Tensor& vtx, int64_t num_ids, const char* op) {
  const int64_t* vv = vtx.data_ptr<int64_t>();
  int64_t first[kNumBatchErrors] = {-1, -1, -1, -1};
  for (int64_t r = 0; r < vtx.numel() && first[kBadVertex] < 0; ++r)
    if (!vertex_ok(vv, r, num_ids, true)) first[kBadVertex] = r;
  raise_batch_error(first, vtx, vtx, vtx, "pos_offsets", "positions", num_ids, true, op);
}

at::Tensor pages_needed_cpu(const at::Tensor& degree_in, const at::Tensor& vertices_in, const at::Tensor& offsets_in,
                            int64_t page_size) {
  constexpr const char* op = "dynamic_graph_pages_needed";
  const int s = page_shift(page_size, op);
  check_growth(degree_in, vertices_in, offsets_in, op);
  const at::Tensor degree = degree_in.contiguous(), vtx = vertices_in.contiguous(), off = offsets_in.contiguous();
  const int64_t runs = vtx.numel(), num_ids = degree.numel();
  const int64_t *d = degree.data_ptr<int64_t>(), *vv = vtx.data_ptr<int64_t>(), *o = off.data_ptr<int64_t>();
  const int64_t need = at::parallel_reduce(0, runs, 4096, int64_t(0), [&](int64_t b, int64_t e, int64_t acc) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t v = vv[r], add = o[r + 1] - o[r];
      if (v >= 0 && v < num_ids && add >= 0) acc += tree_pages(d[v] + add, s) - tree_pages(d[v], s);
    }
    return acc;
  }, std::plus<int64_t>());
  return at::scalar_tensor(need, degree.options());
}

at::Tensor mark_neighbours_cpu(const at::Tensor& pool_in, const at::Tensor& root_in, const at::Tensor& height_in,
                               const at::Tensor& degree_in, const at::Tensor& vertices_in, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_mark_neighbours";
  const int s = page_shift(page_size, op);
  check_reader(pool_in, root_in, height_in, degree_in, s, kCpu, op);
  check_marked_vertices(pool_in, vertices_in);
  const at::Tensor pool = pool_in.contiguous(), root = root_in.contiguous(), height = height_in.contiguous(),
                   degree = degree_in.contiguous(), vtx = vertices_in.contiguous();
  const int64_t runs = vtx.numel(), n = root.numel();
  const int64_t* vv = vtx.data_ptr<int64_t>();
  check_marked_runs(vtx, n, op);
  at::Tensor marks = at::zeros({n}, root.options().dtype(at::kBool));
  bool* out = marks.data_ptr<bool>();
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    const Lists<index_t> g(pool, root, height, degree, s);
    at::parallel_for(0, runs, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        g.each(vv[r], [&](int64_t, int64_t slot) {
          const int64_t x = g.pool[slot];
          // Threads may mark one id together: relaxed atomic stores of the same value.
          if (x >= 0 && x < n) __atomic_store_n(out + x, true, __ATOMIC_RELAXED);
        });
      }
    });
  });
  return marks;
}

std::tuple<at::Tensor, at::Tensor> find_marked_cpu(const at::Tensor& pool_in, const at::Tensor& root_in,
                                                   const at::Tensor& height_in, const at::Tensor& degree_in,
                                                   const at::Tensor& vertices_in, const at::Tensor& mask_in,
                                                   int64_t page_size) {
  constexpr const char* op = "dynamic_graph_find_marked";
  const int s = page_shift(page_size, op);
  check_reader(pool_in, root_in, height_in, degree_in, s, kCpu, op);
  check_marked_vertices(pool_in, vertices_in);
  check_mask(mask_in, root_in, pool_in, op);
  const at::Tensor pool = pool_in.contiguous(), root = root_in.contiguous(), height = height_in.contiguous(),
                   degree = degree_in.contiguous(), vtx = vertices_in.contiguous(), mask_t = mask_in.contiguous();
  const int64_t runs = vtx.numel(), n = root.numel();
  const int64_t* vv = vtx.data_ptr<int64_t>();
  check_marked_runs(vtx, n, op);
  const bool* mask = mask_t.data_ptr<bool>();
  at::Tensor pos_offsets = at::zeros({runs + 1}, vtx.options());
  at::Tensor positions;
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    const Lists<index_t> g(pool, root, height, degree, s);
    auto hit = [&](int64_t v, int64_t slot) {
      const int64_t x = g.pool[slot];
      return mask[v] || (x >= 0 && x < n && mask[x]);
    };
    int64_t* po = pos_offsets.data_ptr<int64_t>();
    at::parallel_for(0, runs, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t v = vv[r];
        int64_t count = 0;
        if (mask[v]) {
          count = g.degree[v];
        } else {
          g.each(v, [&](int64_t, int64_t slot) { count += hit(v, slot); });
        }
        po[r + 1] = count;
      }
    });
    for (int64_t r = 0; r < runs; ++r) po[r + 1] += po[r];
    positions = at::empty({po[runs]}, vtx.options());
    int64_t* out = positions.data_ptr<int64_t>();
    at::parallel_for(0, runs, 16, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        int64_t k = po[r];
        g.each(vv[r], [&](int64_t pos, int64_t slot) {
          if (hit(vv[r], slot)) out[k++] = pos;
        });
      }
    });
  });
  return {pos_offsets, positions};
}

std::tuple<at::Tensor, at::Tensor> find_touching_cpu(const at::Tensor& pool_in, const at::Tensor& root_in,
                                                     const at::Tensor& height_in, const at::Tensor& degree_in,
                                                     const at::Tensor& page_owner, const at::Tensor& page_rank,
                                                     const at::Tensor& meta, const at::Tensor& mask_in,
                                                     int64_t page_size) {
  constexpr const char* op = "dynamic_graph_find_touching";
  const int s = page_shift(page_size, op);
  check_sweeper(pool_in, root_in, height_in, degree_in, page_owner, page_rank, meta, s, kCpu, op);
  check_mask(mask_in, root_in, pool_in, op);
  const at::Tensor pool = pool_in.contiguous(), root = root_in.contiguous(), height = height_in.contiguous(),
                   degree = degree_in.contiguous(), mask_t = mask_in.contiguous();
  const int64_t n = root.numel();
  const bool* mask = mask_t.data_ptr<bool>();
  at::Tensor counts = at::zeros({n + 1}, degree.options());
  int64_t* cnt = counts.data_ptr<int64_t>();
  at::Tensor out_v, out_p;
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    const Lists<index_t> g(pool, root, height, degree, s);
    auto hit = [&](int64_t v, int64_t slot) {
      const int64_t x = g.pool[slot];
      return mask[v] || (x >= 0 && x < n && mask[x]);
    };
    at::parallel_for(0, n, 1024, [&](int64_t b, int64_t e) {
      for (int64_t v = b; v < e; ++v) {
        int64_t c = 0;
        if (mask[v]) {
          c = g.degree[v];
        } else {
          g.each(v, [&](int64_t, int64_t slot) { c += hit(v, slot); });
        }
        cnt[v + 1] = c;
      }
    });
    for (int64_t v = 0; v < n; ++v) cnt[v + 1] += cnt[v];
    out_v = at::empty({cnt[n]}, degree.options());
    out_p = at::empty({cnt[n]}, degree.options());
    int64_t* ov = out_v.data_ptr<int64_t>();
    int64_t* op_ = out_p.data_ptr<int64_t>();
    at::parallel_for(0, n, 1024, [&](int64_t b, int64_t e) {
      for (int64_t v = b; v < e; ++v) {
        int64_t k = cnt[v];
        g.each(v, [&](int64_t pos, int64_t slot) {
          if (hit(v, slot)) {
            ov[k] = v;
            op_[k++] = pos;
          }
        });
      }
    });
  });
  return {out_v, out_p};
}

// ---------------------------------------------------------------------------------------------
// remove

// Removes positions[offsets[r]:offsets[r+1]] of run r's list, compacting its tail into the
// holes; with no `positions`, every run's list goes whole (offsets[r+1] - offsets[r] is its
// degree) and nothing is compacted.
template <typename idx_t>
void remove_typed(const at::Tensor& pool_t, const std::optional<at::Tensor>& weights, const at::Tensor& root_t,
                  const at::Tensor& height_t, const at::Tensor& degree_t, const at::Tensor& owner_t,
                  const at::Tensor& rank_t, const at::Tensor& ring_t, const at::Tensor& meta_t,
                  const at::Tensor& vertices, const at::Tensor& offsets, const std::optional<at::Tensor>& positions,
                  int s) {
  const Lists<idx_t> g(pool_t, root_t, height_t, degree_t, s);
  const int64_t runs = vertices.numel();
  const int64_t num_pages = pool_t.numel() >> s;
  const int64_t* vtx = vertices.data_ptr<int64_t>();
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t* pos = positions ? positions->data_ptr<int64_t>() : nullptr;
  idx_t* owner = owner_t.data_ptr<idx_t>();
  int32_t* rank = rank_t.data_ptr<int32_t>();
  idx_t* ring = ring_t.data_ptr<idx_t>();
  int64_t* meta = meta_t.data_ptr<int64_t>();

  std::vector<int64_t> base(static_cast<size_t>(runs) + 1, 0);
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t d0 = g.degree[vtx[r]];
    base[r + 1] = base[r] + tree_pages(d0, s) - tree_pages(d0 - (off[r + 1] - off[r]), s);
  }
  const int64_t tail = meta[kTail];
  at::parallel_for(0, runs, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t v = vtx[r];
      const int64_t holes = off[r + 1] - off[r];
      const int64_t d0 = g.degree[v], d1 = d0 - holes;
      const int64_t root0 = g.root[v];
      const int h0 = g.height[v];
      for (int64_t k = 0; pos && k < holes; ++k) {
        const int64_t to = compaction_target(pos + off[r], holes, d1, k);
        if (to < 0) continue;
        move_slot(g.pool, weights, entry_slot(g.pool, root0, h0, d1 + k, s), entry_slot(g.pool, root0, h0, to, s));
      }
      for (int64_t t = 0; t < base[r + 1] - base[r]; ++t)
        shrink_item(g.pool, owner, rank, ring, num_pages, tail, root0, d0, d1, base[r], t, s);
      g.root[v] = static_cast<idx_t>(shrunk_root(g.pool, root0, d0, d1, s));
      g.height[v] = static_cast<int8_t>(tree_shape(d1, s).height);
      g.degree[v] = d1;
    }
  });
  meta[kTail] = tail + base[runs];
}

void remove_cpu(const at::Tensor& pool, const std::optional<at::Tensor>& weights, const at::Tensor& root,
                const at::Tensor& height, const at::Tensor& degree, const at::Tensor& page_owner,
                const at::Tensor& page_rank, const at::Tensor& page_ring, const at::Tensor& meta,
                const at::Tensor& vertices, const at::Tensor& pos_offsets, const at::Tensor& positions,
                int64_t page_size) {
  constexpr const char* op = "dynamic_graph_remove";
  const int s = page_shift(page_size, op);
  check_writer(pool, weights, root, height, degree, page_owner, page_rank, page_ring, meta, s, kCpu, op);
  check_runs(pool, vertices, pos_offsets, positions, "pos_offsets", "positions", op);
  const at::Tensor vtx = vertices.contiguous(), off = pos_offsets.contiguous(), pos = positions.contiguous();
  check_batch(vtx, off, pos, "pos_offsets", "positions", root.numel(), degree.data_ptr<int64_t>(), op);
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    remove_typed<index_t>(pool, weights, root, height, degree, page_owner, page_rank, page_ring, meta, vtx, off, pos,
                          s);
  });
}

// ---------------------------------------------------------------------------------------------
// clear

at::Tensor clear_cpu(const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height, const at::Tensor& degree,
                  const at::Tensor& page_owner, const at::Tensor& page_rank, const at::Tensor& page_ring,
                  const at::Tensor& meta, const at::Tensor& vertices, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_clear";
  const int s = page_shift(page_size, op);
  check_writer(pool, std::nullopt, root, height, degree, page_owner, page_rank, page_ring, meta, s, kCpu, op);
  check_marked_vertices(pool, vertices);
  const at::Tensor vtx = vertices.contiguous();
  check_marked_runs(vtx, root.numel(), op);
  const at::Tensor entries = degree.index_select(0, vtx);
  at::Tensor off = at::zeros({vtx.numel() + 1}, vtx.options());
  if (vtx.numel() > 0) off.slice(0, 1).copy_(entries.cumsum(0));
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    remove_typed<index_t>(pool, std::nullopt, root, height, degree, page_owner, page_rank, page_ring, meta, vtx, off,
                          std::nullopt, s);
  });
  return at::scalar_tensor(off[vtx.numel()].item<int64_t>(), at::kLong);
}

// ---------------------------------------------------------------------------------------------
// to_csr

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> to_csr_cpu(
    const at::Tensor& pool_in, const std::optional<at::Tensor>& weights_in, const at::Tensor& root_in,
    const at::Tensor& height_in, const at::Tensor& degree_in, const at::Tensor& page_owner,
    const at::Tensor& page_rank, const at::Tensor& meta, int64_t page_size, bool with_slots) {
  constexpr const char* op = "dynamic_graph_to_csr";
  const int s = page_shift(page_size, op);
  check_sweeper(pool_in, root_in, height_in, degree_in, page_owner, page_rank, meta, s, kCpu, op);
  check_pool_weights(weights_in, pool_in);
  const at::Tensor pool = pool_in.contiguous(), root = root_in.contiguous(), height = height_in.contiguous(),
                   degree = degree_in.contiguous();
  const int64_t n = root.numel();
  at::Tensor indptr = at::zeros({n + 1}, degree.options());
  if (n > 0) indptr.slice(0, 1).copy_(degree.cumsum(0));
  const int64_t* ptr = indptr.data_ptr<int64_t>();
  const int64_t edges = ptr[n];
  at::Tensor indices = at::empty({edges}, pool.options());
  // Slots are needed for the weights' gather even when not returned.
  at::Tensor slots = at::empty({with_slots || weights_in ? edges : 0}, degree.options());
  at::Tensor w_out =
      weights_in ? at::empty({edges}, weights_in->options()) : at::empty({0}, pool.options().dtype(at::kFloat));
  const at::Tensor w = weights_in ? weights_in->contiguous() : at::Tensor();
  int64_t* sl = slots.numel() ? slots.data_ptr<int64_t>() : nullptr;
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    const Lists<index_t> g(pool, root, height, degree, s);
    index_t* out = indices.data_ptr<index_t>();
    at::parallel_for(0, n, 1024, [&](int64_t b, int64_t e) {
      for (int64_t v = b; v < e; ++v) {
        g.each(v, [&](int64_t pos, int64_t slot) {
          out[ptr[v] + pos] = g.pool[slot];
          if (sl) sl[ptr[v] + pos] = slot;
        });
      }
    });
  });
  if (weights_in && edges > 0) w_out.copy_(w.index_select(0, slots));
  return {indptr, indices, w_out, with_slots ? slots : slots.slice(0, 0, 0)};
}

// ---------------------------------------------------------------------------------------------
// sample

// One layer (uniform, csrc/sampling.h) over the paged lists; errors name `op`.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample_paged(
    const at::Tensor& pool_in, const at::Tensor& root_in, const at::Tensor& height_in, const at::Tensor& degree_in,
    const at::Tensor& seeds_in, int64_t fanout, bool replace, uint64_t seed, int64_t page_size, const char* op) {
  const int s = page_shift(page_size, op);
  check_reader(pool_in, root_in, height_in, degree_in, s, kCpu, op);
  check_seeds(seeds_in, pool_in, fanout, op);
  const at::Tensor pool = pool_in.contiguous(), root = root_in.contiguous(), height = height_in.contiguous(),
                   degree = degree_in.contiguous(), seeds = seeds_in.contiguous();
  const int64_t n = seeds.numel(), num_ids = root.numel();
  const int64_t* sd = seeds.data_ptr<int64_t>();
  const int64_t* deg = degree.data_ptr<int64_t>();
  at::Tensor offsets = at::zeros({n + 1}, degree.options());
  int64_t* off = offsets.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (sd[i] < 0 || sd[i] >= num_ids) raise_seed_error(op, sampling::kBadSeed, i, seeds, num_ids);
    off[i + 1] = off[i] + sampling::sample_count(deg[sd[i]], fanout, replace);
  }
  const int64_t total = off[n];
  at::Tensor neighbors = at::empty({total}, pool.options());
  at::Tensor slots = at::empty({total}, degree.options());
  at::Tensor seed_index = at::empty({total}, degree.options());
  int64_t* sl = slots.data_ptr<int64_t>();
  int64_t* si = seed_index.data_ptr<int64_t>();
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), "dynamic_graph_sample", [&] {
    const Lists<index_t> g(pool, root, height, degree, s);
    index_t* nb = neighbors.data_ptr<index_t>();
    at::parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t v = sd[i];
        const int64_t count = off[i + 1] - off[i];
        int64_t* pos = sl + off[i];
        uniform_positions(v, deg[v], count, fanout, replace, seed, pos);
        for (int64_t k = 0; k < count; ++k) {
          pos[k] = entry_slot(g.pool, static_cast<int64_t>(g.root[v]), g.height[v], pos[k], s);
          nb[off[i] + k] = g.pool[pos[k]];
          si[off[i] + k] = i;
        }
      }
    });
  });
  return {offsets, neighbors, slots, seed_index};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample_cpu(
    const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height, const at::Tensor& degree,
    const at::Tensor& seeds, int64_t fanout, bool replace, int64_t seed, int64_t page_size) {
  return sample_paged(pool, root, height, degree, seeds, fanout, replace, static_cast<uint64_t>(seed), page_size,
                      "dynamic_graph_sample");
}

// sample_layers over the paged lists: per layer, the sample above and the compaction of
// compact_ids (csrc/cpu/sampling_cpu.h), as zerocopy::sample_layers does on the CPU.
std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>>
sample_layers_cpu(const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height, const at::Tensor& degree,
                  const at::Tensor& seeds, c10::IntArrayRef fanouts, bool replace, int64_t seed, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_sample_layers";
  TORCH_CHECK_VALUE(!fanouts.empty(), op, ": fanouts must hold at least one fanout (one per layer)");
  for (const int64_t f : fanouts) check_seeds(seeds, pool, f, op);
  std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>> out;
  auto& [nodes_out, src_out, dst_out, eids_out] = out;
  at::Tensor layer_seeds = seeds.contiguous();
  for (size_t l = 0; l < fanouts.size(); ++l) {
    const uint64_t s = sampling::layer_seed(static_cast<uint64_t>(seed), static_cast<int64_t>(l));
    auto [offsets, neighbors, slots, seed_index] =
        sample_paged(pool, root, height, degree, layer_seeds, fanouts[l], replace, s, page_size, op);
    int64_t repeated = -1;
    auto [nodes, local] = compact_cpu(layer_seeds, neighbors, l == 0 ? &repeated : nullptr);
    if (repeated >= 0) raise_seed_error(op, sampling::kDuplicateSeed, repeated, seeds, root.numel());
    nodes_out.push_back(nodes);
    src_out.push_back(local);
    dst_out.push_back(seed_index);
    eids_out.push_back(slots);
    layer_seeds = nodes;
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// bfs

std::tuple<at::Tensor, at::Tensor, at::Tensor> bfs_cpu(const at::Tensor& pool_in, const at::Tensor& root_in,
                                                      const at::Tensor& height_in, const at::Tensor& degree_in,
                                                      const at::Tensor& page_owner, const at::Tensor& page_rank,
                                                      const at::Tensor& meta, int64_t source, bool predecessors,
                                                      int64_t page_size) {
  constexpr const char* op = "dynamic_graph_bfs";
  const int s = page_shift(page_size, op);
  check_sweeper(pool_in, root_in, height_in, degree_in, page_owner, page_rank, meta, s, kCpu, op);
  const int64_t n = root_in.numel();
  check_bfs_source(source, n, op);
  const at::Tensor pool = pool_in.contiguous(), root = root_in.contiguous(), height = height_in.contiguous(),
                   degree = degree_in.contiguous();
  at::Tensor depth = at::full({n}, -1, degree.options().dtype(at::kInt));
  at::Tensor pred = predecessors ? at::full({n}, -1, pool.options()) : at::empty({0}, pool.options());
  int32_t* d = depth.data_ptr<int32_t>();
  int64_t edges = 0, levels = 0;
  AT_DISPATCH_INDEX_TYPES(pool.scalar_type(), op, [&] {
    const Lists<index_t> g(pool, root, height, degree, s);
    index_t* p = predecessors ? pred.data_ptr<index_t>() : nullptr;
    std::vector<int64_t> queue{source};
    d[source] = 0;
    if (p) p[source] = static_cast<index_t>(source);
    for (size_t head = 0; head < queue.size(); ++head) {
      const int64_t v = queue[head];
      edges += g.degree[v];
      g.each(v, [&](int64_t, int64_t slot) {
        const int64_t u = g.pool[slot];
        if (d[u] != -1) return;
        d[u] = d[v] + 1;
        if (p) p[u] = static_cast<index_t>(v);
        queue.push_back(u);
      });
    }
    levels = d[queue.back()] + 1;
  });
  at::Tensor stats = at::empty({2}, degree.options());
  stats[0] = edges;
  stats[1] = levels;
  return {depth, pred, stats};
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) {
  m.impl("dynamic_graph_append", append_cpu);
  m.impl("dynamic_graph_contains", contains_cpu);
  m.impl("dynamic_graph_find", find_cpu);
  m.impl("dynamic_graph_find_touching", find_touching_cpu);
  m.impl("dynamic_graph_find_marked", find_marked_cpu);
  m.impl("dynamic_graph_mark_neighbours", mark_neighbours_cpu);
  m.impl("dynamic_graph_pages_needed", pages_needed_cpu);
  m.impl("dynamic_graph_remove", remove_cpu);
  m.impl("dynamic_graph_clear", clear_cpu);
  m.impl("dynamic_graph_to_csr", to_csr_cpu);
  m.impl("dynamic_graph_sample", sample_cpu);
  m.impl("dynamic_graph_sample_layers", sample_layers_cpu);
  m.impl("dynamic_graph_bfs", bfs_cpu);
}

}  // namespace zerocopy
