#include "accounting/counters_text.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <optional>

#include "accounting/memory_breakdown.hpp"
#include "accounting/tag_registry.hpp"
#include "allocator/text_format.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kMaxListedEntries = 16;  // per-tag and per-stream lines in one report

// printf-style so the compiler checks every format against its arguments.
[[gnu::format(printf, 2, 3)]] void append_format(std::string& out, const char* format, ...) {
  char line[1024];
  std::va_list args;
  va_start(args, format);
  const int length = std::vsnprintf(line, sizeof(line), format, args);
  va_end(args);
  if (length > 0) {
    out.append(line, std::min<std::size_t>(static_cast<std::size_t>(length), sizeof(line) - 1));
  }
}

void append_breakdown_line(std::string& out, const char* label, std::int64_t bytes) {
  append_format(out, "  %-46s %12s %20" PRId64 "%s\n", label, format_bytes(bytes).c_str(), bytes,
                bytes < 0 ? "  <-- NEGATIVE: an event is missing" : "");
}

std::string format_ratio(const std::optional<double>& value) {
  if (!value) return "n/a";
  char text[32];
  std::snprintf(text, sizeof(text), "%.4f", *value);
  return text;
}

void append_usage_line(std::string& out, const std::string& name, const UsageStats& usage) {
  append_format(out, "  %-24s allocated %s (peak %s, %" PRId64 " blocks), requested %s, active %s\n",
                name.c_str(), format_bytes(usage.allocated_bytes.current).c_str(),
                format_bytes(usage.allocated_bytes.peak).c_str(), usage.allocation.current,
                format_bytes(usage.requested_bytes.current).c_str(),
                format_bytes(usage.active_bytes.current).c_str());
}

// Largest active bytes first (active includes pending frees, so it is what the entry holds); zero-usage entries (seen earlier, all freed) are skipped.
template <typename Entry, typename NameOf>
void append_usage_section(std::string& out, const char* title, std::vector<Entry> entries,
                          NameOf name_of) {
  std::erase_if(entries, [](const Entry& entry) {
    return entry.usage.active_bytes.current == 0 && entry.usage.allocated_bytes.peak == 0;
  });
  if (entries.empty()) return;
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.usage.active_bytes.current > b.usage.active_bytes.current;
  });
  append_format(out, "%s:\n", title);
  for (std::size_t index = 0; index < entries.size() && index < kMaxListedEntries; ++index) {
    append_usage_line(out, name_of(entries[index]), entries[index].usage);
  }
  if (entries.size() > kMaxListedEntries) {
    append_format(out, "  ... and %zu more\n", entries.size() - kMaxListedEntries);
  }
}

void append_fragmentation(std::string& out, const FragmentationMetrics& metrics) {
  append_format(out,
                "fragmentation: GMLake ratio %s (1 - peak active / peak reserved), %s at peak "
                "reserved (active %s); overhead ratio %s (peak reserved / peak requested); "
                "inactive split %" PRId64 " blocks, %s\n",
                format_ratio(metrics.gmlake_ratio).c_str(),
                format_ratio(metrics.ratio_at_peak_reserved).c_str(),
                format_bytes(metrics.active_bytes_at_peak_reserved).c_str(),
                format_ratio(metrics.overhead_ratio).c_str(), metrics.inactive_split,
                format_bytes(metrics.inactive_split_bytes).c_str());
  if (metrics.largest_free_block) {
    append_format(out, "free blocks (census): largest %s, all backed free bytes %s\n",
                  format_bytes(*metrics.largest_free_block).c_str(),
                  format_bytes(metrics.free_bytes.value_or(0)).c_str());
  }
}

void append_counters(std::string& out, const CountersAccount& account,
                     const FragmentationMetrics& metrics) {
  const LedgerCounters& counters = account.counters;
  const PoolCounters& all = counters.aggregate();
  const MemoryBreakdown breakdown = compute_breakdown(all);

  if (!account.inconsistency.empty()) {
    append_format(out, "WARNING: the ledger is inconsistent since %s; figures below are suspect\n",
                  account.inconsistency.c_str());
  }
  append_format(out, "reserved %s (%" PRId64 " bytes) =\n", format_bytes(all.reserved_bytes.current).c_str(),
                all.reserved_bytes.current);
  append_breakdown_line(out, "requested by live allocations", breakdown.requested);
  append_breakdown_line(out, "+ rounding (allocated - requested)", breakdown.rounding);
  append_breakdown_line(out, "+ pending cross-stream frees (active - alloc.)",
                        breakdown.pending_frees);
  append_breakdown_line(out, "+ cached, usable", breakdown.cached_usable);
  append_breakdown_line(out, "+ fragmentation (inactive split blocks)", breakdown.fragmentation);
  append_breakdown_line(out, "+ unmapped physical pages held", breakdown.unmapped_physical);
  if (breakdown.sleeping != 0 || breakdown.sleeping_resident != 0) {
    append_breakdown_line(out, "+ asleep, on pages kept for neighbours", breakdown.sleeping_resident);
    append_format(out, "asleep (docs/sleep.md): %s (%" PRId64 " bytes) in %" PRId64
                       " blocks, address space only, not in reserved but for the line above\n",
                  format_bytes(breakdown.sleeping).c_str(), breakdown.sleeping,
                  all.sleeping.current);
  }

  append_format(out,
                "counts: %" PRId64 " allocated blocks, %" PRId64 " active, %" PRId64
                " segments, %" PRId64 " inactive splits\n",
                all.allocation.current, all.active.current, all.segment.current,
                all.inactive_split.current);
  append_format(out, "peaks: allocated %s, active %s, reserved %s, requested %s\n",
                format_bytes(all.allocated_bytes.peak).c_str(),
                format_bytes(all.active_bytes.peak).c_str(),
                format_bytes(all.reserved_bytes.peak).c_str(),
                format_bytes(all.requested_bytes.peak).c_str());
  for (const StatPool pool : {StatPool::kSmall, StatPool::kLarge}) {
    const PoolCounters& counters_of_pool = counters.pool(pool);
    append_format(out, "%s: allocated %s in %" PRId64 " blocks, active %s, reserved %s (peak %s)\n",
                  to_string(pool), format_bytes(counters_of_pool.allocated_bytes.current).c_str(),
                  counters_of_pool.allocation.current,
                  format_bytes(counters_of_pool.active_bytes.current).c_str(),
                  format_bytes(counters_of_pool.reserved_bytes.current).c_str(),
                  format_bytes(counters_of_pool.reserved_bytes.peak).c_str());
  }
  if (all.virtual_bytes.current != 0 || all.mapped_bytes.current != 0) {
    append_format(out, "virtual memory: %s address space reserved, %s mapped, %s physical\n",
                  format_bytes(all.virtual_bytes.current).c_str(),
                  format_bytes(all.mapped_bytes.current).c_str(),
                  format_bytes(all.physical_bytes.current).c_str());
  }
  append_format(out,
                "device calls: %" PRId64 " allocs, %" PRId64 " frees, %" PRId64 " maps, %" PRId64
                " unmaps; %" PRId64 " alloc retries, %" PRId64 " OOMs\n",
                counters.num_device_alloc, counters.num_device_free, counters.num_maps,
                counters.num_unmaps, counters.num_alloc_retries, counters.num_ooms);
  append_fragmentation(out, metrics);

  append_usage_section(out, "tags", account.tags, [](const TagUsage& entry) {
    return entry.is_overflow ? std::string("(tag ids >= 1024)") : tag_name(entry.tag);
  });
  append_usage_section(out, "streams", account.streams, [](const StreamUsage& entry) {
    return entry.is_overflow ? std::string("(other streams)") : format_hex(entry.stream);
  });
  append_format(out, "trace: %zu records held, %" PRIu64 " dropped, %" PRIu64 " events seen\n",
                account.trace_records, account.trace_dropped, counters.events);
}

}  // namespace

std::string counters_text(const CountersAccount& account, const FragmentationMetrics& metrics) {
  std::string out;
  append_counters(out, account, metrics);
  return out;
}

}  // namespace vramledger
