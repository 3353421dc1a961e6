// The ledger in Prometheus text exposition format (version 0.0.4), for a /metrics endpoint or
// the node exporter's textfile collector. Metric names and labels: docs/report_schema.md.
#pragma once

#include <string>

#include "accounting/ledger.hpp"
#include "accounting/reports/report_labels.hpp"

namespace vramledger {

// Current values and peaks are gauges; the running totals (`allocated`/`freed` of each Stat and
// the num_* counters) are counters, which reset_accumulated() resets as Prometheus allows.
std::string ledger_to_prometheus(const Ledger& ledger, const ReportLabels& labels = {});

// Escapes a label value: backslash, double quote and newline, as the format requires.
std::string escape_label_value(const std::string& value);

}  // namespace vramledger
