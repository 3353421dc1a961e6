// gpu_backend_costs: what the raw backends cost on this GPU, so the policy's choices (page size,
// how much to batch, when to unmap) rest on measured numbers. Not a test: prints a table and
// writes JSON to the path given as the first argument.
//
//   gpu_backend_costs [out.json] [--quick]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "allocator/cuda/cuda_backend_factory.hpp"
#include "allocator/cuda/driver_api.hpp"
#include "allocator/cuda/malloc_async_backend.hpp"
#include "allocator/cuda/vmm_backend.hpp"
#include "tests/gpu/pattern_kernels.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

using Clock = std::chrono::steady_clock;

double micros_since(Clock::time_point start) {
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count();
}

struct Row {
  std::string name;     // what was timed
  std::size_t bytes;    // size per operation
  std::vector<double> us;  // one sample per repetition
  std::string note;

  double first() const { return us.empty() ? 0 : us.front(); }
  double median() const {
    if (us.empty()) return 0;
    std::vector<double> s = us;
    std::sort(s.begin(), s.end());
    return s[s.size() / 2];
  }
  double mean() const {
    return us.empty() ? 0 : std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
  }
  double min() const { return us.empty() ? 0 : *std::min_element(us.begin(), us.end()); }
};

std::deque<Row> g_rows;  // deque: add_row hands out references that must stay valid
std::vector<std::string> g_errors;

void check(const Status& status, const std::string& what) {
  if (status.is_ok()) return;
  g_errors.push_back(what + ": " + status.message());
  std::fprintf(stderr, "error: %s: %s\n", what.c_str(), status.message().c_str());
}

std::string size_label(std::size_t bytes) {
  char text[32];
  if (bytes >= kGiB && bytes % kGiB == 0) {
    std::snprintf(text, sizeof text, "%zu GiB", bytes / kGiB);
  } else if (bytes >= kMiB && bytes % kMiB == 0) {
    std::snprintf(text, sizeof text, "%zu MiB", bytes / kMiB);
  } else if (bytes >= kKiB && bytes % kKiB == 0) {
    std::snprintf(text, sizeof text, "%zu KiB", bytes / kKiB);
  } else {
    std::snprintf(text, sizeof text, "%zu B", bytes);
  }
  return text;
}

Row& add_row(const std::string& name, std::size_t bytes, std::string note = {}) {
  g_rows.push_back({name, bytes, {}, std::move(note)});
  return g_rows.back();
}

// --- VMM steps at one size: cuMemCreate; reserve + map + set access; unmap + release + free VA.
void measure_vmm_steps(VmmBackend& vmm, std::size_t bytes, int repetitions) {
  Row& create = add_row("vmm: cuMemCreate", bytes);
  Row& map = add_row("vmm: reserve + map + set access", bytes);
  Row& unmap = add_row("vmm: unmap + release + free VA", bytes);
  for (int i = 0; i < repetitions; ++i) {
    PhysicalHandle handle = 0;
    DevicePtr va = 0;
    auto t = Clock::now();
    check(vmm.create_physical(bytes, &handle), "create_physical");
    create.us.push_back(micros_since(t));
    t = Clock::now();
    check(vmm.reserve_address_range(bytes, &va), "reserve_address_range");
    const PhysicalHandle one[] = {handle};
    check(vmm.map_pages(va, bytes, one), "map_pages");
    map.us.push_back(micros_since(t));
    t = Clock::now();
    check(vmm.unmap_pages(va, bytes, 1), "unmap_pages");
    check(vmm.release_physical(handle), "release_physical");
    check(vmm.free_address_range(va, bytes), "free_address_range");
    unmap.us.push_back(micros_since(t));
  }
}

// --- A run of separately mapped pages: one set-access per run vs per page; batched vs per-page
// unmap.
void measure_page_runs(int device, std::size_t pages, int repetitions, bool batched_legal) {
  VmmBackend per_page(device, VmmBackend::UnmapMode::kPerPage);
  const std::size_t page = per_page.info().granularity;
  std::vector<PhysicalHandle> handles(pages);
  for (auto& h : handles) check(per_page.create_physical(page, &h), "create_physical");
  DevicePtr va = 0;
  check(per_page.reserve_address_range(pages * page, &va), "reserve_address_range");
  const DriverApi* api = nullptr;
  check(load_driver_api(&api), "load_driver_api");

  Row& map_run = add_row("vmm: map " + std::to_string(pages) + " pages, 1 set access", pages * page,
                         "map_pages: one cuMemMap per page, one cuMemSetAccess for the run");
  Row& map_each = add_row("vmm: map " + std::to_string(pages) + " pages, set access per page",
                          pages * page, "what a naive backend does");
  Row& unmap_each = add_row("vmm: unmap " + std::to_string(pages) + " pages, per page", pages * page);
  Row& maps_only = add_row("vmm: " + std::to_string(pages) + " x cuMemMap only", pages * page,
                           "raw driver calls, no access set");
  Row& access_only = add_row("vmm: 1 cuMemSetAccess over " + std::to_string(pages) + " pages",
                             pages * page, "raw driver call on the mapped run");
  Row* unmap_batched = batched_legal
                           ? &add_row("vmm: unmap " + std::to_string(pages) + " pages, 1 call",
                                      pages * page)
                           : nullptr;
  for (int i = 0; i < repetitions; ++i) {
    auto t = Clock::now();
    check(per_page.map_pages(va, page, handles), "map_pages");
    map_run.us.push_back(micros_since(t));
    t = Clock::now();
    check(per_page.unmap_pages(va, page, pages), "unmap_pages per page");
    unmap_each.us.push_back(micros_since(t));

    t = Clock::now();
    for (std::size_t p = 0; p < pages; ++p) {
      const PhysicalHandle one[] = {handles[p]};
      check(per_page.map_pages(va + p * page, page, one), "map_pages single");
    }
    map_each.us.push_back(micros_since(t));
    if (unmap_batched != nullptr && api != nullptr) {
      t = Clock::now();
      const CUresult r = api->mem_unmap(static_cast<CUdeviceptr>(va), pages * page);
      unmap_batched->us.push_back(micros_since(t));
      if (r != CUDA_SUCCESS) {
        g_errors.push_back("batched cuMemUnmap failed: " + std::to_string(static_cast<int>(r)));
        (void)per_page.unmap_pages(va, page, pages);
      }
    } else {
      check(per_page.unmap_pages(va, page, pages), "unmap_pages per page");
    }
  }
  // Split the cost of mapping a run into its two driver calls.
  for (int i = 0; api != nullptr && i < repetitions; ++i) {
    auto t = Clock::now();
    for (std::size_t p = 0; p < pages; ++p) {
      if (api->mem_map(static_cast<CUdeviceptr>(va + p * page), page, 0, handles[p], 0) !=
          CUDA_SUCCESS) {
        g_errors.push_back("raw cuMemMap failed");
      }
    }
    maps_only.us.push_back(micros_since(t));
    t = Clock::now();
    if (api->mem_set_access(static_cast<CUdeviceptr>(va), pages * page,
                            &per_page.properties().access, 1) != CUDA_SUCCESS) {
      g_errors.push_back("raw cuMemSetAccess failed");
    }
    access_only.us.push_back(micros_since(t));
    check(per_page.unmap_pages(va, page, pages), "unmap_pages per page");
  }
  for (auto h : handles) check(per_page.release_physical(h), "release_physical");
  check(per_page.free_address_range(va, pages * page), "free_address_range");
}

// --- What one chunk of the paged heap costs to map (cuMemMap + cuMemSetAccess) and unmap, by
// chunk size: is the cost per call or per byte? And does a map or an unmap wait for the GPU?
// A spin kernel keeps the GPU busy for 200 ms while the CPU maps and unmaps chunks elsewhere;
// if the calls waited for the GPU their time would include the kernel's.
void measure_chunks(VmmBackend& vmm, int repetitions) {
  const std::size_t page = vmm.info().granularity;
  for (std::size_t chunk : {page, 2 * page, 8 * page, 32 * page}) {
    PhysicalHandle handle = 0;
    check(vmm.create_physical(chunk, &handle), "create_physical");
    DevicePtr va = 0;
    check(vmm.reserve_address_range(chunk, &va), "reserve_address_range");
    Row& map = add_row("vmm: map 1 chunk (cuMemMap + cuMemSetAccess)", chunk,
                       "one physical allocation of this size");
    Row& unmap = add_row("vmm: unmap 1 chunk", chunk);
    const PhysicalHandle one[] = {handle};
    for (int i = 0; i < repetitions; ++i) {
      auto t = Clock::now();
      check(vmm.map_pages(va, chunk, one), "map_pages chunk");
      map.us.push_back(micros_since(t));
      t = Clock::now();
      check(vmm.unmap_pages(va, chunk, 1), "unmap_pages chunk");
      unmap.us.push_back(micros_since(t));
    }
    check(vmm.free_address_range(va, chunk), "free_address_range");
    check(vmm.release_physical(handle), "release_physical");
  }

  cudaStream_t busy = nullptr;
  (void)cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking);
  const std::size_t chunk = 8 * page;
  constexpr int kPairs = 20;
  std::vector<PhysicalHandle> handles(kPairs);
  for (auto& h : handles) check(vmm.create_physical(chunk, &h), "create_physical");
  DevicePtr va = 0;
  check(vmm.reserve_address_range(kPairs * chunk, &va), "reserve_address_range");
  Row& idle = add_row("vmm: 20 x (map + unmap 1 chunk), GPU idle", chunk);
  Row& busy_row = add_row("vmm: 20 x (map + unmap 1 chunk), GPU busy 200 ms", chunk,
                          "median far below 200000 us: the calls do not wait for the GPU");
  Row& still = add_row("vmm: GPU still busy after those calls (1 = yes)", chunk,
                       "cudaStreamQuery == cudaErrorNotReady right after the 20 pairs");
  for (int i = 0; i < repetitions; ++i) {
    for (int gpu_busy = 0; gpu_busy < 2; ++gpu_busy) {
      if (gpu_busy) check(gpu_test::spin(200'000'000, reinterpret_cast<std::uintptr_t>(busy)), "spin");
      const auto t = Clock::now();
      for (int k = 0; k < kPairs; ++k) {
        const PhysicalHandle one[] = {handles[k]};
        check(vmm.map_pages(va + k * chunk, chunk, one), "map_pages");
      }
      for (int k = 0; k < kPairs; ++k) check(vmm.unmap_pages(va + k * chunk, chunk, 1), "unmap");
      (gpu_busy ? busy_row : idle).us.push_back(micros_since(t));
      if (gpu_busy) {
        still.us.push_back(cudaStreamQuery(busy) == cudaErrorNotReady ? 1.0 : 0.0);
        (void)cudaStreamSynchronize(busy);
      }
    }
  }
  check(vmm.free_address_range(va, kPairs * chunk), "free_address_range");
  for (auto h : handles) check(vmm.release_physical(h), "release_physical");
  (void)cudaStreamDestroy(busy);
}

// --- One alloc + free pair, warm.
void measure_pairs(const std::string& name, std::size_t bytes, int repetitions,
                   const std::function<Status(std::size_t)>& pair) {
  Row& row = add_row(name, bytes);
  check(pair(bytes), name + " warm-up");
  for (int i = 0; i < repetitions; ++i) {
    const auto t = Clock::now();
    check(pair(bytes), name);
    row.us.push_back(micros_since(t));
  }
}

// --- Growing by `bytes` from nothing cached: cudaMalloc vs VMM in pages of `page` bytes
// (reserve VA, create every page, map each, one set access). Teardown is timed separately.
void measure_growth(VmmBackend& vmm, std::size_t bytes, int repetitions) {
  const std::size_t granularity = vmm.info().granularity;
  {
    Row& grow = add_row("grow: cudaMalloc", bytes, "first = first ever allocation of this size");
    Row& shrink = add_row("shrink: cudaFree", bytes);
    for (int i = 0; i < repetitions; ++i) {
      DevicePtr ptr = 0;
      auto t = Clock::now();
      check(vmm.allocate_segment(bytes, 0, &ptr), "cudaMalloc grow");
      grow.us.push_back(micros_since(t));
      t = Clock::now();
      check(vmm.free_segment(ptr, bytes, 0), "cudaFree shrink");
      shrink.us.push_back(micros_since(t));
    }
  }
  for (std::size_t page : {granularity, 64 * kMiB, bytes}) {
    if (page > bytes || bytes % page != 0) continue;
    const std::size_t count = bytes / page;
    Row& grow = add_row("grow: vmm, pages of " + size_label(page), bytes,
                        std::to_string(count) + " x cuMemCreate + cuMemMap, 1 cuMemSetAccess");
    Row& shrink = add_row("shrink: vmm, pages of " + size_label(page), bytes,
                          "per-page cuMemUnmap + cuMemRelease, free VA");
    for (int i = 0; i < repetitions; ++i) {
      std::vector<PhysicalHandle> handles(count);
      DevicePtr va = 0;
      auto t = Clock::now();
      check(vmm.reserve_address_range(bytes, &va), "grow reserve");
      for (auto& h : handles) check(vmm.create_physical(page, &h), "grow create");
      check(vmm.map_pages(va, page, handles), "grow map");
      grow.us.push_back(micros_since(t));
      t = Clock::now();
      check(vmm.unmap_pages(va, page, count), "shrink unmap");
      for (auto h : handles) check(vmm.release_physical(h), "shrink release");
      check(vmm.free_address_range(va, bytes), "shrink free VA");
      shrink.us.push_back(micros_since(t));
    }
  }
}

std::string json_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out;
}

int run(int argc, char** argv) {
  const char* json_path = nullptr;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      json_path = argv[i];
    }
  }
  const std::string reason = cuda_device_unavailable_reason();
  if (!reason.empty()) {
    std::printf("no CUDA device: %s (nothing measured)\n", reason.c_str());
    if (json_path != nullptr) {
      std::ofstream(json_path) << "{\"skipped\": \"no CUDA device: " << json_escape(reason)
                               << "\"}\n";
    }
    return 0;
  }
  constexpr int kDevice = 0;
  cudaDeviceProp prop{};
  (void)cudaGetDeviceProperties(&prop, kDevice);
  int driver_version = 0, runtime_version = 0;
  (void)cudaDriverGetVersion(&driver_version);
  (void)cudaRuntimeGetVersion(&runtime_version);
  VmmBackend vmm(kDevice);  // kAuto: probes batched unmap
  bool batched_legal = false;
  check(vmm.probe_batched_unmap(&batched_legal), "probe_batched_unmap");
  MallocAsyncBackend async(kDevice);
  const int reps = quick ? 5 : 30;

  // Growth first, while nothing of these sizes has been allocated yet ("from cold").
  measure_growth(vmm, 1 * kGiB, 3);
  measure_growth(vmm, 8 * kGiB, quick ? 1 : 3);
  for (std::size_t bytes : {2 * kMiB, 64 * kMiB, 256 * kMiB}) measure_vmm_steps(vmm, bytes, reps);
  measure_page_runs(kDevice, 32, reps, batched_legal);
  measure_chunks(vmm, quick ? 5 : 15);

  cudaStream_t stream = nullptr;
  (void)cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  const auto stream_handle = reinterpret_cast<StreamHandle>(stream);
  for (std::size_t bytes : {std::size_t{512}, 64 * kKiB, 1 * kMiB, 16 * kMiB, 256 * kMiB}) {
    measure_pairs("cudaMalloc + cudaFree", bytes, quick ? 20 : 200, [&](std::size_t b) {
      DevicePtr ptr = 0;
      Status s = vmm.allocate_segment(b, 0, &ptr);
      return s.is_ok() ? vmm.free_segment(ptr, b, 0) : s;
    });
  }
  for (std::size_t bytes : {std::size_t{512}, 64 * kKiB, 1 * kMiB, 16 * kMiB, 256 * kMiB}) {
    measure_pairs("cudaMallocFromPoolAsync + cudaFreeAsync (private pool)", bytes,
                  quick ? 200 : 10000, [&](std::size_t b) {
                    DevicePtr ptr = 0;
                    Status s = async.allocate_segment(b, stream_handle, &ptr);
                    return s.is_ok() ? async.free_segment(ptr, b, stream_handle) : s;
                  });
  }
  (void)cudaStreamSynchronize(stream);
  (void)cudaStreamDestroy(stream);

  // Table.
  std::printf("\nGPU: %s, driver %d, runtime %d, VMM granularity %s, batched cuMemUnmap: %s\n\n",
              prop.name, driver_version, runtime_version, size_label(vmm.info().granularity).c_str(),
              batched_legal ? "legal" : "refused");
  std::printf("%-58s %9s %6s %11s %11s %11s %11s\n", "operation", "size", "reps", "first us",
              "median us", "mean us", "min us");
  for (const Row& r : g_rows) {
    std::printf("%-58s %9s %6zu %11.2f %11.2f %11.2f %11.2f\n", r.name.c_str(),
                size_label(r.bytes).c_str(), r.us.size(), r.first(), r.median(), r.mean(),
                r.min());
  }
  for (const std::string& e : g_errors) std::printf("ERROR: %s\n", e.c_str());

  if (json_path != nullptr) {
    std::ofstream out(json_path);
    out << "{\n  \"gpu\": \"" << json_escape(prop.name) << "\",\n  \"driver_version\": "
        << driver_version << ",\n  \"runtime_version\": " << runtime_version
        << ",\n  \"total_bytes\": " << vmm.info().total_bytes
        << ",\n  \"granularity\": " << vmm.info().granularity
        << ",\n  \"batched_unmap_legal\": " << (batched_legal ? "true" : "false")
        << ",\n  \"results\": [\n";
    for (std::size_t i = 0; i < g_rows.size(); ++i) {
      const Row& r = g_rows[i];
      out << "    {\"name\": \"" << json_escape(r.name) << "\", \"bytes\": " << r.bytes
          << ", \"reps\": " << r.us.size() << ", \"first_us\": " << r.first()
          << ", \"median_us\": " << r.median() << ", \"mean_us\": " << r.mean()
          << ", \"min_us\": " << r.min() << ", \"note\": \"" << json_escape(r.note) << "\"}"
          << (i + 1 < g_rows.size() ? "," : "") << "\n";
    }
    out << "  ],\n  \"errors\": [";
    for (std::size_t i = 0; i < g_errors.size(); ++i) {
      out << (i ? ", " : "") << "\"" << json_escape(g_errors[i]) << "\"";
    }
    out << "]\n}\n";
  }
  return g_errors.empty() ? 0 : 1;
}

}  // namespace
}  // namespace vramledger

int main(int argc, char** argv) {
  try {
    return vramledger::run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "gpu_backend_costs: %s\n", error.what());
    return 2;
  }
}
