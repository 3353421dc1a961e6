// Host-side latency of one allocate + deallocate pair through CachingAllocator on the simulated
// device, with the Ledger attached as the observer (the configuration every integration uses).
// The figures to compare with are in /work/shared/anchors.md: cudaMallocAsync ~650 ns, PyTorch's
// caching allocator ~550-880 ns per pair on the H200 machine; our target is <= 60 ns.
//
//   build-release/bench/vramledger-bench-latency --benchmark_format=json
//
// Results: bench/results/<date>-cpu-simulated.{md,json}.
#include <benchmark/benchmark.h>

#include <array>
#include <cmath>
#include <cstddef>
#include <memory>
#include <random>
#include <vector>

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kMaxThreads = 16;
constexpr std::size_t kFrontCacheBytes = std::size_t{1} << 30;  // every benchmarked size enters
constexpr std::size_t kLiveBlocks = 64;
constexpr std::size_t kPatternLength = 4096;  // a power of two: the loop wraps with a mask

// A simulated H200 with an allocator and its ledger; `paged` picks the heap shape. Without
// `with_ledger` the allocator reports to no observer: the policy's own cost and scaling.
struct Rig {
  explicit Rig(bool paged, bool front = false, bool with_ledger = true,
               std::size_t cold_allocations = AllocatorOptions{}.cross_stream_cold_allocations)
      : device(device_options(paged)),
        allocator(device, with_ledger ? &ledger : nullptr,
                  allocator_options(front, cold_allocations)) {
    for (std::size_t i = 0; i < kMaxThreads; ++i) {
      streams[i] = i == 0 ? StreamHandle{0} : device.create_stream();
    }
    // The steady state of a process past its first million events: otherwise each rig's first
    // ~1 M events (a fifth of a second here) also pay the trace ring's page faults.
    ledger.trace().prefault();
  }
  static SimulatedDeviceOptions device_options(bool paged) {
    SimulatedDeviceOptions options;
    options.capacity_bytes = std::size_t{140} << 30;
    options.supports_virtual_memory = paged;
    return options;
  }
  static AllocatorOptions allocator_options(bool front, std::size_t cold_allocations) {
    AllocatorOptions options;
    options.front_cache_bytes = front ? kFrontCacheBytes : 0;
    options.cross_stream_cold_allocations = cold_allocations;
    return options;
  }
  SimulatedDevice device;
  Ledger ledger;
  CachingAllocator allocator;
  std::array<StreamHandle, kMaxThreads> streams{};
};

// The mixed pattern: which of the 64 live slots to replace and with what size (512 B - 4 MiB,
// log-uniform). Drawn once from a fixed seed so every run and thread count sees the same mix.
struct MixedPattern {
  std::vector<std::size_t> sizes;
  std::vector<std::uint32_t> slots;
  explicit MixedPattern(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> exponent(9.0, 22.0);  // 2^9 .. 2^22 bytes
    std::uniform_int_distribution<std::uint32_t> slot(0, kLiveBlocks - 1);
    for (std::size_t i = 0; i < kPatternLength; ++i) {
      sizes.push_back(static_cast<std::size_t>(std::exp2(exponent(rng))));
      slots.push_back(slot(rng));
    }
  }
};

void FixedSize(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  Rig rig(state.range(1) != 0, state.range(2) != 0);
  rig.allocator.deallocate(rig.allocator.allocate(bytes, 0));  // warm: the block is cached
  for (auto _ : state) {
    DevicePtr ptr = rig.allocator.allocate(bytes, 0);
    benchmark::DoNotOptimize(ptr);  // non-const: the const-ref overload is deprecated
    rig.allocator.deallocate(ptr);
  }
  state.SetItemsProcessed(state.iterations());
}

// The same set as the GPU benchmark's counter (the ledger's maps, unmaps, device allocations
// and frees), so the two calls_per_kpair columns compare.
std::uint64_t page_calls(const SimulatedDevice& device) {
  return device.call_count(SimOp::kMapPages) + device.call_count(SimOp::kUnmapPages) +
         device.call_count(SimOp::kCreatePhysical) + device.call_count(SimOp::kReleasePhysical) +
         device.call_count(SimOp::kAllocateSegment) + device.call_count(SimOp::kFreeSegment);
}

// One iteration frees one of this thread's 64 live blocks and allocates its replacement.
void run_mixed(benchmark::State& state, Rig& rig, bool shared_stream = false) {
  const auto thread = static_cast<std::size_t>(state.thread_index());
  const MixedPattern pattern(0x5eed + thread);
  const StreamHandle stream = shared_stream ? rig.streams[0] : rig.streams[thread % kMaxThreads];
  std::array<DevicePtr, kLiveBlocks> live{};
  for (std::size_t i = 0; i < kLiveBlocks; ++i) {
    live[i] = rig.allocator.allocate(pattern.sizes[i], stream);
  }
  // Replaces the live block in the pattern's slot k by its allocation k.
  const auto replace = [&](std::size_t k) {
    const std::uint32_t slot = pattern.slots[k];
    rig.allocator.deallocate(live[slot]);
    live[slot] = rig.allocator.allocate(pattern.sizes[k], stream);
  };
  // One untimed pass over the pattern first, as the GPU benchmark's ring does: the steady
  // state, not the growth of a stream the case is the first to use.
  for (std::size_t k = 0; k < kPatternLength; ++k) replace(k);
  std::size_t k = 0;
  // How the ledger's shards counted the run (per-stream shards, front caches): the share of
  // their events that took the ledger's slow path. Read by thread 0 around its loop (a read folds
  // every shard: not inside the timed loop).
  const Ledger::ShardTally before = thread == 0 ? rig.ledger.shard_tally() : Ledger::ShardTally{};
  // And the driver calls the run made (maps, unmaps, creates: ~20-35 us each on the H200, so a
  // rate the simulated device hides), per thousand pairs of all threads.
  const std::uint64_t calls_before = thread == 0 ? page_calls(rig.device) : 0;
  const BlockCensus census_before = thread == 0 ? rig.allocator.census() : BlockCensus{};
  for (auto _ : state) {
    replace(k);
    k = (k + 1) & (kPatternLength - 1);
  }
  if (thread == 0) {
    const Ledger::ShardTally after = rig.ledger.shard_tally();
    const auto fast = static_cast<double>(after.fast - before.fast);
    const auto slow = static_cast<double>(after.slow - before.slow);
    state.counters["shard_slow"] = fast + slow > 0 ? slow / (fast + slow) : 0.0;
    const auto pairs = static_cast<double>(state.iterations()) * state.threads();
    state.counters["calls_per_kpair"] =
        1000.0 * static_cast<double>(page_calls(rig.device) - calls_before) / pairs;
    // Lanes given during the run (docs/design.md 4): more than a few means threads pass from
    // lane to lane.
    const BlockCensus census_after = rig.allocator.census();
    state.counters["lane_choices"] =
        static_cast<double>(census_after.lane_choices - census_before.lane_choices);
    // Allocations the stream path left to the allocator's lock, per thousand pairs: each one
    // stops every thread meanwhile.
    state.counters["locked_per_kpair"] =
        1000.0 *
        static_cast<double>(census_after.locked_allocations - census_before.locked_allocations) /
        pairs;
  }
  for (DevicePtr ptr : live) rig.allocator.deallocate(ptr);
  state.SetItemsProcessed(state.iterations());
}

void Mixed(benchmark::State& state) {
  Rig rig(state.range(0) != 0, state.range(1) != 0);
  run_mixed(state, rig);
}

// Threads share one allocator. The rig outlives the runs so every thread count starts from the
// same warm cache.
Rig& shared_rig(bool paged, bool front) {
  static Rig rigs[2][2] = {{Rig(false, false), Rig(false, true)}, {Rig(true, false), Rig(true, true)}};
  return rigs[paged ? 1 : 0][front ? 1 : 0];
}

void MixedThreads(benchmark::State& state) {
  run_mixed(state, shared_rig(state.range(0) != 0, state.range(1) != 0), state.range(2) != 0);
}

// The mixed ring on own streams without the ledger: how far the policy alone scales (the
// per-stream locks, docs/design.md 4), apart from the ledger's lock.
void MixedThreadsNoLedger(benchmark::State& state) {
  static Rig rigs[2] = {Rig(false, false, false), Rig(true, false, false)};
  run_mixed(state, rigs[state.range(0) != 0 ? 1 : 0]);
}

// The paged heap's mixed ring on own streams with cross_stream_cold_allocs:0 (the default
// before 2026-12-02; docs/configuration.md): streams trade idle pages beyond the slack at once.
void MixedThreadsTradePages(benchmark::State& state) {
  static Rig rig(true, false, true, 0);
  run_mixed(state, rig);
}

// The mixed ring of N streams taken in turn by one thread, one replacement each: the order of
// events N threads running truly at once give (each stream moves a step while the others move
// one), with no scheduler between them. On the VM's 2 cores, 8 or 16 threads run in time
// slices of thousands of operations, so the escrows that share headroom between streams (the
// ledger's credit, the paged heap's active-bytes rooms) see far less interleaving than on the
// H200's cores: 0.2-0.3 exact-path events per thousand pairs here against 2-3 there. Its
// counters are the figures to read; its time is one thread's.
void MixedStreamsInTurn(benchmark::State& state) {
  const auto streams = static_cast<std::size_t>(state.range(1));
  Rig rig(state.range(0) != 0);
  std::vector<MixedPattern> patterns;
  std::vector<std::array<DevicePtr, kLiveBlocks>> live(streams);
  for (std::size_t s = 0; s < streams; ++s) {
    patterns.emplace_back(0x5eed + s);
    for (std::size_t i = 0; i < kLiveBlocks; ++i) {
      live[s][i] = rig.allocator.allocate(patterns[s].sizes[i], rig.streams[s]);
    }
  }
  const auto replace = [&](std::size_t s, std::size_t k) {
    const std::uint32_t slot = patterns[s].slots[k];
    rig.allocator.deallocate(live[s][slot]);
    live[s][slot] = rig.allocator.allocate(patterns[s].sizes[k], rig.streams[s]);
  };
  for (std::size_t k = 0; k < kPatternLength; ++k) {  // the steady state, as run_mixed
    for (std::size_t s = 0; s < streams; ++s) replace(s, k);
  }
  const Ledger::ShardTally before = rig.ledger.shard_tally();
  const std::int64_t locked_before = rig.allocator.policy_figures().locked_allocations;
  const std::int64_t calls_before = rig.ledger.counters().driver_calls();
  std::size_t k = 0;
  for (auto _ : state) {
    for (std::size_t s = 0; s < streams; ++s) replace(s, k);
    k = (k + 1) & (kPatternLength - 1);
  }
  const auto pairs = static_cast<double>(state.iterations() * streams);
  const Ledger::ShardTally after = rig.ledger.shard_tally();
  state.counters["exact_per_kpair"] = 1000.0 * static_cast<double>(after.slow - before.slow) / pairs;
  state.counters["gathered_per_kpair"] =
      1000.0 * static_cast<double>(after.gathered - before.gathered) / pairs;
  state.counters["locked_per_kpair"] =
      1000.0 *
      static_cast<double>(rig.allocator.policy_figures().locked_allocations - locked_before) /
      pairs;
  state.counters["calls_per_kpair"] =
      1000.0 * static_cast<double>(rig.ledger.counters().driver_calls() - calls_before) / pairs;
  for (std::size_t s = 0; s < streams; ++s) {
    for (DevicePtr ptr : live[s]) rig.allocator.deallocate(ptr);
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(streams));
}

// Warm pairs of one size per thread (512 B, 64 KiB: the sizes a training step repeats).
void PairThreads(benchmark::State& state) {
  const auto thread = static_cast<std::size_t>(state.thread_index());
  Rig& rig = shared_rig(state.range(0) != 0, state.range(1) != 0);
  const StreamHandle stream = state.range(2) != 0 ? rig.streams[0] : rig.streams[thread];
  const auto bytes = static_cast<std::size_t>(state.range(3));
  rig.allocator.deallocate(rig.allocator.allocate(bytes, stream));
  for (auto _ : state) {
    DevicePtr ptr = rig.allocator.allocate(bytes, stream);
    benchmark::DoNotOptimize(ptr);
    rig.allocator.deallocate(ptr);
  }
  state.SetItemsProcessed(state.iterations());
}

constexpr std::int64_t kKiB = 1 << 10;
constexpr std::int64_t kMiB = 1 << 20;

BENCHMARK(FixedSize)
    ->ArgNames({"bytes", "paged", "front"})
    ->ArgsProduct({{512, 64 * kKiB, kMiB, 16 * kMiB, 256 * kMiB}, {1, 0}, {0, 1}});
BENCHMARK(Mixed)->ArgNames({"paged", "front"})->ArgsProduct({{1, 0}, {0, 1}});
BENCHMARK(MixedThreads)
    ->ArgNames({"paged", "front", "shared"})
    ->ArgsProduct({{1, 0}, {0, 1}, {0, 1}})
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->Threads(8)
    ->Threads(16)
    ->UseRealTime();
BENCHMARK(MixedThreadsTradePages)->Threads(1)->Threads(2)->Threads(4)->Threads(8)->Threads(16)
    ->UseRealTime();
BENCHMARK(MixedThreadsNoLedger)
    ->ArgNames({"paged"})
    ->ArgsProduct({{1, 0}})
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->Threads(8)
    ->Threads(16)
    ->UseRealTime();
BENCHMARK(MixedStreamsInTurn)->ArgNames({"paged", "streams"})->ArgsProduct({{1, 0}, {2, 4, 8, 16}});
BENCHMARK(PairThreads)
    ->ArgNames({"paged", "front", "shared", "bytes"})
    ->ArgsProduct({{1, 0}, {0, 1}, {0, 1}, {512, 64 * kKiB}})
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->Threads(8)
    ->Threads(16)
    ->UseRealTime();

}  // namespace
}  // namespace vramledger

BENCHMARK_MAIN();
