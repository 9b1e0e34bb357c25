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
// Probabilities <= 0 (and NaN) are never sampled.
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

// Number of edges a seed gets (see the table above). `positive` is the number of edges with
// p > 0 (the degree when there are no probabilities).
ZC_HD int64_t sample_count(int64_t positive, int64_t fanout, bool replace) {
  if (fanout < 0) return positive;
  if (replace) return positive > 0 ? fanout : 0;
  return positive < fanout ? positive : fanout;
}

}  // namespace sampling
}  // namespace zerocopy
