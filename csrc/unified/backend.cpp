// The `unified` device: torch's PrivateUse1 dispatch key, renamed by the Python package.
//
// Only a handful of ops are implemented for the key itself: allocation, views (which must stay
// unified tensors), copies and conversions. Every other op reaches the boxed fallback below,
// which replaces each unified argument with an alias over the same bytes on the device where
// the op runs (the device of a CUDA argument if there is one, else the unified tensor's GPU,
// else the CPU in a build or machine without a GPU), and calls the op there. Results of
// functional ops therefore land on that device; ops that write a unified argument write
// through the mapping into host memory and return the unified tensor itself.

#include "compat.h"
#include "unified/host_mapper.h"
#include "unified/unified_tensor.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/CPUAllocator.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/_to_copy_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <string>
#include <unordered_set>

namespace zerocopy {

namespace {

constexpr auto kUnified = c10::DeviceType::PrivateUse1;

// ---------------------------------------------------------------------------------------
// Device guard and hooks: the unified device index is a GPU index (or 0 without a GPU).

struct UnifiedGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kUnified; }
  c10::Device exchangeDevice(c10::Device d) const override {
    c10::Device old = getDevice();
    if (old.index() != d.index()) setDevice(d);
    return old;
  }
  c10::Device getDevice() const override { return c10::Device(kUnified, default_unified_index()); }
  void setDevice(c10::Device d) const override {
    TORCH_INTERNAL_ASSERT(d.type() == kUnified);
    if (gpu_backed() && d.index() >= 0) host_mapper()->set_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      setDevice(d);
    } catch (...) {
    }
  }
  c10::Stream getStream(c10::Device d) const noexcept(compat::kStreamAccessorsNoexcept) override {
    return c10::Stream(c10::Stream::DEFAULT, d);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept(compat::kStreamAccessorsNoexcept) override {
    return c10::Stream(c10::Stream::DEFAULT, s.device());
  }
  void synchronizeDevice(const c10::DeviceIndex index) const ZC_HOOK_OVERRIDE {
    if (gpu_backed()) host_mapper()->synchronize(index);
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return gpu_backed() ? static_cast<c10::DeviceIndex>(host_mapper()->device_count()) : 1;
    } catch (...) {
      return 1;
    }
  }
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, UnifiedGuardImpl);

struct UnifiedHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const ZC_HOOK_OVERRIDE { return true; }
  bool isAvailable() const ZC_HOOK_OVERRIDE { return true; }
  bool hasPrimaryContext(c10::DeviceIndex) const ZC_HOOK_OVERRIDE { return true; }
  c10::DeviceIndex deviceCount() const ZC_HOOK_OVERRIDE {
    return gpu_backed() ? static_cast<c10::DeviceIndex>(host_mapper()->device_count()) : 1;
  }
  c10::DeviceIndex getCurrentDevice() const ZC_HOOK_OVERRIDE { return default_unified_index(); }
  void setCurrentDevice(c10::DeviceIndex d) const ZC_HOOK_OVERRIDE {
    if (gpu_backed()) host_mapper()->set_device(d);
  }
  // Pinned-memory requests addressed to this device (Tensor.pin_memory(device=...)) get CUDA's
  // pinned memory, which is what they mean on a GPU machine.
  bool isPinnedPtr(const void* data) const ZC_HOOK_OVERRIDE {
    return gpu_backed() && at::detail::getCUDAHooks().isPinnedPtr(data);
  }
  c10::Allocator* getPinnedMemoryAllocator() const ZC_HOOK_OVERRIDE {
    return gpu_backed() ? at::detail::getCUDAHooks().getPinnedMemoryAllocator() : c10::GetCPUAllocator();
  }
  c10::Device getDeviceFromPtr(void*) const override {
    return c10::Device(kUnified, default_unified_index());
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const ZC_HOOK_OVERRIDE {
    TORCH_CHECK(newsize == storage.nbytes(), "unified storages live in fixed shared-memory allocations and cannot "
                "be resized (from ", storage.nbytes(), " to ", newsize, " bytes): allocate a new one");
  }
};

// ---------------------------------------------------------------------------------------
// Kernels for the unified key itself.

at::Tensor unified_empty(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                         std::optional<at::Layout> layout, std::optional<at::Device> device,
                         std::optional<bool> /*pin_memory*/, std::optional<at::MemoryFormat> memory_format) {
  TORCH_CHECK_VALUE(!layout || *layout == at::kStrided, "unified tensors must be strided");
  const auto fmt = memory_format.value_or(at::MemoryFormat::Contiguous);
  TORCH_CHECK_VALUE(fmt == at::MemoryFormat::Contiguous || fmt == at::MemoryFormat::Preserve,
                    "unified tensors support only the contiguous memory format, got ", fmt);
  const auto index = device && device->has_index() ? device->index() : c10::DeviceIndex(-1);
  return empty_unified(size, c10::contiguous_strides(size), dtype.value_or(at::get_default_dtype_as_scalartype()), index);
}

at::Tensor unified_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                                 std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                                 std::optional<at::Device> device, std::optional<bool> /*pin_memory*/) {
  TORCH_CHECK_VALUE(!layout || *layout == at::kStrided, "unified tensors must be strided");
  const auto index = device && device->has_index() ? device->index() : c10::DeviceIndex(-1);
  return empty_unified(size, stride, dtype.value_or(at::get_default_dtype_as_scalartype()), index);
}

// Copies between any pair of devices, writing a unified destination through its alias.
at::Tensor unified_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  c10::Device where = is_unified(self) ? compute_device(self) : self.device();
  if (!is_unified(dst)) where = dst.device().is_cuda() ? dst.device() : where;
  at::Tensor src_view = is_unified(self) ? device_alias(self, where) : self;
  at::Tensor dst_view = is_unified(dst) ? device_alias(dst, where) : dst;
  dst_view.copy_(src_view, non_blocking);
  return dst;
}

at::Tensor unified_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  TORCH_CHECK(dst.sizes() == self.sizes() || dst.numel() == 0,
              "unified: cannot resize a unified tensor to copy into it; sizes ", dst.sizes(), " vs ",
              self.sizes());
  TORCH_CHECK(dst.numel() != 0 || self.numel() == 0,
              "unified: cannot grow an empty unified tensor; create it with the right shape");
  return unified_copy_from(self, dst, false);
}

const at::Tensor& unified_resize(const at::Tensor& self, c10::IntArrayRef size,
                                 std::optional<at::MemoryFormat> /*memory_format*/) {
  const uint64_t needed = checked_storage_nbytes(size, c10::contiguous_strides(size), self.itemsize(),
                                                 self.storage_offset(), "resize_");
  TORCH_CHECK(needed <= self.storage().nbytes(),
              "unified tensors live in fixed host allocations and cannot grow: resizing to ", size,
              " needs ", needed, " bytes, the storage has ", self.storage().nbytes());
  self.unsafeGetTensorImpl()->set_sizes_contiguous(size);
  return self;
}

// set_ on a unified tensor: adopt a unified storage (torch's storage copies, deepcopy and
// torch.load build tensors this way). The view must lie inside the storage: unified storages
// never grow.
at::Tensor& unified_set_storage(at::Tensor& self, c10::Storage source, int64_t storage_offset,
                                c10::IntArrayRef size, c10::IntArrayRef stride) {
  TORCH_CHECK_VALUE(source.device().type() == kUnified, "set_: a unified tensor can only take a storage on the "
                    "unified device, got one on ", source.device(), " (convert the tensor with .to('unified'))");
  const c10::DimVector strides = stride.empty() ? c10::contiguous_strides(size) : c10::DimVector(stride);
  const uint64_t needed = checked_storage_nbytes(size, strides, self.itemsize(), storage_offset, "set_");
  TORCH_CHECK_VALUE(needed <= source.nbytes(), "set_: shape ", size, " at offset ", storage_offset, " needs ",
                    needed, " bytes, the unified storage has ", source.nbytes());
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(source));
  self.unsafeGetTensorImpl()->set_sizes_and_strides(size, strides, storage_offset);
  return self;
}

at::Tensor& unified_set_whole_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.itemsize());
  return unified_set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& unified_set_tensor(at::Tensor& self, const at::Tensor& source) {
  TORCH_CHECK_TYPE(self.scalar_type() == source.scalar_type(), "set_: cannot set a ", self.scalar_type(),
                   " tensor to a ", source.scalar_type(), " tensor");
  return unified_set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& unified_set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, unified_allocator(), /*resizable=*/false);
  return unified_set_storage(self, std::move(empty), 0, {0}, {});
}

// Conversions to and from the unified device. unified -> CPU with the same dtype: the host
// tensor itself, no copy, after the work queued on the current stream of the tensor's GPU has
// finished (as a CUDA tensor's .cpu() waits for its stream), unless non_blocking. unified ->
// CUDA: a copy into GPU memory.
at::Tensor unified_to_copy(const at::Tensor& self, std::optional<at::ScalarType> dtype,
                           std::optional<at::Layout> layout, std::optional<at::Device> device,
                           std::optional<bool> pin_memory, bool non_blocking,
                           std::optional<at::MemoryFormat> memory_format) {
  const at::Device target = device.value_or(self.device());
  const bool same_dtype = !dtype || *dtype == self.scalar_type();
  const bool keeps_format = !memory_format || *memory_format == at::MemoryFormat::Preserve;
  TORCH_CHECK_VALUE(self.layout() == at::kStrided && (!layout || *layout == at::kStrided),
                    "unified tensors must be strided (dense); got a tensor with layout ", self.layout(),
                    ": convert it with .to_dense() first");
  if (!is_unified(self)) {
    // BackendSelect sends any tensor.to("unified") here. A CPU tensor of the same dtype is
    // mapped in place; anything else is allocated on the unified device and copied.
    if (target.type() == kUnified && self.is_cpu() && same_dtype && keeps_format &&
        self.layout() == at::kStrided && (!layout || *layout == at::kStrided)) {
      return unified_from_cpu(self, target.has_index() ? target.index() : c10::DeviceIndex(-1));
    }
    return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
  }
  if (target.is_cpu() && same_dtype && !pin_memory.value_or(false) && keeps_format) {
    if (!non_blocking && gpu_backed()) host_mapper()->synchronize_stream(compute_device(self).index());
    return host_alias(self);
  }
  if (target.is_cuda()) {
    at::Tensor src = device_alias(self, gpu_backed() ? c10::Device(c10::kCUDA, target.index() >= 0 ? target.index() : compute_device(self).index()) : c10::Device(c10::kCPU));
    return src.to(target, dtype.value_or(self.scalar_type()), non_blocking, /*copy=*/true,
                  memory_format);
  }
  // unified -> unified (new dtype, or an explicit copy) and unified -> CPU with conversion.
  return at::native::_to_copy(self, dtype, layout, device, pin_memory, non_blocking, memory_format);
}

// ---------------------------------------------------------------------------------------
// The fallback for every other op.

// Where an op runs: the first CUDA tensor argument's device, else the first unified
// argument's compute device.
std::optional<c10::Device> pick_device(const torch::jit::Stack& args) {
  std::optional<c10::Device> unified_device;
  auto visit = [&](const at::Tensor& t) -> bool {
    if (!t.defined()) return false;
    if (t.is_cuda()) return true;
    if (!unified_device && is_unified(t)) unified_device = compute_device(t);
    return false;
  };
  for (const c10::IValue& v : args) {
    if (v.isTensor()) {
      if (visit(v.toTensor())) return v.toTensor().device();
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector())
        if (visit(t)) return t.device();
    } else if (v.isList()) {
      for (const c10::IValue& e : v.toListRef())
        if (e.isTensor() && visit(e.toTensor())) return e.toTensor().device();
    }
  }
  return unified_device;
}

c10::IValue to_alias(const c10::IValue& v, c10::Device where) {
  if (v.isTensor()) {
    const at::Tensor& t = v.toTensor();
    return is_unified(t) ? c10::IValue(device_alias(t, where)) : v;
  }
  if (v.isTensorList()) {
    std::vector<at::Tensor> out;
    bool changed = false;
    for (const at::Tensor& t : v.toTensorVector()) {
      changed |= is_unified(t);
      out.push_back(is_unified(t) ? device_alias(t, where) : t);
    }
    return changed ? c10::IValue(out) : v;
  }
  if (v.isList()) {  // Tensor?[] (e.g. aten::index)
    c10::List<std::optional<at::Tensor>> out;
    bool changed = false;
    for (const c10::IValue& e : v.toListRef()) {
      if (e.isTensor() && is_unified(e.toTensor())) {
        changed = true;
        out.push_back(device_alias(e.toTensor(), where));
      } else {
        out.push_back(e.isTensor() ? std::optional<at::Tensor>(e.toTensor()) : std::nullopt);
      }
    }
    return changed ? c10::IValue(out) : v;
  }
  if (v.isDevice() && v.toDevice().type() == kUnified) return c10::IValue(where);
  return v;
}

// A unified argument an op writes, with the alias the op got in its place.
struct WrittenArgument {
  const c10::AliasInfo* alias_info;
  at::Tensor unified;
  at::Tensor alias;
  const c10::StorageImpl* alias_storage;  // the alias's storage when the op was called
  int64_t alias_offset;                    // and its storage offset then
};

// In-place view ops (t_, unsqueeze_, transpose_, as_strided_, ...) and out= ops that shrink
// their output change the alias's sizes, strides or offset: the unified tensor takes the same
// change. An op that gave the alias other memory cannot be mirrored and is refused.
void mirror_metadata(const WrittenArgument& w, const c10::FunctionSchema& schema) {
  const at::Tensor& a = w.alias;
  const int64_t offset = w.unified.storage_offset() + (a.storage_offset() - w.alias_offset);
  if (a.sizes() == w.unified.sizes() && a.strides() == w.unified.strides() && offset == w.unified.storage_offset())
    return;
  TORCH_CHECK(a.storage().unsafeGetStorageImpl() == w.alias_storage, "unified: ", schema.name(),
              " replaced the memory of a unified argument, which lives in a fixed host allocation; "
              "write into a tensor of the right shape instead");
  const uint64_t needed = checked_storage_nbytes(a.sizes(), a.strides(), a.itemsize(), offset, schema.name().c_str());
  TORCH_CHECK(needed <= w.unified.storage().nbytes(), "unified: ", schema.name(), " would reach past the end of a "
              "unified tensor's storage");
  w.unified.unsafeGetTensorImpl()->set_sizes_and_strides(a.sizes(), a.strides(), offset);
}

void unified_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  auto first = stack->end() - static_cast<std::ptrdiff_t>(num_args);
  torch::jit::Stack args(first, stack->end());
  std::optional<c10::Device> where = pick_device(args);
  TORCH_CHECK(where.has_value(), "unified: ", schema.name(), " reached the unified backend without a "
              "unified tensor argument");

  // Arguments an op writes (alias annotations with a write), by alias set: the op returns
  // them, and the caller must get the unified tensor back, not the alias.
  std::vector<WrittenArgument> written;
  for (size_t i = 0; i < num_args; ++i) {
    const auto* alias = schema.arguments()[i].alias_info();
    c10::IValue replaced = to_alias(args[i], *where);
    if (alias && alias->isWrite() && args[i].isTensor() && is_unified(args[i].toTensor())) {
      const at::Tensor& a = replaced.toTensor();
      written.push_back({alias, args[i].toTensor(), a, a.storage().unsafeGetStorageImpl(), a.storage_offset()});
    }
    *(first + static_cast<std::ptrdiff_t>(i)) = std::move(replaced);
  }
  op.callBoxed(stack);

  if (written.empty()) return;
  for (const auto& w : written) mirror_metadata(w, schema);
  const size_t num_returns = schema.returns().size();
  auto ret = stack->end() - static_cast<std::ptrdiff_t>(num_returns);
  for (size_t r = 0; r < num_returns; ++r) {
    const auto* alias = schema.returns()[r].alias_info();
    if (!alias) continue;
    for (const auto& w : written) {
      if (w.alias_info->beforeSets() == alias->beforeSets()) *(ret + static_cast<std::ptrdiff_t>(r)) = w.unified;
    }
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&unified_fallback>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", unified_empty);
  m.impl("empty_strided", unified_empty_strided);
  m.impl("_copy_from", unified_copy_from);
  m.impl("_copy_from_and_resize", unified_copy_from_and_resize);
  m.impl("_to_copy", unified_to_copy);
  m.impl("resize_", unified_resize);
  m.impl("set_.source_Storage_storage_offset", unified_set_storage);
  m.impl("set_.source_Storage", unified_set_whole_storage);
  m.impl("set_.source_Tensor", unified_set_tensor);
  m.impl("set_", unified_set_empty);
  // Views keep the unified device: they only rewrite sizes, strides and offset.
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("unfold", at::native::unfold);
}

// Ops with a composite kernel (CompositeExplicitAutograd[NonFunctional]) would run that
// kernel for unified tensors instead of the fallback: it allocates its result on the unified
// device (a new shared-memory segment per op) and checks devices against it. These ops are
// sent to the fallback too, so they run on the GPU like every other op. Left composite:
// views (they must stay unified tensors), ops without tensor arguments (factories), and ops
// whose meaning is "same device as the input" (clone, *_like, new_*) or about storage identity.
bool keeps_composite(const c10::FunctionSchema& schema) {
  static const std::unordered_set<std::string> kKeep = {
      "aten::clone", "aten::copy_", "aten::copy", "aten::_to_copy", "aten::lift", "aten::lift_fresh",
      "aten::lift_fresh_copy", "aten::resize_as_", "aten::set_", "aten::is_set_to", "aten::detach_",
      "aten::is_pinned", "aten::_pin_memory", "aten::pin_memory", "aten::_has_compatible_shallow_copy_type",
      "aten::fill_", "aten::zero_"};
  const std::string& name = schema.name();
  if (kKeep.count(name)) return true;
  if (name.size() > 5 && name.compare(name.size() - 5, 5, "_like") == 0) return true;
  if (name.rfind("aten::new_", 0) == 0 || name.rfind("aten::empty", 0) == 0) return true;
  for (const auto& ret : schema.returns()) {
    if (ret.alias_info() != nullptr && !ret.alias_info()->isWrite()) return true;  // a view
  }
  for (const auto& arg : schema.arguments()) {
    const auto& type = arg.type();
    if (type->kind() == c10::TypeKind::TensorType) return false;
    if (type->kind() == c10::TypeKind::OptionalType &&
        type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType)
      return false;
    if (type->kind() == c10::TypeKind::ListType) {
      auto elem = type->castRaw<c10::ListType>()->getElementType();
      if (elem->kind() == c10::TypeKind::TensorType ||
          (elem->kind() == c10::TypeKind::OptionalType &&
           elem->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::TensorType))
        return false;
    }
  }
  return true;  // no tensor argument: a factory
}

void route_composites_to_fallback() {
  static torch::Library* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                                  __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findSchema(name);
    if (!op) continue;
    if (op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) continue;
    if (!op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) &&
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional))
      continue;
    if (keeps_composite(op->schema())) continue;
    std::string qualified = name.name.substr(6);
    if (!name.overload_name.empty()) qualified += "." + name.overload_name;
    lib->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&unified_fallback>());
  }
}

// Ops without an autograd kernel (custom ops such as zerocopy::*) pass through the autograd
// key of the unified device, as they do for CPU and CUDA. Newer torch registers this fallback
// itself; torch 2.2 registers it for the built-in backends only.
void register_autograd_fallthrough() {
  if (c10::Dispatcher::singleton().hasBackendFallbackForDispatchKey(c10::DispatchKey::AutogradPrivateUse1)) return;
  static torch::Library* lib = new torch::Library(torch::Library::IMPL, "_", c10::DispatchKey::AutogradPrivateUse1,
                                                  __FILE__, __LINE__);
  lib->fallback(torch::CppFunction::makeFallthrough());
}

void register_unified_hooks() {
  static bool done = false;
  if (done) return;
  at::RegisterPrivateUse1HooksInterface(new UnifiedHooks());
  c10::SetAllocator(kUnified, unified_allocator());
  route_composites_to_fallback();
  register_autograd_fallthrough();
  done = true;
}

}  // namespace zerocopy
