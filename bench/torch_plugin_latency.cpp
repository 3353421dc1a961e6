// Host-side latency of one allocate + free pair through the torch plugin (VramledgerAllocator:
// torch's CUDAAllocator entry points malloc / free_block) on the simulated device, the same
// sizes as allocator_latency's FixedSize: the difference between the two, taken in one run on one
// machine, is what the plugin adds to the policy and the ledger (its pointer registry, pools,
// torch's statistics). The simulated device offers virtual memory, so the plugin uses the paged
// heap there: compare with FixedSize/.../paged:1/front:0.
//
//   build-torch/torch_plugin/vramledger-bench-torch-plugin --benchmark_format=json
#include <benchmark/benchmark.h>

#include <cstddef>

#include "tests/torch/simulated_plugin.hpp"
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

constexpr std::int64_t kKiB = 1 << 10;
constexpr std::int64_t kMiB = 1 << 20;

BENCHMARK(PluginFixedSize)->ArgNames({"bytes"})->Arg(512)->Arg(64 * kKiB)->Arg(kMiB)
    ->Arg(16 * kMiB)->Arg(256 * kMiB);

}  // namespace
}  // namespace vramledger::torch_plugin

BENCHMARK_MAIN();
