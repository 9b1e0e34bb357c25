// CUDA managed memory, two ways: advised read-mostly on a GPU (EMOGI's UVM configuration, the
// baseline; pages migrate on first touch), with a way to make such a tensor cold again; or kept
// in host memory (preferred location: the CPU; every GPU maps it and reads it in place, nothing
// migrates), a private zero-copy table the GPU's page tables map at the driver's managed-memory
// granularity rather than a registered mapping's.
//
// Lifetime: the tensor owns the allocation; its deleter calls cudaFree, which waits for work
// on the device, so the memory never disappears under a running kernel.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <algorithm>
#include <string>

#include "checks.h"
#include "unified/host_memory.h"

namespace zerocopy {
namespace {

cudaMemLocation device_location(int device) {
  cudaMemLocation loc{};
  loc.type = cudaMemLocationTypeDevice;
  loc.id = device;
  return loc;
}

cudaMemLocation host_location() {
  cudaMemLocation loc{};
  loc.type = cudaMemLocationTypeHost;
  loc.id = 0;
  return loc;
}

void free_managed(void* ptr) {
  // A deleter must not throw; a failure here means the context is already gone.
  (void)cudaFree(ptr);
}

// Pins the pages of [ptr, ptr + nbytes) to host memory and maps them for every GPU, so GPU
// reads are served from host memory in place (no fault, no migration). Synchronises `stream`.
void keep_on_host(void* ptr, size_t nbytes, cudaStream_t stream) {
  C10_CUDA_CHECK(cudaMemAdvise(ptr, nbytes, cudaMemAdviseSetPreferredLocation, host_location()));
  for (int d = 0; d < c10::cuda::device_count(); ++d) {
    C10_CUDA_CHECK(cudaMemAdvise(ptr, nbytes, cudaMemAdviseSetAccessedBy, device_location(d)));
  }
  C10_CUDA_CHECK(cudaMemPrefetchAsync(ptr, nbytes, host_location(), 0, stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
}

// nbytes (> 0) of managed memory for `device`. on_host: kept in host memory (keep_on_host), so
// it is refused when the host cannot back it; else refused when the GPU has less free memory.
void* allocate_managed(size_t nbytes, int64_t device, bool on_host, const char* op) {
  if (on_host) {
    require_host_memory(nbytes, std::string(op) + ": managed memory kept in host memory",
                        "use the table mapped in place (Placement.MAPPED), which makes no copy");
  } else {
    size_t free_bytes = 0, total_bytes = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    TORCH_CHECK(nbytes <= free_bytes, op, ": ", nbytes, " bytes of managed memory were asked for, but GPU ", device,
                " has only ", free_bytes, " bytes free (of ", total_bytes,
                "); managed memory is never allocated beyond what the GPU has free. Free GPU memory "
                "(e.g. torch.cuda.empty_cache()) or use a smaller graph.");
  }
  void* ptr = nullptr;
  C10_CUDA_CHECK(cudaMallocManaged(&ptr, std::max<size_t>(nbytes, 1), cudaMemAttachGlobal));
  return ptr;
}

void check_device_index(int64_t device, const char* op) {
  TORCH_CHECK_INDEX(device >= 0 && device < c10::cuda::device_count(), op, ": device must be in [0, ",
                    static_cast<int>(c10::cuda::device_count()), "), got ", device);
}

at::Tensor managed_tensor(void* ptr, at::IntArrayRef sizes, const at::TensorOptions& options, int64_t device) {
  return at::from_blob(ptr, sizes, free_managed,
                       options.device(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device))));
}

at::Tensor managed_empty(at::IntArrayRef sizes, at::ScalarType dtype, int64_t device, bool on_host) {
  check_device_index(device, "managed_empty");
  for (const int64_t s : sizes) TORCH_CHECK_VALUE(s >= 0, "managed_empty: negative dimension in ", sizes);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const size_t nbytes = static_cast<size_t>(c10::multiply_integers(sizes)) * c10::elementSize(dtype);
  void* ptr = allocate_managed(nbytes, device, on_host, "managed_empty");
  try {
    if (nbytes > 0 && on_host) {
      keep_on_host(ptr, nbytes, c10::cuda::getCurrentCUDAStream());
    } else if (nbytes > 0) {
      C10_CUDA_CHECK(cudaMemAdvise(ptr, nbytes, cudaMemAdviseSetReadMostly, device_location(static_cast<int>(device))));
    }
  } catch (...) {
    free_managed(ptr);
    throw;
  }
  return managed_tensor(ptr, sizes, at::TensorOptions().dtype(dtype), device);
}

at::Tensor managed_copy(const at::Tensor& src_in, int64_t device, bool on_host) {
  check_device_type(src_in, c10::kCPU, "src");
  check_device_index(device, "managed_copy");
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  // Sized before anything is copied, so a request the machine cannot back is refused first.
  const size_t nbytes = static_cast<size_t>(src_in.numel()) * src_in.itemsize();
  const at::Tensor src = src_in.contiguous();
  void* ptr = allocate_managed(nbytes, device, on_host, "managed_copy");
  try {
    if (nbytes > 0 && on_host) keep_on_host(ptr, nbytes, c10::cuda::getCurrentCUDAStream());
    // Filled by the CPU, so every page starts in host memory.
    at::Tensor host_view = at::from_blob(ptr, src.sizes(), src.options());
    host_view.copy_(src);
    if (nbytes > 0 && !on_host) {
      C10_CUDA_CHECK(cudaMemAdvise(ptr, nbytes, cudaMemAdviseSetReadMostly, device_location(static_cast<int>(device))));
    }
  } catch (...) {
    free_managed(ptr);
    throw;
  }
  return managed_tensor(ptr, src.sizes(), src.options(), device);
}

void managed_evict(const at::Tensor& t) {
  check_device_type(t, c10::kCUDA, "t");
  TORCH_CHECK_VALUE(t.is_contiguous(), "managed_evict: t must be contiguous");
  const size_t nbytes = t.nbytes();
  if (nbytes == 0) return;
  cudaPointerAttributes attr{};
  C10_CUDA_CHECK(cudaPointerGetAttributes(&attr, t.data_ptr()));
  TORCH_CHECK_VALUE(attr.type == cudaMemoryTypeManaged, "managed_evict: t is not in CUDA managed memory");
  c10::cuda::CUDAGuard guard(t.device());
  const int device = t.device().index();
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  C10_CUDA_CHECK(cudaMemAdvise(t.data_ptr(), nbytes, cudaMemAdviseUnsetReadMostly, device_location(device)));
  C10_CUDA_CHECK(cudaMemPrefetchAsync(t.data_ptr(), nbytes, host_location(), 0, stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  C10_CUDA_CHECK(cudaMemAdvise(t.data_ptr(), nbytes, cudaMemAdviseSetReadMostly, device_location(device)));
}

}  // namespace

TORCH_LIBRARY_IMPL(zerocopy, CPU, m) {
  m.impl("managed_copy", managed_copy);
}

// managed_empty has no tensor argument to dispatch on: one kernel for every key.
TORCH_LIBRARY_IMPL(zerocopy, CompositeExplicitAutograd, m) {
  m.impl("managed_empty", managed_empty);
}

TORCH_LIBRARY_IMPL(zerocopy, CUDA, m) {
  m.impl("managed_evict", managed_evict);
}

}  // namespace zerocopy
