// The counters-only text account (the first part of text_report.hpp's report, and what the
// ledger attaches to out-of-memory errors): the additive breakdown of reserved, counts, peaks,
// fragmentation, per-tag and per-stream usage. It prints a CountersAccount, the ledger's figures
// copied out, so the ledger can describe itself without depending on its printers (arrows go
// one way: text_report -> ledger -> counters_text).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "accounting/fragmentation.hpp"
#include "accounting/ledger_counters.hpp"

namespace vramledger {

struct CountersAccount {
  LedgerCounters counters;
  std::vector<TagUsage> tags;        // Ledger::per_tag()
  std::vector<StreamUsage> streams;  // Ledger::per_stream()
  std::size_t trace_records = 0;
  std::uint64_t trace_dropped = 0;
  std::string inconsistency;  // the ledger's first inconsistency, described; empty when none
};

std::string counters_text(const CountersAccount& account, const FragmentationMetrics& metrics);

}  // namespace vramledger
