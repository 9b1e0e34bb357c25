// Every op schema of the `zerocopy` namespace. Device files (csrc/cpu, csrc/cuda) only
// register implementations; Python wrappers and fake kernels live in pytorch_zerocopy/ops.py
// and the graph/ subpackage.

#include <torch/library.h>

TORCH_LIBRARY(zerocopy, m) {
  // Marker op: lets Python confirm the compiled library is loaded and which build it is.
  m.def("build_flavour() -> str");
}
