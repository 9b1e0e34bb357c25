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
}
