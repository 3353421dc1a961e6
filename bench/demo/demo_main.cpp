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
  const ReplayResult result = replay_workload(
      workload, allocator, ledger, [&](std::uint32_t index) { return device.stream(index); });
  allocator.process_completed_frees();

  std::printf("=== %s, conf \"%s\"\n", describe_policy(config, device.backend()).c_str(),
              conf_text.c_str());
  std::printf("operations %zu, allocations %zu, refused (out of memory) %zu, replay %.3f s\n",
              result.operations, result.allocations, result.out_of_memory, result.seconds);
  std::printf("peak requested %s, peak reserved %s: overhead ratio %.4f, "
              "fragmentation (1 - peak active / peak reserved) %.4f\n",
              format_bytes(result.peak_requested_bytes).c_str(),
              format_bytes(result.peak_reserved_bytes).c_str(), result.overhead_ratio,
              result.gmlake_ratio);
  std::printf("device allocations %llu, device frees %llu, maps %llu, unmaps %llu\n\n",
              static_cast<unsigned long long>(result.device_allocations),
              static_cast<unsigned long long>(result.device_frees),
              static_cast<unsigned long long>(result.maps),
              static_cast<unsigned long long>(result.unmaps));
  const BlockCensus census = allocator.census();
  std::printf("%s\n", text_report(ledger, census).c_str());
  const ConsistencyReport consistency = check_consistency(ledger, census);
  if (!consistency.ok()) {
    std::fprintf(stderr, "vramledger-demo: the ledger disagrees with the allocator:\n%s\n",
                 consistency.to_string().c_str());
    return false;
  }
  return true;
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
    return balanced ? 0 : 1;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "vramledger-demo: %s\n", error.what());
    return 2;
  }
}
