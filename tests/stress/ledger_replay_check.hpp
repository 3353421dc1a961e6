// Checks shared by the multi-threaded tests (suite 'concurrent'): the census agrees with the
// ledger, and the ledger's trace, fed to a fresh ledger, gives the same counters and peaks.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "accounting/trace_record.hpp"
#include "allocator/caching_allocator.hpp"

namespace vramledger::stress {

inline void expect_consistent(const Ledger& ledger, const CachingAllocator& allocator) {
  const ConsistencyReport report = check_consistency(ledger, allocator.census());
  EXPECT_TRUE(report.ok()) << report.to_string();
}

// Feeds the ledger's trace to a fresh ledger: the same events in the trace's order must give the
// same counters and peaks (the shards' records join the trace in an order that proves it).
inline void expect_replay_agrees(const Ledger& ledger) {
  const EventTrace& trace = ledger.trace();
  if (trace.dropped() != 0) {
    GTEST_LOG_(INFO) << "trace dropped " << trace.dropped() << " records: replay not compared";
    return;
  }
  LedgerOptions options;
  options.trace_capacity = 0;
  options.abort_on_inconsistency = false;
  Ledger replay(options);
  for (const TraceRecord& record : trace) replay.on_event(to_event(record));
  ASSERT_FALSE(replay.inconsistent()) << replay.first_inconsistency()->to_string();
  const LedgerCounters live = ledger.counters();
  const LedgerCounters replayed = replay.counters();
  for (std::size_t pool = 0; pool < kStatPoolCount; ++pool) {
    SCOPED_TRACE(to_string(static_cast<StatPool>(pool)));
    for_each_stat(live.pools[pool], [&, index = 0](const char* name, const Stat& stat) mutable {
      std::size_t at = 0;
      for_each_stat(replayed.pools[pool], [&](const char*, const Stat& other) {
        if (at++ == static_cast<std::size_t>(index)) {
          EXPECT_EQ(stat.current, other.current) << name;
          EXPECT_EQ(stat.peak, other.peak) << name;
        }
      });
      ++index;
    });
  }
  EXPECT_EQ(live.active_bytes_at_peak_reserved, replayed.active_bytes_at_peak_reserved);
  const std::vector<StreamUsage> live_streams = ledger.per_stream();
  const std::vector<StreamUsage> replayed_streams = replay.per_stream();
  ASSERT_EQ(live_streams.size(), replayed_streams.size());
  for (std::size_t i = 0; i < live_streams.size(); ++i) {
    SCOPED_TRACE(live_streams[i].stream);
    EXPECT_EQ(live_streams[i].stream, replayed_streams[i].stream);
    std::vector<Stat> replayed_stats;
    for_each_usage_stat(replayed_streams[i].usage,
                        [&](const char*, const Stat& stat) { replayed_stats.push_back(stat); });
    std::size_t at = 0;
    for_each_usage_stat(live_streams[i].usage, [&](const char* name, const Stat& stat) {
      ASSERT_LT(at, replayed_stats.size());
      EXPECT_EQ(stat.current, replayed_stats[at].current) << name;
      EXPECT_EQ(stat.peak, replayed_stats[at].peak) << name;
      ++at;
    });
  }
}

}  // namespace vramledger::stress
