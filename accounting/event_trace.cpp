#include "accounting/event_trace.hpp"

#include <limits>
#include <string>
#include <utility>

#include "allocator/errors.hpp"

namespace vramledger {
namespace {

std::size_t checked_capacity(std::size_t capacity) {
  if (capacity > std::numeric_limits<std::size_t>::max() / sizeof(TraceRecord)) {
    throw Error(ErrorCode::kInvalidArgument,
                "event trace capacity " + std::to_string(capacity) + " records is too large");
  }
  return capacity;
}

}  // namespace

EventTrace::EventTrace(std::size_t capacity, ClockSource clock)
    : capacity_(checked_capacity(capacity)),
      // Raw storage, not new TraceRecord[]: constructing a million records would touch every
      // page up front. TraceRecord is an implicit-lifetime aggregate, so slots come to life when
      // append() assigns them.
      records_(capacity == 0 ? nullptr
                                     : static_cast<TraceRecord*>(
                                           ::operator new(capacity * sizeof(TraceRecord)))),
      clock_(clock),
      origin_(capture_clock_origin(clock)) {}

EventTrace::EventTrace(EventTrace&& other) noexcept
    : capacity_(std::exchange(other.capacity_, 0)),
      records_(std::move(other.records_)),
      next_slot_(std::exchange(other.next_slot_, 0)),
      appended_(std::exchange(other.appended_, 0)),
      clock_(other.clock_),
      origin_(other.origin_) {}

EventTrace& EventTrace::operator=(EventTrace&& other) noexcept {
  if (this != &other) {
    capacity_ = std::exchange(other.capacity_, 0);
    records_ = std::move(other.records_);
    next_slot_ = std::exchange(other.next_slot_, 0);
    appended_ = std::exchange(other.appended_, 0);
    clock_ = other.clock_;
    origin_ = other.origin_;
  }
  return *this;
}

std::vector<TraceRecord> EventTrace::to_vector() const {
  std::vector<TraceRecord> copy;
  copy.reserve(size());
  for (const TraceRecord& record : *this) copy.push_back(record);
  return copy;
}

void EventTrace::clear() noexcept {
  next_slot_ = 0;
  appended_ = 0;
}

}  // namespace vramledger
