#include "accounting/reports/prometheus_report.hpp"

#include <cinttypes>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "accounting/fragmentation.hpp"
#include "accounting/tag_registry.hpp"
#include "accounting/memory_breakdown.hpp"
#include "allocator/text_format.hpp"

namespace vramledger {
namespace {

using Labels = std::vector<std::pair<std::string, std::string>>;

// Samples are collected per metric family first: the format wants every sample of a family
// together, right after its HELP and TYPE lines, while the ledger is naturally walked per pool.
class Exposition {
 public:
  // Integers are written exactly (a double would round byte counts above 2^53).
  void add(const std::string& name, const char* type, const std::string& help,
           const Labels& labels, std::int64_t value) {
    char text[32];
    std::snprintf(text, sizeof(text), "%" PRId64, value);
    add_sample(name, type, help, labels, text);
  }
  void add(const std::string& name, const char* type, const std::string& help,
           const Labels& labels, double value) {
    char text[40];
    std::snprintf(text, sizeof(text), "%.17g", value);
    add_sample(name, type, help, labels, text);
  }

  std::string text() const {
    std::string out;
    for (const std::string& name : order_) {
      const Family& family = families_.at(name);
      out += "# HELP " + name + ' ' + family.help + '\n';
      out += "# TYPE " + name + ' ' + family.type + '\n';
      out += family.samples;
    }
    return out;
  }

 private:
  void add_sample(const std::string& name, const char* type, const std::string& help,
                  const Labels& labels, const char* value) {
    Family& family = families_[name];
    if (family.type.empty()) {
      order_.push_back(name);
      family.type = type;
      family.help = help;
    }
    family.samples += name;
    if (!labels.empty()) {
      family.samples += '{';
      for (std::size_t i = 0; i < labels.size(); ++i) {
        if (i) family.samples += ',';
        family.samples += labels[i].first + "=\"" + escape_label_value(labels[i].second) + '"';
      }
      family.samples += '}';
    }
    family.samples += ' ';
    family.samples += value;
    family.samples += '\n';
  }

  struct Family {
    std::string type;
    std::string help;
    std::string samples;
  };
  std::map<std::string, Family> families_;
  std::vector<std::string> order_;
};

Labels with(Labels labels, const std::string& key, const std::string& value) {
  labels.emplace_back(key, value);
  return labels;
}

// One Stat as four families: current and peak (gauges), increases and decreases (counters).
void add_stat(Exposition& out, const std::string& prefix, const char* name, const Stat& stat,
              const Labels& labels, const std::string& what) {
  const std::string base = prefix + name;
  out.add(base, "gauge", what + ": current value.", labels, stat.current);
  out.add(base + "_peak", "gauge", what + ": highest value since the last peak reset.", labels,
          stat.peak);
  out.add(base + "_allocated_total", "counter",
          what + ": sum of increases since the last accumulated reset.", labels, stat.allocated);
  out.add(base + "_freed_total", "counter",
          what + ": sum of decreases since the last accumulated reset.", labels, stat.freed);
}

}  // namespace

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string ledger_to_prometheus(const Ledger& ledger, const ReportLabels& labels) {
  Exposition out;
  const Labels device{{"device", std::to_string(labels.device)}};
  const LedgerCounters counters = ledger.counters();

  for (const StatPool pool : {StatPool::kAggregate, StatPool::kSmall, StatPool::kLarge}) {
    const Labels pool_labels = with(device, "pool", to_string(pool));
    for_each_stat(counters.pool(pool), [&](const char* name, const Stat& stat) {
      add_stat(out, "vramledger_", name, stat, pool_labels,
               std::string("Ledger counter ") + name + " (docs/stats.md)");
    });
    const MemoryBreakdown breakdown = compute_breakdown(counters.pool(pool));
    const std::pair<const char*, std::int64_t> lines[] = {
        {"requested", breakdown.requested},         {"rounding", breakdown.rounding},
        {"pending_frees", breakdown.pending_frees}, {"cached_usable", breakdown.cached_usable},
        {"fragmentation", breakdown.fragmentation}, {"unmapped_physical", breakdown.unmapped_physical},
        {"sleeping_resident", breakdown.sleeping_resident}};  // docs/sleep.md
    for (const auto& [line, bytes] : lines) {
      out.add("vramledger_breakdown_bytes", "gauge",
              "Additive breakdown of reserved bytes; the lines of one pool sum to "
              "vramledger_reserved_bytes.",
              with(pool_labels, "line", line), bytes);
    }
  }

  const std::pair<const char*, std::int64_t> plain[] = {
      {"vramledger_alloc_retries_total", counters.num_alloc_retries},
      {"vramledger_ooms_total", counters.num_ooms},
      {"vramledger_device_allocs_total", counters.num_device_alloc},
      {"vramledger_device_frees_total", counters.num_device_free},
      {"vramledger_maps_total", counters.num_maps},
      {"vramledger_unmaps_total", counters.num_unmaps},
  };
  for (const auto& [name, value] : plain) {
    out.add(name, "counter", "Ledger event count (docs/stats.md, plain counters).", device, value);
  }
  out.add("vramledger_events_total", "counter", "Events the ledger has seen (never reset).",
          device, static_cast<std::int64_t>(counters.events));
  out.add("vramledger_active_bytes_at_peak_reserved", "gauge",
          "Highest active bytes seen while reserved bytes stood at their peak.", device,
          counters.active_bytes_at_peak_reserved);
  out.add("vramledger_consistent", "gauge",
          "1 while no counter went negative and no event was malformed, else 0.", device,
          ledger.inconsistent() ? std::int64_t{0} : std::int64_t{1});

  // Ratios with a zero denominator are left out rather than exported as NaN.
  const FragmentationMetrics metrics = measure_fragmentation(counters);
  const std::pair<const char*, const std::optional<double>*> ratios[] = {
      {"vramledger_fragmentation_gmlake_ratio", &metrics.gmlake_ratio},
      {"vramledger_fragmentation_ratio_at_peak_reserved", &metrics.ratio_at_peak_reserved},
      {"vramledger_overhead_ratio", &metrics.overhead_ratio},
  };
  for (const auto& [name, value] : ratios) {
    if (*value) {
      out.add(name, "gauge", "Fragmentation figure (docs/stats.md, fragmentation metrics).",
              device, **value);
    }
  }

  for (const StreamUsage& entry : ledger.per_stream()) {
    const Labels stream_labels =
        with(device, "stream", entry.is_overflow ? std::string("other") : format_hex(entry.stream));
    for_each_usage_stat(entry.usage, [&](const char* name, const Stat& stat) {
      add_stat(out, "vramledger_stream_", name, stat, stream_labels,
               std::string("Per-stream ") + name);
    });
  }
  for (const TagUsage& entry : ledger.per_tag()) {
    const Labels tag_labels =
        with(device, "tag", entry.is_overflow ? std::string("overflow") : tag_name(entry.tag));
    for_each_usage_stat(entry.usage, [&](const char* name, const Stat& stat) {
      add_stat(out, "vramledger_tag_", name, stat, tag_labels, std::string("Per-tag ") + name);
    });
  }

  std::int64_t records = 0, dropped = 0;
  ledger.with_trace([&](const EventTrace& trace) {
    records = static_cast<std::int64_t>(trace.size());
    dropped = static_cast<std::int64_t>(trace.dropped());
  });
  out.add("vramledger_trace_records", "gauge", "Event records held by the trace ring.", device,
          records);
  out.add("vramledger_trace_dropped_total", "counter",
          "Event records overwritten because the trace ring was full.", device, dropped);
  return out.text();
}

}  // namespace vramledger
