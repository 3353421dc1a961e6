// The JSON report: real values round-trip, the breakdown sums to reserved, the schema's keys stay.
#include "accounting/reports/json_report.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "accounting/text_report.hpp"
#include "tests/accounting/scenarios.hpp"

namespace vramledger {
namespace {

using namespace vramledger::testing;
using nlohmann::json;

std::set<std::string> keys_of(const json& object) {
  std::set<std::string> keys;
  for (const auto& [key, value] : object.items()) keys.insert(key);
  return keys;
}

TEST(JsonReport, EveryCounterOfEveryPoolRoundTrips) {
  Ledger ledger(quiet_ledger_options());
  const BlockCensus census = segment_heap_scenario(ledger);
  const json parsed = json::parse(ledger_to_json(ledger, &census).dump());
  const LedgerCounters counters = ledger.counters();
  for (const StatPool pool : {StatPool::kAggregate, StatPool::kSmall, StatPool::kLarge}) {
    for_each_stat(counters.pool(pool), [&](const char* name, const Stat& stat) {
      SCOPED_TRACE(std::string(to_string(pool)) + "." + name);
      const json& value = parsed.at("pools").at(to_string(pool)).at(name);
      EXPECT_EQ(value.at("current").get<std::int64_t>(), stat.current);
      EXPECT_EQ(value.at("peak").get<std::int64_t>(), stat.peak);
      EXPECT_EQ(value.at("allocated").get<std::int64_t>(), stat.allocated);
      EXPECT_EQ(value.at("freed").get<std::int64_t>(), stat.freed);
    });
  }
  EXPECT_EQ(parsed["pools"]["all"]["reserved_bytes"]["current"], 22 * kMiB);
  EXPECT_EQ(parsed["counters"]["events"].get<std::uint64_t>(), counters.events);
  EXPECT_EQ(parsed["counters"]["num_device_alloc"], 2);
}

TEST(JsonReport, BreakdownLinesSumToReservedInEveryPool) {
  for (const bool paged : {false, true}) {
    Ledger ledger(quiet_ledger_options());
    const BlockCensus census = paged ? paged_heap_scenario(ledger) : segment_heap_scenario(ledger);
    const json report = ledger_to_json(ledger, &census);
    for (const char* pool : {"all", "small_pool", "large_pool"}) {
      SCOPED_TRACE(std::string(paged ? "paged " : "segments ") + pool);
      const json& lines = report["breakdown"][pool];
      std::int64_t sum = 0;
      for (const char* line : {"requested", "rounding", "pending_frees", "cached_usable",
                               "fragmentation", "unmapped_physical"}) {
        EXPECT_GE(lines.at(line).get<std::int64_t>(), 0) << line;
        sum += lines.at(line).get<std::int64_t>();
      }
      EXPECT_EQ(sum, lines["reserved"].get<std::int64_t>());
      EXPECT_EQ(lines["reserved"], report["pools"][pool]["reserved_bytes"]["current"]);
      EXPECT_TRUE(lines["all_lines_non_negative"].get<bool>());
    }
  }
  Ledger ledger(quiet_ledger_options());
  segment_heap_scenario(ledger);
  const json lines = ledger_to_json(ledger, nullptr)["breakdown"]["all"];
  EXPECT_EQ(lines["fragmentation"], 14 * kMiB);
  EXPECT_EQ(lines["pending_frees"], 2 * kMiB);
  EXPECT_EQ(lines["requested"], 4'000'000);
}

// Consumers key on these names; changing them means bumping kReportSchemaVersion and
// docs/report_schema.md.
TEST(JsonReport, SchemaKeysAreStable) {
  Ledger ledger(quiet_ledger_options());
  const BlockCensus census = segment_heap_scenario(ledger);
  const json report = ledger_to_json(ledger, &census, ReportLabels{.device = 3});
  EXPECT_EQ(report["schema_version"], 1);
  EXPECT_EQ(report["device"], 3);
  EXPECT_EQ(keys_of(report),
            (std::set<std::string>{"schema_version", "generator", "device", "consistent",
                                   "first_inconsistency", "pools", "breakdown", "derived",
                                   "counters", "fragmentation", "streams", "tags", "trace",
                                   "census"}));
  EXPECT_EQ(keys_of(report["pools"]), (std::set<std::string>{"all", "small_pool", "large_pool"}));
  EXPECT_EQ(keys_of(report["pools"]["all"]),
            (std::set<std::string>{"allocation", "active", "allocated_bytes", "active_bytes",
                                   "requested_bytes", "allocated_requested_bytes", "segment",
                                   "inactive_split", "reserved_bytes", "inactive_split_bytes",
                                   "mapped_bytes", "virtual_bytes", "physical_bytes", "sleeping",
                                   "sleeping_bytes", "sleeping_resident_bytes"}));
  EXPECT_EQ(keys_of(report["pools"]["all"]["segment"]),
            (std::set<std::string>{"current", "peak", "allocated", "freed"}));
  EXPECT_EQ(keys_of(report["breakdown"]["all"]),
            (std::set<std::string>{"requested", "rounding", "pending_frees", "cached_usable",
                                   "fragmentation", "unmapped_physical", "sleeping_resident",
                                   "reserved", "sleeping", "all_lines_non_negative"}));
  EXPECT_EQ(keys_of(report["derived"]["all"]),
            (std::set<std::string>{"cached_bytes", "pending_free_bytes",
                                   "unmapped_physical_bytes", "segment_bytes"}));
  EXPECT_EQ(keys_of(report["counters"]),
            (std::set<std::string>{"num_alloc_retries", "num_ooms", "num_device_alloc",
                                   "num_device_free", "num_maps", "num_unmaps",
                                   "active_bytes_at_peak_reserved", "events"}));
  EXPECT_EQ(keys_of(report["fragmentation"]),
            (std::set<std::string>{"peak_active_bytes", "peak_reserved_bytes",
                                   "peak_requested_bytes", "active_bytes_at_peak_reserved",
                                   "gmlake_ratio", "ratio_at_peak_reserved", "overhead_ratio",
                                   "inactive_split", "inactive_split_bytes", "largest_free_block",
                                   "free_bytes"}));
  EXPECT_EQ(keys_of(report["trace"]),
            (std::set<std::string>{"capacity", "records", "appended", "dropped", "first_sequence",
                                   "clock"}));
  EXPECT_EQ(keys_of(report["census"]),
            (std::set<std::string>{"consistent", "mismatches", "free_physical_pages", "pools"}));
  ASSERT_FALSE(report["streams"].empty());
  EXPECT_EQ(keys_of(report["streams"][0]),
            (std::set<std::string>{"stream", "handle", "overflow", "usage"}));
  ASSERT_FALSE(report["tags"].empty());
  EXPECT_EQ(keys_of(report["tags"][0]), (std::set<std::string>{"id", "name", "overflow", "usage"}));
  EXPECT_EQ(keys_of(report["tags"][0]["usage"]),
            (std::set<std::string>{"allocation", "allocated_bytes", "requested_bytes",
                                   "active_bytes"}));
}

TEST(JsonReport, TagsStreamsFragmentationAndCensusCarryRealValues) {
  Ledger ledger(quiet_ledger_options());
  const BlockCensus census = segment_heap_scenario(ledger);
  const json report = ledger_to_json(ledger, &census);
  bool saw_weights = false;
  for (const json& tag : report["tags"]) {
    if (tag["name"] == "weights") {
      saw_weights = true;
      EXPECT_EQ(tag["usage"]["allocated_bytes"]["current"], 4 * kMiB);
    }
  }
  EXPECT_TRUE(saw_weights);
  bool saw_stream_1 = false;
  for (const json& stream : report["streams"]) {
    if (stream["handle"] == 1) {
      saw_stream_1 = true;
      EXPECT_EQ(stream["stream"], "0x1");
      EXPECT_EQ(stream["usage"]["active_bytes"]["current"], 6 * kMiB);
    }
  }
  EXPECT_TRUE(saw_stream_1);
  EXPECT_EQ(report["fragmentation"]["largest_free_block"], 14 * kMiB);
  EXPECT_TRUE(report["census"]["consistent"].get<bool>());
  EXPECT_EQ(report["trace"]["records"], 13);
  EXPECT_TRUE(report["consistent"].get<bool>());
  EXPECT_TRUE(report["first_inconsistency"].is_null());

  const json without_census = ledger_to_json(ledger, nullptr);
  EXPECT_TRUE(without_census["census"].is_null());
  EXPECT_TRUE(without_census["fragmentation"]["largest_free_block"].is_null());
}

TEST(JsonReport, AnInconsistentLedgerSaysWhere) {
  Ledger ledger(quiet_ledger_options());
  ledger.on_event(testing::sized(EventKind::kSegmentRelease, 2 * kMiB));  // never created
  const json report = ledger_to_json(ledger, nullptr);
  EXPECT_FALSE(report["consistent"].get<bool>());
  EXPECT_EQ(report["first_inconsistency"]["event_index"], 0);
  const std::string counter = report["first_inconsistency"]["counter"];
  EXPECT_TRUE(counter == "segment" || counter == "reserved_bytes") << counter;
}

}  // namespace
}  // namespace vramledger
