// vramledger-report: replays a workload trace (docs/workload_trace_format.md) through the
// caching allocator on the simulated device and writes the ledger's reports.
//
//   vramledger-report bench/traces/corpus/gpt2_train.vlt.gz --html gpt2.html --json gpt2.json
//   vramledger-report trace.vlt.gz --conf paged_heap:false --prometheus metrics.prom
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "accounting/ledger.hpp"
#include "accounting/reports/html_report.hpp"
#include "accounting/reports/json_report.hpp"
#include "accounting/reports/prometheus_report.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/config.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "bench/replay/replayer.hpp"
#include "bench/replay/tool_command_line.hpp"
#include "bench/replay/workload_trace.hpp"

namespace vramledger {
namespace {

constexpr int kExitRequestsRefused = 3;

struct Options {
  std::string trace;
  std::string conf;
  double capacity_gib = 143771.0 / 1024.0;  // an H200
  std::size_t samples = 600;
  bool empty_cache = false;
  std::string json_path;
  std::string prometheus_path;
  std::string html_path;
};

void write_file(const std::string& path, const std::string& text) {
  errno = 0;
  std::ofstream out(path, std::ios::binary);
  if (!out) {
    throw std::runtime_error("cannot write " + path + ": " +
                             (errno != 0 ? std::strerror(errno) : "open failed"));
  }
  out << text;
  out.flush();
  if (!out) throw std::runtime_error("cannot write " + path + ": write failed");
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code error;
  return std::filesystem::equivalent(a, b, error) && !error;
}

// Refuses, before anything is replayed or written, an output that is the input trace or another
// output (writing the report would destroy the trace, or one report the other).
void check_output_paths(const Options& options) {
  const std::vector<std::pair<const char*, const std::string*>> outputs = {
      {"--json", &options.json_path},
      {"--prometheus", &options.prometheus_path},
      {"--html", &options.html_path}};
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const std::string& path = *outputs[i].second;
    if (path.empty()) continue;
    if (path == options.trace || same_file(path, options.trace)) {
      throw std::runtime_error(std::string(outputs[i].first) + " " + path +
                               " is the input trace: refusing to overwrite it");
    }
    for (std::size_t j = 0; j < i; ++j) {
      const std::string& other = *outputs[j].second;
      if (!other.empty() && (other == path || same_file(other, path))) {
        throw std::runtime_error(std::string(outputs[i].first) + " and " + outputs[j].first +
                                 " name the same file " + path);
      }
    }
  }
}

std::string base_name(const std::string& path) { return path.substr(path.find_last_of('/') + 1); }

int run(const Options& options) {
  check_output_paths(options);
  const Config config = parse_config(options.conf);
  const WorkloadTrace trace = read_workload_trace(options.trace);

  SimulatedDeviceOptions device_options;
  device_options.capacity_bytes =
      static_cast<std::size_t>(options.capacity_gib * double(std::size_t{1} << 30));
  SimulatedDevice device(device_options);
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, config.options);
  std::vector<StreamHandle> streams{0};
  const ReplayResult result = replay_workload(trace, allocator, ledger, [&](std::uint32_t index) {
    while (streams.size() <= index) streams.push_back(device.create_stream());
    return streams[index];
  });
  if (options.empty_cache) allocator.empty_cache();
  const BlockCensus census = allocator.census();

  const bool paged = device.info().supports_virtual_memory && config.options.use_paged_heap;
  const std::string policy = paged ? "paged heap" : "segment heap";
  if (!options.json_path.empty()) {
    write_file(options.json_path, ledger_to_json(ledger, &census).dump(2) + "\n");
  }
  if (!options.prometheus_path.empty()) {
    write_file(options.prometheus_path, ledger_to_prometheus(ledger));
  }
  if (!options.html_path.empty()) {
    HtmlReportOptions html;
    html.title = "vramledger: " + base_name(options.trace);
    html.subtitle = policy + " on the simulated device, " + std::to_string(result.operations) +
                    " workload operations replayed";
    html.max_samples = options.samples;
    write_file(options.html_path, ledger_to_html(ledger, &census, html));
  }
  // Refused requests change every figure above: the summary says how many there were.
  std::printf("%s (%s): peak requested %lld, peak reserved %lld, overhead ratio %.4f, "
              "refused requests (out of memory) %zu of %zu\n",
              base_name(options.trace).c_str(), policy.c_str(),
              static_cast<long long>(result.peak_requested_bytes),
              static_cast<long long>(result.peak_reserved_bytes), result.overhead_ratio,
              result.out_of_memory, result.allocations + result.out_of_memory);
  if (result.out_of_memory != 0) {
    std::fprintf(stderr,
                 "vramledger-report: %zu request(s) did not fit in the simulated device "
                 "(--capacity-gib) and were skipped: the report is not the trace's\n",
                 result.out_of_memory);
  }
  // The reports are written either way; a script must still learn that they are not the trace's.
  if (ledger.inconsistent()) return 1;
  return result.out_of_memory != 0 ? kExitRequestsRefused : 0;
}

}  // namespace
}  // namespace vramledger

int main(int argc, char** argv) {
  vramledger::Options options;
  vramledger::ToolCommandLine app{"Replays a workload trace on the simulated device and writes "
                                  "the ledger's reports (JSON, Prometheus text, self-contained "
                                  "HTML)."};
  app.existing_file("trace", options.trace, "workload trace (.vlt or .vlt.gz)");
  app.text("--conf", options.conf, "allocator configuration string (default: paged heap)");
  app.capacity_gib("--capacity-gib", options.capacity_gib, "simulated device memory");
  app.whole_number("--samples", options.samples, 2, 100000, "points of the HTML timeline");
  app.flag("--empty-cache", options.empty_cache, "empty the cache before reporting");
  app.text("--json", options.json_path, "write the JSON report here");
  app.text("--prometheus", options.prometheus_path, "write Prometheus text here");
  app.text("--html", options.html_path, "write the HTML report here");
  app.footer("Exit status: 0 the trace replayed whole; 3 some requests did not fit in the simulated "
             "device (--capacity-gib): the reports were written but are not the trace's; any other "
             "non-zero status: an error, said on stderr.");
  if (const int status = app.parse(argc, argv); status != vramledger::ToolCommandLine::kRun) {
    return status;
  }
  try {
    return vramledger::run(options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "vramledger-report: %s\n", error.what());
    return 2;
  }
}
