#include "torch_plugin/stats_json.hpp"

#include <cstdio>
#include <string_view>

#include "accounting/fragmentation.hpp"
#include "accounting/tag_registry.hpp"
#include "torch_plugin/cuda_ipc.hpp"
#include "torch_plugin/device_allocators.hpp"
#include "torch_plugin/json_writer.hpp"

namespace vramledger::torch_plugin {

namespace {

void write_stat(JsonWriter& parent, std::string_view name, const Stat& stat) {
  std::string& out = parent.key(name);
  JsonWriter object(out);
  object.number("current", stat.current);
  object.number("peak", stat.peak);
  object.number("allocated", stat.allocated);
  object.number("freed", stat.freed);
}

template <typename Member>
void write_pooled(JsonWriter& parent, std::string_view name, const LedgerCounters& counters,
                  Member member) {
  std::string& out = parent.key(name);
  JsonWriter pools(out);
  write_stat(pools, "all", counters.pool(StatPool::kAggregate).*member);
  write_stat(pools, "small_pool", counters.pool(StatPool::kSmall).*member);
  write_stat(pools, "large_pool", counters.pool(StatPool::kLarge).*member);
}

void write_counters(JsonWriter& object, const LedgerCounters& counters,
                    const std::vector<TagUsage>& tags) {
  write_pooled(object, "allocation", counters, &PoolCounters::allocation);
  write_pooled(object, "segment", counters, &PoolCounters::segment);
  write_pooled(object, "active", counters, &PoolCounters::active);
  write_pooled(object, "inactive_split", counters, &PoolCounters::inactive_split);
  write_pooled(object, "allocated_bytes", counters, &PoolCounters::allocated_bytes);
  write_pooled(object, "reserved_bytes", counters, &PoolCounters::reserved_bytes);
  write_pooled(object, "active_bytes", counters, &PoolCounters::active_bytes);
  write_pooled(object, "inactive_split_bytes", counters, &PoolCounters::inactive_split_bytes);
  write_pooled(object, "requested_bytes", counters, &PoolCounters::requested_bytes);
  write_pooled(object, "mapped_bytes", counters, &PoolCounters::mapped_bytes);
  write_pooled(object, "virtual_bytes", counters, &PoolCounters::virtual_bytes);
  write_pooled(object, "allocated_requested_bytes", counters,
               &PoolCounters::allocated_requested_bytes);
  write_pooled(object, "physical_bytes", counters, &PoolCounters::physical_bytes);
  write_pooled(object, "sleeping", counters, &PoolCounters::sleeping);  // docs/sleep.md
  write_pooled(object, "sleeping_bytes", counters, &PoolCounters::sleeping_bytes);
  write_pooled(object, "sleeping_resident_bytes", counters,
               &PoolCounters::sleeping_resident_bytes);
  object.number("num_alloc_retries", counters.num_alloc_retries);
  object.number("num_ooms", counters.num_ooms);
  object.number("num_device_alloc", counters.num_device_alloc);
  object.number("num_device_free", counters.num_device_free);
  object.number("num_maps", counters.num_maps);
  object.number("num_unmaps", counters.num_unmaps);
  object.number("active_bytes_at_peak_reserved", counters.active_bytes_at_peak_reserved);

  const FragmentationMetrics metrics = measure_fragmentation(counters);
  {
    std::string& out = object.key("fragmentation");
    JsonWriter fragmentation(out);
    fragmentation.real("gmlake_ratio", metrics.gmlake_ratio);
    fragmentation.real("ratio_at_peak_reserved", metrics.ratio_at_peak_reserved);
    fragmentation.real("overhead_ratio", metrics.overhead_ratio);
    fragmentation.number("peak_reserved_bytes", metrics.peak_reserved_bytes);
    fragmentation.number("peak_requested_bytes", metrics.peak_requested_bytes);
    fragmentation.number("peak_active_bytes", metrics.peak_active_bytes);
  }
  {
    std::string& out = object.key("tags");
    JsonWriter by_tag(out);
    for (const TagUsage& entry : tags) {
      const std::string name = entry.is_overflow ? std::string("(overflow)") : tag_name(entry.tag);
      std::string& tag_out = by_tag.key(name);
      JsonWriter usage(tag_out);
      write_stat(usage, "allocation", entry.usage.allocation);
      write_stat(usage, "allocated_bytes", entry.usage.allocated_bytes);
      write_stat(usage, "requested_bytes", entry.usage.requested_bytes);
      write_stat(usage, "active_bytes", entry.usage.active_bytes);
    }
  }
}

// Memory mapped from other processes (CUDA IPC, docs/ipc.md): not owned, in no counter above.
void write_imported(JsonWriter& object, int device) {
  const ImportedFigures imported = imported_memory().figures(device);
  write_stat(object, "imported_bytes", imported.bytes);
  write_stat(object, "imported_mappings", imported.mappings);
}

// The default pool's policy figures (PolicyFigures: no walk of its blocks; docs/stats.md "The policy's own figures").
void write_policy(JsonWriter& object, const PolicyFigures& figures) {
  std::string& out = object.key("policy");
  JsonWriter policy(out);
  policy.number("stream_heaps", figures.stream_heaps);
  policy.number("lane_choices", figures.lane_choices);
  policy.number("locked_allocations", figures.locked_allocations);
  policy.number("room_shortfalls", figures.room_shortfalls);
  policy.number("active_peak_rises", figures.active_peak_rises);
  policy.number("unmaps_in_background", figures.unmaps_in_background);
  policy.number("unmaps_on_demand", figures.unmaps_on_demand);
  policy.number("unmaps_pending", figures.unmaps_pending);
  policy.number("host_waits", figures.host_waits);
  policy.number("peak_active_bytes", figures.peak_active_bytes);
}

}  // namespace

std::string stats_json(const DeviceAllocators& device) {
  const LedgerCounters counters = device.counters();
  const std::vector<TagUsage> tags = device.per_tag();
  std::string out;
  {
    JsonWriter object(out);
    object.number("device", device.device());
    object.string("backend", device.backend_info().name);
    object.boolean("paged_heap", device.default_pool_is_paged());
    object.number("cap_bytes", static_cast<std::int64_t>(device.cap()));
    object.number("total_bytes", static_cast<std::int64_t>(device.backend_info().total_bytes));
    write_counters(object, counters, tags);
    write_policy(object, device.default_pool().policy().policy_figures());
    write_imported(object, device.device());
  }
  return out;
}

std::string empty_stats_json(int device) {
  std::string out;
  {
    JsonWriter object(out);
    object.number("device", device);
    object.key("backend") += "null";
    object.boolean("paged_heap", false);
    object.number("cap_bytes", 0);
    object.number("total_bytes", 0);
    write_counters(object, LedgerCounters{}, {});
    write_policy(object, PolicyFigures{});
    write_imported(object, device);  // a process may import on a device it never allocated on
  }
  return out;
}

}  // namespace vramledger::torch_plugin
