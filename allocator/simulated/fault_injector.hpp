// Decides which simulated driver calls fail on purpose: one-shot failures at the n-th call of an
// operation, and random failures at a given rate from a seeded generator (reproducible runs).
// Not synchronised: SimulatedDevice calls it under its own lock.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <random>

#include "allocator/errors.hpp"
#include "allocator/simulated/sim_op.hpp"

namespace vramledger {

class FaultInjector {
 public:
  // The nth_call_from_now-th next call of `op` (1 = the very next) fails with `code`, once.
  // Several armed at the same call make that one call fail (with the code armed first).
  // Throws Error(kInvalidArgument) for nth_call_from_now == 0, op == kCount or code == kOk.
  void fail_at(SimOp op, std::uint64_t nth_call_from_now, ErrorCode code);
  // From now on each call of `op` fails with probability `fraction` (replaces an earlier rate).
  // Throws Error(kInvalidArgument) unless 0 <= fraction <= 1, and for op == kCount or kOk.
  void fail_at_rate(SimOp op, double fraction, std::uint64_t seed, ErrorCode code);
  // Disarms every pending failure; the injected counts are kept.
  void clear();

  // Called once per call of `op`: returns the code the call must fail with, or kOk.
  ErrorCode on_call(SimOp op);

  std::uint64_t injected_count(SimOp op) const;
  void reset_injected_counts();

 private:
  struct Rate {
    double fraction = 0.0;
    std::mt19937_64 engine;
    ErrorCode code = ErrorCode::kDriverError;
  };
  struct PerOp {
    std::uint64_t calls_seen = 0;  // never reset, so armed call numbers stay valid
    std::multimap<std::uint64_t, ErrorCode> one_shots;  // by absolute call number
    std::optional<Rate> rate;
    std::uint64_t injected = 0;
  };

  static std::size_t index_of(SimOp op);

  std::array<PerOp, kSimOpCount> ops_;
};

}  // namespace vramledger
