#include "accounting/stream_usage_table.hpp"

#include <cstdint>

namespace vramledger {

UsageStats& StreamUsageTable::usage_of_slow(StreamHandle stream) noexcept {
  // Fibonacci hashing: stream handles are pointers, so their low bits are mostly alignment.
  constexpr unsigned kIndexBits = 6;
  static_assert((std::size_t{1} << kIndexBits) == kCapacity);
  const auto key = static_cast<std::uint64_t>(stream);
  std::size_t index = static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> (64 - kIndexBits));
  for (std::size_t probe = 0; probe < kCapacity; ++probe) {
    Slot& slot = slots_[index];
    if (!slot.in_use) {
      slot.in_use = true;
      slot.stream = stream;
      last_hit_ = &slot;
      return slot.usage;
    }
    if (slot.stream == stream) {
      last_hit_ = &slot;
      return slot.usage;
    }
    index = (index + 1) & (kCapacity - 1);
  }
  overflow_.in_use = true;
  return overflow_.usage;  // not cached as last hit: the overflow entry stands for many streams
}

std::vector<StreamUsage> StreamUsageTable::entries() const {
  std::vector<StreamUsage> result;
  for (const Slot& slot : slots_) {
    if (slot.in_use) result.push_back({slot.stream, false, slot.usage});
  }
  if (overflow_.in_use) result.push_back({0, true, overflow_.usage});
  return result;
}

}  // namespace vramledger
