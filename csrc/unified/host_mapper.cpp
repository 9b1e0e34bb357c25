#include "unified/host_mapper.h"

namespace zerocopy {

namespace {
HostMapper* g_mapper = nullptr;
}

HostMapper* host_mapper() { return g_mapper; }

void install_host_mapper(HostMapper* mapper) { g_mapper = mapper; }

bool gpu_backed() { return g_mapper != nullptr && g_mapper->gpu_available(); }

}  // namespace zerocopy
