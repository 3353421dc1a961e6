// The ledger as a JSON document with a versioned schema (docs/report_schema.md): every counter
// per pool, the additive breakdown of reserved, per-stream and per-tag usage, fragmentation
// metrics and event-trace figures. For tools and dashboards; text_report.hpp is for people.
#pragma once

#include <nlohmann/json.hpp>

#include "accounting/ledger.hpp"
#include "accounting/reports/report_labels.hpp"
#include "allocator/caching_allocator.hpp"

namespace vramledger {

// Bumped whenever a key is renamed, removed or changes meaning; adding keys keeps the version.
inline constexpr int kReportSchemaVersion = 1;

// `census` may be null: the census-only figures (largest free block, free bytes, the consistency
// check) are then null in the document. Take both under the allocator's lock.
nlohmann::json ledger_to_json(const Ledger& ledger, const BlockCensus* census,
                              const ReportLabels& labels = {});

}  // namespace vramledger
