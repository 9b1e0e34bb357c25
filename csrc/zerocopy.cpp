// Every op schema of the `zerocopy` namespace. Device files (csrc/cpu, csrc/cuda) only
// register implementations; Python wrappers and fake kernels live in pytorch_zerocopy/ops.py
// and the graph/ subpackage.

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

  // Neighbour sampling over one adjacency (CSR: out-neighbours, CSC: in-neighbours) for a
  // batch of seed nodes; see csrc/sampling.h for what is sampled. Returns per-seed offsets
  // (int64, seeds+1), the sampled neighbour ids (indices' dtype), their positions in `indices`
  // (int64 edge positions) and, per sampled edge, the index of its seed in `seeds` (int64).
  m.def("sample_neighbors(Tensor indptr, Tensor indices, Tensor seeds, int fanout, bool replace, "
        "Tensor? probs, int seed) -> (Tensor, Tensor, Tensor, Tensor)");
  // The unique ids of cat(seeds, neighbors) in order of first appearance (int64), and the
  // position of each neighbour in that list (int64): a message flow graph's compaction.
  m.def("compact_ids(Tensor seeds, Tensor neighbors) -> (Tensor, Tensor)");
}
