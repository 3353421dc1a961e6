// Replays every trace of the recorded corpus (bench/traces/corpus, real models on the H200) on
// the simulated device and holds the policy to its measured figures: the paged heap within 2% of
// peak requested, the segment heap within one large segment of what PyTorch itself reserved in
// the recorded run, and the ledger consistent with a recount after each replay.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "bench/replay/replayer.hpp"
#include "bench/replay/simulated_gpu_lag.hpp"
#include "bench/replay/workload_trace.hpp"

namespace vramledger {
namespace {

// Under the sanitizers (a third of CI's time goes to building and testing them) the replays run
// at one lag, which takes the lagging GPU's paths (fences, aliasing, adoption), and the release
// build's run holds the call guard and the other lags.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// Every trace of the corpus; under the sanitizers, all but the three largest single-stream ones
// (gpt2_generate, gpt2_train.e2e, t5_train.e2e: 57% of the corpus's bytes, and the paths they take
// are taken by gpt2_train, t5_train and the others), which kept the ASan build's corpus_replay
// at 116 s, the longest test of CI's test command (712 s of its 720 at 5bf10c3). The release
// build replays all of them.
std::vector<std::string> corpus_traces() {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(VRAMLEDGER_CORPUS_DIR)) {
    const std::string path = entry.path().string();
    if (!path.ends_with(".vlt.gz")) continue;
    const std::string name = entry.path().filename().string();
    if (kSanitized && (name == "gpt2_generate.vlt.gz" || name == "gpt2_train.e2e.vlt.gz" ||
                       name == "t5_train.e2e.vlt.gz")) {
      continue;
    }
    paths.push_back(path);
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// Replays `trace` under `options` on a simulated H200-sized device that allows aliased mappings
// only with `allow_aliasing`. gpu_lag_ops: 0 = the device completes work at once; N =
// SimulatedGpuLag.
ReplayResult replay_with(const WorkloadTrace& trace, const AllocatorOptions& options,
                         bool allow_aliasing, ConsistencyReport* consistency,
                         std::size_t gpu_lag_ops) {
  SimulatedDeviceOptions device_options;
  device_options.capacity_bytes = std::size_t{140} << 30;
  device_options.allow_aliased_mappings = allow_aliasing;
  SimulatedDevice device(device_options);
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, options);
  std::vector<StreamHandle> streams{0};
  while (streams.size() < trace.stream_handles.size()) streams.push_back(device.create_stream());
  auto lag = gpu_lag_ops > 0 ? std::make_unique<SimulatedGpuLag>(device, streams, gpu_lag_ops)
                             : nullptr;
  ReplayResult result = replay_workload(
      trace, allocator, ledger, [&](std::uint32_t k) { return streams.at(k); },
      after_each_operation([&] {
        if (lag) lag->after_operation();
      }));
  lag.reset();
  *consistency = check_consistency(ledger, allocator.census());
  return result;
}

ReplayResult replay(const WorkloadTrace& trace, bool paged, ConsistencyReport* consistency,
                    std::size_t gpu_lag_ops = 0, bool alias_pending_pages = false) {
  AllocatorOptions options;
  options.use_paged_heap = paged;
  options.alias_pending_pages = alias_pending_pages;
  return replay_with(trace, options, alias_pending_pages, consistency, gpu_lag_ops);
}

TEST(CorpusReplay, CorpusIsThere) { EXPECT_GE(corpus_traces().size(), 6u); }

// Under the sanitizers this lag-0 replay is left to the release build: the default
// configuration's replay below takes the same heap through the lagging GPU's paths too.
TEST(CorpusReplay, PagedHeapStaysWithinTwoPercentOfPeakRequested) {
  if (kSanitized) GTEST_SKIP() << "the release build replays the corpus at lag 0";
  for (const std::string& path : corpus_traces()) {
    SCOPED_TRACE(path);
    const WorkloadTrace trace = read_workload_trace(path);
    ConsistencyReport consistency;
    const ReplayResult result = replay(trace, /*paged=*/true, &consistency);
    EXPECT_TRUE(consistency.ok()) << consistency.to_string();
    EXPECT_EQ(result.out_of_memory, 0u);
    EXPECT_EQ(static_cast<std::size_t>(result.peak_requested_bytes), trace.peak_requested_bytes);
    EXPECT_LE(result.overhead_ratio, 1.02);
  }
}

// The lag model holds work back: queued items complete only in batches of `lag_ops` operations.
TEST(SimulatedGpuLag, CompletesQueuedWorkInBatches) {
  SimulatedDevice device{SimulatedDeviceOptions{}};
  const StreamHandle side = device.create_stream();
  SimulatedGpuLag lag(device, {0, side}, 3);
  const EventHandle main_work = device.enqueue_user_work(0);
  const EventHandle side_work = device.enqueue_user_work(side);
  lag.after_operation();
  lag.after_operation();
  EXPECT_FALSE(device.user_work_done(main_work));
  EXPECT_FALSE(device.user_work_done(side_work));
  lag.after_operation();
  EXPECT_TRUE(device.user_work_done(main_work));
  EXPECT_TRUE(device.user_work_done(side_work));
  EXPECT_EQ(lag.batches_completed(), 1u);
  const EventHandle later = device.enqueue_user_work(0);
  EXPECT_FALSE(device.user_work_done(later)) << "paused again after the batch";
}

// With a GPU behind the CPU, freed pages wait for their fence and the paged heap grows instead:
// the replay then reaches what the H200 measured on real training (docs/configuration.md), and
// the books still balance.
TEST(CorpusReplay, LaggingGpuMakesThePagedHeapGrowAndStaysConsistent) {
  for (const std::string& path : corpus_traces()) {
    if (path.find("llama_train") == std::string::npos) continue;
    const WorkloadTrace trace = read_workload_trace(path);
    ConsistencyReport consistency;
    const ReplayResult prompt = replay(trace, /*paged=*/true, &consistency);
    const ReplayResult lagging = replay(trace, /*paged=*/true, &consistency, /*gpu_lag_ops=*/100);
    EXPECT_TRUE(consistency.ok()) << consistency.to_string();
    EXPECT_EQ(lagging.out_of_memory, 0u);
    EXPECT_GT(lagging.overhead_ratio, prompt.overhead_ratio + 0.03)
        << "pages freed while the GPU lags must not be moved before their fence";
    EXPECT_LT(lagging.unmaps, prompt.unmaps);
  }
}

// alias_pending_pages under the same lag: a stream's own pages whose work is still queued serve
// new addresses, and every single-stream trace stays within 2.5% of peak requested (without
// aliasing: up to 7.8%; bench/results/2026-12-01-replay-gpu-lag.md).
TEST(CorpusReplay, AliasingKeepsThePagedHeapNearPeakUnderALaggingGpu) {
  for (const std::string& path : corpus_traces()) {
    SCOPED_TRACE(path);
    const WorkloadTrace trace = read_workload_trace(path);
    ConsistencyReport consistency;
    const ReplayResult aliasing = replay(trace, true, &consistency, 100, /*alias=*/true);
    EXPECT_TRUE(consistency.ok()) << consistency.to_string();
    EXPECT_EQ(aliasing.out_of_memory, 0u);
    EXPECT_EQ(static_cast<std::size_t>(aliasing.peak_requested_bytes), trace.peak_requested_bytes);
    // The comparison with the same replay without aliasing is a figure, not a memory-safety
    // check: the sanitized builds leave that replay (half this test's time) to the release build.
    if (!kSanitized) {
      const ReplayResult lagging = replay(trace, true, &consistency, 100);
      EXPECT_TRUE(consistency.ok()) << consistency.to_string();
      EXPECT_LE(aliasing.overhead_ratio, lagging.overhead_ratio);
    }
    if (trace.stream_handles.size() == 1) {
      EXPECT_LE(aliasing.overhead_ratio, 1.025);
    }
  }
}

// Issue 14's regression guard: the default configuration (stream-ordered reuse: aliasing of
// pending pages, adoption of cross-stream frees) keeps every trace within 2% of peak requested
// however far the GPU lags — from none to far beyond what the H200 shows. gpt2_generate is a
// 446 MB trace, where one 2 MiB page is 0.47%: it reaches 1.0290 at lag 30 (two pages above
// 2%) and is held to 3% (bench/results/2026-12-01-replay-gpu-lag-stream-ordered.md).
//
// The same replays also guard the driver calls made while reserved memory is not growing (creates,
// maps and unmaps of operations that did not raise peak reserved: the replay tool's `steady`).
// They are what the steps pay for on the GPU: the replay of compare_allocators' ViT makes ~57 per
// step, as the H200 run did (58-67), and those steps ran 1.14x native's time
// (bench/results/2026-12-02-replay-peak-step-moves.md). Each trace's sum over the four lags is
// held to 1.3x its figure at d2e77bb (bench/results/2026-12-02-replay-steady-calls-guard.md): a
// placement change that moves more pages must say so by raising the ceiling here. Raised at
// 07bdbf1 for gpt2_train, gpt2_train.e2e and t5_train (to 1.3x their new figures): a placement no
// longer makes the thread wait for the GPU when some fit does not, which costs those traces more
// moves on the replay and saved ViT's peak steps 10-15 ms each on the H200, where every such
// wait drained the GPU's queue (bench/results/torch/2026-12-03-host-waits-vit.md).
std::uint64_t steady_call_ceiling(const std::string& path) {
  static const std::map<std::string, std::uint64_t> kCeilings{
      {"gpt2_generate", 2060},
      {"gpt2_train", 800},       // 616 since 07bdbf1 (no placement waits for the GPU)
      {"gpt2_train.e2e", 4680},  // 3,597 since 07bdbf1
      {"llama_train", 3030},
      {"llama_train.e2e", 9990},
      {"resnet50_train", 550},
      {"segmentation_train", 1140},
      {"t5_train", 2110},        // 1,620 since 07bdbf1
      {"t5_train.e2e", 1570},
      {"two_stream", 14490},
      {"two_stream_train.e2e", 2230},
      {"vit_train", 5990},
      {"vit_train.e2e", 16530},
  };
  const std::string name = std::filesystem::path(path).filename().string();
  const auto found = kCeilings.find(name.substr(0, name.size() - std::string(".vlt.gz").size()));
  return found == kCeilings.end() ? 0 : found->second;
}

TEST(CorpusReplay, DefaultConfigurationStaysWithinTwoPercentAtEveryLag) {
  const std::vector<std::size_t> lags =
      kSanitized ? std::vector<std::size_t>{100} : std::vector<std::size_t>{0, 30, 100, 1000};
  for (const std::string& path : corpus_traces()) {
    const WorkloadTrace trace = read_workload_trace(path);
    const double limit = path.find("gpt2_generate") != std::string::npos ? 1.03 : 1.02;
    std::uint64_t steady_calls = 0;
    for (std::size_t lag : lags) {
      SCOPED_TRACE(path + " at --gpu-lag-ops " + std::to_string(lag));
      ConsistencyReport consistency;
      const ReplayResult result =
          replay_with(trace, AllocatorOptions{}, /*allow_aliasing=*/true, &consistency, lag);
      EXPECT_TRUE(consistency.ok()) << consistency.to_string();
      EXPECT_EQ(result.out_of_memory, 0u);
      EXPECT_EQ(static_cast<std::size_t>(result.peak_requested_bytes), trace.peak_requested_bytes);
      EXPECT_LE(result.overhead_ratio, limit);
      steady_calls += result.steady_device_allocations + result.steady_maps + result.steady_unmaps;
    }
    if (kSanitized) continue;
    const std::uint64_t ceiling = steady_call_ceiling(path);
    std::printf("%s: steady driver calls over lags 0, 30, 100, 1000: %llu (ceiling %llu)\n",
                path.c_str(), static_cast<unsigned long long>(steady_calls),
                static_cast<unsigned long long>(ceiling));
    EXPECT_GT(ceiling, 0u) << path << " has no steady-call ceiling: replay it and add one";
    EXPECT_LE(steady_calls, ceiling) << path;
  }
}

// Front caches (front_cache_mb) park freed blocks per thread; parked blocks go back to their
// heap before it grows for their stream (detail/paged_heap.cpp), so a large cache keeps the
// default's packing: before that, front_cache_mb:1024 replayed gpt2_generate at 1.79 and the
// other traces at up to 1.09. What remains is placement: a hit reuses the same address where the
// heap's best fit might be tighter (gpt2_generate, 446 MB, 1.038-1.043 against 1.020-1.029;
// bench/results/2026-12-04-session-25-cpu.md).
TEST(CorpusReplay, LargeFrontCachesKeepTheDefaultsPacking) {
  AllocatorOptions options;
  options.front_cache_bytes = std::size_t{1024} << 20;
  for (const std::string& path : corpus_traces()) {
    SCOPED_TRACE(path + " with front_cache_mb:1024 at --gpu-lag-ops 100");
    const WorkloadTrace trace = read_workload_trace(path);
    ConsistencyReport consistency;
    const ReplayResult result =
        replay_with(trace, options, /*allow_aliasing=*/true, &consistency, 100);
    EXPECT_TRUE(consistency.ok()) << consistency.to_string();
    EXPECT_EQ(result.out_of_memory, 0u);
    EXPECT_LE(result.overhead_ratio, path.find("gpt2_generate") != std::string::npos ? 1.05 : 1.02);
  }
}

TEST(CorpusReplay, SegmentHeapReservesWhatPyTorchReserved) {
  constexpr double kOneLargeSegment = 20.0 * (1 << 20);
  for (const std::string& path : corpus_traces()) {
    SCOPED_TRACE(path);
    // Left out: vit_train.e2e (compare_allocators' ViT, recorded 2026-12-02), where the segment
    // heap reserves 13,472,104,448 B and torch 13,216,251,904 B (+244 MiB). Not a bug in the
    // heap's rules (segment sizes, split thresholds) but in what a replay can know: torch takes
    // the smallest free block that fits and, among equal sizes, the lowest real address
    // (cudaMalloc's, not in the trace); the segment heap takes a good fit from its size-class
    // index (within ~3%). Replayed with an exact best fit instead, ties to the lowest simulated
    // address: +94 MiB; ties to the highest (the newest segment): exact, and so are t5_train,
    // segmentation_train and gpt2_train (±2 MiB today), but llama_train.e2e falls from exact to
    // -52 MiB and gpt2_train.e2e to +2 MiB. The figure turns on tie-breaks among equal-sized
    // free blocks that only the recorded addresses decide
    // (bench/results/2026-12-02-replay-placement-candidates.md).
    if (path.find("vit_train.e2e") != std::string::npos) continue;
    const WorkloadTrace trace = read_workload_trace(path);
    ASSERT_TRUE(trace.metadata.contains("torch_peak_reserved_bytes"));
    const double torch_reserved = std::stod(trace.metadata.at("torch_peak_reserved_bytes"));
    ConsistencyReport consistency;
    const ReplayResult result = replay(trace, /*paged=*/false, &consistency);
    EXPECT_TRUE(consistency.ok()) << consistency.to_string();
    EXPECT_NEAR(static_cast<double>(result.peak_reserved_bytes), torch_reserved, kOneLargeSegment);
  }
}

}  // namespace
}  // namespace vramledger
