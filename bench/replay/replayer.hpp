// Replays a workload trace against one CachingAllocator and reports what it cost.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "bench/replay/workload_trace.hpp"

namespace vramledger {

struct ReplayResult {
  std::size_t operations = 0;
  std::size_t allocations = 0;
  std::size_t out_of_memory = 0;          // requests the allocator refused (skipped)
  std::int64_t peak_reserved_bytes = 0;   // physical memory held, at its peak
  std::int64_t peak_requested_bytes = 0;  // torch's requested_bytes peak
  std::int64_t peak_active_bytes = 0;
  std::int64_t active_at_peak_reserved = 0;
  double overhead_ratio = 0;              // peak reserved / peak requested
  double gmlake_ratio = 0;                // 1 - peak active / peak reserved
  std::uint64_t device_allocations = 0;   // segments and physical pages created
  std::uint64_t device_frees = 0;
  std::uint64_t maps = 0;
  std::uint64_t unmaps = 0;
  // The same driver calls made by operations that did not raise peak reserved: the steady
  // state's cost (a real program pays ~20-30 us of CPU per call, every step), as opposed to the
  // calls that build up the heap while its peak grows, which a warm program no longer makes.
  std::uint64_t steady_device_allocations = 0;
  std::uint64_t steady_maps = 0;
  std::uint64_t steady_unmaps = 0;
  // Times the allocator stopped the replaying thread until the (simulated) GPU caught up
  // (BlockCensus::host_waits): on a GPU, each one lets the queue run dry.
  std::uint64_t host_waits = 0;
  // Driver calls (creates, maps, unmaps) made in each tenth of the trace's operations.
  std::uint64_t calls_by_tenth[10] = {};
  double seconds = 0;                     // wall time of the replay loop
  // The operation (0-based) after which reserved memory first stood at its final peak.
  std::size_t peak_reserved_operation = 0;
};

// Optional hooks of a replay: `after_operation` runs after each replayed operation (e.g.
// SimulatedGpuLag); `at_stop` runs after operation `stop_after` (the replay then ends there,
// before the cleanup frees), with the allocator and ledger as that operation left them.
struct ReplayHooks {
  std::function<void()> after_operation;
  std::size_t stop_after = SIZE_MAX;
  std::function<void()> at_stop;
};

// Hooks that only run `after_operation` after each operation.
inline ReplayHooks after_each_operation(std::function<void()> after_operation) {
  ReplayHooks hooks;
  hooks.after_operation = std::move(after_operation);
  return hooks;
}

// `stream_for(index)` gives the backend stream standing for the trace's stream `index`.
// Allocations still live at the end of the trace (or at hooks.stop_after) are freed afterwards
// (not counted in time).
ReplayResult replay_workload(const WorkloadTrace& trace, CachingAllocator& allocator,
                             const Ledger& ledger,
                             const std::function<StreamHandle(std::uint32_t)>& stream_for,
                             const ReplayHooks& hooks = {});

}  // namespace vramledger
