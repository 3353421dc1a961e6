#include "accounting/text_report.hpp"

#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <iterator>
#include <string>
#include <vector>

#include "allocator/text_format.hpp"

#include "scenarios.hpp"

namespace vramledger {
namespace {

using namespace vramledger::testing;

TEST(MemoryBreakdown, SegmentHeapLinesSumToReserved) {
  Ledger ledger(quiet_ledger_options());
  segment_heap_scenario(ledger);
  const MemoryBreakdown breakdown = compute_breakdown(ledger.counters().aggregate());
  EXPECT_EQ(breakdown.reserved, 22 * kMiB);
  EXPECT_EQ(breakdown.requested, 4'000'000);
  EXPECT_EQ(breakdown.rounding, 4 * kMiB - 4'000'000);
  EXPECT_EQ(breakdown.pending_frees, 2 * kMiB);
  EXPECT_EQ(breakdown.fragmentation, 14 * kMiB);
  EXPECT_EQ(breakdown.cached_usable, 2 * kMiB);
  EXPECT_EQ(breakdown.unmapped_physical, 0);
  EXPECT_EQ(breakdown.sum(), breakdown.reserved);
  EXPECT_TRUE(breakdown.all_lines_non_negative());
}

TEST(MemoryBreakdown, PagedHeapLinesSumToReserved) {
  Ledger ledger(quiet_ledger_options());
  paged_heap_scenario(ledger);
  const MemoryBreakdown breakdown = compute_breakdown(ledger.counters().aggregate());
  EXPECT_EQ(breakdown.reserved, 8 * kMiB);
  EXPECT_EQ(breakdown.requested, 3'000'000);
  EXPECT_EQ(breakdown.rounding, 3 * kMiB - 3'000'000);
  EXPECT_EQ(breakdown.pending_frees, 0);
  EXPECT_EQ(breakdown.cached_usable, 1 * kMiB);
  EXPECT_EQ(breakdown.fragmentation, 0);
  EXPECT_EQ(breakdown.unmapped_physical, 4 * kMiB);
  EXPECT_EQ(breakdown.sum(), breakdown.reserved);
  EXPECT_TRUE(breakdown.all_lines_non_negative());
}

TEST(MemoryBreakdown, SumsToReservedPerPoolToo) {
  Ledger ledger(quiet_ledger_options());
  segment_heap_scenario(ledger);
  for (const StatPool pool : {StatPool::kSmall, StatPool::kLarge}) {
    const MemoryBreakdown breakdown = compute_breakdown(ledger.counters().pool(pool));
    EXPECT_EQ(breakdown.sum(), breakdown.reserved) << to_string(pool);
    EXPECT_TRUE(breakdown.all_lines_non_negative()) << to_string(pool);
  }
}

TEST(MemoryBreakdown, MissingEventShowsAsANegativeLine) {
  Ledger ledger(quiet_ledger_options());
  // An allocation with no segment behind it: the policy forgot kSegmentCreate.
  ledger.on_event(alloc({.size = 4096, .requested = 4096}));
  const MemoryBreakdown breakdown = compute_breakdown(ledger.counters().aggregate());
  EXPECT_EQ(breakdown.sum(), 0);
  EXPECT_FALSE(breakdown.all_lines_non_negative());
  EXPECT_EQ(breakdown.cached_usable, -4096);
  EXPECT_NE(ledger.describe().find("NEGATIVE: an event is missing"), std::string::npos);
}

TEST(TextReport, DescribeShowsTheBreakdownAndUsage) {
  Ledger ledger(quiet_ledger_options());
  segment_heap_scenario(ledger);
  const std::string text = ledger.describe();
  EXPECT_NE(text.find("reserved 22.00 MiB (23068672 bytes) ="), std::string::npos) << text;
  EXPECT_NE(text.find("requested by live allocations"), std::string::npos) << text;
  EXPECT_NE(text.find("4000000"), std::string::npos) << text;
  EXPECT_NE(text.find("+ pending cross-stream frees"), std::string::npos) << text;
  EXPECT_NE(text.find("+ fragmentation (inactive split blocks)"), std::string::npos) << text;
  EXPECT_NE(text.find("counts: 1 allocated blocks, 2 active, 2 segments, 1 inactive splits"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("GMLake ratio"), std::string::npos) << text;
  EXPECT_NE(text.find("  weights "), std::string::npos) << text;
  EXPECT_NE(text.find("  activations "), std::string::npos) << text;
  EXPECT_NE(text.find("  0x1 "), std::string::npos) << text;
  EXPECT_NE(text.find("trace: 13 records held, 0 dropped"), std::string::npos) << text;
  EXPECT_EQ(text.find("WARNING"), std::string::npos) << text;
  EXPECT_EQ(text.find("census"), std::string::npos) << text;  // counters only
}

TEST(TextReport, WithCensusAddsFreeBlocksAndConsistency) {
  Ledger ledger(quiet_ledger_options());
  BlockCensus census = segment_heap_scenario(ledger);
  std::string text = text_report(ledger, census);
  EXPECT_NE(text.find("free blocks (census): largest 14.00 MiB"), std::string::npos) << text;
  EXPECT_NE(text.find("consistency with the block census: ok"), std::string::npos) << text;

  pool_of(census, PoolKind::kSmall).segment = 2;
  text = text_report(ledger, census);
  EXPECT_NE(text.find("CONSISTENCY CHECK FAILED"), std::string::npos) << text;
  EXPECT_NE(text.find("small_pool.segment: ledger 1, census 2"), std::string::npos) << text;
}

TEST(TextReport, InconsistentLedgerIsAnnounced) {
  Ledger ledger(quiet_ledger_options());
  ledger.on_event(sized(EventKind::kUnmap, 4096));
  EXPECT_NE(ledger.describe().find("WARNING: the ledger is inconsistent since event #0 (unmap"),
            std::string::npos)
      << ledger.describe();
}

TEST(FormatBytes, BinaryUnits) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(format_bytes(3 * kMiB), "3.00 MiB");
  EXPECT_EQ(format_bytes(std::int64_t{5} << 40), "5.00 TiB");
  EXPECT_EQ(format_bytes(-4096), "-4.00 KiB");
  EXPECT_EQ(format_bytes(INT64_MIN), "-8.00 EiB");
}

// with_unit and format_hex write with std::to_chars; the text must stay printf's ("%.2f", its
// rounding included: 1048575 B is "1024.00 KiB"), which the reports and messages were made with.
TEST(FormatBytes, SameTextAsPrintf) {
  const auto printf_text = [](std::uint64_t magnitude, bool negative) {
    static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    char text[48];
    if (magnitude < 1024) {
      std::snprintf(text, sizeof(text), "%s%" PRIu64 " B", negative ? "-" : "", magnitude);
      return std::string(text);
    }
    double value = static_cast<double>(magnitude);
    std::size_t unit = 0;
    while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
      value /= 1024.0;
      ++unit;
    }
    std::snprintf(text, sizeof(text), "%s%.2f %s", negative ? "-" : "", value, kUnits[unit]);
    return std::string(text);
  };
  std::vector<std::uint64_t> values = {0, 1, 1023, 1024, 1048575, 1048576, UINT64_MAX,
                                       std::uint64_t{INT64_MAX}};
  for (int bit = 0; bit < 64; ++bit) {
    for (std::int64_t delta = -3; delta <= 3; ++delta) {
      values.push_back((std::uint64_t{1} << bit) + static_cast<std::uint64_t>(delta));
    }
  }
  std::uint64_t state = 0x9e3779b97f4a7c15u;
  for (int i = 0; i < 20000; ++i) {
    state = state * 6364136223846793005u + 1442695040888963407u;
    values.push_back(state >> (state % 64));  // every magnitude, not only huge ones
  }
  for (const std::uint64_t value : values) {
    ASSERT_EQ(format_size(value), printf_text(value, false)) << value;
    if (value <= std::uint64_t{INT64_MAX}) {
      ASSERT_EQ(format_bytes(static_cast<std::int64_t>(value)), printf_text(value, false));
      ASSERT_EQ(format_bytes(-static_cast<std::int64_t>(value)), printf_text(value, value != 0));
    }
    char hex[24];
    std::snprintf(hex, sizeof(hex), "0x%" PRIx64, value);
    ASSERT_EQ(format_hex(value), hex);
  }
}

}  // namespace
}  // namespace vramledger
