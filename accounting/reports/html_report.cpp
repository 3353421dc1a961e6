#include "accounting/reports/html_report.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "accounting/consistency.hpp"
#include "accounting/fragmentation.hpp"
#include "accounting/reports/breakdown_timeline.hpp"
#include "accounting/reports/timeline_svg.hpp"
#include "accounting/tag_registry.hpp"
#include "accounting/memory_breakdown.hpp"
#include "allocator/text_format.hpp"

namespace vramledger {
namespace {

constexpr int kChartWidth = 960;
constexpr int kBreakdownHeight = 360;
constexpr int kRatioHeight = 200;

constexpr const char* kStyle = R"(
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
.sub{color:#666;margin-bottom:12px} .warn{background:#fde2e1;border:1px solid #e15759;padding:8px}
table{border-collapse:collapse;margin:4px 0} td,th{padding:2px 10px;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
.swatch{display:inline-block;width:10px;height:10px;margin-right:6px}
svg{display:block;background:#fff} .area{stroke:none;opacity:.9}
.ratio{fill:none;stroke-width:1.5} .grid{stroke:#e5e5e5} .axis{stroke:#888}
.tick{font-size:11px;fill:#555} .cursor{stroke:#222;stroke-dasharray:3 3}
#tip{position:fixed;pointer-events:none;background:#fff;border:1px solid #999;padding:4px 8px;
font-size:12px;display:none;white-space:pre}
)";

// Hover read-out: the nearest sample's lines, from the data embedded next to the chart.
constexpr const char* kScript = R"(
(function(){
const d=JSON.parse(document.getElementById('timeline-data').textContent);
const svg=document.getElementById('breakdown-chart'),cur=document.getElementById('breakdown-cursor');
const tip=document.getElementById('tip');
function fmt(b){const u=['B','KiB','MiB','GiB','TiB'];let i=0;while(Math.abs(b)>=1024&&i<4){b/=1024;i++;}
return b.toFixed(i?2:0)+' '+u[i];}
svg.addEventListener('mousemove',function(e){
if(!d.x.length)return;const r=svg.getBoundingClientRect();
const x=(e.clientX-r.left)*svg.viewBox.baseVal.width/r.width;let k=0,best=1e9;
for(let i=0;i<d.x.length;i++){const g=Math.abs(d.x[i]-x);if(g<best){best=g;k=i;}}
cur.setAttribute('x1',d.x[k]);cur.setAttribute('x2',d.x[k]);cur.setAttribute('visibility','visible');
let t='event '+d.sequence[k]+'\nreserved '+fmt(d.reserved[k]);
for(const c of d.lines){t+='\n'+c.label+': '+fmt(c.bytes[k]);}
tip.textContent=t;tip.style.display='block';tip.style.left=(e.clientX+14)+'px';tip.style.top=(e.clientY+10)+'px';});
svg.addEventListener('mouseleave',function(){tip.style.display='none';cur.setAttribute('visibility','hidden');});
})();
)";

[[gnu::format(printf, 2, 3)]] void append_format(std::string& out, const char* format, ...) {
  char text[512];
  va_list args;
  va_start(args, format);
  const int length = std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  if (length > 0) out.append(text, std::min<std::size_t>(static_cast<std::size_t>(length), sizeof(text) - 1));
}

std::string ratio_text(const std::optional<double>& value) {
  if (!value) return "n/a";
  char text[32];
  std::snprintf(text, sizeof(text), "%.4f", *value);
  return text;
}

void append_row(std::string& out, const std::string& name, const std::string& value) {
  out += "<tr><td>" + escape_html(name) + "</td><td>" + escape_html(value) + "</td></tr>";
}

void append_breakdown_table(std::string& out, const MemoryBreakdown& now,
                            const BreakdownTimeline& timeline) {
  out += "<table><tr><th>line</th><th>now</th><th>bytes</th><th>at peak reserved</th></tr>";
  for (const BreakdownCategory& category : breakdown_categories()) {
    const std::int64_t bytes = now.*category.bytes;
    append_format(out,
                  "<tr><td><span class=\"swatch\" style=\"background:%s\"></span>%s</td>"
                  "<td>%s</td><td>%" PRId64 "</td><td>%s</td></tr>",
                  category.color, category.label, format_bytes(bytes).c_str(), bytes,
                  format_bytes(timeline.at_peak_reserved.*category.bytes).c_str());
  }
  append_format(out,
                "<tr><th>= reserved</th><th>%s</th><th>%" PRId64 "</th><th>%s</th></tr></table>",
                format_bytes(now.reserved).c_str(), now.reserved,
                format_bytes(timeline.at_peak_reserved.reserved).c_str());
}

void append_pool_table(std::string& out, const LedgerCounters& counters) {
  out += "<table><tr><th>counter</th>";
  for (const StatPool pool : {StatPool::kAggregate, StatPool::kSmall, StatPool::kLarge}) {
    append_format(out, "<th>%s now</th><th>%s peak</th>", to_string(pool), to_string(pool));
  }
  out += "</tr>";
  for_each_stat(counters.aggregate(), [&](const char* name, const Stat&) {
    out += std::string("<tr><td>") + name + "</td>";
    for (const StatPool pool : {StatPool::kAggregate, StatPool::kSmall, StatPool::kLarge}) {
      for_each_stat(counters.pool(pool), [&](const char* other, const Stat& stat) {
        if (std::string_view(other) != name) return;
        const bool bytes = std::string_view(name).ends_with("_bytes");
        const auto show = [&](std::int64_t value) {
          return bytes ? format_bytes(value) : std::to_string(value);
        };
        out += "<td>" + show(stat.current) + "</td><td>" + show(stat.peak) + "</td>";
      });
    }
    out += "</tr>";
  });
  out += "</table>";
}

template <typename Entry, typename NameOf>
void append_usage_table(std::string& out, const char* title, const std::vector<Entry>& entries,
                        NameOf name_of) {
  if (entries.empty()) return;
  append_format(out, "<h2>%s</h2><table><tr><th>name</th><th>allocated</th><th>peak allocated</th>"
                     "<th>blocks</th><th>requested</th><th>active</th></tr>",
                title);
  for (const Entry& entry : entries) {
    const UsageStats& usage = entry.usage;
    out += "<tr><td>" + escape_html(name_of(entry)) + "</td><td>" +
           format_bytes(usage.allocated_bytes.current) + "</td><td>" +
           format_bytes(usage.allocated_bytes.peak) + "</td><td>" +
           std::to_string(usage.allocation.current) + "</td><td>" +
           format_bytes(usage.requested_bytes.current) + "</td><td>" +
           format_bytes(usage.active_bytes.current) + "</td></tr>";
  }
  out += "</table>";
}

// The numbers behind the chart, for the hover script: x in SVG units and each line's bytes.
std::string timeline_data(const BreakdownTimeline& timeline) {
  nlohmann::json data;
  data["x"] = nlohmann::json::array();
  data["sequence"] = nlohmann::json::array();
  data["reserved"] = nlohmann::json::array();
  for (const TimelineSample& sample : timeline.samples) {
    data["x"].push_back(std::round(timeline_x(timeline, sample.sequence, kChartWidth) * 10) / 10);
    data["sequence"].push_back(sample.sequence);
    data["reserved"].push_back(sample.breakdown.reserved);
  }
  data["lines"] = nlohmann::json::array();
  for (const BreakdownCategory& category : breakdown_categories()) {
    nlohmann::json bytes = nlohmann::json::array();
    for (const TimelineSample& sample : timeline.samples) bytes.push_back(sample.breakdown.*category.bytes);
    data["lines"].push_back({{"key", category.key}, {"label", category.label}, {"bytes", bytes}});
  }
  // Inside <script type="application/json">: "</" must not appear (it cannot here, but be safe).
  std::string text = data.dump();
  for (std::size_t at = text.find("</"); at != std::string::npos; at = text.find("</", at)) {
    text.replace(at, 2, "<\\/");
  }
  return text;
}

}  // namespace

std::string escape_html(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string ledger_to_html(const Ledger& ledger, const BlockCensus* census,
                           const HtmlReportOptions& options) {
  const LedgerCounters counters = ledger.counters();
  const MemoryBreakdown now = compute_breakdown(counters.aggregate());
  const FragmentationMetrics metrics =
      census ? measure_fragmentation(counters, *census) : measure_fragmentation(counters);
  BreakdownTimeline timeline;
  std::uint64_t trace_records = 0, trace_dropped = 0;
  ledger.with_trace([&](const EventTrace& trace) {
    timeline = build_breakdown_timeline(trace, options.max_samples);
    trace_records = trace.size();
    trace_dropped = trace.dropped();
  });

  std::string out = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" +
                    escape_html(options.title) + "</title><style>" + kStyle + "</style></head><body>";
  out += "<h1>" + escape_html(options.title) + "</h1><div class=\"sub\">";
  if (!options.subtitle.empty()) out += escape_html(options.subtitle) + " &middot; ";
  append_format(out, "device %d &middot; %" PRIu64 " events &middot; peak reserved %s</div>",
                options.labels.device, counters.events,
                format_bytes(counters.aggregate().reserved_bytes.peak).c_str());

  if (ledger.inconsistent()) {
    out += "<p class=\"warn\">The ledger is inconsistent since " +
           escape_html(ledger.first_inconsistency()->to_string()) + "; figures are suspect.</p>";
  }
  if (timeline.incomplete) {
    append_format(out,
                  "<p class=\"warn\">The trace ring dropped the oldest %" PRIu64
                  " events: the timeline starts from zero at event %" PRIu64
                  ", not from the real state then, so its lines may be off.</p>",
                  trace_dropped, timeline.first_sequence);
  }
  if (census) {
    const ConsistencyReport consistency = check_consistency(ledger, *census);
    if (!consistency.ok()) {
      out += "<p class=\"warn\">Ledger and block census disagree:<br>" +
             escape_html(consistency.to_string()) + "</p>";
    }
  }

  out += "<h2>Reserved memory over the run, by line</h2>";
  out += "<div class=\"sub\">Stacked: the top of the stack is reserved. x: position in the event "
         "stream; each point is the highest-reserved instant of its bucket of events.</div>";
  out += stacked_breakdown_svg(timeline, kChartWidth, kBreakdownHeight);
  out += "<h2>Fragmentation over the run</h2><div class=\"sub\">"
         "<span class=\"swatch\" style=\"background:#e15759\"></span>1 &minus; active / reserved "
         "(held memory no block uses) &nbsp; <span class=\"swatch\" style=\"background:#4e79a7\">"
         "</span>running GMLake ratio, 1 &minus; peak active / peak reserved</div>";
  out += fragmentation_ratio_svg(timeline, kChartWidth, kRatioHeight);

  out += "<h2>Breakdown of reserved</h2>";
  append_breakdown_table(out, now, timeline);

  out += "<h2>Fragmentation</h2><table>";
  append_row(out, "GMLake ratio (1 - peak active / peak reserved)", ratio_text(metrics.gmlake_ratio));
  append_row(out, "ratio at peak reserved", ratio_text(metrics.ratio_at_peak_reserved));
  append_row(out, "overhead ratio (peak reserved / peak requested)",
             ratio_text(metrics.overhead_ratio));
  append_row(out, "peak reserved", format_bytes(metrics.peak_reserved_bytes));
  append_row(out, "peak requested", format_bytes(metrics.peak_requested_bytes));
  append_row(out, "peak active", format_bytes(metrics.peak_active_bytes));
  append_row(out, "inactive split", std::to_string(metrics.inactive_split) + " blocks, " +
                                        format_bytes(metrics.inactive_split_bytes));
  if (metrics.largest_free_block) {
    append_row(out, "largest free block (census)", format_bytes(*metrics.largest_free_block));
    append_row(out, "backed free bytes (census)", format_bytes(metrics.free_bytes.value_or(0)));
  }
  out += "</table>";

  out += "<h2>Counters</h2>";
  append_pool_table(out, counters);
  out += "<table>";
  append_row(out, "device allocations / frees", std::to_string(counters.num_device_alloc) + " / " +
                                                    std::to_string(counters.num_device_free));
  append_row(out, "maps / unmaps",
             std::to_string(counters.num_maps) + " / " + std::to_string(counters.num_unmaps));
  append_row(out, "alloc retries / OOMs", std::to_string(counters.num_alloc_retries) + " / " +
                                              std::to_string(counters.num_ooms));
  append_row(out, "trace records held / dropped",
             std::to_string(trace_records) + " / " + std::to_string(trace_dropped));
  out += "</table>";

  append_usage_table(out, "Tags", ledger.per_tag(), [](const TagUsage& entry) {
    return entry.is_overflow ? std::string("(tag ids >= 1024)") : tag_name(entry.tag);
  });
  append_usage_table(out, "Streams", ledger.per_stream(), [](const StreamUsage& entry) {
    if (entry.is_overflow) return std::string("(other streams)");
    char text[24];
    std::snprintf(text, sizeof(text), "0x%" PRIxPTR, entry.stream);
    return std::string(text);
  });

  out += "<div id=\"tip\"></div><script type=\"application/json\" id=\"timeline-data\">" +
         timeline_data(timeline) + "</script><script>" + kScript + "</script></body></html>\n";
  return out;
}

}  // namespace vramledger
