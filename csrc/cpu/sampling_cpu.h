// The CPU sampling kernels shared by the ops zerocopy::sample_neighbors, zerocopy::compact_ids
// and zerocopy::sample_layers (csrc/cpu/sample_neighbors.cpp, compact_ids.cpp,
// sample_layers.cpp). Every tensor argument is a contiguous CPU tensor whose dtypes and sizes
// the calling op has checked; the graph's contents are checked here, on the data visited.
#pragma once

#include "sampling_errors.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <tuple>

namespace zerocopy {

// One layer's sample: seed i got neighbors[offsets[i]:offsets[i+1]] (indices' dtype), found at
// list positions edge_pos[...] (int64); seed_index[k] is the i of sampled edge k (int64).
struct LayerSample {
  at::Tensor offsets;
  at::Tensor neighbors;
  at::Tensor edge_pos;
  at::Tensor seed_index;
};

// Samples every seed's neighbour list (csrc/sampling.h says what is sampled). `probs` is indexed
// by edge id: eids[position] when `eids` is given, else the position. Raises (messages from
// csrc/sampling_errors.h, prefixed with `op`, values read from `inputs`) on a seed out of
// range, a malformed offset pair, a neighbour id out of range, an edge id out of range or a
// bad probability, on the lists visited.
LayerSample sample_layer_cpu(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                             int64_t fanout, bool replace, const std::optional<at::Tensor>& probs,
                             const std::optional<at::Tensor>& eids, uint64_t seed, const char* op,
                             const SampleInputs& inputs);

// Writes the `count` uniformly sampled list positions (relative to the list's start) of seed
// `node`, whose list holds `deg` entries, into pos[0..count) (csrc/sampling.h's uniform rules).
void uniform_positions(int64_t node, int64_t deg, int64_t count, int64_t fanout, bool replace, uint64_t seed,
                       int64_t* pos);

// The unique ids of cat(seeds, neighbors) in order of first appearance (int64) and each
// neighbour's index in that list (int64). Negative ids raise ValueError. With
// `first_repeated_seed`, also stores the smallest index i such that seeds[i] equals an earlier
// seed (-1: the seeds are distinct).
std::tuple<at::Tensor, at::Tensor> compact_cpu(const at::Tensor& seeds, const at::Tensor& neighbors,
                                               int64_t* first_repeated_seed);

}  // namespace zerocopy
