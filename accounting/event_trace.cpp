#include "accounting/event_trace.hpp"

#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <utility>

#include "allocator/errors.hpp"

#if defined(__linux__)
#include <sys/mman.h>
#endif

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
      records_(capacity == 0 ? nullptr : allocate_ring(capacity)),
      clock_(clock),
      origin_(capture_clock_origin(clock)) {}

TraceRecord* EventTrace::allocate_ring(std::size_t capacity) {
  const std::size_t bytes = capacity * sizeof(TraceRecord);
  void* ring = ::operator new(bytes, std::align_val_t{kRingAlignment});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  // Advice only: without transparent huge pages (or with them off) nothing changes. The first
  // 2 MiB (37,449 records) keep small pages, so a short-lived ledger (a test, a fuzz input)
  // does not zero a huge page for its few records.
  const std::size_t advised = bytes - bytes % kRingAlignment;
  if (advised > kRingAlignment) {
    (void)madvise(static_cast<char*>(ring) + kRingAlignment, advised - kRingAlignment,
                  MADV_HUGEPAGE);
  }
#endif
  return static_cast<TraceRecord*>(ring);
}

EventTrace::Reservation EventTrace::reserve(std::size_t count) noexcept {
  wait_for_fills_below(count);
  if (filling_.load(std::memory_order_acquire) == 0) fill_window_start_ = appended_;
  filling_.fetch_add(1, std::memory_order_relaxed);
  Reservation slots;
  slots.filling_ = &filling_;
  const std::size_t first = std::min(count, capacity_ - next_slot_);
  slots.runs_[0] = records_.get() + next_slot_;
  slots.counts_[0] = first;
  if (first < count) {
    slots.runs_[1] = records_.get();
    slots.counts_[1] = count - first;
  }
  appended_ += count;
  next_slot_ += count;
  if (next_slot_ >= capacity_) next_slot_ -= capacity_;
  return slots;
}

void EventTrace::fill(Reservation& slots, const TraceRecord* records) noexcept {
  if (slots.filling_ == nullptr) return;
  copy_past_caches(slots.runs_[0], records, slots.counts_[0]);
  if (slots.counts_[1] > 0) {
    copy_past_caches(slots.runs_[1], records + slots.counts_[0], slots.counts_[1]);
  }
  // Release: whoever sees the count drop (a writer about to reuse the slots) sees the records.
  slots.filling_->fetch_sub(1, std::memory_order_release);
  slots = Reservation{};
}

void EventTrace::wait_for_fills() noexcept {
  while (filling_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void EventTrace::prefault() noexcept {
  if (capacity_ == 0) return;
  wait_for_fills();
  // Zero bytes are a valid TraceRecord (an implicit-lifetime aggregate); nothing reads a slot
  // before append() has written it.
  std::memset(static_cast<void*>(records_.get()), 0, capacity_ * sizeof(TraceRecord));
}

// A fill in flight writes through the source's storage and counts down the source's `filling_`:
// moving waits for it (a moved ledger is not allocating anyway).
EventTrace::EventTrace(EventTrace&& other) noexcept
    : capacity_((other.wait_for_fills(), std::exchange(other.capacity_, 0))),
      records_(std::move(other.records_)),
      next_slot_(std::exchange(other.next_slot_, 0)),
      appended_(std::exchange(other.appended_, 0)),
      clock_(other.clock_),
      origin_(other.origin_) {}

EventTrace& EventTrace::operator=(EventTrace&& other) noexcept {
  if (this != &other) {
    wait_for_fills();
    other.wait_for_fills();
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
  wait_for_fills();
  next_slot_ = 0;
  appended_ = 0;
}

}  // namespace vramledger
