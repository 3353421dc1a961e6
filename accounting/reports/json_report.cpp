#include "accounting/reports/json_report.hpp"

#include <cinttypes>
#include <cstdio>
#include <optional>
#include <string>

#include "accounting/consistency.hpp"
#include "accounting/fragmentation.hpp"
#include "accounting/tag_registry.hpp"
#include "accounting/memory_breakdown.hpp"
#include "allocator/text_format.hpp"

namespace vramledger {
namespace {

using nlohmann::json;

json stat_to_json(const Stat& stat) {
  return {{"current", stat.current}, {"peak", stat.peak}, {"allocated", stat.allocated},
          {"freed", stat.freed}};
}

json pool_to_json(const PoolCounters& pool) {
  json out = json::object();
  for_each_stat(pool, [&](const char* name, const Stat& stat) { out[name] = stat_to_json(stat); });
  return out;
}

json usage_to_json(const UsageStats& usage) {
  json out = json::object();
  for_each_usage_stat(usage,
                      [&](const char* name, const Stat& stat) { out[name] = stat_to_json(stat); });
  return out;
}

json breakdown_to_json(const MemoryBreakdown& breakdown) {
  return {{"requested", breakdown.requested},
          {"rounding", breakdown.rounding},
          {"pending_frees", breakdown.pending_frees},
          {"cached_usable", breakdown.cached_usable},
          {"fragmentation", breakdown.fragmentation},
          {"unmapped_physical", breakdown.unmapped_physical},
          {"sleeping_resident", breakdown.sleeping_resident},  // docs/sleep.md
          {"reserved", breakdown.reserved},
          {"sleeping", breakdown.sleeping},  // address space, not a line of reserved
          {"all_lines_non_negative", breakdown.all_lines_non_negative()}};
}

json derived_to_json(const PoolCounters& pool) {
  return {{"cached_bytes", pool.cached_bytes()},
          {"pending_free_bytes", pool.pending_free_bytes()},
          {"unmapped_physical_bytes", pool.unmapped_physical_bytes()},
          {"segment_bytes", pool.segment_bytes()}};
}

template <typename T>
json optional_to_json(const std::optional<T>& value) {
  return value ? json(*value) : json(nullptr);
}

json fragmentation_to_json(const FragmentationMetrics& metrics) {
  return {{"peak_active_bytes", metrics.peak_active_bytes},
          {"peak_reserved_bytes", metrics.peak_reserved_bytes},
          {"peak_requested_bytes", metrics.peak_requested_bytes},
          {"active_bytes_at_peak_reserved", metrics.active_bytes_at_peak_reserved},
          {"gmlake_ratio", optional_to_json(metrics.gmlake_ratio)},
          {"ratio_at_peak_reserved", optional_to_json(metrics.ratio_at_peak_reserved)},
          {"overhead_ratio", optional_to_json(metrics.overhead_ratio)},
          {"inactive_split", metrics.inactive_split},
          {"inactive_split_bytes", metrics.inactive_split_bytes},
          {"largest_free_block", optional_to_json(metrics.largest_free_block)},
          {"free_bytes", optional_to_json(metrics.free_bytes)}};
}

const char* clock_name(ClockSource clock) {
  switch (clock) {
    case ClockSource::kCycleCounter: return "cycle_counter";
    case ClockSource::kCoarseMonotonic: return "coarse_monotonic";
    case ClockSource::kNone: return "none";
  }
  return "unknown";
}

json inconsistency_to_json(const std::optional<LedgerInconsistency>& inconsistency) {
  if (!inconsistency) return nullptr;
  return {{"event_index", inconsistency->event_index},
          {"event_kind", to_string(inconsistency->event.kind)},
          {"scope", inconsistency->scope},
          {"counter", inconsistency->counter},
          {"value", inconsistency->value},
          {"text", inconsistency->to_string()}};
}

json census_to_json(const Ledger& ledger, const BlockCensus& census) {
  const ConsistencyReport consistency = check_consistency(ledger, census);
  json mismatches = json::array();
  for (const ConsistencyMismatch& mismatch : consistency.mismatches) {
    mismatches.push_back(
        {{"name", mismatch.name}, {"ledger", mismatch.ledger}, {"census", mismatch.census}});
  }
  json pools = json::object();
  for (const PoolKind pool : {PoolKind::kSmall, PoolKind::kLarge}) {
    const BlockCensus::PerPool& counts = census.pools[static_cast<std::size_t>(pool)];
    pools[to_string(pool == PoolKind::kSmall ? StatPool::kSmall : StatPool::kLarge)] = {
        {"free_bytes", counts.free_bytes}, {"largest_free_block", counts.largest_free_block}};
  }
  return {{"consistent", consistency.ok()},
          {"mismatches", mismatches},
          {"free_physical_pages", census.free_physical_pages},
          {"pools", pools}};
}

}  // namespace

nlohmann::json ledger_to_json(const Ledger& ledger, const BlockCensus* census,
                              const ReportLabels& labels) {
  const LedgerCounters counters = ledger.counters();
  json pools = json::object();
  json breakdown = json::object();
  json derived = json::object();
  for (const StatPool pool : {StatPool::kAggregate, StatPool::kSmall, StatPool::kLarge}) {
    const PoolCounters& counters_of_pool = counters.pool(pool);
    pools[to_string(pool)] = pool_to_json(counters_of_pool);
    breakdown[to_string(pool)] = breakdown_to_json(compute_breakdown(counters_of_pool));
    derived[to_string(pool)] = derived_to_json(counters_of_pool);
  }

  json streams = json::array();
  for (const StreamUsage& entry : ledger.per_stream()) {
    streams.push_back(
        {{"stream", entry.is_overflow ? json(nullptr) : json(format_hex(entry.stream))},
         {"handle", entry.is_overflow ? json(nullptr) : json(entry.stream)},
         {"overflow", entry.is_overflow},
         {"usage", usage_to_json(entry.usage)}});
  }
  json tags = json::array();
  for (const TagUsage& entry : ledger.per_tag()) {
    tags.push_back({{"id", entry.is_overflow ? json(nullptr) : json(entry.tag)},
                    {"name", entry.is_overflow ? json(nullptr) : json(tag_name(entry.tag))},
                    {"overflow", entry.is_overflow},
                    {"usage", usage_to_json(entry.usage)}});
  }

  json trace_figures;
  ledger.with_trace([&](const EventTrace& trace) {
    trace_figures = {{"capacity", trace.capacity()},
                     {"records", trace.size()},
                     {"appended", trace.appended()},
                     {"dropped", trace.dropped()},
                     {"first_sequence", trace.first_sequence()},
                     {"clock", clock_name(trace.clock_source())}};
  });
  const FragmentationMetrics metrics = census ? measure_fragmentation(counters, *census)
                                              : measure_fragmentation(counters);
  return {
      {"schema_version", kReportSchemaVersion},
      {"generator", "vramledger"},
      {"device", labels.device},
      {"consistent", !ledger.inconsistent()},
      {"first_inconsistency", inconsistency_to_json(ledger.first_inconsistency())},
      {"pools", pools},
      {"breakdown", breakdown},
      {"derived", derived},
      {"counters",
       {{"num_alloc_retries", counters.num_alloc_retries},
        {"num_ooms", counters.num_ooms},
        {"num_device_alloc", counters.num_device_alloc},
        {"num_device_free", counters.num_device_free},
        {"num_maps", counters.num_maps},
        {"num_unmaps", counters.num_unmaps},
        {"active_bytes_at_peak_reserved", counters.active_bytes_at_peak_reserved},
        {"events", counters.events}}},
      {"fragmentation", fragmentation_to_json(metrics)},
      {"streams", streams},
      {"tags", tags},
      {"trace", trace_figures},
      {"census", census ? census_to_json(ledger, *census) : json(nullptr)},
  };
}

}  // namespace vramledger
