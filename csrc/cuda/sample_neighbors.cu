// zerocopy::sample_neighbors on the GPU: one warp per seed node.
//
// The adjacency may be GPU memory or host memory mapped for the GPU (a unified tensor reaches
// this kernel as a CUDA tensor over host-mapped bytes). Reads of a neighbour list start at the
// 32-element boundary below the list's start, so every warp-wide load covers whole 128-byte
// lines (256 for int64 indices) and no line is fetched twice over PCIe.
//
// Two passes: a count kernel (degree, or the number of positive-probability edges), a cumsum
// and one host read of the total (which also reports the first out-of-range seed), then the
// sampling kernel writes each seed's edges at its offset. Samples follow csrc/sampling.h, so a
// uniform sample equals the CPU kernel's for the same seed.

#include "checks.h"
#include "sample_neighbors_args.h"
#include "sampling.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cfloat>
#include <climits>

namespace zerocopy {

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int64_t warp_index() {
  return (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
}

__device__ __forceinline__ int64_t warp_count() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x / kWarp;
}

// The first element of the 32-element-aligned chunk holding `start`.
__device__ __forceinline__ int64_t chunk_base(int64_t start) { return start & ~int64_t(kWarp - 1); }

__device__ __forceinline__ int64_t warp_sum(int64_t x) {
  for (int d = kWarp / 2; d > 0; d /= 2) x += __shfl_xor_sync(kFull, x, d);
  return x;
}

template <typename seed_t>
__global__ void count_kernel(const int64_t* __restrict__ indptr, const seed_t* __restrict__ seeds,
                             const int64_t* __restrict__ order, int64_t n, int64_t num_nodes,
                             const float* __restrict__ probs, int64_t fanout, bool replace,
                             int64_t* __restrict__ counts, unsigned long long* __restrict__ first_bad) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t w = warp_index(); w < n; w += warp_count()) {
    const int64_t i = order[w];
    const int64_t v = static_cast<int64_t>(seeds[i]);
    if (v < 0 || v >= num_nodes) {
      if (lane == 0) {
        atomicMin(first_bad, static_cast<unsigned long long>(i));
        counts[i] = 0;
      }
      continue;
    }
    const int64_t start = indptr[v], end = indptr[v + 1];
    int64_t positive = end - start;
    if (probs != nullptr) {
      int64_t mine = 0;
      for (int64_t c = chunk_base(start); c < end; c += kWarp) {
        const int64_t e = c + lane;
        mine += (e >= start && e < end && probs[e] > 0.0f) ? 1 : 0;
      }
      positive = warp_sum(mine);
    }
    if (lane == 0) counts[i] = sampling::sample_count(positive, fanout, replace);
  }
}

// Every neighbour (with probs: every positive one), in list order.
template <typename index_t>
__device__ void take_all(const index_t* __restrict__ indices, const float* __restrict__ probs,
                         int64_t start, int64_t end, int lane, index_t* __restrict__ out_nbr,
                         int64_t* __restrict__ out_pos) {
  int64_t written = 0;
  for (int64_t c = chunk_base(start); c < end; c += kWarp) {
    const int64_t e = c + lane;
    const bool in = e >= start && e < end;
    const bool take = in && (probs == nullptr || probs[e] > 0.0f);
    const unsigned mask = __ballot_sync(kFull, take);
    if (take) {
      const int64_t k = written + __popc(mask & ((1u << lane) - 1u));
      out_nbr[k] = indices[e];
      out_pos[k] = e;
    }
    written += __popc(mask);
  }
}

template <typename seed_t, typename index_t>
__global__ void sample_kernel(const int64_t* __restrict__ indptr, const index_t* __restrict__ indices,
                              const seed_t* __restrict__ seeds, const int64_t* __restrict__ order,
                              int64_t n, const int64_t* __restrict__ offsets,
                              const float* __restrict__ probs, int64_t fanout, bool replace,
                              uint64_t seed, index_t* __restrict__ out_nbr,
                              int64_t* __restrict__ out_pos, int64_t* __restrict__ out_seed) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t w = warp_index(); w < n; w += warp_count()) {
    const int64_t i = order[w];
    const int64_t o = offsets[i];
    const int64_t count = offsets[i + 1] - o;
    if (count == 0) continue;
    const int64_t v = static_cast<int64_t>(seeds[i]);
    const int64_t start = indptr[v], end = indptr[v + 1], deg = end - start;
    index_t* nbr = out_nbr + o;
    int64_t* pos = out_pos + o;
    for (int64_t k = lane; k < count; k += kWarp) out_seed[o + k] = i;

    if (probs == nullptr) {
      if (fanout < 0 || (!replace && deg <= fanout)) {
        take_all(indices, probs, start, end, lane, nbr, pos);
      } else if (replace) {
        for (int64_t k = lane; k < count; k += kWarp) {
          const int64_t e = start + sampling::below(sampling::draw(seed, v, sampling::kReplaceStream + k), deg);
          pos[k] = e;
          nbr[k] = indices[e];
        }
      } else {
        // Floyd's algorithm, sequential in k; the warp tests membership in parallel. Chosen
        // list positions (relative to start) are kept in pos[0..k) until the end.
        for (int64_t k = 0; k < count; ++k) {
          const int64_t j = deg - count + k;
          const int64_t t = sampling::below(sampling::draw(seed, v, sampling::kFloydStream + k), j + 1);
          bool seen = false;
          for (int64_t q = lane; q < k; q += kWarp) seen |= pos[q] == t;
          seen = __any_sync(kFull, seen);
          if (lane == 0) pos[k] = seen ? j : t;
          __syncwarp();
        }
        for (int64_t k = lane; k < count; k += kWarp) {
          const int64_t e = start + pos[k];
          pos[k] = e;
          nbr[k] = indices[e];
        }
      }
      continue;
    }

    if (fanout < 0 || (!replace && count < fanout)) {
      // Fewer positive edges than the fanout (or all requested): every positive one.
      take_all(indices, probs, start, end, lane, nbr, pos);
      continue;
    }
    if (!replace) {
      // The `count` smallest Efraimidis-Spirakis keys, ascending (ties: smaller position),
      // found one at a time as the smallest (key, position) above the previous pick.
      double prev_key = -DBL_MAX;
      int64_t prev_rel = -1;
      for (int64_t k = 0; k < count; ++k) {
        double best_key = DBL_MAX;
        int64_t best_rel = LLONG_MAX;
        for (int64_t c = chunk_base(start); c < end; c += kWarp) {
          const int64_t e = c + lane;
          if (e < start || e >= end) continue;
          const float p = probs[e];
          if (!(p > 0.0f)) continue;
          const int64_t rel = e - start;
          const double key = sampling::weighted_key(seed, v, rel, p);
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
        if (lane == 0) {
          pos[k] = start + best_rel;
          nbr[k] = indices[start + best_rel];
        }
        prev_key = best_key;
        prev_rel = best_rel;
      }
      continue;
    }
    // Weighted with replacement: inverse CDF. The prefix sums are recomputed per draw in the
    // same chunk order as the total, so the search sees exactly the values the total summed.
    double total = 0.0;
    int64_t last_positive = -1;
    for (int64_t c = chunk_base(start); c < end; c += kWarp) {
      const int64_t e = c + lane;
      const float p = (e >= start && e < end) ? probs[e] : 0.0f;
      double w = p > 0.0f ? static_cast<double>(p) : 0.0;
      for (int d = 1; d < kWarp; d *= 2) {
        const double up = __shfl_up_sync(kFull, w, d);
        if (lane >= d) w += up;
      }
      total += __shfl_sync(kFull, w, kWarp - 1);
      const unsigned mask = __ballot_sync(kFull, p > 0.0f);
      if (mask) last_positive = c + (kWarp - 1 - __clz(mask));
    }
    for (int64_t k = 0; k < count; ++k) {
      const double target =
          sampling::open_unit(sampling::draw(seed, v, sampling::kReplaceStream + k)) * total;
      double running = 0.0;
      int64_t found = -1;
      for (int64_t c = chunk_base(start); c < end && found < 0; c += kWarp) {
        const int64_t e = c + lane;
        const float p = (e >= start && e < end) ? probs[e] : 0.0f;
        double w = p > 0.0f ? static_cast<double>(p) : 0.0;
        for (int d = 1; d < kWarp; d *= 2) {
          const double up = __shfl_up_sync(kFull, w, d);
          if (lane >= d) w += up;
        }
        const unsigned hit = __ballot_sync(kFull, p > 0.0f && running + w >= target);
        if (hit) found = c + __ffs(hit) - 1;
        running += __shfl_sync(kFull, w, kWarp - 1);
      }
      if (found < 0) found = last_positive;
      if (lane == 0) {
        pos[k] = found;
        nbr[k] = indices[found];
      }
    }
  }
}

int blocks_for(int64_t n) {
  const int64_t want = (n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(want, int64_t(1) << 20)));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sample_neighbors_cuda(
    const at::Tensor& indptr_in, const at::Tensor& indices_in, const at::Tensor& seeds_in,
    int64_t fanout, bool replace, const std::optional<at::Tensor>& probs_in, int64_t seed) {
  check_sample_neighbors_args(indptr_in, indices_in, seeds_in, fanout, probs_in);
  check_device_type(indptr_in, c10::DeviceType::CUDA, "indptr");
  const c10::cuda::OptionalCUDAGuard guard(indptr_in.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();

  const at::Tensor indptr = indptr_in.contiguous();
  const at::Tensor indices = indices_in.contiguous();
  const at::Tensor seeds = seeds_in.contiguous();
  const at::Tensor probs = probs_in ? probs_in->contiguous() : at::Tensor();
  const float* pr = probs_in ? probs.data_ptr<float>() : nullptr;
  const int64_t n = seeds.numel();
  const int64_t num_nodes = indptr.numel() - 1;
  const auto long_opts = indptr.options().dtype(at::kLong);

  // Warps visit seeds in ascending id order, so that reads of indptr and of the neighbour lists
  // sweep host memory in address order (random order is bound by the GPU's address
  // translation when the graph is in host memory); results still land at each seed's slot.
  const at::Tensor order = std::get<1>(seeds.sort());
  at::Tensor counts = at::empty({n}, long_opts);
  at::Tensor first_bad = at::full({1}, n, long_opts);
  at::Tensor offsets = at::zeros({n + 1}, long_opts);
  AT_DISPATCH_INDEX_TYPES(seeds.scalar_type(), "sample_neighbors", [&] {
    if (n > 0) {
      count_kernel<index_t><<<blocks_for(n), kWarpsPerBlock * kWarp, 0, stream>>>(
          indptr.data_ptr<int64_t>(), seeds.data_ptr<index_t>(), order.data_ptr<int64_t>(), n,
          num_nodes, pr, fanout, replace,
          counts.data_ptr<int64_t>(),
          reinterpret_cast<unsigned long long*>(first_bad.data_ptr<int64_t>()));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      offsets.slice(0, 1).copy_(counts.cumsum(0));
    }
  });
  // One host read: the total and the first bad seed.
  const at::Tensor head = at::cat({offsets.slice(0, n, n + 1), first_bad}).cpu();
  const int64_t total = head.data_ptr<int64_t>()[0];
  const int64_t bad = head.data_ptr<int64_t>()[1];
  if (bad < n) {
    const int64_t value = seeds.slice(0, bad, bad + 1).to(at::kLong).cpu().item<int64_t>();
    TORCH_CHECK_INDEX(false, "sample_neighbors: seeds[", bad, "] = ", value,
                      " is out of range for a graph with ", num_nodes, " nodes");
  }

  at::Tensor neighbors = at::empty({total}, indices.options());
  at::Tensor edge_pos = at::empty({total}, long_opts);
  at::Tensor seed_index = at::empty({total}, long_opts);
  if (total > 0) {
    AT_DISPATCH_INDEX_TYPES(seeds.scalar_type(), "sample_neighbors", [&] {
      using seed_t = index_t;
      if (indices.scalar_type() == at::kInt) {
        sample_kernel<seed_t, int32_t><<<blocks_for(n), kWarpsPerBlock * kWarp, 0, stream>>>(
            indptr.data_ptr<int64_t>(), indices.data_ptr<int32_t>(), seeds.data_ptr<seed_t>(),
            order.data_ptr<int64_t>(), n, offsets.data_ptr<int64_t>(), pr, fanout, replace, static_cast<uint64_t>(seed),
            neighbors.data_ptr<int32_t>(), edge_pos.data_ptr<int64_t>(),
            seed_index.data_ptr<int64_t>());
      } else {
        sample_kernel<seed_t, int64_t><<<blocks_for(n), kWarpsPerBlock * kWarp, 0, stream>>>(
            indptr.data_ptr<int64_t>(), indices.data_ptr<int64_t>(), seeds.data_ptr<seed_t>(),
            order.data_ptr<int64_t>(), n, offsets.data_ptr<int64_t>(), pr, fanout, replace, static_cast<uint64_t>(seed),
            neighbors.data_ptr<int64_t>(), edge_pos.data_ptr<int64_t>(),
            seed_index.data_ptr<int64_t>());
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return {offsets, neighbors, edge_pos, seed_index};
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("sample_neighbors", sample_neighbors_cuda);
}

}  // namespace zerocopy
