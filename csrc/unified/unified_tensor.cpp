#include "unified/unified_tensor.h"

#include "compat.h"
#include "unified/host_memory.h"
#include "unified/host_mapper.h"
#include "unified/registration.h"

#include <ATen/MapAllocator.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/safe_numerics.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <limits>
#include <string>
#include <sys/statvfs.h>

namespace zerocopy {

namespace {

void delete_unified_context(void* ctx) { delete static_cast<UnifiedContext*>(ctx); }

// The context of a storage made here, or nullptr for one made elsewhere (at::from_blob).
UnifiedContext* context_of(const at::Tensor& t) {
  const c10::DataPtr& dp = t.storage().data_ptr();
  if (dp.get_deleter() != &delete_unified_context) return nullptr;
  return static_cast<UnifiedContext*>(dp.get_context());
}

// The DataPtr of a unified storage over `host`'s bytes: it owns `host` and, with a GPU, the
// registration of those bytes.
c10::DataPtr make_unified_data_ptr(c10::Storage host, c10::DeviceIndex index) {
  void* data = host.mutable_data();
  const size_t nbytes = host.nbytes();
  std::shared_ptr<Registration> registration;
  if (gpu_backed() && nbytes > 0) {
    registration = Registration::acquire(data, nbytes);
  }
  auto* ctx = new UnifiedContext{std::move(host), std::move(registration)};
  return c10::DataPtr(data, ctx, &delete_unified_context, c10::Device(c10::DeviceType::PrivateUse1, index));
}

struct UnifiedAllocator final : public compat::HostAllocatorBase {
  c10::DataPtr allocate_bytes(size_t nbytes) const override {
    return make_unified_data_ptr(allocate_shared_host(nbytes), default_unified_index());
  }
};

UnifiedAllocator g_allocator;

c10::Storage make_unified_storage(c10::Storage host, c10::DeviceIndex index) {
  const size_t nbytes = host.nbytes();
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, make_unified_data_ptr(std::move(host), index),
                      &g_allocator, /*resizable=*/false);
}

at::Tensor wrap_storage(c10::Storage storage, const caffe2::TypeMeta dtype, c10::IntArrayRef sizes,
                        c10::IntArrayRef strides, int64_t offset) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

// A unified device index is a GPU index where a GPU serves unified tensors; without one there
// is a single unified device, index 0. Every path that makes a unified tensor on a named
// index (Tensor.to, factories, to_unified, empty_unified) passes here.
c10::DeviceIndex resolve_index(c10::DeviceIndex index) {
  if (index < 0) return default_unified_index();
  if (gpu_backed()) {
    TORCH_CHECK_VALUE(index < host_mapper()->device_count(), "unified:", int(index),
                      " names a GPU that does not exist: this machine has ",
                      host_mapper()->device_count(), " GPU(s)");
  } else {
    TORCH_CHECK_VALUE(index == 0, "unified:", int(index),
                      " does not exist: no GPU serves unified tensors here, so there is 1 unified device, "
                      "unified:0 ('unified')");
  }
  return index;
}

}  // namespace

c10::Allocator* unified_allocator() { return &g_allocator; }

uint64_t checked_storage_nbytes(c10::IntArrayRef sizes, c10::IntArrayRef strides, size_t itemsize,
                                int64_t storage_offset, const char* what) {
  TORCH_CHECK_VALUE(sizes.size() == strides.size(), what, ": ", sizes.size(), " sizes but ", strides.size(),
                    " strides");
  TORCH_CHECK_VALUE(storage_offset >= 0, what, ": negative storage offset ", storage_offset);
  bool empty = false;
  uint64_t extents = 1;  // the product of max(size, 1): numel and every contiguous stride are below it
  bool too_many = false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    TORCH_CHECK_VALUE(sizes[d] >= 0, what, ": negative dimension ", sizes[d], " in shape ", sizes);
    empty |= sizes[d] == 0;
    too_many |= c10::mul_overflows(extents, static_cast<uint64_t>(std::max<int64_t>(sizes[d], 1)), &extents);
  }
  TORCH_CHECK_VALUE(!too_many && extents <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), what,
                    ": shape ", sizes, " has more than 2^63 elements (or strides)");
  for (size_t d = 0; d < sizes.size(); ++d) {
    TORCH_CHECK_VALUE(strides[d] >= 0, what, ": negative stride ", strides[d], " in strides ", strides);
  }
  if (empty) return 0;
  uint64_t last = static_cast<uint64_t>(storage_offset);  // element index of the last element
  bool overflow = false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    uint64_t extent = 0;
    overflow |= c10::mul_overflows(static_cast<uint64_t>(sizes[d] - 1), static_cast<uint64_t>(strides[d]), &extent);
    overflow |= c10::add_overflows(last, extent, &last);
  }
  uint64_t nbytes = 0;
  overflow |= c10::add_overflows(last, uint64_t{1}, &last);
  overflow |= c10::mul_overflows(last, static_cast<uint64_t>(itemsize), &nbytes);
  TORCH_CHECK_VALUE(!overflow && nbytes <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), what,
                    ": shape ", sizes, " with ", itemsize, "-byte elements spans more than 2^63 bytes");
  return nbytes;
}

UnifiedContext::~UnifiedContext() {
  // Unmap first (waits for queued GPU work), then let the CPU storage free the bytes.
  registration.reset();
}

bool is_unified(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

c10::DeviceIndex default_unified_index() {
  return gpu_backed() ? static_cast<c10::DeviceIndex>(host_mapper()->current_device()) : 0;
}

at::Tensor unified_from_cpu(const at::Tensor& cpu, c10::DeviceIndex index) {
  TORCH_CHECK_VALUE(cpu.device().is_cpu(), "to('unified') in place needs a CPU tensor, got one on ",
                    cpu.device());
  TORCH_CHECK_VALUE(cpu.layout() == at::kStrided, "unified tensors must be strided, got layout ",
                    cpu.layout());
  TORCH_CHECK_VALUE(cpu.has_storage(), "to('unified') needs a tensor with storage");
  c10::Storage storage = make_unified_storage(cpu.storage(), resolve_index(index));
  return wrap_storage(std::move(storage), cpu.dtype(), cpu.sizes(), cpu.strides(), cpu.storage_offset());
}

c10::Storage allocate_shared_host(size_t nbytes) {
  const size_t request = std::max<size_t>(nbytes, 1);
  struct statvfs fs{};
  if (statvfs("/dev/shm", &fs) == 0) {
    const uint64_t avail = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    TORCH_CHECK_WITH(OutOfMemoryError, request <= avail, "unified: cannot allocate ", describe_bytes(request),
                     " of shared memory: /dev/shm has only ", describe_bytes(avail),
                     " free. Enlarge it (mount -o remount,size=<N>G /dev/shm, or docker run --shm-size=<N>g) "
                     "or free space in it.");
  }
  // Shared memory is backed by RAM (and swap): reserving more than is available would end in
  // the OOM killer, not in an error.
  require_host_memory(request, "unified: a shared-memory allocation of " + std::to_string(request) + " bytes",
                      "free memory or allocate less");
  const int flags = at::ALLOCATOR_MAPPED_SHAREDMEM | at::ALLOCATOR_MAPPED_EXCLUSIVE |
                    at::ALLOCATOR_MAPPED_KEEPFD | at::ALLOCATOR_MAPPED_UNLINK;
  at::DataPtr dp = at::MapAllocator::makeDataPtr(at::NewProcessWideShmHandle(), flags, request, nullptr);
  // Reserve the pages now: a tmpfs file that cannot be backed raises ENOSPC here instead of
  // SIGBUS at the first touch.
  at::MapAllocator* map = at::MapAllocator::fromDataPtr(dp);
  TORCH_INTERNAL_ASSERT(map != nullptr);
  const int rc = posix_fallocate(map->fd(), 0, static_cast<off_t>(request));
  TORCH_CHECK_WITH(OutOfMemoryError, rc == 0, "unified: cannot reserve ", describe_bytes(request),
                   " of shared memory in /dev/shm: ", std::strerror(rc), ". Enlarge /dev/shm or free space in it.");
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, std::move(dp), /*allocator=*/nullptr,
                      /*resizable=*/false);
}

at::Tensor empty_unified(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype,
                         c10::DeviceIndex index) {
  const auto meta = c10::scalarTypeToTypeMeta(dtype);
  const uint64_t nbytes = checked_storage_nbytes(sizes, strides, meta.itemsize(), 0, "empty_unified");
  c10::Storage host = allocate_shared_host(static_cast<size_t>(nbytes));
  c10::Storage storage = make_unified_storage(std::move(host), resolve_index(index));
  return wrap_storage(std::move(storage), meta, sizes, strides, 0);
}

at::Tensor host_alias(const at::Tensor& unified) {
  if (UnifiedContext* ctx = context_of(unified)) {
    at::Tensor cpu = at::empty({0}, at::TensorOptions().dtype(unified.dtype()).device(at::kCPU));
    cpu.set_(ctx->host, unified.storage_offset(), unified.sizes(), unified.strides());
    return cpu;
  }
  c10::Storage keep = unified.storage();
  return at::for_blob(unified.data_ptr(), unified.sizes())
      .strides(unified.strides())
      .deleter([keep](void*) mutable { keep = c10::Storage(); })
      .options(at::TensorOptions().dtype(unified.dtype()).device(at::kCPU))
      .make_tensor();
}

c10::Device compute_device(const at::Tensor& unified) {
  if (!gpu_backed()) return c10::Device(c10::kCPU);
  return host_mapper()->compute_device(unified.device().index());
}

at::Tensor device_alias(const at::Tensor& unified, c10::Device device) {
  if (device.is_cpu()) return host_alias(unified);
  TORCH_INTERNAL_ASSERT(device.is_cuda());
  const auto* host = static_cast<const char*>(unified.storage().data()) +
                     unified.storage_offset() * static_cast<int64_t>(unified.itemsize());
  void* dev = const_cast<char*>(host);
  if (unified.storage().nbytes() > 0) {
    UnifiedContext* ctx = context_of(unified);
    if (ctx != nullptr) {
      TORCH_CHECK(ctx->registration != nullptr, "unified: this tensor was created without a GPU and is not mapped for one");
      dev = ctx->registration->device_address(host);
    } else {
      dev = registered_device_address(host);
      TORCH_CHECK(dev != nullptr, "unified: this tensor's memory is not mapped for the GPU (its storage was not "
                  "made by pytorch_zerocopy and covers no unified tensor's bytes)");
    }
  }
  c10::Storage keep = unified.storage();
  return at::for_blob(dev, unified.sizes())
      .strides(unified.strides())
      .deleter([keep](void*) mutable { keep = c10::Storage(); })
      .target_device(device)
      .options(at::TensorOptions().dtype(unified.dtype()).device(device))
      .make_tensor();
}

}  // namespace zerocopy
