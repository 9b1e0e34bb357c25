// Paged adjacency of pytorch_zerocopy.graph.DynamicGraph: the layout and the per-item steps that
// the CPU and CUDA kernels share, so both build exactly the same pages from the same batch.
//
// Pool. Adjacency lives in fixed-size pages of C = 2^s slots (`page_size`), cut from one pool
// tensor (`pool[page * C + slot]`, the ids' dtype; an optional `weights` tensor of the same
// shape holds edge weights in the same slots). A page is either a data page (C neighbour ids)
// or an index page (C page ids), so one pool and one free-page queue serve both.
//
// A vertex's list is a radix tree of pages (faimGraph's pages, with the linked list replaced by
// a page table so that position k of any list is O(log_C degree) loads away, which sampling
// needs): with d entries there are L = ceil(d / C) data pages, the tree's height h is 0 when
// L <= 1, else the smallest h with C^h >= L, and level l (0 = data) holds
// n_l = ceil(L / C^l) nodes (l <= h). Node (l, i) is one page; for l >= 1 its slot k holds the
// page of child (l - 1, i * C + k). The root is node (h, 0); `root[v]` is -1 when d == 0.
// Entry k of the list is slot k % C of data page k / C. The tree is always this canonical,
// left-packed shape, so the trees of two degrees d0 < d1 of one vertex are nested: the nodes of
// tree(d0) are nodes of tree(d1) with the same (l, i), and growing or shrinking a list touches
// only the difference, whose size is tree_pages(d1) - tree_pages(d0).
//
// Per-page tables: `page_owner[p]` is the vertex owning page p (-1 when free), `page_rank[p]`
// is i for data page (0, i) and -l for an index page of level l. They make a sweep over all
// pages (snapshot, BFS, in-edge deletion) balanced by construction.
//
// Free pages. `page_ring` is a ring of free page ids (capacity = number of pages), with
// `meta = [head, tail, fresh]` on the ops' device: ring[head % P .. tail % P) are free pages
// to reuse first, and pages [fresh, P) have never been used. A batch takes pages by tickets:
// ticket x < queued (= tail - head) is ring[(head + x) % P], otherwise page fresh + x - queued.
// Each vertex's changes get a contiguous range of tickets from a prefix sum, and within a
// vertex the nodes are numbered in a fixed order (growth: levels top-down, index ascending;
// shrink: levels bottom-up, index ascending), so page assignment is deterministic and the CPU
// and CUDA kernels produce identical pools. Freed pages are appended at the tail in the same
// fashion. This is the Ouroboros/faimGraph index queue applied a batch at a time: the
// per-thread atomics on head and tail become one prefix sum, which also lets a batch check,
// before it writes anything, that the pool holds enough pages.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define ZC_DG_HD __host__ __device__ __forceinline__
#else
#define ZC_DG_HD inline
#endif

namespace zerocopy {
namespace dyngraph {

// Index of the meta entries.
constexpr int kHead = 0;
constexpr int kTail = 1;
constexpr int kFresh = 2;
constexpr int kMetaSize = 3;

// Page sizes accepted: powers of two in [kMinPageShift, kMaxPageShift].
constexpr int kMinPageShift = 2;
constexpr int kMaxPageShift = 12;

ZC_DG_HD int64_t ceil_shift(int64_t x, int s) { return (x + (int64_t(1) << s) - 1) >> s; }

// Shape of the tree holding d entries.
struct TreeShape {
  int64_t leaves;  // L, data pages
  int height;      // h
};

ZC_DG_HD TreeShape tree_shape(int64_t d, int s) {
  TreeShape t{ceil_shift(d, s), 0};
  for (int64_t n = t.leaves; n > 1; n = ceil_shift(n, s)) ++t.height;
  return t;
}

// n_l: nodes at level l (0 above the root or for an empty tree).
ZC_DG_HD int64_t level_nodes(TreeShape t, int l, int s) {
  if (t.leaves == 0 || l > t.height) return 0;
  int64_t n = t.leaves;
  for (int k = 0; k < l; ++k) n = ceil_shift(n, s);
  return n;
}

// Pages (data and index) of the tree holding d entries.
ZC_DG_HD int64_t tree_pages(int64_t d, int s) {
  const TreeShape t = tree_shape(d, s);
  int64_t total = 0;
  int64_t n = t.leaves;
  for (int l = 0; n > 0 && l <= t.height; ++l) {
    total += n;
    n = ceil_shift(n, s);
  }
  return total;
}

struct Node {
  int level;
  int64_t index;
};

// The t-th node of tree(big) that is not in tree(small), in growth order (levels top-down,
// index ascending). t < tree_pages(big) - tree_pages(small).
ZC_DG_HD Node grown_node(TreeShape small, TreeShape big, int64_t t, int s) {
  for (int l = big.height; l >= 0; --l) {
    const int64_t lo = level_nodes(small, l, s);
    const int64_t n = level_nodes(big, l, s) - lo;
    if (t < n) return Node{l, lo + t};
    t -= n;
  }
  return Node{-1, -1};
}

// The number of node (level, index) of tree(big) \ tree(small) in growth order.
ZC_DG_HD int64_t grown_number(TreeShape small, TreeShape big, int level, int64_t index, int s) {
  int64_t t = 0;
  for (int l = big.height; l > level; --l) t += level_nodes(big, l, s) - level_nodes(small, l, s);
  return t + index - level_nodes(small, level, s);
}

// The t-th node of tree(big) that is not in tree(small), in shrink order (levels bottom-up,
// index ascending).
ZC_DG_HD Node shrunk_node(TreeShape small, TreeShape big, int64_t t, int s) {
  for (int l = 0; l <= big.height; ++l) {
    const int64_t lo = level_nodes(small, l, s);
    const int64_t n = level_nodes(big, l, s) - lo;
    if (t < n) return Node{l, lo + t};
    t -= n;
  }
  return Node{-1, -1};
}

// The page of node (level, index) in the tree rooted at `root` of height h.
template <typename idx_t>
ZC_DG_HD int64_t node_page(const idx_t* pool, int64_t root, int h, int level, int64_t index, int s) {
  int64_t p = root;
  const int64_t mask = (int64_t(1) << s) - 1;
  for (int lev = h; lev > level; --lev) {
    const int64_t child = index >> (s * (lev - 1 - level));
    p = static_cast<int64_t>(pool[(p << s) + (child & mask)]);
  }
  return p;
}

// The pool slot of entry `pos` of the list rooted at `root` (height h).
template <typename idx_t>
ZC_DG_HD int64_t entry_slot(const idx_t* pool, int64_t root, int h, int64_t pos, int s) {
  return (node_page(pool, root, h, 0, pos >> s, s) << s) + (pos & ((int64_t(1) << s) - 1));
}

// Page of allocation ticket x (see the file comment).
template <typename idx_t>
struct Tickets {
  const idx_t* ring;
  int64_t num_pages;
  int64_t head;
  int64_t queued;
  int64_t fresh;
  ZC_DG_HD int64_t page(int64_t x) const {
    return x < queued ? static_cast<int64_t>(ring[(head + x) % num_pages]) : fresh + (x - queued);
  }
};

// Growth item t of vertex v, whose list grows from d0 to d1 entries and whose new pages are
// tickets base .. base + (tree_pages(d1) - tree_pages(d0)): takes the page, records its owner
// and links it into its parent (a new page, or a node of the old tree read from `root0`). The
// old root, when the tree gets taller, becomes child 0 of the new node above it. Reads only
// old nodes and writes only slots of new children, so all items of a batch may run at once.
// root/height/degree are updated afterwards (grown_root).
template <typename idx_t>
ZC_DG_HD void grow_item(idx_t* pool, idx_t* page_owner, int32_t* page_rank, const Tickets<idx_t>& tickets,
                        int64_t v, int64_t root0, int64_t d0, int64_t d1, int64_t base, int64_t t, int s) {
  const TreeShape a = tree_shape(d0, s), b = tree_shape(d1, s);
  const Node n = grown_node(a, b, t, s);
  const int64_t page = tickets.page(base + t);
  const int64_t mask = (int64_t(1) << s) - 1;
  page_owner[page] = static_cast<idx_t>(v);
  page_rank[page] = n.level == 0 ? static_cast<int32_t>(n.index) : -n.level;
  if (n.level < b.height) {
    const int pl = n.level + 1;
    const int64_t pi = n.index >> s;
    const int64_t parent = pi >= level_nodes(a, pl, s)
                               ? tickets.page(base + grown_number(a, b, pl, pi, s))
                               : node_page(pool, root0, a.height, pl, pi, s);
    pool[(parent << s) + (n.index & mask)] = static_cast<idx_t>(page);
  }
  if (a.leaves > 0 && n.level == a.height + 1 && n.index == 0) pool[page << s] = static_cast<idx_t>(root0);
}

// The root after grow_item has run for every item of the vertex (d1 >= d0).
template <typename idx_t>
ZC_DG_HD int64_t grown_root(const Tickets<idx_t>& tickets, int64_t root0, int64_t d0, int64_t d1, int64_t base,
                            int s) {
  if (d1 == d0) return root0;
  const TreeShape a = tree_shape(d0, s), b = tree_shape(d1, s);
  return (a.leaves == 0 || b.height > a.height) ? tickets.page(base) : root0;
}

// Shrink item t of vertex v, whose list shrinks from d0 to d1 entries: the page of the t-th
// node of tree(d0) \ tree(d1) goes to ring slot (tail + base + t) % num_pages. Reads only.
template <typename idx_t>
ZC_DG_HD void shrink_item(const idx_t* pool, idx_t* page_owner, int32_t* page_rank, idx_t* ring, int64_t num_pages,
                          int64_t tail, int64_t root0, int64_t d0, int64_t d1, int64_t base, int64_t t, int s) {
  const TreeShape big = tree_shape(d0, s), small = tree_shape(d1, s);
  const Node n = shrunk_node(small, big, t, s);
  const int64_t page = node_page(pool, root0, big.height, n.level, n.index, s);
  ring[(tail + base + t) % num_pages] = static_cast<idx_t>(page);
  page_owner[page] = static_cast<idx_t>(-1);
  page_rank[page] = -1;
}

// The root after shrinking from d0 to d1 entries: node (h1, 0) of the old tree, -1 when empty.
template <typename idx_t>
ZC_DG_HD int64_t shrunk_root(const idx_t* pool, int64_t root0, int64_t d0, int64_t d1, int s) {
  if (d1 == 0) return -1;
  return node_page(pool, root0, tree_shape(d0, s).height, tree_shape(d1, s).height, 0, s);
}

// Data pages touched when entries [d0, d1) are appended: pages d0 / C .. (d1 - 1) / C.
ZC_DG_HD int64_t appended_chunks(int64_t d0, int64_t d1, int s) {
  return d1 > d0 ? ((d1 - 1) >> s) - (d0 >> s) + 1 : 0;
}

// Compaction after deleting the (ascending, distinct) list positions holes[0 .. h) of a list
// of d0 entries: the list keeps d1 = d0 - h entries; every hole below d1 is filled, in
// ascending order, by the surviving entries at or above d1, in ascending order (the tail moves
// into the holes, faimGraph's compaction). Tail position p = d1 + k (k < h) moves to the
// returned position, or stays (-1) when p is itself a hole.
template <typename pos_t>
ZC_DG_HD int64_t compaction_target(const pos_t* holes, int64_t h, int64_t d1, int64_t k) {
  const int64_t p = d1 + k;
  // lower_bound of d1 and of p in holes.
  int64_t lo = 0, hi = h;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int64_t>(holes[mid]) < d1) lo = mid + 1; else hi = mid;
  }
  const int64_t below = lo;
  hi = h;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int64_t>(holes[mid]) < p) lo = mid + 1; else hi = mid;
  }
  if (lo < h && static_cast<int64_t>(holes[lo]) == p) return -1;
  const int64_t rank = k - (lo - below);
  return static_cast<int64_t>(holes[rank]);
}

// Index of the group holding flat item t, for ascending offsets[0 .. n] (offsets[0] = 0):
// the last g with offsets[g] <= t.
ZC_DG_HD int64_t group_of(const int64_t* offsets, int64_t n, int64_t t) {
  int64_t lo = 0, hi = n;  // answer in [0, n)
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (offsets[mid] <= t) lo = mid; else hi = mid;
  }
  return lo;
}

// The position of the first x in the ascending values[lo .. end), or -1 when absent.
template <typename T>
ZC_DG_HD int64_t sorted_find(const T* values, int64_t lo, int64_t end, int64_t x) {
  int64_t hi = end;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int64_t>(values[mid]) < x) lo = mid + 1; else hi = mid;
  }
  return (lo < end && static_cast<int64_t>(values[lo]) == x) ? lo : -1;
}

}  // namespace dyngraph
}  // namespace zerocopy
