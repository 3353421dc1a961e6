// vramledger-bench-gpu-latency: host-side latency of one allocate + free pair on GPU 0, for every
// allocator in one run, so ratios come from the same machine, driver and minute:
//
//   vramledger-<backend>  CachingAllocator + ledger over vmm (paged heap), cuda_malloc,
//                         malloc_async (configured as the plugin is: "backend:<name>");
//                         vramledger-<backend>-front: the same with per-thread front caches
//                         ("backend:<name>,front_cache_mb:1024", docs/design.md 5)
//   cudaMalloc            cudaMalloc + cudaFree
//   cudaMallocAsync       cudaMallocAsync + cudaFreeAsync, default pool, release threshold max
//   rmm-pool, rmm-arena   RAPIDS RMM's pool_memory_resource / arena_memory_resource over
//                         cuda_memory_resource (when built with RMM: scripts/fetch_rmm.sh);
//                         rmm-arena has no growth case (its arena is taken whole when built)
//   torch-native          torch's caching allocator, raw_alloc_with_stream / raw_delete (when
//                         built against torch); torch-expandable: the same, growth only, under
//                         expandable_segments:True
//
// Benchmarks (names a script can split on '/'; Google Benchmark appends /min_time:..,
// /iterations:.., /real_time and /threads:N):
//   BM_Pair/<allocator>/<size>      warm: the size is already cached (512B .. 256MiB)
//   BM_Mixed/<allocator>/threads:N  a ring of 64 live blocks per thread, log-uniform 512 B - 4 MiB
//                                   from a fixed seed; each iteration frees the oldest and
//                                   allocates the next; each thread on its own stream. Time is
//                                   wall time over all threads' operations (per-thread latency is
//                                   that times N); items_per_second is the aggregate rate.
//   BM_MixedShared/<allocator>/threads:N  the same ring, every thread on one shared stream
//   BM_PairThreads/<allocator>/<size>/<own|shared>/threads:N  warm pairs of one size (512B,
//                                   64KiB) per thread, on its own stream or all on one stream;
//                                   items_per_second is the aggregate pair rate
//   BM_Streams/<allocator>/4        the mixed ring on one thread, allocations round-robin over 4
//                                   streams (a block is freed on the stream it was allocated on)
//   BM_Growth/<allocator>/<size>    first allocation of 1 GiB / 8 GiB from a cold allocator, plus
//                                   freeing it and returning the memory to the driver; counter
//                                   alloc_ms is the allocate call alone
//   BM_Trace/<allocator>/<trace>    (with --trace=PATH, repeatable) a recorded program's own
//                                   allocations and frees, one pass of its steps per iteration
//                                   around its never-freed blocks, after two untimed passes
//                                   (trace_case.hpp); counters ns_per_op, calls_per_kop, and
//                                   items_per_second in operations; not for cudaMalloc
//
//   vramledger-bench-gpu-latency [--quick] [--trace=PATH ...] [Google Benchmark flags, e.g.
//       --benchmark_out=gpu_latency.json --benchmark_out_format=json]
//   vramledger-bench-gpu-latency --simulated[-capacity-gib=N] [--quick] [...]
//
// --quick shortens every case (CI-sized figures). --simulated runs the same cases through the
// policy on the simulated device (allocators simulated-paged / simulated-segment): a CPU check of
// this program, never GPU figures. Without a usable GPU (and without --simulated) it prints why
// and exits 0. Exit status 1 when a case failed or a ledger disagrees with its allocator's census
// afterwards; 2 for a bad command line. bench/gpu_latency/pivot.py turns the JSON into a table
// and a chart.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "allocator/cuda/cuda_backend_factory.hpp"
#include "allocator/errors.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "bench/gpu_latency/peers.hpp"
#include "bench/gpu_latency/trace_case.hpp"
#include "bench/replay/simulated_gpu_lag.hpp"
#ifdef VRAMLEDGER_BENCH_WITH_TORCH
#include "bench/gpu_latency/torch_native_peer.hpp"
#endif
#ifdef VRAMLEDGER_BENCH_WITH_RMM
#include "bench/gpu_latency/rmm_peer.hpp"
#endif

namespace vramledger::gpu_latency {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

constexpr std::size_t kLiveBlocks = 64;
constexpr std::size_t kPatternLength = 4096;  // a power of two: indices wrap with a mask
constexpr int kMaxThreads = 16;
constexpr std::size_t kRoundRobinStreams = 4;
constexpr std::array<int, 5> kThreadCounts = {1, 2, 4, 8, 16};

// Growth runs on the legacy default stream (torch's default), which every backend accepts, the
// simulated dry run's fresh devices included.
const cudaStream_t kGrowthStream = nullptr;

struct SizeCase {
  std::size_t bytes;
  const char* label;
};
constexpr std::array<SizeCase, 5> kPairSizes = {{{512, "512B"},
                                                 {64 * kKiB, "64KiB"},
                                                 {kMiB, "1MiB"},
                                                 {16 * kMiB, "16MiB"},
                                                 {256 * kMiB, "256MiB"}}};
constexpr std::array<SizeCase, 2> kThreadPairSizes = {{{512, "512B"}, {64 * kKiB, "64KiB"}}};
constexpr std::array<SizeCase, 2> kGrowthSizes = {{{kGiB, "1GiB"}, {8 * kGiB, "8GiB"}}};

// How long each case runs. Cached allocators take ~0.1-1 us a pair; cudaMalloc ~65 us, so it
// gets a shorter minimum time (still hundreds of pairs) to keep the binary well under ~150 s.
struct RunLengths {
  double fast_min_time_s = 0.2;
  double cuda_malloc_min_time_s = 0.03;
  int growth_iterations = 4;
};

// The simulated dry run (--simulated): no CUDA call may be made.
bool g_simulated = false;
// --simulated-lag-ops=N: on the simulated device, BM_Trace's queued work completes once every N
// operations (bench/replay/simulated_gpu_lag.hpp), as a GPU running behind the CPU would; 0: at
// once. The other cases run without it.
SimulatedDevice* g_simulated_device = nullptr;
std::size_t g_simulated_lag_ops = 0;

// ------------------------------------------------------------------------------ failures

// Cases that failed, reported at the end and turned into exit status 1.
std::mutex g_failures_mutex;
std::map<std::string, std::string> g_failures;

std::string first_line(std::string_view text) {
  text = text.substr(0, text.find('\n'));
  return std::string(text.substr(0, 400));
}

// Marks the running benchmark failed; the caller must leave the timed loop (break) at once.
void fail(benchmark::State& state, const std::string& benchmark_name, const std::exception& error) {
  const std::string message = first_line(error.what());
  state.SkipWithError(message.c_str());
  std::lock_guard<std::mutex> lock(g_failures_mutex);
  g_failures.emplace(benchmark_name, message);
}

// ------------------------------------------------------------------------------ streams

// Streams made once: thread i of a case uses stream i, the round-robin case streams 0..3. Nothing
// is ever launched on them; they only order the stream-aware allocators. On the GPU they are
// non-blocking CUDA streams; in the simulated dry run, streams of the simulated device.
class Streams {
 public:
  using Create = std::function<cudaStream_t()>;
  using Destroy = std::function<void(cudaStream_t)>;
  Streams(const Create& create, Destroy destroy) : destroy_(std::move(destroy)) {
    try {
      for (cudaStream_t& stream : streams_) stream = create();
    } catch (...) {
      destroy_all();  // the destructor will not run
      throw;
    }
  }
  ~Streams() { destroy_all(); }
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  cudaStream_t at(std::size_t i) const { return streams_.at(i); }

  static std::unique_ptr<Streams> cuda() {
    return std::make_unique<Streams>(
        [] {
          cudaStream_t stream = nullptr;
          const cudaError_t error = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
          if (error != cudaSuccess) throw_cuda(error, "cudaStreamCreateWithFlags", 0);
          return stream;
        },
        [](cudaStream_t stream) {
          if (cudaStreamDestroy(stream) != cudaSuccess) (void)cudaGetLastError();
        });
  }
  static std::unique_ptr<Streams> simulated(SimulatedDevice& device) {
    return std::make_unique<Streams>(
        [&device] { return reinterpret_cast<cudaStream_t>(device.create_stream()); },
        [&device](cudaStream_t stream) {
          (void)device.destroy_stream(reinterpret_cast<StreamHandle>(stream));
        });
  }

 private:
  void destroy_all() {
    for (cudaStream_t& stream : streams_) {
      if (stream != nullptr) destroy_(stream);
      stream = nullptr;
    }
  }
  std::array<cudaStream_t, kMaxThreads> streams_{};
  Destroy destroy_;
};

// ------------------------------------------------------------------------------ the mixed ring

// Sizes log-uniform in [512 B, 4 MiB], drawn once per thread from a fixed seed, so every
// allocator and run sees the same sequence.
struct MixedPattern {
  std::vector<std::size_t> sizes;
  explicit MixedPattern(std::uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> exponent(9.0, 22.0);  // 2^9 .. 2^22 bytes
    sizes.reserve(kPatternLength);
    for (std::size_t i = 0; i < kPatternLength; ++i) {
      sizes.push_back(static_cast<std::size_t>(std::exp2(exponent(rng))));
    }
  }
};

const MixedPattern& mixed_pattern(int thread) {
  static const std::vector<MixedPattern> patterns = [] {
    std::vector<MixedPattern> made;
    for (int t = 0; t < kMaxThreads; ++t) made.emplace_back(0x5eed + static_cast<std::uint64_t>(t));
    return made;
  }();
  return patterns.at(static_cast<std::size_t>(thread));
}

struct LiveBlock {
  void* ptr = nullptr;
  std::size_t bytes = 0;  // deallocate's size (RMM needs it)
  cudaStream_t stream = nullptr;
};

// ------------------------------------------------------------------------------ case bodies

template <class Peer>
void pair_case(benchmark::State& state, const std::string& name, Peer& peer, std::size_t bytes,
               cudaStream_t stream) {
  try {
    peer.deallocate(peer.allocate(bytes, stream), bytes, stream);  // warm: the size is now cached
  } catch (const std::exception& error) {
    fail(state, name, error);
    return;
  }
  for (auto _ : state) {
    try {
      // No benchmark::DoNotOptimize(ptr): both calls are opaque to the compiler anyway, and
      // Google Benchmark 1.7's "+m,r" form handed deallocate a garbage pointer in a -O1 build.
      peer.deallocate(peer.allocate(bytes, stream), bytes, stream);
    } catch (const std::exception& error) {
      fail(state, name, error);
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

// The threads of a ring case's run that are past their untimed pass (or gave up before it).
// Thread 0 reads the allocator's counters once all are, so that the driver calls, locked
// allocations and exact-path events it reports are the timed loop's: read while the others
// still ran their pass, the 16-thread cases counted the growth of the streams they were the
// first to use. Reset before each run (Benchmark::Setup, one thread, before any starts).
std::atomic<int> g_ring_threads_ready{0};
void reset_ring_threads_ready(const benchmark::State&) { g_ring_threads_ready.store(0); }

// Counts this thread ready once: after its pass, or when it leaves before (a failure).
class RingReady {
 public:
  ~RingReady() { arrive(); }
  void arrive() {
    if (!arrived_) g_ring_threads_ready.fetch_add(1, std::memory_order_release);
    arrived_ = true;
  }
  static void wait_for_all(int threads) {
    while (g_ring_threads_ready.load(std::memory_order_acquire) < threads) {
      std::this_thread::yield();
    }
  }

 private:
  bool arrived_ = false;
};

// round_robin == 0: every block on this thread's own stream (on stream 0 when `shared`);
// otherwise allocation j goes to stream j % round_robin.
template <class Peer>
void ring_case(benchmark::State& state, const std::string& registered_name, Peer& peer,
               const Streams& streams, std::size_t round_robin, bool shared = false) {
  RingReady ready;
  // One registration runs at several thread counts: name failures by the run, as the JSON does.
  const std::string name = round_robin == 0
                               ? registered_name + "/threads:" + std::to_string(state.threads())
                               : registered_name;
  if (!g_simulated && cudaSetDevice(kDevice) != cudaSuccess) {  // new threads: make GPU 0 current
    fail(state, name, PeerError("cudaSetDevice(0) failed in a benchmark thread"));
    return;
  }
  const auto thread = static_cast<std::size_t>(state.thread_index());
  const std::vector<std::size_t>& sizes = mixed_pattern(state.thread_index()).sizes;
  const auto stream_for = [&](std::size_t j) {
    if (shared) return streams.at(0);
    return round_robin == 0 ? streams.at(thread) : streams.at(j % round_robin);
  };
  std::array<LiveBlock, kLiveBlocks> live{};
  const auto release_live = [&] {
    for (LiveBlock& block : live) {
      if (block.ptr == nullptr) continue;
      try {
        peer.deallocate(block.ptr, block.bytes, block.stream);
      } catch (const std::exception&) {
        // Already failing; the first error is the one reported.
      }
      block.ptr = nullptr;
    }
  };
  try {
    for (std::size_t i = 0; i < kLiveBlocks; ++i) {
      live[i].stream = stream_for(i);
      live[i].bytes = sizes[i];
      live[i].ptr = peer.allocate(live[i].bytes, live[i].stream);
    }
  } catch (const std::exception& error) {
    fail(state, name, error);
    release_live();
    return;
  }
  // Replaces the oldest live block by the pattern's next allocation (pair j of the ring).
  const auto replace = [&](std::size_t j) {
    LiveBlock& oldest = live[j % kLiveBlocks];
    peer.deallocate(oldest.ptr, oldest.bytes, oldest.stream);
    oldest.ptr = nullptr;
    oldest.stream = stream_for(j + kLiveBlocks);
    oldest.bytes = sizes[(j + kLiveBlocks) & (kPatternLength - 1)];
    oldest.ptr = peer.allocate(oldest.bytes, oldest.stream);
  };
  // One untimed pass over the whole pattern first: the ring measures the steady state, and a
  // stream this case is the first to use would otherwise grow its heap inside the timed loop
  // (the 16-thread cases' streams 8-15: 0.67 driver calls per kpair there against 0.04 at 8
  // threads, session 15). Growth has cases of its own (BM_Growth). Every peer gets the same pass.
  try {
    for (std::size_t j = 0; j < kPatternLength; ++j) replace(j);
  } catch (const std::exception& error) {
    fail(state, name, error);
    release_live();
    return;
  }
  ready.arrive();
  if (thread == 0 && state.threads() > 1) RingReady::wait_for_all(state.threads());
  // vramledger's driver calls per thousand pairs of all threads (each ~20-35 us on the H200,
  // under the allocator's lock): read by thread 0 around its loop, outside the timing, once
  // every thread is past its untimed pass (RingReady).
  std::int64_t calls_before = 0;
  std::int64_t lane_choices_before = 0;
  if constexpr (requires { peer.driver_calls(); }) {
    if (thread == 0) calls_before = peer.driver_calls();
  }
  if constexpr (requires { peer.lane_choices(); }) {
    if (thread == 0) lane_choices_before = peer.lane_choices();
  }
  std::int64_t slow_before = 0;
  std::int64_t held_before = 0;
  std::int64_t gathered_before = 0;
  PolicyFigures policy_before;
  if constexpr (requires { peer.policy_figures(); }) {
    if (thread == 0) {
      policy_before = peer.policy_figures();
      slow_before = peer.ledger_slow_events();
      held_before = peer.ledger_all_shards_held_ns();
      gathered_before = peer.ledger_gathered_events();
    }
  }
  const auto loop_start = std::chrono::steady_clock::now();
  std::size_t j = kPatternLength;
  for (auto _ : state) {
    try {
      replace(j);
    } catch (const std::exception& error) {
      fail(state, name, error);
      break;
    }
    ++j;
  }
  if constexpr (requires { peer.driver_calls(); }) {
    if (thread == 0) {
      const auto pairs = static_cast<double>(state.iterations()) * state.threads();
      state.counters["calls_per_kpair"] =
          1000.0 * static_cast<double>(peer.driver_calls() - calls_before) / pairs;
    }
  }
  // What the threads still share, per thousand pairs of all threads: allocations that took the
  // allocator's lock, and ledger events that took its exact path (every shard's mutex).
  if constexpr (requires { peer.policy_figures(); }) {
    if (thread == 0) {
      const auto pairs = static_cast<double>(state.iterations()) * state.threads();
      const PolicyFigures policy = peer.policy_figures();
      state.counters["locked_per_kpair"] =
          1000.0 *
          static_cast<double>(policy.locked_allocations - policy_before.locked_allocations) /
          pairs;
      state.counters["exact_per_kpair"] =
          1000.0 * static_cast<double>(peer.ledger_slow_events() - slow_before) / pairs;
      state.counters["gathered_per_kpair"] =
          1000.0 * static_cast<double>(peer.ledger_gathered_events() - gathered_before) / pairs;
      // Paged heap: locked allocations whose room for active bytes was short everywhere, and
      // the rises of the peak of active bytes (detail/active_bytes.cpp).
      state.counters["room_per_kpair"] =
          1000.0 * static_cast<double>(policy.room_shortfalls - policy_before.room_shortfalls) /
          pairs;
      state.counters["rises_per_kpair"] =
          1000.0 *
          static_cast<double>(policy.active_peak_rises - policy_before.active_peak_rises) / pairs;
      // The share of thread 0's loop during which every ledger shard was held (the exact path,
      // the allocator's own events): time no thread could count an event in its shard.
      const auto loop_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - loop_start)
                               .count();
      const auto share_of_loop = [loop_ns](std::int64_t ns) {
        return loop_ns > 0 ? 100.0 * static_cast<double>(ns) / static_cast<double>(loop_ns) : 0.0;
      };
      state.counters["all_held_pct"] =
          share_of_loop(peer.ledger_all_shards_held_ns() - held_before);
      // The same for the allocator's lock (every stream's lock with it).
      state.counters["streams_held_pct"] =
          share_of_loop(policy.streams_held_ns - policy_before.streams_held_ns);
    }
  }
  // Lanes given during the run (docs/design.md 4): a few when threads first contend; more means
  // threads pass from lane to lane.
  if constexpr (requires { peer.lane_choices(); }) {
    if (thread == 0) {
      state.counters["lane_choices"] =
          static_cast<double>(peer.lane_choices() - lane_choices_before);
    }
  }
  release_live();
  state.SetItemsProcessed(state.iterations());
}

// Warm pairs of one size on every thread: the front caches' case (a training step repeats its
// sizes), and the lock's and the ledger's when threads share them.
template <class Peer>
void pair_threads_case(benchmark::State& state, const std::string& registered_name, Peer& peer,
                       std::size_t bytes, const Streams& streams, bool shared) {
  const std::string name = registered_name + "/threads:" + std::to_string(state.threads());
  if (!g_simulated && cudaSetDevice(kDevice) != cudaSuccess) {
    fail(state, name, PeerError("cudaSetDevice(0) failed in a benchmark thread"));
    return;
  }
  const cudaStream_t stream =
      streams.at(shared ? 0 : static_cast<std::size_t>(state.thread_index()));
  try {
    peer.deallocate(peer.allocate(bytes, stream), bytes, stream);
  } catch (const std::exception& error) {
    fail(state, name, error);
    return;
  }
  for (auto _ : state) {
    try {
      peer.deallocate(peer.allocate(bytes, stream), bytes, stream);
    } catch (const std::exception& error) {
      fail(state, name, error);
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

template <class Peer>
void growth_case(benchmark::State& state, const std::string& name, Peer& peer, std::size_t bytes,
                 cudaStream_t stream) {
  try {
    peer.prepare_growth();
  } catch (const std::exception& error) {
    fail(state, name, error);
    return;
  }
  double alloc_total_s = 0;
  double alloc_min_s = 0;
  std::int64_t samples = 0;
  for (auto _ : state) {
    try {
      const GrowthSample sample = peer.grow_cold(bytes, stream);
      alloc_total_s += sample.alloc_seconds;
      alloc_min_s = samples == 0 ? sample.alloc_seconds : std::min(alloc_min_s, sample.alloc_seconds);
      ++samples;
    } catch (const std::exception& error) {
      fail(state, name, error);
      break;
    }
  }
  try {
    peer.finish_growth();
  } catch (const std::exception& error) {
    if (!state.error_occurred()) fail(state, name, error);
  }
  if (samples > 0) {
    state.counters["alloc_ms"] = alloc_total_s * 1e3 / static_cast<double>(samples);
    state.counters["alloc_ms_min"] = alloc_min_s * 1e3;
  }
  state.SetItemsProcessed(state.iterations());
}

template <class Peer>
void trace_case(benchmark::State& state, const std::string& name, Peer& peer, const TraceOps& trace,
                const Streams& streams) {
  std::vector<TraceBlock> live(trace.allocations);
  const auto stream_of = [&](std::uint32_t index) { return streams.at(index % kMaxThreads); };
  std::unique_ptr<SimulatedGpuLag> lag;
  if (g_simulated_device != nullptr && g_simulated_lag_ops > 0) {
    std::vector<StreamHandle> handles;
    for (std::size_t i = 0; i < kMaxThreads; ++i) {
      handles.push_back(reinterpret_cast<StreamHandle>(streams.at(i)));
    }
    lag = std::make_unique<SimulatedGpuLag>(*g_simulated_device, handles, g_simulated_lag_ops);
  }
  const auto after_op = [&] {
    if (lag) lag->after_operation();
  };
  // Untimed: the first pass grows the heap and makes the persistent blocks; the second settles
  // the layout around them.
  for (const bool first : {true, false}) {
    try {
      replay_trace_once(peer, trace, stream_of, live, first, after_op);
    } catch (const std::exception& error) {
      fail(state, name, error);
      break;
    }
  }
  // vramledger's driver calls per thousand operations of the timed passes (growth, moved
  // pages): the first suspect when its time per operation is high.
  std::int64_t calls_before = 0;
  if constexpr (requires { peer.driver_calls(); }) calls_before = peer.driver_calls();
  if (!state.error_occurred()) {
    for (auto _ : state) {
      try {
        replay_trace_once(peer, trace, stream_of, live, false, after_op);
      } catch (const std::exception& error) {
        fail(state, name, error);
        break;
      }
    }
  }
  const auto ops = static_cast<double>(repeated_ops(trace)) * static_cast<double>(state.iterations());
  std::int64_t calls = 0;
  if constexpr (requires { peer.driver_calls(); }) calls = peer.driver_calls() - calls_before;
  // A program's peak stays cached otherwise, and the next peers' cases need the device too.
  try {
    free_trace_blocks(peer, live);
    peer.release_cache();
  } catch (const std::exception& error) {
    if (!state.error_occurred()) fail(state, name, error);
  }
  if (state.error_occurred()) return;
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(repeated_ops(trace)));
  // Operations per nanosecond of timed (real) time, inverted: ns per operation.
  state.counters["ns_per_op"] =
      benchmark::Counter(ops / 1e9, benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  if constexpr (requires { peer.driver_calls(); }) {
    if (ops > 0) state.counters["calls_per_kop"] = 1000.0 * static_cast<double>(calls) / ops;
  }
}

// ------------------------------------------------------------------------------ registration

// One allocator's cases, registered as closures over the peer so the loop in main can register
// case by case (all allocators' 512 B pairs, then 64 KiB, ...): neighbours in time are the
// comparisons that matter.
struct PeerCases {
  std::string name;
  std::function<void(const SizeCase&)> pair;
  std::function<void()> mixed;
  std::function<void()> mixed_shared;
  std::function<void(const SizeCase&, bool shared)> pair_threads;
  std::function<void()> streams;
  std::function<void(const SizeCase&)> growth;  // empty: not in the growth list
  std::function<void(const TraceOps&)> trace;   // empty: no trace cases (cudaMalloc, rmm-arena)
};

template <class Peer>
PeerCases cases_for(const std::string& allocator, Peer& peer, const Streams& streams,
                    double min_time_s, int growth_iterations, bool warm_cases, bool growth) {
  PeerCases cases;
  cases.name = allocator;
  Peer* p = &peer;
  const Streams* s = &streams;
  if (warm_cases) {
    cases.pair = [=](const SizeCase& size) {
      const std::string name = "BM_Pair/" + allocator + "/" + size.label;
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
        pair_case(state, name, *p, size.bytes, s->at(0));
      })->MinTime(min_time_s)->UseRealTime();
    };
    cases.mixed = [=] {
      const std::string name = "BM_Mixed/" + allocator;
      auto* bm = benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
        ring_case(state, name, *p, *s, 0);
      });
      bm->MinTime(min_time_s)->UseRealTime()->Setup(reset_ring_threads_ready);
      for (int threads : kThreadCounts) bm->Threads(threads);
    };
    cases.mixed_shared = [=] {
      const std::string name = "BM_MixedShared/" + allocator;
      auto* bm = benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
        ring_case(state, name, *p, *s, 0, true);
      });
      bm->MinTime(min_time_s)->UseRealTime()->Setup(reset_ring_threads_ready);
      for (int threads : kThreadCounts) bm->Threads(threads);
    };
    cases.pair_threads = [=](const SizeCase& size, bool shared) {
      const std::string name = "BM_PairThreads/" + allocator + "/" + size.label +
                               (shared ? "/shared" : "/own");
      auto* bm = benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
        pair_threads_case(state, name, *p, size.bytes, *s, shared);
      });
      bm->MinTime(min_time_s)->UseRealTime();
      for (int threads : kThreadCounts) bm->Threads(threads);
    };
    // cudaMalloc would take minutes a trace; rmm-arena's arena is a fixed 16 GiB.
    if (allocator != "cudaMalloc" && allocator != "rmm-arena") {
      cases.trace = [=](const TraceOps& trace) {
        const std::string name = "BM_Trace/" + allocator + "/" + trace.name;
        const TraceOps* t = &trace;
        benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
          trace_case(state, name, *p, *t, *s);
        })->MinTime(min_time_s)->UseRealTime()->Unit(benchmark::kMillisecond);
      };
    }
    cases.streams = [=] {
      const std::string name = "BM_Streams/" + allocator + "/" + std::to_string(kRoundRobinStreams);
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
        ring_case(state, name, *p, *s, kRoundRobinStreams);
      })->MinTime(min_time_s)->UseRealTime();
    };
  }
  if (growth) {
    cases.growth = [=](const SizeCase& size) {
      const std::string name = "BM_Growth/" + allocator + "/" + size.label;
      benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& state) {
        growth_case(state, name, *p, size.bytes, kGrowthStream);
      })->Iterations(growth_iterations)->UseRealTime()->Unit(benchmark::kMillisecond);
    };
  }
  return cases;
}

// ------------------------------------------------------------------------------ main

std::string device_description() {
  cudaDeviceProp properties{};
  int driver = 0;
  int runtime = 0;
  if (cudaGetDeviceProperties(&properties, kDevice) != cudaSuccess ||
      cudaDriverGetVersion(&driver) != cudaSuccess || cudaRuntimeGetVersion(&runtime) != cudaSuccess) {
    (void)cudaGetLastError();
    return "device 0 (properties unavailable)";
  }
  return "device 0: " + std::string(properties.name) + ", " +
         std::to_string(properties.totalGlobalMem >> 20) + " MiB; driver API " +
         std::to_string(driver) + ", runtime " + std::to_string(runtime);
}

// Context lines: Google Benchmark prints them above the table and writes them into the JSON.
void note(const std::string& key, const std::string& value) { benchmark::AddCustomContext(key, value); }

// The command line: our flags, the rest for Google Benchmark.
struct Options {
  RunLengths lengths;
  std::vector<std::string> trace_paths;  // --trace=PATH: BM_Trace cases
  double simulated_capacity_gib = 0;  // > 0: the dry run on the simulated device
};

// Parses and removes our flags from argv; returns false (after printing why) on a bad value.
bool take_our_flags(int* argc, char** argv, Options* options) {
  constexpr std::string_view kCapacityFlag = "--simulated-capacity-gib=";
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--quick") {
      options->lengths = RunLengths{0.05, 0.01, 2};
    } else if (arg.starts_with("--trace=")) {
      const std::string path(arg.substr(std::string_view("--trace=").size()));
      if (path.empty()) {
        std::fprintf(stderr, "vramledger-bench-gpu-latency: --trace= needs a workload trace's path\n");
        return false;
      }
      options->trace_paths.push_back(path);
    } else if (arg.starts_with("--simulated-lag-ops=")) {
      const std::string value(arg.substr(std::string_view("--simulated-lag-ops=").size()));
      char* end = nullptr;
      const unsigned long long ops = std::strtoull(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0') {
        std::fprintf(stderr, "vramledger-bench-gpu-latency: --simulated-lag-ops= needs a count, got '%s'\n",
                     value.c_str());
        return false;
      }
      g_simulated_lag_ops = static_cast<std::size_t>(ops);
    } else if (arg == "--simulated") {
      options->simulated_capacity_gib = 140;
    } else if (arg.starts_with(kCapacityFlag)) {
      const std::string value(arg.substr(kCapacityFlag.size()));
      char* end = nullptr;
      const double gib = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(gib > 0)) {
        std::fprintf(stderr, "vramledger-bench-gpu-latency: %s needs a positive number of GiB, got '%s'\n",
                     std::string(kCapacityFlag).c_str(), value.c_str());
        return false;
      }
      options->simulated_capacity_gib = gib;
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  return true;
}

void record_setup_failure(const std::string& allocator, const std::string& message) {
  note("allocator " + allocator, "FAILED: " + message);
  std::lock_guard<std::mutex> lock(g_failures_mutex);
  g_failures.emplace(allocator + " (setup)", first_line(message));
}

// Registers all cases, case by case, runs them, then checks every vramledger ledger against its
// allocator's census. Returns false when a ledger disagrees.
bool run_all(std::vector<PeerCases>& all,
             const std::vector<std::pair<std::string, VramledgerPeer*>>& ledgers,
             const std::vector<TraceOps>& traces) {
  for (const SizeCase& size : kPairSizes) {
    for (PeerCases& cases : all) if (cases.pair) cases.pair(size);
  }
  for (PeerCases& cases : all) if (cases.mixed) cases.mixed();
  for (PeerCases& cases : all) if (cases.mixed_shared) cases.mixed_shared();
  for (const SizeCase& size : kThreadPairSizes) {
    for (bool shared : {false, true}) {
      for (PeerCases& cases : all) if (cases.pair_threads) cases.pair_threads(size, shared);
    }
  }
  for (PeerCases& cases : all) if (cases.streams) cases.streams();
  for (const SizeCase& size : kGrowthSizes) {
    for (PeerCases& cases : all) if (cases.growth) cases.growth(size);
  }
  for (const TraceOps& trace : traces) {
    for (PeerCases& cases : all) if (cases.trace) cases.trace(trace);
  }
  benchmark::RunSpecifiedBenchmarks();

  // The ledgers saw every event of the run: they must still agree with a recount of the blocks.
  bool consistent = true;
  for (const auto& [name, peer] : ledgers) {
    const bool ok = peer->ledger_consistent();
    std::printf("ledger vs census, %s: %s\n", name.c_str(), ok ? "consistent" : peer->check_ledger().c_str());
    consistent = consistent && ok;
  }
  return consistent;
}

// Every allocator on GPU 0.
bool run_on_gpu(const RunLengths& lengths, const std::vector<TraceOps>& traces) {
  const auto streams = Streams::cuda();
  std::vector<PeerCases> all;
  std::vector<std::unique_ptr<VramledgerPeer>> vramledger_peers;
  std::vector<std::pair<std::string, VramledgerPeer*>> ledgers;
  // -front: per-thread front caches large enough for every pair size (256 MiB blocks enter).
  // -trade: another stream's idle pages taken at once beyond the slack, however many streams
  // allocate (cross_stream_cold_allocs:0, the default before 2026-12-02; docs/configuration.md).
  struct Variant {
    std::string backend;
    bool front;
    std::string suffix, conf;
  };
  for (const Variant& variant : {Variant{"vmm", false, "", ""},
                                 Variant{"vmm", true, "-front", ",front_cache_mb:1024"},
                                 Variant{"vmm", false, "-trade", ",cross_stream_cold_allocs:0"},
                                 Variant{"cuda_malloc", false, "", ""},
                                 Variant{"cuda_malloc", true, "-front", ",front_cache_mb:1024"},
                                 Variant{"malloc_async", false, "", ""}}) {
    const std::string& backend = variant.backend;
    const std::string name = "vramledger-" + backend + variant.suffix;
    try {
      vramledger_peers.push_back(VramledgerPeer::on_gpu(backend, variant.conf));
    } catch (const Error& error) {
      if (error.code() == ErrorCode::kNotSupported) {
        note("allocator " + name, std::string("SKIPPED, not supported here: ") + error.what());
      } else {
        record_setup_failure(name, error.what());
      }
      continue;
    }
    VramledgerPeer& peer = *vramledger_peers.back();
    note("allocator " + name, peer.describe());
    // malloc_async is left out of the growth list: its pool is a second cache under the policy.
    all.push_back(cases_for(name, peer, *streams, lengths.fast_min_time_s,
                            lengths.growth_iterations, true,
                            backend != "malloc_async" && variant.conf.empty()));
    ledgers.emplace_back(name, &peer);
  }

  CudaMallocPeer cuda_malloc;
  note("allocator cudaMalloc", "cudaMalloc + cudaFree (nothing cached)");
  all.push_back(cases_for("cudaMalloc", cuda_malloc, *streams, lengths.cuda_malloc_min_time_s,
                          lengths.growth_iterations, true, true));

  std::unique_ptr<MallocAsyncPeer> malloc_async;
  try {
    malloc_async = std::make_unique<MallocAsyncPeer>();
    note("allocator cudaMallocAsync",
         "cudaMallocAsync + cudaFreeAsync, device default pool, release threshold UINT64_MAX");
    all.push_back(cases_for("cudaMallocAsync", *malloc_async, *streams, lengths.fast_min_time_s,
                            lengths.growth_iterations, true, true));
  } catch (const PeerError& error) {
    record_setup_failure("cudaMallocAsync", error.what());
  }

#ifdef VRAMLEDGER_BENCH_WITH_RMM
  // RAPIDS RMM over cuda_memory_resource. The arena takes its 16 GiB when built and is left out
  // of the growth list (nothing to grow); the pool grows from empty as the others do.
  std::vector<std::unique_ptr<RmmPeer>> rmm_peers;
  using RmmRow = std::pair<std::string, RmmPeer::Kind>;
  for (const auto& [name, kind] :
       {RmmRow{"rmm-pool", RmmPeer::Kind::kPool}, RmmRow{"rmm-arena", RmmPeer::Kind::kArena}}) {
    try {
      rmm_peers.push_back(std::make_unique<RmmPeer>(kind));
    } catch (const PeerError& error) {
      // Built with RMM, so expected here: a failure, not a skip.
      record_setup_failure(name, error.what());
      continue;
    }
    note("allocator " + name, rmm_peers.back()->describe());
    all.push_back(cases_for(name, *rmm_peers.back(), *streams, lengths.fast_min_time_s,
                            lengths.growth_iterations, true, kind == RmmPeer::Kind::kPool));
  }
#else
  note("allocator rmm-pool", "not built (RMM not found when configured: scripts/fetch_rmm.sh)");
  note("allocator rmm-arena", "not built (RMM not found when configured: scripts/fetch_rmm.sh)");
#endif

#ifdef VRAMLEDGER_BENCH_WITH_TORCH
  std::unique_ptr<TorchNativePeer> torch_native;
  std::unique_ptr<TorchNativePeer> torch_expandable;
  try {
    torch_native = std::make_unique<TorchNativePeer>(false);
    torch_expandable = std::make_unique<TorchNativePeer>(true);
    note("allocator torch-native", torch_native->describe());
    note("allocator torch-expandable", torch_expandable->describe());
    all.push_back(cases_for("torch-native", *torch_native, *streams, lengths.fast_min_time_s,
                            lengths.growth_iterations, true, true));
    all.push_back(cases_for("torch-expandable", *torch_expandable, *streams,
                            lengths.fast_min_time_s, lengths.growth_iterations, false, true));
  } catch (const PeerError& error) {
    // Built against torch, so expected here: a failure, not a skip.
    record_setup_failure("torch-native", error.what());
  }
#else
  note("allocator torch-native", "not built (torch not found when configured)");
#endif

  return run_all(all, ledgers, traces);
}

// The same cases through the policy on the simulated device: a CPU check of this binary (case
// bodies, threads, names, failure reporting, ledger check). Not GPU figures.
bool run_simulated(const RunLengths& lengths, double capacity_gib,
                   const std::vector<TraceOps>& traces) {
  g_simulated = true;
  SimulatedDeviceOptions options;
  options.capacity_bytes = static_cast<std::size_t>(capacity_gib * static_cast<double>(kGiB));
  options.supports_virtual_memory = true;
  const auto device = std::make_shared<SimulatedDevice>(options);
  g_simulated_device = device.get();
  note("device", "SIMULATED (dry run, not GPU figures): " + std::to_string(options.capacity_bytes) +
                     " B, virtual memory on");
  const auto streams = Streams::simulated(*device);
  const VramledgerPeer::BackendFactory fresh_device = [options] {
    return std::make_unique<SimulatedDevice>(options);
  };
  std::vector<PeerCases> all;
  std::vector<std::unique_ptr<VramledgerPeer>> peers;
  std::vector<std::pair<std::string, VramledgerPeer*>> ledgers;
  for (const auto& [name, conf] :
       {std::pair<std::string, std::string>{"simulated-paged", "backend:simulated"},
        {"simulated-paged-front", "backend:simulated,front_cache_mb:1024"},
        {"simulated-segment", "backend:simulated,paged_heap:false"}}) {
    peers.push_back(std::make_unique<VramledgerPeer>(conf, device, fresh_device));
    note("allocator " + name, peers.back()->describe());
    all.push_back(cases_for(name, *peers.back(), *streams, lengths.fast_min_time_s,
                            lengths.growth_iterations, true, true));
    ledgers.emplace_back(name, peers.back().get());
  }
  return run_all(all, ledgers, traces);
}

int run(int argc, char** argv) {
  Options options;
  if (!take_our_flags(&argc, argv, &options)) return 2;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;

  std::vector<TraceOps> traces;
  for (const std::string& path : options.trace_paths) {
    traces.push_back(load_trace_ops(path));  // a bad trace ends the run here, before any case
    const TraceOps& trace = traces.back();
    note("trace " + trace.name, path + ": " + std::to_string(trace.ops.size()) + " operations, " +
                                    std::to_string(trace.allocations) + " allocations, peak requested " +
                                    std::to_string(trace.peak_requested_bytes) + " B");
  }
  bool consistent = true;
  if (options.simulated_capacity_gib > 0) {
    consistent = run_simulated(options.lengths, options.simulated_capacity_gib, traces);
  } else {
    const std::string no_gpu = cuda_device_unavailable_reason();
    if (!no_gpu.empty()) {
      std::printf("vramledger-bench-gpu-latency: SKIPPED, no usable CUDA device (%s); nothing measured\n",
                  no_gpu.c_str());
      return 0;
    }
    const cudaError_t error = cudaSetDevice(kDevice);
    if (error != cudaSuccess) {
      std::fprintf(stderr, "vramledger-bench-gpu-latency: cudaSetDevice(0) failed: %s\n",
                   cudaGetErrorString(error));
      return 1;
    }
    note("device", device_description());
    // Everything holding device memory is destroyed inside, while the CUDA runtime is still up.
    consistent = run_on_gpu(options.lengths, traces);
  }

  int status = consistent ? 0 : 1;
  if (!g_failures.empty()) {
    std::printf("%zu case(s) FAILED:\n", g_failures.size());
    for (const auto& [name, message] : g_failures) std::printf("  %s: %s\n", name.c_str(), message.c_str());
    status = 1;
  }
  std::fflush(stdout);
  benchmark::Shutdown();
  return status;
}

}  // namespace
}  // namespace vramledger::gpu_latency

int main(int argc, char** argv) {
  try {
    return vramledger::gpu_latency::run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "vramledger-bench-gpu-latency: %s\n",
                 vramledger::gpu_latency::first_line(error.what()).c_str());
    return 1;
  }
}
