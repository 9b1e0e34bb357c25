// Every op schema of the `zerocopy` namespace. Device files (csrc/cpu, csrc/cuda) only
// register implementations; Python wrappers and fake kernels live in pytorch_zerocopy/ops.py
// and beside the modules that use them (graph/, sampling.py).

#include <torch/library.h>

TORCH_LIBRARY(zerocopy, m) {
  // Marker op: lets Python confirm the compiled library is loaded and which build it is.
  m.def("build_flavour() -> str");

  // Row gather: out[i] = table[index[i]] for a 2-D table (CPU, CUDA, or unified: host memory
  // read in place by the GPU). index: int32/int64, 1-D, any length, duplicates allowed.
  // Output in the caller's index order. Out-of-range or negative indices never read memory;
  // with check_bounds they raise IndexError naming the first bad one (one small device-to-host
  // read on CUDA), without it their rows are zero-filled. index_sorted=True promises ascending
  // order, so the CUDA kernel skips the sort that restores address-order locality.
  // The .out overload writes a caller-provided tensor and returns nothing (a mutable custom op
  // that returns its argument cannot be functionalized, so torch.compile could not trace it).
  m.def("gather_rows(Tensor table, Tensor index, *, bool index_sorted=False, bool check_bounds=True) -> Tensor");
  m.def("gather_rows.out(Tensor table, Tensor index, *, bool index_sorted=False, bool check_bounds=True, "
        "Tensor(a!) out) -> ()");

  // Graph traversal over a CSR graph (pytorch_zerocopy/graph). `indptr` is int64 row offsets
  // (length num_nodes + 1), `indices` int32/int64 column ids, `weights` float32/int32 edge
  // weights (None: unit weights). `variant` (csrc/traversal_checks.h says which op takes which):
  // 0 naive (thread per vertex), 1 merged (warp per vertex), 2 aligned (merged + 128-byte-aligned
  // start), 3 frontier (a queue of active vertices for bfs/sssp; sampled union-find for cc; an
  // edge-balanced streaming sweep for pagerank), 4 direction (bfs: bottom-up steps over the
  // in-neighbour lists), 5 async (bfs/sssp/pagerank: one persistent kernel over a device
  // worklist), 6 push (pagerank: residual push), 7 staged (cc: the edge list streamed through GPU
  // memory by DMA). Every op also returns `stats`, int64 [edges_read, iterations], on the device
  // where it ran. The ops trust the offsets (CSRGraph validates them once); sizes, dtypes,
  // devices and `source` are checked.
  // bfs `in_indptr`/`in_indices`: the in-neighbour lists (the transpose) that the direction
  // variant reads in bottom-up steps; required by it, checked and ignored by the others.
  m.def("graph_bfs(Tensor indptr, Tensor indices, int source, int variant, bool predecessors, "
        "Tensor? in_indptr=None, Tensor? in_indices=None) -> (Tensor depth, Tensor pred, Tensor stats)");
  // sssp `delta`: bucket width of the frontier variant's near-far worklist (<= 0: chosen from
  // the mean weight and degree); the other variants and the CPU ignore it.
  m.def("graph_sssp(Tensor indptr, Tensor indices, Tensor? weights, int source, int variant, "
        "float delta=0.0) -> (Tensor dist, Tensor stats)");
  // `symmetric`: every edge has its reverse, so each pair need only be united from one end.
  // `chunk_edges`: edges per GPU-memory chunk of the staged variant (0: 2^26); others ignore it.
  m.def("graph_connected_components(Tensor indptr, Tensor indices, int variant, bool symmetric=False, "
        "int chunk_edges=0) -> (Tensor labels, Tensor stats)");
  // `tol` bounds the L1 distance of the result to the exact PageRank (traversal_checks.h);
  // `max_iter` caps the iterations (push: rounds; async: edge work, in passes over the edges).
  m.def("graph_pagerank(Tensor indptr, Tensor indices, float alpha, float tol, int max_iter, "
        "int variant) -> (Tensor rank, Tensor stats)");
  // A copy of the CPU tensor `src` in CUDA managed memory (cudaMallocManaged, advised
  // read-mostly) returned as a tensor on cuda:`device`; refused when the GPU lacks the free
  // memory to hold it. CUDA builds only.
  m.def("managed_copy(Tensor src, int device) -> Tensor");
  // Makes a managed tensor cold again without re-allocating it: collapses the GPU's read-only
  // copies, moves every page back to host memory and re-advises read-mostly, so the next GPU
  // pass faults its pages in as a fresh allocation would.
  m.def("managed_evict(Tensor t) -> ()");

  // Neighbour sampling over one adjacency (CSR: out-neighbours, CSC: in-neighbours) for a
  // batch of seed nodes; see csrc/sampling.h for what is sampled. Returns per-seed offsets
  // (int64, seeds+1), the sampled neighbour ids (indices' dtype), their positions in `indices`
  // (int64 edge positions) and, per sampled edge, the index of its seed in `seeds` (int64).
  m.def("sample_neighbors(Tensor indptr, Tensor indices, Tensor seeds, int fanout, bool replace, "
        "Tensor? probs, int seed) -> (Tensor, Tensor, Tensor, Tensor)");
  // The unique ids of cat(seeds, neighbors) in order of first appearance (int64), and the
  // position of each neighbour in that list (int64): a message flow graph's compaction.
  m.def("compact_ids(Tensor seeds, Tensor neighbors) -> (Tensor, Tensor)");

  // GraphSAGE's mean aggregation over a sampled block, fused: out[d] = mean of h_src[src[e]]
  // over the edges e with dst[e] == d (a zero row where d has no edge). h_src: floating
  // [n_src, F]; src, dst: int32/int64 [E], local ids, any order, duplicates allowed; every
  // tensor on one device. inv_deg ([n_dst]; float32, float64 for float64 h_src) is
  // 1 / max(in-degree, 1), what backward needs. The CPU raises IndexError for an id out of
  // range; the CUDA kernels, which never synchronise, skip such an edge (never reading or
  // writing out of bounds): validate ids where blocks are made
  // (pytorch_zerocopy.ops.block_mean(check_ids=True) does it with one sync).
  // Differentiable in h_src (a C++ autograd kernel; block_mean_backward is its backward).
  m.def("block_mean(Tensor h_src, Tensor src, Tensor dst, int n_dst) -> (Tensor out, Tensor inv_deg)");
  // grad_h_src[s] = sum over edges e with src[e] == s of grad_out[dst[e]] * inv_deg[dst[e]].
  m.def("block_mean_backward(Tensor grad_out, Tensor src, Tensor dst, Tensor inv_deg, int n_src) -> Tensor");
}
