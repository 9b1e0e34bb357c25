// The CUDA HostMapper: page-locks host ranges with cudaHostRegister (mapped, portable) and
// hands out their device addresses. Installed when the extension loads (CUDA builds only).

#include "unified/host_mapper.h"

#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <cuda_runtime_api.h>
#include <sys/resource.h>

#include <sstream>

namespace zerocopy {

namespace {

std::string memlock_hint(size_t nbytes) {
  struct rlimit lim{};
  std::ostringstream out;
  if (getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < nbytes) {
    out << " The locked-memory limit (ulimit -l) is " << lim.rlim_cur << " bytes, below the " << nbytes
        << " bytes asked for: raise it (ulimit -l unlimited, or memlock in "
           "/etc/security/limits.conf; docker run --ulimit memlock=-1).";
  } else {
    out << " The host may be short of memory that can be page-locked: free memory, or map a "
           "smaller table.";
  }
  return out.str();
}

class CudaHostMapper final : public HostMapper {
 public:
  bool gpu_available() const override { return c10::cuda::device_count() > 0; }
  int device_count() const override { return c10::cuda::device_count(); }
  int current_device() const override { return c10::cuda::current_device(); }
  void set_device(int index) const override { c10::cuda::set_device(static_cast<c10::DeviceIndex>(index)); }

  void synchronize(int index) const override {
    int current = -1;
    C10_CUDA_CHECK(cudaGetDevice(&current));
    C10_CUDA_CHECK(cudaSetDevice(index));
    C10_CUDA_CHECK(cudaDeviceSynchronize());
    C10_CUDA_CHECK(cudaSetDevice(current));
  }

  void synchronize_stream(int index) const override {
    c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(index)).synchronize();
  }

  c10::Device compute_device(int index) const override {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index >= 0 ? index : current_device()));
  }

  void* map(void* ptr, size_t nbytes, bool* owned) override {
    // Memory page-locked by someone else (cudaHostAlloc, torch's pinned allocator) is used as
    // it is: with unified addressing it is already visible to every GPU.
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, ptr) == cudaSuccess && attr.type == cudaMemoryTypeHost &&
        attr.devicePointer != nullptr) {
      *owned = false;
      return attr.devicePointer;
    }
    (void)cudaGetLastError();
    cudaError_t err = cudaHostRegister(ptr, nbytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      std::ostringstream msg;
      msg << "unified: cudaHostRegister of " << nbytes << " bytes at " << ptr << " failed: "
          << cudaGetErrorName(err) << " (" << cudaGetErrorString(err) << ").";
      if (err == cudaErrorHostMemoryAlreadyRegistered) {
        msg << " Part of this range is already page-locked by code outside pytorch_zerocopy; "
               "unregister it there, or allocate the tensor with pytorch_zerocopy.empty_unified.";
      } else if (err == cudaErrorMemoryAllocation || err == cudaErrorInvalidValue) {
        msg << memlock_hint(nbytes);
      }
      TORCH_CHECK(false, msg.str());
    }
    void* device = nullptr;
    err = cudaHostGetDevicePointer(&device, ptr, 0);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      cudaHostUnregister(ptr);
      TORCH_CHECK(false, "unified: cudaHostGetDevicePointer failed after registering: ",
                  cudaGetErrorString(err));
    }
    *owned = true;
    return device;
  }

  void unmap(void* ptr) override {
    // Wait for work that may still read this memory on any GPU this process has used.
    int current = -1;
    cudaGetDevice(&current);
    const int n = device_count();
    for (int d = 0; d < n; ++d) {
      if (!c10::cuda::hasPrimaryContext(static_cast<c10::DeviceIndex>(d))) continue;
      cudaSetDevice(d);
      cudaDeviceSynchronize();
    }
    if (current >= 0) cudaSetDevice(current);
    cudaError_t err = cudaHostUnregister(ptr);
    if (err != cudaSuccess && err != cudaErrorCudartUnloading) {
      (void)cudaGetLastError();
      TORCH_WARN("unified: cudaHostUnregister failed: ", cudaGetErrorString(err));
    }
  }
};

CudaHostMapper g_cuda_mapper;

struct InstallCudaMapper {
  InstallCudaMapper() { install_host_mapper(&g_cuda_mapper); }
} g_install;

}  // namespace

}  // namespace zerocopy
