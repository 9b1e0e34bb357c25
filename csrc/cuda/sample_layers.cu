// Neighbour sampling on the GPU: zerocopy::sample_layers (multi-layer sampling with compaction),
// zerocopy::sample_neighbors (one layer, no compaction) and zerocopy::compact_ids, built from
// one set of kernels; the same kernels sample a DynamicGraph's paged lists
// (zerocopy::dynamic_graph_sample and dynamic_graph_sample_layers, GraphView below).
//
// The graph may be GPU memory or host memory mapped for the GPU (a unified tensor reaches these
// kernels as a CUDA tensor over host-mapped bytes). Reads of a neighbour list that take the whole
// list start at the 32-element boundary below the list's start, so every warp-wide load covers
// whole 128-byte lines and no line is fetched twice over PCIe. Samples follow csrc/sampling.h:
// a uniform sample equals the CPU kernel's for the same seed.
//
// A layer of sample_layers, all on the current stream, without a host synchronisation:
//   order      the layer's seeds into visit order, by 64-bit order keys (bucket << 40 | seed
//              index) whose bucket is the top kOrderBits bits of the node id, so warps visit the
//              seeds in ascending ranges of ids (reads sweep the host-resident lists in address
//              order, which the GPU's address translation needs): a one-block counting sort for
//              up to 32 K seeds, else cub's radix sort on the bucket bits
//   sample     one warp per seed, in visit order: checks the seed, its offsets and (weighted)
//              every probability of its list; samples; checks every neighbour id read; writes
//              each sampled edge to its slot (seed i owns slots i * fanout .. + fanout) and
//              inserts the seed (code: its index) and each neighbour (code: kPending | slot)
//              into the layer's hash table, keeping the smallest code per id (atomicMin)
//   mark       one warp per seed: a slot is its id's first appearance iff the id's code is
//              kPending | slot; per seed: (edges, first appearances) and each first slot's rank
//   scan       cub's exclusive scan of the per-seed (edges, first appearances): where each seed's
//              edges and new nodes go; the totals land after the last seed
//   number     the layer's nodes: every node reached before the layer, then each new node at
//              that count + its rank (first appearance order, the CPU's order); the table then
//              holds every node's local id; also writes the next layer's order keys and the
//              layer's sizes (device memory)
// The frontier rules (sampling::Frontier). kAll: a layer's seeds are every node reached before
// it, and each layer has a table of its own, into which the sample kernel enters the seeds
// (code: their index, which is their local id). kNew: a layer's seeds are the nodes the previous
// layer numbered (a range of its nodes whose start and length live in device memory), and the
// layers share one table, so a node keeps the local id it got when first reached and is never
// numbered, nor sampled from, twice; layer 0 enters the seeds as kAll does, and a group of
// layers that starts after a fanout == -1 layer (which needs a table sized after its count)
// first enters every node reached before it.
// Every kernel reads its item count from device memory (the previous layer's sizes) and is
// launched over the upper bound (without replacement a seed gets <= fanout edges, with
// replacement exactly fanout; nodes <= nodes reached before + edges; kNew: a layer's seeds <=
// the previous layer's edges), exiting early past the count. After the last layer one kernel
// writes every layer's edges (src local id, dst: the seed's local id in the layer before, edge
// id) and the host reads every size and error word at once: the call's one synchronisation
// (sample_layers_launch leaves it to the caller). A fanout == -1 layer has no static bound: it
// first counts its edges (a count pass and a scan) and reads the total, one more
// synchronisation; its slots are then dense (seed i owns slots offsets[i] .. offsets[i+1]).
//
// Operations per call for L layers with fanouts >= 0: 1 init + per layer (order: 1 up to 32 K
// seeds, else 6 for cub's one-pass onesweep; sample, mark, 2 for cub's scan, number) + 1 edge
// writer + 1 device-to-host copy: 15 for two layers of a 1024-seed minibatch, under either
// frontier rule.
//
// Determinism: the order of first appearance is decided by the smallest slot, and slots are
// ordered by (seed index, draw), whatever order the warps run in; edges are written in (seed,
// draw) order. The results therefore equal the CPU kernels' (csrc/cpu) for uniform sampling,
// under either frontier rule.

#include "checks.h"
#include "dynamic_graph.h"
#include "dynamic_graph_checks.h"
#include "sample_neighbors_args.h"
#include "sampling.h"
#include "sampling_errors.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

namespace zerocopy {

namespace {

using namespace sampling;

constexpr int kWarp = 32;
constexpr int kThreads = 256;
constexpr unsigned kFull = 0xffffffffu;
constexpr unsigned long long kNone = ~0ull;          // an empty table entry; an unset error word
constexpr unsigned long long kPending = 1ull << 62;  // code of a node not yet numbered: kPending | first slot
constexpr int kIndexBits = 40;                        // order key: (bucket << kIndexBits) | seed index
constexpr int64_t kIndexMask = (int64_t(1) << kIndexBits) - 1;
constexpr int kOrderBits = 8;                         // visit order: 2^kOrderBits ranges of node ids
constexpr int kOrderBuckets = 1 << kOrderBits;        // bucket kOrderBuckets: padding (key -1)
constexpr int kBucketThreads = 1024;
constexpr int64_t kBucketMaxKeys = int64_t(32) << 10;  // keys one block orders (32 per thread)
constexpr int kMaxBatch = 8;                          // layers per edge-writer launch

// ---------------------------------------------------------------------------------------------
// Device helpers.

__device__ __forceinline__ int64_t thread_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t thread_count() { return int64_t(gridDim.x) * blockDim.x; }
__device__ __forceinline__ int64_t warp_index() { return thread_index() / kWarp; }
__device__ __forceinline__ int64_t warp_count() { return thread_count() / kWarp; }
__device__ __forceinline__ unsigned lanes_below(int lane) { return (1u << lane) - 1u; }

// The first element of the 32-element-aligned chunk holding `start`.
__device__ __forceinline__ int64_t chunk_base(int64_t start) { return start & ~int64_t(kWarp - 1); }

__device__ __forceinline__ int64_t warp_sum(int64_t x) {
  for (int d = kWarp / 2; d > 0; d /= 2) x += __shfl_xor_sync(kFull, x, d);
  return x;
}

__device__ __forceinline__ void report(unsigned long long* errors, int kind, int64_t where) {
  atomicMin(errors + kind, static_cast<unsigned long long>(where));
}

// A count kept in device memory, clamped to the bound the buffers were sized for (nullptr: the
// bound itself).
__device__ __forceinline__ int64_t device_count(const int64_t* count, int64_t bound) {
  if (count == nullptr) return bound;
  const int64_t c = *count;
  return c < 0 ? 0 : (c < bound ? c : bound);
}

__host__ __device__ __forceinline__ int64_t order_key(int64_t id, int64_t index, int shift) {
  const uint64_t bucket = (static_cast<uint64_t>(id) >> shift) & ((1u << kOrderBits) - 1u);
  return static_cast<int64_t>((bucket << kIndexBits) | static_cast<uint64_t>(index));
}

// ---------------------------------------------------------------------------------------------
// The hash table of a compaction: node id -> smallest code (a local id, or kPending | slot).
// Open addressing, linear probing; keys are inserted by compare-and-swap and never change.

struct IdTable {
  unsigned long long* keys;   // kNone or a node id
  unsigned long long* codes;  // kNone, a local id, or kPending | the smallest slot holding the id
  int64_t mask;               // capacity - 1 (capacity a power of two)
};

// The slot of `id` (>= 0), inserting it if absent, after lowering its code to `code`; stores
// the code it had before in *previous. -1: the table is full (never, with the capacities used).
__device__ int64_t table_insert(const IdTable& t, int64_t id, unsigned long long code,
                                unsigned long long* previous) {
  const unsigned long long key = static_cast<unsigned long long>(id);
  int64_t h = static_cast<int64_t>(mix64(key) & static_cast<uint64_t>(t.mask));
  for (int64_t probe = 0; probe <= t.mask; ++probe) {
    unsigned long long cur = *reinterpret_cast<volatile unsigned long long*>(t.keys + h);
    if (cur == kNone) cur = atomicCAS(t.keys + h, kNone, key);
    if (cur == kNone || cur == key) {
      *previous = atomicMin(t.codes + h, code);
      return h;
    }
    h = (h + 1) & t.mask;
  }
  return -1;
}

// ---------------------------------------------------------------------------------------------
// One seed: checks, then the sample (csrc/sampling.h), written to its slots.

// The lists sampled: a CSR (indptr, indices), or the paged lists of a DynamicGraph
// (csrc/dynamic_graph.h: `indices` is the page pool, vertex v's list is degree[v] entries of the
// page tree at root[v] of height height[v]; a sampled edge's id is its pool slot).
template <typename index_t>
struct GraphView {
  const int64_t* indptr;  // nullptr: paged lists
  const index_t* indices;
  int64_t num_nodes;
  int64_t num_edges;      // entries of `indices`
  const float* probs;     // by edge id; nullptr: uniform (always, for paged lists)
  const int64_t* eids;    // position -> edge id; nullptr: the position is the id
  const index_t* root = nullptr;
  const int8_t* height = nullptr;
  const int64_t* degree = nullptr;
  int page_shift = 0;
};

// The probability of the edge at position e, unchecked (visit_seed checked it).
template <typename index_t>
__device__ __forceinline__ float prob_at(const GraphView<index_t>& g, int64_t e) {
  return g.probs[g.eids ? g.eids[e] : e];
}

// Weighted with replacement: the probability of the lane's position in the chunk at c (0 outside
// the list) in *p, and the inclusive prefix sum over the chunk's lanes of the positive ones.
template <typename index_t>
__device__ __forceinline__ double chunk_prefix(const GraphView<index_t>& g, int64_t c, int64_t start, int64_t end,
                                               int lane, float* p) {
  const int64_t e = c + lane;
  *p = (e >= start && e < end) ? prob_at(g, e) : 0.0f;
  double w = *p > 0.0f ? static_cast<double>(*p) : 0.0;
  for (int d = 1; d < kWarp; d *= 2) {
    const double up = __shfl_up_sync(kFull, w, d);
    if (lane >= d) w += up;
  }
  return w;
}

struct SeedVisit {
  int64_t start;
  int64_t end;
  int64_t count;     // edges to sample; < 0: the seed failed a check (reported), nothing to sample
  int64_t root = 0;  // paged lists: the list's page tree
  int height = 0;
};

// Where list position e (start <= e < end) of the visited seed lives in g.indices.
template <typename index_t>
__device__ __forceinline__ int64_t entry_at(const GraphView<index_t>& g, const SeedVisit& sv, int64_t e) {
  return g.indptr != nullptr ? e : dyngraph::entry_slot(g.indices, sv.root, sv.height, e, g.page_shift);
}

// Checks seed v (index i) and its list, and counts its sample. Warp-cooperative: every lane
// calls it and gets the same result.
template <typename index_t>
__device__ SeedVisit visit_seed(const GraphView<index_t>& g, int64_t v, int64_t i, int64_t fanout, bool replace,
                                unsigned long long* errors, int lane) {
  if (v < 0 || v >= g.num_nodes) {
    if (lane == 0) report(errors, kBadSeed, i);
    return {0, 0, -1};
  }
  if (g.indptr == nullptr) {
    const int64_t deg = g.degree[v];
    if (deg < 0) {
      if (lane == 0) report(errors, kBadIndptr, v);
      return {0, 0, -1};
    }
    return {0, deg, sample_count(deg, fanout, replace), static_cast<int64_t>(g.root[v]), g.height[v]};
  }
  const int64_t start = g.indptr[v], end = g.indptr[v + 1];
  if (!(0 <= start && start <= end && end <= g.num_edges)) {
    if (lane == 0) report(errors, kBadIndptr, v);
    return {0, 0, -1};
  }
  int64_t positive = end - start;
  if (g.probs != nullptr) {
    int64_t mine = 0;
    bool bad = false;
    for (int64_t c = chunk_base(start); c < end; c += kWarp) {
      const int64_t e = c + lane;
      if (e < start || e >= end) continue;
      const int64_t id = g.eids ? g.eids[e] : e;
      if (id < 0 || id >= g.num_edges) {
        report(errors, kBadEdgeId, e);
        bad = true;
        continue;
      }
      const float p = g.probs[id];
      if (!valid_prob(p)) {
        report(errors, kBadProb, id);
        bad = true;
        continue;
      }
      mine += p > 0.0f ? 1 : 0;
    }
    positive = warp_sum(mine);
    if (__any_sync(kFull, bad)) return {0, 0, -1};
  }
  return {start, end, sample_count(positive, fanout, replace)};
}

// Where a seed's sampled edges go, one slot each.
template <typename index_t>
struct SlotSink {
  int64_t* pos;         // slot -> absolute list position
  int64_t* tslot;       // slot -> table slot of the neighbour (-1: none); nullptr: no compaction
  IdTable table;
  index_t* nbr;         // slot -> neighbour id (nullable)
  int64_t* seed_index;  // slot -> index of the seed (nullable)
};

template <typename index_t>
__device__ __forceinline__ void emit(const SlotSink<index_t>& out, const GraphView<index_t>& g, const SeedVisit& sv,
                                     int64_t s, int64_t e, int64_t i, unsigned long long* errors) {
  const int64_t at = entry_at(g, sv, e);
  const int64_t u = static_cast<int64_t>(g.indices[at]);
  out.pos[s] = at;
  const bool ok = u >= 0 && u < g.num_nodes;
  if (!ok) report(errors, kBadNeighbor, at);
  if (out.tslot != nullptr) {
    int64_t slot = -1;
    if (ok) {
      unsigned long long previous;
      slot = table_insert(out.table, u, kPending | static_cast<unsigned long long>(s), &previous);
      if (slot < 0) report(errors, kInternal, s);
    }
    out.tslot[s] = slot;
  }
  if (out.nbr != nullptr) out.nbr[s] = static_cast<index_t>(u);
  if (out.seed_index != nullptr) out.seed_index[s] = i;
}

// A slot that holds no edge (its seed's list changed between the count and the sample).
template <typename index_t>
__device__ __forceinline__ void emit_nothing(const SlotSink<index_t>& out, int64_t s, int64_t i) {
  out.pos[s] = -1;
  if (out.tslot != nullptr) out.tslot[s] = -1;
  if (out.nbr != nullptr) out.nbr[s] = static_cast<index_t>(-1);
  if (out.seed_index != nullptr) out.seed_index[s] = i;
}

// Samples seed v (index i; its checked list sv) into slots base .. base + sv.count.
// Warp-cooperative.
template <typename index_t>
__device__ void sample_seed(const GraphView<index_t>& g, int64_t v, int64_t i, const SeedVisit& sv, int64_t fanout,
                            bool replace, uint64_t seed, int64_t base, const SlotSink<index_t>& out,
                            unsigned long long* errors, int lane) {
  const int64_t start = sv.start, end = sv.end, deg = end - start, count = sv.count;
  int64_t* pos = out.pos + base;  // also the scratch of the sequential pickers
  const bool weighted = g.probs != nullptr;
  const bool take_all = fanout < 0 || (!replace && (weighted ? count < fanout : deg <= fanout));
  if (take_all) {
    // Every neighbour (with probs: every positive one), in list order.
    int64_t written = 0;
    for (int64_t c = chunk_base(start); c < end; c += kWarp) {
      const int64_t e = c + lane;
      const bool take = e >= start && e < end && (!weighted || prob_at(g, e) > 0.0f);
      const unsigned mask = __ballot_sync(kFull, take);
      if (take) emit(out, g, sv, base + written + __popc(mask & lanes_below(lane)), e, i, errors);
      written += __popc(mask);
    }
    return;
  }
  if (!weighted && replace) {
    for (int64_t k = lane; k < count; k += kWarp)
      emit(out, g, sv, base + k, start + below(draw(seed, v, kReplaceStream + k), deg), i, errors);
    return;
  }
  if (!weighted) {
    // Floyd's algorithm, sequential in k; the warp tests membership in parallel. The chosen
    // positions are kept in pos[0..k) until the end.
    for (int64_t k = 0; k < count; ++k) {
      const int64_t j = deg - count + k;
      const int64_t t = below(draw(seed, v, kFloydStream + k), j + 1);
      bool seen = false;
      for (int64_t q = lane; q < k; q += kWarp) seen |= pos[q] == start + t;
      seen = __any_sync(kFull, seen);
      if (lane == 0) pos[k] = start + (seen ? j : t);
      __syncwarp();
    }
  } else if (!replace) {
    // The `count` smallest Efraimidis-Spirakis keys, ascending (ties: smaller position), found
    // one at a time as the smallest (key, position) above the previous pick.
    double prev_key = -DBL_MAX;
    int64_t prev_rel = -1;
    for (int64_t k = 0; k < count; ++k) {
      double best_key = DBL_MAX;
      int64_t best_rel = LLONG_MAX;
      for (int64_t c = chunk_base(start); c < end; c += kWarp) {
        const int64_t e = c + lane;
        if (e < start || e >= end) continue;
        const float p = prob_at(g, e);
        if (!(p > 0.0f)) continue;
        const int64_t rel = e - start;
        const double key = weighted_key(seed, v, rel, p);
        const bool above = key > prev_key || (key == prev_key && rel > prev_rel);
        const bool better = key < best_key || (key == best_key && rel < best_rel);
        if (above && better) {
          best_key = key;
          best_rel = rel;
        }
      }
      for (int d = kWarp / 2; d > 0; d /= 2) {
        const double ok = __shfl_xor_sync(kFull, best_key, d);
        const int64_t orel = __shfl_xor_sync(kFull, best_rel, d);
        if (ok < best_key || (ok == best_key && orel < best_rel)) {
          best_key = ok;
          best_rel = orel;
        }
      }
      if (lane == 0) pos[k] = start + best_rel;
      prev_key = best_key;
      prev_rel = best_rel;
    }
    __syncwarp();
  } else {
    // Weighted with replacement: inverse CDF. The prefix sums are recomputed per draw in the
    // same chunk order as the total, so the search sees exactly the values the total summed.
    double total = 0.0;
    int64_t last_positive = -1;
    for (int64_t c = chunk_base(start); c < end; c += kWarp) {
      float p;
      const double w = chunk_prefix(g, c, start, end, lane, &p);
      total += __shfl_sync(kFull, w, kWarp - 1);
      const unsigned mask = __ballot_sync(kFull, p > 0.0f);
      if (mask) last_positive = c + (kWarp - 1 - __clz(mask));
    }
    for (int64_t k = 0; k < count; ++k) {
      const double target = open_unit(draw(seed, v, kReplaceStream + k)) * total;
      double running = 0.0;
      int64_t found = -1;
      for (int64_t c = chunk_base(start); c < end && found < 0; c += kWarp) {
        float p;
        const double w = chunk_prefix(g, c, start, end, lane, &p);
        const unsigned hit = __ballot_sync(kFull, p > 0.0f && running + w >= target);
        if (hit) found = c + __ffs(hit) - 1;
        running += __shfl_sync(kFull, w, kWarp - 1);
      }
      if (found < 0) found = last_positive;
      if (lane == 0) pos[k] = found;
    }
    __syncwarp();
  }
  for (int64_t k = lane; k < count; k += kWarp) emit(out, g, sv, base + k, pos[k], i, errors);
}

// ---------------------------------------------------------------------------------------------
// Kernels.

template <typename node_t, typename index_t>
struct SampleLaunch {
  GraphView<index_t> g;
  const int64_t* sorted_keys;  // visit order: order keys, ascending bucket
  const node_t* nodes;         // seed i is node nodes[first + i]
  const int64_t* first_seed;   // first (device memory); nullptr: 0
  const int64_t* num_seeds;    // seeds in use (device memory); nullptr: max_seeds
  int64_t max_seeds;
  bool seed_codes;             // with compaction: enter seed i in the table with code i (its local
                               // id); false where the seeds are in the table already
  int64_t fanout;
  bool replace;
  uint64_t seed;
  bool count_only;             // only write counts[i] (and zeros up to counts[max_seeds])
  const int64_t* base;         // dense slots: seed i owns base[i] .. + counts[i]; nullptr: padded
  int64_t* counts;             // slots used per seed: written (padded, count_only), read (dense)
  SlotSink<index_t> out;
  unsigned long long* errors;
};

// One warp per seed, in visit order (see the top of the file).
template <typename node_t, typename index_t>
__global__ void __launch_bounds__(kThreads) sample_kernel(const SampleLaunch<node_t, index_t> a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t n = device_count(a.num_seeds, a.max_seeds);
  const int64_t first = a.first_seed != nullptr ? *a.first_seed : 0;
  if (a.count_only) {
    for (int64_t t = n + thread_index(); t <= a.max_seeds; t += thread_count()) a.counts[t] = 0;
  }
  for (int64_t w = warp_index(); w < n; w += warp_count()) {
    const int64_t i = a.sorted_keys[w] & kIndexMask;
    if (i >= n) {  // the order puts the n seeds in use first
      if (lane == 0) report(a.errors, kInternal, w);
      continue;
    }
    const int64_t v = static_cast<int64_t>(a.nodes[first + i]);
    const SeedVisit sv = visit_seed(a.g, v, i, a.fanout, a.replace, a.errors, lane);
    const int64_t visited = sv.count > 0 ? sv.count : 0;
    if (a.count_only) {
      if (lane == 0) a.counts[i] = visited;
      continue;
    }
    if (a.out.tslot != nullptr && a.seed_codes && lane == 0 && v >= 0 && v < a.g.num_nodes) {
      unsigned long long previous;
      if (table_insert(a.out.table, v, static_cast<unsigned long long>(i), &previous) < 0) {
        report(a.errors, kInternal, i);
      } else if (previous < kPending && previous != static_cast<unsigned long long>(i)) {
        report(a.errors, kDuplicateSeed, i > static_cast<int64_t>(previous) ? i : static_cast<int64_t>(previous));
      }
    }
    int64_t base;
    if (a.base != nullptr) {
      base = a.base[i];
      const int64_t count = a.counts[i];
      if (visited != count) {  // the list changed since the count pass
        for (int64_t k = lane; k < count; k += kWarp) emit_nothing(a.out, base + k, i);
        if (lane == 0 && sv.count >= 0) report(a.errors, kInternal, i);
        continue;
      }
    } else {
      base = i * a.fanout;
      if (lane == 0) a.counts[i] = visited;
    }
    if (visited > 0) sample_seed(a.g, v, i, sv, a.fanout, a.replace, a.seed, base, a.out, a.errors, lane);
  }
}

// Groups of slots: a layer's seeds (group g = seed g) or fixed-width runs of positions.
struct GroupLayout {
  const int64_t* base;    // slot start of each group; nullptr: g * width
  int64_t width;
  const int64_t* counts;  // slots used per group; nullptr: min(width, total - g * width)
  int64_t total;
  __device__ int64_t start(int64_t g) const { return base != nullptr ? base[g] : g * width; }
  __device__ int64_t count(int64_t g) const {
    if (counts != nullptr) return counts[g];
    const int64_t left = total - g * width;
    return left < 0 ? 0 : (left < width ? left : width);
  }
};

struct Totals {
  int64_t edges;  // slots used
  int64_t nodes;  // first appearances
};

struct AddTotals {
  __host__ __device__ Totals operator()(const Totals& a, const Totals& b) const {
    return {a.edges + b.edges, a.nodes + b.nodes};
  }
};

// One warp per group g <= max_groups: within[s] = rank of slot s among its group's first
// appearances (-1: not one); totals[g] = (slots used, first appearances), zero past the groups
// in use, so that the exclusive scan of totals ends in the sums.
__global__ void __launch_bounds__(kThreads)
    mark_first_kernel(const GroupLayout lay, const int64_t* num_groups, int64_t max_groups, const int64_t* tslot,
                      const IdTable table, int64_t* within, Totals* totals) {
  const int lane = threadIdx.x % kWarp;
  const int64_t n = device_count(num_groups, max_groups);
  for (int64_t g = warp_index(); g <= max_groups; g += warp_count()) {
    if (g >= n) {
      if (lane == 0) totals[g] = Totals{0, 0};
      continue;
    }
    const int64_t start = lay.start(g), count = lay.count(g);
    int64_t running = 0;
    for (int64_t c = 0; c < count; c += kWarp) {
      const int64_t k = c + lane;
      bool first = false;
      if (k < count) {
        const int64_t s = start + k;
        const int64_t t = tslot[s];
        first = t >= 0 && t <= table.mask && table.codes[t] == (kPending | static_cast<unsigned long long>(s));
      }
      const unsigned mask = __ballot_sync(kFull, first);
      if (k < count) within[start + k] = first ? running + __popc(mask & lanes_below(lane)) : -1;
      running += __popc(mask);
    }
    if (lane == 0) totals[g] = Totals{count, running};
  }
}

template <typename prev_t>
struct NumberLaunch {
  GroupLayout lay;
  const int64_t* num_groups;
  int64_t max_groups;
  const int64_t* tslot;
  const int64_t* within;
  const Totals* offsets;   // exclusive scan of mark_first's totals (max_groups + 1 entries)
  IdTable table;
  const prev_t* prev;      // nodes numbered before this layer (its seeds), copied first; nullable
  const int64_t* num_prev;
  int64_t max_prev;
  int64_t* nodes;          // out: the layer's nodes
  int64_t max_nodes;
  int64_t* next_keys;      // out (nullable): order keys of the next layer's seeds, -1 past them
  int64_t max_keys;        // entries of next_keys
  bool keys_of_new;        // the next layer's seeds: the new nodes (kNew), else every node (kAll)
  int order_shift;
  int64_t* out_num_nodes;  // out (nullable): device sizes
  int64_t* out_num_edges;
  int64_t* out_num_new;    // out (nullable): the number of new nodes
};

// The layer's nodes: the previous nodes, then each first appearance at its rank; each new
// node's table code becomes its local id. The next layer's seed t is node key_base + t.
template <typename prev_t>
__global__ void __launch_bounds__(kThreads) number_kernel(const NumberLaunch<prev_t> a) {
  const int lane = threadIdx.x % kWarp;
  const int64_t n = device_count(a.num_groups, a.max_groups);
  const int64_t n_prev = device_count(a.num_prev, a.max_prev);
  const Totals total = a.offsets[a.max_groups];
  const int64_t counted = n_prev + total.nodes;
  const int64_t n_next = counted < a.max_nodes ? counted : a.max_nodes;
  const int64_t key_base = a.keys_of_new ? n_prev : 0;
  if (thread_index() == 0) {
    if (a.out_num_nodes != nullptr) *a.out_num_nodes = n_next;
    if (a.out_num_edges != nullptr) *a.out_num_edges = total.edges;
    if (a.out_num_new != nullptr) *a.out_num_new = n_next - n_prev;
  }
  for (int64_t t = thread_index(); t < a.max_nodes; t += thread_count()) {
    if (t < n_prev) {
      const int64_t id = static_cast<int64_t>(a.prev[t]);
      a.nodes[t] = id;
      if (a.next_keys != nullptr && !a.keys_of_new) a.next_keys[t] = order_key(id, t, a.order_shift);
    }
  }
  if (a.next_keys != nullptr) {
    for (int64_t t = n_next - key_base + thread_index(); t < a.max_keys; t += thread_count()) a.next_keys[t] = -1;
  }
  for (int64_t g = warp_index(); g < n; g += warp_count()) {
    const int64_t start = a.lay.start(g), count = a.lay.count(g);
    const int64_t first_node = n_prev + a.offsets[g].nodes;
    for (int64_t k = lane; k < count; k += kWarp) {
      const int64_t s = start + k;
      const int64_t rank = a.within[s];
      const int64_t t = a.tslot[s];
      const int64_t local = first_node + rank;
      if (rank < 0 || local >= n_next || t < 0 || t > a.table.mask) continue;
      const int64_t id = static_cast<int64_t>(a.table.keys[t]);
      a.nodes[local] = id;
      a.table.codes[t] = static_cast<unsigned long long>(local);
      const int64_t key = local - key_base;
      if (a.next_keys != nullptr && key < a.max_keys) a.next_keys[key] = order_key(id, key, a.order_shift);
    }
  }
}

// One layer's edges for the edge writer.
struct EdgeWrite {
  GroupLayout lay;
  const int64_t* num_groups;
  int64_t max_groups;
  const int64_t* tslot;
  const int64_t* pos;
  const Totals* offsets;
  IdTable table;
  int64_t skip;           // edges (in slot order) below this index are not written
  int64_t max_edges;      // capacity of the outputs
  int64_t* src;           // local id of the neighbour (-1: none, after a reported error)
  int64_t* dst;           // local id of the seed, *dst_base + its index (nullable)
  const int64_t* dst_base;  // device memory; nullptr: 0
  int64_t* edge_ids;      // eids[position], or the position (nullable)
  const int64_t* eids;    // nullable; values checked against [0, num_positions)
  int64_t num_positions;  // len(eids): the number of edges
  unsigned long long* errors;
};

struct EdgeWriteBatch {
  EdgeWrite layer[kMaxBatch];
};

// blockIdx.y: the layer; one warp per group.
__global__ void __launch_bounds__(kThreads) write_edges_kernel(const EdgeWriteBatch batch) {
  const EdgeWrite& w = batch.layer[blockIdx.y];
  const int lane = threadIdx.x % kWarp;
  const int64_t n = device_count(w.num_groups, w.max_groups);
  const int64_t dst_base = w.dst_base != nullptr ? *w.dst_base : 0;
  for (int64_t g = warp_index(); g < n; g += warp_count()) {
    const int64_t start = w.lay.start(g), count = w.lay.count(g);
    const int64_t first_edge = w.offsets[g].edges - w.skip;
    for (int64_t k = lane; k < count; k += kWarp) {
      const int64_t e = first_edge + k;
      if (e < 0 || e >= w.max_edges) continue;
      const int64_t s = start + k;
      const int64_t t = w.tslot[s];
      int64_t local = -1;
      if (t >= 0 && t <= w.table.mask) {
        const unsigned long long code = w.table.codes[t];
        if (code < kPending) local = static_cast<int64_t>(code);
      }
      w.src[e] = local;
      if (w.dst != nullptr) w.dst[e] = dst_base + g;
      if (w.edge_ids != nullptr) {
        const int64_t p = w.pos[s];
        int64_t id = p;
        if (w.eids != nullptr && p >= 0 && p < w.num_positions) {
          id = w.eids[p];
          if (id < 0 || id >= w.num_positions) report(w.errors, kBadEdgeId, p);
        }
        w.edge_ids[e] = id;
      }
    }
  }
}

// Orders up to kBucketMaxKeys order keys by bucket in one block: a counting sort on the bucket
// (the padding, key -1, in a last bucket of its own), unstable within a bucket. Same contract as
// the radix sort: the keys in use first, in ascending buckets.
__global__ void __launch_bounds__(kBucketThreads) bucket_order_kernel(const int64_t* keys, int64_t n, int64_t* out) {
  __shared__ int count[kOrderBuckets + 1];
  __shared__ int cursor[kOrderBuckets + 1];
  auto bucket = [](int64_t key) -> int {
    return key == -1 ? kOrderBuckets : static_cast<int>((key >> kIndexBits) & (kOrderBuckets - 1));
  };
  for (int b = threadIdx.x; b <= kOrderBuckets; b += blockDim.x) count[b] = 0;
  __syncthreads();
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) atomicAdd(&count[bucket(keys[t])], 1);
  __syncthreads();
  if (threadIdx.x < kWarp) {  // exclusive scan of the counts: each lane sums a run of buckets
    constexpr int kRun = (kOrderBuckets + 1 + kWarp - 1) / kWarp;
    const int lane = threadIdx.x;
    int sum = 0;
    for (int b = lane * kRun; b < (lane + 1) * kRun && b <= kOrderBuckets; ++b) sum += count[b];
    int before = sum;
    for (int d = 1; d < kWarp; d *= 2) {
      const int up = __shfl_up_sync(kFull, before, d);
      if (lane >= d) before += up;
    }
    before -= sum;
    for (int b = lane * kRun; b < (lane + 1) * kRun && b <= kOrderBuckets; ++b) {
      cursor[b] = before;
      before += count[b];
    }
  }
  __syncthreads();
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
    const int64_t key = keys[t];
    out[atomicAdd(&cursor[bucket(key)], 1)] = key;
  }
}

struct Fill {
  int64_t* ptr;  // filled with -1 (all ones: kNone)
  int64_t n;
};

// Clears tables and error words; writes the order keys of the first seeds and their count.
template <typename seed_t>
__global__ void __launch_bounds__(kThreads)
    init_kernel(const Fill a, const Fill b, const seed_t* seeds, int64_t num_seeds, int order_shift,
                int64_t* keys, int64_t* num_seeds_out) {
  for (int64_t t = thread_index(); t < a.n; t += thread_count()) a.ptr[t] = -1;
  for (int64_t t = thread_index(); t < b.n; t += thread_count()) b.ptr[t] = -1;
  if (keys != nullptr) {
    for (int64_t t = thread_index(); t < num_seeds; t += thread_count())
      keys[t] = order_key(static_cast<int64_t>(seeds[t]), t, order_shift);
  }
  if (thread_index() == 0 && num_seeds_out != nullptr) *num_seeds_out = num_seeds;
}

// compact_ids: every position of cat(seeds, neighbors) into the table, code kPending | position.
template <typename seed_t, typename nbr_t>
__global__ void __launch_bounds__(kThreads)
    insert_positions_kernel(const seed_t* seeds, int64_t ns, const nbr_t* nbrs, int64_t total, const IdTable table,
                            int64_t* tslot, unsigned long long* errors) {
  for (int64_t p = thread_index(); p < total; p += thread_count()) {
    const int64_t id = p < ns ? static_cast<int64_t>(seeds[p]) : static_cast<int64_t>(nbrs[p - ns]);
    int64_t slot = -1;
    if (id < 0) {
      report(errors, kBadSeed, p);
    } else {
      unsigned long long previous;
      slot = table_insert(table, id, kPending | static_cast<unsigned long long>(p), &previous);
      if (slot < 0) report(errors, kInternal, p);
    }
    tslot[p] = slot;
  }
}

// The table of a group of kNew layers that starts after layer 0: every node reached before the
// group, nodes[0 .. *count), with its local id as code (a bad seed, which layer 0 reported, is
// left out as layer 0 left it out).
__global__ void __launch_bounds__(kThreads)
    insert_known_kernel(const int64_t* nodes, const int64_t* count, int64_t max_count, int64_t num_nodes,
                        const IdTable table, unsigned long long* errors) {
  const int64_t n = device_count(count, max_count);
  for (int64_t t = thread_index(); t < n; t += thread_count()) {
    const int64_t id = nodes[t];
    if (id < 0 || id >= num_nodes) continue;
    unsigned long long previous;
    if (table_insert(table, id, static_cast<unsigned long long>(t), &previous) < 0) report(errors, kInternal, t);
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

unsigned blocks_for_threads(int64_t threads) {
  const int64_t want = (threads + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(1) << 20)));
}

unsigned blocks_for_warps(int64_t warps) { return blocks_for_threads(warps * kWarp); }

// Shift that maps node ids in [0, num_nodes) to kOrderBits-bit buckets.
int order_shift(int64_t num_nodes) {
  int bits = 0;
  while (bits < 62 && (int64_t(1) << bits) < num_nodes) ++bits;
  return std::max(0, bits - kOrderBits);
}

// A power-of-two capacity at least twice `keys` (load <= 1/2).
int64_t table_capacity(int64_t keys) {
  int64_t cap = 64;
  while (cap < 2 * keys) cap <<= 1;
  return cap;
}

IdTable table_in(const at::Tensor& words, int64_t offset, int64_t capacity) {
  auto* base = reinterpret_cast<unsigned long long*>(words.data_ptr<int64_t>()) + offset;
  return IdTable{base, base + capacity, capacity - 1};
}

// The visit order: `keys` (n order keys, padding -1 last) sorted by bucket. One block for a
// layer of up to kBucketMaxKeys seeds, else cub's radix sort on the bucket bits (stable, so the
// padding, whose bucket bits are all ones, stays after every key in use).
at::Tensor sort_order_keys(const at::Tensor& keys, int64_t n, cudaStream_t stream) {
  at::Tensor sorted = at::empty_like(keys);
  if (n == 0) return sorted;
  if (n <= kBucketMaxKeys) {
    bucket_order_kernel<<<1, kBucketThreads, 0, stream>>>(keys.data_ptr<int64_t>(), n, sorted.data_ptr<int64_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return sorted;
  }
  TORCH_CHECK(n <= std::numeric_limits<int>::max(), "sample_layers: too many seeds in one layer (", n, ")");
  const auto* in = reinterpret_cast<const unsigned long long*>(keys.data_ptr<int64_t>());
  auto* out = reinterpret_cast<unsigned long long*>(sorted.data_ptr<int64_t>());
  size_t bytes = 0;
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, bytes, in, out, static_cast<int>(n), kIndexBits,
                                                kIndexBits + kOrderBits, stream));
  at::Tensor temp = at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, keys.options().dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(temp.data_ptr(), bytes, in, out, static_cast<int>(n), kIndexBits,
                                                kIndexBits + kOrderBits, stream));
  return sorted;
}

// Exclusive scan of n Totals.
void scan_totals(const Totals* in, Totals* out, int64_t n, const at::TensorOptions& opts, cudaStream_t stream) {
  TORCH_CHECK(n <= std::numeric_limits<int>::max(), "sample_layers: too many groups in one layer (", n, ")");
  size_t bytes = 0;
  C10_CUDA_CHECK(cub::DeviceScan::ExclusiveScan(nullptr, bytes, in, out, AddTotals{}, Totals{0, 0},
                                                static_cast<int>(n), stream));
  at::Tensor temp = at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, opts.dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceScan::ExclusiveScan(temp.data_ptr(), bytes, in, out, AddTotals{}, Totals{0, 0},
                                                static_cast<int>(n), stream));
}

// Exclusive sum of n int64 counts.
void scan_counts(const int64_t* in, int64_t* out, int64_t n, const at::TensorOptions& opts, cudaStream_t stream) {
  TORCH_CHECK(n <= std::numeric_limits<int>::max(), "sample_layers: too many seeds in one layer (", n, ")");
  size_t bytes = 0;
  C10_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, in, out, static_cast<int>(n), stream));
  at::Tensor temp = at::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, opts.dtype(at::kByte));
  C10_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.data_ptr(), bytes, in, out, static_cast<int>(n), stream));
}

// Reads `n` int64 from device memory: a host synchronisation.
void read_device(int64_t* host, const int64_t* device, int64_t n, cudaStream_t stream) {
  c10::cuda::memcpy_and_sync(host, const_cast<int64_t*>(device), n * static_cast<int64_t>(sizeof(int64_t)),
                             cudaMemcpyDeviceToHost, stream);
}

Totals* as_totals(const at::Tensor& t) { return reinterpret_cast<Totals*>(t.data_ptr<int64_t>()); }

// Saturating product for upper bounds; refuses a sample too large to describe.
int64_t bound_product(int64_t seeds, int64_t fanout) {
  TORCH_CHECK_VALUE(fanout == 0 || seeds <= std::numeric_limits<int64_t>::max() / fanout,
                    "sample_layers: ", seeds, " seeds with fanout ", fanout, " exceed any memory");
  return seeds * fanout;
}

// ---------------------------------------------------------------------------------------------
// sample_layers.

// The buffers of one layer.
struct LayerState {
  int64_t fanout = 0;
  bool dense = false;
  int64_t max_seeds = 0;  // bounds: seeds, edges, nodes (seeds + new neighbours)
  int64_t max_edges = 0;
  int64_t max_nodes = 0;
  int64_t capacity = 0;   // of the hash table
  IdTable table{};
  at::Tensor keys;        // order keys of the seeds (max_seeds)
  at::Tensor sorted;      // sorted order keys
  at::Tensor counts;      // slots used per seed (max_seeds + 1)
  at::Tensor base;        // dense: slot start per seed (max_seeds + 1)
  at::Tensor pos, tslot, within;    // per slot (max_edges)
  at::Tensor totals, offsets;       // per seed, Totals (2 * (max_seeds + 1))
  at::Tensor nodes;                 // out (max_nodes)
  at::Tensor src, dst, edge_ids;    // out (max_edges)
  GroupLayout layout() const {
    return GroupLayout{dense ? base.data_ptr<int64_t>() : nullptr, fanout, counts.data_ptr<int64_t>(), 0};
  }
};

struct LaunchResult {
  std::vector<at::Tensor> nodes, src, dst, edge_ids;
  at::Tensor status;
};

template <typename seed_t, typename index_t>
class LayerSampler {
 public:
  // `g` and `seeds` (on g's device) must stay alive and unchanged until the work is done.
  LayerSampler(const GraphView<index_t>& g, const at::Tensor& seeds, c10::IntArrayRef fanouts, bool replace,
               uint64_t seed, Frontier frontier)
      : seeds_(seeds),
        fanouts_(fanouts.vec()),
        replace_(replace),
        seed_(seed),
        frontier_(frontier),
        num_layers_(static_cast<int64_t>(fanouts.size())),
        opts_(seeds.options().dtype(at::kLong)),
        stream_(c10::cuda::getCurrentCUDAStream()),
        shift_(order_shift(g.num_nodes)),
        eids_(g.eids),
        g_(g),
        node_cap_(seeds.numel() + g.num_nodes) {}

  LaunchResult run() {
    const int64_t L = num_layers_;
    status_ = at::empty({2 * L + 1 + kNumSampleErrors}, opts_);
    if (frontier_ == Frontier::kNew) new_counts_ = at::empty({L}, opts_);
    layers_.resize(static_cast<size_t>(L));
    layers_[0].max_seeds = seeds_.numel();
    layers_[0].keys = at::empty({seeds_.numel()}, opts_);
    int64_t l = 0;
    while (l < L) {
      LayerState& first = layers_[static_cast<size_t>(l)];
      first.fanout = fanouts_[static_cast<size_t>(l)];
      first.dense = first.fanout < 0;
      if (first.dense) {
        if (!initialised_) initialise(nullptr, 0);
        count_dense(l);
      }
      // Bounds and hash tables of the layers up to the next fanout == -1 layer: one table per
      // layer (kAll), or one for the whole group (kNew: a node is numbered once, whatever layer
      // reaches it again).
      int64_t m = l + 1;
      while (m < L && fanouts_[static_cast<size_t>(m)] >= 0) ++m;
      const bool shared = frontier_ == Frontier::kNew;
      int64_t words = 0;
      for (int64_t j = l; j < m; ++j) {
        LayerState& y = layers_[static_cast<size_t>(j)];
        y.fanout = fanouts_[static_cast<size_t>(j)];
        y.dense = y.fanout < 0;
        if (j > l) y.max_seeds = next_max_seeds(layers_[static_cast<size_t>(j - 1)]);
        if (!y.dense) y.max_edges = bound_product(y.max_seeds, y.fanout);
        const int64_t before = j == 0 ? seeds_.numel() : layers_[static_cast<size_t>(j - 1)].max_nodes;
        y.max_nodes = std::min(before + std::min(y.max_edges, node_cap_), node_cap_);
        y.capacity = table_capacity(y.max_nodes);
        if (!shared) words += 2 * y.capacity;
      }
      if (shared) words = 2 * layers_[static_cast<size_t>(m - 1)].capacity;
      at::Tensor tables = at::empty({words}, opts_);
      int64_t offset = 0;
      for (int64_t j = l; j < m; ++j) {
        LayerState& y = layers_[static_cast<size_t>(j)];
        if (shared) {
          y.capacity = layers_[static_cast<size_t>(m - 1)].capacity;
          y.table = table_in(tables, 0, y.capacity);
        } else {
          y.table = table_in(tables, offset, y.capacity);
          offset += 2 * y.capacity;
        }
      }
      tables_.push_back(tables);
      initialise(tables.data_ptr<int64_t>(), words);
      if (shared && l > 0) insert_known(l);
      for (int64_t j = l; j < m; ++j) run_layer(j);
      l = m;
    }
    write_edges();
    LaunchResult r;
    for (const LayerState& y : layers_) {
      r.nodes.push_back(y.nodes);
      r.src.push_back(y.src);
      r.dst.push_back(y.dst);
      r.edge_ids.push_back(y.edge_ids);
    }
    r.status = status_;
    return r;
  }

 private:
  int64_t* status() { return status_.data_ptr<int64_t>(); }
  unsigned long long* errors() { return reinterpret_cast<unsigned long long*>(status() + 2 * num_layers_ + 1); }

  // Layer j's seeds (its frontier) are nodes first .. first + count of with_seed_nodes(j), both
  // in device memory: with kAll, every node reached before layer j; with kNew, those first
  // reached in layer j - 1 (count written by layer j - 1's number kernel).
  bool new_frontier(int64_t j) const { return frontier_ == Frontier::kNew && j > 0; }
  int64_t* seed_count(int64_t j) { return new_frontier(j) ? new_counts_.data_ptr<int64_t>() + j : status() + j; }
  const int64_t* seed_first(int64_t j) { return new_frontier(j) ? status() + j - 1 : nullptr; }

  // Bound on the seeds of the layer after y.
  int64_t next_max_seeds(const LayerState& y) const {
    return frontier_ == Frontier::kNew ? std::min(y.max_edges, y.max_nodes) : y.max_nodes;
  }

  // kNew, a table group starting at layer j > 0: every node reached before layer j enters the
  // group's (cleared) table with its local id.
  void insert_known(int64_t j) {
    const LayerState& prev = layers_[static_cast<size_t>(j - 1)];
    insert_known_kernel<<<blocks_for_threads(std::max<int64_t>(prev.max_nodes, 1)), kThreads, 0, stream_>>>(
        prev.nodes.data_ptr<int64_t>(), status() + j, prev.max_nodes, g_.num_nodes,
        layers_[static_cast<size_t>(j)].table, errors());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // Fills `n` words at `words` with -1; the first call also clears the error words and writes
  // the first layer's order keys and status[0].
  void initialise(int64_t* words, int64_t n) {
    const bool first = !initialised_;
    const Fill a{words, n};
    const Fill b{first ? reinterpret_cast<int64_t*>(errors()) : nullptr, first ? kNumSampleErrors : 0};
    const int64_t n0 = first ? seeds_.numel() : 0;
    init_kernel<seed_t><<<blocks_for_threads(std::max({n, n0, int64_t(1)})), kThreads, 0, stream_>>>(
        a, b, seeds_.data_ptr<seed_t>(), n0, shift_, first ? layers_[0].keys.data_ptr<int64_t>() : nullptr,
        first ? status() : nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    initialised_ = true;
  }

  template <typename node_t>
  SampleLaunch<node_t, index_t> launch_args(int64_t j, const node_t* nodes) {
    LayerState& y = layers_[static_cast<size_t>(j)];
    SampleLaunch<node_t, index_t> a{};
    a.g = g_;
    a.sorted_keys = y.sorted.data_ptr<int64_t>();
    a.nodes = nodes;
    a.first_seed = seed_first(j);
    a.num_seeds = seed_count(j);
    a.max_seeds = y.max_seeds;
    a.seed_codes = !new_frontier(j);
    a.fanout = y.fanout;
    a.replace = replace_;
    a.seed = layer_seed(seed_, j);
    a.counts = y.counts.data_ptr<int64_t>();
    a.errors = errors();
    return a;
  }

  template <typename node_t>
  void launch_sample(const SampleLaunch<node_t, index_t>& a, int64_t max_seeds) {
    sample_kernel<node_t, index_t><<<blocks_for_warps(max_seeds + 1), kThreads, 0, stream_>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // Dispatches on the type of the layer's seed ids: the input seeds, or the previous nodes.
  template <typename F>
  void with_seed_nodes(int64_t j, F&& f) {
    if (j == 0) {
      f(seeds_.data_ptr<seed_t>());
    } else {
      f(static_cast<const int64_t*>(layers_[static_cast<size_t>(j - 1)].nodes.data_ptr<int64_t>()));
    }
  }

  // A fanout == -1 layer: sort, count, scan and read its edge total (a synchronisation).
  void count_dense(int64_t j) {
    LayerState& y = layers_[static_cast<size_t>(j)];
    y.sorted = sort_order_keys(y.keys, y.max_seeds, stream_);
    y.counts = at::empty({y.max_seeds + 1}, opts_);
    y.base = at::empty({y.max_seeds + 1}, opts_);
    with_seed_nodes(j, [&](auto nodes) {
      auto a = launch_args(j, nodes);
      a.count_only = true;
      launch_sample(a, y.max_seeds);
    });
    scan_counts(y.counts.data_ptr<int64_t>(), y.base.data_ptr<int64_t>(), y.max_seeds + 1, opts_, stream_);
    int64_t total = 0;
    read_device(&total, y.base.data_ptr<int64_t>() + y.max_seeds, 1, stream_);
    y.max_edges = total;
  }

  void run_layer(int64_t j) {
    LayerState& y = layers_[static_cast<size_t>(j)];
    const bool last = j + 1 == num_layers_;
    if (!y.dense) {
      y.sorted = sort_order_keys(y.keys, y.max_seeds, stream_);
      y.counts = at::empty({y.max_seeds + 1}, opts_);
    }
    y.pos = at::empty({y.max_edges}, opts_);
    y.tslot = at::empty({y.max_edges}, opts_);
    y.within = at::empty({y.max_edges}, opts_);
    y.totals = at::empty({2 * (y.max_seeds + 1)}, opts_);
    y.offsets = at::empty({2 * (y.max_seeds + 1)}, opts_);
    y.nodes = at::empty({y.max_nodes}, opts_);
    if (!last) {
      LayerState& next = layers_[static_cast<size_t>(j + 1)];
      next.max_seeds = next_max_seeds(y);
      next.keys = at::empty({next.max_seeds}, opts_);
    }

    with_seed_nodes(j, [&](auto nodes) {
      auto a = launch_args(j, nodes);
      a.base = y.dense ? y.base.data_ptr<int64_t>() : nullptr;
      a.out = SlotSink<index_t>{y.pos.data_ptr<int64_t>(), y.tslot.data_ptr<int64_t>(), y.table, nullptr, nullptr};
      launch_sample(a, y.max_seeds);
    });

    const GroupLayout lay = y.layout();
    mark_first_kernel<<<blocks_for_warps(y.max_seeds + 1), kThreads, 0, stream_>>>(
        lay, seed_count(j), y.max_seeds, y.tslot.data_ptr<int64_t>(), y.table, y.within.data_ptr<int64_t>(),
        as_totals(y.totals));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    scan_totals(as_totals(y.totals), as_totals(y.offsets), y.max_seeds + 1, opts_, stream_);

    with_seed_nodes(j, [&](auto prev) {
      using prev_t = std::remove_const_t<std::remove_pointer_t<decltype(prev)>>;
      NumberLaunch<prev_t> a{};
      a.lay = lay;
      a.num_groups = seed_count(j);
      a.max_groups = y.max_seeds;
      a.tslot = y.tslot.data_ptr<int64_t>();
      a.within = y.within.data_ptr<int64_t>();
      a.offsets = as_totals(y.offsets);
      a.table = y.table;
      a.prev = prev;
      a.num_prev = status() + j;
      a.max_prev = j == 0 ? seeds_.numel() : layers_[static_cast<size_t>(j - 1)].max_nodes;
      a.nodes = y.nodes.data_ptr<int64_t>();
      a.max_nodes = y.max_nodes;
      if (!last) {
        const LayerState& next = layers_[static_cast<size_t>(j + 1)];
        a.next_keys = next.keys.data_ptr<int64_t>();
        a.max_keys = next.max_seeds;
        a.keys_of_new = frontier_ == Frontier::kNew;
        if (frontier_ == Frontier::kNew) a.out_num_new = new_counts_.data_ptr<int64_t>() + j + 1;
      }
      a.order_shift = shift_;
      a.out_num_nodes = status() + j + 1;
      a.out_num_edges = status() + num_layers_ + 1 + j;
      const int64_t threads = std::max({y.max_nodes, (y.max_seeds + 1) * kWarp, a.max_keys});
      number_kernel<prev_t><<<blocks_for_threads(threads), kThreads, 0, stream_>>>(a);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });

    y.src = at::empty({y.max_edges}, opts_);
    y.dst = at::empty({y.max_edges}, opts_);
    y.edge_ids = at::empty({y.max_edges}, opts_);
  }

  // Every layer's edges, kMaxBatch layers per launch (blockIdx.y: the layer).
  void write_edges() {
    for (int64_t l0 = 0; l0 < num_layers_; l0 += kMaxBatch) {
      const int64_t l1 = std::min<int64_t>(num_layers_, l0 + kMaxBatch);
      EdgeWriteBatch batch{};
      int64_t max_groups = 0;
      for (int64_t j = l0; j < l1; ++j) {
        LayerState& y = layers_[static_cast<size_t>(j)];
        EdgeWrite& w = batch.layer[j - l0];
        w.lay = y.layout();
        w.num_groups = seed_count(j);
        w.max_groups = y.max_seeds;
        w.tslot = y.tslot.data_ptr<int64_t>();
        w.pos = y.pos.data_ptr<int64_t>();
        w.offsets = as_totals(y.offsets);
        w.table = y.table;
        w.skip = 0;
        w.max_edges = y.max_edges;
        w.src = y.src.data_ptr<int64_t>();
        w.dst = y.dst.data_ptr<int64_t>();
        w.dst_base = seed_first(j);
        w.edge_ids = y.edge_ids.data_ptr<int64_t>();
        w.eids = eids_;
        w.num_positions = g_.num_edges;
        w.errors = errors();
        max_groups = std::max(max_groups, y.max_seeds);
      }
      const dim3 grid(blocks_for_warps(std::max<int64_t>(max_groups, 1)), static_cast<unsigned>(l1 - l0));
      write_edges_kernel<<<grid, kThreads, 0, stream_>>>(batch);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }

  const at::Tensor& seeds_;
  std::vector<int64_t> fanouts_;
  bool replace_;
  uint64_t seed_;
  Frontier frontier_;
  int64_t num_layers_;
  at::TensorOptions opts_;
  cudaStream_t stream_;
  int shift_;
  const int64_t* eids_;
  GraphView<index_t> g_{};
  int64_t node_cap_ = 0;  // no layer has more nodes: the seeds plus every valid node id
  bool initialised_ = false;
  at::Tensor status_;
  at::Tensor new_counts_;  // kNew: new_counts_[j] = layer j's seeds, for j >= 1 (device memory)
  std::vector<LayerState> layers_;
  std::vector<at::Tensor> tables_;
};

using Layers = std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
                          std::vector<at::Tensor>>;

// The checked, contiguous inputs of one call, kept alive for the call.
struct CudaInputs {
  at::Tensor indptr, indices, seeds;
  std::optional<at::Tensor> probs, eids;
  Frontier frontier = Frontier::kAll;
  SampleInputs view() const { return SampleInputs{indptr, indices, seeds, probs, eids}; }
};

CudaInputs prepare_layers(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                          c10::IntArrayRef fanouts, const std::optional<at::Tensor>& probs,
                          const std::optional<at::Tensor>& eids, int64_t frontier) {
  const Frontier rule = check_sample_layers_args(indptr, indices, seeds, fanouts, probs, eids, frontier);
  check_device_type(indptr, c10::DeviceType::CUDA, "indptr");
  return CudaInputs{indptr.contiguous(), indices.contiguous(), seeds.contiguous(),
                    probs ? std::optional<at::Tensor>(probs->contiguous()) : std::nullopt,
                    eids ? std::optional<at::Tensor>(eids->contiguous()) : std::nullopt, rule};
}

template <typename index_t>
GraphView<index_t> csr_view(const CudaInputs& in) {
  return GraphView<index_t>{in.indptr.data_ptr<int64_t>(), in.indices.data_ptr<index_t>(), in.indptr.numel() - 1,
                            in.indices.numel(), in.probs ? in.probs->data_ptr<float>() : nullptr,
                            in.eids ? in.eids->data_ptr<int64_t>() : nullptr};
}

// Every layer, queued on the current stream (no synchronisation unless a fanout is -1).
template <typename idx_t>
LaunchResult launch_view(const GraphView<idx_t>& g, const at::Tensor& seeds, c10::IntArrayRef fanouts, bool replace,
                         int64_t seed, Frontier frontier) {
  LaunchResult out;
  AT_DISPATCH_INDEX_TYPES(seeds.scalar_type(), "sample_layers", [&] {
    out = LayerSampler<index_t, idx_t>(g, seeds, fanouts, replace, static_cast<uint64_t>(seed), frontier).run();
  });
  return out;
}

LaunchResult launch_layers(const CudaInputs& in, c10::IntArrayRef fanouts, bool replace, int64_t seed) {
  if (in.indices.scalar_type() == at::kInt) {
    return launch_view(csr_view<int32_t>(in), in.seeds, fanouts, replace, seed, in.frontier);
  }
  return launch_view(csr_view<int64_t>(in), in.seeds, fanouts, replace, seed, in.frontier);
}

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
           at::Tensor>
sample_layers_launch_cuda(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                          c10::IntArrayRef fanouts, bool replace, const std::optional<at::Tensor>& probs,
                          const std::optional<at::Tensor>& eids, int64_t seed, int64_t frontier) {
  const c10::cuda::OptionalCUDAGuard guard(indptr.device());
  const CudaInputs in = prepare_layers(indptr, indices, seeds, fanouts, probs, eids, frontier);
  LaunchResult r = launch_layers(in, fanouts, replace, seed);
  return {r.nodes, r.src, r.dst, r.edge_ids, r.status};
}

// A host copy of a launch's status: the call's one synchronisation.
at::Tensor host_status(const LaunchResult& r) {
  at::Tensor host = at::empty(r.status.sizes(), at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  read_device(host.data_ptr<int64_t>(), r.status.data_ptr<int64_t>(), r.status.numel(),
              c10::cuda::getCurrentCUDAStream());
  return host;
}

// The layers of a launch cut to their sizes (status[0 : 2L + 1], read back).
Layers narrowed(const LaunchResult& r, const std::vector<int64_t>& sizes) {
  const int64_t L = static_cast<int64_t>(r.nodes.size());
  Layers out;
  auto& [nodes, src, dst, edge_ids] = out;
  for (int64_t l = 0; l < L; ++l) {
    const int64_t n = sizes[static_cast<size_t>(l + 1)];
    const int64_t e = sizes[static_cast<size_t>(L + 1 + l)];
    nodes.push_back(r.nodes[static_cast<size_t>(l)].narrow(0, 0, n));
    src.push_back(r.src[static_cast<size_t>(l)].narrow(0, 0, e));
    dst.push_back(r.dst[static_cast<size_t>(l)].narrow(0, 0, e));
    edge_ids.push_back(r.edge_ids[static_cast<size_t>(l)].narrow(0, 0, e));
  }
  return out;
}

Layers sample_layers_cuda(const at::Tensor& indptr, const at::Tensor& indices, const at::Tensor& seeds,
                          c10::IntArrayRef fanouts, bool replace, const std::optional<at::Tensor>& probs,
                          const std::optional<at::Tensor>& eids, int64_t seed, int64_t frontier) {
  const c10::cuda::OptionalCUDAGuard guard(indptr.device());
  const CudaInputs in = prepare_layers(indptr, indices, seeds, fanouts, probs, eids, frontier);
  const LaunchResult r = launch_layers(in, fanouts, replace, seed);
  return narrowed(r, check_sample_status(host_status(r), in.view()));
}

std::vector<int64_t> sample_layers_check_cuda(const at::Tensor& status, const at::Tensor& indptr,
                                              const at::Tensor& indices, const at::Tensor& seeds,
                                              const std::optional<at::Tensor>& probs,
                                              const std::optional<at::Tensor>& eids) {
  return check_sample_status(status, SampleInputs{indptr, indices, seeds, probs, eids});
}

// ---------------------------------------------------------------------------------------------
// sample_neighbors: one layer, dense slots, no compaction; two synchronisations (the edge total,
// then the error words).

struct OneLayer {
  at::Tensor offsets, neighbors, edge_pos, seed_index;
  int64_t words[kNumSampleErrors];  // the error words, read back
};

template <typename idx_t>
OneLayer sample_one_layer(const GraphView<idx_t>& g, const at::Tensor& seeds, int64_t fanout, bool replace,
                          int64_t seed) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const int64_t n = seeds.numel();
  const auto opts = seeds.options().dtype(at::kLong);
  const int shift = order_shift(g.num_nodes);
  OneLayer r;
  at::Tensor errors = at::empty({kNumSampleErrors}, opts);
  at::Tensor keys = at::empty({n}, opts);
  at::Tensor counts = at::empty({n + 1}, opts);
  r.offsets = at::empty({n + 1}, opts);
  AT_DISPATCH_INDEX_TYPES(seeds.scalar_type(), "sample_neighbors", [&] {
    using seed_t = index_t;
    init_kernel<seed_t><<<blocks_for_threads(std::max<int64_t>(n, 1)), kThreads, 0, stream>>>(
        Fill{errors.data_ptr<int64_t>(), kNumSampleErrors}, Fill{nullptr, 0}, seeds.data_ptr<seed_t>(), n, shift,
        keys.data_ptr<int64_t>(), nullptr);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const at::Tensor sorted = sort_order_keys(keys, n, stream);
    SampleLaunch<seed_t, idx_t> a{};
    a.g = g;
    a.sorted_keys = sorted.data_ptr<int64_t>();
    a.nodes = seeds.data_ptr<seed_t>();
    a.num_seeds = nullptr;
    a.max_seeds = n;
    a.fanout = fanout;
    a.replace = replace;
    a.seed = static_cast<uint64_t>(seed);
    a.count_only = true;
    a.counts = counts.data_ptr<int64_t>();
    a.errors = reinterpret_cast<unsigned long long*>(errors.data_ptr<int64_t>());
    sample_kernel<seed_t, idx_t><<<blocks_for_warps(n + 1), kThreads, 0, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    scan_counts(counts.data_ptr<int64_t>(), r.offsets.data_ptr<int64_t>(), n + 1, opts, stream);
    int64_t total = 0;
    read_device(&total, r.offsets.data_ptr<int64_t>() + n, 1, stream);
    r.neighbors = at::empty({total}, opts.dtype(c10::CppTypeToScalarType<idx_t>::value));
    r.edge_pos = at::empty({total}, opts);
    r.seed_index = at::empty({total}, opts);
    if (total > 0) {
      a.count_only = false;
      a.base = r.offsets.data_ptr<int64_t>();
      a.out = SlotSink<idx_t>{r.edge_pos.data_ptr<int64_t>(), nullptr, IdTable{}, r.neighbors.data_ptr<idx_t>(),
                              r.seed_index.data_ptr<int64_t>()};
      sample_kernel<seed_t, idx_t><<<blocks_for_warps(n), kThreads, 0, stream>>>(a);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  read_device(r.words, errors.data_ptr<int64_t>(), kNumSampleErrors, stream);
  return r;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample_neighbors_cuda(
    const at::Tensor& indptr_in, const at::Tensor& indices_in, const at::Tensor& seeds_in, int64_t fanout,
    bool replace, const std::optional<at::Tensor>& probs_in, int64_t seed) {
  check_sample_neighbors_args(indptr_in, indices_in, seeds_in, fanout, probs_in);
  check_device_type(indptr_in, c10::DeviceType::CUDA, "indptr");
  const c10::cuda::OptionalCUDAGuard guard(indptr_in.device());
  const CudaInputs in{indptr_in.contiguous(), indices_in.contiguous(), seeds_in.contiguous(),
                      probs_in ? std::optional<at::Tensor>(probs_in->contiguous()) : std::nullopt, std::nullopt};
  const OneLayer r = in.indices.scalar_type() == at::kInt
                         ? sample_one_layer(csr_view<int32_t>(in), in.seeds, fanout, replace, seed)
                         : sample_one_layer(csr_view<int64_t>(in), in.seeds, fanout, replace, seed);
  raise_first_sample_error("sample_neighbors", r.words, in.view());
  return {r.offsets, r.neighbors, r.edge_pos, r.seed_index};
}

// ---------------------------------------------------------------------------------------------
// The same samplers over a DynamicGraph's paged lists (zerocopy::dynamic_graph_sample and
// dynamic_graph_sample_layers): samples equal those of its to_csr snapshot for the same seed,
// with pool slots as edge ids.

struct PagedInputs {
  at::Tensor pool, root, height, degree, seeds;
  int shift;
};

PagedInputs prepare_paged(const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height,
                          const at::Tensor& degree, const at::Tensor& seeds, c10::IntArrayRef fanouts,
                          int64_t page_size, const char* op) {
  const int s = dyngraph::page_shift(page_size, op);
  dyngraph::check_reader(pool, root, height, degree, s, c10::DeviceType::CUDA, op);
  TORCH_CHECK_VALUE(!fanouts.empty(), op, ": fanouts must hold at least one fanout (one per layer)");
  for (const int64_t f : fanouts) dyngraph::check_seeds(seeds, pool, f, op);
  return PagedInputs{pool.contiguous(), root.contiguous(), height.contiguous(), degree.contiguous(),
                     seeds.contiguous(), s};
}

template <typename idx_t>
GraphView<idx_t> paged_view(const PagedInputs& in) {
  GraphView<idx_t> g{nullptr, in.pool.data_ptr<idx_t>(), in.root.numel(), in.pool.numel(), nullptr, nullptr};
  g.root = in.root.data_ptr<idx_t>();
  g.height = in.height.data_ptr<int8_t>();
  g.degree = in.degree.data_ptr<int64_t>();
  g.page_shift = in.shift;
  return g;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dynamic_graph_sample_cuda(
    const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height, const at::Tensor& degree,
    const at::Tensor& seeds, int64_t fanout, bool replace, int64_t seed, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_sample";
  const c10::cuda::OptionalCUDAGuard guard(pool.device());
  const int64_t fanouts[] = {fanout};
  const PagedInputs in = prepare_paged(pool, root, height, degree, seeds, fanouts, page_size, op);
  const OneLayer r = in.pool.scalar_type() == at::kInt
                         ? sample_one_layer(paged_view<int32_t>(in), in.seeds, fanout, replace, seed)
                         : sample_one_layer(paged_view<int64_t>(in), in.seeds, fanout, replace, seed);
  raise_first_paged_sample_error(op, r.words, in.seeds, in.root.numel());
  return {r.offsets, r.neighbors, r.edge_pos, r.seed_index};
}

Layers dynamic_graph_sample_layers_cuda(const at::Tensor& pool, const at::Tensor& root, const at::Tensor& height,
                                        const at::Tensor& degree, const at::Tensor& seeds, c10::IntArrayRef fanouts,
                                        bool replace, int64_t seed, int64_t page_size) {
  constexpr const char* op = "dynamic_graph_sample_layers";
  const c10::cuda::OptionalCUDAGuard guard(pool.device());
  const PagedInputs in = prepare_paged(pool, root, height, degree, seeds, fanouts, page_size, op);
  const LaunchResult r = in.pool.scalar_type() == at::kInt
                             ? launch_view(paged_view<int32_t>(in), in.seeds, fanouts, replace, seed, Frontier::kAll)
                             : launch_view(paged_view<int64_t>(in), in.seeds, fanouts, replace, seed, Frontier::kAll);
  const at::Tensor host = host_status(r);
  const int64_t* words = host.data_ptr<int64_t>();
  const int64_t sizes = 2 * static_cast<int64_t>(fanouts.size()) + 1;
  raise_first_paged_sample_error(op, words + sizes, in.seeds, in.root.numel());
  return narrowed(r, std::vector<int64_t>(words, words + sizes));
}

// ---------------------------------------------------------------------------------------------
// compact_ids: the compaction of sample_layers over the positions of cat(seeds, neighbors),
// in runs of 32 positions; one synchronisation (the number of unique ids and the error words).

std::tuple<at::Tensor, at::Tensor> compact_ids_cuda(const at::Tensor& seeds_in, const at::Tensor& neighbors_in) {
  check_compact_ids_args(seeds_in, neighbors_in);
  check_device_type(seeds_in, c10::DeviceType::CUDA, "seeds");
  const c10::cuda::OptionalCUDAGuard guard(seeds_in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const at::Tensor seeds = seeds_in.contiguous();
  const at::Tensor neighbors = neighbors_in.contiguous();
  const auto opts = seeds.options().dtype(at::kLong);
  const int64_t ns = seeds.numel(), nn = neighbors.numel(), total = ns + nn;
  if (total == 0) return {at::empty({0}, opts), at::empty({0}, opts)};

  const int64_t capacity = table_capacity(total);
  const int64_t groups = (total + kWarp - 1) / kWarp;
  at::Tensor table_words = at::empty({2 * capacity}, opts);
  at::Tensor status = at::empty({1 + kNumSampleErrors}, opts);
  at::Tensor tslot = at::empty({total}, opts);
  at::Tensor within = at::empty({total}, opts);
  at::Tensor totals = at::empty({2 * (groups + 1)}, opts);
  at::Tensor offsets = at::empty({2 * (groups + 1)}, opts);
  at::Tensor nodes = at::empty({total}, opts);
  at::Tensor local = at::empty({nn}, opts);
  const IdTable table = table_in(table_words, 0, capacity);
  auto* errors = reinterpret_cast<unsigned long long*>(status.data_ptr<int64_t>() + 1);

  init_kernel<int64_t><<<blocks_for_threads(2 * capacity), kThreads, 0, stream>>>(
      Fill{table_words.data_ptr<int64_t>(), 2 * capacity}, Fill{status.data_ptr<int64_t>() + 1, kNumSampleErrors},
      nullptr, 0, 0, nullptr, nullptr);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  AT_DISPATCH_INDEX_TYPES(seeds.scalar_type(), "compact_ids", [&] {
    using seed_t = index_t;
    auto insert = [&](auto nbr_tag) {
      using nbr_t = decltype(nbr_tag);
      insert_positions_kernel<seed_t, nbr_t><<<blocks_for_threads(total), kThreads, 0, stream>>>(
          seeds.data_ptr<seed_t>(), ns, neighbors.data_ptr<nbr_t>(), total, table, tslot.data_ptr<int64_t>(),
          errors);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    if (neighbors.scalar_type() == at::kInt) {
      insert(int32_t{});
    } else {
      insert(int64_t{});
    }
  });
  const GroupLayout lay{nullptr, kWarp, nullptr, total};
  mark_first_kernel<<<blocks_for_warps(groups + 1), kThreads, 0, stream>>>(
      lay, nullptr, groups, tslot.data_ptr<int64_t>(), table, within.data_ptr<int64_t>(), as_totals(totals));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  scan_totals(as_totals(totals), as_totals(offsets), groups + 1, opts, stream);

  NumberLaunch<int64_t> num{};
  num.lay = lay;
  num.num_groups = nullptr;
  num.max_groups = groups;
  num.tslot = tslot.data_ptr<int64_t>();
  num.within = within.data_ptr<int64_t>();
  num.offsets = as_totals(offsets);
  num.table = table;
  num.prev = nullptr;
  num.num_prev = nullptr;
  num.max_prev = 0;
  num.nodes = nodes.data_ptr<int64_t>();
  num.max_nodes = total;
  num.next_keys = nullptr;
  num.out_num_nodes = status.data_ptr<int64_t>();
  num.out_num_edges = nullptr;
  number_kernel<int64_t><<<blocks_for_threads(std::max(total, (groups + 1) * kWarp)), kThreads, 0, stream>>>(num);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  if (nn > 0) {
    EdgeWriteBatch batch{};
    EdgeWrite& w = batch.layer[0];
    w.lay = lay;
    w.num_groups = nullptr;
    w.max_groups = groups;
    w.tslot = tslot.data_ptr<int64_t>();
    w.pos = nullptr;
    w.offsets = as_totals(offsets);
    w.table = table;
    w.skip = ns;
    w.max_edges = nn;
    w.src = local.data_ptr<int64_t>();
    write_edges_kernel<<<dim3(blocks_for_warps(groups), 1), kThreads, 0, stream>>>(batch);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  int64_t host[1 + kNumSampleErrors];
  read_device(host, status.data_ptr<int64_t>(), 1 + kNumSampleErrors, stream);
  const int64_t bad = host[1 + kBadSeed];
  if (bad >= 0) {
    const int64_t value = bad < ns ? detail::value_at(seeds, bad) : detail::value_at(neighbors, bad - ns);
    TORCH_CHECK_VALUE(false, "compact_ids: node ids must be >= 0, got ", value, " in ",
                      bad < ns ? "seeds[" : "neighbors[", bad < ns ? bad : bad - ns, "]");
  }
  TORCH_CHECK(host[1 + kInternal] < 0, "compact_ids: internal error (hash table full)");
  return {nodes.narrow(0, 0, host[0]), local};
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("sample_neighbors", sample_neighbors_cuda);
  m.impl("compact_ids", compact_ids_cuda);
  m.impl("sample_layers", sample_layers_cuda);
  m.impl("sample_layers_launch", sample_layers_launch_cuda);
  m.impl("sample_layers_check", sample_layers_check_cuda);
  m.impl("dynamic_graph_sample", dynamic_graph_sample_cuda);
  m.impl("dynamic_graph_sample_layers", dynamic_graph_sample_layers_cuda);
}

}  // namespace zerocopy
