// zerocopy::sample_neighbors on the CPU, and the one-layer sampler it shares with
// zerocopy::sample_layers: one task per seed node, at::parallel_for over seeds. The samples of a
// seed depend only on (seed, node id), see csrc/sampling.h, so the result is the same for every
// thread count.

#include "checks.h"
#include "cpu/sampling_cpu.h"
#include "sample_neighbors_args.h"
#include "sampling.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <unordered_set>
#include <utility>
#include <vector>

namespace zerocopy {

void uniform_positions(int64_t node, int64_t deg, int64_t count, int64_t fanout, bool replace, uint64_t seed,
                       int64_t* pos) {
  if (count == 0) return;
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
      const bool seen = use_set ? taken.count(t) != 0 : std::find(pos, pos + i, t) != pos + i;
      pos[i] = seen ? j : t;
      if (use_set) taken.insert(pos[i]);
    }
  }
}

namespace {

using sampling::sample_count;

// Probabilities by edge id, read through the position -> edge id map when there is one.
struct EdgeProbs {
  const float* probs;
  const int64_t* eids;  // nullptr: the position is the edge id
  float at(int64_t e) const { return probs[eids ? eids[e] : e]; }
};

// Writes the `count` sampled list positions (relative to the list's start) of one seed into
// pos[0..count). `p` (nullptr: uniform) reads the probabilities of the list's positions, which
// the caller has checked.
void sample_positions(int64_t node, int64_t start, int64_t deg, int64_t count, int64_t fanout, bool replace,
                      const EdgeProbs* p, uint64_t seed, int64_t* pos) {
  if (count == 0) return;
  if (p == nullptr) {
    uniform_positions(node, deg, count, fanout, replace, seed, pos);
    return;
  }
  // Weighted.
  if (fanout < 0) {  // every positive edge, in list order
    int64_t k = 0;
    for (int64_t e = 0; e < deg && k < count; ++e)
      if (p->at(start + e) > 0.0f) pos[k++] = e;
    return;
  }
  if (replace) {
    std::vector<double> prefix(static_cast<size_t>(deg));
    double total = 0.0;
    int64_t last_positive = -1;
    for (int64_t e = 0; e < deg; ++e) {
      const float pe = p->at(start + e);
      const double w = pe > 0.0f ? static_cast<double>(pe) : 0.0;
      if (w > 0.0) last_positive = e;
      total += w;
      prefix[static_cast<size_t>(e)] = total;
    }
    for (int64_t i = 0; i < count; ++i) {
      const double target =
          sampling::open_unit(sampling::draw(seed, node, sampling::kReplaceStream + i)) * total;
      // First position whose inclusive prefix reaches the target: never a p == 0 edge.
      auto it = std::lower_bound(prefix.begin(), prefix.end(), target);
      const int64_t e = it == prefix.end() ? last_positive : static_cast<int64_t>(it - prefix.begin());
      pos[i] = std::min(e, last_positive);
    }
    return;
  }
  std::vector<std::pair<double, int64_t>> keyed;
  keyed.reserve(static_cast<size_t>(deg));
  for (int64_t e = 0; e < deg; ++e) {
    const float pe = p->at(start + e);
    if (pe > 0.0f) keyed.emplace_back(sampling::weighted_key(seed, node, e, pe), e);
  }
  if (static_cast<int64_t>(keyed.size()) < fanout) {
    for (int64_t i = 0; i < count; ++i) pos[i] = keyed[static_cast<size_t>(i)].second;
    return;
  }
  std::partial_sort(keyed.begin(), keyed.begin() + count, keyed.end());
  for (int64_t i = 0; i < count; ++i) pos[i] = keyed[static_cast<size_t>(i)].second;
}

template <typename seed_t, typename index_t>
LayerSample sample_typed(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                         int64_t fanout, bool replace, const float* probs, const int64_t* eids, uint64_t seed,
                         const char* op, const SampleInputs& inputs) {
  const int64_t n = seeds.numel();
  const int64_t num_nodes = indptr.numel() - 1;
  const int64_t num_edges = indices.numel();
  const int64_t* ptr = indptr.data_ptr<int64_t>();
  const seed_t* sd = seeds.data_ptr<seed_t>();
  const EdgeProbs edge_probs{probs, eids};
  const EdgeProbs* pr = probs ? &edge_probs : nullptr;
  ErrorWords errors;

  // Pass 1: every visited seed, offset pair and probability is checked; counts.
  at::Tensor counts = at::empty({n}, seeds.options().dtype(at::kLong));
  int64_t* cnt = counts.data_ptr<int64_t>();
  at::parallel_for(0, n, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      cnt[i] = 0;
      const int64_t v = static_cast<int64_t>(sd[i]);
      if (v < 0 || v >= num_nodes) {
        errors.report(sampling::kBadSeed, i);
        continue;
      }
      const int64_t start = ptr[v], end = ptr[v + 1];
      if (!(0 <= start && start <= end && end <= num_edges)) {
        errors.report(sampling::kBadIndptr, v);
        continue;
      }
      int64_t positive = end - start;
      if (pr) {
        positive = 0;
        bool bad = false;
        for (int64_t k = start; k < end; ++k) {
          const int64_t id = eids ? eids[k] : k;
          if (id < 0 || id >= num_edges) {
            errors.report(sampling::kBadEdgeId, k);
            bad = true;
            continue;
          }
          const float p = probs[id];
          if (!sampling::valid_prob(p)) {
            errors.report(sampling::kBadProb, id);
            bad = true;
            continue;
          }
          positive += p > 0.0f;
        }
        if (bad) continue;
      }
      cnt[i] = sample_count(positive, fanout, replace);
    }
  });
  errors.raise_if_any(op, inputs);

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

  // Pass 2: sample; every neighbour id read is checked.
  at::parallel_for(0, n, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t v = static_cast<int64_t>(sd[i]);
      const int64_t start = ptr[v], deg = ptr[v + 1] - ptr[v];
      const int64_t count = off[i + 1] - off[i];
      int64_t* pos = ep + off[i];
      sample_positions(v, start, deg, count, fanout, replace, pr, seed, pos);
      for (int64_t k = 0; k < count; ++k) {
        pos[k] += start;
        const index_t u = idx[pos[k]];
        if (u < 0 || static_cast<int64_t>(u) >= num_nodes) errors.report(sampling::kBadNeighbor, pos[k]);
        nb[off[i] + k] = u;
        si[off[i] + k] = i;
      }
    }
  });
  errors.raise_if_any(op, inputs);
  return {offsets, neighbors, edge_pos, seed_index};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample_neighbors_cpu(
    const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds, int64_t fanout,
    bool replace, const std::optional<at::Tensor>& probs, int64_t seed) {
  check_sample_neighbors_args(indptr, indices, seeds, fanout, probs);
  check_device_type(indptr, c10::DeviceType::CPU, "indptr");
  const at::Tensor ptr = indptr.contiguous();
  const at::Tensor idx = indices.contiguous();
  const at::Tensor sd = seeds.contiguous();
  const std::optional<at::Tensor> pr = probs ? std::optional<at::Tensor>(probs->contiguous()) : std::nullopt;
  const std::optional<at::Tensor> no_eids;
  const SampleInputs inputs{ptr, idx, sd, pr, no_eids};
  LayerSample out = sample_layer_cpu(ptr, idx, sd, fanout, replace, pr, no_eids, static_cast<uint64_t>(seed),
                                     "sample_neighbors", inputs);
  return {out.offsets, out.neighbors, out.edge_pos, out.seed_index};
}

}  // namespace

LayerSample sample_layer_cpu(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                             int64_t fanout, bool replace, const std::optional<at::Tensor>& probs,
                             const std::optional<at::Tensor>& eids, uint64_t seed, const char* op,
                             const SampleInputs& inputs) {
  const float* pr = probs ? probs->data_ptr<float>() : nullptr;
  const int64_t* ei = eids ? eids->data_ptr<int64_t>() : nullptr;
  LayerSample out;
  AT_DISPATCH_INDEX_TYPES(seeds.scalar_type(), "sample_neighbors", [&] {
    using seed_t = index_t;
    if (indices.scalar_type() == at::kInt) {
      out = sample_typed<seed_t, int32_t>(indptr, indices, seeds, fanout, replace, pr, ei, seed, op, inputs);
    } else {
      out = sample_typed<seed_t, int64_t>(indptr, indices, seeds, fanout, replace, pr, ei, seed, op, inputs);
    }
  });
  return out;
}

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) {
  m.impl("sample_neighbors", sample_neighbors_cpu);
}

}  // namespace zerocopy
