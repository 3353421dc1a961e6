#include "preload/route/routed_cache.hpp"

#include <algorithm>

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/errors.hpp"
#include "preload/route/driver_segment_backend.hpp"

namespace vramledger::route {

struct RoutedCache::DeviceCache {
  DeviceCache(const RouteDriver& driver, CUdevice device, CUcontext primary,
              const AllocatorOptions& options)
      : context(primary),
        backend(driver, device, primary),
        ledger(LedgerOptions{.trace_capacity = 0}),
        allocator(backend, &ledger, options) {}

  CUcontext context;
  DriverSegmentBackend backend;
  Ledger ledger;
  CachingAllocator allocator;
};

namespace {

constexpr StreamHandle kLegacyStream = 0;  // frees synchronise, so one stream serves every caller

int to_cuda_result(const Error& error, const DriverSegmentBackend& backend) {
  switch (error.code()) {
    case ErrorCode::kOutOfMemory: return kCudaErrorOutOfMemory;
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kInvalidPointer:
    case ErrorCode::kDoubleFree: return kCudaErrorInvalidValue;
    case ErrorCode::kDriverError:
      return backend.last_error() != kCudaSuccess ? backend.last_error() : kCudaErrorUnknown;
    default: return kCudaErrorUnknown;
  }
}

}  // namespace

RoutedCache::RoutedCache(vramledger_route_resolve_fn resolve, Config config,
                         ReleaseElsewhere release_elsewhere)
    : resolve_(resolve), config_(std::move(config)), release_elsewhere_(std::move(release_elsewhere)) {
  config_.options.use_paged_heap = false;  // cuMemAlloc segments: no virtual memory
}

// Leaked at exit by its owner (route_api.cpp): hooks may still run during exit. When it is
// destroyed (tests), cached segments go back to the driver and live blocks are left alone.
RoutedCache::~RoutedCache() = default;

bool RoutedCache::driver_ready() {
  if (driver_loaded_) return true;
  std::string missing;
  driver_loaded_ = driver_.load(resolve_, &missing);
  return driver_loaded_;
}

RoutedCache::DeviceCache* RoutedCache::current_device_cache() {
  if (!driver_ready()) return nullptr;
  CUcontext current = nullptr;
  if (driver_.ctx_get_current(&current) != kCudaSuccess || current == nullptr) return nullptr;
  CUdevice device = -1;
  if (driver_.ctx_get_device(&device) != kCudaSuccess || device < 0) return nullptr;
  const auto index = static_cast<std::size_t>(device);
  if (index >= devices_.size()) devices_.resize(index + 1);
  if (devices_[index] == nullptr) {
    // An inactive primary context cannot be the current one; retaining it would start it (and
    // spend device memory on it) for a program that only uses contexts of its own.
    unsigned int flags = 0;
    int active = 0;
    if (driver_.primary_ctx_get_state(device, &flags, &active) != kCudaSuccess || active == 0) {
      return nullptr;
    }
    // Retained for the rest of the process: the cache's segments live in this context, so it
    // must not be destroyed under them when the program releases its last reference.
    CUcontext primary = nullptr;
    if (driver_.primary_ctx_retain(&primary, device) != kCudaSuccess) return nullptr;
    devices_[index] = std::make_unique<DeviceCache>(driver_, device, primary, config_.options);
  }
  // Memory of a context the program created itself dies with that context: not ours to cache.
  return devices_[index]->context == current ? devices_[index].get() : nullptr;
}

RoutedCache::DeviceCache* RoutedCache::owner_of(std::uint64_t pointer) const {
  for (const auto& cache : devices_) {
    if (cache != nullptr && cache->allocator.owns(static_cast<DevicePtr>(pointer))) {
      return cache.get();
    }
  }
  return nullptr;
}

int RoutedCache::allocate(std::uint64_t bytes, std::uint64_t* out) {
  if (out == nullptr || bytes == 0) return VRAMLEDGER_ROUTE_DECLINED;  // the driver's own error
  // The allocator has already given this cache's idle memory back and retried; memory the torch
  // allocator holds idle would have served the program without routing, so ask for it too.
  int result = attempt_allocation(bytes, out);
  if (result == kCudaErrorOutOfMemory && release_elsewhere_ && release_elsewhere_()) {
    result = attempt_allocation(bytes, out);
  }
  std::lock_guard lock(mutex_);
  if (result == kCudaSuccess) {
    ++totals_.allocations;
  } else if (result != VRAMLEDGER_ROUTE_DECLINED) {
    ++totals_.failed;
  }
  refresh_totals();  // an out-of-memory retry may have released cached segments
  return result;
}

int RoutedCache::attempt_allocation(std::uint64_t bytes, std::uint64_t* out) {
  std::lock_guard lock(mutex_);
  DeviceCache* cache = nullptr;
  try {
    cache = current_device_cache();
    if (cache == nullptr) {
      ++totals_.declined;
      return VRAMLEDGER_ROUTE_DECLINED;
    }
    *out = cache->allocator.allocate(static_cast<std::size_t>(bytes), kLegacyStream);
    return kCudaSuccess;
  } catch (const Error& error) {
    // A size beyond what the allocator can describe is one no device could hold: the driver
    // answers cuMemAlloc with out of memory there, not with an invalid value.
    if (error.code() == ErrorCode::kInvalidArgument) return kCudaErrorOutOfMemory;
    return cache != nullptr ? to_cuda_result(error, cache->backend) : kCudaErrorUnknown;
  } catch (...) {
    return kCudaErrorOutOfMemory;  // std::bad_alloc of the host-side bookkeeping
  }
}

int RoutedCache::free(std::uint64_t pointer) {
  CUcontext context = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (pointer == 0 || !driver_loaded_) return VRAMLEDGER_ROUTE_DECLINED;
    DeviceCache* cache = owner_of(pointer);
    if (cache == nullptr) {
      // A pointer inside the cache's memory that is not a live block (a double free, an interior
      // pointer) must not reach the driver: at a segment's start it would free the segment
      // under the cache.
      if (inside_segment(pointer)) {
        ++totals_.failed;
        return kCudaErrorInvalidValue;
      }
      return VRAMLEDGER_ROUTE_DECLINED;
    }
    context = cache->context;
  }
  // cudaFree / cuMemFree return only once the device has finished the work queued before them;
  // kernels of any stream may still read this block, so do the same before it can be reused.
  CUresult result = driver_.ctx_push_current(context);
  if (result == kCudaSuccess) {
    result = driver_.ctx_synchronize();
    CUcontext popped = nullptr;
    (void)driver_.ctx_pop_current(&popped);
  }
  std::lock_guard lock(mutex_);
  if (result != kCudaSuccess) {
    ++totals_.failed;  // the allocation stays live: nothing is lost, the caller sees the error
    return result;
  }
  DeviceCache* cache = owner_of(pointer);
  if (cache == nullptr) {
    // Freed by another thread meanwhile (or its device forgotten): an error returned to the
    // caller, so counted like the other failed calls.
    ++totals_.failed;
    return kCudaErrorInvalidValue;
  }
  try {
    cache->allocator.deallocate(static_cast<DevicePtr>(pointer));
  } catch (const Error& error) {
    ++totals_.failed;
    return to_cuda_result(error, cache->backend);
  }
  ++totals_.frees;
  refresh_totals();
  return kCudaSuccess;
}

std::int64_t RoutedCache::release_idle() {
  std::lock_guard lock(mutex_);
  const std::int64_t before = totals_.reserved_bytes;
  for (auto& cache : devices_) {
    if (cache == nullptr) continue;
    try {
      cache->allocator.empty_cache();
    } catch (const Error&) {
      ++totals_.failed;  // a driver failure: what could not be freed stays cached and counted
    }
  }
  refresh_totals();
  return before - totals_.reserved_bytes;
}

void RoutedCache::forget_device(int device) {
  std::lock_guard lock(mutex_);
  if (device < 0 || static_cast<std::size_t>(device) >= devices_.size()) return;
  std::unique_ptr<DeviceCache>& cache = devices_[static_cast<std::size_t>(device)];
  if (cache == nullptr) return;
  cache->backend.abandon();
  cache.reset();  // a later allocation retains the new primary context and starts afresh
  refresh_totals();
}

bool RoutedCache::inside_segment(std::uint64_t pointer) const {
  for (const auto& cache : devices_) {
    if (cache != nullptr && cache->backend.contains(static_cast<DevicePtr>(pointer))) return true;
  }
  return false;
}

void RoutedCache::refresh_totals() {
  std::int64_t reserved = 0;
  std::int64_t live = 0;
  std::int64_t devices = 0;
  for (const auto& cache : devices_) {
    if (cache == nullptr) continue;
    const LedgerCounters counters = cache->ledger.counters();
    const PoolCounters& all = counters.pools[stat_pool_index(StatPool::kAggregate)];
    reserved += all.reserved_bytes.current;
    live += all.requested_bytes.current;
    ++devices;
  }
  totals_.reserved_bytes = reserved;
  totals_.live_bytes = live;
  totals_.idle_bytes = reserved - live;  // reserved >= allocated block sizes >= requested
  totals_.devices = devices;
  totals_.reserved_peak_bytes = std::max(totals_.reserved_peak_bytes, reserved);
  totals_.idle_peak_bytes = std::max(totals_.idle_peak_bytes, totals_.idle_bytes);
}

vramledger_route_stats RoutedCache::stats() const {
  std::lock_guard lock(mutex_);
  return totals_;
}

}  // namespace vramledger::route
