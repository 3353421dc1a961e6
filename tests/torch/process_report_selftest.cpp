// vramledger_process_report and its assembly (torch_plugin/process_report.*) on the simulated
// device, without a GPU or NVML: a scripted process source stands in for NVML, a scripted shim
// sample for the preload library. The real NVML path and the real shim are checked on the GPU
// (tests/torch/*.py, docs/classification.md).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "accounting/classification/manual_process_memory_source.hpp"
#include "torch_plugin/process_report.hpp"
#include "torch_plugin/vramledger_allocator.hpp"
#include "tests/torch/simulated_plugin.hpp"
#include "abi/vramledger_c_api.h"

namespace vramledger::torch_plugin {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

DeviceAllocators& device0() {
  plugin();
  DeviceAllocators* state = plugin().device_if_created(0);
  if (state == nullptr) {
    plugin().free_block(plugin().malloc(512, 0, nullptr));  // creates the device's state
    state = plugin().device_if_created(0);
  }
  return *state;
}

// Live allocations for the duration of a test.
struct Allocations {
  std::vector<void*> blocks;
  explicit Allocations(std::initializer_list<std::size_t> sizes) {
    for (std::size_t size : sizes) blocks.push_back(plugin().malloc(size, 0, nullptr));
  }
  ~Allocations() {
    for (void* block : blocks) plugin().free_block(block);
  }
};

std::int64_t reserved_now() { return device0().ledger_view().aggregate.reserved_bytes.current; }

// The text report's additive lines: {label, bytes} from the first line after the header to the
// "= process usage" line, which comes last.
std::vector<std::pair<std::string, std::int64_t>> additive_lines(const std::string& text) {
  std::vector<std::pair<std::string, std::int64_t>> lines;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    const std::size_t paren = line.rfind("  (");
    if (paren == std::string::npos) break;
    const std::string head = line.substr(0, paren);
    const std::size_t space = head.find_last_of(' ');
    const std::string label = head.substr(2, head.find_last_not_of(' ', space) - 1);
    lines.emplace_back(label, std::stoll(head.substr(space + 1)));
    if (line.rfind("= ", 0) == 0) break;
  }
  return lines;
}

void expect_text_sums(const std::string& text, std::int64_t process_usage) {
  const auto lines = additive_lines(text);
  ASSERT_GE(lines.size(), 8u) << text;
  EXPECT_EQ(lines.back().first, "process usage") << text;
  EXPECT_EQ(lines.back().second, process_usage) << text;
  std::int64_t sum = 0;
  for (std::size_t i = 0; i + 1 < lines.size(); ++i) sum += lines[i].second;
  EXPECT_EQ(sum, process_usage) << text;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ProcessReport, PerProcessFigureWithTrackedLibrariesSumsExactly) {
  Allocations live({1000, 3 * static_cast<std::size_t>(kMiB)});
  const std::int64_t reserved = reserved_now();
  ManualProcessMemorySource nvml;
  nvml.memory().process_used_bytes = reserved + 4 * kMiB + 600 * kMiB;
  nvml.memory().device_used_bytes = *nvml.memory().process_used_bytes + 8192 * kMiB;
  nvml.memory().device_total_bytes = 143771 * kMiB;
  NonTorchTracked shim;
  shim.hooked = true;
  shim.bytes_by_library = {{"nccl", 3 * kMiB}, {"cublas", kMiB}};

  const ProcessReport report = gather_process_report(0, &device0(), &nvml, shim, "preload");
  const ProcessClassification& c = report.classification;
  EXPECT_EQ(report.process_memory_source, "caller");
  EXPECT_EQ(c.basis, ProcessUsageBasis::kNvmlPerProcess);
  EXPECT_EQ(c.torch.reserved, reserved);
  EXPECT_EQ(c.torch.requested, 1000 + 3 * kMiB);
  EXPECT_EQ(c.remainder, 600 * kMiB);
  EXPECT_EQ(c.sum(), c.process_usage);
  EXPECT_TRUE(c.trustworthy());
  EXPECT_EQ(c.other_processes, 8192 * kMiB);

  const std::string text = process_report_text(report);
  expect_text_sums(text, c.process_usage);
  EXPECT_TRUE(contains(text, "non-torch: nccl")) << text;
  EXPECT_TRUE(contains(text, "non-torch: cublas")) << text;
  EXPECT_TRUE(contains(text, "context, modules, driver ")) << text;
  EXPECT_FALSE(contains(text, "untracked non-torch")) << text;
  EXPECT_TRUE(contains(text, "other processes (not in the sum)")) << text;
  EXPECT_TRUE(contains(text, std::to_string(8192 * kMiB))) << text;
  EXPECT_FALSE(contains(text, "MISSING HOOK")) << text;
  EXPECT_FALSE(contains(text, "CAVEAT")) << text;
  for (const auto& [label, bytes] : additive_lines(text)) EXPECT_GE(bytes, 0) << label;

  const std::string json = process_report_json(report);
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
  EXPECT_TRUE(contains(json, "\"schema\":\"vramledger.process_report\",\"schema_version\":1,"
                             "\"device\":0,\"basis\":\"nvml_per_process\"")) << json;
  EXPECT_TRUE(contains(json, "\"process_usage_bytes\":" + std::to_string(c.process_usage) +
                                 ",\"sum_bytes\":" + std::to_string(c.process_usage))) << json;
  EXPECT_TRUE(contains(json, "\"by_library\":{\"cublas\":1048576,\"nccl\":3145728}")) << json;
  EXPECT_TRUE(contains(json, "{\"kind\":\"non_torch\",\"name\":\"non-torch: nccl\","
                             "\"bytes\":3145728}")) << json;
  EXPECT_TRUE(contains(json, "{\"kind\":\"remainder\",\"name\":\"context, modules, driver\","
                             "\"bytes\":629145600}")) << json;
  EXPECT_TRUE(contains(json, "\"other_processes_bytes\":" + std::to_string(8192 * kMiB))) << json;
  EXPECT_TRUE(contains(json, "\"missing_hook\":null")) << json;
  EXPECT_TRUE(contains(json, "\"trustworthy\":true")) << json;
  EXPECT_TRUE(contains(json, "\"caveat\":null")) << json;
}

TEST(ProcessReport, NegativeRemainderIsAMissingHookInBothFormats) {
  Allocations live({8 * static_cast<std::size_t>(kMiB)});
  const std::int64_t reserved = reserved_now();
  ManualProcessMemorySource nvml;
  nvml.memory().process_used_bytes = reserved - 2 * kMiB;  // the driver saw less than we hold
  nvml.memory().device_used_bytes = reserved;
  nvml.memory().device_total_bytes = 1024 * kMiB;
  const ProcessReport report =
      gather_process_report(0, &device0(), &nvml, NonTorchTracked::untracked(), "none");
  EXPECT_EQ(report.classification.remainder, -2 * kMiB);
  const std::string text = process_report_text(report);
  expect_text_sums(text, reserved - 2 * kMiB);
  EXPECT_TRUE(contains(text, "\nMISSING HOOK: ")) << text;
  EXPECT_TRUE(contains(text, "untracked non-torch")) << text;
  EXPECT_TRUE(contains(text, "-2097152")) << text;  // shown negative, never clamped
  const std::string json = process_report_json(report);
  EXPECT_TRUE(contains(json, "\"missing_hook\":{\"deficit_bytes\":2097152,")) << json;
  EXPECT_TRUE(contains(json, "\"all_lines_non_negative\":false")) << json;
  EXPECT_TRUE(contains(json, "\"hooked\":false")) << json;
}

TEST(ProcessReport, FallbackWithoutPerProcessFigureStatesItsCaveat) {
  ManualProcessMemorySource nvml;
  nvml.memory().device_used_bytes = reserved_now() + 10 * kMiB;
  nvml.memory().device_total_bytes = 1024 * kMiB;
  nvml.make_process_usage_unavailable("PID namespace");
  const ProcessReport report =
      gather_process_report(0, &device0(), &nvml, NonTorchTracked::untracked(), "none");
  const std::string text = process_report_text(report);
  expect_text_sums(text, reserved_now() + 10 * kMiB);
  EXPECT_TRUE(contains(text, "basis device_used_fallback")) << text;
  EXPECT_TRUE(contains(text, "\nCAVEAT: per-process usage unavailable (PID namespace)")) << text;
  EXPECT_TRUE(contains(text, "other processes (not in the sum): unknown")) << text;
  EXPECT_TRUE(contains(text, "+ other processes ")) << text;  // in the remainder's label
  const std::string json = process_report_json(report);
  EXPECT_TRUE(contains(json, "\"other_processes_bytes\":null")) << json;
  EXPECT_TRUE(contains(json, "\"caveat\":\"per-process usage unavailable (PID namespace)")) << json;
}

TEST(ProcessReport, PreloadStatsBecomeLibraryLines) {
  vramledger_preload_stats stats{};
  stats.categories[VRAMLEDGER_PRELOAD_NCCL].current_bytes = 10;
  stats.categories[VRAMLEDGER_PRELOAD_CUBLAS].current_bytes = 20;
  stats.categories[VRAMLEDGER_PRELOAD_JIT].current_bytes = 3;
  stats.categories[VRAMLEDGER_PRELOAD_VRAMLEDGER].current_bytes = 1000;  // the ledger's own
  stats.categories[VRAMLEDGER_PRELOAD_TORCH].current_bytes = 5;
  stats.table_overflow = 2;
  stats.table_overflow_bytes = 4096;
  std::vector<std::string> notes;
  const auto name = [](int category) -> const char* {
    static const char* const kNames[] = {"nccl",  "cublas",     "cudnn", "triton", "unknown/JIT",
                                         "torch", "vramledger", "user",  "unknown"};
    return category >= 0 && category < 9 ? kNames[category] : nullptr;
  };
  const NonTorchTracked tracked = non_torch_from_preload(stats, name, &notes);
  EXPECT_TRUE(tracked.hooked);
  const std::map<std::string, std::int64_t> expected = {
      {"nccl", 10}, {"cublas", 20}, {"unknown/JIT", 3}, {"torch (outside vramledger)", 5}};
  EXPECT_EQ(tracked.bytes_by_library, expected);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(contains(notes[0], "2 allocations (4096 bytes) not recorded")) << notes[0];
}

TEST(ProcessReport, WithoutTheShimNonTorchIsNotHooked) {
  std::vector<std::string> notes;
  std::string source;
  const NonTorchTracked tracked = sample_preload_shim(&notes, &source);
  EXPECT_FALSE(tracked.hooked);
  EXPECT_EQ(source, "none");
  EXPECT_TRUE(notes.empty());
}

TEST(ProcessReport, CApiOnTheSimulatedDeviceFallsBackToTheBackendFigures) {
  Allocations live({4096, 5 * static_cast<std::size_t>(kMiB)});
  const char* text = vramledger_process_report(0, "text");
  ASSERT_NE(text, nullptr) << vramledger_last_error();
  const std::string report = text;
  // The simulated device holds exactly what the ledger reserved: remainder 0, sum exact.
  expect_text_sums(report, reserved_now());
  EXPECT_TRUE(contains(report, "basis device_used_fallback (from backend_memory_info)")) << report;
  EXPECT_TRUE(contains(report, "non-torch tracking off (none)")) << report;
  EXPECT_TRUE(contains(report, "simulated device")) << report;
  EXPECT_FALSE(contains(report, "MISSING HOOK")) << report;
  EXPECT_EQ(std::string(vramledger_process_report(0, nullptr)), report) << "default is text";

  const char* json = vramledger_process_report(0, "json");
  ASSERT_NE(json, nullptr) << vramledger_last_error();
  const std::string document = json;
  EXPECT_TRUE(contains(document, "\"process_memory_source\":\"backend_memory_info\"")) << document;
  EXPECT_TRUE(contains(document, "\"sum_bytes\":" + std::to_string(reserved_now()))) << document;

  EXPECT_EQ(vramledger_process_report(0, "yaml"), nullptr);
  EXPECT_TRUE(contains(vramledger_last_error(), "format must be")) << vramledger_last_error();
  EXPECT_EQ(vramledger_process_report(-1, "text"), nullptr);
  EXPECT_TRUE(contains(vramledger_last_error(), "invalid device")) << vramledger_last_error();
}

TEST(ProcessReport, DeviceVramledgerNeverUsedHasNoTorchLines) {
  const ProcessReport report = gather_process_report(
      5, nullptr, nullptr, NonTorchTracked::untracked(), "none");
  EXPECT_EQ(report.classification.allocators, 0);
  EXPECT_EQ(report.classification.torch.reserved, 0);
  EXPECT_EQ(report.classification.sum(), report.classification.process_usage);
  ASSERT_NE(vramledger_process_report(5, "text"), nullptr) << vramledger_last_error();
}

}  // namespace
}  // namespace vramledger::torch_plugin
