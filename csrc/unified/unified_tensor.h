// Unified tensors: tensors on the `unified` device (torch's PrivateUse1 key, renamed) whose
// bytes are host memory, page-locked and mapped for every GPU.
//
// Storage contract. A unified storage's DataPtr points at the host bytes and carries a
// UnifiedContext that owns (1) the CPU storage those bytes belong to and (2) the GPU
// registration of them. The CPU storage is released only after the registration, and the
// registration's release waits for queued GPU work, so neither the mapping nor the memory
// goes away under a running kernel. Every alias handed to an op (a CPU or CUDA tensor over
// the same bytes) holds a reference to the unified storage for as long as it lives.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <memory>

namespace zerocopy {

class Registration;

struct UnifiedContext {
  c10::Storage host;                          // the CPU storage that owns the bytes
  std::shared_ptr<Registration> registration;  // null when no GPU serves unified tensors
  ~UnifiedContext();
};

bool is_unified(const at::Tensor& t);

// The allocator of the unified device (installed for PrivateUse1, so that
// torch.UntypedStorage(n, device=unified), storage clones, deepcopy and torch.load work): each
// allocation is a new shared-memory segment, mapped on the current unified device's GPU.
c10::Allocator* unified_allocator();

// Bytes a strided tensor of these sizes/strides/offset spans, checked: negative sizes, strides
// or offsets raise ValueError, and so does a byte count that does not fit 64 bits. `what`
// names the caller in messages.
uint64_t checked_storage_nbytes(c10::IntArrayRef sizes, c10::IntArrayRef strides, size_t itemsize,
                                int64_t storage_offset, const char* what);

// The unified tensor over `cpu`'s bytes, in place: no copy, same sizes, strides and offset.
// `index` is the GPU the tensor's ops run on (-1: the current device).
at::Tensor unified_from_cpu(const at::Tensor& cpu, c10::DeviceIndex index);

// A new unified tensor in shared host memory (usable by other processes without a copy).
at::Tensor empty_unified(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype,
                         c10::DeviceIndex index);

// The CPU tensor over a unified tensor's bytes (same storage, no copy). Also for a tensor on
// the unified device whose storage was made elsewhere (at::from_blob over unified memory, as
// torch's serialization does): every byte of the unified device is host memory; the alias
// then holds that storage alive.
at::Tensor host_alias(const at::Tensor& unified);

// A tensor over the same bytes on `device` (CUDA: through the GPU mapping; CPU: the host
// alias). The alias keeps the unified storage alive.
at::Tensor device_alias(const at::Tensor& unified, c10::Device device);

// The device where an op whose only device inputs are unified tensors runs.
c10::Device compute_device(const at::Tensor& unified);

// The device index a new unified tensor gets when none is named.
c10::DeviceIndex default_unified_index();

// Shared-memory allocation. The returned storage is created the way torch.multiprocessing's
// file-descriptor strategy creates its own, so sending it to another process shares the
// segment instead of copying it. Raises torch.OutOfMemoryError, saying what was asked and
// what is available, when /dev/shm or the machine's memory lacks the space (checked before
// anything is allocated).
c10::Storage allocate_shared_host(size_t nbytes);

}  // namespace zerocopy
