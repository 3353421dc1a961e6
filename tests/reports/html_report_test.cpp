// The HTML report: self-contained (no network), and its SVG paths are drawn from real data —
// one point per timeline sample, and the top of the stack reaching the run's peak reserved.
#include "accounting/reports/html_report.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "accounting/reports/breakdown_timeline.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "bench/replay/replayer.hpp"
#include "bench/replay/workload_trace.hpp"
#include "tests/accounting/scenarios.hpp"

namespace vramledger {
namespace {

using namespace vramledger::testing;

struct SvgPath {
  std::string cls;
  std::string line;
  std::vector<std::pair<double, double>> points;
};

// Plain string search rather than std::regex: libstdc++'s regex recurses per character and a
// path's d attribute is thousands of characters long (too deep a stack under sanitizers).
std::string attribute(const std::string& tag, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const std::size_t at = tag.find(key);
  if (at == std::string::npos) return {};
  const std::size_t begin = at + key.size();
  return tag.substr(begin, tag.find('"', begin) - begin);
}

std::vector<SvgPath> paths_of(const std::string& html) {
  std::vector<SvgPath> paths;
  for (std::size_t at = html.find("<path "); at != std::string::npos;
       at = html.find("<path ", at + 1)) {
    const std::string tag = html.substr(at, html.find('>', at) - at);
    SvgPath parsed{attribute(tag, "class"), attribute(tag, "data-line"), {}};
    const std::string d = attribute(tag, "d");
    for (std::size_t i = 0; i < d.size();) {
      if (d[i] != 'M' && d[i] != 'L') {
        ++i;
        continue;
      }
      std::size_t used = 0;
      const double x = std::stod(d.substr(i + 1), &used);
      const std::size_t comma = i + 1 + used;
      const double y = std::stod(d.substr(comma + 1), &used);
      parsed.points.emplace_back(x, y);
      i = comma + 1 + used;
    }
    paths.push_back(parsed);
  }
  return paths;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(HtmlReport, IsSelfContained) {
  Ledger ledger(quiet_ledger_options());
  const BlockCensus census = segment_heap_scenario(ledger);
  HtmlReportOptions options;
  options.title = "a <title> & more";
  const std::string html = ledger_to_html(ledger, &census, options);
  EXPECT_TRUE(html.starts_with("<!DOCTYPE html>"));
  EXPECT_NE(html.find("a &lt;title&gt; &amp; more"), std::string::npos);
  EXPECT_EQ(count(html, "<svg"), 2u);
  EXPECT_EQ(html.find("http://") , html.find("http://www.w3.org/2000/svg"));  // the SVG namespace only
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("<script src"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_NE(html.find("fragmentation (inactive split)"), std::string::npos);
}

TEST(HtmlReport, PathsHaveOnePointPerSampleOnBothBoundaries) {
  Ledger ledger(quiet_ledger_options());
  const BlockCensus census = segment_heap_scenario(ledger);
  const std::string html = ledger_to_html(ledger, &census);
  const std::vector<SvgPath> paths = paths_of(html);
  const std::size_t samples = ledger.trace().size();
  ASSERT_EQ(paths.size(), 9u);  // seven areas, two ratio lines
  for (std::size_t i = 0; i < 7; ++i) {
    EXPECT_EQ(paths[i].cls, "area");
    EXPECT_EQ(paths[i].points.size(), 2 * samples) << paths[i].line;
  }
  EXPECT_EQ(paths[0].line, "requested");
  EXPECT_EQ(paths[5].line, "unmapped_physical");
  EXPECT_EQ(paths[6].line, "sleeping_resident");
  EXPECT_EQ(paths[7].points.size(), samples);
}

// gpt2_train from the recorded corpus, replayed on the simulated device (paged heap): the top of
// the stack climbs to the run's peak reserved and comes back down after the frees.
TEST(HtmlReport, DrawsARealCorpusReplay) {
  const WorkloadTrace trace = read_workload_trace(VRAMLEDGER_CORPUS_DIR "/gpt2_train.vlt.gz");
  SimulatedDeviceOptions device_options;
  device_options.capacity_bytes = std::size_t{140} << 30;
  SimulatedDevice device(device_options);
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, AllocatorOptions{});
  std::vector<StreamHandle> streams{0};
  replay_workload(trace, allocator, ledger, [&](std::uint32_t k) {
    while (streams.size() <= k) streams.push_back(device.create_stream());
    return streams[k];
  });
  const BlockCensus census = allocator.census();
  HtmlReportOptions options;
  options.max_samples = 300;
  const std::string html = ledger_to_html(ledger, &census, options);
  const std::vector<SvgPath> paths = paths_of(html);
  ASSERT_EQ(paths.size(), 9u);

  // The upper boundary of the top area is reserved; its highest point (smallest y) is the peak.
  const SvgPath& top = paths[6];
  ASSERT_EQ(top.points.size(), 600u);
  double min_y = 1e9;
  double max_y = -1e9;
  for (std::size_t i = 0; i < 300; ++i) {
    min_y = std::min(min_y, top.points[i].second);
    max_y = std::max(max_y, top.points[i].second);
  }
  EXPECT_GT(max_y - min_y, 100.0) << "the chart should show reserved moving over the run";
  // Stack order: every area's top lies at or above (smaller y than) the area below's top.
  for (std::size_t i = 1; i < 7; ++i) {
    for (std::size_t k = 0; k < 300; ++k) {
      EXPECT_LE(paths[i].points[k].second, paths[i - 1].points[k].second + 0.05);
    }
  }
  // The data behind the hover read-out names the real peak.
  const BreakdownTimeline timeline = build_breakdown_timeline(ledger.trace(), 300);
  std::int64_t highest = 0;
  for (const TimelineSample& sample : timeline.samples) {
    highest = std::max(highest, sample.breakdown.reserved);
    EXPECT_EQ(sample.breakdown.sum(), sample.breakdown.reserved);
    EXPECT_TRUE(sample.breakdown.all_lines_non_negative());
  }
  EXPECT_EQ(highest, ledger.counters().aggregate().reserved_bytes.peak);
  EXPECT_NE(html.find(std::to_string(highest)), std::string::npos);
  EXPECT_FALSE(timeline.incomplete);
}

}  // namespace
}  // namespace vramledger
