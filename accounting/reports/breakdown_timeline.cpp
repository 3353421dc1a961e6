#include "accounting/reports/breakdown_timeline.hpp"

#include <algorithm>

#include "accounting/ledger.hpp"

namespace vramledger {

BreakdownTimeline build_breakdown_timeline(const EventTrace& trace, std::size_t max_samples) {
  BreakdownTimeline timeline;
  timeline.first_sequence = trace.first_sequence();
  timeline.events = trace.size();
  timeline.incomplete = trace.dropped() > 0;
  if (trace.size() == 0 || max_samples == 0) return timeline;

  LedgerOptions options;
  options.trace_capacity = 0;  // the replay needs counters only
  options.clock = ClockSource::kNone;
  options.abort_on_inconsistency = false;  // an incomplete trace must still be drawable
  Ledger replay(options);

  const std::size_t records = trace.size();
  const std::size_t buckets = std::min(records, max_samples);
  timeline.samples.reserve(buckets);
  std::int64_t peak_reserved = -1;
  std::int64_t peak_active = 0;
  std::int64_t active_at_peak_reserved = -1;
  std::size_t index = 0;
  for (std::size_t bucket = 0; bucket < buckets; ++bucket) {
    // Bucket b holds records [b * n / buckets, (b + 1) * n / buckets).
    const std::size_t end = (bucket + 1) * records / buckets;
    TimelineSample best;
    bool have_best = false;
    for (; index < end; ++index) {
      const TraceRecord& record = trace[index];
      replay.on_event(to_event(record));
      const PoolCounters all = replay.counters().aggregate();
      const std::int64_t reserved = all.reserved_bytes.current;
      peak_active = std::max(peak_active, all.active_bytes.current);
      // Of the instants at peak reserved, the one with most active bytes: the moment the held
      // memory was best used (as active_bytes_at_peak_reserved in docs/stats.md).
      if (reserved > peak_reserved || (reserved == peak_reserved &&
                                        all.active_bytes.current > active_at_peak_reserved)) {
        active_at_peak_reserved = all.active_bytes.current;
        peak_reserved = reserved;
        timeline.at_peak_reserved = compute_breakdown(all);
        timeline.peak_reserved_sequence = timeline.first_sequence + index;
      }
      if (!have_best || reserved >= best.breakdown.reserved) {
        have_best = true;
        best.sequence = timeline.first_sequence + index;
        best.time_ticks = record.time_ticks;
        best.breakdown = compute_breakdown(all);
        best.active_bytes = all.active_bytes.current;
        best.running_gmlake_ratio =
            peak_reserved > 0
                ? 1.0 - static_cast<double>(peak_active) / static_cast<double>(peak_reserved)
                : 0.0;
      }
    }
    timeline.samples.push_back(best);
  }
  timeline.inconsistent = replay.inconsistent();
  return timeline;
}

}  // namespace vramledger
