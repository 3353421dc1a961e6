// The optional routing mode: non-torch cuMemAlloc / cudaMalloc calls served by vramledger's cache
// (libvramledger_route.so) instead of the driver. Off unless VRAMLEDGER_PRELOAD_ROUTE says which
// libraries to route; the cache is loaded only then, so the shim itself stays libc-only.
#pragma once

#include <cstdint>

#include "preload/categories.hpp"
#include "preload/route/route_api.h"

namespace vramledger::preload {

inline constexpr int kRouteDeclined = VRAMLEDGER_ROUTE_DECLINED;

// At load: reads VRAMLEDGER_PRELOAD_ROUTE / _ROUTE_CONF / _ROUTE_LIBRARY, loads the cache, logs
// one line saying what is routed or why nothing is.
void init_routing();

// True once the cache is loaded and some category is routed (one relaxed load).
bool routing_enabled();
bool route_wanted(Category category);

// CUresult, or kRouteDeclined: the caller then calls the real function.
int route_alloc(std::uint64_t bytes, std::uint64_t* out);
int route_free(std::uint64_t pointer);
// The current context's device is about to be reset (cudaDeviceReset, cuDevicePrimaryCtxReset).
void route_forget_device(int device);
// The device of the calling thread's current context; -1 when none or routing is off.
int route_current_device();

// Returns the cache's idle memory to the driver; the bytes released.
std::int64_t route_release_idle();

// 1 routing, 0 off, -1 asked for but not possible (see the log line).
int route_state();
// False (and *out zeroed) when routing is off.
bool route_stats(vramledger_route_stats* out);

}  // namespace vramledger::preload
