// The breakdown of reserved over a run, rebuilt from an event trace: the records are fed again
// (to_event) into a fresh Ledger, and compute_breakdown is sampled as it goes. The HTML report
// draws it; anything else wanting "each category over time" can use it too.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "accounting/event_trace.hpp"
#include "accounting/memory_breakdown.hpp"

namespace vramledger {

struct TimelineSample {
  std::uint64_t sequence = 0;  // position of the sampled instant in the ledger's event stream
  std::uint64_t time_ticks = 0;
  MemoryBreakdown breakdown;       // aggregate, after the event at `sequence`
  std::int64_t active_bytes = 0;   // aggregate
  // 1 - peak active / peak reserved over the run so far (GMLake's ratio); 0 before any reserve.
  double running_gmlake_ratio = 0;
};

struct BreakdownTimeline {
  std::vector<TimelineSample> samples;  // in stream order
  std::uint64_t first_sequence = 0;     // the trace's first record
  std::uint64_t events = 0;             // records replayed
  // The ring had dropped older records: the replay starts from zero, not from the ledger's real
  // state then, so lines can be off (even negative). Reported, never hidden.
  bool incomplete = false;
  bool inconsistent = false;  // the replaying ledger saw a counter go negative
  // The instant reserved peaked (of several, the one with most active bytes).
  MemoryBreakdown at_peak_reserved;
  std::uint64_t peak_reserved_sequence = 0;
};

// Splits the records into `max_samples` buckets of consecutive events and keeps from each the
// instant where reserved was highest (the last such one), so that no peak falls between
// samples. With fewer records than max_samples every record is a sample.
BreakdownTimeline build_breakdown_timeline(const EventTrace& trace, std::size_t max_samples);

}  // namespace vramledger
