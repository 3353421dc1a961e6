#include "preload/hook_support.hpp"

#include <ctime>

#include "preload/attribution.hpp"
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

void after_free(int result, KeyKind kind, std::uint64_t key, bool nested) {
  count_intercepted_call();
  if (nested || result != 0) return;
  const std::uint64_t start = now_ns();
  record_free(kind, key);
  add_overhead_ns(now_ns() - start);
}

}  // namespace vramledger::preload
