// The paged heap's steady state: a training loop whose shapes change from step to step (GPT-2
// training with a random sequence length per step, as in bench/traces/corpus/gpt2_train) must
// stop moving pages once it is warm. Each move is an unmap and a map, ~50 us of CPU on the H200
// in the allocating thread (docs/configuration.md, "Reuse in place"), at every step.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kKiB = 1024;
constexpr std::size_t kMiB = kKiB * 1024;

// One step of a transformer-like training loop at sequence length `seq`: per layer, a
// temporary and two saved activations; the logits; then the backward pass, which frees the
// saved activations in reverse order, each next to a gradient of its size.
void training_step(CachingAllocator& allocator, std::size_t seq) {
  constexpr int kLayers = 12;
  std::vector<std::pair<DevicePtr, std::size_t>> saved;
  for (int layer = 0; layer < kLayers; ++layer) {
    const DevicePtr scratch = allocator.allocate(seq * 48 * kKiB, 0);
    saved.emplace_back(allocator.allocate(seq * 12 * kKiB, 0), seq * 12 * kKiB);
    saved.emplace_back(allocator.allocate(seq * 48 * kKiB, 0), seq * 48 * kKiB);
    allocator.deallocate(scratch);
  }
  const DevicePtr logits = allocator.allocate(seq * 800 * kKiB, 0);
  const DevicePtr logits_grad = allocator.allocate(seq * 800 * kKiB, 0);
  allocator.deallocate(logits);
  while (!saved.empty()) {
    const DevicePtr grad = allocator.allocate(saved.back().second, 0);
    allocator.deallocate(saved.back().first);
    allocator.deallocate(grad);
    saved.pop_back();
  }
  allocator.deallocate(logits_grad);
}

// While idle mapped memory is plentiful (here all of it), an allocation whose best fit by size
// would need new pages goes to the tightest free run of mapped pages that holds it and maps
// nothing, whatever its size.
TEST(PagedHeapSteadyState, PlentifulIdleMemoryIsReusedInTheTightestMappedRun) {
  SimulatedDevice device(SimulatedDeviceOptions{});
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, AllocatorOptions{});
  const DevicePtr base = allocator.allocate(2 * kMiB, 0);  // the span's first page
  const DevicePtr wide_run = base + 32 * kMiB;
  const DevicePtr tight_run = base + 128 * kMiB;
  const DevicePtr wide = allocator.allocate_at(wide_run, 24 * kMiB, 0);
  const DevicePtr tight = allocator.allocate_at(tight_run, 10 * kMiB, 0);
  allocator.deallocate(base);
  allocator.deallocate(wide);
  allocator.deallocate(tight);
  const std::uint64_t maps = device.call_count(SimOp::kMapPages);
  const std::uint64_t unmaps = device.call_count(SimOp::kUnmapPages);
  const DevicePtr p = allocator.allocate(8 * kMiB, 0);  // at `base`, it would need 3 new pages
  EXPECT_EQ(p, tight_run);
  EXPECT_EQ(device.call_count(SimOp::kMapPages), maps);
  EXPECT_EQ(device.call_count(SimOp::kUnmapPages), unmaps);
  EXPECT_TRUE(device.is_range_accessible(p, 8 * kMiB));
  const ConsistencyReport report = check_consistency(ledger, allocator.census());
  EXPECT_TRUE(report.ok()) << report.to_string();
  allocator.deallocate(p);
}

// Once every length has run, the steps shorter than the longest (where idle mapped memory is
// plentiful) make no driver call: each allocation goes to a free run of mapped pages. Before
// (the best fit by size, its missing pages moved from idle ones elsewhere) the same steps made
// ~130 maps and unmaps each. Steps at the longest length may still move pages (the heap is at
// its peak there, and moving keeps the live blocks packed) but never grow the heap.
TEST(PagedHeapSteadyState, VaryingShapesStopMovingPagesOnceWarm) {
  SimulatedDevice device(SimulatedDeviceOptions{});
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, AllocatorOptions{});
  const DevicePtr weights = allocator.allocate(500 * kMiB, 0);
  std::vector<std::size_t> lengths;
  for (std::size_t seq = 128; seq <= 1024; seq += 64) lengths.push_back(seq);
  std::mt19937 random(14);
  auto random_length = [&](std::size_t count) {
    return lengths[std::uniform_int_distribution<std::size_t>(0, count - 1)(random)];
  };
  // Warm-up: every length once, the longest first, then a few random steps.
  training_step(allocator, lengths.back());
  for (std::size_t seq : lengths) training_step(allocator, seq);
  for (int step = 0; step < 10; ++step) training_step(allocator, random_length(lengths.size()));
  auto driver_calls = [&] {
    allocator.finish_background_unmaps();  // the helper thread's unmaps of earlier steps
    return device.call_count(SimOp::kCreatePhysical) + device.call_count(SimOp::kMapPages) +
           device.call_count(SimOp::kUnmapPages) + device.call_count(SimOp::kReleasePhysical);
  };

  for (int step = 0; step < 40; ++step) {
    const std::size_t seq = random_length(lengths.size() - 1);  // any but the longest
    SCOPED_TRACE("step " + std::to_string(step) + ", length " + std::to_string(seq));
    const std::uint64_t calls = driver_calls();
    training_step(allocator, seq);
    ASSERT_EQ(driver_calls(), calls) << "pages moved in the steady state";
  }
  const std::uint64_t creates = device.call_count(SimOp::kCreatePhysical);
  for (int step = 0; step < 3; ++step) training_step(allocator, lengths.back());
  EXPECT_EQ(device.call_count(SimOp::kCreatePhysical), creates) << "the peak grew";

  const LedgerCounters counters = ledger.counters();
  const PoolCounters& all = counters.pool(StatPool::kAggregate);
  EXPECT_LE(static_cast<double>(all.reserved_bytes.peak),
            1.02 * static_cast<double>(all.requested_bytes.peak));
  allocator.deallocate(weights);
  const ConsistencyReport report = check_consistency(ledger, allocator.census());
  EXPECT_TRUE(report.ok()) << report.to_string();
}

}  // namespace
}  // namespace vramledger
