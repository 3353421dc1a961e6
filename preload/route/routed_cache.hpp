// The cache behind routed non-torch allocations: one vramledger CachingAllocator per device over
// that device's primary context, serving cuMemAlloc / cudaMalloc calls of other libraries.
//
// Semantics kept from the driver: an allocation lands on the device of the caller's current
// context; a free waits for the device to finish its queued work first (cudaFree and cuMemFree
// synchronise), so a block is never handed out again while a kernel may still use it; errors are
// CUresults. One mutex for every device: routed calls replace calls that cost tens of
// microseconds, and the synchronisation on free runs outside it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "allocator/config.hpp"
#include "preload/route/route_api.h"
#include "preload/route/route_driver.hpp"

namespace vramledger::route {

class RoutedCache {
 public:
  // Asks the process's other vramledger cache (the torch allocator) to give its idle memory back
  // to the driver; true when it may have freed something. Called without the cache's lock.
  using ReleaseElsewhere = std::function<bool()>;

  RoutedCache(vramledger_route_resolve_fn resolve, Config config,
              ReleaseElsewhere release_elsewhere = nullptr);
  ~RoutedCache();

  // CUresult, or VRAMLEDGER_ROUTE_DECLINED.
  int allocate(std::uint64_t bytes, std::uint64_t* out);
  int free(std::uint64_t pointer);
  std::int64_t release_idle();
  void forget_device(int device);
  vramledger_route_stats stats() const;

 private:
  struct DeviceCache;

  // The driver table, loaded on first use (libcuda may load after the shim). False if absent.
  bool driver_ready();
  // The cache of the device whose primary context is current, or nullptr (declined).
  DeviceCache* current_device_cache();
  // One allocation attempt under the lock: CUresult or declined; counts nothing but declines.
  int attempt_allocation(std::uint64_t bytes, std::uint64_t* out);
  DeviceCache* owner_of(std::uint64_t pointer) const;
  bool inside_segment(std::uint64_t pointer) const;
  // Recomputes reserved / idle and their peaks; mutex_ held.
  void refresh_totals();

  vramledger_route_resolve_fn resolve_;
  Config config_;
  ReleaseElsewhere release_elsewhere_;
  RouteDriver driver_;
  bool driver_loaded_ = false;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<DeviceCache>> devices_;  // indexed by CUdevice, null until used
  vramledger_route_stats totals_{};
};

}  // namespace vramledger::route
