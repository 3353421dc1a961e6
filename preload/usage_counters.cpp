#include "preload/usage_counters.hpp"

#include <atomic>

#include "preload/routing.hpp"

namespace vramledger::preload {
namespace {

struct CategoryCounters {
  std::atomic<std::int64_t> current_bytes{0};
  std::atomic<std::int64_t> peak_bytes{0};
  std::atomic<std::int64_t> live_allocations{0};
  std::atomic<std::int64_t> allocations{0};
  std::atomic<std::int64_t> frees{0};
  std::atomic<std::int64_t> failed_calls{0};
  std::atomic<std::int64_t> routed_current_bytes{0};
};

CategoryCounters g_categories[kCategoryCount];
std::atomic<std::int64_t> g_intercepted_calls{0};
std::atomic<std::int64_t> g_table_overflow{0};
std::atomic<std::int64_t> g_table_overflow_bytes{0};
std::atomic<std::int64_t> g_untracked_frees{0};
std::atomic<std::int64_t> g_unwrapped_lookups{0};
std::atomic<std::int64_t> g_torch_install{0};
std::atomic<std::uint64_t> g_overhead_ns{0};

void raise_peak(std::atomic<std::int64_t>& peak, std::int64_t value) {
  std::int64_t seen = peak.load(std::memory_order_relaxed);
  while (value > seen && !peak.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

void forget(const AllocationRecord& record) {
  CategoryCounters& counters = g_categories[record.category];
  counters.current_bytes.fetch_sub(static_cast<std::int64_t>(record.bytes), std::memory_order_relaxed);
  if (record.routed) {
    counters.routed_current_bytes.fetch_sub(static_cast<std::int64_t>(record.bytes),
                                            std::memory_order_relaxed);
  }
  counters.live_allocations.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace

void record_allocation(KeyKind kind, std::uint64_t key, std::uint64_t bytes, Category category,
                       bool routed) {
  AllocationRecord replaced{};
  // A live key handed out again means its free was missed (e.g. freed by a path we do not see):
  // drop the stale record first so the bytes are not counted twice.
  if (allocation_table().erase(kind, key, &replaced)) {
    forget(replaced);
    g_untracked_frees.fetch_add(1, std::memory_order_relaxed);
  }
  if (!allocation_table().insert(kind, key, AllocationRecord{bytes, category, routed})) {
    g_table_overflow.fetch_add(1, std::memory_order_relaxed);
    g_table_overflow_bytes.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed);
    return;
  }
  CategoryCounters& counters = g_categories[category];
  const std::int64_t now =
      counters.current_bytes.fetch_add(static_cast<std::int64_t>(bytes), std::memory_order_relaxed) +
      static_cast<std::int64_t>(bytes);
  raise_peak(counters.peak_bytes, now);
  if (routed) {
    counters.routed_current_bytes.fetch_add(static_cast<std::int64_t>(bytes),
                                            std::memory_order_relaxed);
  }
  counters.live_allocations.fetch_add(1, std::memory_order_relaxed);
  counters.allocations.fetch_add(1, std::memory_order_relaxed);
}

bool take_record(KeyKind kind, std::uint64_t key, AllocationRecord* out) {
  return allocation_table().erase(kind, key, out);
}

void account_free(const AllocationRecord& record) {
  forget(record);
  g_categories[record.category].frees.fetch_add(1, std::memory_order_relaxed);
}

void restore_record(KeyKind kind, std::uint64_t key, const AllocationRecord& record) {
  if (allocation_table().insert(kind, key, record)) return;
  // Only if the table filled up meanwhile: the bytes move to the overflow figures (a loud gap).
  forget(record);
  g_table_overflow.fetch_add(1, std::memory_order_relaxed);
  g_table_overflow_bytes.fetch_add(static_cast<std::int64_t>(record.bytes), std::memory_order_relaxed);
}

void count_untracked_free() { g_untracked_frees.fetch_add(1, std::memory_order_relaxed); }

void record_failed_allocation(Category category) {
  g_categories[category].failed_calls.fetch_add(1, std::memory_order_relaxed);
}

void count_intercepted_call() { g_intercepted_calls.fetch_add(1, std::memory_order_relaxed); }
void count_unwrapped_lookup() { g_unwrapped_lookups.fetch_add(1, std::memory_order_relaxed); }
void add_overhead_ns(std::uint64_t ns) { g_overhead_ns.fetch_add(ns, std::memory_order_relaxed); }
void set_torch_install_state(int state) { g_torch_install.store(state, std::memory_order_relaxed); }
std::uint64_t overhead_ns() { return g_overhead_ns.load(std::memory_order_relaxed); }

void fill_stats(vramledger_preload_stats* out) {
  *out = vramledger_preload_stats{};
  for (int c = 0; c < kCategoryCount; ++c) {
    const CategoryCounters& in = g_categories[c];
    vramledger_preload_category_stats& to = out->categories[c];
    to.current_bytes = in.current_bytes.load(std::memory_order_relaxed);
    to.peak_bytes = in.peak_bytes.load(std::memory_order_relaxed);
    to.live_allocations = in.live_allocations.load(std::memory_order_relaxed);
    to.allocations = in.allocations.load(std::memory_order_relaxed);
    to.frees = in.frees.load(std::memory_order_relaxed);
    to.failed_calls = in.failed_calls.load(std::memory_order_relaxed);
    to.routed_current_bytes = in.routed_current_bytes.load(std::memory_order_relaxed);
    if (c == VRAMLEDGER_PRELOAD_ROUTED_CACHE) continue;  // filled from the routed cache below
    if (c != VRAMLEDGER_PRELOAD_TORCH && c != VRAMLEDGER_PRELOAD_VRAMLEDGER) {
      out->non_torch_current_bytes += to.current_bytes;
    }
  }
  out->intercepted_calls = g_intercepted_calls.load(std::memory_order_relaxed);
  out->table_capacity = static_cast<std::int64_t>(AllocationTable::kCapacity);
  out->table_live = static_cast<std::int64_t>(allocation_table().live());
  out->table_overflow = g_table_overflow.load(std::memory_order_relaxed);
  out->table_overflow_bytes = g_table_overflow_bytes.load(std::memory_order_relaxed);
  out->untracked_frees = g_untracked_frees.load(std::memory_order_relaxed);
  out->unwrapped_lookups = g_unwrapped_lookups.load(std::memory_order_relaxed);
  out->torch_install = g_torch_install.load(std::memory_order_relaxed);
  vramledger_route_stats route{};
  out->route_state = route_state();
  if (route_stats(&route)) {
    // Idle = reserved - live, taken in one snapshot under the cache's lock: the routed
    // allocations themselves are already in their libraries' lines.
    vramledger_preload_category_stats& idle = out->categories[VRAMLEDGER_PRELOAD_ROUTED_CACHE];
    idle.current_bytes = route.idle_bytes;
    idle.peak_bytes = route.idle_peak_bytes;
    out->non_torch_current_bytes += route.idle_bytes;
    out->routed_reserved_bytes = route.reserved_bytes;
    out->routed_reserved_peak_bytes = route.reserved_peak_bytes;
    out->routed_live_bytes = route.live_bytes;
    out->routed_allocations = route.allocations;
    out->routed_declined = route.declined;
    out->routed_failed = route.failed;
  }
}

}  // namespace vramledger::preload
