// Always-on event log: a bounded ring of fixed-size records. Appending never allocates; when the
// ring is full the oldest record is overwritten and counted as dropped.
//
// Not synchronised: appends come from the ledger under the allocator's lock, and readers must
// hold that lock too (or read while nothing allocates).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <memory>
#include <new>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "accounting/cheap_clock.hpp"
#include "accounting/trace_record.hpp"

namespace vramledger {

class EventTrace {
 public:
  static constexpr std::size_t kDefaultCapacity = std::size_t{1} << 20;  // 48 MiB of address space
  static constexpr std::uintptr_t kPrefetchBytesAhead = 512;

  // capacity 0 disables recording (every event counts as dropped). Memory is reserved up front
  // but the pages are only touched as records are written.
  // `clock` is the source of the ticks passed to append(); the trace only keeps it, with an
  // origin, so that files can convert ticks to time. Throws Error(kInvalidArgument) when
  // capacity records do not fit in the address space.
  explicit EventTrace(std::size_t capacity = kDefaultCapacity,
                      ClockSource clock = ClockSource::kCoarseMonotonic);
  EventTrace(const EventTrace&) = delete;
  EventTrace& operator=(const EventTrace&) = delete;
  // A moved-from trace has capacity 0: it keeps counting appends but records nothing.
  EventTrace(EventTrace&& other) noexcept;
  EventTrace& operator=(EventTrace&& other) noexcept;

  void append(const AllocatorEvent& event, std::uint64_t ticks) noexcept {
    ++appended_;
    if (capacity_ == 0) [[unlikely]] return;
    // Field by field into the slot: building the record on the stack first and copying it made
    // the compiler reload it with wide loads that stall on store forwarding.
    TraceRecord& slot = records_.get()[next_slot_];
    // A ring larger than the caches misses on every new line; asking for the line a few hundred
    // bytes ahead keeps those misses off the store buffer. (A hint: never faults, even past the
    // end of the ring.)
    __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<std::uintptr_t>(&slot) +
                                                     kPrefetchBytesAhead),
                       1);
    slot.time_ticks = ticks;
    slot.address = event.address;
    slot.size = event.size;
    slot.requested = event.requested;
    slot.stream = event.stream;
    slot.kind = event.kind;
    slot.pool = event.pool;
    slot.tag = event.tag;
    slot.inactive_split_delta = event.inactive_split_delta;
    slot.inactive_split_bytes_delta = event.inactive_split_bytes_delta;
    if (++next_slot_ == capacity_) next_slot_ = 0;  // compare, not modulo: no division
  }

  // `count` records made elsewhere (a ledger shard's staged records), in order: one or two block
  // copies into the ring instead of a field-by-field append each.
  void append_records(const TraceRecord* records, std::size_t count) noexcept {
    appended_ += count;
    if (capacity_ == 0) [[unlikely]] return;
    while (count > 0) {
      // Past a full ring only the newest `capacity_` survive; copying them is enough.
      const std::size_t run = std::min(count, capacity_ - next_slot_);
      copy_past_caches(records_.get() + next_slot_, records, run);
      records += run;
      count -= run;
      next_slot_ += run;
      if (next_slot_ == capacity_) next_slot_ = 0;
    }
  }

  std::size_t capacity() const noexcept { return capacity_; }
  // Records held now (oldest first through operator[] and iteration).
  std::size_t size() const noexcept {
    return appended_ < capacity_ ? static_cast<std::size_t>(appended_) : capacity_;
  }
  std::uint64_t appended() const noexcept { return appended_; }  // ever, including dropped
  std::uint64_t dropped() const noexcept { return appended_ - size(); }
  // Sequence number (0-based position in the whole event stream) of the oldest held record.
  std::uint64_t first_sequence() const noexcept { return dropped(); }
  ClockSource clock_source() const noexcept { return clock_; }
  const ClockOrigin& clock_origin() const noexcept { return origin_; }

  const TraceRecord& operator[](std::size_t index) const noexcept {
    std::size_t slot = oldest_slot() + index;
    if (slot >= capacity_) slot -= capacity_;
    return records_.get()[slot];
  }

  class Iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = TraceRecord;
    using difference_type = std::ptrdiff_t;
    using pointer = const TraceRecord*;
    using reference = const TraceRecord&;

    Iterator() = default;
    Iterator(const EventTrace* trace, std::size_t index) : trace_(trace), index_(index) {}
    reference operator*() const noexcept { return (*trace_)[index_]; }
    pointer operator->() const noexcept { return &(*trace_)[index_]; }
    Iterator& operator++() noexcept {
      ++index_;
      return *this;
    }
    Iterator operator++(int) noexcept {
      Iterator before = *this;
      ++index_;
      return before;
    }
    friend bool operator==(const Iterator& a, const Iterator& b) noexcept {
      return a.trace_ == b.trace_ && a.index_ == b.index_;
    }

   private:
    const EventTrace* trace_ = nullptr;
    std::size_t index_ = 0;
  };
  Iterator begin() const noexcept { return {this, 0}; }
  Iterator end() const noexcept { return {this, size()}; }

  // Copies the held records, oldest first.
  std::vector<TraceRecord> to_vector() const;
  // Forgets every record and the drop count; capacity and clock origin stay.
  void clear() noexcept;
  // Touches every page of the ring now, as a process past its first `capacity` events has them:
  // for benchmarks of the steady state (the pages are otherwise faulted in as records arrive).
  void prefault() noexcept;

 private:
  std::size_t oldest_slot() const noexcept { return appended_ > capacity_ ? next_slot_ : 0; }
  // A batch goes to the ring with non-temporal stores: the ring is larger than the caches, so an
  // ordinary copy first reads each line it overwrites from memory and then evicts useful lines;
  // streamed, a line is written once. The fence orders them before the ledger's unlock.
  static void copy_past_caches(TraceRecord* to, const TraceRecord* from, std::size_t count) noexcept {
#if defined(__x86_64__)
    static_assert(sizeof(TraceRecord) % sizeof(long long) == 0 && alignof(TraceRecord) >= 8);
    auto* out = reinterpret_cast<long long*>(to);
    const auto* in = reinterpret_cast<const long long*>(from);
    const std::size_t words = count * (sizeof(TraceRecord) / sizeof(long long));
    for (std::size_t i = 0; i < words; ++i) _mm_stream_si64(out + i, in[i]);
    _mm_sfence();
#else
    std::memcpy(to, from, count * sizeof(TraceRecord));
#endif
  }

  // The ring is aligned to, and advised as, transparent huge pages (Linux): faulting in 1 M
  // records 4 KiB at a time cost ~14,000 page faults over the first million events (the first
  // cases of a latency run measured 2-5x slower than the same cases later); 2 MiB pages take 28.
  static constexpr std::size_t kRingAlignment = std::size_t{2} << 20;
  struct RawStorageDeleter {
    void operator()(TraceRecord* records) const noexcept {
      ::operator delete(records, std::align_val_t{kRingAlignment});
    }
  };
  static TraceRecord* allocate_ring(std::size_t capacity);

  std::size_t capacity_;
  std::unique_ptr<TraceRecord, RawStorageDeleter> records_;
  std::size_t next_slot_ = 0;
  std::uint64_t appended_ = 0;
  ClockSource clock_;
  ClockOrigin origin_;
};

}  // namespace vramledger
