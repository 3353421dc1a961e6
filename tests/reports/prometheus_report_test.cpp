// Prometheus text exposition: every line follows the format's grammar, each family is declared
// once (HELP, TYPE) before its samples, and the samples carry the ledger's real values.
#include "accounting/reports/prometheus_report.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>

#include "accounting/tag_registry.hpp"
#include "tests/accounting/scenarios.hpp"

namespace vramledger {
namespace {

using namespace vramledger::testing;

// The text format's grammar (https://prometheus.io/docs/instrumenting/exposition_formats/),
// one scanner per kind of line. Scanned by hand rather than with std::regex: libstdc++'s regex
// makes GCC print -Wmaybe-uninitialized warnings from its own headers in the sanitizer builds.
//   # HELP name text
//   # TYPE name counter|gauge|histogram|summary|untyped
//   name{label="value",...} value        (labels optional; value: a float, NaN or +-Inf)
bool is_name_start(char c, bool allow_colon) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_' || (allow_colon && c == ':');
}
// The length of the metric name (allow_colon) or label name at the start of `text`; 0 if none.
std::size_t name_length(std::string_view text, bool allow_colon) {
  if (text.empty() || !is_name_start(text[0], allow_colon)) return 0;
  std::size_t n = 1;
  while (n < text.size() && (is_name_start(text[n], allow_colon) ||
                             std::isdigit(static_cast<unsigned char>(text[n])) != 0)) {
    ++n;
  }
  return n;
}
bool is_metric_name(std::string_view text) {
  return !text.empty() && name_length(text, true) == text.size();
}
std::size_t digits(std::string_view text, std::size_t pos) {
  std::size_t n = 0;
  while (pos + n < text.size() && std::isdigit(static_cast<unsigned char>(text[pos + n])) != 0) ++n;
  return n;
}
// -?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?|NaN|[+-]Inf
bool is_value(std::string_view text) {
  if (text == "NaN" || text == "+Inf" || text == "-Inf") return true;
  std::size_t pos = (!text.empty() && text[0] == '-') ? 1 : 0;
  std::size_t n = digits(text, pos);
  if (n == 0) return false;
  pos += n;
  if (pos < text.size() && text[pos] == '.') {
    n = digits(text, pos + 1);
    if (n == 0) return false;
    pos += 1 + n;
  }
  if (pos < text.size() && (text[pos] == 'e' || text[pos] == 'E')) {
    ++pos;
    if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) ++pos;
    n = digits(text, pos);
    if (n == 0) return false;
    pos += n;
  }
  return pos == text.size();
}
// The length of a label set `{name="value",...}` at the start of `text`; 0 if malformed.
std::size_t label_set_length(std::string_view text) {
  if (text.empty() || text[0] != '{') return 0;
  std::size_t pos = 1;
  while (true) {
    const std::size_t n = name_length(text.substr(pos), false);
    if (n == 0) return 0;
    pos += n;
    if (text.substr(pos, 2) != "=\"") return 0;
    pos += 2;
    while (pos < text.size() && text[pos] != '"') {
      if (text[pos] == '\n') return 0;
      if (text[pos] == '\\') {
        if (pos + 1 >= text.size()) return 0;
        const char escaped = text[pos + 1];
        if (escaped != '\\' && escaped != '"' && escaped != 'n') return 0;
        ++pos;
      }
      ++pos;
    }
    if (pos >= text.size()) return 0;
    ++pos;  // the closing quote
    if (pos < text.size() && text[pos] == ',') {
      ++pos;
      continue;
    }
    if (pos < text.size() && text[pos] == '}') return pos + 1;
    return 0;
  }
}
// "# KEYWORD name rest": name and rest, or nothing when the line is not of that kind.
std::optional<std::pair<std::string, std::string>> comment_line(std::string_view line,
                                                                std::string_view keyword) {
  const std::string prefix = "# " + std::string(keyword) + " ";
  if (!line.starts_with(prefix)) return std::nullopt;
  line.remove_prefix(prefix.size());
  const std::size_t space = line.find(' ');
  if (space == std::string_view::npos || !is_metric_name(line.substr(0, space))) {
    return std::nullopt;
  }
  return std::pair{std::string(line.substr(0, space)), std::string(line.substr(space + 1))};
}
bool is_type(std::string_view type) {
  return type == "counter" || type == "gauge" || type == "histogram" || type == "summary" ||
         type == "untyped";
}
struct Sample {
  std::string name;
  std::string labels;  // with the braces, or empty
  std::string value;
};
std::optional<Sample> sample_line(std::string_view line) {
  const std::size_t n = name_length(line, true);
  if (n == 0) return std::nullopt;
  Sample sample{std::string(line.substr(0, n)), "", ""};
  line.remove_prefix(n);
  if (!line.empty() && line[0] == '{') {
    const std::size_t labels = label_set_length(line);
    if (labels == 0) return std::nullopt;
    sample.labels = std::string(line.substr(0, labels));
    line.remove_prefix(labels);
  }
  if (line.empty() || line[0] != ' ' || !is_value(line.substr(1))) return std::nullopt;
  sample.value = std::string(line.substr(1));
  return sample;
}

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
  while (std::getline(lines, line)) {
    if (const auto help = comment_line(line, "HELP")) {
      if (!helped.insert(help->first).second) parsed.errors.push_back("second HELP: " + line);
    } else if (const auto type = comment_line(line, "TYPE"); type && is_type(type->second)) {
      if (!parsed.types.emplace(type->first, type->second).second) {
        parsed.errors.push_back("second TYPE: " + line);
      }
      if (!current.empty()) closed.insert(current);
      current = type->first;
    } else if (const auto sample = sample_line(line)) {
      if (sample->name != current) parsed.errors.push_back("sample outside its family: " + line);
      if (closed.count(sample->name)) parsed.errors.push_back("family split: " + line);
      if (!parsed.samples.emplace(sample->name + sample->labels, std::stod(sample->value)).second) {
        parsed.errors.push_back("duplicate sample: " + line);
      }
    } else {
      parsed.errors.push_back("not in the grammar: " + line);
    }
  }
  if (!text.empty() && text.back() != '\n') parsed.errors.push_back("no final newline");
  return parsed;
}

// The scanner itself: what the grammar accepts and what it refuses.
TEST(PrometheusGrammar, AcceptsTheFormatAndRefusesWhatIsNot) {
  const std::string good =
      "# HELP a_b:c Some help text.\n# TYPE a_b:c gauge\na_b:c 1\n"
      "a_b:c{x=\"1\",y_2=\"q\\\"\\\\\\n\"} -2.5e+3\na_b:c{x=\"2\"} NaN\n"
      "a_b:c{x=\"3\"} +Inf\n";
  const Parsed parsed = parse_exposition(good);
  EXPECT_TRUE(parsed.errors.empty()) << parsed.errors.front();
  EXPECT_EQ(parsed.samples.size(), 4u);
  EXPECT_EQ(parsed.samples.at("a_b:c"), 1.0);
  EXPECT_EQ(parsed.samples.at("a_b:c{x=\"1\",y_2=\"q\\\"\\\\\\n\"}"), -2500.0);
  for (const char* bad : {"# TYPE a flavour", "# HELP 1a text", "# HELP a", "a", "a 1 2",
                          "a  1", "a 1.", "a .5", "a 1e", "a{} 1", "a{x=1} 1", "a{x=\"1\"",
                          "a{x=\"1\",} 1", "a{x=\"\\q\"} 1", "a{x:y=\"1\"} 1", "9a 1",
                          "a inf"}) {
    const Parsed refused = parse_exposition("# TYPE a gauge\n" + std::string(bad) + "\n");
    EXPECT_EQ(refused.errors.size(), 1u) << bad;
  }
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
