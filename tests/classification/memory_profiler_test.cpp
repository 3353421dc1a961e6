#include "accounting/classification/memory_profiler.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "accounting/tag_registry.hpp"
#include "scripted_process.hpp"

namespace vramledger {
namespace {

using namespace vramledger::testing;

constexpr std::int64_t kH200Total = std::int64_t{143'771} * kMiB;

// vLLM's non-torch estimate at one instant: (total - free) - memory_reserved(), where
// total - free is the whole device's used memory.
std::int64_t vllm_non_torch(ScriptedProcess& p) {
  return p.nvml.sample().device_used_bytes - p.ledger.counters().aggregate().reserved_bytes.current;
}

// Loads 3.5 GiB of weights into a 4 GiB segment, then profiles a forward pass whose activations
// peak at 1.75 GiB above the weights, in a second 2 GiB segment.
void load_weights(ScriptedProcess& p) {
  p.create_segment(4 * kGiB);
  p.alloc(3 * kGiB + kGiB / 2, 3 * kGiB + kGiB / 2, kWeightsTag);
}
void forward_pass(ScriptedProcess& p) {
  p.create_segment(2 * kGiB);
  const DevicePtr a = p.alloc(3 * kGiB / 2, 3 * kGiB / 2 - 512);
  const DevicePtr b = p.alloc(kGiB / 4, kGiB / 4);
  p.free(b, kGiB / 4, kGiB / 4);
  p.free(a, 3 * kGiB / 2, 3 * kGiB / 2 - 512);
}

TEST(MemoryProfiler, NeighbourAllocating8GiBMovesVllmButNotUs) {
  ScriptedProcess p(kH200Total, /*context=*/612 * kMiB, /*neighbours=*/2 * kGiB);
  MemoryProfiler profiler({&p.ledger}, {.process = &p.nvml});
  profiler.begin();
  load_weights(p);
  profiler.end_load();

  const std::int64_t vllm_before = vllm_non_torch(p);
  {
    ProfileScope scope(profiler);
    forward_pass(p);
    p.nvml.add_neighbour_bytes(8 * kGiB);  // another process on the same GPU
  }
  const std::int64_t vllm_after = vllm_non_torch(p);

  const ProfileResult r = profiler.result(KvBudget::of_utilization(0.9));
  EXPECT_EQ(vllm_after - vllm_before, 8 * kGiB);  // the subtraction moves by the neighbour
  EXPECT_EQ(r.non_torch_increase_bytes, 0);       // our figure does not
  EXPECT_EQ(r.non_torch_basis, NonTorchBasis::kProcessUsage);

  EXPECT_EQ(r.weights_bytes, 3 * kGiB + kGiB / 2);
  EXPECT_EQ(r.weights_tag_bytes, 3 * kGiB + kGiB / 2);
  EXPECT_EQ(r.other_torch_bytes, 0);
  EXPECT_EQ(r.peak_activation_bytes, 3 * kGiB / 2 + kGiB / 4);
  EXPECT_EQ(r.baseline_bytes, 612 * kMiB);
  EXPECT_EQ(r.device_total_bytes, kH200Total);
  // floor(0.9 * 150,754,820,096), 0.9 being the double nearest to it (just above 0.9).
  const std::int64_t budget = 135'679'338'086;
  EXPECT_EQ(r.budget_bytes, budget);
  EXPECT_EQ(r.kv_cache_budget_bytes,
            budget - 612 * kMiB - (3 * kGiB + kGiB / 2) - (3 * kGiB / 2 + kGiB / 4));
  EXPECT_EQ(r.accounted_bytes(), r.budget_bytes);
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();
}

TEST(MemoryProfiler, NeighbourFreeing8GiBMovesVllmButNotUs) {
  ScriptedProcess p(kH200Total, 612 * kMiB, 10 * kGiB);
  MemoryProfiler profiler({&p.ledger}, {.process = &p.nvml});
  profiler.begin();
  load_weights(p);
  profiler.end_load();
  const std::int64_t vllm_before = vllm_non_torch(p);
  profiler.begin_profile();
  forward_pass(p);
  p.nvml.add_neighbour_bytes(-8 * kGiB);
  profiler.end_profile();
  EXPECT_EQ(vllm_non_torch(p) - vllm_before, -8 * kGiB);
  EXPECT_EQ(profiler.result(KvBudget::of_utilization(0.5)).non_torch_increase_bytes, 0);
}

TEST(MemoryProfiler, OwnNonTorchAllocationsAreCountedWithOrWithoutTracker) {
  for (const bool with_tracker : {false, true}) {
    ScriptedProcess p(kH200Total, 612 * kMiB, 2 * kGiB);
    ScriptedTracker tracker(p);
    MemoryProfiler profiler({&p.ledger},
                            {.process = &p.nvml, .non_torch = with_tracker ? &tracker : nullptr});
    profiler.begin();
    load_weights(p);
    profiler.end_load();
    profiler.begin_profile();
    forward_pass(p);
    p.library_alloc("libcublasLt.so.12", 64 * kMiB);  // a cuBLAS workspace
    p.nvml.add_neighbour_bytes(8 * kGiB);
    profiler.end_profile();
    const ProfileResult r = profiler.result(KvBudget::of_bytes(40 * kGiB));
    EXPECT_EQ(r.non_torch_increase_bytes, 64 * kMiB);
    EXPECT_EQ(r.non_torch_tracked_increase_bytes, with_tracker ? 64 * kMiB : 0);
    EXPECT_EQ(r.budget_bytes, 40 * kGiB);
    EXPECT_FALSE(r.utilization.has_value());
    EXPECT_EQ(r.accounted_bytes(), 40 * kGiB);
  }
}

TEST(MemoryProfiler, AllocationsBetweenLoadAndProfileAreTheirOwnTerm) {
  ScriptedProcess p(kH200Total, 612 * kMiB, 0);
  p.create_segment(64 * kMiB);
  p.alloc(8 * kMiB, 8 * kMiB);  // live before begin(): part of the baseline
  MemoryProfiler profiler({&p.ledger}, {.process = &p.nvml});
  profiler.begin();
  load_weights(p);
  profiler.end_load();
  p.alloc(16 * kMiB, 16 * kMiB);  // e.g. rotary tables built after loading
  profiler.begin_profile();
  forward_pass(p);
  profiler.end_profile();
  const ProfileResult r = profiler.result(KvBudget::of_utilization(0.9));
  // non-torch (context) + torch allocated; the 56 MiB cached in the segment is reusable by
  // the KV cache, so it is in no term.
  EXPECT_EQ(r.baseline_bytes, 612 * kMiB + 8 * kMiB);
  EXPECT_EQ(r.other_torch_bytes, 16 * kMiB);
  EXPECT_EQ(r.weights_bytes, 3 * kGiB + kGiB / 2);
  EXPECT_EQ(r.peak_activation_bytes, 3 * kGiB / 2 + kGiB / 4);
  EXPECT_EQ(r.accounted_bytes(), r.budget_bytes);
}

TEST(MemoryProfiler, FallbackWithoutPerProcessDataIsMovedByNeighboursAndSaysSo) {
  ScriptedProcess p(kH200Total, 612 * kMiB, 2 * kGiB);
  p.nvml.make_process_usage_unavailable("container without PID visibility");
  MemoryProfiler profiler({&p.ledger}, {.process = &p.nvml});
  profiler.begin();
  load_weights(p);
  profiler.end_load();
  profiler.begin_profile();
  forward_pass(p);
  p.nvml.add_neighbour_bytes(8 * kGiB);
  profiler.end_profile();
  const ProfileResult r = profiler.result(KvBudget::of_utilization(0.9));
  EXPECT_EQ(r.non_torch_basis, NonTorchBasis::kDeviceUsedFallback);
  EXPECT_EQ(r.non_torch_increase_bytes, 8 * kGiB);  // the caveat, visible
  ASSERT_FALSE(r.warnings.empty());
  EXPECT_NE(r.warnings.front().find("container without PID visibility"), std::string::npos);
  EXPECT_EQ(r.accounted_bytes(), r.budget_bytes);
}

TEST(MemoryProfiler, ModelThatDoesNotFitGivesANegativeBudgetNotZero) {
  ScriptedProcess p(kH200Total, 612 * kMiB, 0);
  MemoryProfiler profiler({&p.ledger}, {.process = &p.nvml});
  profiler.begin();
  load_weights(p);
  profiler.end_load();
  profiler.begin_profile();
  forward_pass(p);
  profiler.end_profile();
  const ProfileResult r = profiler.result(KvBudget::of_bytes(4 * kGiB));
  EXPECT_EQ(r.kv_cache_budget_bytes,
            4 * kGiB - 612 * kMiB - (3 * kGiB + kGiB / 2) - (3 * kGiB / 2 + kGiB / 4));
  EXPECT_LT(r.kv_cache_budget_bytes, 0);
  ASSERT_FALSE(r.warnings.empty());
  EXPECT_NE(r.warnings.back().find("no room"), std::string::npos);
}

TEST(MemoryProfiler, WithoutSourcesTorchFiguresStillExact) {
  ScriptedProcess p(kH200Total, 612 * kMiB, 0);
  MemoryProfiler profiler({&p.ledger});
  profiler.begin();
  load_weights(p);
  profiler.end_load();
  profiler.begin_profile();
  forward_pass(p);
  profiler.end_profile();
  const ProfileResult r = profiler.result(KvBudget::of_bytes(60 * kGiB));
  EXPECT_EQ(r.non_torch_basis, NonTorchBasis::kNone);
  EXPECT_EQ(r.weights_bytes, 3 * kGiB + kGiB / 2);
  EXPECT_EQ(r.peak_activation_bytes, 3 * kGiB / 2 + kGiB / 4);
  EXPECT_EQ(r.baseline_bytes, 0);
  EXPECT_FALSE(r.warnings.empty());
}

TEST(MemoryProfiler, MissingHookDuringProfileBecomesAWarning) {
  ScriptedProcess p(kH200Total, 612 * kMiB, 0);
  MemoryProfiler profiler({&p.ledger}, {.process = &p.nvml});
  profiler.begin();
  load_weights(p);
  profiler.end_load();
  profiler.begin_profile();
  forward_pass(p);
  p.nvml.add_own_bytes(-2 * kGiB);  // the driver lost 2 GiB the ledger still thinks it holds
  profiler.end_profile();
  const ProfileResult r = profiler.result(KvBudget::of_utilization(0.9));
  bool reported = false;
  for (const std::string& warning : r.warnings) {
    reported = reported || warning.find("MISSING HOOK") != std::string::npos;
  }
  EXPECT_TRUE(reported);
}

TEST(MemoryProfiler, CallsOutOfOrderThrow) {
  ScriptedProcess p(kH200Total, 612 * kMiB, 0);
  MemoryProfiler profiler({&p.ledger});
  EXPECT_THROW(profiler.end_load(), std::logic_error);
  profiler.begin();
  EXPECT_THROW(profiler.begin_profile(), std::logic_error);
  EXPECT_THROW(profiler.result(KvBudget::of_bytes(1)), std::logic_error);
  EXPECT_THROW(MemoryProfiler({}), std::invalid_argument);
}

TEST(KvBudget, UtilizationIsFlooredExactly) {
  EXPECT_EQ(KvBudget::of_utilization(0.5).resolve(3), 1);
  EXPECT_EQ(KvBudget::of_utilization(1.0).resolve(kH200Total), kH200Total);
  EXPECT_EQ(KvBudget::of_utilization(0.0).resolve(kH200Total), 0);
  // 0.1 as a double is 0.1000000000000000055511151231257827...: 10 * it floors to 1.
  EXPECT_EQ(KvBudget::of_utilization(0.1).resolve(10), 1);
  // 0.7 as a double is 0.6999999999999999555910790149937...: 10 * it floors to 6.
  EXPECT_EQ(KvBudget::of_utilization(0.7).resolve(10), 6);
  EXPECT_EQ(KvBudget::of_bytes(123).resolve(kH200Total), 123);
  EXPECT_THROW(KvBudget::of_utilization(-0.1).resolve(10), std::invalid_argument);
  EXPECT_THROW(KvBudget::of_utilization(1.5).resolve(10), std::invalid_argument);
}

TEST(ProfileResult, LogLinesUseVllmsWording) {
  ProfileResult r;
  r.device_total_bytes = 140 * kGiB;
  r.utilization = 0.9;
  r.budget_bytes = 126 * kGiB;
  r.baseline_bytes = 612 * kMiB;
  r.weights_bytes = 14 * kGiB + kGiB / 4;
  r.non_torch_increase_bytes = 256 * kMiB;
  r.peak_activation_bytes = 2 * kGiB;
  r.non_torch_basis = NonTorchBasis::kProcessUsage;
  r.kv_cache_budget_bytes = r.budget_bytes - r.baseline_bytes - r.weights_bytes -
                            r.non_torch_increase_bytes - r.peak_activation_bytes;
  const std::vector<std::string> lines = r.log_lines();
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "the current instance can use total_gpu_memory (140.00GiB) x "
                      "gpu_memory_utilization (0.90) = 126.00GiB");
  EXPECT_EQ(lines[1], "model weights take 14.25GiB; non_torch_memory takes 0.25GiB; PyTorch "
                      "activation peak memory takes 2.00GiB; the rest of the memory reserved "
                      "for KV Cache is 108.90GiB.");
  EXPECT_EQ(lines[2], "memory in use before loading (CUDA context, modules, driver, earlier "
                      "allocations) takes 0.60GiB; other PyTorch allocations kept from loading "
                      "to profiling take 0.00GiB; non-torch figures from process_usage.");
}

}  // namespace
}  // namespace vramledger
