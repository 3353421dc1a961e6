#include "preload/routing.hpp"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "preload/cuda_abi.h"
#include "preload/interposed_functions.hpp"
#include "preload/log.hpp"
#include "preload/real_symbols.hpp"
#include "preload/route_setting.hpp"

namespace vramledger::preload {
namespace {

struct RouteApi {
  decltype(&vramledger_route_init) init = nullptr;
  decltype(&vramledger_route_alloc) alloc = nullptr;
  decltype(&vramledger_route_free) free = nullptr;
  decltype(&vramledger_route_forget_device) forget_device = nullptr;
  decltype(&vramledger_route_release_idle) release_idle = nullptr;
  decltype(&vramledger_route_get_stats) get_stats = nullptr;
};

RouteApi g_api;
bool g_wanted[kCategoryCount] = {};
std::atomic<bool> g_enabled{false};
int g_state = 0;

// The real driver function behind `symbol`: the shim's own memory hooks are skipped, so the
// cache's segments are not mistaken for the allocations it serves.
void* resolve_real_driver(const char* symbol) {
  if (std::strcmp(symbol, "cuMemAlloc_v2") == 0) return real_function(Fn::kMemAlloc, 0);
  if (std::strcmp(symbol, "cuMemFree_v2") == 0) return real_function(Fn::kMemFree, 0);
  return next_definition(Library::kDriver, symbol);
}

bool load_route_library(char* error, std::size_t error_size) {
  char path[900];
  const char* chosen = std::getenv("VRAMLEDGER_PRELOAD_ROUTE_LIBRARY");
  if (chosen == nullptr || chosen[0] == '\0') {
    std::snprintf(path, sizeof path, "%slibvramledger_route.so", shim_directory());
    chosen = path;
  }
  void* handle = real_dlopen()(chosen, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::snprintf(error, error_size, "cannot load %.400s: %.400s", chosen, dlerror());
    return false;
  }
  DlsymFn lookup = real_dlsym();
  g_api.init = reinterpret_cast<decltype(g_api.init)>(lookup(handle, "vramledger_route_init"));
  g_api.alloc = reinterpret_cast<decltype(g_api.alloc)>(lookup(handle, "vramledger_route_alloc"));
  g_api.free = reinterpret_cast<decltype(g_api.free)>(lookup(handle, "vramledger_route_free"));
  g_api.forget_device = reinterpret_cast<decltype(g_api.forget_device)>(
      lookup(handle, "vramledger_route_forget_device"));
  g_api.release_idle = reinterpret_cast<decltype(g_api.release_idle)>(
      lookup(handle, "vramledger_route_release_idle"));
  g_api.get_stats =
      reinterpret_cast<decltype(g_api.get_stats)>(lookup(handle, "vramledger_route_get_stats"));
  if (!g_api.init || !g_api.alloc || !g_api.free || !g_api.forget_device || !g_api.release_idle ||
      !g_api.get_stats) {
    std::snprintf(error, error_size, "%.400s lacks the vramledger_route_* functions", chosen);
    return false;
  }
  char init_error[512] = {};
  if (g_api.init(&resolve_real_driver, std::getenv("VRAMLEDGER_PRELOAD_ROUTE_CONF"), init_error,
                 sizeof init_error) != 0) {
    std::snprintf(error, error_size, "VRAMLEDGER_PRELOAD_ROUTE_CONF: %s", init_error);
    return false;
  }
  return true;
}

}  // namespace

void init_routing() {
  const char* setting = std::getenv("VRAMLEDGER_PRELOAD_ROUTE");
  if (setting == nullptr || setting[0] == '\0' || std::strcmp(setting, "0") == 0) return;
  char error[1024] = {};
  if (!parse_route_setting(setting, g_wanted, error, sizeof error) ||
      !load_route_library(error, sizeof error)) {
    g_state = -1;
    log_line("NOT routing non-torch allocations through vramledger's cache: %s", error);
    return;
  }
  char names[256] = {};
  for (int c = 0; c < kCategoryCount; ++c) {
    if (!g_wanted[c]) continue;
    std::strncat(names, names[0] ? "," : "", sizeof names - std::strlen(names) - 1);
    std::strncat(names, category_name(c), sizeof names - std::strlen(names) - 1);
  }
  g_state = 1;
  g_enabled.store(true, std::memory_order_release);
  log_line("routing cuMemAlloc/cudaMalloc of %s through vramledger's cache (frees synchronise "
           "the device, as cudaFree does)", names);
}

bool routing_enabled() { return g_enabled.load(std::memory_order_relaxed); }
bool route_wanted(Category category) { return g_wanted[category]; }

int route_alloc(std::uint64_t bytes, std::uint64_t* out) {
  return routing_enabled() ? g_api.alloc(bytes, out) : kRouteDeclined;
}

int route_free(std::uint64_t pointer) {
  return routing_enabled() ? g_api.free(pointer) : kRouteDeclined;
}

void route_forget_device(int device) {
  if (routing_enabled()) g_api.forget_device(device);
}

int route_current_device() {
  if (!routing_enabled()) return -1;
  using CtxGetDevice = CUresult (*)(int*);
  auto get_device = reinterpret_cast<CtxGetDevice>(resolve_real_driver("cuCtxGetDevice"));
  int device = -1;
  if (get_device == nullptr || get_device(&device) != 0) return -1;
  return device;
}

std::int64_t route_release_idle() { return routing_enabled() ? g_api.release_idle() : 0; }

int route_state() { return g_state; }

bool route_stats(vramledger_route_stats* out) {
  *out = vramledger_route_stats{};
  if (!routing_enabled()) return false;
  g_api.get_stats(out);
  return true;
}

}  // namespace vramledger::preload
