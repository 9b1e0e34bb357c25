// Neighbour sampling: the pieces the CPU and CUDA kernels share, so that both produce the same
// samples for the same (seed, node) wherever the arithmetic is exact.
//
// Randomness is counter-based: every draw is a hash of (seed, seed node id, draw number), so a
// node's samples depend only on the seed and the node, never on thread count, launch shape or
// the order in which seeds are processed.
//
// Per seed node v with neighbour list of length deg (CSR positions start .. start+deg):
//   fanout == -1                    every neighbour (with probs: every one with p > 0), in
//                                   list order
//   uniform, no replacement         deg <= fanout: every neighbour in list order; otherwise
//                                   Floyd's algorithm picks fanout distinct positions, in the
//                                   order Floyd's algorithm inserts them
//   uniform, with replacement       fanout positions, each uniform in [0, deg) (0 if deg == 0)
//   weighted (probs), no repl.      the min(fanout, #positive) positions with the smallest keys
//                                   -log(u)/p (Efraimidis-Spirakis), ascending key; when
//                                   #positive < fanout, every positive edge in list order
//   weighted, with replacement      fanout positions by inverse-CDF of p (0 if no p > 0)
// Probabilities are finite and >= 0 (the kernels raise on NaN, inf or a negative value, checked
// on every list they visit); an edge with probability 0 is never sampled.
//
// Layers. Layer l of a multi-layer sample draws with layer_seed(seed, l): layer 0 with `seed`
// itself (a one-layer sample equals sample_neighbors with the same seed), every later layer
// with its own derived seed, so a node that is a seed in two layers gets independent samples.
// A layer's frontier (Frontier below) is every node of the previous layer, or only the nodes
// first reached there; either way a node's draws in layer l depend on (seed, l, node) alone.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define ZC_HD __host__ __device__ __forceinline__
#else
#define ZC_HD inline
#endif

namespace zerocopy {
namespace sampling {

// splitmix64's finaliser: a bijective 64-bit mixer.
ZC_HD uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The k-th random word of node `node` under `seed`.
ZC_HD uint64_t draw(uint64_t seed, int64_t node, int64_t k) {
  return mix64(mix64(seed ^ mix64(static_cast<uint64_t>(node))) + static_cast<uint64_t>(k));
}

// A value uniform in [0, n) from a random word (multiply-shift; n > 0).
ZC_HD int64_t below(uint64_t r, int64_t n) {
#if defined(__CUDA_ARCH__)
  return static_cast<int64_t>(__umul64hi(r, static_cast<uint64_t>(n)));
#else
  return static_cast<int64_t>((static_cast<unsigned __int128>(r) * static_cast<uint64_t>(n)) >> 64);
#endif
}

// A double uniform in the open interval (0, 1).
ZC_HD double open_unit(uint64_t r) {
  return (static_cast<double>(r >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Draw streams: each sampling mode uses its own range of draw numbers.
constexpr int64_t kFloydStream = 0;
constexpr int64_t kReplaceStream = int64_t(1) << 40;
constexpr int64_t kKeyStream = int64_t(2) << 40;

// Efraimidis-Spirakis key of edge `pos` (position within the list) with probability p:
// smaller is more likely to be picked. +inf for p <= 0 or NaN.
ZC_HD double weighted_key(uint64_t seed, int64_t node, int64_t pos, double p) {
  if (!(p > 0.0)) return __builtin_huge_val();
  return -log(open_unit(draw(seed, node, kKeyStream + pos))) / p;
}

// The seed of layer `layer` of a multi-layer sample drawn with `seed` (see the top).
ZC_HD uint64_t layer_seed(uint64_t seed, int64_t layer) {
  return layer == 0 ? seed : mix64(seed ^ mix64(static_cast<uint64_t>(layer)));
}

// The frontier of layer l >= 1 of a multi-layer sample (the op argument `frontier`, checked at
// the op boundary; csrc/zerocopy.cpp describes the outputs of each).
enum class Frontier : int64_t {
  kAll = 0,  // every node of layer l - 1: DGL's message flow graphs
  kNew = 1,  // the nodes first reached in layer l - 1: PyG's hops
};

// A sampling probability the kernels accept: finite and >= 0 (NaN fails both tests).
ZC_HD bool valid_prob(float p) { return p >= 0.0f && p <= 3.402823466e38f; }

// Number of edges a seed gets (see the table above). `positive` is the number of edges with
// p > 0 (the degree when there are no probabilities).
ZC_HD int64_t sample_count(int64_t positive, int64_t fanout, bool replace) {
  if (fanout < 0) return positive;
  if (replace) return positive > 0 ? fanout : 0;
  return positive < fanout ? positive : fanout;
}

// What the sampling kernels check on the data they visit, one error word per kind. A word holds
// the smallest `where` reported for its kind (all ones: none); csrc/sampling_errors.h turns
// the first kind that fired into an exception naming the argument.
enum SampleError : int {
  kBadSeed = 0,        // where: index in seeds of a node id outside [0, num_nodes)
  kDuplicateSeed = 1,  // where: index in seeds of a node id that an earlier seed already holds
  kBadIndptr = 2,      // where: node v with not 0 <= indptr[v] <= indptr[v+1] <= len(indices)
  kBadNeighbor = 3,    // where: position e with indices[e] outside [0, num_nodes)
  kBadEdgeId = 4,      // where: position e with eids[e] outside [0, len(indices))
  kBadProb = 5,        // where: edge id with a NaN, infinite or negative probability
  kInternal = 6,       // a broken invariant (a full hash table; the graph changed during the call)
  kNumSampleErrors = 7,
};

}  // namespace sampling
}  // namespace zerocopy
