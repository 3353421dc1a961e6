#include "allocator/simulated/fault_injector.hpp"

#include <string>

namespace vramledger {

std::size_t FaultInjector::index_of(SimOp op) {
  const auto index = static_cast<std::size_t>(op);
  if (index >= kSimOpCount) {
    throw Error(ErrorCode::kInvalidArgument,
                "fault injection needs a real operation, not SimOp::kCount");
  }
  return index;
}

void FaultInjector::fail_at(SimOp op, std::uint64_t nth_call_from_now, ErrorCode code) {
  PerOp& per_op = ops_[index_of(op)];
  if (nth_call_from_now == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "inject_failure_at(" + std::string(to_string(op)) +
                    "): nth_call_from_now counts from 1 (1 = the next call), got 0");
  }
  if (code == ErrorCode::kOk) {
    throw Error(ErrorCode::kInvalidArgument,
                "inject_failure_at(" + std::string(to_string(op)) + "): cannot inject 'ok'");
  }
  per_op.one_shots.emplace(per_op.calls_seen + nth_call_from_now, code);
}

void FaultInjector::fail_at_rate(SimOp op, double fraction, std::uint64_t seed, ErrorCode code) {
  PerOp& per_op = ops_[index_of(op)];
  // Written so that NaN fails the check too.
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    throw Error(ErrorCode::kInvalidArgument, "inject_failure_rate(" + std::string(to_string(op)) +
                                                 "): fraction must lie in [0, 1], got " +
                                                 std::to_string(fraction));
  }
  if (code == ErrorCode::kOk) {
    throw Error(ErrorCode::kInvalidArgument,
                "inject_failure_rate(" + std::string(to_string(op)) + "): cannot inject 'ok'");
  }
  per_op.rate = Rate{fraction, std::mt19937_64(seed), code};
}

void FaultInjector::clear() {
  for (PerOp& per_op : ops_) {
    per_op.one_shots.clear();
    per_op.rate.reset();
  }
}

ErrorCode FaultInjector::on_call(SimOp op) {
  PerOp& per_op = ops_[index_of(op)];
  const std::uint64_t call_number = ++per_op.calls_seen;
  ErrorCode code = ErrorCode::kOk;
  if (auto it = per_op.one_shots.find(call_number); it != per_op.one_shots.end()) {
    code = it->second;  // the earliest armed wins; one call can fail only once
    per_op.one_shots.erase(call_number);
  } else if (per_op.rate) {
    // 53 random bits to a double in [0, 1): the same sequence on every standard library,
    // unlike std::uniform_real_distribution.
    const double draw = static_cast<double>(per_op.rate->engine() >> 11) * 0x1.0p-53;
    if (draw < per_op.rate->fraction) code = per_op.rate->code;
  }
  if (code != ErrorCode::kOk) ++per_op.injected;
  return code;
}

std::uint64_t FaultInjector::injected_count(SimOp op) const {
  return ops_[index_of(op)].injected;
}

void FaultInjector::reset_injected_counts() {
  for (PerOp& per_op : ops_) per_op.injected = 0;
}

}  // namespace vramledger
