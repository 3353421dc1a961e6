#include "preload/hook_support.hpp"

#include <ctime>

#include "preload/attribution.hpp"
#include "preload/routing.hpp"
#include "preload/usage_counters.hpp"

namespace vramledger::preload {
namespace {

// initial-exec: a preloaded library gets static TLS, and the general-dynamic model could call
// __tls_get_addr, which may allocate on first use in a thread.
__attribute__((tls_model("initial-exec"))) thread_local int t_runtime_depth = 0;

std::uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no system call, no allocation
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull +
         static_cast<std::uint64_t>(ts.tv_nsec);
}

}  // namespace

RuntimeCallScope::RuntimeCallScope() { ++t_runtime_depth; }
RuntimeCallScope::~RuntimeCallScope() { --t_runtime_depth; }
bool inside_runtime_call() { return t_runtime_depth > 0; }

void after_allocation(int result, KeyKind kind, std::uint64_t key, std::uint64_t bytes,
                      const void* return_address, bool nested) {
  count_intercepted_call();
  if (nested) return;
  const std::uint64_t start = now_ns();
  const Category category = category_of_caller(return_address);
  if (result == 0) {
    record_allocation(kind, key, bytes, category);
  } else {
    record_failed_allocation(category);
  }
  add_overhead_ns(now_ns() - start);
}

FreeInProgress::FreeInProgress(KeyKind kind, std::uint64_t key, bool nested)
    : kind_(kind), key_(key), nested_(nested) {
  if (nested_) return;
  const std::uint64_t start = now_ns();
  recorded_ = take_record(kind_, key_, &record_);
  add_overhead_ns(now_ns() - start);
}

void FreeInProgress::cancel() {
  if (recorded_) restore_record(kind_, key_, record_);
  recorded_ = false;
}

void FreeInProgress::finish(int result) {
  count_intercepted_call();
  if (nested_) return;
  const std::uint64_t start = now_ns();
  if (result != 0) {
    if (recorded_) restore_record(kind_, key_, record_);  // the memory is still allocated
  } else if (recorded_) {
    account_free(record_);
  } else if (key_ != 0) {  // free(0) is a no-op
    count_untracked_free();
  }
  add_overhead_ns(now_ns() - start);
}

int try_routed_allocation(std::uint64_t bytes, std::uint64_t* out, const void* return_address) {
  if (!routing_enabled()) return kRouteDeclined;
  const Category category = category_of_caller(return_address);
  if (!route_wanted(category)) return kRouteDeclined;
  const int result = route_alloc(bytes, out);
  if (result == kRouteDeclined) return result;
  count_intercepted_call();
  if (result == 0) {
    record_allocation(KeyKind::kDevicePointer, *out, bytes, category, /*routed=*/true);
  } else {
    record_failed_allocation(category);
  }
  return result;
}

int try_routed_free(std::uint64_t pointer) {
  if (!routing_enabled() || pointer == 0) return kRouteDeclined;
  // Taken out first: the cache can hand the address to another thread as soon as it has it back.
  FreeInProgress free_call(KeyKind::kDevicePointer, pointer, /*nested=*/false);
  const int result = route_free(pointer);
  if (result == kRouteDeclined) {
    free_call.cancel();  // the real free follows, with its own bookkeeping
    return result;
  }
  free_call.finish(result);
  return result;
}

}  // namespace vramledger::preload
