// The two charts of the HTML report as inline SVG, drawn from a BreakdownTimeline: the six
// breakdown lines stacked (their top is reserved) and the fragmentation ratios, both against the
// position in the event stream.
#pragma once

#include <array>
#include <string>

#include "accounting/reports/breakdown_timeline.hpp"

namespace vramledger {

struct BreakdownCategory {
  const char* key;    // as in the JSON report's breakdown object
  const char* label;  // for people
  const char* color;
  std::int64_t MemoryBreakdown::*bytes;
};
// Bottom of the stack first.
const std::array<BreakdownCategory, 7>& breakdown_categories();

// Where the charts put an event of the stream, in SVG units (for the hover read-out's data).
double timeline_x(const BreakdownTimeline& timeline, std::uint64_t sequence, int width);

// One <path class="area" data-line="KEY"> per category (omitted when the timeline is empty),
// axes with byte ticks. Width and height are the SVG's user units.
std::string stacked_breakdown_svg(const BreakdownTimeline& timeline, int width, int height);
// Two <path class="ratio"> lines: 1 - active / reserved at each sample, and the running GMLake
// ratio; y from 0 to 1.
std::string fragmentation_ratio_svg(const BreakdownTimeline& timeline, int width, int height);

}  // namespace vramledger
