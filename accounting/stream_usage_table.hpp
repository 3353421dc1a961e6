// Per-stream usage with no allocation and no hashing of strings on the hot path: a fixed
// open-addressed table keyed by the stream handle, with the last hit checked first (most
// programs allocate on one or two streams). Streams beyond its capacity share one overflow entry.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "accounting/ledger_counters.hpp"

namespace vramledger {

class StreamUsageTable {
 public:
  static constexpr std::size_t kCapacity = 64;  // power of two

  UsageStats& usage_of(StreamHandle stream) noexcept {
    if (last_hit_->in_use && last_hit_->stream == stream) [[likely]] return last_hit_->usage;
    return usage_of_slow(stream);
  }

  // The entry's position: 0 .. kCapacity-1 for a slot, kCapacity for the overflow entry (the
  // ledger keeps per-entry figures of its front-cache shards beside the table).
  std::size_t index_of(const UsageStats& usage) const noexcept {
    if (&usage == &overflow_.usage) return kCapacity;
    return static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(&usage) -
                                    reinterpret_cast<std::uintptr_t>(&slots_[0].usage)) /
           sizeof(Slot);
  }

  UsageStats& at(std::size_t index) noexcept {
    return index == kCapacity ? overflow_.usage : slots_[index].usage;
  }
  const UsageStats& at(std::size_t index) const noexcept {
    return index == kCapacity ? overflow_.usage : slots_[index].usage;
  }

  // Entries that have seen a stream, in slot order, then the overflow entry if used.
  std::vector<StreamUsage> entries() const;
  template <typename Visit>
  void for_each_usage(Visit visit) noexcept {
    for (Slot& slot : slots_) visit(slot.usage);
    visit(overflow_.usage);
  }

 private:
  struct Slot {
    StreamHandle stream = 0;
    bool in_use = false;
    UsageStats usage;
  };

  UsageStats& usage_of_slow(StreamHandle stream) noexcept;

  std::array<Slot, kCapacity> slots_{};
  Slot overflow_{};
  Slot* last_hit_ = &slots_[0];
};

}  // namespace vramledger
