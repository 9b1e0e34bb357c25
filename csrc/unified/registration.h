// Page-locked, GPU-mapped host ranges with reference counts.
//
// cudaHostRegister refuses a range that overlaps one already registered ("resource already
// mapped"). A Registration therefore covers its byte range with *pieces*: pieces already held
// by other live registrations (views, overlapping tensors) are shared (their count goes up),
// and only the uncovered gaps are newly registered. A piece is unregistered when its last holder dies. With unified virtual
// addressing the device address of a registered page equals its host address, so pieces
// made by separate calls still form one contiguous device range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace zerocopy {

class Registration {
 public:
  // Maps [ptr, ptr + nbytes) for every GPU. Throws c10::Error naming the cause and the fix.
  // Must only be called when gpu_backed() is true.
  static std::shared_ptr<Registration> acquire(void* ptr, size_t nbytes);
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  // Device address of a host address inside the registered range.
  void* device_address(const void* host) const;

 private:
  Registration() = default;
  std::vector<uintptr_t> pieces_;  // keys into the piece table, each holding one reference
  intptr_t device_offset_ = 0;     // device address minus host address
};

// The device address of `host` if a live registration covers it, else nullptr.
void* registered_device_address(const void* host);

// Live accounting, for leak tests and `zerocopy doctor`.
struct RegistrationStats {
  int64_t live_pieces;
  int64_t live_bytes;
  int64_t total_registrations;  // cudaHostRegister calls made so far
};
RegistrationStats registration_stats();

}  // namespace zerocopy
