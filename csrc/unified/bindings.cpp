// Python module pytorch_zerocopy._C: installs the unified backend's hooks and exposes the
// few entry points that are not torch ops (allocation, aliasing, registration accounting).

#include "unified/host_mapper.h"
#include "unified/registration.h"
#include "unified/unified_tensor.h"

#include <torch/extension.h>

namespace zerocopy {
void register_unified_hooks();
}

namespace {
std::string build_flavour() { return zerocopy::host_mapper() != nullptr ? "cuda" : "cpu"; }
}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CompositeExplicitAutograd, m) {
  m.impl("build_flavour", build_flavour);
}

PYBIND11_MODULE(_C, m) {
  zerocopy::register_unified_hooks();
  m.doc() = "pytorch_zerocopy compiled core";
  m.def("build_flavour", &build_flavour, "'cuda' for a CUDA build, 'cpu' for a CPU-only build");
  m.def("gpu_backed", &zerocopy::gpu_backed,
        "True when unified tensors are served by a GPU (CUDA build and a visible GPU)");
  m.def("host_alias", &zerocopy::host_alias, "The CPU tensor over a unified tensor's bytes (no copy)");
  m.def("device_alias", &zerocopy::device_alias,
        "A tensor over a unified tensor's bytes on the given device (no copy)");
  m.def(
      "unified_from_cpu",
      [](const at::Tensor& cpu, int index) { return zerocopy::unified_from_cpu(cpu, static_cast<c10::DeviceIndex>(index)); },
      "The unified tensor over a CPU tensor's bytes, registered in place");
  m.def(
      "empty_unified",
      [](std::vector<int64_t> sizes, at::ScalarType dtype, int index) {
        return zerocopy::empty_unified(sizes, c10::contiguous_strides(sizes), dtype,
                                       static_cast<c10::DeviceIndex>(index));
      },
      "A new contiguous unified tensor in shared host memory");
  m.def("registration_stats", []() {
    auto s = zerocopy::registration_stats();
    return std::make_tuple(s.live_pieces, s.live_bytes, s.total_registrations);
  });
}
