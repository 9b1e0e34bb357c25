// Python module pytorch_zerocopy._C: installs the unified backend's hooks and exposes the
// few entry points that are not torch ops (allocation, aliasing, registration accounting).

#include "unified/host_mapper.h"
#include "unified/host_memory.h"
#include "unified/registration.h"
#include "unified/unified_tensor.h"

#include <ATen/Parallel.h>
#include <torch/extension.h>

#include <mutex>
#include <set>

namespace zerocopy {
void register_unified_hooks();
}

namespace {
std::string build_flavour() { return zerocopy::host_mapper() != nullptr ? "cuda" : "cpu"; }

// How many intra-op threads an at::parallel_for of `n` unit tasks really ran on, compiled
// here: this package's CPU kernels fan out through the same header code, so this shows
// whether they run multithreaded (a build without OpenMP silently runs them on one thread).
int64_t parallel_for_threads(int64_t n) {
  std::mutex mutex;
  std::set<int> seen;
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    volatile double sink = 0;  // enough work per task for the team to spread out
    for (int64_t i = begin; i < end; ++i)
      for (int k = 0; k < 200000; ++k) sink = sink + k;
    const std::lock_guard<std::mutex> lock(mutex);
    seen.insert(at::get_thread_num());
  });
  return static_cast<int64_t>(seen.size());
}
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
  m.def("parallel_for_threads", &parallel_for_threads,
        "Distinct threads an at::parallel_for of n tasks ran on (checks the OpenMP build)");
  m.def("available_host_memory", []() {
    const auto m = zerocopy::available_host_memory();
    return std::make_tuple(m.available, m.source);
  }, "(bytes, source): host memory a new allocation may still use");
  m.def("require_host_memory", &zerocopy::require_host_memory, py::arg("nbytes"), py::arg("what"), py::arg("hint"),
        "Raises torch.OutOfMemoryError, saying what `what` would cost, when nbytes exceed the available memory");
  m.def("registration_stats", []() {
    auto s = zerocopy::registration_stats();
    return std::make_tuple(s.live_pieces, s.live_bytes, s.total_registrations);
  });
}
