// Integer tuning knobs read from the environment, checked: an unset or empty variable gives the
// fallback; anything else must be an integer in [lo, hi] or the call fails with a ValueError.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>

namespace zerocopy {

inline int env_int(const char* name, int fallback, int lo, int hi) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  TORCH_CHECK_VALUE(end != nullptr && *end == '\0' && v >= lo && v <= hi, name, " must be an integer in [", lo,
                    ", ", hi, "], got '", env, "'");
  return static_cast<int>(v);
}

}  // namespace zerocopy
