#include "unified/host_memory.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

namespace zerocopy {

namespace {

constexpr uint64_t kUnknown = std::numeric_limits<uint64_t>::max();

// The value of `key` ("MemAvailable:") in a "key value [kB]" file, in bytes; kUnknown if absent.
uint64_t read_keyed(const std::string& path, const std::string& key, uint64_t unit) {
  std::ifstream in(path);
  std::string name;
  uint64_t value = 0;
  std::string rest;
  while (in >> name >> value) {
    std::getline(in, rest);
    if (name == key) return value * unit;
  }
  return kUnknown;
}

// A file holding one number (or "max"); kUnknown when absent or unlimited.
uint64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return kUnknown;
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return kUnknown;
  }
}

// This process's cgroup v2 directory ("0::/path" in /proc/self/cgroup).
std::string cgroup_v2_dir() {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return "/sys/fs/cgroup" + line.substr(3);
  }
  return "/sys/fs/cgroup";
}

// Bytes the memory cgroup still allows (its limit minus what it holds that cannot be
// reclaimed); kUnknown without a limit.
uint64_t cgroup_headroom() {
  for (const std::string& dir : {cgroup_v2_dir(), std::string("/sys/fs/cgroup")}) {
    const uint64_t limit = read_number(dir + "/memory.max");
    const uint64_t used = read_number(dir + "/memory.current");
    if (limit == kUnknown || used == kUnknown) continue;
    const uint64_t cache = read_keyed(dir + "/memory.stat", "inactive_file", 1);
    const uint64_t held = used - std::min(used, cache == kUnknown ? 0 : cache);
    return limit > held ? limit - held : 0;
  }
  const std::string v1 = "/sys/fs/cgroup/memory";
  const uint64_t limit = read_number(v1 + "/memory.limit_in_bytes");
  const uint64_t used = read_number(v1 + "/memory.usage_in_bytes");
  if (limit == kUnknown || used == kUnknown || limit >= (uint64_t{1} << 62)) return kUnknown;
  return limit > used ? limit - used : 0;
}

}  // namespace

AvailableHostMemory available_host_memory() {
  const uint64_t avail = read_keyed("/proc/meminfo", "MemAvailable:", 1024);
  const uint64_t swap = read_keyed("/proc/meminfo", "SwapFree:", 1024);
  AvailableHostMemory m{kUnknown, "unknown"};
  if (avail != kUnknown) {
    m.available = avail + (swap == kUnknown ? 0 : swap);
    m.source = swap == kUnknown || swap == 0 ? "MemAvailable" : "MemAvailable + SwapFree";
  }
  const uint64_t headroom = cgroup_headroom();
  if (headroom < m.available) {
    m.available = headroom;
    m.source = "the memory cgroup's limit minus its usage";
  }
  return m;
}

std::string describe_bytes(uint64_t nbytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(nbytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%.1f %s (%llu bytes)", value, units[unit],
                static_cast<unsigned long long>(nbytes));
  return buf;
}

void require_host_memory(uint64_t nbytes, const std::string& what, const std::string& hint) {
  const AvailableHostMemory m = available_host_memory();
  if (m.available == kUnknown || nbytes <= m.available) return;
  TORCH_CHECK_WITH(OutOfMemoryError, false, what, " needs ", describe_bytes(nbytes), " of host memory, but only ",
                   describe_bytes(m.available), " are available (", m.source, ")",
                   hint.empty() ? "" : ": ", hint);
}

}  // namespace zerocopy
