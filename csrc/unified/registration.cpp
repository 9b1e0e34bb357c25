#include "unified/registration.h"

#include "unified/host_mapper.h"

#include <c10/util/Exception.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>

namespace zerocopy {

namespace {

// The driver rejects very large single registrations (tables over 256 GiB), so ranges are
// registered in pieces of at most this many bytes. PYTORCH_ZEROCOPY_MAX_REGISTER_BYTES lowers it
// (drivers with smaller limits; tests of the chunked path).
size_t max_piece_bytes() {
  static const size_t value = [] {
    size_t v = size_t(64) << 30;
    if (const char* env = std::getenv("PYTORCH_ZEROCOPY_MAX_REGISTER_BYTES")) {
      const long long parsed = std::atoll(env);
      if (parsed > 0) v = static_cast<size_t>(parsed);
    }
    return v;
  }();
  return value;
}

struct Piece {
  uintptr_t end;
  int64_t refs;
  bool owned;  // false: page-locked by someone else; never unregistered by us
  intptr_t device_offset;
};

std::mutex g_mutex;
std::map<uintptr_t, Piece> g_pieces;  // start -> piece; pieces never overlap
int64_t g_live_bytes = 0;
int64_t g_total_registrations = 0;

size_t page_size() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// Drops one reference to each piece; unmaps pieces that reach zero. Caller holds g_mutex.
void release_locked(const std::vector<uintptr_t>& keys) {
  for (uintptr_t key : keys) {
    auto it = g_pieces.find(key);
    TORCH_INTERNAL_ASSERT(it != g_pieces.end(), "unified: released an unknown piece");
    if (--it->second.refs > 0) continue;
    if (it->second.owned) {
      host_mapper()->unmap(reinterpret_cast<void*>(key));
    }
    g_live_bytes -= static_cast<int64_t>(it->second.end - key);
    g_pieces.erase(it);
  }
}

}  // namespace

std::shared_ptr<Registration> Registration::acquire(void* ptr, size_t nbytes) {
  HostMapper* mapper = host_mapper();
  TORCH_INTERNAL_ASSERT(mapper != nullptr, "unified: no GPU mapper in this build");
  // The exact byte range, not its page hull: CUDA treats a registered range as pinned, and a
  // hull would make copies from unrelated pageable memory on the same pages fail.
  const size_t page = page_size();
  const uintptr_t begin = reinterpret_cast<uintptr_t>(ptr);
  const uintptr_t end = begin + std::max<size_t>(nbytes, 1);

  std::shared_ptr<Registration> reg(new Registration());
  bool have_offset = false;
  auto note_offset = [&](intptr_t offset) {
    if (!have_offset) {
      reg->device_offset_ = offset;
      have_offset = true;
    }
    TORCH_CHECK(reg->device_offset_ == offset,
                "unified: this tensor spans host ranges that the GPU maps at unrelated addresses; "
                "this GPU/driver lacks unified addressing for registered memory, so such a "
                "tensor cannot be mapped. Allocate it with pytorch_zerocopy.empty_unified.");
  };

  std::lock_guard<std::mutex> lock(g_mutex);
  try {
    uintptr_t cursor = begin;
    // The first piece that could overlap [begin, end) starts at or before begin.
    auto it = g_pieces.upper_bound(begin);
    if (it != g_pieces.begin()) {
      auto prev = std::prev(it);
      if (prev->second.end > begin) it = prev;
    }
    while (cursor < end) {
      if (it != g_pieces.end() && it->first <= cursor) {
        // Share an existing piece.
        it->second.refs += 1;
        reg->pieces_.push_back(it->first);
        note_offset(it->second.device_offset);
        cursor = it->second.end;
        ++it;
        continue;
      }
      // Register the gap up to the next piece (or the end), in bounded chunks.
      uintptr_t gap_end = end;
      if (it != g_pieces.end() && it->first < gap_end) gap_end = it->first;
      gap_end = std::min<uintptr_t>(gap_end, std::max<uintptr_t>(cursor + page, (cursor + max_piece_bytes()) / page * page));
      bool owned = true;
      void* device = mapper->map(reinterpret_cast<void*>(cursor), gap_end - cursor, &owned);
      const intptr_t offset = reinterpret_cast<intptr_t>(device) - static_cast<intptr_t>(cursor);
      auto inserted = g_pieces.emplace(cursor, Piece{gap_end, 1, owned, offset}).first;
      g_live_bytes += static_cast<int64_t>(gap_end - cursor);
      g_total_registrations += owned ? 1 : 0;
      reg->pieces_.push_back(cursor);
      cursor = gap_end;
      it = std::next(inserted);
      note_offset(offset);
    }
  } catch (...) {
    release_locked(reg->pieces_);
    reg->pieces_.clear();
    throw;
  }
  return reg;
}

Registration::~Registration() {
  if (pieces_.empty()) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  try {
    release_locked(pieces_);
  } catch (const std::exception& e) {
    // A destructor must not throw; the mapping is leaked rather than the process aborted.
    TORCH_WARN("unified: releasing a host registration failed: ", e.what());
  }
}

void* Registration::device_address(const void* host) const {
  return reinterpret_cast<void*>(reinterpret_cast<intptr_t>(host) + device_offset_);
}

void* registered_device_address(const void* host) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(host);
  std::lock_guard<std::mutex> lock(g_mutex);
  auto it = g_pieces.upper_bound(address);
  if (it == g_pieces.begin()) return nullptr;
  --it;
  if (address >= it->second.end) return nullptr;
  return reinterpret_cast<void*>(static_cast<intptr_t>(address) + it->second.device_offset);
}

RegistrationStats registration_stats() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return RegistrationStats{static_cast<int64_t>(g_pieces.size()), g_live_bytes, g_total_registrations};
}

}  // namespace zerocopy
