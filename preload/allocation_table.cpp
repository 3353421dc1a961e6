#include "preload/allocation_table.hpp"

#include <atomic>

namespace vramledger::preload {
namespace {

struct Slot {
  std::uint64_t key;
  std::uint64_t bytes;
  std::uint8_t kind;  // 0: empty
  std::uint8_t category;
  bool routed;
};

Slot g_slots[AllocationTable::kCapacity];
std::size_t g_live = 0;
std::atomic<bool> g_locked{false};

class SpinGuard {
 public:
  SpinGuard() {
    while (g_locked.exchange(true, std::memory_order_acquire)) {
      while (g_locked.load(std::memory_order_relaxed)) cpu_relax();
    }
  }
  ~SpinGuard() { g_locked.store(false, std::memory_order_release); }
  SpinGuard(const SpinGuard&) = delete;
  SpinGuard& operator=(const SpinGuard&) = delete;

 private:
  static void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
};

constexpr std::size_t kMask = AllocationTable::kCapacity - 1;

std::size_t home_of(KeyKind kind, std::uint64_t key) {
  // Device addresses are aligned; mix the high bits in (splitmix64 finaliser).
  std::uint64_t h = key ^ (static_cast<std::uint64_t>(kind) << 62);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  h ^= h >> 31;
  return static_cast<std::size_t>(h) & kMask;
}

}  // namespace

bool AllocationTable::insert(KeyKind kind, std::uint64_t key, AllocationRecord record) {
  SpinGuard guard;
  std::size_t index = home_of(kind, key);
  for (std::size_t probes = 0; probes < kCapacity; ++probes, index = (index + 1) & kMask) {
    Slot& slot = g_slots[index];
    if (slot.kind == 0) {
      if (g_live + 1 >= kCapacity) return false;  // keep one empty slot so probes terminate
      slot = Slot{key, record.bytes, static_cast<std::uint8_t>(kind),
                  static_cast<std::uint8_t>(record.category), record.routed};
      ++g_live;
      return true;
    }
    if (slot.kind == static_cast<std::uint8_t>(kind) && slot.key == key) {
      slot.bytes = record.bytes;
      slot.category = static_cast<std::uint8_t>(record.category);
      slot.routed = record.routed;
      return false;
    }
  }
  return false;
}

bool AllocationTable::erase(KeyKind kind, std::uint64_t key, AllocationRecord* out) {
  SpinGuard guard;
  std::size_t index = home_of(kind, key);
  for (std::size_t probes = 0; probes < kCapacity; ++probes, index = (index + 1) & kMask) {
    Slot& slot = g_slots[index];
    if (slot.kind == 0) return false;
    if (slot.kind != static_cast<std::uint8_t>(kind) || slot.key != key) continue;
    out->bytes = slot.bytes;
    out->category = static_cast<Category>(slot.category);
    out->routed = slot.routed;
    // Backward shift: move later entries of the probe run into the hole when their home
    // position allows it, so lookups never need tombstones.
    std::size_t hole = index;
    std::size_t next = (hole + 1) & kMask;
    while (g_slots[next].kind != 0) {
      const std::size_t home =
          home_of(static_cast<KeyKind>(g_slots[next].kind), g_slots[next].key);
      // The entry may move to the hole iff its home is not cyclically in (hole, next].
      const bool home_after_hole = ((next - home) & kMask) < ((next - hole) & kMask);
      if (!home_after_hole) {
        g_slots[hole] = g_slots[next];
        hole = next;
      }
      next = (next + 1) & kMask;
    }
    g_slots[hole] = Slot{};
    --g_live;
    return true;
  }
  return false;
}

std::size_t AllocationTable::live() const {
  SpinGuard guard;
  return g_live;
}

AllocationTable& allocation_table() {
  static AllocationTable table;  // stateless façade over the static slots
  return table;
}

}  // namespace vramledger::preload
