// Does a VMM driver call wait for work queued on the GPU?
//
// Issue 14: ViT's peak steps are GPU-bound and slower under the paged heap, which moves ~250
// 4 MiB chunks in each of them (unmap at the old address, map at the new one). ~50 µs of CPU per
// move cannot explain it while the CPU runs ahead; a call that waits for the GPU can. This probe
// keeps a stream busy with a spin kernel and times each VMM call made meanwhile on memory the
// kernel never touches. A call that takes about as long as the spin waited for it.
//
// It also checks that one physical allocation can be mapped at two addresses at once (what a
// "map at the new address first, unmap the old one later" move needs), whether a kernel launched
// right after an unmap starts late, and whether page moves made on a helper thread slow kernel
// launches on the allocating thread (they do not: unmap_in_background, 2026-12-03). Added in
// session 17 (results: bench/results/gpu/2026-12-03-h200-session-17.md):
//  * whether moves stall the GPU's own work (a GPU-bound queue timed by events, with moves on
//    another thread and on the launching thread): they do not;
//  * whether moves on several threads run side by side in the driver: they do not;
//  * a launch-bound thread moving a chunk per allocation, inline or on a helper while the stream
//    waits on a host counter (cuStreamWaitValue32): the helper saves most of the moves' time for
//    kernels, but under torch this cannot be used, since cudaMemsetAsync and cudaMemcpyAsync
//    refuse an address not yet mapped and accessible when queued (access_probe.cu beside this
//    file; docs/design.md 3.1).
//
// Build: nvcc -O2 -std=c++17 -o vmm_sync_probe vmm_sync_probe.cu -lcuda
// Prints one line per call: the call, µs idle, µs while the GPU spins, and "WAITS" when the busy
// figure is over half the spin.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

namespace {

constexpr std::uint64_t kSpinNs = 50'000'000;  // 50 ms

__global__ void spin_kernel(std::uint64_t nanoseconds) {
  std::uint64_t start = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  std::uint64_t now = start;
  while (now - start < nanoseconds) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
}

__global__ void touch_kernel(unsigned char* data, std::size_t bytes) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += gridDim.x * blockDim.x) data[i] += 1;
}

// One small kernel of an allocating thread's stream: adds one to every 4-byte word of one
// 4 KiB stretch of the block (a use of the freshly mapped memory).
__global__ void bump_kernel(unsigned* data) { data[threadIdx.x] += 1; }

void check(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) {
    const char* text = nullptr;
    cuGetErrorString(result, &text);
    std::fprintf(stderr, "%s failed: %s\n", what, text ? text : "?");
    std::exit(1);
  }
}

void check(cudaError_t result, const char* what) {
  if (result != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(result));
    std::exit(1);
  }
}

double micros(const std::function<void()>& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
}

struct Vmm {
  int device = 0;
  CUmemAllocationProp prop{};
  CUmemAccessDesc access{};
  std::size_t page = 0;

  Vmm() {
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device;
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    check(cuMemGetAllocationGranularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), "granularity");
    page = page < (4u << 20) ? (4u << 20) : page;
  }
  CUmemGenericAllocationHandle create() {
    CUmemGenericAllocationHandle handle = 0;
    check(cuMemCreate(&handle, page, &prop, 0), "cuMemCreate");
    return handle;
  }
  CUdeviceptr reserve(std::size_t pages) {
    CUdeviceptr va = 0;
    check(cuMemAddressReserve(&va, pages * page, page, 0, 0), "cuMemAddressReserve");
    return va;
  }
  void map(CUdeviceptr va, CUmemGenericAllocationHandle handle) const {
    check(cuMemMap(va, page, 0, handle, 0), "cuMemMap");
  }
  void set_access(CUdeviceptr va) const { check(cuMemSetAccess(va, page, &access, 1), "cuMemSetAccess"); }
  std::vector<CUmemGenericAllocationHandle> create_many(int count) {
    std::vector<CUmemGenericAllocationHandle> made;
    for (int i = 0; i < count; ++i) made.push_back(create());
    return made;
  }
  // Maps handles[i] at va + i pages, each made accessible.
  void map_each(CUdeviceptr va, const std::vector<CUmemGenericAllocationHandle>& handles) {
    for (std::size_t i = 0; i < handles.size(); ++i) {
      map(va + i * page, handles[i]);
      set_access(va + i * page);
    }
  }
  void unmap(CUdeviceptr va) const { check(cuMemUnmap(va, page), "cuMemUnmap"); }
  // `count` new chunks mapped (and accessible) in a first range, with a second range of the same
  // size reserved beside it: what the move loops shuttle between.
  struct TwoRanges {
    std::vector<CUmemGenericAllocationHandle> chunks;
    CUdeviceptr first = 0;
    CUdeviceptr second = 0;
  };
  TwoRanges chunks_in_two_ranges(int count) {
    TwoRanges made{create_many(count), reserve(count), reserve(count)};
    map_each(made.first, made.chunks);
    return made;
  }
};

// Moves every chunk of `chunks` from one of two ranges to the other (unmap, map, set access),
// round after round, until `stop` (checked between rounds, so between runs the chunks are all on
// one side: `at_from`), counting each move in `moves`. On its own thread.
void shuttle_chunks(const Vmm& vmm, const std::vector<CUmemGenericAllocationHandle>& chunks,
                    CUdeviceptr from, CUdeviceptr to, bool& at_from,
                    const std::atomic<bool>& stop, std::atomic<long>& moves) {
  check(cudaSetDevice(0), "cudaSetDevice (mover)");
  while (!stop.load(std::memory_order_relaxed)) {
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      const CUdeviceptr old_va = (at_from ? from : to) + i * vmm.page;
      const CUdeviceptr new_va = (at_from ? to : from) + i * vmm.page;
      vmm.unmap(old_va);
      vmm.map(new_va, chunks[i]);
      vmm.set_access(new_va);
      moves.fetch_add(1, std::memory_order_relaxed);
    }
    at_from = !at_from;
  }
}

}  // namespace

int main() {
  check(cudaSetDevice(0), "cudaSetDevice");
  check(cudaFree(nullptr), "context");
  Vmm vmm;
  cudaStream_t busy = nullptr;
  cudaStream_t other = nullptr;
  check(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking), "stream");
  check(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), "stream");
  std::printf("page %zu bytes, spin %.0f ms\n", vmm.page, kSpinNs / 1e6);

  constexpr int kPages = 16;
  std::vector<CUmemGenericAllocationHandle> handles = vmm.create_many(kPages);
  const CUdeviceptr a = vmm.reserve(kPages);
  const CUdeviceptr b = vmm.reserve(kPages);
  vmm.map_each(a, handles);
  // Used once by a kernel that finished long before the calls below.
  touch_kernel<<<64, 256, 0, other>>>(reinterpret_cast<unsigned char*>(a), kPages * vmm.page);
  check(cudaStreamSynchronize(other), "sync");

  int next_page = 0;
  struct Row {
    const char* name;
    std::function<void()> call;
  };
  // Each row runs twice: once with the GPU idle, once right after a 50 ms spin was queued on a
  // non-blocking stream that none of these addresses belong to.
  auto run_row = [&](const char* name, const std::function<void(bool)>& call) {
    const double idle = micros([&] { call(false); });
    spin_kernel<<<1, 1, 0, busy>>>(kSpinNs);
    check(cudaGetLastError(), "spin launch");
    const double while_busy = micros([&] { call(true); });
    const double rest = micros([&] { check(cudaStreamSynchronize(busy), "sync"); });
    std::printf("%-52s idle %9.1f us  busy %9.1f us  then sync %8.1f us  %s\n", name, idle, while_busy, rest,
                while_busy > kSpinNs / 2e3 ? "WAITS" : "");
  };

  run_row("cuMemCreate (4 MiB)", [&](bool) { handles.push_back(vmm.create()); });
  run_row("cuMemMap (fresh handle, new address)", [&](bool busy_now) {
    const int i = next_page++;
    vmm.map(b + i * vmm.page, handles[kPages + (busy_now ? 1 : 0)]);
  });
  run_row("cuMemSetAccess (that page)", [&](bool busy_now) {
    vmm.set_access(b + (next_page - 1 - (busy_now ? 0 : 1)) * vmm.page);
  });
  run_row("cuMemUnmap (page a kernel used long ago)", [&](bool busy_now) {
    vmm.unmap(a + (busy_now ? 1 : 0) * vmm.page);
  });
  run_row("cuMemMap (same handle at a second address)", [&](bool busy_now) {
    // handles[2] and [3] stay mapped in a; map them again in b.
    const int i = next_page++;
    vmm.map(b + i * vmm.page, handles[busy_now ? 3 : 2]);
    vmm.set_access(b + i * vmm.page);
  });
  run_row("cuMemUnmap (old address of a dual-mapped handle)", [&](bool busy_now) {
    vmm.unmap(a + (busy_now ? 3 : 2) * vmm.page);
  });
  run_row("cuMemRelease (handle unmapped everywhere)", [&](bool busy_now) {
    check(cuMemRelease(handles[busy_now ? 1 : 0]), "cuMemRelease");
  });
  run_row("cuMemAddressReserve + Free (64 MiB)", [&](bool) {
    CUdeviceptr va = vmm.reserve(16);
    check(cuMemAddressFree(va, 16 * vmm.page), "cuMemAddressFree");
  });
  run_row("cudaEventRecord + cudaEventQuery", [&](bool) {
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event");
    check(cudaEventRecord(event, other), "record");
    (void)cudaEventQuery(event);
    check(cudaEventDestroy(event), "destroy");
  });
  run_row("4 x (cuMemUnmap + cuMemMap + cuMemSetAccess): a move", [&](bool busy_now) {
    const int base = busy_now ? 8 : 4;
    for (int k = 0; k < 4; ++k) {
      vmm.unmap(a + (base + k) * vmm.page);
      const int i = next_page++;
      vmm.map(b + i * vmm.page, handles[base + k]);
      vmm.set_access(b + i * vmm.page);
    }
  });

  // Does a kernel launched right after an unmap start late? Spin on one stream, unmap, then
  // launch a short kernel on another stream and time until it completes.
  spin_kernel<<<1, 1, 0, busy>>>(kSpinNs);
  vmm.unmap(a + 12 * vmm.page);
  const double after_unmap = micros([&] {
    spin_kernel<<<1, 1, 0, other>>>(1000);
    check(cudaStreamSynchronize(other), "sync");
  });
  check(cudaStreamSynchronize(busy), "sync");
  spin_kernel<<<1, 1, 0, busy>>>(kSpinNs);
  const double baseline = micros([&] {
    spin_kernel<<<1, 1, 0, other>>>(1000);
    check(cudaStreamSynchronize(other), "sync");
  });
  check(cudaStreamSynchronize(busy), "sync");
  std::printf("short kernel on another stream while the spin runs: %.1f us after an unmap, %.1f us without\n",
              after_unmap, baseline);

  // Does cuMemSetAccess cost per call or per byte? A move of an n-chunk run maps n chunks at
  // adjacent addresses: one cuMemSetAccess over the run or one per chunk. The same for the
  // unmap of a run. Five repetitions per n, median, GPU idle and GPU busy.
  const std::vector<CUmemGenericAllocationHandle> batch = vmm.create_many(kPages);
  const CUdeviceptr c = vmm.reserve(kPages);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("run of n chunks: map n + set access (1 call | n calls), unmap (1 call | n calls), us, median of 5\n");
  for (const int n : {1, 2, 4, 8, 16}) {
    for (const bool busy_now : {false, true}) {
      std::vector<double> one_access, each_access, one_unmap, each_unmap;
      for (int rep = 0; rep < 5; ++rep) {
        if (busy_now) spin_kernel<<<1, 1, 0, busy>>>(kSpinNs);
        for (const bool batched : {true, false}) {
          (batched ? one_access : each_access).push_back(micros([&] {
            for (int i = 0; i < n; ++i) vmm.map(c + i * vmm.page, batch[i]);
            if (batched) {
              check(cuMemSetAccess(c, n * vmm.page, &vmm.access, 1), "cuMemSetAccess (run)");
            } else {
              for (int i = 0; i < n; ++i) vmm.set_access(c + i * vmm.page);
            }
          }));
          (batched ? one_unmap : each_unmap).push_back(micros([&] {
            if (batched) {
              if (cuMemUnmap(c, n * vmm.page) != CUDA_SUCCESS) {  // not legal on every driver
                std::printf("  (one cuMemUnmap over %d chunks refused: unmapping each)\n", n);
                for (int i = 0; i < n; ++i) vmm.unmap(c + i * vmm.page);
              }
            } else {
              for (int i = 0; i < n; ++i) vmm.unmap(c + i * vmm.page);
            }
          }));
        }
        if (busy_now) check(cudaStreamSynchronize(busy), "sync");
      }
      std::printf("  n=%2d %-4s map+access %8.1f | %8.1f   unmap %8.1f | %8.1f\n", n, busy_now ? "busy" : "idle",
                  median(one_access), median(each_access), median(one_unmap), median(each_unmap));
    }
  }
  // Can page moves leave the allocating thread? A helper thread would map ahead of need and
  // unmap donors while the thread that allocates goes on launching kernels. That helps only if
  // the driver lets the two run side by side: time 20,000 launches of an empty kernel on one
  // thread, alone and while a second thread moves 4 MiB chunks (unmap + map + set access) in a
  // loop, and the moves' cost with and without the launches beside them (issue 14).
  {
    constexpr int kLaunches = 20000;
    constexpr int kMovePages = 8;
    const Vmm::TwoRanges ranges = vmm.chunks_in_two_ranges(kMovePages);
    const std::vector<CUmemGenericAllocationHandle>& movers = ranges.chunks;
    const CUdeviceptr from = ranges.first;
    const CUdeviceptr to = ranges.second;
    auto launches = [&] {
      return micros([&] {
        for (int i = 0; i < kLaunches; ++i) spin_kernel<<<1, 1, 0, other>>>(0);
        check(cudaStreamSynchronize(other), "sync");
      });
    };
    // Moves every chunk from one range to the other, round after round, until `stop` (checked
    // between rounds, so the chunks are always all on one side between runs: `at_from`).
    std::atomic<bool> stop{false};
    std::atomic<long> moves{0};
    bool at_from = true;
    auto mover = [&] { shuttle_chunks(vmm, movers, from, to, at_from, stop, moves); };
    const double alone = launches();
    const double moves_alone_us = [&] {
      moves = 0;
      stop = false;
      std::thread t(mover);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      stop = true;
      t.join();
      return 200000.0 / static_cast<double>(std::max<long>(moves.load(), 1));
    }();
    moves = 0;
    stop = false;
    const auto start = std::chrono::steady_clock::now();
    std::thread t(mover);
    const double beside = launches();
    stop = true;
    t.join();
    const double elapsed =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    std::printf("%d empty-kernel launches on one thread: %.1f us alone, %.1f us while another thread moves chunks\n",
                kLaunches, alone, beside);
    std::printf("a chunk move (unmap + map + set access) on the other thread: %.1f us alone, %.1f us beside the launches (%ld moves)\n",
                moves_alone_us, elapsed / static_cast<double>(std::max<long>(moves.load(), 1)), moves.load());
  }
  // Do moves stall the GPU itself? The launches above are bound by the CPU, so they cannot show
  // it. Here the GPU is the bottleneck: 2,000 bandwidth-bound kernels over a 64 MiB buffer queued
  // on one stream, timed by events on the GPU, alone and while another thread moves chunks. If
  // the page-table updates of a map or an unmap hold up the running work, the queue takes longer
  // by about the moves' count times that hold-up; if not, maps can leave the allocating thread
  // with the stream waiting for them on the GPU (issue 14, docs/design.md 3.1).
  {
    constexpr int kKernels = 2000;
    constexpr int kMovePages = 8;
    constexpr std::size_t kBytes = std::size_t{64} << 20;
    unsigned char* buffer = nullptr;
    check(cudaMalloc(&buffer, kBytes), "cudaMalloc");
    cudaEvent_t begin = nullptr, end = nullptr;
    check(cudaEventCreate(&begin), "cudaEventCreate");
    check(cudaEventCreate(&end), "cudaEventCreate");
    auto gpu_us = [&] {
      check(cudaEventRecord(begin, other), "cudaEventRecord");
      for (int i = 0; i < kKernels; ++i) touch_kernel<<<1056, 256, 0, other>>>(buffer, kBytes);
      check(cudaEventRecord(end, other), "cudaEventRecord");
      check(cudaEventSynchronize(end), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
      return 1000.0 * ms;
    };
    const Vmm::TwoRanges ranges = vmm.chunks_in_two_ranges(kMovePages);
    const std::vector<CUmemGenericAllocationHandle>& movers = ranges.chunks;
    const CUdeviceptr from = ranges.first;
    const CUdeviceptr to = ranges.second;
    std::atomic<bool> stop{false};
    std::atomic<long> moves{0};
    bool at_from = true;
    auto mover = [&] { shuttle_chunks(vmm, movers, from, to, at_from, stop, moves); };
    (void)gpu_us();  // warm
    std::vector<double> alone, beside, counts;
    for (int round = 0; round < 3; ++round) {
      alone.push_back(gpu_us());
      moves = 0;
      stop = false;
      std::thread t(mover);
      beside.push_back(gpu_us());
      stop = true;
      t.join();
      counts.push_back(static_cast<double>(moves.load()));
    }
    for (int round = 0; round < 3; ++round) {
      std::printf("GPU-bound queue (%d kernels over 64 MiB): %.1f us alone, %.1f us while another thread "
                  "moves chunks (%.0f moves): %+.2f us of GPU time per move\n",
                  kKernels, alone[round], beside[round], counts[round],
                  (beside[round] - alone[round]) / std::max(counts[round], 1.0));
    }
    // The same queue with the moves made by the launching thread itself, one move after every
    // tenth kernel: the allocating thread's case today (a move on the critical path of launches).
    {
      check(cudaEventRecord(begin, other), "cudaEventRecord");
      const auto start = std::chrono::steady_clock::now();
      long inline_moves = 0;
      for (int i = 0; i < kKernels; ++i) {
        touch_kernel<<<1056, 256, 0, other>>>(buffer, kBytes);
        if (i % 10 == 9) {
          const int k = static_cast<int>(inline_moves % kMovePages);
          const CUdeviceptr old_va = (at_from ? from : to) + k * vmm.page;
          const CUdeviceptr new_va = (at_from ? to : from) + k * vmm.page;
          vmm.unmap(old_va);
          vmm.map(new_va, movers[k]);
          vmm.set_access(new_va);
          if (k == kMovePages - 1) at_from = !at_from;
          ++inline_moves;
        }
      }
      const double cpu =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
      check(cudaEventRecord(end, other), "cudaEventRecord");
      check(cudaEventSynchronize(end), "cudaEventSynchronize");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
      std::printf("the same queue, a move after every tenth launch on the launching thread (%ld moves): "
                  "GPU %.1f us, launching %.1f us\n",
                  inline_moves, 1000.0 * ms, cpu);
    }
    check(cudaFree(buffer), "cudaFree");
  }
  // Do maps on several threads at once run side by side in the driver? If they do, an
  // allocation that needs k chunks moved could have its maps made by k threads while it waits,
  // keeping today's guarantee (every page mapped before the pointer is handed out) at a fraction
  // of the wall time. Each thread moves its own 8 chunks between its own two ranges for 300 ms;
  // aggregate moves per second at 1, 2, 4 and 8 threads.
  for (int threads : {1, 2, 4, 8}) {
    constexpr int kMovePages = 8;
    struct Lane {
      std::vector<CUmemGenericAllocationHandle> chunks;
      CUdeviceptr from = 0, to = 0;
      bool at_from = true;
    };
    std::vector<Lane> lanes(threads);
    for (Lane& lane : lanes) {
      Vmm::TwoRanges ranges = vmm.chunks_in_two_ranges(kMovePages);
      lane.chunks = std::move(ranges.chunks);
      lane.from = ranges.first;
      lane.to = ranges.second;
    }
    std::atomic<bool> stop{false};
    std::atomic<long> moves{0};
    std::vector<std::thread> workers;
    const auto start = std::chrono::steady_clock::now();
    for (Lane& lane : lanes) {
      workers.emplace_back([&, lane_ptr = &lane] {
        shuttle_chunks(vmm, lane_ptr->chunks, lane_ptr->from, lane_ptr->to, lane_ptr->at_from, stop,
                       moves);
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    stop = true;
    for (std::thread& t : workers) t.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("moves on %d thread(s) at once: %.0f moves/s in all, %.1f us per move per thread\n",
                threads, moves.load() / seconds, 1e6 * seconds * threads / std::max<long>(moves.load(), 1));
  }
  // Maps off the allocating thread, the stream waiting for them on the GPU (issue 14,
  // docs/design.md 3.1; holds for kernels only: see access_probe.cu). An allocating thread that is the bottleneck (small kernels: launching
  // them takes longer than running them) moves a chunk for each "allocation" and launches 16
  // kernels that write into it. Inline: it moves the chunk itself, then launches. Helper: it
  // hands the move to a helper thread, enqueues cuStreamWaitValue32 (GEQ) on a host-mapped
  // counter, launches at once; the helper moves the chunk and raises the counter. A chunk is
  // moved again only after the work that used it at its old address has finished (an event,
  // as the allocator's fences do). Every word of every chunk is checked at the end: a kernel
  // that ran before its map would fault (illegal address) or leave a wrong count.
  {
    constexpr int kChunks = 8;
    constexpr int kAllocations = 2000;
    constexpr int kKernelsPerAllocation = 16;
    const Vmm::TwoRanges ranges = vmm.chunks_in_two_ranges(kChunks);
    const std::vector<CUmemGenericAllocationHandle>& chunks = ranges.chunks;
    const CUdeviceptr range_a = ranges.first;
    const CUdeviceptr range_b = ranges.second;
    check(cudaMemset(reinterpret_cast<void*>(range_a), 0, kChunks * vmm.page), "cudaMemset");
    check(cudaDeviceSynchronize(), "sync");
    unsigned* counter_host = nullptr;
    check(cuMemHostAlloc(reinterpret_cast<void**>(&counter_host), sizeof(unsigned),
                         CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
    *counter_host = 0;
    CUdeviceptr counter_device = 0;
    check(cuMemHostGetDevicePointer(&counter_device, counter_host, 0), "cuMemHostGetDevicePointer");
    int mem_ops = 0;
    check(cuDeviceGetAttribute(&mem_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, 0), "attribute");
    std::printf("stream memory operations supported: %d\n", mem_ops);
    // The enqueue cost of a wait whose value is already there.
    {
      const int n = 10000;
      const double us = micros([&] {
        for (int i = 0; i < n; ++i) {
          check(cuStreamWaitValue32(other, counter_device, 0, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
        }
        check(cudaStreamSynchronize(other), "sync");
      });
      std::printf("cuStreamWaitValue32 already satisfied: %.2f us per call (%d calls, synchronized)\n", us / n, n);
    }
    // Where each chunk is, and the event after the last work that used it there.
    // One event per use (recorded once), so a helper running behind never waits for a later
    // record of the same event (which would wait for the helper itself).
    std::vector<CUdeviceptr> at(kChunks);
    std::vector<cudaEvent_t> use_events(3 * kAllocations + kChunks);
    for (cudaEvent_t& e : use_events) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event");
    std::size_t next_event = 0;
    std::vector<cudaEvent_t> last_use(kChunks);
    for (int c = 0; c < kChunks; ++c) {
      at[c] = range_a + c * vmm.page;
      last_use[c] = use_events[next_event++];
      check(cudaEventRecord(last_use[c], other), "record");
    }
    auto destination = [&](int c) {
      return at[c] >= range_b ? range_a + c * vmm.page : range_b + c * vmm.page;
    };
    auto move = [&](int c, CUdeviceptr to) {
      check(cudaEventSynchronize(last_use[c]), "wait for last use");  // the fence
      vmm.map(to, chunks[c]);  // map first, as unmap_in_background does
      vmm.set_access(to);
      vmm.unmap(at[c]);
    };
    auto launch_uses = [&](int c, CUdeviceptr va) {
      for (int k = 0; k < kKernelsPerAllocation; ++k) {
        bump_kernel<<<1, 1024, 0, other>>>(reinterpret_cast<unsigned*>(va) + k * 1024);
      }
      last_use[c] = use_events[next_event++];
      check(cudaEventRecord(last_use[c], other), "record");
    };
    // Inline.
    const double inline_us = micros([&] {
      for (int i = 0; i < kAllocations; ++i) {
        const int c = i % kChunks;
        const CUdeviceptr to = destination(c);
        move(c, to);
        at[c] = to;
        launch_uses(c, to);
      }
      check(cudaStreamSynchronize(other), "sync");
    });
    // Helper.
    struct Job { int chunk; CUdeviceptr to; unsigned ticket; cudaEvent_t fence; };
    std::mutex queue_mutex;
    std::condition_variable queue_cv;
    std::deque<Job> queue;
    bool closing = false;
    std::vector<CUdeviceptr> helper_at = at;  // the helper's view of where each chunk is
    std::thread helper([&] {
      check(cudaSetDevice(0), "cudaSetDevice (helper)");
      while (true) {
        Job job;
        {
          std::unique_lock lock(queue_mutex);
          queue_cv.wait(lock, [&] { return closing || !queue.empty(); });
          if (queue.empty()) return;
          job = queue.front();
          queue.pop_front();
        }
        check(cudaEventSynchronize(job.fence), "wait for last use");
        vmm.map(job.to, chunks[job.chunk]);
        vmm.set_access(job.to);
        vmm.unmap(helper_at[job.chunk]);
        helper_at[job.chunk] = job.to;
        __atomic_store_n(counter_host, job.ticket, __ATOMIC_RELEASE);
      }
    });
    unsigned ticket = 0;
    double enqueue_us = 0;
    const double helper_us = micros([&] {
      for (int i = 0; i < kAllocations; ++i) {
        const int c = i % kChunks;
        const CUdeviceptr to = destination(c);
        {
          std::lock_guard lock(queue_mutex);
          queue.push_back({c, to, ++ticket, last_use[c]});
        }
        queue_cv.notify_one();
        at[c] = to;
        const auto w0 = std::chrono::steady_clock::now();
        check(cuStreamWaitValue32(other, counter_device, ticket, CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32");
        enqueue_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - w0).count();
        launch_uses(c, to);
      }
      check(cudaStreamSynchronize(other), "sync");
    });
    {
      std::lock_guard lock(queue_mutex);
      closing = true;
    }
    queue_cv.notify_one();
    helper.join();
    // Launching alone, no moves: the thread's own share.
    const double launches_us = micros([&] {
      for (int i = 0; i < kAllocations; ++i) {
        const int c = i % kChunks;
        launch_uses(c, at[c]);
      }
      check(cudaStreamSynchronize(other), "sync");
    });
    // Check: every word the kernels wrote was counted once per kernel that wrote it.
    std::vector<unsigned> host(kChunks * vmm.page / sizeof(unsigned));
    long wrong = 0;
    for (int c = 0; c < kChunks; ++c) {
      std::vector<unsigned> words(vmm.page / sizeof(unsigned));
      check(cudaMemcpy(words.data(), reinterpret_cast<void*>(at[c]), vmm.page, cudaMemcpyDeviceToHost), "copy back");
      const unsigned expected = 3u * (kAllocations / kChunks);  // inline, helper, launches only
      for (std::size_t w = 0; w < kKernelsPerAllocation * 1024u; ++w) wrong += words[w] != expected;
    }
    std::printf("allocating thread, %d allocations each moving a chunk and launching %d kernels into it:\n"
                "  moves inline %.1f us; moves on a helper + cuStreamWaitValue32 %.1f us (enqueue %.2f us per wait); "
                "launches alone (no moves) %.1f us; words wrong %ld\n",
                kAllocations, kKernelsPerAllocation, inline_us, helper_us, enqueue_us / kAllocations,
                launches_us, wrong);
    for (cudaEvent_t& e : use_events) check(cudaEventDestroy(e), "event destroy");
    check(cuMemFreeHost(counter_host), "cuMemFreeHost");
  }
  std::printf("done\n");
  return 0;
}
