// How the unified backend reaches a GPU. The core of the backend (csrc/unified) is compiled
// in every build and knows nothing of CUDA; a CUDA build links csrc/cuda/cuda_host_mapper.cpp,
// which installs a HostMapper when the extension loads. A CPU-only build has none, and unified
// tensors then run their ops on the CPU (the documented fallback).
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <string>

namespace zerocopy {

struct HostMapper {
  virtual ~HostMapper() = default;

  // True when at least one GPU can be used now. May initialise the driver, never a context.
  virtual bool gpu_available() const = 0;
  virtual int device_count() const = 0;
  virtual int current_device() const = 0;
  virtual void set_device(int index) const = 0;

  // Page-locks [ptr, ptr + nbytes) and maps it into every GPU's address space. Returns the
  // device address of ptr. `owned` is set false when the range was already page-locked by
  // someone else (cudaHostAlloc, torch's pinned allocator): then unmap must not be called.
  // Throws c10::Error with the cause and the fix on failure.
  virtual void* map(void* ptr, size_t nbytes, bool* owned) = 0;
  // Releases a mapping made by map. Waits for all work queued on every GPU this process
  // uses, so memory is never unmapped under a kernel that still reads it.
  virtual void unmap(void* ptr) = 0;

  // Waits for all work queued on GPU `index`.
  virtual void synchronize(int index) const = 0;
  // Waits for the work queued on GPU `index`'s current stream.
  virtual void synchronize_stream(int index) const = 0;

  // The device on which an op over a unified tensor of this index runs.
  virtual c10::Device compute_device(int index) const = 0;
};

// nullptr in a CPU-only build.
HostMapper* host_mapper();
// Called once by the CUDA build at load time.
void install_host_mapper(HostMapper* mapper);

// True when unified tensors are served by a GPU (a CUDA build on a machine with a GPU).
bool gpu_backed();

}  // namespace zerocopy
