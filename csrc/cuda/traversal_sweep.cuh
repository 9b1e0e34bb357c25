// Full sweeps over the edge list, for ops where every vertex is active in every pass
// (connected components, pagerank). sweep_edges calls visit(v, u) for every edge
// v -> u in one of the four read shapes:
//
// * naive / merged / aligned: as in traversal_common.cuh (thread or warp per vertex).
// * frontier (edge-balanced, sweep_edge_slices): each warp takes a fixed slice of kSliceEdges
//   consecutive edges, starting at a 128-byte line boundary, and lane k reads edges k, k + 32,
//   ... of it; each lane finds the source vertex of its first edge by binary search over indptr
//   and then walks forward. Every request is a whole aligned line whatever the degrees, and no
//   lane idles on a short list.
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

// Edge-balanced sweep over the edges [begin, end) of the list, whose edge e is read from
// src[e - begin] (src: the edge list itself with begin = 0, or a copy of a piece of it). Each warp
// takes slices of kSliceEdges edges that start on a 128-byte line of src; a step of the slice
// is one converged load of one whole line. A lane finds the source vertex of its first edge by
// binary search and then walks forward; visit(v, u) runs after the step's load, so whatever it
// does (divergent loops, atomics) never splits the next step's request.
template <typename T, typename Skip, typename Visit>
__device__ __forceinline__ void sweep_edge_slices(int64_t n, const int64_t* __restrict__ indptr,
                                                  const T* __restrict__ src, int64_t begin, int64_t end,
                                                  Skip&& skip, Visit&& visit, unsigned long long& edges) {
  const int lane = threadIdx.x % kWarp;
  const int64_t count = end - begin;
  const int64_t shift = -aligned_start(src, 0);  // elements of src's first line before src[0]
  const int64_t slices = (count + shift + kSliceEdges - 1) / kSliceEdges;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t s = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp; s < slices;
       s += warps) {
    const int64_t first = s * kSliceEdges - shift;  // index into src
    const int64_t lo = first < 0 ? 0 : first;
    const int64_t hi = first + kSliceEdges < count ? first + kSliceEdges : count;
    if (lane == 0) edges += hi - lo;
    int64_t v = -1;
    for (int64_t step = first; step < hi; step += kWarp) {
      __syncwarp();
      const int64_t i = step + lane;
      const bool valid = i >= lo && i < hi;
      const int64_t u = valid ? static_cast<int64_t>(src[i]) : 0;
      if (!valid) continue;
      const int64_t e = begin + i;
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
      if (!skip(v)) visit(v, u);
    }
  }
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
      // Lane 0's answer for the whole warp, so the warp-collective loop below is entered by all
      // lanes or none even if skip() reads state that changes under it.
      if (__shfl_sync(0xffffffffu, static_cast<int>(skip(v)), 0)) continue;
      const int64_t start = indptr[v], end = indptr[v + 1];
      if (lane == 0) edges += end - start;
      warp_for_each<kVariant == kAligned>(indices, start, end, lane, [&](int64_t e, bool valid) {
        const int64_t u = valid ? static_cast<int64_t>(indices[e]) : 0;
        if (valid) visit(v, u);
      });
    }
  } else {
    sweep_edge_slices(n, indptr, indices, 0, indptr[n], skip, visit, edges);
  }
}

}  // namespace traversal
}  // namespace zerocopy
