// PageRank on the GPU, to a stated accuracy: every variant stops once the L1 distance of its
// result to the exact PageRank is bounded by `tol` (traversal_checks.h), up to float32
// rounding. All state is in GPU memory except the edge list.
//
// Power iteration (naive, merged, aligned, frontier): push-style, four kernels per iteration:
//   contrib: c[v] = rank[v] / outdeg(v) (0 without out-edges), and the dangling rank sum;
//   sweep:   acc[u] += c[v] for every edge v -> u (float atomics), in the variant's read shape;
//   update:  rank[u] = (1 - alpha) / N + alpha * (acc[u] + dangling / N), the L1 change, acc = 0;
//   finish:  one thread counts the iteration and ends the run once the change is small enough.
//
// Residual push (push; EMOGI's PageRank is of this family): keeps x and a residual r with
// x* = x + (I - alpha M)^-1 r, where M is the walk matrix with dangling mass spread uniformly.
// It starts from x = 1/N, whose residual r = (1 - alpha)/N + alpha M x - x one sweep computes
// (r then sums to 0 and shrinks like power iteration's change, where starting from x = 0 would
// leave mass to push that shrinks only like alpha^k). Each round, every vertex with
// |r[v]| > eps moves r[v] into x[v] and pushes alpha r[v] / outdeg(v) to its out-neighbours'
// residuals (dangling vertices spread theirs uniformly); vertices below eps are skipped, and
// their lists not read. It stops when |r|_1 <= (1 - alpha) tol / alpha and returns x + r
// (pagerank_push_target: the bound power iteration's change gives). eps = target / (2N), so a
// round where nothing is above eps has already met the target. A round reads the lists
// of its active vertices with the edge-balanced sweep when they hold more than a quarter of
// the edges, else warp per active vertex (aligned reads, inactive vertices skipped in tiles).
//
// Async (Atos): the same residual equations, but one persistent kernel over a worklist
// (traversal_async.cuh), run in epochs. Epoch k takes the residual norm R_k = |r|_1 (plus the
// dangling mass not yet spread) and a unit u_k = R_k / (2 (E + N)); a vertex expands only when
// |r[v]| > u_k * max(outdeg(v), 1) (Andersen, Chung and Lang's per-degree threshold), so a hub
// waits until its residual pays for reading its list. A vertex is queued when |r| rises above
// u_k (the smallest threshold); taking it re-reads its residual against its own threshold and
// moves the whole of it (atomicExch) or leaves it. An epoch ends when the worklist is empty:
// whatever stays below the thresholds then sums to at most u_k (E + N) = R_k / 2, and every
// expansion of p lowers the norm by at least (1 - alpha) |p| >= (1 - alpha) u_k outdeg(v), so an
// epoch reads at most 2 (E + N) / (1 - alpha) edges and halves the norm, up to the mass dangling
// vertices gather, which is spread before the next epoch. (A unit fixed by the final target
// instead would let every small addition re-expand a hub: work without bound in practice.)
// The host repeats epochs until the norm is at most the target. `max_iter` bounds the work at
// max_iter passes' worth of edges.
//
// Iterations are launched in batches and stop on the device: `top` holds the last iteration
// known to have work, the kernels of iteration s return at once when top < s, and the finish
// kernel of s sets top = s + 1 unless s met the bound (run_steps in traversal_common.cuh).
// Float atomics make the last bits of the result vary from run to run.
//
// Bad graphs: every read of the graph is checked (GraphGuard, traversal_common.cuh); a vertex
// with bad offsets counts as dangling and an id out of range is skipped. Every vertex's offsets
// are read, and so checked, by the contrib kernel (power iteration) or the init kernel (push,
// async) besides the sweeps. The error words follow `top` and come back with it
// (run_steps); the async variant reads them once, after its epochs.

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include "traversal_async.cuh"
#include "traversal_sweep.cuh"

namespace zerocopy {
namespace traversal {
namespace {

// Per-iteration sums, reset by the finish kernels. The iteration count lives in stats[1].
struct PageRankScalars {
  double dangling;
  double diff;      // power iteration: L1 change; push: |r|_1 after the round
  double active;    // push: out-edges of the vertices that push in the next round (set by update)
  double sweeping;  // push: out-edges of the vertices that push in this round (set by finish)
};

__device__ __forceinline__ bool pr_idle(const long long* top, int64_t step) {
  return *reinterpret_cast<const volatile long long*>(top) < step;
}

__device__ __forceinline__ void add_block_double(double mine, double* total) {
  __shared__ double block_sum;
  if (threadIdx.x == 0) block_sum = 0;
  __syncthreads();
  if (mine != 0) atomicAdd(&block_sum, mine);
  __syncthreads();
  if (threadIdx.x == 0 && block_sum != 0) atomicAdd(total, block_sum);
}

__global__ void pr_init_kernel(int64_t n, float* rank, float* acc) {
  const float r0 = 1.0f / static_cast<float>(n);
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    rank[v] = r0;
    acc[v] = 0.0f;
  }
}

// The out-degree of v, 0 for a list with bad offsets (reported through g).
__device__ __forceinline__ int64_t checked_degree(const int64_t* __restrict__ indptr, int64_t v, const GraphGuard& g) {
  int64_t start = indptr[v], end = indptr[v + 1];
  g.list(v, start, end);
  return end - start;
}

__global__ void pr_contrib_kernel(int64_t n, const int64_t* __restrict__ indptr, const float* __restrict__ rank,
                                  float* contrib, PageRankScalars* scalars, GraphGuard g, const long long* top,
                                  int64_t step) {
  if (pr_idle(top, step)) return;
  double dangling = 0;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t deg = checked_degree(indptr, v, g);
    if (deg == 0) {
      dangling += rank[v];
      contrib[v] = 0.0f;
    } else {
      contrib[v] = rank[v] / static_cast<float>(deg);
    }
  }
  add_block_double(dangling, &scalars->dangling);
}

template <int kVariant, typename T>
__global__ void pr_sweep_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                const float* __restrict__ contrib, float* acc, GraphGuard g, const long long* top,
                                int64_t step, long long* stats) {
  if (pr_idle(top, step)) return;
  unsigned long long edges = 0;
  sweep_edges<kVariant, T>(
      n, indptr, indices, g, [](int64_t) { return false; },
      [&](int64_t v, int64_t u) { atomicAdd(acc + u, contrib[v]); }, edges);
  add_block_count(edges, stats);
}

__global__ void pr_update_kernel(int64_t n, float* rank, float* acc, double alpha, PageRankScalars* scalars,
                                 const long long* top, int64_t step) {
  if (pr_idle(top, step)) return;
  const double inv_n = 1.0 / static_cast<double>(n);
  const float base = static_cast<float>((1.0 - alpha) * inv_n + alpha * scalars->dangling * inv_n);
  const float a = static_cast<float>(alpha);
  double diff = 0;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < n;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float r = base + a * acc[u];
    diff += fabs(static_cast<double>(r) - static_cast<double>(rank[u]));
    rank[u] = r;
    acc[u] = 0.0f;
  }
  add_block_double(diff, &scalars->diff);
}

// Ends iteration `step`: counts it, keeps the run going unless scalars->diff (power iteration:
// the change; push: |r|_1) is at most `bound`, and resets the sums.
__global__ void pr_finish_kernel(PageRankScalars* scalars, long long* top, long long* stats, double bound,
                                 int64_t step) {
  if (*top < step) return;
  stats[1] += 1;
  if (!(scalars->diff <= bound)) *top = step + 1;
  scalars->dangling = 0;
  scalars->diff = 0;
  scalars->sweeping = scalars->active;
  scalars->active = 0;
}

template <typename T>
void power_iteration(const at::Tensor& indptr, const at::Tensor& indices, int64_t n, double alpha, double tol,
                     int64_t max_iter, int64_t variant, at::Tensor& rank, at::Tensor& stats, cudaStream_t stream) {
  const int64_t* off = indptr.data_ptr<int64_t>();
  const T* col = indices.data_ptr<T>();
  float* r = rank.data_ptr<float>();
  at::Tensor acc = at::empty({n}, rank.options());
  at::Tensor contrib = at::empty({n}, rank.options());
  at::Tensor scalars_t = at::zeros({4}, rank.options().dtype(at::kDouble));
  at::Tensor top_t = counters_and_errors(1, stats.options());  // [top, error words...]
  float* a = acc.data_ptr<float>();
  float* c = contrib.data_ptr<float>();
  auto* scalars = reinterpret_cast<PageRankScalars*>(scalars_t.data_ptr<double>());
  auto* top = reinterpret_cast<long long*>(top_t.data_ptr<int64_t>());
  auto* st = reinterpret_cast<long long*>(stats.data_ptr<int64_t>());
  const GraphGuard g{n, indices.numel(), reinterpret_cast<unsigned long long*>(top + 1)};
  const double threshold = pagerank_change_threshold(alpha, tol);
  const int64_t vertex_blocks = grid_blocks(1, n);
  const int64_t warp_blocks = grid_blocks(kWarp, n);
  const int64_t slice_blocks = grid_blocks(kWarp, indices.numel() / kSliceEdges + 2);
  pr_init_kernel<<<vertex_blocks, kBlock, 0, stream>>>(n, r, a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  auto launch = [&](int64_t step) {
    pr_contrib_kernel<<<vertex_blocks, kBlock, 0, stream>>>(n, off, r, c, scalars, g, top, step);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    switch (variant) {
      case kNaive:
        pr_sweep_kernel<kNaive, T><<<vertex_blocks, kBlock, 0, stream>>>(n, off, col, c, a, g, top, step, st);
        break;
      case kMerged:
        pr_sweep_kernel<kMerged, T><<<warp_blocks, kBlock, 0, stream>>>(n, off, col, c, a, g, top, step, st);
        break;
      case kAligned:
        pr_sweep_kernel<kAligned, T><<<warp_blocks, kBlock, 0, stream>>>(n, off, col, c, a, g, top, step, st);
        break;
      default:
        pr_sweep_kernel<kFrontier, T><<<slice_blocks, kBlock, 0, stream>>>(n, off, col, c, a, g, top, step, st);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    pr_update_kernel<<<vertex_blocks, kBlock, 0, stream>>>(n, r, a, alpha, scalars, top, step);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    pr_finish_kernel<<<1, 1, 0, stream>>>(scalars, top, st, threshold, step);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  };
  GraphErrors errors;
  run_steps(launch, top, max_iter, stream, errors);
  check_graph_errors("pagerank", errors, indptr, indices);
}

// --- residual push ---------------------------------------------------------------------------

// x = 1/N; c[v] = alpha x[v] / outdeg(v) (0 without out-edges, whose alpha x[v] goes to the
// dangling sum); r = (1 - alpha)/N - x, to which the update after the first sweep adds
// alpha M x.
__global__ void prp_init_kernel(int64_t n, const int64_t* __restrict__ indptr, float* x, float* r, float* c,
                                float* acc, double alpha, PageRankScalars* scalars, GraphGuard g) {
  const double x0 = 1.0 / static_cast<double>(n);
  double dangling = 0;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t deg = checked_degree(indptr, v, g);
    x[v] = static_cast<float>(x0);
    r[v] = static_cast<float>((1.0 - alpha) * x0 - x0);
    acc[v] = 0.0f;
    if (deg == 0) {
      c[v] = 0.0f;
      dangling += alpha * x0;
    } else {
      c[v] = static_cast<float>(alpha * x0 / static_cast<double>(deg));
    }
  }
  add_block_double(dangling, &scalars->dangling);
}

// Moves the residual of every vertex above eps into x and sets what it pushes.
__global__ void prp_take_kernel(int64_t n, const int64_t* __restrict__ indptr, float* x, float* r, float* c,
                                double alpha, float eps, PageRankScalars* scalars, GraphGuard g,
                                const long long* top, int64_t step) {
  if (pr_idle(top, step)) return;
  double dangling = 0;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float p = r[v];
    float cv = 0.0f;
    if (fabsf(p) > eps) {
      x[v] += p;
      r[v] = 0.0f;
      const int64_t deg = checked_degree(indptr, v, g);
      if (deg == 0) {
        dangling += alpha * static_cast<double>(p);
      } else {
        cv = static_cast<float>(alpha * static_cast<double>(p) / static_cast<double>(deg));
      }
    }
    c[v] = cv;
  }
  add_block_double(dangling, &scalars->dangling);
}

// The round's pushes when its active vertices hold more than a quarter of the edges: the
// edge-balanced sweep (every line read, inactive sources add nothing).
template <typename T>
__global__ void prp_slices_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                  const float* __restrict__ c, float* acc, const PageRankScalars* scalars,
                                  double edges_total, GraphGuard g, const long long* top, int64_t step,
                                  long long* stats) {
  if (pr_idle(top, step) || !(scalars->sweeping * 4 > edges_total)) return;
  unsigned long long edges = 0;
  sweep_edge_slices(
      n, indptr, indices, 0, g.m, g, [&](int64_t v) { return c[v] == 0.0f; },
      [&](int64_t v, int64_t u) { atomicAdd(acc + u, c[v]); }, edges);
  add_block_count(edges, stats);
}

// Otherwise: warp per active vertex, aligned reads; tiles of 32 vertices skip inactive ones
// without reading their lists.
template <typename T>
__global__ void prp_vertices_kernel(int64_t n, const int64_t* __restrict__ indptr, const T* __restrict__ indices,
                                    const float* __restrict__ c, float* acc, const PageRankScalars* scalars,
                                    double edges_total, GraphGuard g, const long long* top, int64_t step,
                                    long long* stats) {
  if (pr_idle(top, step) || scalars->sweeping * 4 > edges_total) return;
  const int lane = threadIdx.x % kWarp;
  unsigned long long edges = 0;
  warp_for_each_active(n, lane, [&](int64_t v) { return c[v] != 0.0f; }, [&](int64_t v) {
    const float cv = c[v];
    int64_t start = indptr[v], end = indptr[v + 1];
    g.list(v, start, end);
    if (lane == 0) edges += end - start;
    warp_for_each<true>(indices, start, end, lane, [&](int64_t e, bool valid) {
      const T u = valid ? indices[e] : T(0);
      if (valid && g.id(u, e)) atomicAdd(acc + u, cv);
    });
  });
  add_block_count(edges, stats);
}

// r += acc + dangling / N; |r|_1 and the out-edges of the vertices above eps (next round).
__global__ void prp_update_kernel(int64_t n, const int64_t* __restrict__ indptr, float* r, float* acc, float eps,
                                  PageRankScalars* scalars, GraphGuard g, const long long* top, int64_t step) {
  if (pr_idle(top, step)) return;
  const float spread = static_cast<float>(scalars->dangling / static_cast<double>(n));
  double norm = 0, active = 0;
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < n;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float nr = r[u] + acc[u] + spread;
    r[u] = nr;
    acc[u] = 0.0f;
    norm += fabs(static_cast<double>(nr));
    if (fabsf(nr) > eps) active += static_cast<double>(checked_degree(indptr, u, g));
  }
  add_block_double(norm, &scalars->diff);
  add_block_double(active, &scalars->active);
}

// x += r: the push variant's result (pagerank_push_target).
__global__ void prp_settle_kernel(int64_t n, float* x, const float* __restrict__ r) {
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < n;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[v] += r[v];
}

// The state of the residual form, in GPU memory: x (the result), r, what each vertex pushes
// (c), the pushes' sum per vertex (acc), the per-round sums, and the step counter followed by
// the error words (`top`, `guard`).
template <typename T>
struct Residual {
  const int64_t n, m;
  const int64_t* off;
  const T* col;
  const double alpha, target;  // |r|_1 at which the rounds stop
  const float eps;  // vertices with |r| <= eps do not push: at most half the target left below it
  at::Tensor r_t, c_t, acc_t, scalars_t, top_t;
  float *x, *r, *c, *acc;
  PageRankScalars* scalars;
  long long* top;
  long long* st;
  GraphGuard guard;

  Residual(const at::Tensor& indptr, const at::Tensor& indices, double alpha_, double target_, at::Tensor& rank,
           at::Tensor& stats)
      : n(indptr.numel() - 1),
        m(indices.numel()),
        off(indptr.data_ptr<int64_t>()),
        col(indices.data_ptr<T>()),
        alpha(alpha_),
        target(target_),
        eps(static_cast<float>(target_ / (2.0 * static_cast<double>(n)))),
        r_t(at::empty({n}, rank.options())),
        c_t(at::empty({n}, rank.options())),
        acc_t(at::empty({n}, rank.options())),
        scalars_t(at::zeros({4}, rank.options().dtype(at::kDouble))),
        top_t(counters_and_errors(1, stats.options())),
        x(rank.data_ptr<float>()),
        r(r_t.data_ptr<float>()),
        c(c_t.data_ptr<float>()),
        acc(acc_t.data_ptr<float>()),
        scalars(reinterpret_cast<PageRankScalars*>(scalars_t.data_ptr<double>())),
        top(reinterpret_cast<long long*>(top_t.data_ptr<int64_t>())),
        st(reinterpret_cast<long long*>(stats.data_ptr<int64_t>())),
        guard{n, m, reinterpret_cast<unsigned long long*>(top + 1)} {}

  // x = 1/N without any iteration (max_iter == 0).
  void uniform(cudaStream_t stream) {
    pr_init_kernel<<<grid_blocks(1, n), kBlock, 0, stream>>>(n, x, acc);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }

  // One round (step 0: x = 1/N and its residual, one full sweep; later steps: the vertices above
  // eps push), ending with the finish kernel.
  void round(int64_t step, cudaStream_t stream) {
    const int64_t vertex_blocks = grid_blocks(1, n);
    if (step == 0) {
      scalars_t.select(0, 3).fill_(static_cast<double>(m));  // every vertex pushes
      prp_init_kernel<<<vertex_blocks, kBlock, 0, stream>>>(n, off, x, r, c, acc, alpha, scalars, guard);
    } else {
      prp_take_kernel<<<vertex_blocks, kBlock, 0, stream>>>(n, off, x, r, c, alpha, eps, scalars, guard, top,
                                                            step);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    prp_slices_kernel<T><<<grid_blocks(kWarp, m / kSliceEdges + 2), kBlock, 0, stream>>>(
        n, off, col, c, acc, scalars, static_cast<double>(m), guard, top, step, st);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    prp_vertices_kernel<T><<<grid_blocks(kWarp, n), kBlock, 0, stream>>>(n, off, col, c, acc, scalars,
                                                                          static_cast<double>(m), guard, top, step,
                                                                          st);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    prp_update_kernel<<<vertex_blocks, kBlock, 0, stream>>>(n, off, r, acc, eps, scalars, guard, top, step);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    pr_finish_kernel<<<1, 1, 0, stream>>>(scalars, top, st, target, step);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
};

template <typename T>
void residual_push(const at::Tensor& indptr, const at::Tensor& indices, double alpha, double tol, int64_t max_iter,
                   at::Tensor& rank, at::Tensor& stats, cudaStream_t stream) {
  Residual<T> res(indptr, indices, alpha, pagerank_push_target(alpha, tol), rank, stats);
  if (max_iter == 0) {
    res.uniform(stream);
    return;
  }
  GraphErrors errors;
  run_steps([&](int64_t step) { res.round(step, stream); }, res.top, max_iter, stream, errors);
  check_graph_errors("pagerank", errors, indptr, indices);
  prp_settle_kernel<<<grid_blocks(1, res.n), kBlock, 0, stream>>>(res.n, res.x, res.r);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// --- async -------------------------------------------------------------------------------------

struct PageRankAsyncOp {
  float* r;
  float* x;
  int* queued;
  double* dangling;
  float alpha;
  float unit;  // the epoch's unit: a vertex expands once |r| > unit * max(outdeg, 1); queued above unit
  using Item = float;  // what the vertex adds to each out-neighbour's residual
  struct Edge {};
  struct Peek {};

  __device__ __forceinline__ bool begin(int64_t v, int64_t start, int64_t end, float& amount) const {
    // Unmark before reading the residual: an addition after the read then sees the mark clear
    // and schedules v again (both sides fence between their two accesses).
    atomicExch(queued + v, 0);
    __threadfence();
    const int64_t degree = end > start ? end - start : 1;
    if (!(fabsf(ld_volatile(r + v)) > unit * static_cast<float>(degree))) return false;
    const float p = atomicExch(r + v, 0.0f);
    if (p == 0.0f) return false;
    atomicAdd(x + v, p);
    if (end == start) {
      atomicAdd(dangling, static_cast<double>(alpha) * static_cast<double>(p));
      return false;
    }
    amount = alpha * p / static_cast<float>(end - start);
    return true;
  }

  __device__ __forceinline__ Edge load(int64_t) const { return {}; }

  __device__ __forceinline__ Peek peek(int64_t) const { return {}; }

  __device__ __forceinline__ bool relax(int64_t, int64_t u, Edge, float amount, Peek) const {
    const float before = atomicAdd(r + u, amount);
    if (!(fabsf(before + amount) > unit)) return false;
    __threadfence();
    if (ld_volatile(queued + u) != 0) return false;
    return atomicExch(queued + u, 1) == 0;
  }
};

// Schedules every vertex above its threshold (PageRankAsyncOp). Every thread of a warp runs the
// same number of loop trips (async_push_warp is warp-collective).
template <typename T>
__global__ void pra_seed_kernel(int64_t n, const int64_t* __restrict__ indptr, const float* __restrict__ r,
                                int* queued, float unit, AsyncQueueView<T> q, GraphGuard g) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t base = blockIdx.x * static_cast<int64_t>(blockDim.x); base < n;
       base += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t v = base + threadIdx.x;
    const int64_t degree = v < n ? checked_degree(indptr, v, g) : 0;
    const float threshold = unit * static_cast<float>(degree > 0 ? degree : 1);
    const bool push = v < n && fabsf(r[v]) > threshold && atomicExch(queued + v, 1) == 0;
    async_push_warp(q, push, static_cast<T>(push ? v : 0), lane);
  }
}

// r += dangling / N (the mass gathered from dangling vertices), dangling = 0.
__global__ void pra_spread_kernel(int64_t n, float* r, double* dangling) {
  const float spread = static_cast<float>(*dangling / static_cast<double>(n));
  for (int64_t u = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; u < n;
       u += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    r[u] += spread;
  }
}

template <typename T>
void async_push(const at::Tensor& indptr, const at::Tensor& indices, double alpha, double tol, int64_t max_iter,
                at::Tensor& rank, at::Tensor& stats, cudaStream_t stream) {
  Residual<T> res(indptr, indices, alpha, pagerank_residual_target(alpha, tol), rank, stats);
  if (max_iter == 0) {
    res.uniform(stream);
    return;
  }
  const int64_t n = res.n, m = res.m;
  res.round(0, stream);  // x = 1/N and its residual; stats[1] becomes 1
  res.scalars_t.select(0, 0).zero_();  // the dangling mass of x was spread by the round
  at::Tensor queued_t = at::zeros({n}, rank.options().dtype(at::kInt));
  AsyncQueue<T> queue(n, indptr.options().dtype(indices.scalar_type()), stream);
  double* dangling = &res.scalars->dangling;
  int* queued = queued_t.data_ptr<int>();
  const unsigned long long budget = static_cast<unsigned long long>(std::max<int64_t>(m, 1)) *
                                    static_cast<unsigned long long>(max_iter - 1);
  // One epoch per pass of this loop (see the file comment); the mass dangling vertices gathered
  // during an epoch is spread before the next one.
  const at::Tensor& r_t = res.r_t;
  const at::Tensor& scalars_t = res.scalars_t;
  for (int64_t run = 0; run < max_iter; ++run) {
    const double norm = r_t.abs().sum(at::kDouble).item<double>() + std::abs(scalars_t[0].item<double>());
    if (norm <= res.target) break;
    const int64_t used = stats[0].item<int64_t>() - m;
    if (used >= static_cast<int64_t>(budget)) break;
    const float unit = static_cast<float>(norm / (2.0 * static_cast<double>(m + n)));
    const PageRankAsyncOp op{res.r, res.x, queued, dangling, static_cast<float>(alpha), unit};
    pra_spread_kernel<<<grid_blocks(1, n), kBlock, 0, stream>>>(n, res.r, dangling);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    scalars_t.select(0, 0).zero_();
    pra_seed_kernel<T><<<grid_blocks(1, n), kBlock, 0, stream>>>(n, res.off, res.r, queued, unit, queue.view,
                                                                 res.guard);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    queue.run(res.off, res.col, op, res.guard, res.st, budget - static_cast<unsigned long long>(used), false, stream);
    if (queue.pending_host() != 0) break;  // the work budget ran out
  }
  check_graph_errors("pagerank", read_graph_errors(res.top + 1, stream), indptr, indices);
  // iterations: passes over the edge list, rounded up
  if (m > 0) stats.select(0, 1).copy_((stats.select(0, 0) + (m - 1)).div(m, "floor"));
}

// --- entry -------------------------------------------------------------------------------------

template <typename T>
void pagerank_run(const at::Tensor& indptr, const at::Tensor& indices, int64_t n, double alpha, double tol,
                  int64_t max_iter, int64_t variant, at::Tensor& rank, at::Tensor& stats) {
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (variant == kPush) {
    residual_push<T>(indptr, indices, alpha, tol, max_iter, rank, stats, stream);
  } else if (variant == kAsync) {
    async_push<T>(indptr, indices, alpha, tol, max_iter, rank, stats, stream);
  } else {
    power_iteration<T>(indptr, indices, n, alpha, tol, max_iter, variant, rank, stats, stream);
  }
}

std::tuple<at::Tensor, at::Tensor> pagerank_cuda(const at::Tensor& indptr_in, const at::Tensor& indices_in,
                                                 double alpha, double tol, int64_t max_iter, int64_t variant) {
  check_variant(variant, TraversalOp::kPagerank);
  check_pagerank_args(alpha, tol, max_iter);
  const int64_t n = check_cuda_csr(indptr_in, indices_in, "pagerank");
  c10::cuda::OptionalCUDAGuard guard(indptr_in.device());
  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  at::Tensor rank = at::empty({n}, indptr.options().dtype(at::kFloat));
  at::Tensor stats = at::zeros({2}, indptr.options());
  if (n > 0) {
    AT_DISPATCH_INDEX_TYPES(indices.scalar_type(), "pagerank", [&] {
      pagerank_run<index_t>(indptr, indices, n, alpha, tol, max_iter, variant, rank, stats);
    });
  }
  return {rank, stats};
}

}  // namespace
}  // namespace traversal

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("graph_pagerank", traversal::pagerank_cuda);
}

}  // namespace zerocopy
