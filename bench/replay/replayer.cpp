#include "bench/replay/replayer.hpp"

#include <algorithm>
#include <chrono>
#include <vector>

namespace vramledger {

ReplayResult replay_workload(const WorkloadTrace& trace, CachingAllocator& allocator,
                             const Ledger& ledger,
                             const std::function<StreamHandle(std::uint32_t)>& stream_for,
                             const ReplayHooks& hooks) {
  std::vector<StreamHandle> streams(trace.stream_handles.size());
  for (std::uint32_t i = 0; i < streams.size(); ++i) streams[i] = stream_for(i);
  // By slot, not by id: ids can be any 64-bit number (a huge one once crashed the replay).
  std::vector<DevicePtr> pointers(trace.allocation_count, 0);
  ReplayResult result;
  // The instant reserved peaks, active memory at that instant (GMLake's "at peak" figure).
  std::int64_t peak_reserved_seen = -1;
  std::size_t op_index = 0;
  auto observe = [&] {
    const LedgerCounters counters = ledger.counters();
    const PoolCounters& all = counters.pools[stat_pool_index(StatPool::kAggregate)];
    if (all.reserved_bytes.current > peak_reserved_seen) {
      peak_reserved_seen = all.reserved_bytes.current;
      result.active_at_peak_reserved = all.active_bytes.current;
      result.peak_reserved_operation = op_index;
    }
  };
  // Driver calls so far and peak reserved, to tell the steady state's calls from the growth's.
  struct Calls {
    std::int64_t creates = 0, maps = 0, unmaps = 0, peak_reserved = 0;
  };
  auto calls_now = [&] {
    const LedgerCounters counters = ledger.counters();
    return Calls{counters.num_device_alloc, counters.num_maps, counters.num_unmaps,
                 counters.pools[stat_pool_index(StatPool::kAggregate)].reserved_bytes.peak};
  };
  Calls before = calls_now();
  const auto start = std::chrono::steady_clock::now();
  for (const WorkloadOp& op : trace.ops) {
    switch (op.kind) {
      case WorkloadOp::Kind::kAlloc:
        try {
          pointers[op.slot] = allocator.allocate(op.bytes, streams[op.stream]);
          ++result.allocations;
          observe();
        } catch (const OutOfMemoryError&) {
          ++result.out_of_memory;
        }
        break;
      case WorkloadOp::Kind::kFree:
      case WorkloadOp::Kind::kFreeCompleted:
        if (pointers[op.slot] != 0) allocator.deallocate(pointers[op.slot]);
        pointers[op.slot] = 0;
        break;
      case WorkloadOp::Kind::kFreeRequested:
        // Other streams still use it: its memory stays taken until the completion record.
        break;
    }
    if (hooks.after_operation) hooks.after_operation();
    const Calls after = calls_now();
    const auto made = static_cast<std::uint64_t>((after.creates - before.creates) +
                                                 (after.maps - before.maps) +
                                                 (after.unmaps - before.unmaps));
    result.calls_by_tenth[op_index * 10 / trace.ops.size()] += made;
    if (made > 0 && after.peak_reserved == before.peak_reserved) {
      result.steady_device_allocations += static_cast<std::uint64_t>(after.creates - before.creates);
      result.steady_maps += static_cast<std::uint64_t>(after.maps - before.maps);
      result.steady_unmaps += static_cast<std::uint64_t>(after.unmaps - before.unmaps);
    }
    before = after;
    if (op_index == hooks.stop_after) {
      if (hooks.at_stop) hooks.at_stop();
      break;
    }
    ++op_index;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.operations = trace.ops.size();
  for (DevicePtr p : pointers) {
    if (p != 0) allocator.deallocate(p);
  }
  const LedgerCounters counters = ledger.counters();
  const PoolCounters& all = counters.pools[stat_pool_index(StatPool::kAggregate)];
  result.peak_reserved_bytes = all.reserved_bytes.peak;
  result.peak_requested_bytes = all.requested_bytes.peak;
  result.peak_active_bytes = all.active_bytes.peak;
  if (result.peak_requested_bytes > 0) {
    result.overhead_ratio = static_cast<double>(result.peak_reserved_bytes) /
                            static_cast<double>(result.peak_requested_bytes);
  }
  if (result.peak_reserved_bytes > 0) {
    result.gmlake_ratio = 1.0 - static_cast<double>(result.peak_active_bytes) /
                                    static_cast<double>(result.peak_reserved_bytes);
  }
  result.device_allocations = static_cast<std::uint64_t>(counters.num_device_alloc);
  result.device_frees = static_cast<std::uint64_t>(counters.num_device_free);
  result.maps = static_cast<std::uint64_t>(counters.num_maps);
  result.unmaps = static_cast<std::uint64_t>(counters.num_unmaps);
  result.host_waits = static_cast<std::uint64_t>(allocator.census().host_waits);
  return result;
}

}  // namespace vramledger
