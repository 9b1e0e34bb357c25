#include "unified/unified_tensor.h"

#include "unified/host_mapper.h"
#include "unified/registration.h"

#include <ATen/MapAllocator.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/statvfs.h>

namespace zerocopy {

namespace {

void delete_unified_context(void* ctx) { delete static_cast<UnifiedContext*>(ctx); }

UnifiedContext* context_of(const at::Tensor& t) {
  const c10::DataPtr& dp = t.storage().data_ptr();
  TORCH_INTERNAL_ASSERT(dp.get_deleter() == &delete_unified_context,
                        "unified: tensor storage was not made by pytorch_zerocopy");
  return static_cast<UnifiedContext*>(dp.get_context());
}

c10::Storage make_unified_storage(c10::Storage host, c10::DeviceIndex index) {
  void* data = host.mutable_data();
  const size_t nbytes = host.nbytes();
  std::shared_ptr<Registration> registration;
  if (gpu_backed() && nbytes > 0) {
    registration = Registration::acquire(data, nbytes);
  }
  auto* ctx = new UnifiedContext{std::move(host), std::move(registration)};
  c10::DataPtr dp(data, ctx, &delete_unified_context,
                  c10::Device(c10::DeviceType::PrivateUse1, index));
  return c10::Storage(c10::Storage::use_byte_size_t(), nbytes, std::move(dp),
                      /*allocator=*/nullptr, /*resizable=*/false);
}

at::Tensor wrap_storage(c10::Storage storage, const caffe2::TypeMeta dtype, c10::IntArrayRef sizes,
                        c10::IntArrayRef strides, int64_t offset) {
  auto t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), dtype);
  t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, strides, offset);
  return t;
}

c10::DeviceIndex resolve_index(c10::DeviceIndex index) {
  if (index >= 0) {
    if (gpu_backed()) {
      TORCH_CHECK_VALUE(index < host_mapper()->device_count(), "unified:", int(index),
                        " names a GPU that does not exist: this machine has ",
                        host_mapper()->device_count(), " GPU(s)");
    }
    return index;
  }
  return default_unified_index();
}

}  // namespace

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
    const unsigned long long avail = static_cast<unsigned long long>(fs.f_bavail) * fs.f_frsize;
    TORCH_CHECK(request <= avail, "unified: cannot allocate ", request,
                " bytes of shared memory: /dev/shm has only ", avail,
                " bytes free. Enlarge it (mount -o remount,size=<N>G /dev/shm, or "
                "docker run --shm-size=<N>g) or free space in it.");
  }
  const int flags = at::ALLOCATOR_MAPPED_SHAREDMEM | at::ALLOCATOR_MAPPED_EXCLUSIVE |
                    at::ALLOCATOR_MAPPED_KEEPFD | at::ALLOCATOR_MAPPED_UNLINK;
  at::DataPtr dp = at::MapAllocator::makeDataPtr(at::NewProcessWideShmHandle(), flags, request, nullptr);
  // Reserve the pages now: a tmpfs file that cannot be backed raises ENOSPC here instead of
  // SIGBUS at the first touch.
  at::MapAllocator* map = at::MapAllocator::fromDataPtr(dp);
  TORCH_INTERNAL_ASSERT(map != nullptr);
  const int rc = posix_fallocate(map->fd(), 0, static_cast<off_t>(request));
  TORCH_CHECK(rc == 0, "unified: cannot reserve ", request, " bytes of shared memory in /dev/shm: ",
              std::strerror(rc), ". Enlarge /dev/shm or free space in it.");
  return c10::Storage(c10::Storage::use_byte_size_t(), request, std::move(dp), /*allocator=*/nullptr,
                      /*resizable=*/false);
}

at::Tensor empty_unified(c10::IntArrayRef sizes, c10::IntArrayRef strides, at::ScalarType dtype,
                         c10::DeviceIndex index) {
  const auto meta = c10::scalarTypeToTypeMeta(dtype);
  int64_t max_offset = 0;
  bool empty = false;
  for (size_t d = 0; d < sizes.size(); ++d) {
    TORCH_CHECK_VALUE(sizes[d] >= 0, "negative dimension ", sizes[d]);
    if (sizes[d] == 0) empty = true;
    max_offset += (sizes[d] - 1) * strides[d];
  }
  const size_t nbytes = empty ? 0 : static_cast<size_t>(max_offset + 1) * meta.itemsize();
  c10::Storage host = allocate_shared_host(nbytes);
  c10::Storage storage = make_unified_storage(std::move(host), resolve_index(index));
  return wrap_storage(std::move(storage), meta, sizes, strides, 0);
}

at::Tensor host_alias(const at::Tensor& unified) {
  UnifiedContext* ctx = context_of(unified);
  at::Tensor cpu = at::empty({0}, at::TensorOptions().dtype(unified.dtype()).device(at::kCPU));
  cpu.set_(ctx->host, unified.storage_offset(), unified.sizes(), unified.strides());
  return cpu;
}

c10::Device compute_device(const at::Tensor& unified) {
  if (!gpu_backed()) return c10::Device(c10::kCPU);
  return host_mapper()->compute_device(unified.device().index());
}

at::Tensor device_alias(const at::Tensor& unified, c10::Device device) {
  if (device.is_cpu()) return host_alias(unified);
  TORCH_INTERNAL_ASSERT(device.is_cuda());
  UnifiedContext* ctx = context_of(unified);
  TORCH_CHECK(ctx->registration != nullptr || unified.storage().nbytes() == 0,
              "unified: this tensor was created without a GPU and is not mapped for one");
  const auto* host = static_cast<const char*>(unified.storage().data()) +
                     unified.storage_offset() * static_cast<int64_t>(unified.itemsize());
  void* dev = ctx->registration ? ctx->registration->device_address(host) : const_cast<char*>(host);
  c10::Storage keep = unified.storage();
  return at::for_blob(dev, unified.sizes())
      .strides(unified.strides())
      .deleter([keep](void*) mutable { keep = c10::Storage(); })
      .target_device(device)
      .options(at::TensorOptions().dtype(unified.dtype()).device(device))
      .make_tensor();
}

}  // namespace zerocopy
