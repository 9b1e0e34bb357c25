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
  // blocks_per_sm / unroll tune the CUDA kernel's launch (the caller's plan decides them; the
  // CPU kernel ignores them): blocks_per_sm > 0 runs a persistent grid of that many blocks per
  // SM this process may use (an MPS client sees only its share), leaving the rest of each SM to
  // other work; unroll (4, 8 or 16; 0: 8) is the loads each lane keeps in flight.
  m.def("gather_rows(Tensor table, Tensor index, *, bool index_sorted=False, bool check_bounds=True, "
        "int blocks_per_sm=0, int unroll=0) -> Tensor");
  m.def("gather_rows.out(Tensor table, Tensor index, *, bool index_sorted=False, bool check_bounds=True, "
        "int blocks_per_sm=0, int unroll=0, Tensor(a!) out) -> ()");
  // Row gather through a cache of rows: out[i] = cache[slot_of[index[i]]] where that slot lies
  // in [0, cache rows), else table[index[i]]. cache: [cache rows, width], the table's dtype
  // (GPU memory, with the table unified or in GPU memory; or all on the CPU); slot_of: int32,
  // one entry per table row (-1: not cached). The caller guarantees each cached row equals its
  // table row; a slot outside the cache reads the table. Output in index order, on the cache's
  // device. Index bounds are the table's, checked as gather_rows checks them; the CUDA kernel
  // reads cached and table rows in one sort and one gather, without host synchronisation
  // unless check_bounds.
  m.def("gather_rows_cached(Tensor table, Tensor cache, Tensor slot_of, Tensor index, *, bool check_bounds=True, "
        "int blocks_per_sm=0, int unroll=0) -> Tensor");
  m.def("gather_rows_cached.out(Tensor table, Tensor cache, Tensor slot_of, Tensor index, *, "
        "bool check_bounds=True, int blocks_per_sm=0, int unroll=0, Tensor(a!) out) -> ()");

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
  // A copy of the CPU tensor `src` in CUDA managed memory (cudaMallocManaged) returned as a
  // tensor on cuda:`device`. on_host=False: advised read-mostly on the GPU (pages migrate on
  // first touch), refused when the GPU lacks the free memory to hold it. on_host=True: kept in
  // host memory and mapped for every GPU (reads are zero-copy, nothing migrates), refused when
  // the host cannot back it; returns once the pages are in place. CUDA builds only.
  m.def("managed_copy(Tensor src, int device, bool on_host=False) -> Tensor");
  // An uninitialised managed tensor on cuda:`device` (on_host as managed_copy), for a process
  // that fills a table in place instead of copying one it already holds.
  m.def("managed_empty(int[] size, ScalarType dtype, int device, bool on_host=True) -> Tensor");
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
  // Multi-layer neighbour sampling with compaction, all layers in one call. `fanouts` in the
  // order applied: fanouts[0] is sampled from `seeds` (distinct node ids), fanouts[l] from layer
  // l's frontier; layer l draws with sampling::layer_seed(seed, l). `frontier`
  // (sampling::Frontier, csrc/sampling.h) says which nodes are layer l's frontier for l >= 1:
  //   0  every node of layer l - 1 (DGL's message flow graphs)
  //   1  the nodes first reached in layer l - 1, nodes[l - 1][len(nodes[l - 2]):] (for l = 1,
  //      nodes[0][len(seeds):]): PyG's hops, where a node's neighbours are sampled at most once
  // `eids` (int64, one per position of `indices`, optional) maps a list position to its edge id
  // (absent: the position is the id); `probs` (float32, optional) is indexed by edge id. Per
  // layer l:
  //   nodes[l]  int64 global ids of every node reached up to layer l: nodes[l - 1] (`seeds` for
  //             l = 0) first, in order, then the sampled neighbours it does not hold, in order of
  //             first appearance in (frontier node, draw) order
  //   src[l]    int64 index in nodes[l] of each sampled edge's neighbour
  //   dst[l]    int64 index in nodes[l - 1] (in `seeds` for l = 0) of the frontier node that
  //             sampled the edge
  //   eids[l]   int64 edge id of each sampled edge
  // A node keeps its index in every later layer's nodes, so with frontier 1 nodes[L - 1] is
  // PyG's node list (seeds, then each hop's new nodes) and src/dst are local ids into it.
  // Edges are in (frontier node, draw) order. Every offset pair, neighbour id, edge id and
  // probability visited is checked (IndexError / ValueError naming the argument). On CUDA the
  // whole call makes one host synchronisation (reading every layer's sizes and the error words
  // at the end), plus one per fanout == -1 layer (its size has no bound known in advance).
  m.def("sample_layers(Tensor indptr, Tensor indices, Tensor seeds, int[] fanouts, bool replace, Tensor? probs, "
        "Tensor? eids, int seed, *, int frontier=0) -> (Tensor[] nodes, Tensor[] src, Tensor[] dst, Tensor[] eids)");
  // sample_layers without its synchronisation (CUDA): every output is a buffer of an upper-bound
  // size, and `status` (int64, on the GPU) holds the sizes and error words, to be copied to the
  // host when the work is done and read by sample_layers_check before any output is used:
  // status[0..L] node counts (L = len(fanouts); status[0] = len(seeds), status[l + 1] =
  // len(nodes[l])), status[L + 1 + l] = edges of layer l, then sampling::kNumSampleErrors error
  // words. fanout == -1 layers still synchronise once each.
  m.def("sample_layers_launch(Tensor indptr, Tensor indices, Tensor seeds, int[] fanouts, bool replace, "
        "Tensor? probs, Tensor? eids, int seed, *, int frontier=0) -> (Tensor[] nodes, Tensor[] src, Tensor[] dst, "
        "Tensor[] eids, Tensor status)");
  // Raises the first error recorded in a host copy of sample_layers_launch's `status` (reading
  // the offending values from the call's inputs), else returns status[0 : 2L + 1]: the sizes.
  m.def("sample_layers_check(Tensor status, Tensor indptr, Tensor indices, Tensor seeds, Tensor? probs, "
        "Tensor? eids) -> int[]");

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

  // Dynamic graphs (pytorch_zerocopy.graph.DynamicGraph): adjacency lists in pages of
  // `page_size` slots; layout, page order and the free-page queue in csrc/dynamic_graph.h.
  // State: pool (ids' dtype, pages * page_size slots), weights (float32/int32 per slot, or
  // None), per vertex id root (ids' dtype), height (int8) and degree (int64), per page
  // page_owner (ids' dtype) and page_rank (int32), page_ring (ids' dtype, the free-page queue)
  // and meta (int64 [head, tail, fresh]). Every tensor on one device; the pool and weights may
  // be unified tensors. A batch is a set of runs: `vertices` (int64) and offsets (int64,
  // len(vertices) + 1) delimiting each vertex's slice of an int64 per-entry array. The mutating
  // ops check the batch's contents first and write nothing when they raise.
  //
  // Appends run_dst[offsets[r]:offsets[r+1]] (with run_weights) to the list of vertices[r], in
  // that order. vertices strictly ascending, run_dst (int32 or int64) valid vertex ids; raises
  // when the pool lacks the pages (tree_pages(new degree) - tree_pages(old degree) per vertex).
  m.def("dynamic_graph_append(Tensor(a!) pool, Tensor(b!)? weights, Tensor(c!) root, Tensor(d!) height, "
        "Tensor(e!) degree, Tensor(f!) page_owner, Tensor(g!) page_rank, Tensor(h!) page_ring, Tensor(i!) meta, "
        "Tensor vertices, Tensor run_offsets, Tensor run_dst, Tensor? run_weights, int page_size) -> ()");
  // found[j]: whether run_dst[j] is in the list of its run's vertex. Each run's destinations
  // ascending; of a destination repeated in a run only the first copy is marked.
  m.def("dynamic_graph_contains(Tensor pool, Tensor root, Tensor height, Tensor degree, Tensor vertices, "
        "Tensor run_offsets, Tensor run_dst, int page_size) -> Tensor");
  // The list positions holding any of each run's (ascending) destinations: positions
  // [pos_offsets[r], pos_offsets[r+1]) belong to vertices[r], ascending.
  m.def("dynamic_graph_find(Tensor pool, Tensor root, Tensor height, Tensor degree, Tensor vertices, "
        "Tensor run_offsets, Tensor run_dst, int page_size) -> (Tensor pos_offsets, Tensor positions)");
  // Every (vertex, position) whose vertex or destination is marked in `mask` (bool per vertex
  // id), sorted by vertex then position: the edges a vertex deletion removes.
  m.def("dynamic_graph_find_touching(Tensor pool, Tensor root, Tensor height, Tensor degree, Tensor page_owner, "
        "Tensor page_rank, Tensor meta, Tensor mask, int page_size) -> (Tensor vertices, Tensor positions)");
  // The list positions of vertices[r] (strictly ascending) holding an id marked in `mask`
  // (bool per vertex id), or every position when vertices[r] is itself marked: positions
  // [pos_offsets[r], pos_offsets[r+1]) belong to vertices[r], ascending. What a vertex deletion
  // removes from the lists named by its in-edges, without a sweep.
  m.def("dynamic_graph_find_marked(Tensor pool, Tensor root, Tensor height, Tensor degree, Tensor vertices, "
        "Tensor mask, int page_size) -> (Tensor pos_offsets, Tensor positions)");
  // The pages (data and index) that appending run_offsets[r+1] - run_offsets[r] entries to the
  // list of each vertices[r] takes, summed (int64, 0-dim, on degree's device): what an append
  // of that batch needs free. A run whose vertex is out of range or whose count is negative
  // counts 0 (append's content check reports it).
  m.def("dynamic_graph_pages_needed(Tensor degree, Tensor vertices, Tensor run_offsets, int page_size) -> Tensor");
  // Bool per vertex id: whether the id is an entry of the list of any of `vertices` (strictly
  // ascending). The lists that hold an edge into a deleted vertex, read from its own list (a
  // symmetric graph) or from its in-edge index list.
  m.def("dynamic_graph_mark_neighbours(Tensor pool, Tensor root, Tensor height, Tensor degree, Tensor vertices, "
        "int page_size) -> Tensor");
  // Deletes the list positions positions[pos_offsets[r]:pos_offsets[r+1]] (distinct,
  // ascending) of vertices[r] (strictly ascending), moving the list's tail into the holes, and
  // returns pages left empty to the free-page queue.
  m.def("dynamic_graph_remove(Tensor(a!) pool, Tensor(b!)? weights, Tensor(c!) root, Tensor(d!) height, "
        "Tensor(e!) degree, Tensor(f!) page_owner, Tensor(g!) page_rank, Tensor(h!) page_ring, Tensor(i!) meta, "
        "Tensor vertices, Tensor pos_offsets, Tensor positions, int page_size) -> ()");
  // Empties the lists of vertices (strictly ascending): every page of each goes back to the
  // free-page queue; returns the number of entries removed (an int64 scalar on the CPU, known
  // to the host without waiting for the GPU).
  m.def("dynamic_graph_clear(Tensor pool, Tensor(a!) root, Tensor(b!) height, Tensor(c!) degree, "
        "Tensor(d!) page_owner, Tensor(e!) page_rank, Tensor(f!) page_ring, Tensor(g!) meta, Tensor vertices, "
        "int page_size) -> Tensor");
  // The CSR snapshot: indptr = [0, cumsum(degree)] (int64), the column ids in list order (ids'
  // dtype), their weights (empty without weights) and, with `with_slots`, each entry's pool slot
  // (int64; empty otherwise).
  m.def("dynamic_graph_to_csr(Tensor pool, Tensor? weights, Tensor root, Tensor height, Tensor degree, "
        "Tensor page_owner, Tensor page_rank, Tensor meta, int page_size, bool with_slots) "
        "-> (Tensor indptr, Tensor indices, Tensor weights_out, Tensor slots)");
  // sample_neighbors (uniform, csrc/sampling.h) over the paged lists: the same offsets,
  // neighbours and seed indices as sample_neighbors on the to_csr snapshot for the same seed;
  // the third output holds pool slots instead of CSR positions.
  m.def("dynamic_graph_sample(Tensor pool, Tensor root, Tensor height, Tensor degree, Tensor seeds, int fanout, "
        "bool replace, int seed, int page_size) -> (Tensor, Tensor, Tensor, Tensor)");
  // sample_layers (uniform) over the paged lists: the same nodes, src and dst per layer as
  // sample_layers on the to_csr snapshot for the same seed; eids hold pool slots. On the GPU, one
  // host synchronisation per call (as sample_layers).
  m.def("dynamic_graph_sample_layers(Tensor pool, Tensor root, Tensor height, Tensor degree, Tensor seeds, "
        "int[] fanouts, bool replace, int seed, int page_size) -> (Tensor[] nodes, Tensor[] src, Tensor[] dst, "
        "Tensor[] eids)");
  // graph_bfs over the paged lists: depth (int32, -1 unreachable), pred (ids' dtype; empty
  // unless asked) and stats (int64 [edges_scanned, levels]). On the CPU, lists are walked in
  // order, so pred equals graph_bfs's on the snapshot.
  m.def("dynamic_graph_bfs(Tensor pool, Tensor root, Tensor height, Tensor degree, Tensor page_owner, "
        "Tensor page_rank, Tensor meta, int source, bool predecessors, int page_size) "
        "-> (Tensor depth, Tensor pred, Tensor stats)");
}
