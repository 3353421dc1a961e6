// vramledger-demo: runs an allocation workload through the caching allocator with the ledger
// attached and prints the ledger's account. The workload is a synthetic GPT-style training loop
// (synthetic_training.hpp) or a recorded workload trace (--trace); the device is the simulated
// one or, in builds with CUDA, a real GPU backend.
//
//   vramledger-demo                                   both heap shapes, simulated H200
//   vramledger-demo --conf "" --steps 100 --seed 7
//   vramledger-demo --backend vmm                     the same loop on a real GPU
//   vramledger-demo --trace bench/traces/corpus/gpt2_train.vlt.gz
//
// Arguments are parsed by hand: the GPU machine has no CLI library, and this must build there.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "accounting/text_report.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/config.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "bench/demo/synthetic_training.hpp"
#include "bench/replay/replay_device.hpp"
#include "bench/replay/replayer.hpp"
#include "bench/replay/tool_flags.hpp"
#include "bench/replay/workload_trace.hpp"

namespace vramledger {
namespace {

constexpr const char* kUsage = R"(usage: vramledger-demo [options]
  --backend NAME       simulated (default), or with a CUDA build: cuda_malloc, vmm, malloc_async
  --conf TEXT          allocator configuration (allocator/config.hpp), repeatable;
                       default: the paged heap ("") and the segment heap ("paged_heap:false")
  --trace FILE         replay this workload trace (.vlt / .vlt.gz) instead of the synthetic loop
  --write-trace FILE   write the synthetic loop's trace to FILE and continue
  --steps N            training steps of the synthetic loop, 1 to 1000000 (default 40)
  --seed N             seed of the synthetic loop's batch/sequence draws (default 1)
  --capacity-gib X     simulated device memory, up to 4096 (default 140.4, an H200)
  --help
)";

struct Options {
  std::string backend = "simulated";
  std::vector<std::string> confs;
  std::string trace_path;
  std::string write_trace_path;
  SyntheticTrainingOptions synthetic;
  double capacity_gib = 143771.0 / 1024.0;
};

[[noreturn]] void usage_error(const std::string& message) {
  std::fprintf(stderr, "vramledger-demo: %s\n%s", message.c_str(), kUsage);
  std::exit(2);
}

// Bounded: strtoull took " -1" as 2^64 - 1, and --steps 2^32 became 0 once cast to int.
constexpr std::uint64_t kMaxSteps = 1000000;

std::uint64_t parse_number(std::string_view flag, const std::string& text, std::uint64_t min,
                           std::uint64_t max) {
  std::uint64_t value = 0;
  const std::string problem = parse_whole_number(text, min, max, value);
  if (!problem.empty()) usage_error(std::string(flag) + ": " + problem);
  return value;
}

Options parse_arguments(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) usage_error(std::string(flag) + ": unknown option or missing value");
    const std::string value = argv[++i];
    if (flag == "--backend") {
      if (value != "simulated" && value != "cuda_malloc" && value != "vmm" &&
          value != "malloc_async") {
        std::string message =
            "--backend: expected simulated, cuda_malloc, vmm or malloc_async, got '";
        message += value;
        message += '\'';
        usage_error(message);
      }
      options.backend = value;
    } else if (flag == "--conf") {
      options.confs.push_back(value);
    } else if (flag == "--trace") {
      options.trace_path = value;
    } else if (flag == "--write-trace") {
      options.write_trace_path = value;
    } else if (flag == "--steps") {
      options.synthetic.steps = static_cast<int>(parse_number(flag, value, 1, kMaxSteps));
    } else if (flag == "--seed") {
      options.synthetic.seed = parse_number(flag, value, 0, UINT64_MAX);
    } else if (flag == "--capacity-gib") {
      const std::string problem = parse_capacity_gib(value, options.capacity_gib);
      if (!problem.empty()) usage_error("--capacity-gib: " + problem);
    } else {
      usage_error("unknown option " + std::string(flag));
    }
  }
  if (options.confs.empty()) options.confs = {"", "paged_heap:false"};
  return options;
}

WorkloadTrace load_workload(const Options& options) {
  if (!options.trace_path.empty()) return read_workload_trace(options.trace_path);
  const std::string text = synthetic_training_trace(options.synthetic);
  if (!options.write_trace_path.empty()) {
    errno = 0;
    std::ofstream out(options.write_trace_path, std::ios::binary);
    out << text;
    out.flush();
    if (!out) {  // a missing folder used to write nothing and exit 0
      throw Error(ErrorCode::kInvalidArgument,
                  "--write-trace " + options.write_trace_path + ": cannot write: " +
                      (errno != 0 ? std::strerror(errno) : "write failed"));
    }
  }
  std::istringstream in(text);
  return parse_workload_trace(in, "synthetic training loop");
}

// The ledger's account at the instant reserved memory peaked, with the consistency check made then.
struct AccountAtPeak {
  std::int64_t reserved = 0;
  std::int64_t live = 0;      // allocated bytes then
  std::size_t operation = 0;  // operations done when it was taken (0: none taken)
  std::string report;
  ConsistencyReport consistency;
};

// Prints the outcome of a consistency check (the ledger's counters against a recount of the
// allocator's blocks); false when it failed.
bool report_check(const char* when, const ConsistencyReport& consistency) {
  if (consistency.ok()) {
    std::printf("check %s: passed (the ledger's counters equal a recount of the allocator's "
                "blocks)\n", when);
    return true;
  }
  std::printf("check %s: FAILED\n", when);
  std::fprintf(stderr, "vramledger-demo: %s, the ledger disagrees with the allocator:\n%s\n", when,
               consistency.to_string().c_str());
  return false;
}

// What the columns of the account mean (docs/stats.md defines every line).
void print_legend() {
  std::fputs(R"(How to read the account (docs/stats.md defines every line):
  reserved       physical memory held from the (simulated) driver; the six lines under it add up
                 to it exactly, in binary units (GiB = 2^30 bytes) and, on the right, in bytes
  requested      what the live allocations asked for
  rounding       what the allocator added to them (size classes, page and block alignment)
  pending frees  freed by the program, still in use by another stream (record_stream)
  cached, usable free memory that can serve the next request (or be given back by empty_cache)
  fragmentation  free holes inside segments or spans that still hold a live block (torch's
                 inactive_split bytes): usable only by requests that fit the hole
  unmapped       physical pages held (VMM) but mapped at no address, ready to be mapped anywhere
  peaks          highest values over the run; "requested" is torch's requested_bytes
  overhead ratio peak reserved / peak requested: what the run cost over what it asked for
                 (1.0 is perfect; PyTorch's own allocator: 1.20-1.45 on the recorded traces)
  GMLake ratio   1 - peak active / peak reserved, the fragmentation figure of the GMLake paper
                 (ASPLOS 2024): the share of the most memory ever held (peak reserved) beyond the
                 most ever in use (peak active). It counts every reserved byte not in use, so at
                 the peak it matches "cached, usable" + "fragmentation" + "unmapped" together
                 (the "at peak reserved" figure), not the "fragmentation" line alone.
  check          the ledger's counters (what the allocator told it) compared with a recount of
                 the allocator's blocks (the census); "passed" means they agree exactly.
)",
             stdout);
}

// The device the allocator runs on, and how trace streams map onto its streams.
// Replays the workload under one configuration; returns false when the books do not balance.
bool run_one(const Options& options, const WorkloadTrace& workload, const std::string& conf_text) {
  const Config config = parse_config(conf_text);
  if (config.backend != "auto" && config.backend != options.backend) {
    throw Error(ErrorCode::kInvalidArgument, "--conf names backend '" + config.backend +
                                                 "' but --backend is '" + options.backend + "'");
  }
  ReplayDevice device(options.backend, options.capacity_gib);
  Ledger ledger;
  CachingAllocator allocator(device.backend(), &ledger, config.options);
  // The account is taken while the workload runs, at the instant reserved memory peaks (of
  // those instants, the one with the most live memory): by the end everything is freed and
  // every line but the cache reads 0 B.
  AccountAtPeak at_peak;
  std::size_t operations_done = 0;
  const ReplayResult result = replay_workload(
      workload, allocator, ledger, [&](std::uint32_t index) { return device.stream(index); },
      after_each_operation([&] {
        ++operations_done;
        const LedgerCounters counters = ledger.counters();
        const PoolCounters& all = counters.pools[stat_pool_index(StatPool::kAggregate)];
        const std::int64_t reserved = all.reserved_bytes.current;
        const std::int64_t live = all.allocated_bytes.current;
        // A new peak, or the same peak holding more live memory (reserved often peaks on the
        // segment created for the allocation that follows).
        if (reserved < at_peak.reserved || (reserved == at_peak.reserved && live <= at_peak.live)) {
          return;
        }
        const BlockCensus census = allocator.census();
        at_peak.reserved = reserved;
        at_peak.live = live;
        at_peak.operation = operations_done;
        at_peak.report = text_report(ledger, census);
        at_peak.consistency = check_consistency(ledger, census);
      }));
  allocator.process_completed_frees();

  std::printf("=== %s, conf \"%s\"\n", describe_policy(config, device.backend()).c_str(),
              conf_text.c_str());
  std::printf("operations %zu, allocations %zu, refused (out of memory) %zu, replay %.3f s\n",
              result.operations, result.allocations, result.out_of_memory, result.seconds);
  std::printf("peak requested %s, peak reserved %s: overhead ratio %.4f, "
              "GMLake fragmentation ratio (1 - peak active / peak reserved) %.4f\n",
              format_bytes(result.peak_requested_bytes).c_str(),
              format_bytes(result.peak_reserved_bytes).c_str(), result.overhead_ratio,
              result.gmlake_ratio);
  std::printf("device allocations %llu, device frees %llu, maps %llu, unmaps %llu\n\n",
              static_cast<unsigned long long>(result.device_allocations),
              static_cast<unsigned long long>(result.device_frees),
              static_cast<unsigned long long>(result.maps),
              static_cast<unsigned long long>(result.unmaps));
  bool balanced = true;
  if (at_peak.operation == 0) {
    std::printf("(no memory was reserved: no account at peak)\n\n");
  } else {
    std::printf("--- the account at peak reserved memory (after operation %zu of %zu)\n%s\n",
                at_peak.operation, result.operations, at_peak.report.c_str());
    balanced = report_check("at peak", at_peak.consistency) && balanced;
  }
  // The end of the run: every allocation freed, the cache kept.
  const BlockCensus census = allocator.census();
  const LedgerCounters counters = ledger.counters();
  const MemoryBreakdown end =
      compute_breakdown(counters.pools[stat_pool_index(StatPool::kAggregate)]);
  std::printf("--- at the end of the run (every allocation freed, the cache kept): reserved %s, of "
              "which cached and usable %s, unmapped physical pages %s, still allocated %s\n",
              format_bytes(end.reserved).c_str(), format_bytes(end.cached_usable).c_str(),
              format_bytes(end.unmapped_physical).c_str(),
              format_bytes(end.requested + end.rounding + end.pending_frees).c_str());
  balanced = report_check("at the end", check_consistency(ledger, census)) && balanced;
  std::printf("\n");
  return balanced;
}

}  // namespace
}  // namespace vramledger

int main(int argc, char** argv) {
  const vramledger::Options options = vramledger::parse_arguments(argc, argv);
  try {
    const vramledger::WorkloadTrace workload = vramledger::load_workload(options);
    std::printf("workload: %s, %zu operations, peak requested %s\n\n",
                options.trace_path.empty() ? "synthetic GPT-style training loop"
                                           : options.trace_path.c_str(),
                workload.ops.size(),
                vramledger::format_bytes(static_cast<std::int64_t>(workload.peak_requested_bytes))
                    .c_str());
    bool balanced = true;
    for (const std::string& conf : options.confs) {
      balanced = vramledger::run_one(options, workload, conf) && balanced;
    }
    vramledger::print_legend();
    return balanced ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "vramledger-demo: %s\n", error.what());
    return 2;
  }
}
