// zerocopy::sample_layers on the CPU: per layer, the one-layer sampler of sample_neighbors over
// the layer's frontier and the hash-table compaction of compact_ids over the nodes reached so
// far and the sampled neighbours (csrc/cpu/sampling_cpu.h), each parallel over seeds or
// positions with at::parallel_for. Results equal the CUDA kernel's for uniform sampling and do
// not depend on the thread count.

#include "checks.h"
#include "cpu/sampling_cpu.h"
#include "sample_neighbors_args.h"
#include "sampling.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

namespace zerocopy {

namespace {

using Layers = std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
                          std::vector<at::Tensor>>;

// The edge ids of sampled list positions: eids[position] (each checked to be an edge id), or
// the positions themselves.
at::Tensor edge_ids_of(const at::Tensor& edge_pos, const std::optional<at::Tensor>& eids, const SampleInputs& in) {
  if (!eids) return edge_pos;
  at::Tensor out = at::empty_like(edge_pos);
  const int64_t* pos = edge_pos.data_ptr<int64_t>();
  const int64_t* ids = eids->data_ptr<int64_t>();
  int64_t* o = out.data_ptr<int64_t>();
  const int64_t num_edges = eids->numel();
  ErrorWords errors;
  at::parallel_for(0, edge_pos.numel(), 4096, [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      const int64_t id = ids[pos[k]];
      if (id < 0 || id >= num_edges) errors.report(sampling::kBadEdgeId, pos[k]);
      o[k] = id;
    }
  });
  errors.raise_if_any("sample_layers", in);
  return out;
}

Layers sample_layers_cpu(const at::Tensor& indptr_in, const at::Tensor& indices_in, const at::Tensor& seeds_in,
                         c10::IntArrayRef fanouts, bool replace, const std::optional<at::Tensor>& probs_in,
                         const std::optional<at::Tensor>& eids_in, int64_t seed, int64_t frontier_in) {
  const sampling::Frontier frontier =
      check_sample_layers_args(indptr_in, indices_in, seeds_in, fanouts, probs_in, eids_in, frontier_in);
  check_device_type(indptr_in, c10::DeviceType::CPU, "indptr");
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  const std::optional<at::Tensor> probs =
      probs_in ? std::optional<at::Tensor>(probs_in->contiguous()) : std::nullopt;
  const std::optional<at::Tensor> eids = eids_in ? std::optional<at::Tensor>(eids_in->contiguous()) : std::nullopt;

  Layers out;
  auto& [nodes_out, src_out, dst_out, eids_out] = out;
  // reached: every node reached so far (the seeds, then each layer's new nodes); the layer's
  // frontier is reached[first:].
  at::Tensor reached = seeds_in.contiguous();
  int64_t first = 0;
  for (size_t l = 0; l < fanouts.size(); ++l) {
    const at::Tensor layer_seeds = first == 0 ? reached : reached.narrow(0, first, reached.numel() - first);
    const SampleInputs inputs{indptr, indices, layer_seeds, probs, eids};
    const uint64_t s = sampling::layer_seed(static_cast<uint64_t>(seed), static_cast<int64_t>(l));
    LayerSample sample = sample_layer_cpu(indptr, indices, layer_seeds, fanouts[l], replace, probs, eids, s,
                                          "sample_layers", inputs);
    int64_t repeated = -1;
    auto [nodes, local] = compact_cpu(reached, sample.neighbors, l == 0 ? &repeated : nullptr);
    if (repeated >= 0) raise_sample_error("sample_layers", sampling::kDuplicateSeed, repeated, inputs);
    nodes_out.push_back(nodes);
    src_out.push_back(local);
    dst_out.push_back(first == 0 ? sample.seed_index : sample.seed_index + first);
    eids_out.push_back(edge_ids_of(sample.edge_pos, eids, inputs));
    if (frontier == sampling::Frontier::kNew) first = reached.numel();
    reached = nodes;
  }
  return out;
}

std::vector<int64_t> sample_layers_check_cpu(const at::Tensor& status, const at::Tensor& indptr,
                                             const at::Tensor& indices, const at::Tensor& seeds,
                                             const std::optional<at::Tensor>& probs,
                                             const std::optional<at::Tensor>& eids) {
  return check_sample_status(status, SampleInputs{indptr, indices, seeds, probs, eids});
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) {
  m.impl("sample_layers", sample_layers_cpu);
  m.impl("sample_layers_check", sample_layers_check_cpu);
}

}  // namespace zerocopy
