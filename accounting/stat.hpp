// One statistic with torch's meaning: the current value, its high-water mark since the last
// peak reset, and running totals of every increase and decrease since the last accumulated reset.
#pragma once

#include <cstdint>

namespace vramledger {

struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;  // sum of every increase
  std::int64_t freed = 0;      // sum of every decrease

  void increase(std::int64_t amount) noexcept {
    current += amount;
    allocated += amount;
    // A branch, not std::max: peaks rarely move in steady state, and skipping the store matters
    // on the ledger's hot path (stores, not arithmetic, bound it).
    if (current > peak) peak = current;
  }
  // Never clamps: a negative current value is the caller's evidence of a missing event.
  void decrease(std::int64_t amount) noexcept {
    current -= amount;
    freed += amount;
  }
  void reset_peak() noexcept { peak = current; }
  void reset_accumulated() noexcept {
    allocated = 0;
    freed = 0;
  }

  friend bool operator==(const Stat&, const Stat&) = default;
};

}  // namespace vramledger
