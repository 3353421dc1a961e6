// Live blocks by start address: an open-addressing table with linear probing and backward-shift
// deletion, so lookups on the free path touch one or two cache lines and never allocate.
// AddressMap<T> maps addresses to any T* (the front caches' FrontBlock, thread_cache.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "allocator/detail/block.hpp"

namespace vramledger {

template <typename T>
class AddressMap {
 public:
  static constexpr std::size_t kDefaultCapacity = 1024;
  // `initial_capacity`: a power of two.
  explicit AddressMap(std::size_t initial_capacity = kDefaultCapacity) {
    slots_.resize(initial_capacity);
  }

  T* find(DevicePtr address) const {
    for (std::size_t i = home(address);; i = (i + 1) & mask()) {
      const Slot& s = slots_[i];
      if (s.block == nullptr) return nullptr;
      if (s.address == address) return s.block;
    }
  }

  void insert(DevicePtr address, T* block) {
    if ((size_ + 1) * 4 > slots_.size() * 3) grow();
    place(address, block);
    ++size_;
  }

  // Returns the block that was stored, or nullptr when the address is unknown.
  T* erase(DevicePtr address) {
    std::size_t i = home(address);
    for (;; i = (i + 1) & mask()) {
      if (slots_[i].block == nullptr) return nullptr;
      if (slots_[i].address == address) break;
    }
    T* erased = slots_[i].block;
    // Backward shift: pull later entries of the probe run into the hole.
    std::size_t hole = i;
    for (std::size_t j = (i + 1) & mask(); slots_[j].block != nullptr; j = (j + 1) & mask()) {
      const std::size_t want = home(slots_[j].address);
      // Move j into the hole unless its home lies cyclically in (hole, j].
      const bool home_after_hole =
          hole <= j ? (want > hole && want <= j) : (want > hole || want <= j);
      if (!home_after_hole) {
        slots_[hole] = slots_[j];
        hole = j;
      }
    }
    slots_[hole] = Slot{};
    --size_;
    return erased;
  }

  std::size_t size() const { return size_; }

  template <typename Visitor>
  void for_each(Visitor&& visit) const {
    for (const Slot& s : slots_) {
      if (s.block != nullptr) visit(s.block);
    }
  }

 private:
  struct Slot {
    DevicePtr address = 0;
    T* block = nullptr;
  };

  std::size_t mask() const { return slots_.size() - 1; }
  std::size_t home(DevicePtr address) const {
    // Addresses are at least 512-byte aligned: drop those bits, then mix.
    return static_cast<std::size_t>(((address >> 9) * 0x9E3779B97F4A7C15ull) >> 20) & mask();
  }
  void place(DevicePtr address, T* block) {
    std::size_t i = home(address);
    while (slots_[i].block != nullptr) i = (i + 1) & mask();
    slots_[i] = Slot{address, block};
  }
  void grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old) {
      if (s.block != nullptr) place(s.address, s.block);
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

using BlockAddressMap = AddressMap<Block>;

}  // namespace vramledger
