// The LD_PRELOAD shim's routing mode keeps other libraries' freed memory in its own cache
// (docs/preload.md). Memory idle there would have served torch without routing, so the torch
// allocator asks for it before reporting out of memory.
#pragma once

#include <cstdint>

namespace vramledger::torch_plugin {

// Bytes the shim's routed cache gave back to the driver; 0 when the shim is absent, routing is
// off or nothing was idle. Never throws.
std::int64_t release_routed_cache_idle() noexcept;

}  // namespace vramledger::torch_plugin
