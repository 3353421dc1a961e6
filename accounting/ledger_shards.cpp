// The ledger's shards (ledger_shard.hpp): their fast path, folds, and the slow path; the escrow's
// credit is in ledger_shard_credit.cpp (docs/design.md, 5.2 has the argument).
#include <algorithm>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "accounting/cheap_clock.hpp"
#include "accounting/ledger.hpp"
#include "accounting/ledger_slots.hpp"
#include "allocator/steady_time.hpp"

namespace vramledger {

using namespace ledger_slots;

// ------------------------------------------------------------------ the shard's fast path

namespace {

// The fields of an event the shard's fast path reads. Field by field on purpose: the caller has
// just written the event field by field, and a load wider than the store it reads from (a
// 16-byte load of size and requested, a 2-byte load of kind and pool: what the compiler merged
// them into) cannot be forwarded from the stores: it waited for them to retire, a third of
// try_apply's time (perf annotate). The empty asm statements keep each field its own load.
struct FastFields {
  std::uint32_t kind;
  std::uint32_t pool;
  std::int64_t size;
  std::int64_t requested;
  std::int64_t split_count;
  std::int64_t split_bytes;
};

[[gnu::always_inline]] inline FastFields read_fast_fields(const AllocatorEvent& event) noexcept {
  auto kind = static_cast<std::uint32_t>(event.kind);
  auto pool = static_cast<std::uint32_t>(event.pool);
  asm("" : "+r"(kind), "+r"(pool));
  auto size = static_cast<std::int64_t>(event.size);
  auto requested = static_cast<std::int64_t>(event.requested);
  asm("" : "+r"(size), "+r"(requested));
  return FastFields{kind, pool, size, requested, event.inactive_split_delta,
                    event.inactive_split_bytes_delta};
}

}  // namespace

// A front cache's shard (the common case, kept lean: the stream shards' path is out of line, so
// this one needs no stack frame for it).
bool LedgerShard::try_apply(const AllocatorEvent& event) noexcept {
  if (for_stream_) return try_apply_for_stream(event);
  const FastFields f = read_fast_fields(event);
  if (staged_count_ == kStaged || event.tag != kUntagged) [[unlikely]] return false;
  if ((f.split_count | f.split_bytes) != 0) return false;  // a front shard holds no split credit
  const std::size_t share = share_of(event.stream);
  if (share == kStreams) [[unlikely]] return false;
  Cell& cell = cells_[f.pool & 1][share];
  if (f.kind == static_cast<std::uint32_t>(EventKind::kAlloc)) {
    if (cell[0].credit < 1 || cell[1].credit < f.size || cell[2].credit < f.requested) {
      return false;  // nothing changed
    }
    cell[0].credit -= 1;
    cell[0].delta += 1;
    cell[0].increases += 1;
    cell[1].credit -= f.size;
    cell[1].delta += f.size;
    cell[1].increases += f.size;
    cell[2].credit -= f.requested;
    cell[2].delta += f.requested;
    cell[2].increases += f.requested;
  } else if (f.kind == static_cast<std::uint32_t>(EventKind::kFree)) {
    // A decrease is always allowed, and becomes credit: the sums went down by as much.
    cell[0].credit += 1;
    cell[0].delta -= 1;
    cell[1].credit += f.size;
    cell[1].delta -= f.size;
    cell[2].credit += f.requested;
    cell[2].delta -= f.requested;
  } else {
    return false;
  }
  stage_record(event, f.kind, f.pool, f.size, f.requested, 0, 0);
  return true;
}

// A stream shard (Ledger::open_stream_shard): split changes too, and credit it may take from the
// ledger's spares.
bool LedgerShard::try_apply_for_stream(const AllocatorEvent& event) noexcept {
  const FastFields f = read_fast_fields(event);
  if (staged_count_ == kStaged || event.tag != kUntagged) [[unlikely]] return false;
  const std::size_t share = share_of(event.stream);
  if (share == kStreams) [[unlikely]] return false;
  const std::uint32_t pool = f.pool;
  Cell& cell = cells_[pool & 1][share];
  // Split changes move in either direction; a raise needs credit and a decrease becomes
  // credit, in the pool's cell and in the common one alike (LedgerShard::cells_).
  const bool alloc = f.kind == static_cast<std::uint32_t>(EventKind::kAlloc);
  if (!alloc && f.kind != static_cast<std::uint32_t>(EventKind::kFree)) return false;
  const std::int64_t sign = alloc ? 1 : -1;
  const std::array<std::int64_t, kAmountKinds> amounts = {sign, sign * f.size, sign * f.requested,
                                                          f.split_count, f.split_bytes};
  Cell& common = cells_[kCommon][share];
  Cell& own = cells_[kOwnStream][share];
  for (std::size_t k = 0; k < kAmountKinds; ++k) {
    if (amounts[k] <= 0) continue;
    // Short of the own stream's credit: its spare (another lane of the stream gave it).
    if (k < kSplitCount && own[k].credit < amounts[k] &&
        !ledger_.take_stream_spare_credit(streams_[share].entry, k, amounts[k], own[k].credit)) {
      return false;  // nothing changed
    }
    // Short of shared credit: the ledger's spare, if it has enough (moved, not counted: the
    // event may still go to the slow path, and the credit is as good there).
    if (cell[k].credit < amounts[k] &&
        !ledger_.take_spare_credit(pool & 1, k, amounts[k], cell[k].credit)) {
      return false;
    }
    if (common[k].credit < amounts[k] &&
        !ledger_.take_spare_credit(kCommon, k, amounts[k], common[k].credit)) {
      return false;
    }
  }
  // The three cells move alike, the own stream's by its three kinds (no split figures): spelled
  // out with constant bounds, since a loop over the cells kept each amount in memory.
  const auto move = [&amounts](Cell& target, auto kinds) {
#pragma GCC unroll 5
    for (std::size_t k = 0; k < decltype(kinds)::value; ++k) {
      target[k].credit -= amounts[k];
      target[k].delta += amounts[k];
      target[k].increases += std::max<std::int64_t>(amounts[k], 0);
    }
  };
  move(cell, std::integral_constant<std::size_t, kAmountKinds>{});
  move(common, std::integral_constant<std::size_t, kAmountKinds>{});
  move(own, std::integral_constant<std::size_t, kSplitCount>{});
  stage_record(event, f.kind, pool, f.size, f.requested, f.split_count, f.split_bytes);
  return true;
}

// The event, counted, waits in the staged records for the next fold.
inline void LedgerShard::stage_record(const AllocatorEvent& event, std::uint32_t kind,
                                      std::uint32_t pool, std::int64_t size,
                                      std::int64_t requested, std::int64_t split_count,
                                      std::int64_t split_bytes) noexcept {
  TraceRecord& record = staged_[staged_count_++];
  record.time_ticks = read_clock(ledger_.options_.clock);
  record.address = event.address;
  record.size = static_cast<std::uint64_t>(size);
  record.requested = static_cast<std::uint64_t>(requested);
  record.stream = event.stream;
  record.kind = static_cast<EventKind>(kind);
  record.pool = static_cast<PoolKind>(pool);
  record.tag = kUntagged;
  record.inactive_split_delta = static_cast<std::int32_t>(split_count);
  record.inactive_split_bytes_delta = split_bytes;
  staged_with_splits_ += (split_count | split_bytes) != 0 ? 1 : 0;
}

void LedgerShard::apply_slow(const AllocatorEvent& event) noexcept {
  ledger_.apply_from_shard(*this, event);
}

void LedgerShard::publish() noexcept { ledger_.publish_shard(*this); }

// ------------------------------------------------------------------ the ledger's side

ObserverShard* Ledger::open_shard() { return open_shard_of_kind(false); }

ObserverShard* Ledger::open_stream_shard() { return open_shard_of_kind(true); }

ObserverShard* Ledger::open_shard_of_kind(bool for_stream) {
  std::lock_guard lock(mutex_);
  if (for_stream) {
    stream_shards_ = true;
    ++stream_shard_count_;
  }
  auto shard = std::make_unique<LedgerShard>(*this, for_stream);
  LedgerShard* opened = shard.get();
  const auto at = std::upper_bound(
      shards_.begin(), shards_.end(), opened,
      [](const LedgerShard* a, const std::unique_ptr<LedgerShard>& b) { return a < b.get(); });
  shards_.insert(at, std::move(shard));
  sharded_.store(true, std::memory_order_release);
  return opened;
}

void Ledger::close_shard(ObserverShard* closing) noexcept {
  std::lock_guard lock(mutex_);
  lock_shards();
  fold_locked();
  for (auto it = shards_.begin(); it != shards_.end(); ++it) {
    LedgerShard& shard = **it;
    if (&shard != closing) continue;
    if (shard.for_stream_) --stream_shard_count_;
    // Its credit goes back: headroom nobody else may use twice.
    for (std::size_t c = 0; c < LedgerShard::kCells; ++c) {
      for (std::size_t s = 0; s < shard.streams_used_; ++s) {
        for (std::size_t k = 0; k < kAmountKinds; ++k) {
          const std::int64_t credit = shard.cells_[c][s][k].credit;
          for_each_slot_of_cell(shard, c, s, k,
                                [&](const Slot& slot) { outstanding_of(slot) -= credit; });
        }
      }
    }
    if (shard.for_stream_ && stream_shard_count_ == 0) revoke_spare_credit_locked();
    unlock_shards();
    shards_.erase(it);
    return;
  }
  unlock_shards();
}

// Shards biased to their threads (allocator/biased_mutex.hpp) are taken from them with one
// process-wide barrier for all.
void Ledger::lock_shards() const noexcept {
  all_held_since_ns_ = steady_now_ns();
  bool barrier = false;
  for (const auto& shard : shards_) barrier |= shard->mutex().lock_deferring_barrier();
  if (barrier) {
    BiasedMutex::process_wide_barrier();
    for (const auto& shard : shards_) shard->mutex().finish_lock();
  }
  shards_held_ = true;
}

void Ledger::unlock_shards() const noexcept {
  shards_held_ = false;
  for (auto it = shards_.rbegin(); it != shards_.rend(); ++it) (*it)->mutex().unlock();
  all_held_ns_ += steady_now_ns() - all_held_since_ns_;
}

// Moves every shard's staged records into the trace and its deltas into the counters. No value
// changes (a counter is the ledger's figure plus the shards' deltas), nor any credit.
void Ledger::fold_locked() noexcept {
  {
    // Every shard held: no hand-over can reserve slots between these (one lock, not one a shard).
    std::lock_guard trace_lock(trace_mutex_);
    for (const auto& shard : shards_) {
      if (shard->staged_count_ == 0) continue;
      trace_.append_records(shard->staged_.data(), shard->staged_count_);
    }
  }
  for (const auto& shard : shards_) fold_shard_counters_locked(*shard);
}

void Ledger::fold_shard_locked(LedgerShard& shard) noexcept {
  {
    std::lock_guard trace_lock(trace_mutex_);
    trace_.append_records(shard.staged_.data(), shard.staged_count_);
  }
  fold_shard_counters_locked(shard);
}

// The shard's deltas into the counters and its events (staged, now in the trace, and handed
// over before) counted; the staged records are the caller's to place in the trace first.
// Each cell moves the counters for_each_slot_of_cell names, spelled out per part here: the
// exact path folds every shard, and the generic walk (a scan of the twelve counters per kind,
// a switch per slot) cost ~870 instructions a shard, a third of an exact-path event with 16
// stream shards (callgrind, MixedStreamsInTurn, 2026-12-05).
void Ledger::fold_shard_counters_locked(LedgerShard& shard) noexcept {
  const std::size_t events = shard.staged_count_ + shard.handed_over_;
  counters_.events += events;
  shard_tally_.fast += events;
  shard_tally_.fast_with_splits += shard.staged_with_splits_ + shard.handed_over_with_splits_;
  shard.staged_with_splits_ = 0;
  shard.staged_count_ = 0;
  shard.handed_over_ = 0;
  shard.handed_over_with_splits_ = 0;
  UsageStats& untagged = tags_[tag_slot(kUntagged)];
  for (std::size_t s = 0; s < shard.streams_used_; ++s) {
    const LedgerShard::StreamShare& share = shard.streams_[s];
    for (std::size_t c = 0; c < LedgerShard::kCells; ++c) {
      LedgerShard::Cell& cell = shard.cells_[c][s];
      bool moved = false;
      for (const ShardStat& stat : cell) moved |= (stat.delta | stat.increases) != 0;
      if (!moved) continue;
      // The parts of the counters the cell stands for (for_each_slot_of_cell): a front shard's
      // pool cells stand for all four, a stream shard's cells for one part each.
      const bool front = !shard.for_stream_;
      if (front && c >= LedgerShard::kCommon) continue;  // unused by front shards
      const bool pool_part = front || c < LedgerShard::kCommon;
      const bool common_part = front || c == LedgerShard::kCommon;
      const bool stream_part = front || c == LedgerShard::kOwnStream;
      const auto fold = [&cell](Stat& stat, std::int64_t& outstanding, std::size_t kind) {
        stat.current += cell[kind].delta;
        stat.allocated += cell[kind].increases;
        outstanding -= cell[kind].delta;
      };
      if (pool_part) {
        for (std::size_t j = 0; j < kFastPoolStats; ++j) {
          fold(counters_.pools[1 + c].*kFastPool[j], outstanding_pool_[c][j], kPoolKind[j]);
        }
      }
      if (common_part) {
        for (std::size_t j = 0; j < kFastPoolStats; ++j) {  // the aggregate: the pools' sum
          outstanding_aggregate_[j] -= cell[kPoolKind[j]].delta;
        }
        for (std::size_t j = 0; j < kFastUsageStats; ++j) {
          fold(untagged.*kFastUsage[j], outstanding_untagged_[j], kUsageKind[j]);
        }
      }
      if (stream_part) {
        for (std::size_t j = 0; j < kFastUsageStats; ++j) {
          fold(share.usage->*kFastUsage[j], outstanding_stream_[share.entry][j], kUsageKind[j]);
        }
      }
      for (ShardStat& stat : cell) {
        stat.delta = 0;
        stat.increases = 0;
      }
    }
  }
}

// One shard's records into the trace now: the ledger's own events about its blocks (a free from
// another thread) must follow them there.
void Ledger::publish_shard(LedgerShard& shard) noexcept {
  std::lock_guard lock(mutex_);
  std::lock_guard shard_lock(shard.mutex());
  fold_shard_locked(shard);
}

// Under the shard's mutex alone, its staged records full: they take their place in the trace
// (under the trace's mutex, for a few instructions) and are copied after it is released
// (EventTrace::reserve), so threads whose records fill up at once neither wait for the ledger's
// mutex nor copy one after another. Their counts wait in the shard until its next fold: a
// reader folds every shard first, and `outstanding` already counts what the shard holds. Half
// of a stream shard's credit goes to the spares then, as at a fold: its records are in the
// trace's order before any raise that credit pays for (docs/design.md 5.2).
void Ledger::hand_over_records_locked(LedgerShard& shard) noexcept {
  const std::size_t count = shard.staged_count_;
  EventTrace::Reservation slots;
  {
    std::lock_guard trace_lock(trace_mutex_);
    if (trace_.can_reserve(count)) {
      slots = trace_.reserve(count);
    } else {
      trace_.append_records(shard.staged_.data(), count);
    }
  }
  EventTrace::fill(slots, shard.staged_.data());
  shard.handed_over_ += count;
  shard.handed_over_with_splits_ += shard.staged_with_splits_;
  shard.staged_count_ = 0;
  shard.staged_with_splits_ = 0;
  if (shard.for_stream_) return_spare_credit_locked(shard);
}

void Ledger::apply_from_shard(LedgerShard& shard, const AllocatorEvent& event) noexcept {
  const bool fast_kind = event.kind == EventKind::kAlloc || event.kind == EventKind::kFree;
  bool known_stream = false;  // whether the shard has a share for the event's stream
  {
    // Most often only its staged records are full: handing them over needs neither the
    // ledger's mutex nor any other shard (no credit changes), and the event then fits the
    // shard's own credit. Short of credit, the slow path below.
    std::lock_guard shard_lock(shard.mutex());
    if (shard.staged_count_ == LedgerShard::kStaged) {
      hand_over_records_locked(shard);
      if (shard.try_apply(event)) return;
    }
    known_stream = shard.share_of(event.stream) != LedgerShard::kStreams;
  }
  // Short of credit: most often the spares are short while other shards hold credit (at 8-16
  // streams the exact path raised a peak in under a fifth of its events). Gathering theirs one
  // shard at a time stops no other thread for long; the exact path below holds them all.
  if (shard.for_stream_ && fast_kind && event.tag == kUntagged && known_stream &&
      gather_credit_shard_by_shard(shard, event)) {
    gathered_events_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::lock_guard lock(mutex_);
  ++shard_tally_.slow;
  lock_shards();
  fold_locked();
  if (stream_shards_) gather_spare_credit_locked();
  if (fast_kind && event.tag == kUntagged && shard.share_of(event.stream) == LedgerShard::kStreams) {
    UsageStats& usage = streams_.usage_of(event.stream);
    const std::size_t entry = streams_.index_of(usage);
    if (entry < StreamUsageTable::kCapacity) {  // the overflow entry stands for many streams
      std::size_t s = shard.streams_used_;
      if (s < LedgerShard::kStreams) {
        ++shard.streams_used_;
      } else {
        // A fifth stream: the oldest share goes (folded, so only its credit is left to return).
        s = shard.next_victim_++ % LedgerShard::kStreams;
        for (std::size_t c = 0; c < LedgerShard::kCells; ++c) {
          for (std::size_t k = 0; k < kAmountKinds; ++k) {
            ShardStat& cell = shard.cells_[c][s][k];
            for_each_slot_of_cell(shard, c, s, k,
                                  [&](const Slot& slot) { outstanding_of(slot) -= cell.credit; });
            cell = ShardStat{};
          }
        }
      }
      LedgerShard::StreamShare& share = shard.streams_[s];
      share.stream = event.stream;
      share.entry = entry;
      share.usage = &usage;
    }
  }
  // Every stream shard's credit is in the spares now (gathered above, or there are none).
  make_room_locked(event, /*stream_shards_hold_credit=*/false);
  apply(event);
  if (fast_kind) grant_credit_locked(shard, event);
  unlock_shards();
}

void Ledger::on_event_sharded(const AllocatorEvent& event) noexcept {
  std::lock_guard lock(mutex_);
  // Reserved reaching its peak arms "active at peak reserved", read from the exact sum.
  const bool reserved_peak =
      (event.kind == EventKind::kSegmentCreate || event.kind == EventKind::kPhysicalCreate ||
       event.kind == EventKind::kSegmentWake) &&
      aggregate_current(&PoolCounters::reserved_bytes) + static_cast<std::int64_t>(event.size) >=
          counters_.pools[stat_pool_index(StatPool::kAggregate)].reserved_bytes.peak;
  bool exact = false;  // whether the update needs the shards folded and their credit checked
  if (stream_shards_) {
    // Stream shards: the allocator sends this under its lock, so no stream's fast path is
    // between its heap change and its shard's update, and events of one stream (a split made
    // on the fast path, undone here) must reach the trace in their order: every shard's staged
    // records go first (docs/design.md 5.2).
    exact = true;
  } else if (event.kind == EventKind::kAlloc) {
    exact = !raise_fits(event);
  } else if (event.kind == EventKind::kWake) {
    exact = true;  // raises what an allocation does (rare: take the exact path)
  } else if (reserved_peak) {
    exact = true;
  }
  if (!exact) {
    // No shard's mutex held: a shard may be handing its records to the trace meanwhile.
    std::lock_guard trace_lock(trace_mutex_);
    if (event.kind == EventKind::kAlloc) {
      apply_alloc_below_peaks(event);
    } else {
      apply(event);
    }
    return;
  }
  lock_shards();
  fold_locked();
  if (stream_shards_ && !reserved_peak &&
      (event.kind == EventKind::kAlloc || event.kind == EventKind::kFree)) {
    // The allocator's own allocation or free on a published stream (growth, pages to map, a
    // free the fast path declined): within that stream shard's credit it is counted as its
    // fast path would count it, and folded at once, rather than taking the room from the
    // shards' credit (make_room_locked), which sent the other streams' next events to the slow
    // path in turn. A stream with lanes (threads contending on it: the policy's
    // detail/stream_lanes.cpp) has several such shards; the event names its lane's
    // (home_shard), tried first: counted in another lane's, it would spend credit that lane's
    // next raise needs, sending that one to the slow path.
    const auto counted_in = [&](LedgerShard& shard) {
      if (!shard.for_stream_ || shard.share_of(event.stream) == LedgerShard::kStreams ||
          !shard.try_apply(event)) {
        return false;
      }
      fold_shard_locked(shard);
      unlock_shards();
      return true;
    };
    LedgerShard* home = nullptr;
    for (const auto& owned : shards_) {
      if (owned.get() == event.home_shard) home = owned.get();
    }
    if (home != nullptr && counted_in(*home)) return;
    for (const auto& owned : shards_) {
      if (owned.get() != home && counted_in(*owned)) return;
    }
  }
  make_room_locked(event, /*stream_shards_hold_credit=*/true);
  // Credit for the aggregate's active bytes was granted against a ceiling that may drop now.
  if (reserved_peak) revoke_slot_locked(Slot{Slot::kAggregate, 0, kActiveBytes});
  apply(event);
  unlock_shards();
}

}  // namespace vramledger
