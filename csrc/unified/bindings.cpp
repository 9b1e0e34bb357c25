// Python module pytorch_zerocopy._C: installs the unified backend's hooks and exposes the
// few entry points that are not torch ops (allocation, aliasing, registration accounting).

#include "checks.h"
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
// The trainer's end of a ring slot (pytorch_zerocopy.pipeline.ring): the slot's first `n`
// feature rows and the first sum(cuts) values of its packed tensor, copied into new tensors on
// the current stream (which the caller has made wait for the slot), the packed copy cut into
// views of `cuts` values each. Returns [rows, packed, piece, ...]: the calls the trainer makes
// per minibatch, in one. The copies are the caller's; the slot may be reused once the current
// stream has run them.
std::vector<at::Tensor> copy_out_slot(const at::Tensor& rows, int64_t n, const at::Tensor& packed,
                                      const std::vector<int64_t>& cuts) {
  TORCH_CHECK_VALUE(rows.dim() >= 1, "copy_out_slot: rows must have a row dimension, got shape ", rows.sizes());
  TORCH_CHECK_VALUE(n >= 0 && n <= rows.size(0), "copy_out_slot: n must be in [0, ", rows.size(0),
                    "] (the slot's rows), got ", n);
  zerocopy::check_dim(packed, 1, "copy_out_slot: packed");
  zerocopy::check_dtype(packed, at::kLong, "copy_out_slot: packed");
  zerocopy::check_same_device(rows, "copy_out_slot: rows", packed, "packed");
  int64_t total = 0;
  for (const int64_t c : cuts) {
    TORCH_CHECK_VALUE(c >= 0 && c <= packed.numel() - total, "copy_out_slot: cuts ", c10::IntArrayRef(cuts),
                      " must be >= 0 and add up to at most the slot's packed values (", packed.numel(), ")");
    total += c;
  }
  std::vector<at::Tensor> out;
  out.reserve(cuts.size() + 2);
  out.push_back(rows.narrow(0, 0, n).clone(at::MemoryFormat::Contiguous));
  at::Tensor copied = packed.narrow(0, 0, total).clone(at::MemoryFormat::Contiguous);
  out.push_back(copied);
  for (at::Tensor& piece : copied.split_with_sizes(cuts)) out.push_back(std::move(piece));
  return out;
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
  m.def("copy_out_slot", &copy_out_slot, py::arg("rows"), py::arg("n"), py::arg("packed"), py::arg("cuts"),
        "[rows[:n].clone(), p := packed[:sum(cuts)].clone(), *p.split(cuts)], in one call");
  m.def("registration_stats", []() {
    auto s = zerocopy::registration_stats();
    return std::make_tuple(s.live_pieces, s.live_bytes, s.total_registrations);
  });
}
