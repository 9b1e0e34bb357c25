// Full sweeps over the edge list, for ops where every vertex is active in every pass
// (connected components, pagerank). sweep_edges calls visit(v, u, lane_valid) for every edge
// v -> u in one of the four read shapes:
//
// * naive / merged / aligned: as in traversal_common.cuh (thread or warp per vertex).
// * frontier (edge-balanced): each warp takes a fixed slice of kSliceEdges consecutive edges,
//   starting at a 128-byte line boundary, and lane k reads edges k, k + 32, ... of it; each
//   lane finds the source vertex of its first edge by binary search over indptr and then
//   walks forward. Every request is a whole aligned line whatever the degrees, and no lane
//   idles on a short list.
//
// skip(v) lets a sweep leave out vertices with nothing to contribute (read before their list).
#pragma once

#include "traversal_common.cuh"

namespace zerocopy {
namespace traversal {

constexpr int64_t kSliceEdges = 32 * 32;

// The vertex whose list holds edge e (0 <= e < indptr[n]): the largest v with indptr[v] <= e.
__device__ __forceinline__ int64_t vertex_of_edge(const int64_t* __restrict__ indptr, int64_t n, int64_t e) {
  int64_t lo = 0, hi = n - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (indptr[mid] <= e) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

template <int kVariant, typename T, typename Skip, typename Visit>
__device__ __forceinline__ void sweep_edges(int64_t n, const int64_t* __restrict__ indptr,
                                            const T* __restrict__ indices, Skip&& skip, Visit&& visit,
                                            unsigned long long& edges) {
  const int lane = threadIdx.x % kWarp;
  if constexpr (kVariant == kNaive) {
    for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
         v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      if (skip(v)) continue;
      const int64_t start = indptr[v], end = indptr[v + 1];
      edges += end - start;
      for (int64_t e = start; e < end; ++e) visit(v, static_cast<int64_t>(indices[e]));
    }
  } else if constexpr (kVariant == kMerged || kVariant == kAligned) {
    const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
    for (int64_t v = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp; v < n; v += warps) {
      if (skip(v)) continue;
      const int64_t start = indptr[v], end = indptr[v + 1];
      if (lane == 0) edges += end - start;
      warp_for_each<kVariant == kAligned>(indices, start, end, lane, [&](int64_t e, bool valid) {
        if (valid) visit(v, static_cast<int64_t>(indices[e]));
      });
    }
  } else {
    const int64_t m = indptr[n];
    const int64_t shift = -aligned_start(indices, 0);  // elements of the first line before indices[0]
    const int64_t slices = (m + shift + kSliceEdges - 1) / kSliceEdges;
    const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
    for (int64_t s = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp; s < slices;
         s += warps) {
      const int64_t first = s * kSliceEdges - shift;
      const int64_t lo = first < 0 ? 0 : first;
      const int64_t hi = first + kSliceEdges < m ? first + kSliceEdges : m;
      if (lane == 0) edges += hi - lo;
      int64_t v = -1;
      for (int64_t e = first + lane; e < hi; e += kWarp) {
        if (e < lo) continue;
        if (v < 0) {
          v = vertex_of_edge(indptr, n, e);
        } else {
          int hops = 0;
          while (indptr[v + 1] <= e) {
            if (++hops > 8) {
              v = vertex_of_edge(indptr, n, e);
              break;
            }
            ++v;
          }
        }
        if (!skip(v)) visit(v, static_cast<int64_t>(indices[e]));
      }
    }
  }
}

}  // namespace traversal
}  // namespace zerocopy
