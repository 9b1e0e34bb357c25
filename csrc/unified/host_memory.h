// Host memory a request may still use, and the check that refuses a request larger than that
// before anything is allocated (an allocation the machine cannot back ends in the OOM killer or
// a SIGBUS, not in an exception).
#pragma once

#include <cstdint>
#include <string>

namespace zerocopy {

struct AvailableHostMemory {
  uint64_t available;  // bytes: MemAvailable + SwapFree, lowered to the cgroup's headroom
  std::string source;  // where the figure comes from, for messages
};

// Read afresh on every call (/proc/meminfo and the memory cgroup, v2 or v1).
AvailableHostMemory available_host_memory();

// "24.0 GiB (25769803776 bytes)".
std::string describe_bytes(uint64_t nbytes);

// Raises torch.OutOfMemoryError naming `what`, the bytes asked and the bytes available when
// `nbytes` exceeds available_host_memory(); `hint` (may be empty) says what to do instead.
void require_host_memory(uint64_t nbytes, const std::string& what, const std::string& hint);

}  // namespace zerocopy
