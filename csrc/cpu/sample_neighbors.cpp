// zerocopy::sample_neighbors on the CPU: one task per seed node, at::parallel_for over seeds.
// The samples of a seed depend only on (seed, node id), see csrc/sampling.h, so the result is
// the same for every thread count.

#include "checks.h"
#include "sampling.h"
#include "sample_neighbors_args.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <unordered_set>
#include <utility>
#include <vector>

namespace zerocopy {

namespace {

using sampling::sample_count;

// Writes the `count` sampled list positions of one seed into pos[0..count).
void sample_positions(int64_t node, int64_t deg, int64_t count, int64_t fanout, bool replace,
                      const float* p, uint64_t seed, int64_t* pos) {
  if (count == 0) return;
  if (p == nullptr) {
    if (fanout < 0 || (!replace && deg <= fanout)) {
      for (int64_t i = 0; i < count; ++i) pos[i] = i;
    } else if (replace) {
      for (int64_t i = 0; i < count; ++i)
        pos[i] = sampling::below(sampling::draw(seed, node, sampling::kReplaceStream + i), deg);
    } else {
      // Floyd's algorithm: for j = deg-count .. deg-1 pick t in [0, j]; take t unless already
      // taken, else j. The membership test is a scan for small samples, a hash set otherwise;
      // both give the same sequence.
      std::unordered_set<int64_t> taken;
      const bool use_set = count > 64;
      for (int64_t i = 0; i < count; ++i) {
        const int64_t j = deg - count + i;
        const int64_t t = sampling::below(sampling::draw(seed, node, sampling::kFloydStream + i), j + 1);
        bool seen;
        if (use_set) {
          seen = taken.count(t) != 0;
        } else {
          seen = std::find(pos, pos + i, t) != pos + i;
        }
        pos[i] = seen ? j : t;
        if (use_set) taken.insert(pos[i]);
      }
    }
    return;
  }
  // Weighted.
  if (fanout < 0) {  // every positive edge, in list order
    int64_t k = 0;
    for (int64_t e = 0; e < deg && k < count; ++e)
      if (p[e] > 0.0f) pos[k++] = e;
    return;
  }
  if (replace) {
    std::vector<double> prefix(static_cast<size_t>(deg));
    double total = 0.0;
    int64_t last_positive = -1;
    for (int64_t e = 0; e < deg; ++e) {
      const double w = p[e] > 0.0f ? static_cast<double>(p[e]) : 0.0;
      if (w > 0.0) last_positive = e;
      total += w;
      prefix[static_cast<size_t>(e)] = total;
    }
    for (int64_t i = 0; i < count; ++i) {
      const double target =
          sampling::open_unit(sampling::draw(seed, node, sampling::kReplaceStream + i)) * total;
      // First position whose inclusive prefix reaches the target: never a p <= 0 edge.
      auto it = std::lower_bound(prefix.begin(), prefix.end(), target);
      const int64_t e = it == prefix.end() ? last_positive : static_cast<int64_t>(it - prefix.begin());
      pos[i] = std::min(e, last_positive);
    }
    return;
  }
  std::vector<std::pair<double, int64_t>> keyed;
  keyed.reserve(static_cast<size_t>(deg));
  for (int64_t e = 0; e < deg; ++e) {
    if (p[e] > 0.0f) keyed.emplace_back(sampling::weighted_key(seed, node, e, p[e]), e);
  }
  if (static_cast<int64_t>(keyed.size()) < fanout) {
    for (int64_t i = 0; i < count; ++i) pos[i] = keyed[static_cast<size_t>(i)].second;
    return;
  }
  std::partial_sort(keyed.begin(), keyed.begin() + count, keyed.end());
  for (int64_t i = 0; i < count; ++i) pos[i] = keyed[static_cast<size_t>(i)].second;
}

template <typename seed_t, typename index_t>
std::vector<at::Tensor> sample_cpu_typed(const at::Tensor& indptr, const at::Tensor& indices,
                                         const at::Tensor& seeds, int64_t fanout, bool replace,
                                         const at::Tensor* probs, uint64_t seed) {
  const int64_t n = seeds.numel();
  const int64_t num_nodes = indptr.numel() - 1;
  const int64_t* ptr = indptr.data_ptr<int64_t>();
  const seed_t* sd = seeds.data_ptr<seed_t>();
  const float* pr = probs ? probs->data_ptr<float>() : nullptr;

  at::Tensor counts = at::empty({n}, seeds.options().dtype(at::kLong));
  int64_t* cnt = counts.data_ptr<int64_t>();
  std::atomic<int64_t> first_bad{n};
  at::parallel_for(0, n, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t v = static_cast<int64_t>(sd[i]);
      if (v < 0 || v >= num_nodes) {
        int64_t cur = first_bad.load();
        while (i < cur && !first_bad.compare_exchange_weak(cur, i)) {
        }
        cnt[i] = 0;
        continue;
      }
      const int64_t start = ptr[v], deg = ptr[v + 1] - ptr[v];
      int64_t positive = deg;
      if (pr) {
        positive = 0;
        for (int64_t k = 0; k < deg; ++k) positive += pr[start + k] > 0.0f;
      }
      cnt[i] = sample_count(positive, fanout, replace);
    }
  });
  const int64_t bad = first_bad.load();
  TORCH_CHECK_INDEX(bad == n, "sample_neighbors: seeds[", bad, "] = ", static_cast<int64_t>(sd[bad]),
                    " is out of range for a graph with ", num_nodes, " nodes");

  at::Tensor offsets = at::zeros({n + 1}, counts.options());
  if (n > 0) offsets.slice(0, 1).copy_(counts.cumsum(0));
  const int64_t* off = offsets.data_ptr<int64_t>();
  const int64_t total = off[n];
  at::Tensor neighbors = at::empty({total}, indices.options());
  at::Tensor edge_pos = at::empty({total}, indptr.options());
  at::Tensor seed_index = at::empty({total}, indptr.options());
  index_t* nb = neighbors.data_ptr<index_t>();
  int64_t* ep = edge_pos.data_ptr<int64_t>();
  int64_t* si = seed_index.data_ptr<int64_t>();
  const index_t* idx = indices.data_ptr<index_t>();

  at::parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t v = static_cast<int64_t>(sd[i]);
      const int64_t start = ptr[v], deg = ptr[v + 1] - ptr[v];
      const int64_t count = off[i + 1] - off[i];
      int64_t* pos = ep + off[i];
      sample_positions(v, deg, count, fanout, replace, pr ? pr + start : nullptr, seed, pos);
      for (int64_t k = 0; k < count; ++k) {
        pos[k] += start;
        nb[off[i] + k] = idx[pos[k]];
        si[off[i] + k] = i;
      }
    }
  });
  return {offsets, neighbors, edge_pos, seed_index};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample_neighbors_cpu(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds, int64_t fanout,
    bool replace, const std::optional<at::Tensor>& probs, int64_t seed) {
  check_sample_neighbors_args(indptr, indices, seeds, fanout, probs);
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&indptr, "indptr"},
                                {&indices, "indices"}, {&seeds, "seeds"}}) {
    check_device_type(*t, c10::DeviceType::CPU, name);
  }
  if (probs) check_device_type(*probs, c10::DeviceType::CPU, "probs");
  const at::Tensor ptr = indptr.contiguous();
  const at::Tensor idx = indices.contiguous();
  const at::Tensor sd = seeds.contiguous();
  const at::Tensor pr = probs ? probs->contiguous() : at::Tensor();
  std::vector<at::Tensor> out;
  AT_DISPATCH_INDEX_TYPES(sd.scalar_type(), "sample_neighbors", [&] {
    using seed_t = index_t;
    if (idx.scalar_type() == at::kInt) {
      out = sample_cpu_typed<seed_t, int32_t>(ptr, idx, sd, fanout, replace, probs ? &pr : nullptr,
                                              static_cast<uint64_t>(seed));
    } else {
      out = sample_cpu_typed<seed_t, int64_t>(ptr, idx, sd, fanout, replace, probs ? &pr : nullptr,
                                              static_cast<uint64_t>(seed));
    }
  });
  return {out[0], out[1], out[2], out[3]};
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) {
  m.impl("sample_neighbors", sample_neighbors_cpu);
}

}  // namespace zerocopy
