// One thread's share of the ledger: what a front cache (allocator/detail/thread_cache.hpp) counts
// without the allocator's lock, and the escrow that keeps every peak exact (docs/design.md, 5.2).
// A published stream of the per-stream fast path (allocator/detail/stream_fast_path.cpp) has one
// too (Ledger::open_stream_shard), which also counts the split changes its events carry
// (inactive split count and bytes, raised or lowered) with cells and credit of their own.
//
// For the counters a front cache moves (the six an allocate/free pair touches, per pool and for
// the aggregate; the four usage counters of its streams and of the untagged tag) a shard keeps
// `delta` (its change since the last fold into the ledger), `increases` (their positive part, for
// the running totals) and `credit`: how far it may still raise them on its own. The ledger
// keeps, per counter, `outstanding` = the sum over shards of delta + credit (plus, for stream
// shards' shared counters, the spare credit no shard holds), which no fast operation changes (a
// raise moves credit into delta, a decrease moves it back; a stream shard taking spare credit
// moves it between holders). Invariant: ledger's current + outstanding <= peak (or the ceiling,
// see Ledger::fast_ceiling), hence the true sum current + sum(delta) never exceeds the peak while
// shards stay within their credit: the peak is unchanged. A raise without credit (a stream
// shard's: nor enough spare) takes the slow path (Ledger::apply_from_shard): every shard folded
// under every shard's mutex, so the sum is exact and the peak is raised to exactly the value the
// sum reaches.
//
// Trace records wait in a small array (`staged`) and join the ledger's trace at the next fold, or,
// when the array is full, on their own under the shard's mutex (Ledger::hand_over_records_locked);
// credit moves between shards only through a fold (spare credit is given by a shard just folded,
// or by the slow path after folding all), so a replay of the trace reaches the same peaks
// (docs/design.md, 5.2).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "accounting/ledger_counters.hpp"
#include "accounting/trace_record.hpp"
#include "allocator/allocator_events.hpp"

namespace vramledger {

class Ledger;

// What one shard holds of one kind of amount in one cell (see LedgerShard).
struct ShardStat {
  std::int64_t delta = 0;
  std::int64_t increases = 0;
  std::int64_t credit = 0;
};

// The six PoolCounters an allocate/free pair moves, then the two its split changes move (torch's
// inactive split, the paged heap's page fragments: per-stream shards count them), and the four
// UsageStats.
inline constexpr std::size_t kFastPoolStats = 8;
inline constexpr std::size_t kFastUsageStats = 4;
// The amounts they move by: 1 (counts), the block size (bytes), the request, and the event's
// split changes (count, bytes; signed: an event may raise or lower them).
inline constexpr std::size_t kAmountKinds = 5;
inline constexpr std::size_t kSplitCount = 3;  // the amount kinds of the split changes
inline constexpr std::size_t kSplitBytes = 4;

// A shard's figures are kept per cell, one cell per (pool, stream) it has seen, and per kind of
// amount: a cell's count delta is that of its pool's allocation and active counts, of the
// aggregate's, of its stream's allocation count and of the untagged tag's. So the fast path
// checks and moves three credits, not twenty counters; a cell's credit is counted in the
// `outstanding` of every counter it stands for, and granted within the smallest headroom.
// Cache-line aligned: each stream's thread writes its shard at every operation, and two shards
// allocated side by side would otherwise share the line between one's end and the other's start.
class alignas(64) LedgerShard final : public ObserverShard {
 public:
  static constexpr std::size_t kStreams = 4;   // streams a shard counts for itself
  static constexpr std::size_t kStaged = 128;  // trace records held before a fold

  // `for_stream`: the shard of a stream's heaps on the per-stream fast path (Ledger::
  // open_stream_shard), which also counts split changes; else a front cache's.
  LedgerShard(Ledger& ledger, bool for_stream) : ledger_(ledger), for_stream_(for_stream) {}

  bool try_apply(const AllocatorEvent& event) noexcept override;
  void apply_slow(const AllocatorEvent& event) noexcept override;
  void publish() noexcept override;

  struct StreamShare {
    StreamHandle stream = 0;
    std::size_t entry = 0;  // StreamUsageTable::index_of
    UsageStats* usage = nullptr;
  };
  using Cell = std::array<ShardStat, kAmountKinds>;

 private:
  friend class Ledger;

  [[gnu::noinline]] bool try_apply_for_stream(const AllocatorEvent& event) noexcept;
  void stage_record(const AllocatorEvent& event, std::uint32_t kind, std::uint32_t pool,
                    std::int64_t size, std::int64_t requested, std::int64_t split_count,
                    std::int64_t split_bytes) noexcept;

  std::size_t share_of(StreamHandle stream) const noexcept {
    for (std::size_t i = 0; i < streams_used_; ++i) {
      if (streams_[i].stream == stream) return i;
    }
    return kStreams;
  }

  Ledger& ledger_;
  bool for_stream_;
  // [cell][stream share]: cells 0 and 1 are the pools'; a front shard's stands for its pool's,
  // the aggregate's, its stream's and the untagged tag's counters. A stream shard's stands for
  // its pool's only, kCommon for the aggregate's and the untagged tag's, and kOwnStream for its
  // stream's (counts, bytes and requests: a stream's usage has no split figures): in a ring
  // whose stream count sits at its peak, a free in one pool then pays for an allocation in the
  // other (the common credit), as far as that pool is below its own peak. A stream shard's pool
  // and common credit stand for counters every stream moves, so it may come from and go back to
  // the ledger's spare credit (Ledger::take_spare_credit) without the slow path; its own
  // stream's credit likewise comes from and goes back to that stream's own spare
  // (Ledger::stream_spare_), which the lanes of a stream (threads contending on it, each with
  // heaps and a shard of its own) share.
  static constexpr std::size_t kCommon = 2;
  static constexpr std::size_t kOwnStream = 3;
  static constexpr std::size_t kCells = 4;
  static constexpr std::size_t kSpareCells = 3;  // the cells the spare credit stands for
  std::array<std::array<Cell, kStreams>, kCells> cells_{};
  std::array<StreamShare, kStreams> streams_{};
  std::size_t streams_used_ = 0;
  std::size_t next_victim_ = 0;  // the stream share given up for a fifth stream (round robin)
  // Staged records are the trace's own records (an untagged kAlloc or kFree), written field by
  // field as the event arrives, so that a fold moves them into the ring with one block copy
  // (EventTrace::append_records): converting each one back into an event and appending it field
  // by field was 16% of a front cache's warm pair (perf, FixedSize/512, 2026-12-03).
  std::array<TraceRecord, kStaged> staged_;  // the first staged_count_ are set
  std::size_t staged_count_ = 0;
  std::size_t staged_with_splits_ = 0;  // of those, records that carry split changes
  // Records already in the trace (Ledger::hand_over_records_locked) whose events the ledger's
  // event count and shard tally take in at the next fold.
  std::size_t handed_over_ = 0;
  std::size_t handed_over_with_splits_ = 0;
};

}  // namespace vramledger
