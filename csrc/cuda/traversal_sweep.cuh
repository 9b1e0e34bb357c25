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
// Every read of the graph is checked against a GraphGuard (traversal_common.cuh).
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
//
// Bounds: src is read only at [0, end - begin) (a staged chunk's own bounds), indptr only at
// [0, n], whatever the offsets hold (the walk stops at the last vertex, the binary search stays
// in [0, n - 1]). Every list whose offsets a lane reads is checked (GraphGuard), and an edge is
// visited only when it lies in its vertex's list and that list is sound; edges that lie in no
// list (before indptr[0] or from indptr[n] on) are not visited. Callers that must see every
// vertex's offsets checked pair the sweep with a pass that reads them all.
template <typename T, typename Skip, typename Visit>
__device__ __forceinline__ void sweep_edge_slices(int64_t n, const int64_t* __restrict__ indptr,
                                                  const T* __restrict__ src, int64_t begin, int64_t end,
                                                  const GraphGuard& g, Skip&& skip, Visit&& visit,
                                                  unsigned long long& edges) {
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
    int64_t v = -1, vstart = 0, vend = 0;  // the lane's vertex and its list [vstart, vend)
    for (int64_t step = first; step < hi; step += kWarp) {
      __syncwarp();
      const int64_t i = step + lane;
      const bool valid = i >= lo && i < hi;
      const T u = valid ? src[i] : T(0);
      if (!valid) continue;
      const int64_t e = begin + i;
      if (v < 0 || e >= vend) {
        int hops = 0;
        while (v >= 0 && e >= vend && v + 1 < n && ++hops <= 8) {
          ++v;
          vstart = vend;
          vend = indptr[v + 1];
          if (!g.list_ok(vstart, vend)) g.report(kBadOffsets, v);
        }
        if (v < 0 || e >= vend) {
          v = vertex_of_edge(indptr, n, e);
          vstart = indptr[v];
          vend = indptr[v + 1];
          if (!g.list_ok(vstart, vend)) g.report(kBadOffsets, v);
        }
      }
      if (e < vstart || e >= vend || !g.list_ok(vstart, vend) || !g.id(u, e)) continue;
      if (!skip(v)) visit(v, static_cast<int64_t>(u));
    }
  }
}

template <int kVariant, typename T, typename Skip, typename Visit>
__device__ __forceinline__ void sweep_edges(int64_t n, const int64_t* __restrict__ indptr,
                                            const T* __restrict__ indices, const GraphGuard& g, Skip&& skip,
                                            Visit&& visit, unsigned long long& edges) {
  const int lane = threadIdx.x % kWarp;
  if constexpr (kVariant == kNaive) {
    for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
         v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      if (skip(v)) continue;
      int64_t start = indptr[v], end = indptr[v + 1];
      g.list(v, start, end);
      edges += end - start;
      for (int64_t e = start; e < end; ++e) {
        const T u = indices[e];
        if (g.id(u, e)) visit(v, static_cast<int64_t>(u));
      }
    }
  } else if constexpr (kVariant == kMerged || kVariant == kAligned) {
    const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
    for (int64_t v = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp; v < n; v += warps) {
      // Lane 0's answer for the whole warp, so the warp-collective loop below is entered by all
      // lanes or none even if skip() reads state that changes under it.
      if (__shfl_sync(0xffffffffu, static_cast<int>(skip(v)), 0)) continue;
      int64_t start = indptr[v], end = indptr[v + 1];
      g.list(v, start, end);
      if (lane == 0) edges += end - start;
      warp_for_each<kVariant == kAligned>(indices, start, end, lane, [&](int64_t e, bool valid) {
        const T u = valid ? indices[e] : T(0);
        if (valid && g.id(u, e)) visit(v, static_cast<int64_t>(u));
      });
    }
  } else {
    sweep_edge_slices(n, indptr, indices, 0, g.m, g, skip, visit, edges);
  }
}

}  // namespace traversal
}  // namespace zerocopy
