// The ledger's front-cache shards and the escrow that keeps peaks exact (ledger_shard.hpp;
// docs/design.md, 5.4 has the argument).
#include <algorithm>
#include <mutex>
#include <tuple>
#include <utility>

#include "accounting/cheap_clock.hpp"
#include "accounting/ledger.hpp"

namespace vramledger {

// Which counter a slot names: a pool's, the aggregate's, the untagged tag's or a stream entry's.
struct Ledger::Slot {
  enum Kind { kPool, kAggregate, kUntagged, kStream } kind;
  std::size_t which;  // pool index, or StreamUsageTable::index_of
  std::size_t stat;   // index into kFastPool / kFastUsage
};

namespace {

using PoolStat = Stat PoolCounters::*;
using UsageStat = Stat UsageStats::*;

// The counters an allocate/free pair moves, and the kind of amount each moves by.
constexpr PoolStat kFastPool[kFastPoolStats] = {
    &PoolCounters::allocation,      &PoolCounters::active,
    &PoolCounters::allocated_bytes, &PoolCounters::active_bytes,
    &PoolCounters::requested_bytes, &PoolCounters::allocated_requested_bytes,
    &PoolCounters::inactive_split,  &PoolCounters::inactive_split_bytes};
constexpr std::size_t kPoolKind[kFastPoolStats] = {0, 0, 1, 1, 2, 2, kSplitCount, kSplitBytes};
constexpr std::size_t kFirstSplitStat = 6;
constexpr std::size_t kActiveBytes = 3;
constexpr UsageStat kFastUsage[kFastUsageStats] = {
    &UsageStats::allocation, &UsageStats::allocated_bytes, &UsageStats::requested_bytes,
    &UsageStats::active_bytes};
constexpr std::size_t kUsageKind[kFastUsageStats] = {0, 1, 2, 1};

// How far the event raises the fast counters, per kind of amount (a kind it lowers or leaves:
// zero or less): an allocation's counts, and the split changes of any event.
inline bool raises_counts(const AllocatorEvent& event) noexcept {
  return event.kind == EventKind::kAlloc || event.kind == EventKind::kWake;
}
inline std::array<std::int64_t, kAmountKinds> raises_of(const AllocatorEvent& event) noexcept {
  const bool counts = raises_counts(event);
  return {counts ? 1 : 0, counts ? static_cast<std::int64_t>(event.size) : 0,
          counts ? static_cast<std::int64_t>(event.requested) : 0, event.inactive_split_delta,
          event.inactive_split_bytes_delta};
}


}  // namespace

// ------------------------------------------------------------------ the shard's fast path

bool LedgerShard::try_apply(const AllocatorEvent& event) noexcept {
  // Field by field on purpose: the caller has just written the event field by field, and a load
  // wider than the store it reads from (a 16-byte load of size and requested, a 2-byte load of
  // kind and pool: what the compiler merged them into) cannot be forwarded from the stores: it
  // waited for them to retire, a third of this function's time (perf annotate). The empty asm
  // statements keep each field its own load.
  auto kind = static_cast<std::uint32_t>(event.kind);
  auto pool = static_cast<std::uint32_t>(event.pool);
  asm("" : "+r"(kind), "+r"(pool));
  auto size = static_cast<std::int64_t>(event.size);
  auto requested = static_cast<std::int64_t>(event.requested);
  asm("" : "+r"(size), "+r"(requested));
  const std::int64_t split_count = event.inactive_split_delta;
  const std::int64_t split_bytes = event.inactive_split_bytes_delta;
  if (staged_count_ == kStaged || event.tag != kUntagged) [[unlikely]] return false;
  const std::size_t share = share_of(event.stream);
  if (share == kStreams) [[unlikely]] return false;
  Cell& cell = cells_[pool & 1][share];
  // Split changes (a stream shard's events only) move in either direction: a raise needs
  // credit, a decrease becomes credit, as the counts below.
  const bool splits = (split_count | split_bytes) != 0;
  if (splits) {
    if (!for_stream_ || cell[kSplitCount].credit < split_count ||
        cell[kSplitBytes].credit < split_bytes) {
      return false;  // nothing changed
    }
  }
  if (kind == static_cast<std::uint32_t>(EventKind::kAlloc)) {
    if (cell[0].credit < 1 || cell[1].credit < size || cell[2].credit < requested) {
      return false;  // nothing changed
    }
    cell[0].credit -= 1;
    cell[0].delta += 1;
    cell[0].increases += 1;
    cell[1].credit -= size;
    cell[1].delta += size;
    cell[1].increases += size;
    cell[2].credit -= requested;
    cell[2].delta += requested;
    cell[2].increases += requested;
  } else if (kind == static_cast<std::uint32_t>(EventKind::kFree)) {
    // A decrease is always allowed, and becomes credit: the sums went down by as much.
    cell[0].credit += 1;
    cell[0].delta -= 1;
    cell[1].credit += size;
    cell[1].delta -= size;
    cell[2].credit += requested;
    cell[2].delta -= requested;
  } else {
    return false;
  }
  if (splits) {
    for (const auto& [k, amount] : {std::pair{kSplitCount, split_count},
                                    std::pair{kSplitBytes, split_bytes}}) {
      cell[k].credit -= amount;
      cell[k].delta += amount;
      cell[k].increases += std::max<std::int64_t>(amount, 0);
    }
  }
  StagedRecord& record = staged_[staged_count_++];
  record.address = event.address;
  record.size = static_cast<std::size_t>(size);
  record.requested = static_cast<std::size_t>(requested);
  record.stream = event.stream;
  record.ticks = read_clock(ledger_.options_.clock);
  record.split_bytes = split_bytes;
  record.split_count = static_cast<std::int32_t>(split_count);
  record.kind = static_cast<EventKind>(kind);
  record.pool = static_cast<PoolKind>(pool);
  return true;
}

void LedgerShard::apply_slow(const AllocatorEvent& event) noexcept {
  ledger_.apply_from_shard(*this, event);
}

void LedgerShard::publish() noexcept { ledger_.publish_shard(*this); }

// ------------------------------------------------------------------ slots and cells

std::int64_t& Ledger::outstanding_of(const Slot& slot) noexcept {
  switch (slot.kind) {
    case Slot::kPool: return outstanding_pool_[slot.which][slot.stat];
    case Slot::kAggregate: return outstanding_aggregate_[slot.stat];
    case Slot::kUntagged: return outstanding_untagged_[slot.stat];
    case Slot::kStream: break;
  }
  return outstanding_stream_[slot.which][slot.stat];
}

// The ledger's own figure of the slot's counter (exact once the shards are folded), and the
// value it may reach without the slow path.
std::int64_t Ledger::current_of(const Slot& slot) const noexcept {
  switch (slot.kind) {
    case Slot::kPool: return (counters_.pools[1 + slot.which].*kFastPool[slot.stat]).current;
    case Slot::kAggregate: return aggregate_current(kFastPool[slot.stat]);
    case Slot::kUntagged: return (tags_[tag_slot(kUntagged)].*kFastUsage[slot.stat]).current;
    case Slot::kStream: break;
  }
  return (streams_.at(slot.which).*kFastUsage[slot.stat]).current;
}

std::int64_t Ledger::ceiling_of(const Slot& slot) const noexcept {
  switch (slot.kind) {
    case Slot::kPool: return (counters_.pools[1 + slot.which].*kFastPool[slot.stat]).peak;
    case Slot::kAggregate: return fast_ceiling(slot.stat);
    case Slot::kUntagged: return (tags_[tag_slot(kUntagged)].*kFastUsage[slot.stat]).peak;
    case Slot::kStream: break;
  }
  return (streams_.at(slot.which).*kFastUsage[slot.stat]).peak;
}

// The value a fast counter may reach without the slow path: its peak; for the aggregate's
// active bytes while reserved stands at its peak, the "active at peak reserved" mark too.
std::int64_t Ledger::fast_ceiling(std::size_t stat) const noexcept {
  const PoolCounters& all = counters_.pools[stat_pool_index(StatPool::kAggregate)];
  const std::int64_t peak = (all.*kFastPool[stat]).peak;
  if (stat == kActiveBytes &&
      aggregate_current(&PoolCounters::reserved_bytes) == all.reserved_bytes.peak) {
    return std::min(peak, counters_.active_bytes_at_peak_reserved);
  }
  return peak;
}

// Calls visit(slot) for every counter a cell's amount of `kind` stands for.
template <typename Visit>
void Ledger::for_each_slot_of_cell(std::size_t pool, std::size_t entry, std::size_t kind,
                                   Visit&& visit) noexcept {
  for (std::size_t j = 0; j < kFastPoolStats; ++j) {
    if (kPoolKind[j] != kind) continue;
    visit(Slot{Slot::kPool, pool, j});
    visit(Slot{Slot::kAggregate, 0, j});
  }
  for (std::size_t j = 0; j < kFastUsageStats; ++j) {
    if (kUsageKind[j] != kind) continue;
    visit(Slot{Slot::kStream, entry, j});
    visit(Slot{Slot::kUntagged, 0, j});
  }
}

// Calls visit(slot, amount) for every fast counter this event moves (amount: its raise, zero or
// less where it does not raise the counter).
template <typename Visit>
void Ledger::for_each_fast_slot(const AllocatorEvent& event, Visit&& visit) noexcept {
  const auto amounts = raises_of(event);
  const std::size_t p = static_cast<std::size_t>(event.pool) & 1;
  for (std::size_t j = 0; j < kFastPoolStats; ++j) {
    visit(Slot{Slot::kPool, p, j}, amounts[kPoolKind[j]]);
    visit(Slot{Slot::kAggregate, 0, j}, amounts[kPoolKind[j]]);
  }
  if (!raises_counts(event)) return;  // usage counters only rise with an allocation
  const std::size_t entry = streams_.index_of(streams_.usage_of(event.stream));
  const bool untagged = tag_slot(event.tag) == tag_slot(kUntagged);
  for (std::size_t j = 0; j < kFastUsageStats; ++j) {
    visit(Slot{Slot::kStream, entry, j}, amounts[kUsageKind[j]]);
    if (untagged) visit(Slot{Slot::kUntagged, 0, j}, amounts[kUsageKind[j]]);
  }
}

// Whether a cell of `shard` (pool, share) holds a share of the slot's counter.
bool Ledger::cell_counts_for(const LedgerShard& shard, std::size_t pool, std::size_t share,
                             const Slot& slot) noexcept {
  switch (slot.kind) {
    case Slot::kPool: return slot.which == pool;
    case Slot::kAggregate:
    case Slot::kUntagged: return true;
    case Slot::kStream: break;
  }
  return shard.streams_[share].entry == slot.which;
}

// Takes back every credit standing for the slot's counter (each also counted for the other
// counters of its cell).
void Ledger::revoke_slot_locked(const Slot& slot) noexcept {
  const std::size_t kind =
      slot.kind == Slot::kPool || slot.kind == Slot::kAggregate ? kPoolKind[slot.stat]
                                                                  : kUsageKind[slot.stat];
  for (const auto& owned : shards_) {
    LedgerShard& shard = *owned;
    for (std::size_t p = 0; p < 2; ++p) {
      for (std::size_t s = 0; s < shard.streams_used_; ++s) {
        ShardStat& share = shard.cells_[p][s][kind];
        if (share.credit == 0 || !cell_counts_for(shard, p, s, slot)) continue;
        for_each_slot_of_cell(p, shard.streams_[s].entry, kind,
                              [&](const Slot& other) { outstanding_of(other) -= share.credit; });
        share.credit = 0;
      }
    }
  }
}

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
    for (std::size_t p = 0; p < 2; ++p) {
      for (std::size_t s = 0; s < shard.streams_used_; ++s) {
        for (std::size_t k = 0; k < kAmountKinds; ++k) {
          const std::int64_t credit = shard.cells_[p][s][k].credit;
          for_each_slot_of_cell(p, shard.streams_[s].entry, k,
                                [&](const Slot& slot) { outstanding_of(slot) -= credit; });
        }
      }
    }
    unlock_shards();
    shards_.erase(it);
    return;
  }
  unlock_shards();
}

void Ledger::lock_shards() const noexcept {
  for (const auto& shard : shards_) shard->mutex().lock();
  shards_held_ = true;
}

void Ledger::unlock_shards() const noexcept {
  shards_held_ = false;
  for (auto it = shards_.rbegin(); it != shards_.rend(); ++it) (*it)->mutex().unlock();
}

// Moves every shard's staged records into the trace and its deltas into the counters. No value
// changes (a counter is the ledger's figure plus the shards' deltas), nor any credit.
void Ledger::fold_locked() noexcept {
  for (const auto& shard : shards_) fold_shard_locked(*shard);
}

void Ledger::fold_shard_locked(LedgerShard& shard) noexcept {
  for (std::size_t i = 0; i < shard.staged_count_; ++i) {
    const LedgerShard::StagedRecord& record = shard.staged_[i];
    AllocatorEvent event{record.kind};
    event.pool = record.pool;
    event.tag = kUntagged;
    event.stream = record.stream;
    event.address = record.address;
    event.size = record.size;
    event.requested = record.requested;
    event.inactive_split_delta = record.split_count;
    event.inactive_split_bytes_delta = record.split_bytes;
    trace_.append(event, record.ticks);
    ++counters_.events;
    ++shard_tally_.fast;
    if (record.split_count != 0 || record.split_bytes != 0) ++shard_tally_.fast_with_splits;
  }
  shard.staged_count_ = 0;
  for (std::size_t p = 0; p < 2; ++p) {
    for (std::size_t s = 0; s < shard.streams_used_; ++s) {
      UsageStats& stream = *shard.streams_[s].usage;
      for (std::size_t k = 0; k < kAmountKinds; ++k) {
        ShardStat& share = shard.cells_[p][s][k];
        if (share.delta == 0 && share.increases == 0) continue;
        for_each_slot_of_cell(p, shard.streams_[s].entry, k, [&](const Slot& slot) {
          outstanding_of(slot) -= share.delta;
          Stat* stat = nullptr;
          switch (slot.kind) {
            case Slot::kPool: stat = &(counters_.pools[1 + p].*kFastPool[slot.stat]); break;
            case Slot::kAggregate: break;  // the pools' sum
            case Slot::kUntagged:
              stat = &(tags_[tag_slot(kUntagged)].*kFastUsage[slot.stat]);
              break;
            case Slot::kStream: stat = &(stream.*kFastUsage[slot.stat]); break;
          }
          if (stat == nullptr) return;
          stat->current += share.delta;
          stat->allocated += share.increases;
        });
        share.delta = 0;
        share.increases = 0;
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

// Whether a raise by the ledger's own event keeps every fast counter provably at or below its
// ceiling without looking at the shards: then the counters move and no peak does.
// current + outstanding is the true sum plus the credit held, so this bounds the sum after the
// raise (the ledger's own figure alone may be above it: shards may hold frees).
bool Ledger::raise_fits(const AllocatorEvent& event) noexcept {
  // The twenty comparisons of for_each_fast_slot, spelled out: every heap allocation runs this
  // while shards are open, and the generic slots (a switch per counter) made it a fifth of a
  // mixed-size pair's cost (perf, simulated device).
  // Only front shards are open here (stream shards make every event take the exact path), and
  // they hold no split credit: the split counters' own figures are exact, and apply moves them.
  if (event.requested > event.size) return false;  // malformed: the usual path reports it
  const auto amounts = raises_of(event);
  const std::size_t p = static_cast<std::size_t>(event.pool) & 1;
  const PoolCounters& pool = counters_.pools[1 + p];
  const PoolCounters& small = counters_.pools[stat_pool_index(PoolKind::kSmall)];
  const PoolCounters& large = counters_.pools[stat_pool_index(PoolKind::kLarge)];
  const PoolCounters& all = counters_.pools[stat_pool_index(StatPool::kAggregate)];
  const bool reserved_at_peak =
      small.reserved_bytes.current + large.reserved_bytes.current == all.reserved_bytes.peak;
  bool fits = true;
  for (std::size_t j = 0; j < kFirstSplitStat; ++j) {
    const std::int64_t amount = amounts[kPoolKind[j]];
    const Stat& own = pool.*kFastPool[j];
    fits &= own.current + amount + outstanding_pool_[p][j] <= own.peak;
    std::int64_t ceiling = (all.*kFastPool[j]).peak;
    if (j == kActiveBytes && reserved_at_peak) {
      ceiling = std::min(ceiling, counters_.active_bytes_at_peak_reserved);
    }
    fits &= (small.*kFastPool[j]).current + (large.*kFastPool[j]).current + amount +
                outstanding_aggregate_[j] <=
            ceiling;
  }
  const UsageStats& stream = streams_.usage_of(event.stream);
  const auto& stream_outstanding = outstanding_stream_[streams_.index_of(stream)];
  const bool untagged = tag_slot(event.tag) == tag_slot(kUntagged);
  const UsageStats& tag = tags_[tag_slot(kUntagged)];
  for (std::size_t j = 0; j < kFastUsageStats; ++j) {
    const std::int64_t amount = amounts[kUsageKind[j]];
    const Stat& mine = stream.*kFastUsage[j];
    fits &= mine.current + amount + stream_outstanding[j] <= mine.peak;
    const Stat& untagged_stat = tag.*kFastUsage[j];
    fits &= !untagged ||
            untagged_stat.current + amount + outstanding_untagged_[j] <= untagged_stat.peak;
  }
  return fits;
}

// Shards folded and held: takes back the credit of every counter this raise would otherwise let
// the shards push past its ceiling. The usual update that follows sees the exact sums.
void Ledger::make_room_locked(const AllocatorEvent& event) noexcept {
  for_each_fast_slot(event, [&](const Slot& slot, std::int64_t amount) {
    if (amount > 0 && current_of(slot) + amount + outstanding_of(slot) > ceiling_of(slot)) {
      revoke_slot_locked(slot);
    }
  });
}

void Ledger::revoke_all_credit_locked() noexcept {
  for (const auto& shard : shards_) {
    for (auto& pool : shard->cells_) {
      for (auto& cell : pool) {
        for (ShardStat& stat : cell) stat.credit = 0;
      }
    }
  }
  // Folded: deltas are zero, so nothing is outstanding any more.
  for (auto& pool : outstanding_pool_) pool.fill(0);
  outstanding_aggregate_.fill(0);
  outstanding_untagged_.fill(0);
  for (auto& entry : outstanding_stream_) entry.fill(0);
}

// Gives the event's cell of `shard` a share of the smallest headroom of the counters each of its
// amounts stands for, so its next raises stay on its fast path while others keep some. A front
// cache's shard gets half (the heap's own events, checked against the headroom without folding,
// keep the rest). A stream's shard gets 1/n of it, n the stream shards open (the allocator's own
// events fold and take credit back as needed); when what is left is below 1/n of the credit the
// others hold, theirs is taken back first (they get their share again at their next slow path),
// so that sixteen streams do not halve the headroom down to nothing for the last ones.
void Ledger::grant_credit_locked(LedgerShard& shard, const AllocatorEvent& event) noexcept {
  const std::size_t s = shard.share_of(event.stream);
  if (s == LedgerShard::kStreams || event.tag != kUntagged) return;
  const std::size_t p = static_cast<std::size_t>(event.pool) & 1;
  // Split credit only for a stream's shard: a front cache's events carry no split changes, and
  // credit it held would only make the heap's own events take the exact path.
  const std::size_t kinds = shard.for_stream_ ? kAmountKinds : kSplitCount;
  const std::int64_t shares =
      shard.for_stream_ ? std::max<std::int64_t>(1, static_cast<std::int64_t>(stream_shard_count_))
                        : 2;
  const std::size_t entry = shard.streams_[s].entry;
  for (std::size_t k = 0; k < kinds; ++k) {
    const auto headroom_of_cell = [&] {
      std::int64_t headroom = INT64_MAX;
      std::int64_t held = 0;
      std::int64_t grant = INT64_MAX;  // the smallest share over the slots
      for_each_slot_of_cell(p, entry, k, [&](const Slot& slot) {
        const std::int64_t room = ceiling_of(slot) - current_of(slot) - outstanding_of(slot);
        headroom = std::min(headroom, room);
        // A stream's own usage counter has one stream shard: it may have all of the room.
        const bool own = shard.for_stream_ && slot.kind == Slot::kStream;
        grant = std::min(grant, own ? room : (room + shares - 1) / shares);
        if (!own) held = std::max(held, outstanding_of(slot));
      });
      return std::tuple{headroom, held, grant};
    };
    auto [headroom, held, grant] = headroom_of_cell();
    if (shard.for_stream_ && shares > 1 && headroom < held / shares) {
      for_each_slot_of_cell(p, entry, k, [&](const Slot& slot) { revoke_slot_locked(slot); });
      std::tie(headroom, held, grant) = headroom_of_cell();
    }
    if (headroom <= 0) continue;
    shard.cells_[p][s][k].credit += grant;
    for_each_slot_of_cell(p, shard.streams_[s].entry, k,
                          [&](const Slot& slot) { outstanding_of(slot) += grant; });
  }
}

void Ledger::apply_from_shard(LedgerShard& shard, const AllocatorEvent& event) noexcept {
  std::lock_guard lock(mutex_);
  {
    // Most often only its staged records are full: moving them into the trace needs no other
    // shard (no credit changes), and the event then fits the shard's own credit.
    std::lock_guard shard_lock(shard.mutex());
    fold_shard_locked(shard);
    if (shard.try_apply(event)) return;
  }
  ++shard_tally_.slow;
  lock_shards();
  fold_locked();
  const bool fast_kind = event.kind == EventKind::kAlloc || event.kind == EventKind::kFree;
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
        for (std::size_t p = 0; p < 2; ++p) {
          for (std::size_t k = 0; k < kAmountKinds; ++k) {
            ShardStat& cell = shard.cells_[p][s][k];
            for_each_slot_of_cell(p, shard.streams_[s].entry, k,
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
  make_room_locked(event);
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
    if (event.kind == EventKind::kAlloc) {
      apply_alloc_below_peaks(event);
    } else {
      apply(event);
    }
    return;
  }
  lock_shards();
  fold_locked();
  make_room_locked(event);
  // Credit for the aggregate's active bytes was granted against a ceiling that may drop now.
  if (reserved_peak) revoke_slot_locked(Slot{Slot::kAggregate, 0, kActiveBytes});
  apply(event);
  unlock_shards();
}

}  // namespace vramledger
