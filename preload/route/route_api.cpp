// The C functions of libvramledger_route.so (route_api.h). Nothing escapes as an exception.
#include <dlfcn.h>

#include <cstdio>
#include <exception>

#include "allocator/config.hpp"
#include "preload/route/route_api.h"
#include "preload/route/routed_cache.hpp"

namespace {

// Created once and never destroyed: the shim's hooks can run during exit, after static
// destructors, and must still find the cache.
vramledger::route::RoutedCache* g_cache = nullptr;

// The vramledger torch allocator, when the process has it (loaded RTLD_GLOBAL by the Python
// package and by the shim's install): its idle memory goes back to the driver.
bool empty_torch_cache() {
  using EmptyCache = int (*)();
  auto empty_cache = reinterpret_cast<EmptyCache>(dlsym(RTLD_DEFAULT, "vramledger_empty_cache"));
  return empty_cache != nullptr && empty_cache() == 0;
}

void write_error(char* error, size_t size, const char* message) {
  if (error != nullptr && size > 0) std::snprintf(error, size, "%s", message);
}

}  // namespace

extern "C" {

int vramledger_route_init(vramledger_route_resolve_fn resolve, const char* config, char* error,
                          size_t error_size) {
  if (g_cache != nullptr) return 0;
  if (resolve == nullptr) {
    write_error(error, error_size, "no driver resolver");
    return -1;
  }
  try {
    vramledger::Config parsed = vramledger::parse_config(config != nullptr ? config : "");
    if (parsed.backend != "auto" && parsed.backend != "cuda_malloc") {
      write_error(error, error_size,
                  "backend must be auto or cuda_malloc: routed allocations are cuMemAlloc segments");
      return -1;
    }
    g_cache = new vramledger::route::RoutedCache(resolve, std::move(parsed), &empty_torch_cache);
    return 0;
  } catch (const std::exception& e) {
    write_error(error, error_size, e.what());
    return -1;
  }
}

int vramledger_route_alloc(uint64_t bytes, uint64_t* out) {
  return g_cache != nullptr ? g_cache->allocate(bytes, out) : VRAMLEDGER_ROUTE_DECLINED;
}

int vramledger_route_free(uint64_t pointer) {
  return g_cache != nullptr ? g_cache->free(pointer) : VRAMLEDGER_ROUTE_DECLINED;
}

int64_t vramledger_route_release_idle(void) {
  return g_cache != nullptr ? g_cache->release_idle() : 0;
}

void vramledger_route_forget_device(int device) {
  if (g_cache != nullptr) g_cache->forget_device(device);
}

void vramledger_route_get_stats(vramledger_route_stats* out) {
  if (out == nullptr) return;
  *out = g_cache != nullptr ? g_cache->stats() : vramledger_route_stats{};
}

}  // extern "C"
