#include "accounting/reports/timeline_svg.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <vector>

namespace vramledger {
namespace {

// Plot area inside the SVG: room on the left for byte labels, at the bottom for event indexes.
struct Frame {
  double left = 84, top = 12, right = 0, bottom = 0;  // right/bottom from the size
  std::uint64_t x_min = 0, x_max = 1;
  double y_max = 1;

  double x(std::uint64_t sequence) const {
    const double span = static_cast<double>(x_max - x_min);
    return left + (span > 0 ? static_cast<double>(sequence - x_min) / span : 0.5) * (right - left);
  }
  double y(double value) const { return bottom - value / y_max * (bottom - top); }
};

Frame make_frame(const BreakdownTimeline& timeline, int width, int height, double y_max) {
  Frame frame;
  frame.right = width - 16.0;
  frame.bottom = height - 28.0;
  // The whole replayed stream, not just the sampled instants, so the axis starts at its start.
  if (timeline.events > 0) {
    frame.x_min = timeline.first_sequence;
    frame.x_max = timeline.first_sequence + timeline.events - 1;
  }
  frame.y_max = y_max > 0 ? y_max : 1;
  return frame;
}

std::string format(const char* pattern, double a, double b) {
  char text[64];
  std::snprintf(text, sizeof(text), pattern, a, b);
  return text;
}

// A step of 1, 2 or 5 times a power of 1024 or 10 — bytes read best in binary units.
double nice_byte_step(double max_value, int ticks) {
  const double raw = max_value / ticks;
  double unit = 1;
  while (unit * 1024 <= raw) unit *= 1024;
  for (const double m : {1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0}) {
    if (unit * m >= raw) return unit * m;
  }
  return unit * 1024;
}

std::string byte_label(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), bytes == static_cast<double>(static_cast<std::int64_t>(bytes))
                                        ? "%.0f %s"
                                        : "%.1f %s",
                bytes, kUnits[unit]);
  return text;
}

void append_axes(std::string& svg, const Frame& frame, const std::vector<double>& y_ticks,
                 const std::vector<std::string>& y_labels) {
  for (std::size_t i = 0; i < y_ticks.size(); ++i) {
    const double y = frame.y(y_ticks[i]);
    svg += "<line class=\"grid\" x1=\"" + format("%.1f", frame.left, 0) + "\" x2=\"" +
           format("%.1f", frame.right, 0) + "\" y1=\"" + format("%.1f", y, 0) + "\" y2=\"" +
           format("%.1f", y, 0) + "\"/>";
    svg += "<text class=\"tick\" x=\"" + format("%.1f", frame.left - 6, 0) + "\" y=\"" +
           format("%.1f", y + 4, 0) + "\" text-anchor=\"end\">" + y_labels[i] + "</text>";
  }
  for (int i = 0; i <= 4; ++i) {
    const std::uint64_t sequence = frame.x_min + (frame.x_max - frame.x_min) * i / 4;
    char label[32];
    std::snprintf(label, sizeof(label), "%" PRIu64, sequence);
    svg += "<text class=\"tick\" x=\"" + format("%.1f", frame.x(sequence), 0) + "\" y=\"" +
           format("%.1f", frame.bottom + 16, 0) + "\" text-anchor=\"middle\">" + label + "</text>";
  }
  svg += "<line class=\"axis\" x1=\"" + format("%.1f", frame.left, 0) + "\" x2=\"" +
         format("%.1f", frame.right, 0) + "\" y1=\"" + format("%.1f", frame.bottom, 0) +
         "\" y2=\"" + format("%.1f", frame.bottom, 0) + "\"/>";
}

// Appends "Mx,y" or "Lx,y" to a path's d attribute. (Built with snprintf: GCC 12 warns falsely
// about `"M" + std::string`, and --werror makes that fatal.)
void append_point(std::string& d, char command, double x, double y) {
  char text[48];
  std::snprintf(text, sizeof(text), "%c%.1f,%.1f", command, x, y);
  d += text;
}

std::string open_svg(const char* id, int width, int height) {
  char text[160];
  std::snprintf(text, sizeof(text),
                "<svg id=\"%s\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" "
                "width=\"%d\" height=\"%d\">",
                id, width, height, width, height);
  return text;
}

}  // namespace

const std::array<BreakdownCategory, 7>& breakdown_categories() {
  static const std::array<BreakdownCategory, 7> categories{{
      {"requested", "requested by live allocations", "#4e79a7", &MemoryBreakdown::requested},
      {"rounding", "rounding", "#a0cbe8", &MemoryBreakdown::rounding},
      {"pending_frees", "pending cross-stream frees", "#b07aa1", &MemoryBreakdown::pending_frees},
      {"cached_usable", "cached, usable", "#59a14f", &MemoryBreakdown::cached_usable},
      {"fragmentation", "fragmentation (inactive split)", "#e15759",
       &MemoryBreakdown::fragmentation},
      {"unmapped_physical", "unmapped physical pages", "#bab0ac",
       &MemoryBreakdown::unmapped_physical},
      {"sleeping_resident", "asleep, kept pages (docs/sleep.md)", "#f1ce63",
       &MemoryBreakdown::sleeping_resident},
  }};
  return categories;
}

double timeline_x(const BreakdownTimeline& timeline, std::uint64_t sequence, int width) {
  return make_frame(timeline, width, 100, 1).x(sequence);
}

std::string stacked_breakdown_svg(const BreakdownTimeline& timeline, int width, int height) {
  std::int64_t max_reserved = 0;
  for (const TimelineSample& sample : timeline.samples) {
    max_reserved = std::max(max_reserved, sample.breakdown.reserved);
  }
  const double step = nice_byte_step(static_cast<double>(std::max<std::int64_t>(max_reserved, 1)), 5);
  const double y_max = step * std::max(1.0, std::ceil(static_cast<double>(max_reserved) / step));
  const Frame frame = make_frame(timeline, width, height, y_max);

  std::string svg = open_svg("breakdown-chart", width, height);
  std::vector<double> ticks;
  std::vector<std::string> labels;
  for (double value = 0; value <= y_max + step / 2; value += step) {
    ticks.push_back(value);
    labels.push_back(byte_label(value));
  }
  append_axes(svg, frame, ticks, labels);

  // Each area lies between the running sum below it and the running sum including it. Lines are
  // drawn as they are: a negative line (a missing event) makes the stack dip, visibly.
  std::vector<double> below(timeline.samples.size(), 0.0);
  for (const BreakdownCategory& category : breakdown_categories()) {
    if (timeline.samples.empty()) break;
    std::string upper;
    std::string lower;
    std::vector<double> above(below.size());
    for (std::size_t i = 0; i < timeline.samples.size(); ++i) {
      above[i] = below[i] + static_cast<double>(timeline.samples[i].breakdown.*category.bytes);
      append_point(upper, i == 0 ? 'M' : 'L', frame.x(timeline.samples[i].sequence),
                   frame.y(above[i]));
    }
    for (std::size_t i = timeline.samples.size(); i-- > 0;) {
      append_point(lower, 'L', frame.x(timeline.samples[i].sequence), frame.y(below[i]));
    }
    svg += std::string("<path class=\"area\" data-line=\"") + category.key + "\" fill=\"" +
           category.color + "\" d=\"" + upper + lower + "Z\"><title>" + category.label +
           "</title></path>";
    below = std::move(above);
  }
  svg += "<line id=\"breakdown-cursor\" class=\"cursor\" x1=\"0\" x2=\"0\" y1=\"" +
         format("%.1f", frame.top, 0) + "\" y2=\"" + format("%.1f", frame.bottom, 0) +
         "\" visibility=\"hidden\"/>";
  svg += "</svg>";
  return svg;
}

std::string fragmentation_ratio_svg(const BreakdownTimeline& timeline, int width, int height) {
  const Frame frame = make_frame(timeline, width, height, 1.0);
  std::string svg = open_svg("ratio-chart", width, height);
  append_axes(svg, frame, {0, 0.25, 0.5, 0.75, 1.0}, {"0", "0.25", "0.50", "0.75", "1"});
  if (!timeline.samples.empty()) {
    std::string waste;
    std::string gmlake;
    for (std::size_t i = 0; i < timeline.samples.size(); ++i) {
      const TimelineSample& sample = timeline.samples[i];
      const double reserved = static_cast<double>(sample.breakdown.reserved);
      const double waste_ratio =
          reserved > 0 ? 1.0 - static_cast<double>(sample.active_bytes) / reserved : 0.0;
      const double x = frame.x(sample.sequence);
      append_point(waste, i == 0 ? 'M' : 'L', x, frame.y(waste_ratio));
      append_point(gmlake, i == 0 ? 'M' : 'L', x, frame.y(sample.running_gmlake_ratio));
    }
    svg += "<path class=\"ratio\" data-line=\"waste\" stroke=\"#e15759\" d=\"" + waste +
           "\"><title>1 - active / reserved</title></path>";
    svg += "<path class=\"ratio\" data-line=\"gmlake\" stroke=\"#4e79a7\" d=\"" + gmlake +
           "\"><title>running GMLake ratio: 1 - peak active / peak reserved</title></path>";
  }
  svg += "</svg>";
  return svg;
}

}  // namespace vramledger
