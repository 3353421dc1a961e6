// Always-on event log: a bounded ring of fixed-size records. Appending never allocates; when the
// ring is full the oldest record is overwritten and counted as dropped.
//
// Not synchronised: appends and reservations come from the ledger under a lock of its own (its
// trace mutex, or every shard's), and readers must exclude them too (the ledger's hold every
// shard's mutex; or read while nothing allocates). The one exception is a reservation's fill:
// reserve() hands out the slots of a batch under the lock, in the batch's place in the order,
// and fill() copies the records in after the lock is released, so that threads handing over
// their shards' records copy side by side instead of one after another (docs/design.md, 5.2).
// Until every fill is done the slots it writes are neither read (a fill runs under its shard's
// mutex) nor overwritten: a write that would reach them waits for the fills in flight.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
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
    if (capacity_ == 0) [[unlikely]] {
      ++appended_;
      return;
    }
    wait_for_fills_below(1);
    ++appended_;
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
    if (capacity_ == 0) [[unlikely]] {
      appended_ += count;
      return;
    }
    wait_for_fills_below(count);
    appended_ += count;
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

  // The slots of `count` records, in their place in the order, to be written by fill() once the
  // caller's lock is released. Only for 0 < count <= capacity() (else append_records).
  class Reservation {
   public:
    Reservation() = default;
    bool empty() const noexcept { return counts_[0] == 0; }

   private:
    friend class EventTrace;
    std::array<TraceRecord*, 2> runs_{};  // the ring wraps at most once within a batch
    std::array<std::size_t, 2> counts_{};
    std::atomic<std::uint32_t>* filling_ = nullptr;
  };
  bool can_reserve(std::size_t count) const noexcept { return count > 0 && count <= capacity_; }
  Reservation reserve(std::size_t count) noexcept;
  // Any thread, no lock: the reserved slots receive `records` (as many as were reserved).
  static void fill(Reservation& slots, const TraceRecord* records) noexcept;

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
  // Forgets every record and the drop count; capacity and clock origin stay. Waits for fills.
  void clear() noexcept;
  // Touches every page of the ring now, as a process past its first `capacity` events has them:
  // for benchmarks of the steady state (the pages are otherwise faulted in as records arrive).
  void prefault() noexcept;

 private:
  std::size_t oldest_slot() const noexcept { return appended_ > capacity_ ? next_slot_ : 0; }
  // Before writing `count` slots from the next one: while fills are in flight, a write that
  // reaches a slot reserved since they started waits for them (it never does with a ring far
  // larger than the batches in flight; a thread preempted mid-fill is what this is for).
  void wait_for_fills_below(std::size_t count) noexcept {
    if (filling_.load(std::memory_order_acquire) == 0) [[likely]] return;
    if (appended_ + count <= fill_window_start_ + capacity_) return;
    wait_for_fills();
  }
  void wait_for_fills() noexcept;
  // A batch goes to the ring with non-temporal stores: the ring is larger than the caches, so an
  // ordinary copy first reads each line it overwrites from memory and then evicts useful lines;
  // streamed, a line is written once. The fence orders them before the ledger's unlock.
  static void copy_past_caches(TraceRecord* to, const TraceRecord* from, std::size_t count) noexcept {
#if defined(VRAMLEDGER_TRACE_COPY_CACHED)  // experiment: an ordinary copy, for comparison
    std::memcpy(to, from, count * sizeof(TraceRecord));
#elif defined(__x86_64__)
    static_assert(sizeof(TraceRecord) % sizeof(long long) == 0 && alignof(TraceRecord) >= 8);
    auto* out = reinterpret_cast<long long*>(to);
    const auto* in = reinterpret_cast<const long long*>(from);
    std::size_t words = count * (sizeof(TraceRecord) / sizeof(long long));
    // 16 bytes per store where the ring is 16-byte aligned (every other record): a word at a
    // time, the copy took ~42 instructions per record, a seventh of a front-cache pair.
    if ((reinterpret_cast<std::uintptr_t>(out) & 15) != 0 && words > 0) {
      _mm_stream_si64(out++, *in++);
      --words;
    }
    // Four stores a turn: one at a time, the loop's own bookkeeping was most of the copy's
    // instructions (a fold of 128 records: ~3,200, now ~1,400).
    for (; words >= 8; words -= 8, out += 8, in += 8) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 4));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 6));
      _mm_stream_si128(reinterpret_cast<__m128i*>(out), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 2), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 4), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + 6), d);
    }
    for (; words >= 2; words -= 2, out += 2, in += 2) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(out),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(in)));
    }
    if (words > 0) _mm_stream_si64(out, *in);
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
  // Reservations whose fill has not finished, and the sequence of the oldest slot any of them
  // may still write: set when a reservation finds none in flight, so never later than the true
  // oldest (a fill that finishes unseen only makes the bound conservative).
  std::atomic<std::uint32_t> filling_{0};
  std::uint64_t fill_window_start_ = 0;
  ClockSource clock_;
  ClockOrigin origin_;
};

}  // namespace vramledger
