// Force-included when EMOGI's code is built with CUDA 13 or later (benchmarks/emogi.py): CUDA 13
// removed cudaMemAdvise's overload that names a device by its ordinal, which EMOGI's sources call;
// this adds it back over the cudaMemLocation form. EMOGI's sources are not changed.
#pragma once
#include <cuda_runtime_api.h>

#if defined(CUDART_VERSION) && CUDART_VERSION >= 13000
static inline cudaError_t cudaMemAdvise(const void* ptr, size_t count, enum cudaMemoryAdvise advice, int device) {
  struct cudaMemLocation where;
  where.type = device == cudaCpuDeviceId ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  where.id = device == cudaCpuDeviceId ? 0 : device;
  return cudaMemAdvise(ptr, count, advice, where);
}
#endif
