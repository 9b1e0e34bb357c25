// Breadth-first search on the GPU.
//
// Scan variants (naive, merged, aligned): the kernel of level L visits every vertex and
// expands those with depth == L (EMOGI's BFS; aligned is EMOGI's merged + aligned reads, with
// each warp taking 32 consecutive vertices at a time, as EMOGI's chunked kernel does). Frontier
// variant: the kernel of level L expands only the vertices queued by level L - 1, claiming each
// newly reached vertex with atomicCAS so it is queued exactly once; queues are pushed with one
// atomic per warp step. Queue order is arbitrary, and random-order reads of short lists from
// host memory are bound by address translation, so a level holding more than
// num_nodes / kScanDivisor vertices is expanded in id order instead (a scan of depth == L,
// decided on the device from the queue length), each tile's runs of consecutive frontier lists
// read as one range of whole lines, and its lone short lists by their own lanes together. A
// list longer than one chunk (kChunkBytes from the line it starts in) is not queued as its
// vertex but as its chunks, each a work item of the next level (chunk items, v << 32 | k for
// chunk k of v's list), and the scan passes such vertices over: a hub's list is then read by
// many warps at once, each with kLinesInFlight lines in flight, instead of a line at a time by
// one warp, which left a power-law level's tail at its longest list. The chunk queue's capacity holds the chunks of disjoint lists;
// lists that overflow it overlap, so the offsets decrease somewhere, which the op reports.
//
// Direction variant (Beamer et al., SC 2012): each level goes top-down as the frontier variant
// does, or bottom-up: every unvisited vertex reads its in-neighbour list until it meets a
// vertex of the current level, and stops there. A step of the bottom-up read is one group of
// lanes reading one aligned 64-byte block of ids (16 int32 ids, one request), so a vertex whose
// first in-neighbours include a frontier vertex costs one such block, not its whole list: that
// is how the direction variant reads less than the edge list. The choice is made on
// the device at the start of each level from counters the previous level left. Beamer's rule
// (alpha = 14, beta = 24): bottom-up when the frontier's out-edges exceed 1/kAlpha of the
// edges into unvisited vertices and the frontier holds more than 1/kBeta of the vertices. It
// counts edge checks; when the in-lists are in host memory, what a level pays for is the bytes
// it reads over the link, and on a graph of short lists Beamer's rule sends to bottom-up a
// level that reads a block for every unvisited vertex where top-down reads far fewer bytes.
// There a level goes bottom-up only if its expected bytes are at most kBytesSlack times
// top-down's (bottom_up_reads_few_bytes), the slack standing for top-down's own per-edge work
// (a check and an atomic per edge in GPU memory), which the byte counts leave out.
//
// All of these stop through the device counter described in traversal_common.cuh.
//
// Async variant: one persistent kernel over a device worklist (traversal_async.cuh). Each
// vertex's state is one 64-bit word, depth << 33 | parent << 1 | queued, improved with
// atomicCAS (so depth and parent always agree) and taken with atomicAnd (clearing "queued"
// and reading the latest depth in one step). Depths are improved out of order and corrected;
// the final words are the exact BFS depths.
//
// Device state: stats[0] counts the edges read, stats[1] is the last level known to have
// vertices (and becomes the number of levels at the end), followed by the error words of a bad
// graph (traversal_common.cuh), which come back with stats[1] once per batch of levels; the
// async variant reads them once, after its persistent kernel. Frontier queues (two of num_nodes
// ids, two of chunk_capacity chunk items: level L reads half L&1 and fills the other) and
// three-slot rings of per-level counters: level L reads slot L%3, adds to slot (L+1)%3 and
// clears slot (L+2)%3, which no kernel in flight uses.

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "traversal_async.cuh"
#include "traversal_common.cuh"

namespace zerocopy {
namespace traversal {
namespace {

constexpr long long kAlpha = 14;
constexpr long long kBeta = 24;
constexpr int kBottomUpStepBytes = 64;  // what one vertex reads per bottom-up step
constexpr double kListWasteBytes = 32;  // a top-down list read's alignment waste, about one sector
constexpr double kBytesSlack = 1.5;
constexpr int kChunkBytes = 4096;  // a top-down work item's share of a long list
constexpr int kLinesInFlight = 4;  // lines of a list a warp requests before it uses any
// Blocks per SM the level kernels (frontier, direction) are compiled for: their reads are
// latency-bound, so the compiler keeps them to the registers of this many resident blocks (with
// 64-bit ids, fewer: three would spill).
template <typename T>
constexpr int level_blocks_per_sm() {
  return sizeof(T) == 4 ? 3 : 2;
}

template <typename T>
constexpr int64_t chunk_entries() {
  return kChunkBytes / static_cast<int64_t>(sizeof(T));
}

// Chunks of the list [start, end) of `base`, counted from the 128-byte line it starts in (0 for
// an empty list): more than one makes it a long list, queued as its chunks.
template <typename T>
__device__ __forceinline__ int64_t list_chunks(const T* base, int64_t start, int64_t end) {
  if (end <= start) return 0;
  return (end - aligned_start(base, start) + chunk_entries<T>() - 1) / chunk_entries<T>();
}

// Chunk items one level can hold when the lists are disjoint: a long list has more than
// chunk_entries - (ids per line - 1) ids and at most ids / chunk_entries + 2 chunks.
template <typename T>
int64_t chunk_capacity(int64_t m) {
  const int64_t shortest_long = chunk_entries<T>() - 128 / static_cast<int64_t>(sizeof(T)) + 2;
  return m / chunk_entries<T>() + 2 * (m / shortest_long) + 2;
}

// Counters of a top-down frontier, each a three-slot ring (the file comment): the vertices
// queued, the chunk items queued, and the vertices queued as chunks (the frontier holds
// queued + chunked vertices).
struct FrontierCounts {
  long long queued[3];
  long long chunks[3];
  long long chunked[3];
};

// The queues of two levels (see the file comment) and their counters, in GPU memory.
template <typename T>
struct Frontiers {
  T* queue;                    // 2 x n vertex ids
  unsigned long long* chunks;  // 2 x capacity chunk items
  int64_t n;
  int64_t capacity;
  FrontierCounts* counts;

  __device__ __forceinline__ const T* queue_in(int64_t level) const { return queue + (level & 1) * n; }
  __device__ __forceinline__ T* queue_out(int64_t level) const { return queue + ((level + 1) & 1) * n; }
  __device__ __forceinline__ const unsigned long long* chunks_in(int64_t level) const {
    return chunks + (level & 1) * capacity;
  }
  __device__ __forceinline__ unsigned long long* chunks_out(int64_t level) const {
    return chunks + ((level + 1) & 1) * capacity;
  }

  // Clears the slot level L + 2 will fill (no kernel in flight uses it); one thread of the grid.
  __device__ __forceinline__ void clear_ahead(int64_t level) const {
    const int s = static_cast<int>((level + 2) % 3);
    counts->queued[s] = 0;
    counts->chunks[s] = 0;
    counts->chunked[s] = 0;
  }

  // Queues u, which this lane claimed for level `level` + 1 (claimed), warp-collectively: its
  // chunks when its list [start, end) (as read from indptr) is long, else u itself. A bad list
  // is queued as its vertex and reported when it is expanded.
  __device__ __forceinline__ void push(bool claimed, T u, int64_t start, int64_t end, const T* __restrict__ indices,
                                       const GraphGuard& g, int64_t level, int lane) const {
    bool as_vertex = claimed;
    if (claimed) {
      const int64_t k = g.list_ok(start, end) ? list_chunks(indices, start, end) : 0;
      if (k > 1) {
        as_vertex = false;
        push_chunks(u, k, g, level);
      }
    }
    warp_push(as_vertex, u, queue_out(level), counts->queued + static_cast<int>((level + 1) % 3), lane);
  }

  // Queues the k chunk items of u's long list, one lane for all of them (long lists are few).
  // Items beyond the capacity are not written and flag overlapping lists.
  __device__ __forceinline__ void push_chunks(T u, int64_t k, const GraphGuard& g, int64_t level) const {
    const int s = static_cast<int>((level + 1) % 3);
    const auto base = static_cast<int64_t>(
        atomicAdd(reinterpret_cast<unsigned long long*>(counts->chunks + s), static_cast<unsigned long long>(k)));
    atomicAdd(reinterpret_cast<unsigned long long*>(counts->chunked + s), 1ull);
    if (base + k > capacity) {
      g.report(kOverlappingLists, 0);
      return;
    }
    unsigned long long* out = chunks_out(level) + base;
    const unsigned long long id = static_cast<unsigned long long>(u) << 32;
    for (int64_t j = 0; j < k; ++j) out[j] = id | static_cast<unsigned long long>(j);
  }
};

// Calls step(i, u, valid) on every lane for the ids of [lo, hi), in steps of kLinesInFlight
// lines from `first` (a line boundary at or before lo): u[j] = indices[e] for e = i + j * kWarp +
// lane, valid[j] whether e lies in [lo, hi). Each lane loads its kLinesInFlight ids of a step
// together, and those of the next step before the step runs, so the warp's next lines are in
// flight while it uses the last ones. Warp-uniform trip count (step may use warp collectives).
template <typename T, typename Step>
__device__ __forceinline__ void warp_read_lines(const T* __restrict__ indices, int64_t first, int64_t lo, int64_t hi,
                                                int lane, Step&& step) {
  constexpr int64_t kStride = kWarp * kLinesInFlight;
  T u[kLinesInFlight] = {}, next[kLinesInFlight] = {};
  bool valid[kLinesInFlight];
  auto load = [&](int64_t i, T (&out)[kLinesInFlight]) {
#pragma unroll
    for (int j = 0; j < kLinesInFlight; ++j) {
      const int64_t e = i + j * kWarp + lane;
      out[j] = e >= lo && e < hi ? indices[e] : T(0);
    }
  };
  if (first < hi) load(first, u);
  for (int64_t i = first; i < hi; i += kStride) {
    __syncwarp();
    if (i + kStride < hi) load(i + kStride, next);
#pragma unroll
    for (int j = 0; j < kLinesInFlight; ++j) {
      const int64_t e = i + j * kWarp + lane;
      valid[j] = e >= lo && e < hi;
    }
    step(i, u, valid);
#pragma unroll
    for (int j = 0; j < kLinesInFlight; ++j) u[j] = next[j];
  }
}

// The lane of a scan tile whose list holds edge e, for a run of lanes [a, b] whose lists are
// consecutive in the edge list and hold e: the first lane of the run whose list ends after e.
// `end` is the lane's list end (indptr[v + 1]); lanes outside the run are keyed below or above
// every edge, so the search sees non-decreasing keys whatever their offsets hold.
// Warp-collective: every lane calls it, each with its own e.
__device__ __forceinline__ int run_lane_of(int64_t end, int a, int b, int lane, int64_t e) {
  const int64_t key = lane < a ? INT64_MIN : lane > b ? INT64_MAX : end;
  int pos = 0;
#pragma unroll
  for (int s = kWarp / 2; s > 0; s >>= 1) {
    const int64_t k = __shfl_sync(0xffffffffu, key, pos + s - 1);
    if (k <= e) pos += s;
  }
  return pos;
}

__device__ __forceinline__ bool level_has_work(const long long* top, int64_t level) {
  return *reinterpret_cast<const volatile long long*>(top) >= level;
}

template <typename T>
__global__ void bfs_init_kernel(int32_t* depth, T* pred, int64_t source) {
  depth[source] = 0;
  if (pred) pred[source] = static_cast<T>(source);
}

// Clears every slot of f's counters and queues the source for level 0; one warp.
template <typename T>
__device__ __forceinline__ void queue_source(const Frontiers<T>& f, const int64_t* __restrict__ indptr,
                                             const T* __restrict__ indices, const GraphGuard& g, int64_t source) {
  const int lane = threadIdx.x % kWarp;
  if (lane < 3) {
    f.counts->queued[lane] = 0;
    f.counts->chunks[lane] = 0;
    f.counts->chunked[lane] = 0;
  }
  __syncwarp();
  f.push(lane == 0, static_cast<T>(source), indptr[source], indptr[source + 1], indices, g, -1, lane);
}

template <typename T>
__global__ void bfs_frontier_init_kernel(const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                         int32_t* depth, T* pred, Frontiers<T> f, GraphGuard g, int64_t source) {
  if (threadIdx.x == 0) {
    depth[source] = 0;
    if (pred) pred[source] = static_cast<T>(source);
  }
  queue_source(f, indptr, indices, g, source);
}

template <typename T>
__global__ void bfs_naive_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                 int32_t* depth, T* pred, long long* stats, GraphGuard g, int64_t level) {
  if (!level_has_work(stats + 1, level)) return;
  const int32_t cur = static_cast<int32_t>(level);
  bool found = false;
  unsigned long long edges = 0;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (depth[v] != cur) continue;
    int64_t start = indptr[v], end = indptr[v + 1];
    g.list(v, start, end);
    edges += end - start;
    for (int64_t e = start; e < end; ++e) {
      const T u = indices[e];
      if (g.id(u, e) && depth[u] == -1) {
        depth[u] = cur + 1;  // racing writers all store the same value
        if (pred) pred[u] = static_cast<T>(v);
        found = true;
      }
    }
  }
  add_block_count(edges, stats);
  mark_found(found, stats + 1, level);
}

template <bool kAlign, typename T>
__global__ void bfs_warp_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                int32_t* depth, T* pred, long long* stats, GraphGuard g, int64_t level) {
  if (!level_has_work(stats + 1, level)) return;
  const int32_t cur = static_cast<int32_t>(level);
  const int lane = threadIdx.x % kWarp;
  bool found = false;
  unsigned long long edges = 0;
  warp_for_each_active(n, lane, [&](int64_t v) { return depth[v] == cur; }, [&](int64_t v) {
    int64_t start = indptr[v], end = indptr[v + 1];
    g.list(v, start, end);
    if (lane == 0) edges += end - start;
    warp_for_each<kAlign>(indices, start, end, lane, [&](int64_t e, bool valid) {
      if (!valid) return;
      const T u = indices[e];
      if (g.id(u, e) && depth[u] == -1) {
        depth[u] = cur + 1;
        if (pred) pred[u] = static_cast<T>(v);
        found = true;
      }
    });
  });
  add_block_count(edges, stats);
  mark_found(found, stats + 1, level);
}

// One top-down level: expands the frontier of level `cur` (queued vertices and chunk items of
// long lists, Frontiers), or, when it holds more than n / kScanDivisor vertices, the chunk items
// and every vertex with depth == cur and a short list in id order (exactly the queued ones), so
// that the lists are read in address order. A scan tile's frontier vertices whose lists are
// consecutive in the edge list (vertices with empty lists between them do not break a run) are
// read as one range of lines, so that short lists cost whole-line requests rather than a
// request of a sector or two each. Claims each newly reached vertex u with atomicCAS, queues it
// for the next level and calls reached(u) on the lane that claimed it. Called by every thread
// of the grid.
template <typename T, typename Reached>
__device__ __forceinline__ void bfs_top_down(int64_t n, const int64_t* __restrict__ indptr,
                                             const T* __restrict__ indices, int32_t* depth, T* pred,
                                             const Frontiers<T>& f, int32_t cur, const GraphGuard& g,
                                             unsigned long long& edges, bool& found, Reached&& reached) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const int slot = cur % 3;
  const long long queued = ld_volatile(f.counts->queued + slot);
  const long long chunks = min(ld_volatile(f.counts->chunks + slot), static_cast<long long>(f.capacity));
  const long long frontier = queued + ld_volatile(f.counts->chunked + slot);
  // Claims and queues what ids u[j] (valid[j]) reach, read at positions pos(j) of the edge
  // array from the lists of owner(j) (warp-collective). The depths of all of them and the
  // offsets of those unvisited are loaded first, then they are claimed, so a step waits for one
  // round of loads rather than one per id. Ids that are no vertex are reported only after those
  // loads: a conditional atomic between two loads keeps the second from being issued before it.
  // Called by all lanes of a warp.
  auto claim = [&](const T (&u)[kLinesInFlight], const bool (&valid)[kLinesInFlight], auto&& pos, auto&& owner) {
    bool fresh[kLinesInFlight], bad[kLinesInFlight];
    int64_t start[kLinesInFlight], end[kLinesInFlight];
#pragma unroll
    for (int j = 0; j < kLinesInFlight; ++j) bad[j] = valid[j] && !g.is_vertex(u[j]);
#pragma unroll
    for (int j = 0; j < kLinesInFlight; ++j) fresh[j] = valid[j] && !bad[j] && depth[u[j]] == -1;
#pragma unroll
    for (int j = 0; j < kLinesInFlight; ++j) {
      start[j] = fresh[j] ? indptr[u[j]] : 0;
      end[j] = fresh[j] ? indptr[u[j] + 1] : 0;
    }
#pragma unroll
    for (int j = 0; j < kLinesInFlight; ++j) {
      if (bad[j]) g.report(kBadId, pos(j));
    }
#pragma unroll
    for (int j = 0; j < kLinesInFlight; ++j) {
      const int64_t v = __any_sync(0xffffffffu, fresh[j]) ? owner(j) : 0;
      bool claimed = false;
      if (fresh[j] && atomicCAS(depth + u[j], -1, cur + 1) == -1) {
        claimed = true;
        if (pred) pred[u[j]] = static_cast<T>(v);
        reached(static_cast<int64_t>(u[j]));
      }
      f.push(claimed, u[j], start[j], end[j], indices, g, cur, lane);
      found |= claimed;
    }
  };
  // Reads ids [lo, hi) from line `first` on, claiming and queueing what they reach; owner(e) is
  // the vertex whose list holds edge e (warp-collective). Called by all lanes of a warp.
  auto read = [&](auto&& owner, int64_t first, int64_t lo, int64_t hi) {
    if (lane == 0) edges += hi - lo;
    warp_read_lines(indices, first, lo, hi, lane,
                    [&](int64_t i, const T (&u)[kLinesInFlight], const bool (&valid)[kLinesInFlight]) {
      auto pos = [&](int j) { return i + j * kWarp + lane; };
      claim(u, valid, pos, [&](int j) { return owner(pos(j)); });
    });
  };
  // Piece k of v's list (its chunk item), or the whole list for k < 0.
  auto piece = [&](int64_t v, int64_t k) {
    int64_t start = indptr[v], end = indptr[v + 1], first = 0;
    if (k < 0) {
      g.list(v, start, end);
      first = aligned_start(indices, start);
    } else {
      if (!g.list_ok(start, end) || k >= list_chunks(indices, start, end)) return;
      first = aligned_start(indices, start) + k * chunk_entries<T>();
      start = max(first, start);
      end = min(first + chunk_entries<T>(), end);
    }
    read([v](int64_t) { return v; }, first, start, end);
  };
  // The scan's tile of vertices [base, base + kWarp): its runs of frontier vertices with short
  // lists (long ones are read as their chunk items), each read as one range, but for runs of
  // one list of at most kLinesInFlight ids, which their lanes read together. A run's lists are
  // consecutive because indptr is one array: lane l's end is lane l + 1's start.
  auto tile = [&](int64_t base) {
    const int64_t v = base + lane;
    int64_t start = 0, end = 0;
    bool member = false, empty = false;
    if (v < n) {
      start = indptr[v];
      end = indptr[v + 1];
      empty = start == end && g.list_ok(start, end);  // a bad list (reported if in the frontier) breaks runs
      if (depth[v] == cur) member = g.list(v, start, end) && start < end && list_chunks(indices, start, end) <= 1;
    }
    unsigned todo = __ballot_sync(0xffffffffu, member);
    const unsigned breaks = ~(todo | __ballot_sync(0xffffffffu, empty));
    unsigned lone = 0;  // runs of one list of at most kLinesInFlight ids, read by their own lanes
    while (todo) {
      const int a = __ffs(todo) - 1;
      const unsigned after = breaks & ~((2u << a) - 1u);  // a == 31: none after
      const unsigned run = after ? todo & ((1u << (__ffs(after) - 1)) - 1u) : todo;
      const int b = 31 - __clz(run);
      todo &= ~run;
      const int64_t lo = __shfl_sync(0xffffffffu, start, a), hi = __shfl_sync(0xffffffffu, end, b);
      const int64_t first = aligned_start(indices, lo);
      if (a == b && hi - lo <= kLinesInFlight) {
        lone |= 1u << a;
      } else if (a == b) {
        read([v = base + a](int64_t) { return v; }, first, lo, hi);
      } else {
        read([&](int64_t e) { return base + run_lane_of(end, a, b, lane, e); }, first, lo, hi);
      }
    }
    // The lone short lists together, each lane reading its own: one round of requests for the
    // tile rather than one per list (a level of short lists scattered among visited vertices).
    if (lone) {
      const bool mine = (lone >> lane) & 1u;
      T u[kLinesInFlight];
      bool valid[kLinesInFlight];
#pragma unroll
      for (int j = 0; j < kLinesInFlight; ++j) {
        valid[j] = mine && start + j < end;
        u[j] = valid[j] ? indices[start + j] : T(0);
      }
      if (mine) edges += end - start;
      claim(u, valid, [&](int j) { return start + j; }, [&](int) { return v; });
    }
  };
  // One warp-strided loop over the level's items: the chunk items, then the queued vertices,
  // or the scan's tiles of kWarp ids.
  const bool scan = frontier > n / kScanDivisor;
  const int64_t vertex_items = scan ? (n + kWarp - 1) / kWarp : queued;
  const unsigned long long* items = f.chunks_in(cur);
  const T* queue = f.queue_in(cur);
  const int64_t first_warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  for (int64_t w = first_warp; w < chunks + vertex_items; w += warps) {
    if (w < chunks) {
      const unsigned long long item = items[w];
      const int64_t v = static_cast<int64_t>(item >> 32);
      if (!g.is_vertex(v)) continue;  // only where the queue overflowed (reported)
      piece(v, static_cast<int64_t>(item & 0xffffffffull));
    } else if (scan) {
      tile((w - chunks) * kWarp);
    } else {
      piece(static_cast<int64_t>(queue[w - chunks]), -1);
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlock, level_blocks_per_sm<T>())
    bfs_frontier_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices, int32_t* depth,
                        T* pred, Frontiers<T> f, long long* stats, GraphGuard g, int64_t level) {
  if (!level_has_work(stats + 1, level)) return;
  if (blockIdx.x == 0 && threadIdx.x == 0) f.clear_ahead(level);
  bool found = false;
  unsigned long long edges = 0;
  bfs_top_down(n, indptr, indices, depth, pred, f, static_cast<int32_t>(level), g, edges, found, [](int64_t) {});
  add_block_count(edges, stats);
  mark_found(found, stats + 1, level);
}

// --- direction-optimizing ----------------------------------------------------------------------

// Per-level counters of the direction variant beside its frontier's (FrontierCounts), each a
// three-slot ring (see the file comment). out_edges / in_edges: out-degree and in-degree sums of
// frontier L at slot L%3; visited / visited_in: the number and in-degree sum of the vertices
// reached at levels <= L, written at slot L%3 by level L's kernel (from slot (L-1)%3 and
// frontier L).
struct DirectionControl {
  long long out_edges[3];
  long long in_edges[3];
  long long visited[3];
  long long visited_in[3];
};

// Whether a bottom-up level reads at most kBytesSlack times the bytes of a top-down one.
// Top-down reads the frontier's lists: their ids plus about one sector of alignment waste per
// list. Bottom-up reads, per unvisited vertex, blocks until one holds a frontier vertex:
// expected 1 / (1 - (1 - p)^k) blocks for a share p of frontier ids among the lists' ids and k
// ids per block, at most the blocks of a mean unvisited list. Every thread computes the same
// answer from the same counters.
__device__ __forceinline__ bool bottom_up_reads_few_bytes(long long frontier, long long frontier_out,
                                                          long long unvisited, long long unvisited_in, long long m,
                                                          int id_bytes) {
  if (unvisited <= 0) return false;
  const double ids_per_block = static_cast<double>(kBottomUpStepBytes) / id_bytes;
  const double top_down = static_cast<double>(frontier_out) * id_bytes + kListWasteBytes * frontier;
  const double mean_list = static_cast<double>(unvisited_in) / unvisited;
  const double list_blocks = mean_list / ids_per_block + 1.0;  // + 1: a list rarely starts on a block
  const double p = m > 0 ? fmin(1.0, static_cast<double>(frontier_out) / m) : 0.0;
  const double k = fmin(mean_list, ids_per_block);
  const double miss = pow(1.0 - p, k);
  const double blocks = miss < 1.0 ? fmin(list_blocks, 1.0 / (1.0 - miss)) : list_blocks;
  return static_cast<double>(unvisited) * kBottomUpStepBytes * blocks <= kBytesSlack * top_down;
}

// The length of v's list [start, end) as read from its offsets (indptr, or in_indptr with kind
// kBadInOffsets), 0 for offsets that bound no list (reported through g): the direction rule's
// degree sums. Takes offsets already loaded, so a caller can load several lists' offsets first.
__device__ __forceinline__ int64_t checked_length(const GraphGuard& g, int64_t v, int64_t start, int64_t end,
                                                  int kind) {
  g.list(v, start, end, kind);
  return end - start;
}

// checked_length of v's list in `offsets`.
__device__ __forceinline__ int64_t checked_degree(const int64_t* __restrict__ offsets, int64_t v, const GraphGuard& g,
                                                  int kind) {
  return checked_length(g, v, offsets[v], offsets[v + 1], kind);
}

template <typename T>
__global__ void bfs_direction_init_kernel(const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                          const int64_t* __restrict__ in_indptr, int32_t* depth, T* pred,
                                          Frontiers<T> f, DirectionControl* ctl, GraphGuard g, int64_t source) {
  if (threadIdx.x == 0) {
    depth[source] = 0;
    if (pred) pred[source] = static_cast<T>(source);
    for (int k = 0; k < 3; ++k) {
      ctl->out_edges[k] = 0;
      ctl->in_edges[k] = 0;
      ctl->visited[k] = 0;
      ctl->visited_in[k] = 0;
    }
    ctl->out_edges[0] = checked_degree(indptr, source, g, kBadOffsets);
    ctl->in_edges[0] = checked_degree(in_indptr, source, g, kBadInOffsets);
  }
  queue_source(f, indptr, indices, g, source);
}

// Bottom-up level: every unvisited vertex (tiles of 32 consecutive ids per warp, one group of
// kGroup lanes per vertex) reads its in-neighbour list in aligned blocks of kGroup ids
// (kBottomUpStepBytes: two 32-byte sectors, one request) and stops at the first block holding a
// vertex of level `cur`; the first such neighbour becomes its parent. Only the group of v writes
// depth[v], so no atomics are needed.
template <typename T>
__device__ __forceinline__ void bfs_bottom_up(int64_t n, const int64_t* __restrict__ indptr,
                                              const T* __restrict__ indices, const int64_t* __restrict__ in_indptr,
                                              const T* __restrict__ in_indices, int32_t* depth, T* pred,
                                              const Frontiers<T>& f, int32_t cur, const GraphGuard& g,
                                              unsigned long long& edges, bool& found, unsigned long long& out_sum,
                                              unsigned long long& in_sum) {
  constexpr int kGroup = kBottomUpStepBytes / static_cast<int>(sizeof(T));
  constexpr unsigned kGroupMask = (1u << kGroup) - 1u;
  const int lane = threadIdx.x % kWarp;
  const int group = lane / kGroup, sub = lane % kGroup;
  const int64_t warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  for (int64_t base = warp * kWarp; base < n; base += warps * kWarp) {
    unsigned todo = __ballot_sync(0xffffffffu, base + lane < n && depth[base + lane] == -1);
    while (todo) {
      // The group-th set bit of todo is this group's vertex.
      int pick = -1;
      for (int j = 0; j < kWarp / kGroup && todo; ++j) {
        const int k = __ffs(todo) - 1;
        todo &= todo - 1;
        if (j == group) pick = k;
      }
      const int64_t v = pick >= 0 ? base + pick : -1;
      int64_t lo = 0, hi = 0, pos = 0;
      if (v >= 0) {
        lo = in_indptr[v];
        hi = in_indptr[v + 1];
        g.list(v, lo, hi, kBadInOffsets);
        pos = aligned_start_to<kBottomUpStepBytes>(in_indices, lo);
      }
      bool searching = v >= 0 && lo < hi;
      bool hit_found = false;
      T parent = 0;
      while (__any_sync(0xffffffffu, searching)) {
        __syncwarp();
        const int64_t e = pos + sub;
        const bool valid = searching && e >= lo && e < hi;
        const T u = valid ? in_indices[e] : T(0);
        if (valid) ++edges;
        const bool bad = valid && !g.is_vertex(u);
        const bool hit = valid && !bad && depth[u] == cur;
        if (bad) g.report(kBadInId, e);  // after the depth load, which it would otherwise hold back
        const unsigned mine = (__ballot_sync(0xffffffffu, hit) >> (group * kGroup)) & kGroupMask;
        const int src = mine ? group * kGroup + __ffs(mine) - 1 : lane;
        const T from = __shfl_sync(0xffffffffu, u, src);
        if (searching) {
          if (mine) {
            hit_found = true;
            parent = from;
            searching = false;
          } else {
            pos += kGroup;
            searching = pos < hi;
          }
        }
      }
      const bool push = sub == 0 && hit_found;
      int64_t start = 0, end = 0;
      if (push) {
        depth[v] = cur + 1;
        if (pred) pred[v] = parent;
        start = indptr[v];
        end = indptr[v + 1];
        out_sum += static_cast<unsigned long long>(checked_length(g, v, start, end, kBadOffsets));
        in_sum += static_cast<unsigned long long>(hi - lo);
      }
      f.push(push, static_cast<T>(push ? v : 0), start, end, indices, g, cur, lane);
      found |= push;
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kBlock, level_blocks_per_sm<T>())
    bfs_direction_kernel(int64_t n, int64_t m, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                         const int64_t* __restrict__ in_indptr, const T* __restrict__ in_indices, int32_t* depth,
                         T* pred, Frontiers<T> f, DirectionControl* ctl, long long* stats, GraphGuard g,
                         int64_t level, bool host_lists) {
  if (!level_has_work(stats + 1, level)) return;
  const int slot = static_cast<int>(level % 3), next = static_cast<int>((level + 1) % 3),
            prev = static_cast<int>((level + 2) % 3);
  const long long count_in = ld_volatile(f.counts->queued + slot) + ld_volatile(f.counts->chunked + slot);
  const long long frontier_out = ctl->out_edges[slot];
  const long long visited = ctl->visited[prev] + count_in;
  const long long visited_in = ctl->visited_in[prev] + ctl->in_edges[slot];
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    ctl->visited[slot] = visited;
    ctl->visited_in[slot] = visited_in;
    f.clear_ahead(level);
    ctl->out_edges[prev] = 0;
    ctl->in_edges[prev] = 0;
  }
  const long long unvisited_in = m - visited_in;
  const bool bottom_up = frontier_out * kAlpha > unvisited_in && count_in * kBeta > n &&
                         (!host_lists || bottom_up_reads_few_bytes(count_in, frontier_out, n - visited, unvisited_in,
                                                                   m, static_cast<int>(sizeof(T))));
  const int32_t cur = static_cast<int32_t>(level);
  bool found = false;
  unsigned long long edges = 0, out_sum = 0, in_sum = 0;
  if (bottom_up) {
    bfs_bottom_up(n, indptr, indices, in_indptr, in_indices, depth, pred, f, cur, g, edges, found,
                  out_sum, in_sum);
  } else {
    bfs_top_down(n, indptr, indices, depth, pred, f, cur, g, edges, found, [&](int64_t u) {
      // Both lists' offsets loaded before either check.
      const int64_t start = indptr[u], end = indptr[u + 1], in_start = in_indptr[u], in_end = in_indptr[u + 1];
      out_sum += static_cast<unsigned long long>(checked_length(g, u, start, end, kBadOffsets));
      in_sum += static_cast<unsigned long long>(checked_length(g, u, in_start, in_end, kBadInOffsets));
    });
  }
  add_block_count(edges, stats);
  add_block_count(out_sum, ctl->out_edges + next);
  add_block_count(in_sum, ctl->in_edges + next);
  mark_found(found, stats + 1, level);
}

// --- async ---------------------------------------------------------------------------------------

constexpr unsigned long long kUnreachedKey = ~1ull;  // depth field all ones, not queued

struct BfsAsyncOp {
  unsigned long long* key;
  using Item = int32_t;  // depth of the vertex being expanded
  struct Edge {};
  using Peek = unsigned long long;

  __device__ __forceinline__ bool begin(int64_t v, int64_t, int64_t, int32_t& d) const {
    d = static_cast<int32_t>(atomicAnd(key + v, ~1ull) >> 33);
    return true;
  }

  __device__ __forceinline__ Edge load(int64_t) const { return {}; }

  __device__ __forceinline__ Peek peek(int64_t u) const { return ld_relaxed(key + u); }

  __device__ __forceinline__ bool relax(int64_t v, int64_t u, Edge, int32_t d, unsigned long long seen) const {
    const unsigned long long nd = static_cast<unsigned long long>(d) + 1;
    const unsigned long long parent = static_cast<uint32_t>(v);
    const unsigned long long want = (nd << 33) | (parent << 1) | 1ull;
    while ((seen >> 33) > nd) {
      const unsigned long long prev = atomicCAS(key + u, seen, want);
      if (prev == seen) return (seen & 1ull) == 0;  // improved; schedule it unless already queued
      seen = prev;
    }
    return false;
  }
};

template <typename T>
__global__ void bfs_async_finalize_kernel(int64_t n, const unsigned long long* __restrict__ key, int32_t* depth,
                                          T* pred, long long* top) {
  int32_t deepest = -1;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const unsigned long long k = key[v];
    const bool reached = (k | 1ull) != ~0ull;
    const int32_t d = reached ? static_cast<int32_t>(k >> 33) : -1;
    depth[v] = d;
    if (pred) pred[v] = reached ? static_cast<T>((k >> 1) & 0xffffffffull) : static_cast<T>(-1);
    deepest = d > deepest ? d : deepest;
  }
  for (int s = kWarp / 2; s > 0; s /= 2) {
    const int32_t o = __shfl_xor_sync(0xffffffffu, deepest, s);
    deepest = o > deepest ? o : deepest;
  }
  if (threadIdx.x % kWarp == 0 && deepest >= 0) atomicMax(top, static_cast<long long>(deepest));
}

template <typename T>
void bfs_async(const at::Tensor& indptr, const at::Tensor& indices, int64_t n, int64_t source, at::Tensor& depth,
               at::Tensor& pred, at::Tensor& stats, const GraphGuard& g, cudaStream_t stream) {
  auto* st = reinterpret_cast<long long*>(stats.data_ptr<int64_t>());
  const unsigned long long source_key = static_cast<unsigned long long>(static_cast<uint32_t>(source)) << 1;
  at::Tensor key = label_correcting<T>(
      indptr, indices, source, kUnreachedKey, source_key, [](unsigned long long* k) { return BfsAsyncOp{k}; }, st,
      g, ~0ull, "bfs", stream);
  stats.select(0, 1).fill_(-1);
  bfs_async_finalize_kernel<T><<<grid_blocks(1, n), kBlock, 0, stream>>>(
      n, reinterpret_cast<const unsigned long long*>(key.data_ptr<int64_t>()), depth.data_ptr<int32_t>(),
      pred.numel() ? pred.data_ptr<T>() : nullptr, st + 1);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// --- entry ---------------------------------------------------------------------------------------

template <typename T>
void bfs_run(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor* in_indptr,
             const at::Tensor* in_indices, int64_t n, int64_t source, int64_t variant, at::Tensor& depth,
             at::Tensor& pred, at::Tensor& stats) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // stats: [edges, top, error words...] (the file comment)
  const GraphGuard g{n, indices.numel(), reinterpret_cast<unsigned long long*>(stats.data_ptr<int64_t>() + 2)};
  if (variant == kAsync) {
    bfs_async<T>(indptr, indices, n, source, depth, pred, stats, g, stream);
    return;
  }
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  int32_t* d = depth.data_ptr<int32_t>();
  T* p = pred.numel() ? pred.data_ptr<T>() : nullptr;
  auto* st = reinterpret_cast<long long*>(stats.data_ptr<int64_t>());
  const int64_t m = indices.numel();
  at::Tensor queues, chunks, counts, control;
  Frontiers<T> f{};
  DirectionControl* ctl = nullptr;
  const bool host_lists =
      variant == kDirection && in_indices->numel() > 0 && !in_device_memory(in_indices->data_ptr());
  if (variant == kFrontier || variant == kDirection) {
    f.n = n;
    f.capacity = chunk_capacity<T>(m);
    queues = at::empty({2, n}, indptr.options().dtype(indices.scalar_type()));
    chunks = at::empty({2, f.capacity}, stats.options());
    counts = at::empty({static_cast<int64_t>(sizeof(FrontierCounts) / sizeof(int64_t))}, stats.options());
    f.queue = queues.data_ptr<T>();
    f.chunks = reinterpret_cast<unsigned long long*>(chunks.data_ptr<int64_t>());
    f.counts = reinterpret_cast<FrontierCounts*>(counts.data_ptr<int64_t>());
  }
  if (variant == kFrontier) {
    bfs_frontier_init_kernel<T><<<1, kWarp, 0, stream>>>(off, col, d, p, f, g, source);
  } else if (variant == kDirection) {
    control = at::empty({static_cast<int64_t>(sizeof(DirectionControl) / sizeof(int64_t))}, stats.options());
    ctl = reinterpret_cast<DirectionControl*>(control.data_ptr<int64_t>());
    bfs_direction_init_kernel<T><<<1, kWarp, 0, stream>>>(off, col, in_indptr->data_ptr<int64_t>(), d, p, f, ctl, g,
                                                          source);
  } else {
    bfs_init_kernel<T><<<1, 1, 0, stream>>>(d, p, source);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  // The frontier and direction kernels use more registers than fit a full SM of kBlock-thread
  // blocks: their grid is what is resident at once (at most what the level needs), so a small
  // level costs one wave of blocks, not two.
  // (kWarp: more blocks per SM than any GPU holds.)
  int64_t level_blocks = grid_blocks(kWarp, n);
  if (variant == kFrontier) {
    level_blocks = std::min(level_blocks, resident_blocks(bfs_frontier_kernel<T>, kBlock, kWarp));
  } else if (variant == kDirection) {
    level_blocks = std::min(level_blocks, resident_blocks(bfs_direction_kernel<T>, kBlock, kWarp));
  }
  auto launch = [&](int64_t level) {
    switch (variant) {
      case kNaive:
        bfs_naive_kernel<T><<<grid_blocks(1, n), kBlock, 0, stream>>>(n, off, col, d, p, st, g, level);
        break;
      case kMerged:
        bfs_warp_kernel<false, T><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, d, p, st, g, level);
        break;
      case kAligned:
        bfs_warp_kernel<true, T><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, d, p, st, g, level);
        break;
      case kDirection:
        bfs_direction_kernel<T><<<level_blocks, kBlock, 0, stream>>>(
            n, m, off, col, in_indptr->data_ptr<int64_t>(), in_indices->data_ptr<T>(), d, p, f, ctl, st, g, level,
            host_lists);
        break;
      default:
        bfs_frontier_kernel<T><<<level_blocks, kBlock, 0, stream>>>(n, off, col, d, p, f, st, g, level);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  GraphErrors errors;
  run_steps(launch, st + 1, n + 1, stream, errors);
  check_graph_errors("bfs", errors, indptr, indices, in_indptr, in_indices);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bfs_cuda(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                                                       int64_t source, int64_t variant, bool predecessors,
                                                       const std::optional<at::Tensor>& in_indptr_in,
                                                       const std::optional<at::Tensor>& in_indices_in) {
  check_variant(variant, TraversalOp::kBfs);
  const int64_t n = check_cuda_csr(indptr_in, indices_in, "bfs");
  check_in_lists(variant, in_indptr_in, in_indices_in, indptr_in, indices_in);
  c10::cuda::OptionalCUDAGuard guard(indptr_in.device());
  check_source(source, n, "bfs");
  TORCH_CHECK_VALUE(n < (int64_t{1} << 31) - 1, "bfs: depths are int32, so num_nodes must be < 2^31 - 1, got ", n);
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  at::Tensor in_indptr, in_indices;
  if (in_indptr_in.has_value()) {
    in_indptr = in_indptr_in->contiguous();
    in_indices = in_indices_in->contiguous();
  }
  // Outputs and scratch on the GPU of indptr (indices may be host memory mapped for it).
  const at::TensorOptions index_options = indptr.options().dtype(indices.scalar_type());
  at::Tensor depth = at::full({n}, -1, indptr.options().dtype(at::kInt));
  at::Tensor pred = predecessors ? at::full({n}, -1, index_options) : at::empty({0}, index_options);
  at::Tensor status = counters_and_errors(2, indptr.options());
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "bfs", [&] {
    bfs_run<index_t>(indptr, indices, in_indptr.defined() ? &in_indptr : nullptr,
                     in_indices.defined() ? &in_indices : nullptr, n, source, variant, depth, pred, status);
  });
  at::Tensor stats = status.narrow(0, 0, 2).clone();
  stats.select(0, 1).add_(1);  // last level with vertices -> number of levels
  return {depth, pred, stats};
}

}  // namespace
}  // namespace traversal

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("graph_bfs", traversal::bfs_cuda);
}

}  // namespace zerocopy
