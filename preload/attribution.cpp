#include "preload/attribution.hpp"

#include <dlfcn.h>

#include <atomic>
#include <cstdint>

namespace vramledger::preload {
namespace {

// Direct-mapped: one 64-bit word per slot holding (address << 8) | (category + 1), so a reader
// sees either a whole entry or none. User-space addresses fit in 56 bits on x86-64 and aarch64.
// A code range reused by a different object after dlclose could keep a stale category: accepted,
// call sites of memory functions are not unloaded in the programs this targets.
constexpr int kCacheSlots = 1024;
std::atomic<std::uint64_t> g_cache[kCacheSlots];

std::uint64_t slot_of(std::uintptr_t address) {
  return (address ^ (address >> 12)) % kCacheSlots;
}

}  // namespace

Category category_of_caller(const void* return_address) {
  const auto address = reinterpret_cast<std::uintptr_t>(return_address);
  auto& slot = g_cache[slot_of(address)];
  const std::uint64_t cached = slot.load(std::memory_order_relaxed);
  if (cached != 0 && (cached >> 8) == address) {
    return static_cast<Category>((cached & 0xff) - 1);
  }
  Dl_info info{};
  // dladdr takes the loader's lock for reading and allocates nothing.
  const Category category = dladdr(return_address, &info) != 0
                                ? classify_object_path(info.dli_fname ? info.dli_fname : "")
                                : classify_object_path(nullptr);
  if ((address >> 56) == 0) {
    slot.store((static_cast<std::uint64_t>(address) << 8) | (category + 1),
               std::memory_order_relaxed);
  }
  return category;
}

}  // namespace vramledger::preload
