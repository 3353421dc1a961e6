// A tcmalloc-style text account of one allocator: reserved memory broken into additive lines
// that sum exactly to reserved (memory_breakdown.hpp), then counts, peaks, fragmentation, per-tag
// and per-stream usage (counters_text.hpp), and with a census the consistency check.
// docs/stats.md defines every line.
#pragma once

#include <string>

#include "accounting/ledger.hpp"
#include "accounting/memory_breakdown.hpp"  // the lines the report prints, for its readers
#include "allocator/caching_allocator.hpp"
#include "allocator/text_format.hpp"  // format_bytes, the report's unit for every figure

namespace vramledger {

// Everything the counters know (what Ledger::describe returns and OOM errors carry).
std::string counters_report(const Ledger& ledger);
// The same plus the census: largest free block, free bytes, and the consistency check.
std::string text_report(const Ledger& ledger, const BlockCensus& census);

}  // namespace vramledger
