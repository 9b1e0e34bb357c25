// The asynchronous variant (Atos, Chen et al.): one persistent kernel whose warps take vertices
// from a device-wide worklist, expand them and put the vertices they improve back, with no
// level barrier and no host round trip until the worklist is empty.
//
// Worklist. A ring of `capacity` cells (a power of two >= 2 * num_nodes), each a 32-bit
// sequence number and a vertex id, used as Vyukov's bounded MPMC queue with 64-bit tickets: a
// producer reserves ticket t from `tail` and, once the cell's sequence is t (free), writes the
// id and publishes sequence t + 1 (release); a consumer claims tickets from `head`, and only
// tickets below `tail` (compare-and-swap on head), waits for sequence t + 1 (acquire), reads the
// id and frees the cell for ticket t + capacity (release). Each op keeps a "queued" mark per
// vertex and schedules a vertex only when it sets that mark, so at most num_nodes tickets are
// reserved and unclaimed at any time; with capacity >= 2 * num_nodes a producer finds its cell
// free except in the instant between a consumer's claim and its read of the previous lap.
//
// Forward progress. A thread only ever waits on a thread that has already acted: a consumer on
// the producer that reserved its ticket (which writes next, waiting at most for a free cell), a
// producer on the consumer that claimed the cell's previous ticket (which reads next). Neither
// wait crosses a warp-collective operation, and a warp that has not started holds no ticket, so
// nothing depends on blocks that are not resident. The grid is sized from the occupancy
// calculator all the same (capped at AsyncTuning::blocks_per_sm blocks per SM), so every block is
// resident and polls.
//
// Termination. `pending` counts items reserved and not yet finished. A warp adds the items it
// will publish before publishing them (so pending cannot reach 0 while they are in flight) and
// subtracts the items it finished no earlier than that, in the same update when it can; the
// thread that brings pending to 0 sets `done`. pending == 0 means no item is queued or being expanded, and only an expansion pushes,
// so it stays 0; a warp that finds it 0 when it starts (nothing seeded, or all done) leaves at
// once. Idle warps back off with __nanosleep and leave once `done` is set. With a work
// budget (edges expanded), busy warps also add their edges to a global count every
// kBudgetCheckSteps steps and set `done` once it passes the budget, so a run stops within about
// warps * kBudgetCheckSteps * 32 edges of it; the host then finds pending > 0.
//
// Workers. Each lane owns at most one item. Lists longer than kLaneEdges are expanded by the
// whole warp (aligned, converged reads, as the aligned variant); shorter ones by their lane,
// which loads all of the list's ids (and weights) and the neighbours' current state at once, so
// a vertex of a road-like graph costs one host round trip and one round of atomics. With kCarry,
// a lane keeps the first vertex it schedules from a short list as its next item instead of
// publishing it (depth-first continuation): on a high-diameter graph the next hop then skips
// the trip through the queue; the other vertices it schedules go to lanes of the same warp that
// have no next item (as theirs), and only the rest to the worklist, so the hand-off from one row
// of a mesh to the next skips it too. It is for graphs of low degree; on graphs with a small diameter
// it runs ahead of the wave and assigns values that later improve, so callers enable it from
// the mean degree.
//
// Bad graphs. A taken vertex whose offsets are not a list of the edge array is expanded as an
// empty list, and an id outside [0, num_nodes) is neither relaxed nor scheduled; both are
// recorded in the error words (GraphGuard, traversal_common.cuh). The run is then a search of
// a smaller graph, so it ends as any other (pending reaches 0), and the host raises. The checks
// are plain compares: each lane keeps its smallest offenders in registers (GraphFaults) and
// reports them once, when it leaves the kernel, so no atomic sits between a list's loads (a short
// list's ids are all loaded before any of them is checked).
//
// An Op supplies:
//   Item   a scalar carried from begin to relax (the vertex's value, or what it pushes);
//   Edge   what is read per edge besides the neighbour id (its weight, or nothing);
//   Peek   a neighbour's current state, read before relaxing it;
//   bool begin(v, start, end, Item&)   called when v is taken: clears v's queued mark, reads
//                                      its current value; false when there is nothing to expand;
//   Edge load(e); Peek peek(u);
//   bool relax(v, u, Edge, Item, Peek) updates u; true when u must be scheduled (u's queued
//                                      mark was set by this call).
#pragma once

#include <ATen/ATen.h>

#include "env.h"
#include "traversal_common.cuh"

namespace zerocopy {
namespace traversal {

constexpr int kAsyncBlock = 128;
constexpr int kLaneEdges = 4;  // lists up to this long are expanded by one lane
constexpr int kBudgetCheckSteps = 16;  // a busy warp reads `done` (and checks its budget) this often
constexpr unsigned kFullMask = 0xffffffffu;

// Launch and scheduling choices of one run (environment variables override the defaults;
// benchmarks/results/async_tuning.md compares settings). blocks_per_sm and block_warps:
// resident blocks per SM and warps per block (at most kAsyncBlock threads); every warp claims,
// publishes and polls through the same few counters, so more warps add contention there
// sooner than they add useful loads in flight, and fewer hold fewer chains of hops at once.
// max_sleep_ns: an idle warp polls the worklist at least this often, so it bounds how long a
// published item waits for a taker (the critical path of a high-diameter graph is a chain of
// such hand-offs). carry_chain: hops a lane follows before it publishes again (kCarry).
struct AsyncTuning {
  int blocks_per_sm = 1;
  int block_warps = kAsyncBlock / kWarp;
  unsigned max_sleep_ns = 64;
  int carry_chain = 4096;
};

inline AsyncTuning async_tuning_from_env() {
  AsyncTuning t;
  t.blocks_per_sm = env_int("PYTORCH_ZEROCOPY_ASYNC_BLOCKS_PER_SM", t.blocks_per_sm, 1, 16);
  t.block_warps = env_int("PYTORCH_ZEROCOPY_ASYNC_BLOCK_WARPS", t.block_warps, 1, kAsyncBlock / kWarp);
  t.max_sleep_ns = static_cast<unsigned>(
      env_int("PYTORCH_ZEROCOPY_ASYNC_MAX_SLEEP_NS", static_cast<int>(t.max_sleep_ns), 64, 1 << 20));
  t.carry_chain = env_int("PYTORCH_ZEROCOPY_ASYNC_CARRY_CHAIN", t.carry_chain, 1, 1 << 30);
  return t;
}

// Counters, each in its own 128-byte line: [head, tail, pending, done, work] at int64 offsets
// 0, 16, 32, 48, 64.
constexpr int kCounterStride = 16;
constexpr int kCounterSlots = 5 * kCounterStride;

template <typename T>
struct AsyncQueueView {
  unsigned* seq;
  T* val;
  unsigned long long mask;  // capacity - 1
  unsigned long long capacity;
  unsigned long long* head;
  unsigned long long* tail;
  unsigned long long* pending;
  unsigned* done;
  unsigned long long* work;        // edges expanded, as the warps report them
  unsigned long long work_budget;  // edges after which the run stops (~0: no limit)
  AsyncTuning tuning;
};

// Claims up to `want` published-or-reserved tickets (lane 0 of a warp); returns how many, the
// first in `first`.
template <typename T>
__device__ __forceinline__ int async_claim(const AsyncQueueView<T>& q, int want, unsigned long long& first) {
  unsigned long long h = ld_relaxed(q.head);
  for (int tries = 0; tries < 4; ++tries) {
    const unsigned long long t = ld_relaxed(q.tail);
    if (h >= t) return 0;
    const unsigned long long k = t - h < static_cast<unsigned long long>(want) ? t - h : want;
    const unsigned long long seen = atomicCAS(q.head, h, h + k);
    if (seen == h) {
      first = h;
      return static_cast<int>(k);
    }
    h = seen;
  }
  return 0;
}

// The vertex of claimed ticket t; frees its cell for ticket t + capacity.
template <typename T>
__device__ __forceinline__ T async_take(const AsyncQueueView<T>& q, unsigned long long t) {
  const unsigned long long c = t & q.mask;
  while (ld_acquire(q.seq + c) != static_cast<unsigned>(t + 1)) __nanosleep(32);
  const T v = ld_volatile(q.val + c);
  st_release(q.seq + c, static_cast<unsigned>(t + q.capacity));
  return v;
}

// Publishes u for every lane with `push` set. Warp-collective: every lane of the warp calls it
// together. Lane 0 counts the items into `pending` before they become visible.
template <typename T>
__device__ __forceinline__ void async_push_warp(const AsyncQueueView<T>& q, bool push, T u, int lane) {
  const unsigned mask = __ballot_sync(kFullMask, push);
  if (!mask) return;
  unsigned long long base = 0;
  if (lane == 0) {
    const unsigned long long k = static_cast<unsigned long long>(__popc(mask));
    atomicAdd(q.pending, k);
    base = atomicAdd(q.tail, k);
  }
  base = __shfl_sync(kFullMask, base, 0);
  if (push) {
    const unsigned long long t = base + static_cast<unsigned long long>(__popc(mask & lanemask_lt(lane)));
    const unsigned long long c = t & q.mask;
    while (ld_acquire(q.seq + c) != static_cast<unsigned>(t)) __nanosleep(32);
    q.val[c] = u;
    st_release(q.seq + c, static_cast<unsigned>(t + 1));
  }
}

// Publishes u[j] for every lane and j with push[j] set, and retires `finished` items of the warp,
// with one update of `pending` (items counted before they become visible; the thread that
// brings it to 0 sets `done`) and one reservation of tickets. Warp-collective.
template <typename T, int K>
__device__ __forceinline__ void async_publish_warp(const AsyncQueueView<T>& q, const bool (&push)[K], const T (&u)[K],
                                                   int finished, int lane) {
  unsigned mask[K];
  int total = 0;
#pragma unroll
  for (int j = 0; j < K; ++j) {
    mask[j] = __ballot_sync(kFullMask, push[j]);
    total += __popc(mask[j]);
  }
  if (total == 0 && finished == 0) return;
  unsigned long long base = 0;
  if (lane == 0) {
    const long long delta = static_cast<long long>(total) - finished;
    if (delta != 0) {
      const unsigned long long before = atomicAdd(q.pending, static_cast<unsigned long long>(delta));
      if (before + static_cast<unsigned long long>(delta) == 0) st_release(q.done, 1u);
    }
    if (total) base = atomicAdd(q.tail, static_cast<unsigned long long>(total));
  }
  if (total == 0) return;
  base = __shfl_sync(kFullMask, base, 0);
#pragma unroll
  for (int j = 0; j < K; ++j) {
    if (push[j]) {
      const unsigned long long t = base + static_cast<unsigned long long>(__popc(mask[j] & lanemask_lt(lane)));
      const unsigned long long c = t & q.mask;
      while (ld_acquire(q.seq + c) != static_cast<unsigned>(t)) __nanosleep(32);
      q.val[c] = u[j];
      st_release(q.seq + c, static_cast<unsigned>(t + 1));
    }
    base += __popc(mask[j]);
  }
}

// Cell c starts free for ticket c.
static __global__ void async_queue_init_kernel(unsigned* seq, unsigned long long capacity) {
  for (unsigned long long c = blockIdx.x * static_cast<unsigned long long>(blockDim.x) + threadIdx.x; c < capacity;
       c += static_cast<unsigned long long>(gridDim.x) * blockDim.x) {
    seq[c] = static_cast<unsigned>(c);
  }
}

// Sum over the warp (every lane gets it).
__device__ __forceinline__ unsigned long long warp_sum(unsigned long long x) {
  for (int d = kWarp / 2; d > 0; d /= 2) x += __shfl_xor_sync(kFullMask, x, d);
  return x;
}

// The first item of a fresh ring: v, whose key becomes `key_of_v` (queued bit set).
template <typename T>
__global__ void async_seed_source_kernel(AsyncQueueView<T> q, unsigned long long* key, T v,
                                         unsigned long long key_of_v) {
  key[v] = key_of_v | 1ull;
  *q.pending = 1;
  *q.tail = 1;
  q.val[0] = v;
  q.seq[0] = 1;
}

// The persistent kernel. stats[0] += edges expanded.
template <typename T, bool kCarry, typename Op>
__global__ void __launch_bounds__(kAsyncBlock)
    async_worklist_kernel(const int64_t* __restrict__ indptr, const T* __restrict__ indices, Op op,
                          AsyncQueueView<T> q, GraphGuard g, long long* stats) {
  using Item = typename Op::Item;
  using Edge = typename Op::Edge;
  using Peek = typename Op::Peek;
  const int lane = threadIdx.x % kWarp;
  bool has = false;  // the lane owns an item
  int64_t v = 0, e = 0, end = 0;
  Item item{};
  int64_t carry = -1;  // the lane's next item, already marked queued and counted in pending
  int chain = 0;
  unsigned long long edges = 0;
  unsigned sleep_ns = 64;
  int since_check = 0;
  unsigned long long reported = 0;  // lane 0: the warp's edges already added to q.work
  GraphFaults faults;  // reported once, after the loop

  // Nothing seeded (or all done before this warp started): nothing can ever be pushed, and no
  // decrement will set `done`, so leave now.
  unsigned long long seeded = 0;
  if (lane == 0) seeded = ld_relaxed(q.pending);
  if (__shfl_sync(kFullMask, seeded, 0) == 0) return;

  // Takes vertex w as the lane's item; returns whether it finished at once (nothing to expand).
  auto start = [&](int64_t w) -> bool {
    v = w;
    e = indptr[w];
    end = indptr[w + 1];
    faults.list(g, w, e, end);
    has = op.begin(w, e, end, item) && e < end;
    return !has;
  };

  while (true) {
    int finished = 0;
    if (kCarry && !has && carry >= 0) {
      const int64_t w = carry;
      carry = -1;
      ++chain;
      finished += start(w);
    }

    const unsigned need = __ballot_sync(kFullMask, !has);
    int claimed = 0;
    if (need) {
      unsigned long long first = 0;
      if (lane == 0) claimed = async_claim(q, __popc(need), first);
      claimed = __shfl_sync(kFullMask, claimed, 0);
      first = __shfl_sync(kFullMask, first, 0);
      const int rank = __popc(need & lanemask_lt(lane));
      if (!has && rank < claimed) {
        chain = 0;
        finished += start(static_cast<int64_t>(async_take(q, first + rank)));
      }
    }

    // Long lists: the whole warp expands them, one at a time, with converged aligned reads.
    unsigned big = __ballot_sync(kFullMask, has && end - e > kLaneEdges);
    while (big) {
      const int k = __ffs(big) - 1;
      big &= big - 1;
      const int64_t bv = __shfl_sync(kFullMask, v, k);
      const int64_t bs = __shfl_sync(kFullMask, e, k);
      const int64_t be = __shfl_sync(kFullMask, end, k);
      const Item bitem = __shfl_sync(kFullMask, item, k);
      warp_for_each<true>(indices, bs, be, lane, [&](int64_t x, bool valid) {
        T u = 0;
        Edge w{};
        bool ok = false;
        if (valid) {
          u = indices[x];
          w = op.load(x);  // x is in the checked list [bs, be)
          ok = g.is_vertex(u);
          if (!ok) faults.bad_id(x);
        }
        const bool push = ok && op.relax(bv, static_cast<int64_t>(u), w, bitem, op.peek(static_cast<int64_t>(u)));
        async_push_warp(q, push, u, lane);
      });
      if (lane == 0) edges += static_cast<unsigned long long>(be - bs);
      if (lane == k) {
        has = false;
        ++finished;
      }
    }

    // Short lists: the lane loads its whole list (ids and edge data: every position below count
    // is in its checked list), then checks the ids with compares alone, loads the valid
    // neighbours' state and relaxes them. What they schedule is published at once below, with
    // the finished items.
    T u[kLaneEdges];
    bool push[kLaneEdges];
    {
      Edge w[kLaneEdges];
      Peek pk[kLaneEdges];
      bool ok[kLaneEdges];
      const int count = has ? static_cast<int>(end - e) : 0;
#pragma unroll
      for (int j = 0; j < kLaneEdges; ++j) {
        u[j] = j < count ? indices[e + j] : T(0);
        w[j] = j < count ? op.load(e + j) : Edge{};
      }
      unsigned bad = 0;  // bit j: position e + j holds an id that is not a vertex
#pragma unroll
      for (int j = 0; j < kLaneEdges; ++j) {
        ok[j] = j < count && g.is_vertex(u[j]);
        bad |= static_cast<unsigned>(j < count && !ok[j]) << j;
      }
      faults.bad_ids(e, bad);
#pragma unroll
      for (int j = 0; j < kLaneEdges; ++j) pk[j] = ok[j] ? op.peek(static_cast<int64_t>(u[j])) : Peek{};
#pragma unroll
      for (int j = 0; j < kLaneEdges; ++j) {
        push[j] = ok[j] && op.relax(v, static_cast<int64_t>(u[j]), w[j], item, pk[j]);
        if (kCarry && push[j] && carry < 0 && chain < q.tuning.carry_chain) {
          carry = static_cast<int64_t>(u[j]);
          push[j] = false;
        }
      }
      if (has) {
        edges += static_cast<unsigned long long>(count);
        has = false;
        if (carry < 0) ++finished;  // else the carried vertex continues this item's count
      }
    }
    // With kCarry, vertices scheduled beyond the carried ones go to lanes of this warp left
    // without a next item, as their carried item (counted in pending below, as a published one
    // is): a hand-off without the trip through the worklist. Only what no lane can take is
    // published.
    int handed = 0;
    if (kCarry) {
      unsigned idle = __ballot_sync(kFullMask, carry < 0);
#pragma unroll
      for (int j = 0; j < kLaneEdges; ++j) {
        unsigned pushing = __ballot_sync(kFullMask, push[j]);
        while (pushing && idle) {
          const int src = __ffs(pushing) - 1, dst = __ffs(idle) - 1;
          pushing &= pushing - 1;
          idle &= idle - 1;
          const int64_t x = __shfl_sync(kFullMask, static_cast<int64_t>(u[j]), src);
          if (lane == src) push[j] = false;
          if (lane == dst) {
            carry = x;
            chain = 0;
          }
          ++handed;
        }
      }
    }
    async_publish_warp(q, push, u, __reduce_add_sync(kFullMask, finished) - handed, lane);

    const bool busy = __any_sync(kFullMask, has || carry >= 0);
    if (!busy || (q.work_budget != ~0ull && ++since_check >= kBudgetCheckSteps)) {
      since_check = 0;
      unsigned stop = 0;
      if (q.work_budget != ~0ull) {
        const unsigned long long warp_edges = warp_sum(edges);
        if (lane == 0 && warp_edges > reported) {
          const unsigned long long total = atomicAdd(q.work, warp_edges - reported) + (warp_edges - reported);
          reported = warp_edges;
          if (total > q.work_budget) st_release(q.done, 1u);
        }
      }
      if (lane == 0) stop = ld_acquire(q.done);
      if (__shfl_sync(kFullMask, stop, 0)) break;
    }
    if (!busy) {
      if (claimed == 0) {
        __nanosleep(sleep_ns);
        sleep_ns = sleep_ns < q.tuning.max_sleep_ns ? sleep_ns * 2 : q.tuning.max_sleep_ns;
      } else {
        sleep_ns = 64;
      }
    }
  }
  faults.flush(g);
  const unsigned long long total = warp_sum(edges);
  if (lane == 0 && total) atomicAdd(reinterpret_cast<unsigned long long*>(stats), total);
}

// Host side: the ring and counters of one run, in GPU memory on the current device.
template <typename T>
struct AsyncQueue {
  at::Tensor seq, val, counters;
  AsyncQueueView<T> view{};

  AsyncQueue(int64_t num_nodes, const at::TensorOptions& index_options, cudaStream_t stream) {
    unsigned long long capacity = 1024;
    while (capacity < 2ull * static_cast<unsigned long long>(num_nodes)) capacity *= 2;
    TORCH_CHECK(capacity <= (1ull << 31), "async worklist: num_nodes must be < 2^30, got ", num_nodes);
    seq = at::empty({static_cast<int64_t>(capacity)}, index_options.dtype(at::kInt));
    val = at::empty({static_cast<int64_t>(capacity)}, index_options);
    counters = at::zeros({kCounterSlots}, index_options.dtype(at::kLong));
    auto* c = reinterpret_cast<unsigned long long*>(counters.data_ptr<int64_t>());
    view.seq = reinterpret_cast<unsigned*>(seq.data_ptr<int32_t>());
    view.val = val.data_ptr<T>();
    view.capacity = capacity;
    view.mask = capacity - 1;
    view.head = c;
    view.tail = c + kCounterStride;
    view.pending = c + 2 * kCounterStride;
    view.done = reinterpret_cast<unsigned*>(c + 3 * kCounterStride);
    view.work = c + 4 * kCounterStride;
    view.work_budget = ~0ull;
    view.tuning = async_tuning_from_env();
    async_queue_init_kernel<<<grid_blocks(1, static_cast<int64_t>(capacity)), kBlock, 0, stream>>>(view.seq,
                                                                                                capacity);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // Runs the persistent kernel until the worklist is empty or about `work_budget` edges have
  // been expanded in this run (~0: no limit); `carry` picks the depth-first continuation. A later
  // run may use the same ring after its items were seeded: tickets carry on.
  template <typename Op>
  void run(const int64_t* indptr, const T* indices, const Op& op, const GraphGuard& g, long long* stats,
           unsigned long long work_budget, bool carry, cudaStream_t stream) {
    view.work_budget = work_budget;
    C10_CUDA_CHECK(cudaMemsetAsync(view.done, 0, sizeof(unsigned), stream));
    C10_CUDA_CHECK(cudaMemsetAsync(view.work, 0, sizeof(unsigned long long), stream));
    if (carry) {
      launch(async_worklist_kernel<T, true, Op>, indptr, indices, op, g, stats, stream);
    } else {
      launch(async_worklist_kernel<T, false, Op>, indptr, indices, op, g, stats, stream);
    }
  }

  template <typename Kernel, typename Op>
  void launch(Kernel kernel, const int64_t* indptr, const T* indices, const Op& op, const GraphGuard& g,
              long long* stats, cudaStream_t stream) {
    const int threads = view.tuning.block_warps * kWarp;
    kernel<<<resident_blocks(kernel, threads, view.tuning.blocks_per_sm), threads, 0, stream>>>(indptr, indices, op,
                                                                                                view, g, stats);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // Items seeded or left over (read back: one small copy and a sync).
  int64_t pending_host() const { return counters.select(0, 2 * kCounterStride).item<int64_t>(); }
};

// Mean degree at or below which the depth-first continuation (kCarry) is used: mesh- and
// road-like graphs, whose diameter makes the chain of hops the critical path.
inline bool carry_pays(int64_t num_nodes, int64_t num_edges) { return num_edges <= 8 * num_nodes; }

// A label-correcting search from `source` (bfs, sssp) over one 64-bit key per vertex, value
// above a queued bit: the keys start at `unreached`, the source's at `source_key`, and
// make_op(keys) gives the Op that relaxes them. Returns the final keys. A bad graph (recorded
// through `g`, read back after the run: one small copy and a sync) raises, naming `op_name`.
// `work_budget` bounds the edges expanded (~0: none); running out of it is an error too.
template <typename T, typename MakeOp>
at::Tensor label_correcting(const at::Tensor& indptr, const at::Tensor& indices, int64_t source,
                            unsigned long long unreached, unsigned long long source_key, MakeOp&& make_op,
                            long long* stats, const GraphGuard& g, unsigned long long work_budget,
                            const char* op_name, cudaStream_t stream) {
  const int64_t n = indptr.numel() - 1;
  at::Tensor key = at::full({n}, static_cast<int64_t>(unreached), indptr.options());
  auto* k = reinterpret_cast<unsigned long long*>(key.data_ptr<int64_t>());
  AsyncQueue<T> queue(n, indptr.options().dtype(indices.scalar_type()), stream);
  async_seed_source_kernel<T><<<1, 1, 0, stream>>>(queue.view, k, static_cast<T>(source), source_key);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  queue.run(indptr.data_ptr<int64_t>(), indices.data_ptr<T>(), make_op(k), g, stats, work_budget,
            carry_pays(n, indices.numel()), stream);
  check_graph_errors(op_name, read_graph_errors(reinterpret_cast<const long long*>(g.errors), stream), indptr,
                     indices);
  if (work_budget != ~0ull) {
    TORCH_CHECK(queue.pending_host() == 0, op_name, ": the async variant expanded ", work_budget,
                " edges without settling; are the weights non-negative?");
  }
  return key;
}

}  // namespace traversal
}  // namespace zerocopy
