// The escrow's credit (ledger_shard.hpp; docs/design.md, 5.2): which counters a cell stands
// for, what headroom they have, and how credit is granted and taken back.
#include <algorithm>
#include <array>
#include <cassert>
#include <tuple>
#include <utility>

#include "accounting/ledger.hpp"
#include "accounting/ledger_slots.hpp"

namespace vramledger {

using namespace ledger_slots;

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

// Whether a cell of `shard` (cell, share) holds a share of the slot's counter.
bool Ledger::cell_counts_for(const LedgerShard& shard, std::size_t cell, std::size_t share,
                             const Slot& slot) noexcept {
  if (slot.kind == Slot::kPool) return slot.which == cell;  // a pool's cell only
  const bool own_stream = slot.kind != Slot::kStream || shard.streams_[share].entry == slot.which;
  if (!shard.for_stream_) return cell < LedgerShard::kCommon && own_stream;  // one cell for all
  if (slot.kind == Slot::kStream) return cell == LedgerShard::kOwnStream && own_stream;
  return cell == LedgerShard::kCommon;  // the aggregate's and the untagged tag's
}

// Takes back every credit standing for the slot's counter (each also counted for the other
// counters of its cell).
void Ledger::revoke_slot_locked(const Slot& slot, bool stream_shards_hold_credit) noexcept {
  const std::size_t kind =
      slot.kind == Slot::kPool || slot.kind == Slot::kAggregate ? kPoolKind[slot.stat]
                                                                  : kUsageKind[slot.stat];
  for (const auto& owned : shards_) {
    LedgerShard& shard = *owned;
    if (shard.for_stream_ && !stream_shards_hold_credit) {
      assert(std::all_of(shard.cells_.begin(), shard.cells_.end(), [&](const auto& cell) {
        return std::all_of(cell.begin(), cell.end(),
                           [&](const LedgerShard::Cell& c) { return c[kind].credit == 0; });
      }));
      continue;
    }
    for (std::size_t c = 0; c < LedgerShard::kCells; ++c) {
      for (std::size_t s = 0; s < shard.streams_used_; ++s) {
        ShardStat& share = shard.cells_[c][s][kind];
        if (share.credit == 0 || !cell_counts_for(shard, c, s, slot)) continue;
        for_each_slot_of_cell(shard, c, s, kind,
                              [&](const Slot& other) { outstanding_of(other) -= share.credit; });
        share.credit = 0;
      }
    }
  }
  // The spare credit that stands for it (for_each_slot_of_spare, for_each_slot_of_stream_spare):
  // its pool's cell, the common cell (the aggregate's and the untagged tag's), or its stream's.
  switch (slot.kind) {
    case Slot::kPool: revoke_spare_cell_locked(slot.which, kind); break;
    case Slot::kAggregate:
    case Slot::kUntagged: revoke_spare_cell_locked(LedgerShard::kCommon, kind); break;
    case Slot::kStream: revoke_stream_spare_locked(slot.which, kind); break;
  }
}

// Whether a raise by the ledger's own event keeps every fast counter provably at or below its
// ceiling without looking at the shards: then the counters move and no peak does.
// current + outstanding is the true sum plus the credit held, so this bounds the sum after the
// raise (the ledger's own figure alone may be above it: shards may hold frees).
bool Ledger::raise_fits(const AllocatorEvent& event) noexcept {
  // The twenty comparisons, one per fast counter the event moves, spelled out: every heap
  // allocation runs this while shards are open, and the generic slots (a switch per counter)
  // made it a fifth of a mixed-size pair's cost (perf, simulated device).
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
// The counters are every fast one the event moves (its pool's and the aggregate's, then, for an
// allocation, its stream's and the untagged tag's), read directly rather than through the
// generic slots (a call and a switch per read, three reads a counter). Each check reads
// `outstanding` as the revokes before it left it: a revoke lowers that of every counter its
// credit stood for. `stream_shards_hold_credit`: false right after gather_spare_credit_locked
// (every shard held), when their credit is all in the spares: the revokes skip their cells
// (the walk found nothing there, and was a third of an exact-path event with 16 stream shards).
void Ledger::make_room_locked(const AllocatorEvent& event,
                              bool stream_shards_hold_credit) noexcept {
  const auto amounts = raises_of(event);
  const auto revoke_if_past = [&](const Slot& slot, std::int64_t current, std::int64_t amount,
                                  std::int64_t outstanding, std::int64_t ceiling) {
    if (amount > 0 && current + amount + outstanding > ceiling) {
      revoke_slot_locked(slot, stream_shards_hold_credit);
    }
  };
  const std::size_t p = static_cast<std::size_t>(event.pool) & 1;
  for (std::size_t j = 0; j < kFastPoolStats; ++j) {
    const std::int64_t amount = amounts[kPoolKind[j]];
    if (amount <= 0) continue;
    const Stat& pool = counters_.pools[1 + p].*kFastPool[j];
    revoke_if_past(Slot{Slot::kPool, p, j}, pool.current, amount, outstanding_pool_[p][j],
                   pool.peak);
    revoke_if_past(Slot{Slot::kAggregate, 0, j}, aggregate_current(kFastPool[j]), amount,
                   outstanding_aggregate_[j], fast_ceiling(j));
  }
  if (!raises_counts(event)) return;  // usage counters only rise with an allocation
  const std::size_t entry = streams_.index_of(streams_.usage_of(event.stream));
  const bool untagged = tag_slot(event.tag) == tag_slot(kUntagged);
  for (std::size_t j = 0; j < kFastUsageStats; ++j) {
    const std::int64_t amount = amounts[kUsageKind[j]];
    if (amount <= 0) continue;
    const Stat& stream = streams_.at(entry).*kFastUsage[j];
    revoke_if_past(Slot{Slot::kStream, entry, j}, stream.current, amount,
                   outstanding_stream_[entry][j], stream.peak);
    if (!untagged) continue;
    const Stat& tag = tags_[tag_slot(kUntagged)].*kFastUsage[j];
    revoke_if_past(Slot{Slot::kUntagged, 0, j}, tag.current, amount, outstanding_untagged_[j],
                   tag.peak);
  }
}

void Ledger::revoke_all_credit_locked() noexcept {
  for (const auto& shard : shards_) {
    for (auto& pool : shard->cells_) {
      for (auto& cell : pool) {
        for (ShardStat& stat : cell) stat.credit = 0;
      }
    }
  }
  for (SpareCell& cell : spare_credit_) {
    for (auto& credit : cell.credit) credit.store(0, std::memory_order_relaxed);
  }
  for (StreamSpare& spare : stream_spare_) {
    for (auto& credit : spare.credit) credit.store(0, std::memory_order_relaxed);
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
// keep the rest). For a stream's shard, the room of its own stream's counters goes to that
// stream's spare, and the room of its pool's, the aggregate's and the untagged tag's to the
// spare credit; every stream shard draws from them as it needs. Fair shares of the pools' room,
// fixed at each slow path, ran out at four threads and more: a fifth of the mixed ring's events
// took the slow path on the H200 host (bench/results/gpu/2026-12-02-h200-session-10.md). The
// own stream's room granted to the asking shard left a stream's other lanes (a shard each,
// detail/stream_lanes.cpp in the policy) none, since every slow path takes back the credit of
// the counters it raises (make_room_locked): each of their next raises took the slow path in
// turn (7-10% of the shard events on the H200 host with 4-16 lanes).
void Ledger::grant_credit_locked(LedgerShard& shard, const AllocatorEvent& event) noexcept {
  const std::size_t s = shard.share_of(event.stream);
  if (s == LedgerShard::kStreams || event.tag != kUntagged) return;
  const std::size_t p = static_cast<std::size_t>(event.pool) & 1;
  if (!shard.for_stream_) {
    // Split credit only for a stream's shard: a front cache's events carry no split changes, and
    // credit it held would only make the heap's own events take the exact path.
    grant_cell_credit_locked(shard, p, s, kSplitCount, 2);
    return;
  }
  // Each spare gets the smallest headroom of the counters it stands for (for_each_slot_of_spare,
  // for_each_slot_of_stream_spare), counted in their `outstanding`. Every counter's headroom is
  // read once, here: through the generic slots (a call and a switch per read) this was a
  // quarter of an exact-path event with 16 stream shards. Each counter belongs to one spare, so
  // the order of the spares changes nothing.
  const std::size_t entry = shard.streams_[s].entry;
  std::array<std::array<std::int64_t, kFastPoolStats>, 2> pool_room{};
  std::array<std::int64_t, kFastPoolStats> aggregate_room{};
  for (std::size_t j = 0; j < kFastPoolStats; ++j) {
    for (std::size_t q = 0; q < 2; ++q) {
      const Stat& stat = counters_.pools[1 + q].*kFastPool[j];
      pool_room[q][j] = stat.peak - stat.current - outstanding_pool_[q][j];
    }
    aggregate_room[j] =
        fast_ceiling(j) - aggregate_current(kFastPool[j]) - outstanding_aggregate_[j];
  }
  const UsageStats& untagged = tags_[tag_slot(kUntagged)];
  const UsageStats& stream = streams_.at(entry);
  std::array<std::int64_t, kFastUsageStats> untagged_room{};
  std::array<std::int64_t, kFastUsageStats> stream_room{};
  for (std::size_t j = 0; j < kFastUsageStats; ++j) {
    const Stat& tag_stat = untagged.*kFastUsage[j];
    untagged_room[j] = tag_stat.peak - tag_stat.current - outstanding_untagged_[j];
    const Stat& stream_stat = stream.*kFastUsage[j];
    stream_room[j] = stream_stat.peak - stream_stat.current - outstanding_stream_[entry][j];
  }
  // The smallest room of the counters of `kind` in `rooms` (their kinds: `kinds`), folded into
  // `room`; then, once `room` is final, `outstanding` of each raised by it.
  const auto smallest = [](std::int64_t& room, const auto& rooms, const auto& kinds,
                           std::size_t kind) {
    for (std::size_t j = 0; j < rooms.size(); ++j) {
      if (kinds[j] == kind) room = std::min(room, rooms[j]);
    }
  };
  const auto count = [](std::int64_t room, auto& outstanding, const auto& kinds,
                        std::size_t kind) {
    for (std::size_t j = 0; j < outstanding.size(); ++j) {
      if (kinds[j] == kind) outstanding[j] += room;
    }
  };
  const auto put = [](std::atomic<std::int64_t>& spare, std::int64_t room) {
    if (room <= 0 || room == INT64_MAX) return false;
    spare.fetch_add(room, std::memory_order_relaxed);
    return true;
  };
  for (std::size_t k = 0; k < kSplitCount; ++k) {
    std::int64_t room = INT64_MAX;
    smallest(room, stream_room, kUsageKind, k);
    if (put(stream_spare_[entry].credit[k], room)) {
      count(room, outstanding_stream_[entry], kUsageKind, k);
    }
  }
  for (std::size_t k = 0; k < kAmountKinds; ++k) {
    for (std::size_t q = 0; q < 2; ++q) {
      std::int64_t room = INT64_MAX;
      smallest(room, pool_room[q], kPoolKind, k);
      if (put(spare_credit_[q].credit[k], room)) count(room, outstanding_pool_[q], kPoolKind, k);
    }
    std::int64_t room = INT64_MAX;
    smallest(room, aggregate_room, kPoolKind, k);
    smallest(room, untagged_room, kUsageKind, k);
    if (put(spare_credit_[LedgerShard::kCommon].credit[k], room)) {
      count(room, outstanding_aggregate_, kPoolKind, k);
      count(room, outstanding_untagged_, kUsageKind, k);
    }
  }
}

void Ledger::grant_cell_credit_locked(LedgerShard& shard, std::size_t c, std::size_t s,
                                      std::size_t kinds, std::int64_t shares) noexcept {
  for (std::size_t k = 0; k < kinds; ++k) {
    std::int64_t headroom = INT64_MAX;
    for_each_slot_of_cell(shard, c, s, k, [&](const Slot& slot) {
      headroom = std::min(headroom, ceiling_of(slot) - current_of(slot) - outstanding_of(slot));
    });
    if (headroom <= 0 || headroom == INT64_MAX) continue;
    const std::int64_t grant = (headroom + shares - 1) / shares;
    shard.cells_[c][s][k].credit += grant;
    for_each_slot_of_cell(shard, c, s, k, [&](const Slot& slot) { outstanding_of(slot) += grant; });
  }
}

// ------------------------------------------------------------------ spare credit

namespace {

// At least `need` of `spare` into `credit`, with a sixteenth of what is left beyond it, or false
// and nothing taken: one compare-exchange loop, no lock. A sixteenth, not an eighth: as many
// takes, and what a shard takes beyond its need no longer leaves the spare empty for the next
// one (exact-path events per thousand pairs at 8 / 16 streams in turn: paged 11.2 / 21.1 ->
// 9.3 / 12.5, segment 7.8 / 14.7 -> 6.5 / 8.3; bench/results/2026-12-05-session-29-cpu.md).
bool take_from_spare(std::atomic<std::int64_t>& spare, std::int64_t need,
                     std::int64_t& credit) noexcept {
  need -= credit;
  std::int64_t available = spare.load(std::memory_order_relaxed);
  std::int64_t take = 0;
  do {
    if (available < need) return false;
    take = need + (available - need) / 16;
  } while (!spare.compare_exchange_weak(available, available - take, std::memory_order_relaxed));
  credit += take;
  return true;
}

}  // namespace

// On a stream shard's fast path, under its mutex only: at least `need` of the spare credit of
// (cell, kind) into `credit`, with a sixteenth of what is left beyond it (so the next raises need
// not come back), or false and nothing taken. The credit only changes hands: `outstanding`
// counts it either way. Spare credit came from shards folded before they gave it (or from the
// slow path, after folding all), so the trace holds every free that made it before any raise it
// pays for (docs/design.md 5.2: the trace replays to the same peaks).
bool Ledger::take_spare_credit(std::size_t cell, std::size_t kind, std::int64_t need,
                               std::int64_t& credit) noexcept {
  return take_from_spare(spare_credit_[cell].credit[kind], need, credit);
}

// The same for a stream's own counters (`entry`: its StreamUsageTable index), whose spare the
// lanes of one stream share (stream_spare_).
bool Ledger::take_stream_spare_credit(std::size_t entry, std::size_t kind, std::int64_t need,
                                      std::int64_t& credit) noexcept {
  return take_from_spare(stream_spare_[entry].credit[kind], need, credit);
}

// Under `shard`'s mutex, the shard just folded or its records just handed over (the ledger's
// mutex is not needed: the spares are atomics, and whatever else moves them in bulk holds every
// shard's mutex): 1/`divisor` of each of its pool, common and own-stream credits goes to the
// spares. Only the holder changes, so `outstanding` does not.
bool Ledger::give_credit_to_spare_locked(LedgerShard& shard, std::int64_t divisor) noexcept {
  bool gave = false;
  const auto give = [divisor, &gave](ShardStat& share, std::atomic<std::int64_t>& spare) {
    const std::int64_t given = share.credit / divisor;
    if (given <= 0) return;
    share.credit -= given;
    spare.fetch_add(given, std::memory_order_relaxed);
    gave = true;
  };
  for (std::size_t s = 0; s < shard.streams_used_; ++s) {
    for (std::size_t c = 0; c < LedgerShard::kSpareCells; ++c) {
      for (std::size_t k = 0; k < kAmountKinds; ++k) {
        give(shard.cells_[c][s][k], spare_credit_[c].credit[k]);
      }
    }
    for (std::size_t k = 0; k < kSplitCount; ++k) {
      give(shard.cells_[LedgerShard::kOwnStream][s][k],
           stream_spare_[shard.streams_[s].entry].credit[k]);
    }
  }
  return gave;
}

// Before the exact path (Ledger::apply_from_shard), under the ledger's mutex (so the shards stay
// open), holding no other shard's mutex while it visits one: the other stream shards, one at a
// time from where the last gather stopped, each handing its staged records to the trace (so the
// frees that made its credit are in the trace before any raise it pays for) and giving all its
// pool, common and own-stream credit to the spares; after each that gave some, `event` is tried
// on `needy`'s fast path again. A shard held by its thread, or biased to it (taking it would
// revoke the bias: a process-wide barrier, which the exact path pays once for all), is passed
// over. True if the event was counted.
bool Ledger::gather_credit_shard_by_shard(LedgerShard& needy, const AllocatorEvent& event) noexcept {
  std::lock_guard lock(mutex_);
  const std::size_t count = shards_.size();
  for (std::size_t visited = 0; visited < count; ++visited) {
    LedgerShard& shard = *shards_[(gather_start_ + visited) % count];
    if (!shard.for_stream_ || &shard == &needy) continue;
    BiasedMutex& mutex = shard.mutex();
    if (!mutex.try_lock_without_revoking()) continue;
    bool moved = false;
    if (shard.staged_count_ != 0) {
      hand_over_records_locked(shard);  // gives half its credit to the spares
      moved = true;
    }
    moved |= give_credit_to_spare_locked(shard, 1);
    mutex.unlock_auto();
    if (!moved) continue;
    BiasedMutex& own = needy.mutex();
    own.lock_auto();
    if (needy.staged_count_ == LedgerShard::kStaged) hand_over_records_locked(needy);
    const bool counted = needy.try_apply(event);
    own.unlock_auto();
    if (counted) {
      gather_start_ = (gather_start_ + visited + 1) % count;  // the next gather drains others first
      return true;
    }
  }
  return false;
}

// At a stream shard's fold: half its pool, common and own-stream credit goes to the spares,
// where a stream (or lane) that needs it finds it (a shard's frees add to its own credit, which
// would otherwise stay there while other streams' raises go to the slow path).
void Ledger::return_spare_credit_locked(LedgerShard& shard) noexcept {
  give_credit_to_spare_locked(shard, 2);
}

// At the slow path, every shard held and folded: every stream shard's pool, common and own-stream
// credit goes to the spares (each then takes what it needs), so no stream, nor a lane of one,
// keeps room another lacks.
// The pools' and the common cells' credit is summed first and added to each spare once (one
// atomic add per spare, not one per shard and cell).
void Ledger::gather_spare_credit_locked() noexcept {
  std::array<std::array<std::int64_t, kAmountKinds>, LedgerShard::kSpareCells> gathered{};
  for (const auto& owned : shards_) {
    LedgerShard& shard = *owned;
    if (!shard.for_stream_) continue;
    for (std::size_t s = 0; s < shard.streams_used_; ++s) {
      for (std::size_t c = 0; c < LedgerShard::kSpareCells; ++c) {
        for (std::size_t k = 0; k < kAmountKinds; ++k) {
          ShardStat& share = shard.cells_[c][s][k];
          if (share.credit <= 0) continue;
          gathered[c][k] += share.credit;
          share.credit = 0;
        }
      }
      for (std::size_t k = 0; k < kSplitCount; ++k) {
        ShardStat& share = shard.cells_[LedgerShard::kOwnStream][s][k];
        if (share.credit <= 0) continue;
        stream_spare_[shard.streams_[s].entry].credit[k].fetch_add(share.credit,
                                                                   std::memory_order_relaxed);
        share.credit = 0;
      }
    }
  }
  for (std::size_t c = 0; c < LedgerShard::kSpareCells; ++c) {
    for (std::size_t k = 0; k < kAmountKinds; ++k) {
      if (gathered[c][k] > 0) {
        spare_credit_[c].credit[k].fetch_add(gathered[c][k], std::memory_order_relaxed);
      }
    }
  }
}

// Every shard held: `spare` taken back from the `outstanding` of the counters it stands for.
template <typename ForEachSlot>
void Ledger::revoke_spare_locked(std::atomic<std::int64_t>& spare,
                                 ForEachSlot&& for_each_slot) noexcept {
  const std::int64_t taken = spare.exchange(0, std::memory_order_relaxed);
  if (taken == 0) return;
  for_each_slot([&](const Slot& slot) { outstanding_of(slot) -= taken; });
}

// Every shard held: the spare credit of (cell, kind) taken back.
void Ledger::revoke_spare_cell_locked(std::size_t cell, std::size_t kind) noexcept {
  revoke_spare_locked(spare_credit_[cell].credit[kind],
                      [&](auto&& visit) { for_each_slot_of_spare(cell, kind, visit); });
}

// Every shard held: the spare credit of stream `entry`'s own counters of `kind` taken back.
void Ledger::revoke_stream_spare_locked(std::size_t entry, std::size_t kind) noexcept {
  revoke_spare_locked(stream_spare_[entry].credit[kind],
                      [&](auto&& visit) { for_each_slot_of_stream_spare(entry, kind, visit); });
}

// Every shard held: all spare credit taken back (the last stream shard closed).
void Ledger::revoke_spare_credit_locked() noexcept {
  for (std::size_t c = 0; c < LedgerShard::kSpareCells; ++c) {
    for (std::size_t k = 0; k < kAmountKinds; ++k) revoke_spare_cell_locked(c, k);
  }
  for (std::size_t entry = 0; entry < stream_spare_.size(); ++entry) {
    for (std::size_t k = 0; k < kSplitCount; ++k) revoke_stream_spare_locked(entry, k);
  }
}

}  // namespace vramledger
