#include "allocator/cuda/pinned_host_memory.hpp"

#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "allocator/cuda/cuda_status.hpp"
#include "allocator/text_format.hpp"

namespace vramledger {

namespace {

constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kSmallPage = 4096;

// Registered mappings and their lengths (free_pinned must tell them from cudaHostAlloc memory).
std::mutex& registered_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::map<void*, std::size_t>& registered() {
  static auto* mappings = new std::map<void*, std::size_t>;  // outlives static destructors
  return *mappings;
}

}  // namespace

// The default is register: on the H200 (bench/sleep, 2026-12-01, 1af113d) the first sleep that
// offloads 8 GiB took 0.62 s with it against 3.61 s with cudaHostAlloc, the copy alone ~0.2 s.
PinMethod pin_method_from_environment() {
  const char* value = std::getenv("VRAMLEDGER_SLEEP_PIN");
  const std::string_view text = value == nullptr ? std::string_view() : std::string_view(value);
  if (text.empty() || text == "register") return PinMethod::kRegister;
  if (text == "host_alloc") return PinMethod::kHostAlloc;
  throw Error(ErrorCode::kInvalidArgument,
              "VRAMLEDGER_SLEEP_PIN='" + std::string(text) +
                  "': expected 'host_alloc' (cudaHostAlloc) or 'register' (huge pages faulted "
                  "in parallel, then cudaHostRegister)");
}

std::string to_string(PinMethod method) {
  return method == PinMethod::kRegister ? "register" : "host_alloc";
}

unsigned default_pin_threads() {
  if (const char* value = std::getenv("VRAMLEDGER_SLEEP_PIN_THREADS")) {
    const long threads = std::strtol(value, nullptr, 10);
    if (threads >= 1 && threads <= 256) return static_cast<unsigned>(threads);
  }
  return std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
}

void* map_prefaulted(std::size_t bytes, unsigned threads) {
  const std::size_t length = (std::max<std::size_t>(bytes, 1) + kHugePage - 1) / kHugePage * kHugePage;
  void* data = mmap(nullptr, length, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (data == MAP_FAILED) return nullptr;
  // Advice only: without transparent huge pages the faults below are 4 KiB ones.
  (void)madvise(data, length, MADV_HUGEPAGE);
  // Whole huge pages per thread, so no two threads fault the same one.
  const std::size_t pages = length / kHugePage;
  const std::size_t workers = std::clamp<std::size_t>(threads, 1, pages);
  auto touch = [data, pages, workers](std::size_t worker) {
    auto* bytes_of = static_cast<volatile char*>(data);
    const std::size_t first = pages * worker / workers;
    const std::size_t last = pages * (worker + 1) / workers;
    for (std::size_t at = first * kHugePage; at < last * kHugePage; at += kSmallPage) {
      bytes_of[at] = 0;
    }
  };
  std::vector<std::thread> helpers;
  try {
    for (std::size_t worker = 1; worker < workers; ++worker) helpers.emplace_back(touch, worker);
  } catch (const std::system_error&) {
    // Fewer threads than asked: the calling thread faults what the missing ones would have.
    for (std::size_t worker = helpers.size() + 1; worker < workers; ++worker) touch(worker);
  }
  touch(0);
  for (std::thread& helper : helpers) helper.join();
  return data;
}

void unmap_prefaulted(void* data, std::size_t bytes) {
  const std::size_t length = (std::max<std::size_t>(bytes, 1) + kHugePage - 1) / kHugePage * kHugePage;
  (void)munmap(data, length);
}

Status allocate_pinned(std::size_t bytes, PinMethod method, void** out) {
  if (method == PinMethod::kHostAlloc) {
    return runtime_status(cudaHostAlloc(out, bytes == 0 ? 1 : bytes, cudaHostAllocDefault),
                          "cudaHostAlloc", "bytes=" + std::to_string(bytes));
  }
  void* data = map_prefaulted(bytes, default_pin_threads());
  if (data == nullptr) {
    return {ErrorCode::kOutOfMemory, "mmap of " + format_bytes_exact(bytes) +
                                         " of host memory for offloading: " +
                                         std::strerror(errno)};
  }
  const std::size_t length = (std::max<std::size_t>(bytes, 1) + kHugePage - 1) / kHugePage * kHugePage;
  Status status = runtime_status(cudaHostRegister(data, length, cudaHostRegisterDefault),
                                 "cudaHostRegister", "bytes=" + std::to_string(length));
  if (!status.is_ok()) {
    unmap_prefaulted(data, bytes);
    return status;
  }
  try {
    const std::lock_guard lock(registered_mutex());
    registered().emplace(data, bytes);
  } catch (const std::bad_alloc&) {
    (void)cudaHostUnregister(data);
    unmap_prefaulted(data, bytes);
    return {ErrorCode::kOutOfMemory, "no host memory to record a pinned mapping"};
  }
  *out = data;
  return Status::ok();
}

Status free_pinned(void* host) {
  std::size_t bytes = 0;
  bool mapped = false;
  {
    const std::lock_guard lock(registered_mutex());
    const auto it = registered().find(host);
    if (it != registered().end()) {
      bytes = it->second;
      mapped = true;
      registered().erase(it);
    }
  }
  if (!mapped) {
    return runtime_status(cudaFreeHost(host), "cudaFreeHost",
                          "host=" + describe_address(reinterpret_cast<std::uintptr_t>(host)));
  }
  const Status status = runtime_status(cudaHostUnregister(host), "cudaHostUnregister",
                                       "host=" + describe_address(
                                                     reinterpret_cast<std::uintptr_t>(host)));
  // Still registered: the driver may yet touch it, so the mapping is left in place (leaked).
  if (status.is_ok()) unmap_prefaulted(host, bytes);
  return status;
}

}  // namespace vramledger
