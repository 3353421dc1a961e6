#include "tests/stress/allocator_state.hpp"

#include "tests/stress/concat.hpp"

namespace vramledger::stress {

AllocatorState AllocatorState::take(CachingAllocator& allocator, const Ledger& ledger,
                                    const SimulatedDevice& device) {
  // The helper thread may still be unmapping old addresses (unmap_in_background): finished
  // first, so that the device's mapped bytes do not change between two snapshots.
  allocator.finish_background_unmaps();
  AllocatorState state;
  state.census = allocator.census();
  state.counters = ledger.counters();
  state.device_physical_bytes = device.physical_bytes_in_use();
  state.device_mapped_bytes = device.mapped_bytes();
  state.device_segments = device.live_segment_count();
  return state;
}

namespace {

template <typename T>
void compare(std::string& out, const char* scope, const char* name, T before, T after) {
  if (before != after) out += concat(scope, ".", name, ": ", before, " -> ", after, "\n");
}

void compare_pool(std::string& out, const char* scope, const BlockCensus::PerPool& a,
                  const BlockCensus::PerPool& b) {
  compare(out, scope, "allocation", a.allocation, b.allocation);
  compare(out, scope, "allocated_bytes", a.allocated_bytes, b.allocated_bytes);
  compare(out, scope, "requested_bytes", a.requested_bytes, b.requested_bytes);
  compare(out, scope, "active", a.active, b.active);
  compare(out, scope, "active_bytes", a.active_bytes, b.active_bytes);
  compare(out, scope, "inactive_split", a.inactive_split, b.inactive_split);
  compare(out, scope, "inactive_split_bytes", a.inactive_split_bytes, b.inactive_split_bytes);
  compare(out, scope, "segment", a.segment, b.segment);
  compare(out, scope, "reserved_bytes", a.reserved_bytes, b.reserved_bytes);
  compare(out, scope, "mapped_bytes", a.mapped_bytes, b.mapped_bytes);
  compare(out, scope, "virtual_bytes", a.virtual_bytes, b.virtual_bytes);
  compare(out, scope, "free_bytes", a.free_bytes, b.free_bytes);
  compare(out, scope, "largest_free_block", a.largest_free_block, b.largest_free_block);
}

}  // namespace

std::string differences(const AllocatorState& before, const AllocatorState& after) {
  std::string out;
  compare_pool(out, "census.small", before.census.pools[0], after.census.pools[0]);
  compare_pool(out, "census.large", before.census.pools[1], after.census.pools[1]);
  compare(out, "census", "free_physical_pages", before.census.free_physical_pages,
          after.census.free_physical_pages);
  if (!(before.counters == after.counters)) out += "ledger counters changed\n";
  compare(out, "device", "physical_bytes", before.device_physical_bytes,
          after.device_physical_bytes);
  compare(out, "device", "mapped_bytes", before.device_mapped_bytes, after.device_mapped_bytes);
  compare(out, "device", "segments", before.device_segments, after.device_segments);
  return out;
}

}  // namespace vramledger::stress
