// A self-contained HTML report: the breakdown of reserved over the run as a stacked-area chart
// (inline SVG, rebuilt from the event trace by breakdown_timeline.hpp), fragmentation ratios over
// the run, and summary tables. No network, no libraries; a few lines of inline script give hover
// read-outs. docs/report_schema.md describes what is drawn.
#pragma once

#include <cstddef>
#include <string>

#include "accounting/ledger.hpp"
#include "accounting/reports/report_labels.hpp"
#include "allocator/caching_allocator.hpp"

namespace vramledger {

struct HtmlReportOptions {
  std::string title = "vramledger memory report";
  std::string subtitle;          // e.g. the workload and policy; shown under the title
  std::size_t max_samples = 600;  // timeline points (one per bucket of events)
  ReportLabels labels;
};

// `census` may be null (then the census-only figures are left out).
std::string ledger_to_html(const Ledger& ledger, const BlockCensus* census,
                           const HtmlReportOptions& options = {});

// &, <, >, " and ' as entities.
std::string escape_html(const std::string& text);

}  // namespace vramledger
