// zerocopy::compact_ids on the CPU: the unique ids of cat(seeds, neighbors) in order of first
// appearance, and each neighbour's position in that list, in O(n) parallel work.
//
// A concurrent open-addressing table maps each id to the smallest position where it occurs
// (insert by compare-and-swap of the key, atomic min of the position). Positions that are
// their id's first occurrence are marked; an exclusive prefix sum over the marks numbers the
// unique ids in order of first appearance. The result does not depend on thread count.
// zerocopy::sample_layers compacts each layer with the same code (compact_cpu).

#include "checks.h"
#include "cpu/sampling_cpu.h"
#include "sample_neighbors_args.h"

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

namespace zerocopy {

namespace {

constexpr int64_t kEmpty = -1;

inline uint64_t hash_id(int64_t k) {
  uint64_t z = static_cast<uint64_t>(k) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

struct IdTable {
  // Key and first position side by side: one cache line per probe.
  struct Entry {
    int64_t key;
    int64_t first;  // smallest position of the key
  };
  std::vector<Entry> entries;
  uint64_t mask;

  explicit IdTable(int64_t n) {
    uint64_t cap = 16;
    while (cap < static_cast<uint64_t>(n) * 2) cap <<= 1;
    entries.assign(cap, Entry{kEmpty, std::numeric_limits<int64_t>::max()});
    mask = cap - 1;
  }

  // Slot of `k`, inserting it if absent; thread-safe.
  uint64_t insert(int64_t k) {
    uint64_t h = hash_id(k) & mask;
    while (true) {
      int64_t* key = &entries[h].key;
      int64_t cur = __atomic_load_n(key, __ATOMIC_ACQUIRE);
      if (cur == k) return h;
      if (cur == kEmpty) {
        int64_t expected = kEmpty;
        if (__atomic_compare_exchange_n(key, &expected, k, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
          return h;
        if (expected == k) return h;
      }
      h = (h + 1) & mask;
    }
  }

  void note_position(uint64_t slot, int64_t pos) {
    int64_t* first = &entries[slot].first;
    int64_t cur = __atomic_load_n(first, __ATOMIC_RELAXED);
    while (pos < cur && !__atomic_compare_exchange_n(first, &cur, pos, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
  }
};

template <typename seed_t, typename nbr_t>
std::tuple<at::Tensor, at::Tensor> compact_typed(const at::Tensor& seeds, const at::Tensor& neighbors,
                                                 int64_t* first_repeated_seed) {
  const int64_t ns = seeds.numel();
  const int64_t nn = neighbors.numel();
  const int64_t n = ns + nn;
  const seed_t* sd = seeds.data_ptr<seed_t>();
  const nbr_t* nb = neighbors.data_ptr<nbr_t>();
  auto id_at = [&](int64_t p) -> int64_t {
    return p < ns ? static_cast<int64_t>(sd[p]) : static_cast<int64_t>(nb[p - ns]);
  };
  IdTable table(n);
  constexpr int64_t kGrain = 4096;
  std::atomic<bool> negative{false};
  std::vector<int64_t> slot_of(static_cast<size_t>(n));  // table slot of each position's id
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const int64_t k = id_at(p);
      if (k < 0) {
        negative = true;
        return;
      }
      const uint64_t slot = table.insert(k);
      slot_of[static_cast<size_t>(p)] = static_cast<int64_t>(slot);
      table.note_position(slot, p);
    }
  });
  TORCH_CHECK_VALUE(!negative.load(), "compact_ids: node ids must be >= 0");
  // Mark first occurrences, then number them in position order.
  at::Tensor is_first = at::zeros({n}, seeds.options().dtype(at::kLong));
  int64_t* mark = is_first.data_ptr<int64_t>();
  const int64_t cap = static_cast<int64_t>(table.mask + 1);
  at::parallel_for(0, cap, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; ++s)
      if (table.entries[static_cast<size_t>(s)].key != kEmpty) mark[table.entries[static_cast<size_t>(s)].first] = 1;
  });
  if (first_repeated_seed) {
    // A seed position that is not its id's first occurrence repeats an earlier seed.
    *first_repeated_seed = -1;
    for (int64_t p = 0; p < ns; ++p) {
      if (!mark[p]) {
        *first_repeated_seed = p;
        break;
      }
    }
  }
  const at::Tensor rank = is_first.cumsum(0);  // inclusive: local id of a first occurrence + 1
  const int64_t* rk = rank.data_ptr<int64_t>();
  const int64_t num_unique = n > 0 ? rk[n - 1] : 0;
  at::Tensor nodes = at::empty({num_unique}, seeds.options().dtype(at::kLong));
  at::Tensor local = at::empty({nn}, seeds.options().dtype(at::kLong));
  int64_t* out_nodes = nodes.data_ptr<int64_t>();
  int64_t* out_local = local.data_ptr<int64_t>();
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      if (mark[p]) out_nodes[rk[p] - 1] = id_at(p);
    }
  });
  // A first occurrence's local id is rk - 1; every other position copies it from its id's
  // first occurrence.
  at::parallel_for(ns, n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t p = b; p < e; ++p) {
      const int64_t f = table.entries[static_cast<size_t>(slot_of[static_cast<size_t>(p)])].first;
      out_local[p - ns] = rk[f] - 1;
    }
  });
  return {nodes, local};
}

std::tuple<at::Tensor, at::Tensor> compact_ids_cpu(const at::Tensor& seeds_in, const at::Tensor& neighbors_in) {
  check_compact_ids_args(seeds_in, neighbors_in);
  check_device_type(seeds_in, c10::DeviceType::CPU, "seeds");
  return compact_cpu(seeds_in.contiguous(), neighbors_in.contiguous(), nullptr);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> compact_cpu(const at::Tensor& seeds, const at::Tensor& neighbors,
                                               int64_t* first_repeated_seed) {
  std::tuple<at::Tensor, at::Tensor> out;
  AT_DISPATCH_INDEX_TYPES(seeds.scalar_type(), "compact_ids", [&] {
    using seed_t = index_t;
    if (neighbors.scalar_type() == at::kInt) {
      out = compact_typed<seed_t, int32_t>(seeds, neighbors, first_repeated_seed);
    } else {
      out = compact_typed<seed_t, int64_t>(seeds, neighbors, first_repeated_seed);
    }
  });
  return out;
}

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) {
  m.impl("compact_ids", compact_ids_cpu);
}

}  // namespace zerocopy
