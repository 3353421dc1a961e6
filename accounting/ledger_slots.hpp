// The ledger's shards, inside the ledger: which counters a slot and a shard's cell stand for
// (ledger_shards.cpp: the shards' fast path, folds and slow path; ledger_shard_credit.cpp: the
// escrow's credit). Included by those two files only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "accounting/ledger.hpp"

namespace vramledger {

// Which counter a slot names: a pool's, the aggregate's, the untagged tag's or a stream entry's.
struct Ledger::Slot {
  enum Kind { kPool, kAggregate, kUntagged, kStream } kind;
  std::size_t which;  // pool index, or StreamUsageTable::index_of
  std::size_t stat;   // index into kFastPool / kFastUsage
};

namespace ledger_slots {

using PoolStat = Stat PoolCounters::*;
using UsageStat = Stat UsageStats::*;

// The counters an allocate/free pair moves, and the kind of amount each moves by.
inline constexpr PoolStat kFastPool[kFastPoolStats] = {
    &PoolCounters::allocation,      &PoolCounters::active,
    &PoolCounters::allocated_bytes, &PoolCounters::active_bytes,
    &PoolCounters::requested_bytes, &PoolCounters::allocated_requested_bytes,
    &PoolCounters::inactive_split,  &PoolCounters::inactive_split_bytes};
inline constexpr std::size_t kPoolKind[kFastPoolStats] = {0, 0, 1, 1, 2, 2, kSplitCount, kSplitBytes};
inline constexpr std::size_t kFirstSplitStat = 6;
inline constexpr std::size_t kActiveBytes = 3;
inline constexpr UsageStat kFastUsage[kFastUsageStats] = {
    &UsageStats::allocation, &UsageStats::allocated_bytes, &UsageStats::requested_bytes,
    &UsageStats::active_bytes};
inline constexpr std::size_t kUsageKind[kFastUsageStats] = {0, 1, 2, 1};

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

}  // namespace ledger_slots

// Calls visit(slot) for every counter the amount of `kind` of the shard's cell (cell, share)
// stands for: a front shard's cell (one per pool) for its pool's, the aggregate's, its stream's
// and the untagged tag's; a stream shard's pool cell for its pool's only, its common cell
// (LedgerShard::kCommon) for the aggregate's and the untagged tag's, and its own stream's cell
// (LedgerShard::kOwnStream) for its stream's.
template <typename Visit>
void Ledger::for_each_slot_of_cell(const LedgerShard& shard, std::size_t cell, std::size_t share,
                                   std::size_t kind, Visit&& visit) noexcept {
  if (!shard.for_stream_ && cell >= LedgerShard::kCommon) return;  // unused by front shards
  const bool pool_part = !shard.for_stream_ || cell < LedgerShard::kCommon;
  const bool common_part = !shard.for_stream_ || cell == LedgerShard::kCommon;
  const bool stream_part = !shard.for_stream_ || cell == LedgerShard::kOwnStream;
  for (std::size_t j = 0; j < kFastPoolStats; ++j) {
    if (ledger_slots::kPoolKind[j] != kind) continue;
    if (pool_part) visit(Slot{Slot::kPool, cell, j});
    if (common_part) visit(Slot{Slot::kAggregate, 0, j});
  }
  for (std::size_t j = 0; j < kFastUsageStats; ++j) {
    if (ledger_slots::kUsageKind[j] != kind) continue;
    if (stream_part) visit(Slot{Slot::kStream, shard.streams_[share].entry, j});
    if (common_part) visit(Slot{Slot::kUntagged, 0, j});
  }
}

// Calls visit(slot) for every counter the spare credit of a stream shard's cell `cell` (a pool's
// or the common one) of `kind` stands for: as that cell of any stream shard does.
template <typename Visit>
void Ledger::for_each_slot_of_spare(std::size_t cell, std::size_t kind, Visit&& visit) noexcept {
  const bool common = cell == LedgerShard::kCommon;
  for (std::size_t j = 0; j < kFastPoolStats; ++j) {
    if (ledger_slots::kPoolKind[j] != kind) continue;
    visit(common ? Slot{Slot::kAggregate, 0, j} : Slot{Slot::kPool, cell, j});
  }
  if (!common) return;
  for (std::size_t j = 0; j < kFastUsageStats; ++j) {
    if (ledger_slots::kUsageKind[j] == kind) visit(Slot{Slot::kUntagged, 0, j});
  }
}

// Calls visit(slot) for every counter the spare credit of stream `entry`'s own counters of
// `kind` stands for (Ledger::stream_spare_): as the own-stream cell of any of its shards does.
template <typename Visit>
void Ledger::for_each_slot_of_stream_spare(std::size_t entry, std::size_t kind,
                                           Visit&& visit) noexcept {
  for (std::size_t j = 0; j < kFastUsageStats; ++j) {
    if (ledger_slots::kUsageKind[j] == kind) visit(Slot{Slot::kStream, entry, j});
  }
}

}  // namespace vramledger
