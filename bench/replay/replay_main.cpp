// vramledger-replay: replays workload traces against allocator policies on the simulated device
// and prints, per trace and policy, peak reserved against peak requested — next to what the
// recording allocator (e.g. PyTorch's own) reserved in the real run — and the driver calls it
// cost: creates (dev.alloc), maps and unmaps, and "steady", those of the three made by
// operations that did not raise peak reserved (what a warm program pays at every step).
//
//   vramledger-replay bench/traces/corpus/*.vlt.gz
//   vramledger-replay --conf paged_heap:false --conf "" --report trace.vlt.gz
//   vramledger-replay --gpu-lag-ops 1000 --report-at-peak trace.vlt.gz   (where the overhead sits)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "accounting/text_report.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/config.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "bench/replay/replay_device.hpp"
#include "bench/replay/replayer.hpp"
#include "bench/replay/simulated_gpu_lag.hpp"
#include "bench/replay/tool_command_line.hpp"
#include "bench/replay/workload_trace.hpp"

namespace vramledger {
namespace {

// The default configurations: the paged heap ("") and the segment heap; their rows' heap names
// say all there is to say about them.
const std::vector<std::string> kDefaultConfs = {"", "paged_heap:false"};

struct Options {
  std::vector<std::string> traces;
  std::vector<std::string> confs;
  double capacity_gib = 143771.0 / 1024.0;  // an H200
  bool report = false;
  bool report_at_peak = false;
  bool check = false;
  bool timeline = false;
  std::size_t gpu_lag_ops = 0;
};

std::string trace_name(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  for (const char* suffix : {".gz", ".vlt"}) {
    const std::string s = suffix;
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      name.resize(name.size() - s.size());
    }
  }
  return name;
}

double metadata_number(const WorkloadTrace& trace, const std::string& key) {
  auto it = trace.metadata.find(key);
  if (it == trace.metadata.end()) return 0;
  try {
    const double value = std::stod(it->second);
    return std::isfinite(value) && value > 0 ? value : 0;  // "nan", "inf": not a figure
  } catch (const std::exception&) {
    return 0;
  }
}

// One replay's device, books and allocator, fresh; with the simulated GPU lag when asked.
struct ReplaySetup {
  ReplayDevice device;
  Ledger ledger;
  std::unique_ptr<CachingAllocator> allocator;
  std::unique_ptr<SimulatedGpuLag> lag;

  ReplaySetup(const Config& config, const WorkloadTrace& trace, const Options& options)
      : device(config.backend, options.capacity_gib),
        allocator(std::make_unique<CachingAllocator>(device.backend(), &ledger, config.options)) {
    if (options.gpu_lag_ops > 0 && device.simulated() != nullptr) {
      std::vector<StreamHandle> streams;
      for (std::uint32_t k = 0; k < trace.stream_handles.size(); ++k) {
        streams.push_back(device.stream(k));
      }
      lag = std::make_unique<SimulatedGpuLag>(*device.simulated(), streams, options.gpu_lag_ops);
    }
  }

  ReplayResult replay(const WorkloadTrace& trace, std::size_t stop_after = SIZE_MAX,
                      std::function<void()> at_stop = nullptr) {
    ReplayHooks hooks;
    hooks.after_operation = [this] {
      if (lag) lag->after_operation();
    };
    hooks.stop_after = stop_after;
    hooks.at_stop = std::move(at_stop);
    return replay_workload(
        trace, *allocator, ledger, [this](std::uint32_t k) { return device.stream(k); }, hooks);
  }
};

// The ledger's account at the instant reserved memory first reached its peak: the trace
// replayed again, stopped after that operation, before the (simulated) GPU catches up, so
// pending frees and pages waiting for queued work show as they stood. Where the fragmentation
// figure comes from, which the account after the replay (everything freed) cannot say.
void print_account_at_peak(const WorkloadTrace& trace, const Config& config,
                           const Options& options, const ReplayResult& first,
                           const std::string& name, const std::string& policy) {
  ReplaySetup setup(config, trace, options);
  std::string account;
  std::int64_t reserved = -1;
  setup.replay(trace, first.peak_reserved_operation, [&] {
    const LedgerCounters counters = setup.ledger.counters();
    reserved = counters.pools[stat_pool_index(StatPool::kAggregate)].reserved_bytes.current;
    account = text_report(setup.ledger, setup.allocator->census());
  });
  std::printf("\nAccount of %s (%s) at peak reserved: after operation %zu of %zu, GPU lag %zu "
              "operations, before the GPU caught up:\n%s\n",
              name.c_str(), policy.c_str(), first.peak_reserved_operation + 1,
              trace.ops.size(), options.gpu_lag_ops, account.c_str());
  if (reserved != first.peak_reserved_bytes) {
    // The helper thread's unmaps (unmap_in_background) run when they run; a replay that placed
    // differently would show another instant.
    std::printf("(this replay held %lld bytes there, not the first replay's peak %lld: the "
                "account is of a different instant)\n",
                static_cast<long long>(reserved),
                static_cast<long long>(first.peak_reserved_bytes));
  }
}

int run(const Options& options) {
  std::vector<Config> configs;
  for (const std::string& text : options.confs) configs.push_back(parse_config(text));
  std::printf("%-20s %-28s %14s %14s %7s %7s %9s %9s %6s %8s\n", "trace", "policy",
              "peak requested", "peak reserved", "ratio", "gmlake", "dev.alloc", "map+unmap",
              "steady", "seconds");
  int failures = 0;
  for (const std::string& path : options.traces) {
    const WorkloadTrace trace = read_workload_trace(path);
    const std::string name = trace_name(path);
    const double torch_reserved = metadata_number(trace, "torch_peak_reserved_bytes");
    const double torch_requested = metadata_number(trace, "torch_peak_requested_bytes");
    if (torch_reserved > 0 && torch_requested > 0) {
      std::printf("%-20s %-28s %14.0f %14.0f %7.4f %7s %9s %9s %6s %8s\n", name.c_str(),
                  "recorded run (torch)", torch_requested, torch_reserved,
                  torch_reserved / torch_requested, "", "", "", "", "");
    }
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const Config& config = configs[i];
      ReplaySetup setup(config, trace, options);
      // Several configurations of one heap would print the same label: name the setting.
      std::string policy = describe_policy(config, setup.device.backend());
      if (options.confs.size() > 1 && std::find(kDefaultConfs.begin(), kDefaultConfs.end(),
                                                options.confs[i]) == kDefaultConfs.end()) {
        policy += " [" + options.confs[i] + "]";
      }
      const Ledger& ledger = setup.ledger;
      CachingAllocator* allocator = setup.allocator.get();
      const ReplayResult result = setup.replay(trace);
      setup.lag.reset();  // the GPU catches up before the census below
      std::printf("%-20s %-28s %14lld %14lld %7.4f %7.4f %9llu %9llu %6llu %8.3f%s\n",
                  name.c_str(), policy.c_str(),
                  static_cast<long long>(result.peak_requested_bytes),
                  static_cast<long long>(result.peak_reserved_bytes), result.overhead_ratio,
                  result.gmlake_ratio, static_cast<unsigned long long>(result.device_allocations),
                  static_cast<unsigned long long>(result.maps + result.unmaps),
                  static_cast<unsigned long long>(result.steady_device_allocations +
                                                  result.steady_maps + result.steady_unmaps),
                  result.seconds, result.out_of_memory ? "  (some requests did not fit)" : "");
      if (options.timeline) {
        std::printf("%-20s   driver calls by tenth of the trace:", "");
        for (std::uint64_t calls : result.calls_by_tenth) {
          std::printf(" %llu", static_cast<unsigned long long>(calls));
        }
        std::printf("\n%-20s   steady: %llu creates, %llu maps, %llu unmaps; host waits: %llu\n",
                    "", static_cast<unsigned long long>(result.steady_device_allocations),
                    static_cast<unsigned long long>(result.steady_maps),
                    static_cast<unsigned long long>(result.steady_unmaps),
                    static_cast<unsigned long long>(result.host_waits));
        // Events are host work too (cudaEventRecord / cudaEventQuery: ~1 us each on a GPU),
        // which the driver calls above do not show.
        if (const SimulatedDevice* simulated = setup.device.simulated()) {
          std::printf("%-20s   events over the whole trace: %llu recorded, %llu queried, %llu "
                      "waited for (%zu allocations)\n",
                      "", static_cast<unsigned long long>(
                              simulated->call_count(SimOp::kRecordEvent)),
                      static_cast<unsigned long long>(simulated->call_count(SimOp::kQueryEvent)),
                      static_cast<unsigned long long>(
                          simulated->call_count(SimOp::kSynchronizeEvent)),
                      trace.allocation_count);
        }
      }
      if (static_cast<std::size_t>(result.peak_requested_bytes) != trace.peak_requested_bytes &&
          result.out_of_memory == 0) {
        std::fprintf(stderr, "%s: ledger peak requested %lld differs from the trace's %zu\n",
                     name.c_str(), static_cast<long long>(result.peak_requested_bytes),
                     trace.peak_requested_bytes);
        ++failures;
      }
      const BlockCensus census = allocator->census();
      if (options.check) {
        const ConsistencyReport consistency = check_consistency(ledger, census);
        if (!consistency.ok()) {
          std::fprintf(stderr, "%s: ledger and allocator disagree\n", name.c_str());
          ++failures;
        }
      }
      if (options.report_at_peak && i + 1 == configs.size()) {
        print_account_at_peak(trace, config, options, result, name, policy);
      }
      if (options.report && i + 1 == configs.size()) {
        std::printf("\nAccount after replaying %s (%s), everything freed, cache kept:\n%s\n",
                    name.c_str(), policy.c_str(), text_report(ledger, census).c_str());
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace vramledger

int main(int argc, char** argv) {
  vramledger::Options options;
  vramledger::ToolCommandLine app{"Replays vramledger workload traces on the simulated device or, "
                                  "with --conf backend:vmm|cuda_malloc|malloc_async, on GPU 0."};
  app.existing_files("traces", options.traces, "workload traces (.vlt or .vlt.gz)");
  app.texts("--conf", options.confs,
            "allocator configuration string, repeatable (default: paged heap and segment heap)");
  app.capacity_gib("--capacity-gib", options.capacity_gib, "simulated device memory");
  app.flag("--report", options.report, "print the ledger's account after each trace");
  app.flag("--report-at-peak", options.report_at_peak,
           "print the ledger's account at the instant reserved memory first reached its peak "
           "(the trace replayed again up to there)");
  app.flag("--check", options.check, "check the ledger against a recount after each replay");
  app.flag("--timeline", options.timeline,
           "also print the driver calls (creates, maps, unmaps) by tenth of the trace, and those "
           "of the steady state by kind");
  app.whole_number("--gpu-lag-ops", options.gpu_lag_ops, 0, 1000000000,
                   "simulated device only: the GPU runs behind the CPU, completing queued work "
                   "once every N replayed operations (0: at once)");
  if (const int status = app.parse(argc, argv); status != vramledger::ToolCommandLine::kRun) {
    return status;
  }
  if (options.confs.empty()) options.confs = vramledger::kDefaultConfs;
  try {
    return vramledger::run(options);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "vramledger-replay: %s\n", error.what());
    return 2;
  }
}
