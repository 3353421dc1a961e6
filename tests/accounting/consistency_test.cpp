#include "accounting/consistency.hpp"

#include <gtest/gtest.h>

#include "scenarios.hpp"

namespace vramledger {
namespace {

using namespace vramledger::testing;

TEST(Consistency, MatchingCensusIsOk) {
  {
    Ledger ledger(quiet_ledger_options());
    const BlockCensus census = segment_heap_scenario(ledger);
    const ConsistencyReport report = check_consistency(ledger, census);
    EXPECT_TRUE(report.ok()) << report.to_string();
    EXPECT_EQ(report.to_string(), "consistent");
  }
  {
    Ledger ledger(quiet_ledger_options());
    const BlockCensus census = paged_heap_scenario(ledger);
    const ConsistencyReport report = check_consistency(ledger, census);
    EXPECT_TRUE(report.ok()) << report.to_string();
  }
  {
    Ledger ledger(quiet_ledger_options());
    EXPECT_TRUE(check_consistency(ledger, BlockCensus{}).ok());
  }
}

TEST(Consistency, PlantedMismatchIsNamedWithBothValues) {
  Ledger ledger(quiet_ledger_options());
  BlockCensus census = segment_heap_scenario(ledger);
  pool_of(census, PoolKind::kLarge).allocated_bytes += 512;  // a block the ledger never heard of
  const ConsistencyReport report = check_consistency(ledger, census);
  ASSERT_FALSE(report.ok());
  ASSERT_EQ(report.mismatches.size(), 2u) << report.to_string();
  EXPECT_EQ(report.mismatches[0].name, "all.allocated_bytes");
  EXPECT_EQ(report.mismatches[0].ledger, 4 * kMiB);
  EXPECT_EQ(report.mismatches[0].census, 4 * kMiB + 512);
  EXPECT_EQ(report.mismatches[1].name, "large_pool.allocated_bytes");
  EXPECT_NE(report.to_string().find("large_pool.allocated_bytes: ledger 4194304, census 4194816"),
            std::string::npos)
      << report.to_string();
}

TEST(Consistency, EveryComparedCounterIsChecked) {
  const std::vector<std::pair<std::int64_t BlockCensus::PerPool::*, std::string>> fields = {
      {&BlockCensus::PerPool::allocation, "allocation"},
      {&BlockCensus::PerPool::allocated_bytes, "allocated_bytes"},
      {&BlockCensus::PerPool::requested_bytes, "requested_bytes"},
      {&BlockCensus::PerPool::active, "active"},
      {&BlockCensus::PerPool::active_bytes, "active_bytes"},
      {&BlockCensus::PerPool::inactive_split, "inactive_split"},
      {&BlockCensus::PerPool::inactive_split_bytes, "inactive_split_bytes"},
      {&BlockCensus::PerPool::segment, "segment"},
      {&BlockCensus::PerPool::reserved_bytes, "reserved_bytes"},
      {&BlockCensus::PerPool::mapped_bytes, "mapped_bytes"},
      {&BlockCensus::PerPool::virtual_bytes, "virtual_bytes"},
  };
  for (const auto& [field, name] : fields) {
    Ledger ledger(quiet_ledger_options());
    BlockCensus census = paged_heap_scenario(ledger);
    pool_of(census, PoolKind::kSmall).*field += 1;
    const ConsistencyReport report = check_consistency(ledger, census);
    bool found = false;
    for (const ConsistencyMismatch& mismatch : report.mismatches) {
      found |= mismatch.name == "small_pool." + name;
    }
    EXPECT_TRUE(found) << name << ":\n" << report.to_string();
  }
}

TEST(Consistency, HeldBytesIdentityCatchesMissingFreeBytes) {
  Ledger ledger(quiet_ledger_options());
  BlockCensus census = paged_heap_scenario(ledger);
  pool_of(census, PoolKind::kLarge).free_bytes = 0;  // census says the mapped tail is not free
  const ConsistencyReport report = check_consistency(ledger, census);
  ASSERT_EQ(report.mismatches.size(), 1u) << report.to_string();
  EXPECT_EQ(report.mismatches[0].ledger, kMiB);
  EXPECT_EQ(report.mismatches[0].census, 0);
}

TEST(Consistency, LedgerInconsistencyFailsTheCheck) {
  Ledger ledger(quiet_ledger_options());
  ledger.on_event(free_completed({.size = 512, .requested = 512}));
  ledger.on_event(alloc({.size = 512, .requested = 512}));  // counters balance again...
  const ConsistencyReport report = check_consistency(ledger, BlockCensus{});
  EXPECT_FALSE(report.ok());  // ... but the sticky flag remembers
  EXPECT_NE(report.to_string().find("went negative"), std::string::npos);
}

}  // namespace
}  // namespace vramledger
