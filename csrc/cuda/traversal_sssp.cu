// Single-source shortest paths on the GPU: Bellman-Ford over the vertices whose distance
// dropped (EMOGI's SSSP), with non-negative weights.
//
// A vertex is active in step S when stamp[v] == S. Step S relaxes every edge of every active
// vertex with atomicMin on the neighbour's distance; a neighbour whose distance it lowered
// gets stamp S + 1. A vertex lowered again while step S is still running is simply stamped
// S + 1 and relaxed again in step S + 1 from its latest distance, so no flag has to be
// cleared. Scan variants test every vertex's stamp each step. The frontier variant keeps
// queues instead (a vertex is queued the first time its stamp moves to S + 1, so each step's
// queue holds it at most once) and orders the work with a near-far worklist (below): vertices
// far beyond the current distance threshold wait, so fewer lists are read again after their
// distance drops, which is what a host-resident edge list pays for.
//
// The async variant runs one persistent kernel over a device worklist (traversal_async.cuh):
// label-correcting relaxation in worklist order. Each vertex's state is one 64-bit word,
// distance << 1 | queued (the distance as an int64, or a float's bit pattern), lowered with
// atomicCAS and taken with atomicAnd, so a vertex is queued at most once at a time and its
// expansion always starts from its latest distance.
//
// Distances: float32 weights -> float32 (atomicMin on the bit pattern, which orders
// non-negative floats like integers), int32 or unit weights -> int64. Unreachable vertices keep
// the type's maximum. Termination, stats and the checks of a bad graph as in traversal_bfs.cu.
// The weights are trusted to be non-negative here (checking would cost a pass over a
// host-resident weight array per call): CSRGraph records their minimum once and the Python
// wrapper refuses negative ones.

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "traversal_async.cuh"
#include "traversal_common.cuh"

namespace zerocopy {
namespace traversal {
namespace {

__device__ __forceinline__ bool step_has_work(const long long* top, int64_t step) {
  return *reinterpret_cast<const volatile long long*>(top) >= step;
}

__device__ __forceinline__ float atomic_min_dist(float* addr, float value) {
  return __int_as_float(atomicMin(reinterpret_cast<int*>(addr), __float_as_int(value)));
}

__device__ __forceinline__ int64_t atomic_min_dist(int64_t* addr, int64_t value) {
  return static_cast<int64_t>(atomicMin(reinterpret_cast<long long*>(addr), static_cast<long long>(value)));
}

// Relaxes edge e (to u) from a vertex at distance dv; true when it lowered dist[u].
template <typename W, typename D>
__device__ __forceinline__ bool relax(D* dist, const W* weights, int64_t e, int64_t u, D dv) {
  const D nd = dv + (weights ? static_cast<D>(weights[e]) : D(1));
  if (!(nd < dist[u])) return false;
  return nd < atomic_min_dist(dist + u, nd);
}

template <typename T, typename D>
__global__ void sssp_init_kernel(D* dist, int32_t* stamp, int64_t source) {
  dist[source] = D(0);
  stamp[source] = 0;
}

template <typename T, typename W, typename D>
__global__ void sssp_naive_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                  const W* __restrict__ weights, D* dist, int32_t* stamp, long long* stats,
                                  GraphGuard g, int64_t step) {
  if (!step_has_work(stats + 1, step)) return;
  const int32_t cur = static_cast<int32_t>(step);
  bool found = false;
  unsigned long long edges = 0;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (reinterpret_cast<volatile int32_t*>(stamp)[v] != cur) continue;
    const D dv = reinterpret_cast<volatile D*>(dist)[v];
    int64_t start = indptr[v], end = indptr[v + 1];
    g.list(v, start, end);
    edges += end - start;
    for (int64_t e = start; e < end; ++e) {
      const int64_t u = indices[e];
      if (g.id(u, e) && relax(dist, weights, e, u, dv)) {
        stamp[u] = cur + 1;
        found = true;
      }
    }
  }
  add_block_count(edges, stats);
  mark_found(found, stats + 1, step);
}

template <bool kAlign, typename T, typename W, typename D>
__global__ void sssp_warp_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                 const W* __restrict__ weights, D* dist, int32_t* stamp, long long* stats,
                                 GraphGuard g, int64_t step) {
  if (!step_has_work(stats + 1, step)) return;
  const int32_t cur = static_cast<int32_t>(step);
  const int lane = threadIdx.x % kWarp;
  bool found = false;
  unsigned long long edges = 0;
  // A vertex found active may be re-stamped cur + 1 before the warp reaches it; expanding it
  // now from its newer distance is still correct (and it is expanded again next step).
  auto active = [&](int64_t v) { return reinterpret_cast<volatile int32_t*>(stamp)[v] == cur; };
  warp_for_each_active(n, lane, active, [&](int64_t v) {
    D dv = lane == 0 ? reinterpret_cast<volatile D*>(dist)[v] : D(0);
    dv = __shfl_sync(0xffffffffu, dv, 0);
    int64_t start = indptr[v], end = indptr[v + 1];
    g.list(v, start, end);
    if (lane == 0) edges += end - start;
    warp_for_each<kAlign>(indices, start, end, lane, [&](int64_t e, bool valid) {
      if (!valid) return;
      const int64_t u = indices[e];
      if (g.id(u, e) && relax(dist, weights, e, u, dv)) {
        stamp[u] = cur + 1;
        found = true;
      }
    });
  });
  add_block_count(edges, stats);
  mark_found(found, stats + 1, step);
}

// Near-far worklist of the frontier variant. Four queues of num_nodes ids change roles: `in`
// (this step's vertices), `out` (the next step's), `far` (vertices whose distance is at or
// beyond the current threshold). A step expands the vertices of `in` whose distance is below
// the threshold; an improved neighbour goes to `out` when its new distance is below the
// threshold (once per step: stamp) and to `far` otherwise (once per epoch: far_epoch). A
// single-thread control kernel after each step makes `out` the next `in`; when `out` is empty
// it raises the threshold by delta, starts a new epoch and makes `far` the next `in` (its
// vertices still beyond the new threshold are deferred again when popped). It sets the "last
// step with work" counter that run_steps watches, so termination stays on the device. Large
// steps fed by `out` are expanded in vertex-id order, as in traversal_bfs.cu.
template <typename D>
struct NearFarControl {
  long long in_count;
  long long out_count;
  long long far_count;
  int32_t in, out, far;  // queue roles: indices into the four queues
  int32_t in_from_far;    // `in` is a refilled far queue (its members are not stamped)
  int32_t epoch;
  D threshold;
  D delta;
  D far_min;  // smallest distance sent to `far` this epoch
};

template <typename T, typename W, typename D>
__global__ void sssp_nearfar_kernel(const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                    const W* __restrict__ weights, D* dist, int32_t* stamp, int32_t* far_epoch,
                                    T* queues, int64_t n, NearFarControl<D>* ctl, long long* stats, GraphGuard g,
                                    int64_t step) {
  if (!step_has_work(stats + 1, step)) return;
  const int32_t cur = static_cast<int32_t>(step);
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarpsPerBlock;
  const long long count_in = ctl->in_count;
  const T* queue_in = queues + ctl->in * n;
  T* queue_out = queues + ctl->out * n;
  T* queue_far = queues + ctl->far * n;
  const int32_t epoch = ctl->epoch;
  const D threshold = ctl->threshold;
  unsigned long long edges = 0;
  auto process = [&](int64_t v) {  // called by all lanes of a warp
    D dv = lane == 0 ? reinterpret_cast<volatile D*>(dist)[v] : D(0);
    dv = __shfl_sync(0xffffffffu, dv, 0);
    if (!(dv < threshold)) {  // beyond this epoch's threshold: defer (warp-uniform, dv is broadcast)
      if (lane == 0) {
        atomic_min_dist(&ctl->far_min, dv);
        if (atomicExch(far_epoch + v, epoch) != epoch) {
          queue_far[atomicAdd(reinterpret_cast<unsigned long long*>(&ctl->far_count), 1ull)] = static_cast<T>(v);
        }
      }
      return;
    }
    int64_t start = indptr[v], end = indptr[v + 1];
    g.list(v, start, end);
    if (lane == 0) edges += end - start;
    warp_for_each<true>(indices, start, end, lane, [&](int64_t e, bool valid) {
      bool near = false, far = false;
      T u = 0;
      if (valid) u = indices[e];
      if (valid && g.id(u, e)) {
        const D nd = dv + (weights ? static_cast<D>(weights[e]) : D(1));
        if (nd < dist[u] && nd < atomic_min_dist(dist + u, nd)) {
          if (nd < threshold) {
            near = atomicExch(stamp + u, cur + 1) != cur + 1;
          } else {
            atomic_min_dist(&ctl->far_min, nd);
            far = atomicExch(far_epoch + u, epoch) != epoch;
          }
        }
      }
      warp_push(near, u, queue_out, &ctl->out_count, lane);
      warp_push(far, u, queue_far, &ctl->far_count, lane);
    });
  };
  const int64_t first_warp = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / kWarp;
  if (!ctl->in_from_far && count_in > n / kScanDivisor) {
    // A large step: visit its vertices in id order (those stamped with this step are the
    // queued ones, less any already re-stamped for the next step, which that step expands),
    // so lists are read in address order.
    warp_for_each_active(
        n, lane, [&](int64_t v) { return reinterpret_cast<volatile int32_t*>(stamp)[v] == cur; }, process);
  } else {
    for (int64_t w = first_warp; w < count_in; w += warps) process(queue_in[w]);
  }
  add_block_count(edges, stats);
}

template <typename D>
__global__ void sssp_nearfar_control_kernel(NearFarControl<D>* ctl, long long* stats, int64_t step) {
  if (stats[1] < step) return;  // finished earlier
  if (ctl->out_count > 0) {
    const int32_t t = ctl->in;
    ctl->in = ctl->out;
    ctl->out = t;
    ctl->in_count = ctl->out_count;
    ctl->out_count = 0;
    ctl->in_from_far = 0;
    stats[1] = step + 1;
  } else if (ctl->far_count > 0) {
    // `far` becomes `in`; the new `far` and `out` are two of the other three (all empty now).
    const int32_t new_in = ctl->far;
    int32_t others[3];
    int k = 0;
    for (int32_t q = 0; q < 4; ++q) {
      if (q != new_in) others[k++] = q;
    }
    ctl->in = new_in;
    ctl->far = others[0];
    ctl->out = others[1];
    ctl->in_count = ctl->far_count;
    ctl->far_count = 0;
    ctl->out_count = 0;
    ctl->in_from_far = 1;
    ctl->epoch += 1;
    // Jump past empty buckets: the nearest deferred vertex is expanded in the next epoch, and
    // its distance is final (every shorter distance is settled once `out` runs dry), so each
    // epoch settles at least one vertex.
    ctl->threshold = (ctl->far_min > ctl->threshold ? ctl->far_min : ctl->threshold) + ctl->delta;
    ctl->far_min = std::numeric_limits<D>::max();
    stats[1] = step + 1;
  }
}

template <typename T, typename D>
__global__ void sssp_nearfar_init_kernel(T* queues, NearFarControl<D>* ctl, int64_t source, D delta) {
  queues[0] = static_cast<T>(source);
  ctl->in_count = 1;
  ctl->out_count = 0;
  ctl->far_count = 0;
  ctl->in = 0;
  ctl->out = 1;
  ctl->far = 2;
  ctl->in_from_far = 0;
  ctl->epoch = 0;
  ctl->threshold = delta;
  ctl->delta = delta;
  ctl->far_min = std::numeric_limits<D>::max();
}

// --- async ---------------------------------------------------------------------------------------

// A distance as the unsigned value stored above the queued bit, and back.
__device__ __forceinline__ unsigned long long dist_bits(float d) { return __float_as_uint(d); }
__device__ __forceinline__ unsigned long long dist_bits(int64_t d) { return static_cast<unsigned long long>(d); }
__device__ __forceinline__ void bits_dist(unsigned long long b, float& d) {
  d = __uint_as_float(static_cast<unsigned>(b));
}
__device__ __forceinline__ void bits_dist(unsigned long long b, int64_t& d) { d = static_cast<int64_t>(b); }

template <typename D>
unsigned long long unreached_key() {
  if constexpr (std::is_same_v<D, float>) {
    unsigned bits;
    const float top = std::numeric_limits<float>::max();
    std::memcpy(&bits, &top, sizeof(bits));
    return static_cast<unsigned long long>(bits) << 1;
  } else {
    return static_cast<unsigned long long>(std::numeric_limits<int64_t>::max()) << 1;
  }
}

template <typename W, typename D>
struct SsspAsyncOp {
  unsigned long long* key;
  const W* weights;  // nullptr: unit weights
  using Item = D;    // distance of the vertex being expanded
  using Edge = D;    // the edge's weight
  using Peek = unsigned long long;

  __device__ __forceinline__ bool begin(int64_t v, int64_t, int64_t, D& dv) const {
    bits_dist(atomicAnd(key + v, ~1ull) >> 1, dv);
    return true;
  }

  __device__ __forceinline__ D load(int64_t e) const { return weights ? static_cast<D>(weights[e]) : D(1); }

  __device__ __forceinline__ Peek peek(int64_t u) const { return ld_relaxed(key + u); }

  __device__ __forceinline__ bool relax(int64_t, int64_t u, D w, D dv, unsigned long long seen) const {
    const unsigned long long nd = dist_bits(static_cast<D>(dv + w));
    while ((seen >> 1) > nd) {
      const unsigned long long prev = atomicCAS(key + u, seen, (nd << 1) | 1ull);
      if (prev == seen) return (seen & 1ull) == 0;
      seen = prev;
    }
    return false;
  }
};

template <typename D>
__global__ void sssp_async_finalize_kernel(int64_t n, const unsigned long long* __restrict__ key, D* dist) {
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    D d;
    bits_dist(key[v] >> 1, d);
    dist[v] = d;
  }
}

// Expansions allowed before the run is declared runaway: label-correcting order expands a list
// again each time its vertex improves, which on non-negative weights stays far below this.
constexpr unsigned long long kAsyncPassesBudget = 1024;

template <typename T, typename W, typename D>
void sssp_async(const at::Tensor& indptr, const at::Tensor& indices, const W* w, int64_t n, int64_t source,
                at::Tensor& dist, at::Tensor& stats, const GraphGuard& g, cudaStream_t stream) {
  const unsigned long long budget = std::min<unsigned long long>(
      static_cast<unsigned long long>(indices.numel() + 1) * kAsyncPassesBudget, 1ull << 62);
  auto make_op = [w](unsigned long long* k) { return SsspAsyncOp<W, D>{k, w}; };
  at::Tensor key = label_correcting<T>(indptr, indices, source, unreached_key<D>(), 0ull, make_op,
                                       reinterpret_cast<long long*>(stats.data_ptr<int64_t>()), g, budget,
                                       "sssp", stream);
  sssp_async_finalize_kernel<D><<<grid_blocks(1, n), kBlock, 0, stream>>>(
      n, reinterpret_cast<const unsigned long long*>(key.data_ptr<int64_t>()), dist.data_ptr<D>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// --- entry ---------------------------------------------------------------------------------------

template <typename T, typename W, typename D>
void sssp_run(const at::Tensor& indptr, const at::Tensor& indices, const W* w, int64_t n, int64_t source,
              int64_t variant, D delta, at::Tensor& dist, at::Tensor& stats) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  // stats: [edges, top, error words...] (traversal_bfs.cu's layout)
  const GraphGuard g{n, indices.numel(), reinterpret_cast<unsigned long long*>(stats.data_ptr<int64_t>() + 2)};
  if (variant == kAsync) {
    sssp_async<T, W, D>(indptr, indices, w, n, source, dist, stats, g, stream);
    return;
  }
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  D* d = dist.data_ptr<D>();
  at::Tensor stamp = at::full({n}, -1, indptr.options().dtype(at::kInt));
  int32_t* sp = stamp.data_ptr<int32_t>();
  auto* st = reinterpret_cast<long long*>(stats.data_ptr<int64_t>());
  at::Tensor queues, far_epoch, control;
  T* q = nullptr;
  int32_t* fe = nullptr;
  NearFarControl<D>* ctl = nullptr;
  if (variant == kFrontier) {
    queues = at::empty({4, n}, indices.options());
    far_epoch = at::full({n}, -1, indptr.options().dtype(at::kInt));
    control = at::empty({static_cast<int64_t>(sizeof(NearFarControl<D>))}, indptr.options().dtype(at::kByte));
    q = queues.data_ptr<T>();
    fe = far_epoch.data_ptr<int32_t>();
    ctl = reinterpret_cast<NearFarControl<D>*>(control.data_ptr<uint8_t>());
    sssp_nearfar_init_kernel<T, D><<<1, 1, 0, stream>>>(q, ctl, source, delta);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  sssp_init_kernel<T, D><<<1, 1, 0, stream>>>(d, sp, source);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto launch = [&](int64_t step) {
    switch (variant) {
      case kNaive:
        sssp_naive_kernel<T, W, D><<<grid_blocks(1, n), kBlock, 0, stream>>>(n, off, col, w, d, sp, st, g, step);
        break;
      case kMerged:
        sssp_warp_kernel<false, T, W, D><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, w, d, sp, st, g,
                                                                                       step);
        break;
      case kAligned:
        sssp_warp_kernel<true, T, W, D><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, w, d, sp, st, g,
                                                                                      step);
        break;
      default:
        sssp_nearfar_kernel<T, W, D><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(off, col, w, d, sp, fe, q, n,
                                                                                   ctl, st, g, step);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        sssp_nearfar_control_kernel<D><<<1, 1, 0, stream>>>(ctl, st, step);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  // Scan variants: after step k every vertex whose shortest path has at most k + 1 edges is
  // final, so n steps suffice. Near-far: at most n epochs (each settles a vertex), each of at
  // most its bucket's size + 1 steps, so 4n steps suffice. The bounds also cap the work for
  // weights that break the non-negative contract.
  GraphErrors errors;
  run_steps(launch, st + 1, variant == kFrontier ? 4 * n + 64 : n + 1, stream, errors);
  check_graph_errors("sssp", errors, indptr, indices);
}

std::tuple<at::Tensor, at::Tensor> sssp_cuda(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                                             const std::optional<at::Tensor>& weights_in, int64_t source,
                                             int64_t variant, double delta) {
  check_variant(variant, TraversalOp::kSssp);
  const int64_t n = check_cuda_csr(indptr_in, indices_in, "sssp");
  c10::cuda::OptionalCUDAGuard guard(indptr_in.device());
  check_source(source, n, "sssp");
  TORCH_CHECK_VALUE(n < (int64_t{1} << 31) - 1, "sssp: num_nodes must be < 2^31 - 1, got ", n);
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  std::optional<at::Tensor> weights;
  if (weights_in.has_value()) {
    check_weights(*weights_in, indices);
    weights = weights_in->contiguous();
  }
  const at::ScalarType dt = sssp_dist_dtype(weights);
  if (variant == kFrontier && !(delta > 0)) {
    // About one warp's worth of edges per vertex per bucket: mean weight * max(1, 32 / degree).
    const int64_t m = indices.numel();
    const double mean_w = (weights.has_value() && m > 0) ? weights->sum(at::kDouble).item<double>() / m : 1.0;
    const double avg_deg = n > 0 ? static_cast<double>(m) / n : 1.0;
    delta = mean_w * std::max(1.0, 32.0 / std::max(avg_deg, 1e-9));
  }
  at::Tensor status = counters_and_errors(2, indptr.options());
  at::Tensor dist;
  AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "sssp", [&] {
    using T = index_t;
    if (dt == at::kFloat) {
      dist = at::full({n}, std::numeric_limits<float>::max(), indptr.options().dtype(at::kFloat));
      const float fdelta = std::max(static_cast<float>(delta), std::numeric_limits<float>::min());
      sssp_run<T, float, float>(indptr, indices, weights->data_ptr<float>(), n, source, variant, fdelta, dist,
                                status);
    } else {
      dist = at::full({n}, std::numeric_limits<int64_t>::max(), indptr.options().dtype(at::kLong));
      const int32_t* w = weights.has_value() ? weights->data_ptr<int32_t>() : nullptr;
      const int64_t idelta = std::max<int64_t>(1, static_cast<int64_t>(std::llround(std::min(delta, 1e18))));
      sssp_run<T, int32_t, int64_t>(indptr, indices, w, n, source, variant, idelta, dist, status);
    }
  });
  at::Tensor stats = status.narrow(0, 0, 2).clone();
  stats.select(0, 1).add_(1);
  return {dist, stats};
}

}  // namespace
}  // namespace traversal

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("graph_sssp", traversal::sssp_cuda);
}

}  // namespace zerocopy
