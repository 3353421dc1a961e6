// The ledger: an AllocatorObserver whose counters and trace are pure functions of the event
// stream (docs/stats.md). One ledger per allocator.
//
// on_event is called with the allocator's lock held and is the hot path (two or three events per
// allocate/free pair): fixed arrays only, no allocation, no locking, no string work. Queries are
// not synchronised with on_event either: call them under the allocator's lock, or while no thread
// allocates or frees. An allocator with per-stream locks (accept_concurrent_events) reports from
// several threads at once: from then on on_event and every query take the ledger's lock.
//
// Front caches (docs/design.md, 5): once an allocator opens a shard (open_shard), threads also
// report through their LedgerShard (ledger_shard.hpp) without the allocator's lock. From then on
// on_event takes the ledger's own lock, and every query folds the shards first, under that lock
// and every shard's mutex, so what it returns is exact. Lock order: allocator lock -> ledger lock
// -> shard mutexes (ascending address). The per-stream fast path's shards (open_stream_shard)
// are updated under their stream's lock and their own mutex, and take the slow path with the
// stream's lock still held (docs/design.md 4, 5.2).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "accounting/event_trace.hpp"
#include "accounting/ledger_counters.hpp"
#include "accounting/ledger_shard.hpp"
#include "accounting/stream_usage_table.hpp"
#include "accounting/tag_registry.hpp"
#include "allocator/allocator_events.hpp"

namespace vramledger {

struct PoolUpdate;  // ledger.cpp: the counters one pool event touches
struct CountersAccount;  // counters_text.hpp

struct LedgerOptions {
  std::size_t trace_capacity = EventTrace::kDefaultCapacity;  // records; 0 turns tracing off
  // Timestamps of trace records. Coarse by default: measured on a KVM guest of an H200 host, a
  // cycle-counter read cost ~11 ns per event there against ~3 ns for the coarse clock; events
  // keep their exact order through their sequence. kCycleCounter gives precise times.
  ClockSource clock = ClockSource::kCoarseMonotonic;
  // Stop the process at the first inconsistency, so a debugger shows the offending event. On by
  // default in debug builds; tests that plant an inconsistency turn it off.
#ifdef NDEBUG
  bool abort_on_inconsistency = false;
#else
  bool abort_on_inconsistency = true;
#endif
};

// The first event after which a counter went negative, or that could not be accounted at all.
struct LedgerInconsistency {
  std::uint64_t event_index = 0;  // 0-based position in the event stream
  AllocatorEvent event{EventKind::kAlloc};
  const char* scope = "";    // "all", "small_pool", "large_pool", "stream", "tag" or "event"
  const char* counter = "";  // the Stat's name, or the bad field for scope "event"
  std::int64_t value = 0;    // the counter after the event, or the bad field's value

  std::string to_string() const;
};

class Ledger final : public AllocatorObserver {
 public:
  explicit Ledger(LedgerOptions options = {});
  ~Ledger() override;
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  void on_event(const AllocatorEvent& event) noexcept override {
    if (!sharded_.load(std::memory_order_acquire)) [[likely]] {
      if (concurrent_.load(std::memory_order_relaxed)) {
        std::lock_guard lock(mutex_);
        apply(event);
        return;
      }
      apply(event);
      return;
    }
    on_event_sharded(event);
  }
  // From now on on_event and every query take the ledger's lock: allocators with per-stream
  // locks report from several threads at once (docs/design.md 4). Irreversible.
  bool accept_concurrent_events() noexcept override {
    concurrent_.store(true, std::memory_order_release);
    return true;
  }
  // Front-cache shards (ledger_shards.cpp).
  bool has_shards() const noexcept override { return true; }
  ObserverShard* open_shard() override;
  // A published stream's shard (docs/design.md 5.2): from its first one on, every event the
  // allocator sends itself folds every shard first.
  ObserverShard* open_stream_shard() override;
  void close_shard(ObserverShard* shard) noexcept override;
  // How the shards' events were counted, since construction: on a shard's fast path (those
  // carrying split changes among them) or through the ledger's slow path. For tests and
  // benchmarks; the shards are folded first.
  struct ShardTally {
    std::uint64_t fast = 0;
    std::uint64_t fast_with_splits = 0;
    std::uint64_t slow = 0;
    // Events a stream shard counted after gathering the other shards' credit one at a time,
    // without the exact path (Ledger::gather_credit_shard_by_shard).
    std::uint64_t gathered = 0;
    // Nanoseconds (steady clock) with every shard's mutex held, from the first taken to the
    // last released: the exact path, the allocator's own events and the queries. No shard's
    // fast path runs meanwhile, so it is time every counting thread may have to wait for.
    std::uint64_t all_held_ns = 0;
  };
  ShardTally shard_tally() const;
  // The counters-only account (counters_text.hpp) attached to out-of-memory errors.
  std::string describe() const override;
  // The figures that account prints, copied out (counters_text.hpp).
  CountersAccount counters_account() const;

  // Snapshots with torch's Stat meaning (see "Storage" below for why they are computed here).
  LedgerCounters counters() const noexcept;
  std::vector<StreamUsage> per_stream() const;
  // Tags with any non-zero statistic, in id order, then the overflow entry if used.
  std::vector<TagUsage> per_tag() const;
  UsageStats tag_usage(TagId tag) const noexcept;

  // torch's resetPeakMemoryStats / resetAccumulatedMemoryStats, for every counter the ledger
  // keeps (pools, streams, tags; reset_accumulated also zeroes the num_* counters).
  void reset_peaks() noexcept;
  void reset_accumulated() noexcept;

  // Sticky: once a counter went negative or an event was malformed, the counters are suspect
  // until the ledger is rebuilt. Never clamped.
  bool inconsistent() const noexcept { return first_inconsistency_.has_value(); }
  const std::optional<LedgerInconsistency>& first_inconsistency() const noexcept {
    return first_inconsistency_;
  }

  // Calls read(trace) while no event can reach the trace: the ledger's lock and every shard's
  // are held, the shards folded. For reports made while other threads allocate (the reference
  // trace() returns may be read only while nothing does). `read` must not call the ledger.
  void with_trace(const std::function<void(const EventTrace&)>& read) const;
  // With shards open, the shards' staged records are moved into the trace first. Read the
  // reference only while no thread allocates (else: with_trace).
  const EventTrace& trace() const noexcept {
    fold_for_read();
    return trace_;
  }
  EventTrace& trace() noexcept {
    fold_for_read();
    return trace_;
  }

 private:
  friend class LedgerShard;
  // Holds the ledger's lock and every shard's mutex, shards folded, while a query reads.
  class ReadGuard;

  void apply(const AllocatorEvent& event) noexcept;  // the counters' update, one event
  void apply_alloc_below_peaks(const AllocatorEvent& event) noexcept;
  LedgerCounters counters_unlocked() const noexcept;

  // ---- shards (ledger_shards.cpp)
  struct Slot;  // one fast counter: a pool's, the aggregate's, a stream's or the untagged tag's
  void on_event_sharded(const AllocatorEvent& event) noexcept;
  ObserverShard* open_shard_of_kind(bool for_stream);
  void apply_from_shard(LedgerShard& shard, const AllocatorEvent& event) noexcept;
  void lock_shards() const noexcept;
  void unlock_shards() const noexcept;
  void fold_locked() noexcept;
  void fold_shard_locked(LedgerShard& shard) noexcept;
  void fold_shard_counters_locked(LedgerShard& shard) noexcept;
  void hand_over_records_locked(LedgerShard& shard) noexcept;
  void publish_shard(LedgerShard& shard) noexcept;
  void fold_for_read() const noexcept;
  bool raise_fits(const AllocatorEvent& event) noexcept;
  void make_room_locked(const AllocatorEvent& event, bool stream_shards_hold_credit) noexcept;
  void grant_credit_locked(LedgerShard& shard, const AllocatorEvent& event) noexcept;
  void grant_cell_credit_locked(LedgerShard& shard, std::size_t cell, std::size_t share,
                                std::size_t kinds, std::int64_t shares) noexcept;
  // Spare credit (ledger_shard_credit.cpp): stream shards' pool and common credit that no
  // shard holds, taken without the ledger's mutex.
  bool take_spare_credit(std::size_t cell, std::size_t kind, std::int64_t need,
                         std::int64_t& credit) noexcept;
  bool take_stream_spare_credit(std::size_t entry, std::size_t kind, std::int64_t need,
                                std::int64_t& credit) noexcept;
  void revoke_stream_spare_locked(std::size_t entry, std::size_t kind) noexcept;
  bool give_credit_to_spare_locked(LedgerShard& shard, std::int64_t divisor) noexcept;
  void return_spare_credit_locked(LedgerShard& shard) noexcept;
  void gather_spare_credit_locked() noexcept;
  bool gather_credit_shard_by_shard(LedgerShard& needy, const AllocatorEvent& event) noexcept;
  void revoke_spare_cell_locked(std::size_t cell, std::size_t kind) noexcept;
  void revoke_spare_credit_locked() noexcept;
  template <typename Visit>
  void for_each_slot_of_spare(std::size_t cell, std::size_t kind, Visit&& visit) noexcept;
  template <typename Visit>
  void for_each_slot_of_stream_spare(std::size_t entry, std::size_t kind, Visit&& visit) noexcept;
  template <typename ForEachSlot>
  void revoke_spare_locked(std::atomic<std::int64_t>& spare, ForEachSlot&& for_each_slot) noexcept;
  void revoke_all_credit_locked() noexcept;
  void revoke_slot_locked(const Slot& slot, bool stream_shards_hold_credit = true) noexcept;
  std::int64_t fast_ceiling(std::size_t stat) const noexcept;
  std::int64_t& outstanding_of(const Slot& slot) noexcept;
  std::int64_t current_of(const Slot& slot) const noexcept;
  std::int64_t ceiling_of(const Slot& slot) const noexcept;
  static bool cell_counts_for(const LedgerShard& shard, std::size_t cell, std::size_t share,
                              const Slot& slot) noexcept;
  template <typename Visit>
  void for_each_slot_of_cell(const LedgerShard& shard, std::size_t cell, std::size_t share,
                             std::size_t kind, Visit&& visit) noexcept;

  static std::size_t tag_slot(TagId tag) noexcept { return tag < kMaxTags ? tag : kMaxTags; }
  // The tag's entry, for an event that changes it: the entries past tag_slots_used_ stay zero,
  // so that queries and resets visit only the entries in use, not all kMaxTags + 1.
  UsageStats& tag_entry_for_update(TagId tag) noexcept {
    const std::size_t slot = tag_slot(tag);
    if (slot >= tag_slots_used_) [[unlikely]] tag_slots_used_ = slot + 1;
    return tags_[slot];
  }

  PoolUpdate update_for(PoolKind pool) noexcept;
  std::int64_t aggregate_current(Stat PoolCounters::*stat) const noexcept;
  void on_alloc(const AllocatorEvent& event, const PoolUpdate& update) noexcept;
  bool on_free_requested(const AllocatorEvent& event, const PoolUpdate& update) noexcept;
  bool on_free_completed(const AllocatorEvent& event, const PoolUpdate& update) noexcept;
  void raise_reserved(const PoolUpdate& update, std::int64_t bytes) noexcept;

  [[gnu::cold]] void record_negative_counter(const AllocatorEvent& event) noexcept;
  [[gnu::cold]] void record_malformed_event(const AllocatorEvent& event, const char* field,
                                            std::int64_t value) noexcept;
  void record_inconsistency(const LedgerInconsistency& inconsistency) noexcept;

  // Storage. To keep on_event cheap, stored Stats are not kept in torch's form: a decrease only
  // lowers `current`, and `freed` holds the value `current` had at the last reset_accumulated,
  // so that the real total of decreases is allocated + freed - current. Aggregate Stats keep only
  // their peak (current and totals are the two pools' sums). The queries above convert.
  LedgerOptions options_;
  LedgerCounters counters_;
  // A kFreeCompleted that follows its kFreeRequested in the same call reuses its timestamp,
  // which saves a clock read on the common path.
  static constexpr DevicePtr kNoAddress = ~DevicePtr{0};
  DevicePtr free_requested_address_ = kNoAddress;
  std::uint64_t free_requested_ticks_ = 0;
  StreamUsageTable streams_;
  // Zeroed storage from calloc, released with free (ledger.cpp says why).
  struct FreeTable {
    void operator()(UsageStats* table) const noexcept;
  };
  std::unique_ptr<UsageStats[], FreeTable> tags_;  // kMaxTags + 1 entries; the last: overflow
  // Entries at or past this index were never changed (all zero). Slot 0 (kUntagged) counts as
  // used: front-cache shards fold into it directly.
  std::size_t tag_slots_used_ = 1;
  std::optional<LedgerInconsistency> first_inconsistency_;
  EventTrace trace_;
  // A shard whose staged records are full hands them to the trace under its own mutex and this
  // one, without the ledger's (hand_over_records_locked): every other write to the trace that
  // does not hold every shard's mutex takes it too. Lock order: ledger -> shards -> trace.
  // Both locks bias themselves to the thread that takes them most (allocator/biased_mutex.hpp).
  alignas(64) mutable AutoBiasedMutex trace_mutex_;

  // Shards (ledger_shard.hpp). `outstanding_*` is, per counter, the sum over shards of
  // delta + credit; only the slow path (every shard's mutex held) changes it.
  std::atomic<bool> sharded_{false};
  std::atomic<bool> concurrent_{false};  // accept_concurrent_events: events and queries lock
  // Taken by on_event once sharded_ or concurrent_, and by queries.
  mutable AutoBiasedMutex mutex_;
  mutable bool shards_held_ = false;  // under mutex_: lock_shards() is in effect
  bool stream_shards_ = false;        // under mutex_: a stream's shard was opened
  std::size_t stream_shard_count_ = 0;  // under mutex_: stream shards open now
  ShardTally shard_tally_;            // under mutex_
  mutable std::uint64_t all_held_ns_ = 0;     // ShardTally::all_held_ns; under mutex_
  std::atomic<std::uint64_t> gathered_events_{0};  // ShardTally::gathered
  std::size_t gather_start_ = 0;  // the shard the next gather visits first; under mutex_
  mutable std::uint64_t all_held_since_ns_ = 0;  // when lock_shards() began; under mutex_
  std::vector<std::unique_ptr<LedgerShard>> shards_;  // ascending address: the lock order
  std::array<std::array<std::int64_t, kFastPoolStats>, 2> outstanding_pool_{};
  std::array<std::int64_t, kFastPoolStats> outstanding_aggregate_{};
  std::array<std::int64_t, kFastUsageStats> outstanding_untagged_{};
  std::array<std::array<std::int64_t, kFastUsageStats>, StreamUsageTable::kCapacity + 1>
      outstanding_stream_{};
  // Per stream shards' cell (the two pools', the common) and kind of amount: credit counted in
  // `outstanding` that no shard holds. A stream shard takes from it on its fast path, under its
  // own mutex (a compare-exchange: no other lock); it is given back at a shard's fold and swept
  // together at the slow path, both under the ledger's mutex (docs/design.md 5.2).
  struct alignas(64) SpareCell {
    std::array<std::atomic<std::int64_t>, kAmountKinds> credit{};
  };
  std::array<SpareCell, LedgerShard::kSpareCells> spare_credit_{};
  // The same per stream, for the own-stream cells (counts, bytes, requests): a stream has
  // several stream shards when threads contending on it got lanes of their own (the policy's
  // detail/stream_lanes.cpp), and the room below the stream's peaks then moves between them
  // through here as the pools' room does through spare_credit_.
  struct alignas(64) StreamSpare {
    std::array<std::atomic<std::int64_t>, kSplitCount> credit{};
  };
  std::array<StreamSpare, StreamUsageTable::kCapacity + 1> stream_spare_{};
};

}  // namespace vramledger
