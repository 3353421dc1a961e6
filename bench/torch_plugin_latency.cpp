// Host-side latency of one allocate + free pair through the torch plugin (VramledgerAllocator:
// torch's CUDAAllocator entry points malloc / free_block) on the simulated device, the same
// sizes as allocator_latency's FixedSize: the difference between the two, taken in one run on one
// machine, is what the plugin adds to the policy and the ledger (its pointer registry, pools,
// torch's statistics). The simulated device offers virtual memory, so the plugin uses the paged
// heap there: compare with FixedSize/.../paged:1/front:0.
//
// PluginThreads: the same pair (512 B) from N threads, each on a stream of its own, pairs per
// second of all threads together: the default pool's per-stream fast path and, with
// VRAMLEDGER_SIMULATED_PLUGIN_CONF=front_cache_mb:64, its front caches, both counting through
// the ledger's shards (torch_plugin/event_gate.hpp).
//
//   build-torch/torch_plugin/vramledger-bench-torch-plugin --benchmark_format=json
#include <benchmark/benchmark.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include "allocator/simulated/simulated_device.hpp"
#include "tests/torch/simulated_plugin.hpp"
#include "torch_plugin/device_allocators.hpp"
#include "torch_plugin/vramledger_allocator.hpp"

namespace vramledger::torch_plugin {
namespace {

void PluginFixedSize(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  VramledgerAllocator& allocator = plugin();
  allocator.free_block(allocator.malloc(bytes, 0, nullptr));  // warm: the block is cached
  for (auto _ : state) {
    void* ptr = allocator.malloc(bytes, 0, nullptr);
    benchmark::DoNotOptimize(ptr);
    allocator.free_block(ptr);
  }
  state.SetItemsProcessed(state.iterations());
}

// Streams of the simulated device, made once (streams[0..15]; a function-local static: the
// benchmark's threads may ask at once).
const std::vector<cudaStream_t>& bench_streams() {
  static const std::vector<cudaStream_t> streams = [] {
    auto& device = dynamic_cast<SimulatedDevice&>(plugin().device_state(0).backend());
    std::vector<cudaStream_t> made;
    for (int i = 0; i < 16; ++i) {
      made.push_back(reinterpret_cast<cudaStream_t>(device.create_stream()));
    }
    return made;
  }();
  return streams;
}

void PluginThreads(benchmark::State& state) {
  VramledgerAllocator& allocator = plugin();
  const cudaStream_t stream = bench_streams()[static_cast<std::size_t>(state.thread_index())];
  allocator.free_block(allocator.malloc(512, 0, stream));  // warm: asked for before
  allocator.free_block(allocator.malloc(512, 0, stream));
  for (auto _ : state) {
    void* ptr = allocator.malloc(512, 0, stream);
    benchmark::DoNotOptimize(ptr);
    allocator.free_block(ptr);
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(PluginThreads)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

// PluginHandOff: thread 0 allocates (64 KiB, its own stream), thread 1 frees what it made,
// through a ring of 256 pointers: the pattern of autograd, whose backward thread frees the
// forward thread's activations. With front caches the freeing thread meets blocks another
// thread's cache manages (docs/design.md 5.1). Wall time per block, both threads together.
void PluginHandOff(benchmark::State& state) {
  VramledgerAllocator& allocator = plugin();
  constexpr std::size_t kRing = 256;
  static std::array<std::atomic<void*>, kRing> ring{};
  static std::atomic<std::uint64_t> produced{0};
  static std::atomic<std::uint64_t> consumed{0};
  const cudaStream_t stream = bench_streams()[0];
  if (state.thread_index() == 0) {
    produced.store(0);
    consumed.store(0);
  }
  std::uint64_t mine = 0;
  for (auto _ : state) {
    if (state.thread_index() == 0) {
      while (produced.load(std::memory_order_relaxed) - consumed.load(std::memory_order_acquire) >=
             kRing) {
        std::this_thread::yield();
      }
      const std::uint64_t at = produced.load(std::memory_order_relaxed);
      ring[at % kRing].store(allocator.malloc(64 << 10, 0, stream), std::memory_order_relaxed);
      produced.store(at + 1, std::memory_order_release);
    } else {
      while (produced.load(std::memory_order_acquire) <= mine) std::this_thread::yield();
      allocator.free_block(ring[mine % kRing].load(std::memory_order_relaxed));
      consumed.store(++mine, std::memory_order_release);
    }
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(PluginHandOff)->Threads(2)->UseRealTime();

constexpr std::int64_t kKiB = 1 << 10;
constexpr std::int64_t kMiB = 1 << 20;

BENCHMARK(PluginFixedSize)->ArgNames({"bytes"})->Arg(512)->Arg(64 * kKiB)->Arg(kMiB)
    ->Arg(16 * kMiB)->Arg(256 * kMiB);

}  // namespace
}  // namespace vramledger::torch_plugin

BENCHMARK_MAIN();
