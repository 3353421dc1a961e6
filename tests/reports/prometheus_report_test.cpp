// Prometheus text exposition: every line follows the format's grammar, each family is declared
// once (HELP, TYPE) before its samples, and the samples carry the ledger's real values.
#include "accounting/reports/prometheus_report.hpp"

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "accounting/tag_registry.hpp"
#include "tests/accounting/scenarios.hpp"

namespace vramledger {
namespace {

using namespace vramledger::testing;

// The text format's grammar, one regex per kind of line.
const std::regex kHelp(R"(# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) (.*))");
const std::regex kType(R"(# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (counter|gauge|histogram|summary|untyped))");
const std::regex kSample(
    R"(([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")(,[a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\[\\"n])*")*\})? (-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?|NaN|[+-]Inf))");

struct Parsed {
  std::map<std::string, std::string> types;         // family -> type
  std::map<std::string, double> samples;            // "name{labels}" -> value
  std::vector<std::string> errors;
};

Parsed parse_exposition(const std::string& text) {
  Parsed parsed;
  std::set<std::string> helped;
  std::set<std::string> closed;  // families whose samples ended (they must not reappear)
  std::string current;
  std::istringstream lines(text);
  std::string line;
  std::smatch match;
  while (std::getline(lines, line)) {
    if (std::regex_match(line, match, kHelp)) {
      if (!helped.insert(match[1]).second) parsed.errors.push_back("second HELP: " + line);
    } else if (std::regex_match(line, match, kType)) {
      if (!parsed.types.emplace(match[1], match[2]).second) {
        parsed.errors.push_back("second TYPE: " + line);
      }
      if (!current.empty()) closed.insert(current);
      current = match[1];
    } else if (std::regex_match(line, match, kSample)) {
      const std::string name = match[1];
      if (name != current) parsed.errors.push_back("sample outside its family: " + line);
      if (closed.count(name)) parsed.errors.push_back("family split: " + line);
      const std::string key = name + std::string(match[2]);
      if (!parsed.samples.emplace(key, std::stod(match[7])).second) {
        parsed.errors.push_back("duplicate sample: " + line);
      }
    } else {
      parsed.errors.push_back("not in the grammar: " + line);
    }
  }
  if (!text.empty() && text.back() != '\n') parsed.errors.push_back("no final newline");
  return parsed;
}

TEST(PrometheusReport, EveryLineFollowsTheGrammarAndFamiliesAreDeclaredOnce) {
  for (const bool paged : {false, true}) {
    Ledger ledger(quiet_ledger_options());
    if (paged) {
      paged_heap_scenario(ledger);
    } else {
      segment_heap_scenario(ledger);
    }
    const std::string text = ledger_to_prometheus(ledger, ReportLabels{.device = 1});
    const Parsed parsed = parse_exposition(text);
    for (const std::string& error : parsed.errors) ADD_FAILURE() << error;
    EXPECT_GT(parsed.samples.size(), 100u);
    for (const auto& [family, type] : parsed.types) {
      if (family.ends_with("_total")) {
        EXPECT_EQ(type, "counter") << family;
      } else {
        EXPECT_EQ(type, "gauge") << family;
      }
    }
  }
}

TEST(PrometheusReport, SamplesCarryTheLedgersValues) {
  Ledger ledger(quiet_ledger_options());
  segment_heap_scenario(ledger);
  const Parsed parsed = parse_exposition(ledger_to_prometheus(ledger));
  const auto value = [&](const std::string& key) {
    const auto it = parsed.samples.find(key);
    EXPECT_NE(it, parsed.samples.end()) << key;
    return it == parsed.samples.end() ? -1.0 : it->second;
  };
  EXPECT_EQ(value(R"(vramledger_reserved_bytes{device="0",pool="all"})"), 22 * kMiB);
  EXPECT_EQ(value(R"(vramledger_reserved_bytes_peak{device="0",pool="large_pool"})"), 20 * kMiB);
  EXPECT_EQ(value(R"(vramledger_allocation{device="0",pool="all"})"), 1);
  EXPECT_EQ(value(R"(vramledger_allocation_allocated_total{device="0",pool="all"})"), 3);
  EXPECT_EQ(value(R"(vramledger_device_allocs_total{device="0"})"), 2);
  EXPECT_EQ(value(R"(vramledger_tag_allocated_bytes{device="0",tag="weights"})"), 4 * kMiB);
  EXPECT_EQ(value(R"(vramledger_stream_active_bytes{device="0",stream="0x1"})"), 6 * kMiB);
  EXPECT_EQ(value(R"(vramledger_consistent{device="0"})"), 1);

  // The breakdown lines of each pool add up to its reserved bytes.
  for (const char* pool : {"all", "small_pool", "large_pool"}) {
    double sum = 0;
    for (const char* line : {"requested", "rounding", "pending_frees", "cached_usable",
                             "fragmentation", "unmapped_physical"}) {
      sum += value(std::string("vramledger_breakdown_bytes{device=\"0\",pool=\"") + pool +
                   "\",line=\"" + line + "\"}");
    }
    EXPECT_EQ(sum, value(std::string("vramledger_reserved_bytes{device=\"0\",pool=\"") + pool +
                         "\"}"))
        << pool;
  }
  EXPECT_EQ(value(R"(vramledger_breakdown_bytes{device="0",pool="all",line="fragmentation"})"),
            14 * kMiB);
}

TEST(PrometheusReport, LabelValuesAreEscaped) {
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Ledger ledger(quiet_ledger_options());
  const TagId tag = register_tag("odd \"name\"\\x");
  AllocatorEvent event{EventKind::kAlloc};
  event.size = 512;
  event.requested = 512;
  event.tag = tag;
  event.pool = PoolKind::kSmall;
  ledger.on_event(event);
  const std::string text = ledger_to_prometheus(ledger);
  EXPECT_NE(text.find(R"(tag="odd \"name\"\\x")"), std::string::npos);
  EXPECT_TRUE(parse_exposition(text).errors.empty());
}

}  // namespace
}  // namespace vramledger
