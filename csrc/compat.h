// Differences between the torch versions this package builds against (2.2 to current). Every
// version test lives here; code elsewhere uses these names and stays identical across torch.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

#include <cstring>
#include <utility>

#define ZC_TORCH_AT_LEAST(major, minor) \
  (TORCH_VERSION_MAJOR > (major) || (TORCH_VERSION_MAJOR == (major) && TORCH_VERSION_MINOR >= (minor)))

namespace zerocopy {
namespace compat {

// DeviceGuardImplInterface::getStream / exchangeStream were `noexcept` in older torch and are
// not in newer; an override must match. Read the base class's own specification.
constexpr bool kStreamAccessorsNoexcept =
    noexcept(std::declval<const c10::impl::DeviceGuardImplInterface&>().getStream(
        std::declval<c10::Device>()));

// c10::Allocator::allocate is `const` up to torch 2.2 and not from 2.3 on, where the pure
// `copy_data` appeared. An allocator of host memory derives from this base and implements
// allocate_bytes; the base declares both spellings of allocate (whichever the torch in use
// declares virtual is the override) and copy_data as a memcpy.
struct HostAllocatorBase : public c10::Allocator {
  virtual c10::DataPtr allocate_bytes(size_t nbytes) const = 0;
  c10::DataPtr allocate(size_t nbytes) const { return allocate_bytes(nbytes); }
  c10::DataPtr allocate(size_t nbytes) { return allocate_bytes(nbytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const { std::memcpy(dest, src, count); }
};

}  // namespace compat
}  // namespace zerocopy

// PrivateUse1HooksInterface gained the accelerator hooks (isBuilt, isAvailable, deviceCount,
// getCurrentDevice, setCurrentDevice, hasPrimaryContext, isPinnedPtr, getPinnedMemoryAllocator)
// after torch 2.2, which has only getDefaultGenerator and getDeviceFromPtr, and
// DeviceGuardImplInterface gained synchronizeDevice. Those methods carry ZC_HOOK_OVERRIDE:
// `override` from torch 2.11 (the oldest torch with CUDA this package is built against, where
// the base declares them all); before, nothing, so that torch 2.2 compiles them as plain
// methods. A method with the base's signature overrides it either way.
#if ZC_TORCH_AT_LEAST(2, 11)
#define ZC_HOOK_OVERRIDE override
#else
#define ZC_HOOK_OVERRIDE
#endif
