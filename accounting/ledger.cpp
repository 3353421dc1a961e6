#include "accounting/ledger.hpp"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <type_traits>

#include "accounting/cheap_clock.hpp"
#include "accounting/counters_text.hpp"
#include "accounting/fragmentation.hpp"

namespace vramledger {

// The counters one pool event touches, in the storage form described in ledger.hpp: a pool keeps
// current, peak and the total of increases; the aggregate keeps only its peak, its current being
// the pools' sum.
struct PoolUpdate {
  PoolCounters& pool;         // the event's pool
  const PoolCounters& other;  // the other pool
  PoolCounters& aggregate;
};

namespace {

using PoolStat = Stat PoolCounters::*;

inline void raise(const PoolUpdate& update, PoolStat stat, std::int64_t amount) {
  Stat& mine = update.pool.*stat;
  mine.increase(amount);
  const std::int64_t total = mine.current + (update.other.*stat).current;
  Stat& aggregate = update.aggregate.*stat;
  if (total > aggregate.peak) aggregate.peak = total;
}
// Returns the new value. Callers OR the results and test the sign once per event: any negative
// value makes the OR negative.
inline std::int64_t lower(const PoolUpdate& update, PoolStat stat, std::int64_t amount) {
  Stat& mine = update.pool.*stat;
  mine.current -= amount;
  return mine.current;
}

// A signed change: an increase or a decrease. Returns the new value.
inline std::int64_t apply_delta(const PoolUpdate& update, PoolStat stat, std::int64_t delta) {
  if (delta >= 0) {
    raise(update, stat, delta);
    return (update.pool.*stat).current;
  }
  return lower(update, stat, -delta);
}

// Storage form to torch's Stat.
Stat materialized(const Stat& stored) {
  Stat stat = stored;
  stat.freed = stored.allocated + stored.freed - stored.current;
  return stat;
}
UsageStats materialized(const UsageStats& stored) {
  UsageStats usage = stored;
  for_each_usage_stat(usage, [](const char*, Stat& stat) { stat = materialized(stat); });
  return usage;
}

void reset_accumulated_in_storage(Stat& stored) {
  stored.allocated = 0;
  stored.freed = stored.current;  // the base from which later decreases are counted
}

inline std::int64_t bytes_of(std::size_t size) { return static_cast<std::int64_t>(size); }

}  // namespace

const char* to_string(StatPool pool) noexcept {
  switch (pool) {
    case StatPool::kAggregate: return "all";
    case StatPool::kSmall: return "small_pool";
    case StatPool::kLarge: return "large_pool";
  }
  return "unknown";
}

std::string LedgerInconsistency::to_string() const {
  std::string text = "event #" + std::to_string(event_index) + " (" +
                     vramledger::to_string(event.kind) + ", pool " +
                     std::to_string(static_cast<unsigned>(event.pool)) + ", stream " +
                     std::to_string(event.stream) + ", tag " + std::to_string(event.tag) +
                     ", address " + std::to_string(event.address) + ", size " +
                     std::to_string(event.size) + ", requested " +
                     std::to_string(event.requested) + "): ";
  if (std::string_view(scope) == "event") {
    text += std::string("malformed field '") + counter + "' = " + std::to_string(value);
  } else {
    text += std::string(scope) + "." + counter + " went negative (" + std::to_string(value) + ")";
  }
  return text;
}

// The tag table is 128 KiB, of which a program touches the entries of the few tags it uses:
// calloc hands out fresh pages already zero, where new[] wrote every entry (a ledger per input of
// the allocation-ops fuzzer paid a 128 KiB memset and its page faults each time). UsageStats is an
// aggregate of integers, so zeroed storage holds zeroed entries (an implicit-lifetime type).
static_assert(std::is_aggregate_v<UsageStats> && std::is_trivially_copyable_v<UsageStats> &&
              std::is_trivially_destructible_v<UsageStats>);
void Ledger::FreeTable::operator()(UsageStats* table) const noexcept { std::free(table); }

Ledger::Ledger(LedgerOptions options)
    : options_(options),
      tags_(static_cast<UsageStats*>(std::calloc(kMaxTags + 1, sizeof(UsageStats)))),
      trace_(options.trace_capacity, options.clock) {
  if (!tags_) throw std::bad_alloc();
}

Ledger::~Ledger() = default;

// With shards open: the ledger's lock and every shard's mutex, shards folded, for one query.
class Ledger::ReadGuard {
 public:
  explicit ReadGuard(const Ledger& ledger)
      : ledger_(ledger),
        sharded_(ledger.sharded_.load(std::memory_order_acquire)),
        locked_(sharded_ || ledger.concurrent_.load(std::memory_order_acquire)) {
    if (!locked_) return;
    ledger_.mutex_.lock();
    if (!sharded_) return;
    ledger_.lock_shards();
    const_cast<Ledger&>(ledger_).fold_locked();  // moves figures, changes no value
  }
  ~ReadGuard() {
    if (!locked_) return;
    if (sharded_) ledger_.unlock_shards();
    ledger_.mutex_.unlock();
  }
  ReadGuard(const ReadGuard&) = delete;
  ReadGuard& operator=(const ReadGuard&) = delete;

 private:
  const Ledger& ledger_;
  bool sharded_;
  bool locked_;  // sharded, or events come from several threads (accept_concurrent_events)
};

void Ledger::fold_for_read() const noexcept { ReadGuard guard(*this); }

void Ledger::with_trace(const std::function<void(const EventTrace&)>& read) const {
  ReadGuard guard(*this);
  read(trace_);
}

// A kAlloc the escrow has proven to stay at or below every peak (Ledger::raise_fits): the
// counters move, no peak does. (The ledger's own figures may then exceed the true sums, by the
// frees the shards hold; the peaks, checked against those sums, are not touched.)
void Ledger::apply_alloc_below_peaks(const AllocatorEvent& event) noexcept {
  const std::uint64_t ticks = read_clock(options_.clock);
  free_requested_address_ = kNoAddress;
  free_requested_ticks_ = ticks;
  trace_.append(event, ticks);
  ++counters_.events;
  const PoolUpdate update = update_for(event.pool);
  const std::int64_t size = bytes_of(event.size);
  const std::int64_t requested = bytes_of(event.requested);
  const auto add = [](Stat& stat, std::int64_t amount) {
    stat.current += amount;
    stat.allocated += amount;
  };
  add(update.pool.allocation, 1);
  add(update.pool.active, 1);
  add(update.pool.allocated_bytes, size);
  add(update.pool.active_bytes, size);
  add(update.pool.requested_bytes, requested);
  add(update.pool.allocated_requested_bytes, requested);
  for (UsageStats* usage : {&streams_.usage_of(event.stream), &tag_entry_for_update(event.tag)}) {
    add(usage->allocation, 1);
    add(usage->allocated_bytes, size);
    add(usage->requested_bytes, requested);
    add(usage->active_bytes, size);
  }
  if (event.inactive_split_delta != 0 || event.inactive_split_bytes_delta != 0) {
    bool negative = apply_delta(update, &PoolCounters::inactive_split, event.inactive_split_delta) < 0;
    negative |= apply_delta(update, &PoolCounters::inactive_split_bytes,
                            event.inactive_split_bytes_delta) < 0;
    if (negative) [[unlikely]] record_negative_counter(event);
  }
}

void Ledger::apply(const AllocatorEvent& event) noexcept {
  const bool completes_last_free = event.kind == EventKind::kFreeCompleted &&
                                   event.address == free_requested_address_;
  const std::uint64_t ticks =
      completes_last_free ? free_requested_ticks_ : read_clock(options_.clock);
  free_requested_address_ = event.kind == EventKind::kFreeRequested ? event.address : kNoAddress;
  free_requested_ticks_ = ticks;
  trace_.append(event, ticks);
  ++counters_.events;

  const auto pool_value = static_cast<std::uint8_t>(event.pool);
  if (pool_value > static_cast<std::uint8_t>(PoolKind::kLarge)) [[unlikely]] {
    record_malformed_event(event, "pool", pool_value);
    return;
  }
  const PoolUpdate update = update_for(event.pool);
  const std::int64_t size = bytes_of(event.size);
  bool negative = false;

  switch (event.kind) {
    case EventKind::kAlloc:
      on_alloc(event, update);
      break;
    case EventKind::kFreeRequested:
      negative = on_free_requested(event, update);
      break;
    case EventKind::kFreeCompleted:
      negative = on_free_completed(event, update);
      break;
    case EventKind::kFree:
      negative = on_free_requested(event, update) | on_free_completed(event, update);
      break;
    case EventKind::kSegmentCreate:
      raise(update, &PoolCounters::segment, 1);
      raise_reserved(update, size);
      ++counters_.num_device_alloc;
      break;
    case EventKind::kSegmentRelease:
      negative = (lower(update, &PoolCounters::segment, 1) |
                  lower(update, &PoolCounters::reserved_bytes, size)) < 0;
      ++counters_.num_device_free;
      break;
    case EventKind::kPhysicalCreate:
      raise(update, &PoolCounters::physical_bytes, size);
      raise_reserved(update, size);
      ++counters_.num_device_alloc;
      break;
    case EventKind::kPhysicalRelease:
      negative = (lower(update, &PoolCounters::physical_bytes, size) |
                  lower(update, &PoolCounters::reserved_bytes, size)) < 0;
      ++counters_.num_device_free;
      break;
    case EventKind::kMap:
      raise(update, &PoolCounters::mapped_bytes, size);
      ++counters_.num_maps;
      break;
    case EventKind::kUnmap:
      negative = lower(update, &PoolCounters::mapped_bytes, size) < 0;
      ++counters_.num_unmaps;
      break;
    case EventKind::kVirtualReserve:
      raise(update, &PoolCounters::virtual_bytes, size);
      break;
    case EventKind::kVirtualRelease:
      negative = lower(update, &PoolCounters::virtual_bytes, size) < 0;
      break;
    case EventKind::kInactiveSplitAdd:
      raise(update, &PoolCounters::inactive_split, 1);
      raise(update, &PoolCounters::inactive_split_bytes, size);
      break;
    case EventKind::kInactiveSplitRemove:
      negative = (lower(update, &PoolCounters::inactive_split, 1) |
                  lower(update, &PoolCounters::inactive_split_bytes, size)) < 0;
      break;
    case EventKind::kAllocRetry:
      ++counters_.num_alloc_retries;
      break;
    case EventKind::kOutOfMemory:
      ++counters_.num_ooms;
      break;
    case EventKind::kFrontCacheReturn:  // counted free already: only its split changes below
      break;
    case EventKind::kSleep:  // docs/sleep.md: leaves allocated and active as a free would
      negative = on_free_requested(event, update);
      negative |= on_free_completed(event, update);
      raise(update, &PoolCounters::sleeping, 1);
      raise(update, &PoolCounters::sleeping_bytes, size);
      break;
    case EventKind::kWake:  // back as an allocation
      negative = (lower(update, &PoolCounters::sleeping, 1) |
                  lower(update, &PoolCounters::sleeping_bytes, size)) < 0;
      on_alloc(event, update);
      break;
    case EventKind::kSleepResident:
      raise(update, &PoolCounters::sleeping_resident_bytes, size);
      break;
    case EventKind::kWakeResident:
      negative = lower(update, &PoolCounters::sleeping_resident_bytes, size) < 0;
      break;
    case EventKind::kSegmentSleep:  // docs/sleep.md: memory gone, address (and segment) kept
      negative = lower(update, &PoolCounters::reserved_bytes, size) < 0;
      break;
    case EventKind::kSegmentWake:
      raise_reserved(update, size);
      break;
    case EventKind::kCount:
    default:
      record_malformed_event(event, "kind", static_cast<std::int64_t>(event.kind));
      return;
  }
  if (event.inactive_split_delta != 0 || event.inactive_split_bytes_delta != 0) {
    negative |= apply_delta(update, &PoolCounters::inactive_split, event.inactive_split_delta) < 0;
    negative |= apply_delta(update, &PoolCounters::inactive_split_bytes,
                            event.inactive_split_bytes_delta) < 0;
  }
  if (negative) [[unlikely]] record_negative_counter(event);
}

PoolUpdate Ledger::update_for(PoolKind pool) noexcept {
  const std::size_t mine = stat_pool_index(pool);
  const std::size_t other = mine == stat_pool_index(PoolKind::kSmall)
                                ? stat_pool_index(PoolKind::kLarge)
                                : stat_pool_index(PoolKind::kSmall);
  return {counters_.pools[mine], counters_.pools[other],
          counters_.pools[stat_pool_index(StatPool::kAggregate)]};
}

std::int64_t Ledger::aggregate_current(Stat PoolCounters::*stat) const noexcept {
  return (counters_.pools[stat_pool_index(StatPool::kSmall)].*stat).current +
         (counters_.pools[stat_pool_index(StatPool::kLarge)].*stat).current;
}

void Ledger::on_alloc(const AllocatorEvent& event, const PoolUpdate& update) noexcept {
  if (event.requested > event.size) [[unlikely]] {
    record_malformed_event(event, "requested", bytes_of(event.requested));
  }
  const std::int64_t size = bytes_of(event.size);
  const std::int64_t requested = bytes_of(event.requested);
  raise(update, &PoolCounters::allocation, 1);
  raise(update, &PoolCounters::allocated_bytes, size);
  raise(update, &PoolCounters::allocated_requested_bytes, requested);
  raise(update, &PoolCounters::active, 1);
  raise(update, &PoolCounters::active_bytes, size);
  raise(update, &PoolCounters::requested_bytes, requested);
  for (UsageStats* usage : {&streams_.usage_of(event.stream), &tag_entry_for_update(event.tag)}) {
    usage->allocation.increase(1);
    usage->allocated_bytes.increase(size);
    usage->requested_bytes.increase(requested);
    usage->active_bytes.increase(size);
  }
  // Reserved usually peaks on the segment creation just before the allocation that needed it,
  // so keep raising the "active at peak reserved" mark while reserved stays at its peak.
  if (aggregate_current(&PoolCounters::reserved_bytes) == update.aggregate.reserved_bytes.peak) {
    counters_.active_bytes_at_peak_reserved = std::max(
        counters_.active_bytes_at_peak_reserved, aggregate_current(&PoolCounters::active_bytes));
  }
}

bool Ledger::on_free_requested(const AllocatorEvent& event, const PoolUpdate& update) noexcept {
  const std::int64_t size = bytes_of(event.size);
  std::int64_t values = lower(update, &PoolCounters::allocation, 1) |
                       lower(update, &PoolCounters::allocated_bytes, size) |
                       lower(update, &PoolCounters::allocated_requested_bytes,
                             bytes_of(event.requested));
  for (UsageStats* usage : {&streams_.usage_of(event.stream), &tag_entry_for_update(event.tag)}) {
    usage->allocation.current -= 1;
    usage->allocated_bytes.current -= size;
    values |= usage->allocation.current | usage->allocated_bytes.current;
  }
  return values < 0;
}

bool Ledger::on_free_completed(const AllocatorEvent& event, const PoolUpdate& update) noexcept {
  const std::int64_t size = bytes_of(event.size);
  const std::int64_t requested = bytes_of(event.requested);
  std::int64_t values = lower(update, &PoolCounters::active, 1) |
                       lower(update, &PoolCounters::active_bytes, size) |
                       lower(update, &PoolCounters::requested_bytes, requested);
  for (UsageStats* usage : {&streams_.usage_of(event.stream), &tag_entry_for_update(event.tag)}) {
    usage->active_bytes.current -= size;
    usage->requested_bytes.current -= requested;
    values |= usage->active_bytes.current | usage->requested_bytes.current;
  }
  return values < 0;
}

void Ledger::raise_reserved(const PoolUpdate& update, std::int64_t bytes) noexcept {
  const std::int64_t previous_peak = update.aggregate.reserved_bytes.peak;
  raise(update, &PoolCounters::reserved_bytes, bytes);
  const std::int64_t reserved = aggregate_current(&PoolCounters::reserved_bytes);
  const std::int64_t active = aggregate_current(&PoolCounters::active_bytes);
  if (reserved > previous_peak) {
    counters_.active_bytes_at_peak_reserved = active;  // a new, higher peak
  } else if (reserved == update.aggregate.reserved_bytes.peak) {
    counters_.active_bytes_at_peak_reserved =
        std::max(counters_.active_bytes_at_peak_reserved, active);
  }
}

LedgerCounters Ledger::counters() const noexcept {
  ReadGuard guard(*this);
  return counters_unlocked();
}

LedgerCounters Ledger::counters_unlocked() const noexcept {
  LedgerCounters result = counters_;
  PoolCounters& all = result.pools[stat_pool_index(StatPool::kAggregate)];
  PoolCounters& small = result.pools[stat_pool_index(StatPool::kSmall)];
  PoolCounters& large = result.pools[stat_pool_index(StatPool::kLarge)];
  // One pass over the stats (three for_each_stat passes through tables of pointers were most of
  // its cost under the sanitizers; the allocation-ops fuzz target asks after every operation).
  for (const PoolStatMember& stat_member : kPoolStatMembers) {
    const PoolStat member = stat_member.member;
    Stat& small_stat = small.*member;
    Stat& large_stat = large.*member;
    small_stat = materialized(small_stat);
    large_stat = materialized(large_stat);
    // The aggregate's current value and totals are the pools' sums; it stores only its peak.
    Stat& stat = all.*member;
    stat.current = small_stat.current + large_stat.current;
    stat.allocated = small_stat.allocated + large_stat.allocated;
    stat.freed = small_stat.freed + large_stat.freed;
  }
  return result;
}

Ledger::ShardTally Ledger::shard_tally() const {
  ReadGuard guard(*this);
  ShardTally tally = shard_tally_;
  tally.all_held_ns = all_held_ns_;
  tally.gathered = gathered_events_.load(std::memory_order_relaxed);
  return tally;
}

std::vector<StreamUsage> Ledger::per_stream() const {
  ReadGuard guard(*this);
  std::vector<StreamUsage> entries = streams_.entries();
  for (StreamUsage& entry : entries) entry.usage = materialized(entry.usage);
  return entries;
}

UsageStats Ledger::tag_usage(TagId tag) const noexcept {
  ReadGuard guard(*this);
  return materialized(tags_[tag_slot(tag)]);
}

std::vector<TagUsage> Ledger::per_tag() const {
  ReadGuard guard(*this);
  std::vector<TagUsage> result;
  for (std::size_t slot = 0; slot < tag_slots_used_; ++slot) {  // the others are all zero
    const UsageStats usage = materialized(tags_[slot]);
    bool touched = false;
    for_each_usage_stat(usage, [&](const char*, const Stat& stat) { touched |= stat != Stat{}; });
    if (!touched) continue;
    const bool overflow = slot == kMaxTags;
    result.push_back({overflow ? kUntagged : static_cast<TagId>(slot), overflow, usage});
  }
  return result;
}

void Ledger::reset_peaks() noexcept {
  ReadGuard guard(*this);
  if (sharded_.load(std::memory_order_relaxed)) revoke_all_credit_locked();  // peak = current
  for (const StatPool pool : {StatPool::kSmall, StatPool::kLarge}) {
    for_each_stat(counters_.pools[stat_pool_index(pool)],
                  [](const char*, Stat& stat) { stat.reset_peak(); });
  }
  const LedgerCounters now = counters_unlocked();
  std::array<std::int64_t, 16> aggregate_now{};
  std::size_t count = 0;
  for_each_stat(now.aggregate(), [&](const char*, const Stat& stat) { aggregate_now[count++] = stat.current; });
  count = 0;
  for_each_stat(counters_.pools[stat_pool_index(StatPool::kAggregate)],
                [&](const char*, Stat& stat) { stat.peak = aggregate_now[count++]; });
  const auto reset_usage = [](UsageStats& usage) {
    for_each_usage_stat(usage, [](const char*, Stat& stat) { stat.reset_peak(); });
  };
  streams_.for_each_usage(reset_usage);
  for (std::size_t slot = 0; slot < tag_slots_used_; ++slot) reset_usage(tags_[slot]);
  counters_.active_bytes_at_peak_reserved = aggregate_current(&PoolCounters::active_bytes);
}

void Ledger::reset_accumulated() noexcept {
  ReadGuard guard(*this);
  // Aggregate totals are derived from the pools', so only pools, streams and tags are reset.
  for (const StatPool pool : {StatPool::kSmall, StatPool::kLarge}) {
    for_each_stat(counters_.pools[stat_pool_index(pool)],
                  [](const char*, Stat& stat) { reset_accumulated_in_storage(stat); });
  }
  const auto reset_usage = [](UsageStats& usage) {
    for_each_usage_stat(usage, [](const char*, Stat& stat) { reset_accumulated_in_storage(stat); });
  };
  streams_.for_each_usage(reset_usage);
  for (std::size_t slot = 0; slot < tag_slots_used_; ++slot) reset_usage(tags_[slot]);
  counters_.num_alloc_retries = 0;
  counters_.num_ooms = 0;
  counters_.num_device_alloc = 0;
  counters_.num_device_free = 0;
  counters_.num_maps = 0;
  counters_.num_unmaps = 0;
}

std::string Ledger::describe() const {
  const CountersAccount account = counters_account();
  return counters_text(account, measure_fragmentation(account.counters));
}

CountersAccount Ledger::counters_account() const {
  CountersAccount account;
  account.counters = counters();
  account.tags = per_tag();
  account.streams = per_stream();
  ReadGuard guard(*this);
  account.trace_records = trace_.size();
  account.trace_dropped = trace_.dropped();
  if (first_inconsistency_) account.inconsistency = first_inconsistency_->to_string();
  return account;
}

void Ledger::record_negative_counter(const AllocatorEvent& event) noexcept {
  if (first_inconsistency_) return;  // only the first one matters: later ones follow from it
  LedgerInconsistency found;
  // Its place in the trace (records shards handed over are there, not yet in counters_.events).
  found.event_index = trace_.appended() - 1;
  found.event = event;
  const auto look_at = [&](const char* scope, const char* name, const Stat& stat) {
    if (stat.current < 0 && found.counter[0] == '\0') {
      found.scope = scope;
      found.counter = name;
      found.value = stat.current;
    }
  };
  // With shards open a counter may dip below zero here while a shard holds the matching
  // increase: fold the shards, and record only what is still negative.
  if (sharded_.load(std::memory_order_relaxed)) {
    const bool held = shards_held_;
    if (!held) lock_shards();
    fold_locked();
    if (!held) unlock_shards();
  }
  const LedgerCounters now = counters_unlocked();  // the aggregate's current exists only here
  for (std::size_t index = 0; index < kStatPoolCount; ++index) {
    const char* scope = to_string(static_cast<StatPool>(index));
    for_each_stat(now.pools[index],
                  [&](const char* name, const Stat& stat) { look_at(scope, name, stat); });
  }
  // The event's stream entry was the last hit, so looking it up again allocates nothing.
  for_each_usage_stat(streams_.usage_of(event.stream),
                      [&](const char* name, const Stat& stat) { look_at("stream", name, stat); });
  for_each_usage_stat(tags_[tag_slot(event.tag)],
                      [&](const char* name, const Stat& stat) { look_at("tag", name, stat); });
  if (found.counter[0] == '\0' && sharded_.load(std::memory_order_relaxed)) return;
  record_inconsistency(found);
}

void Ledger::record_malformed_event(const AllocatorEvent& event, const char* field,
                                    std::int64_t value) noexcept {
  if (first_inconsistency_) return;
  LedgerInconsistency found;
  found.event_index = trace_.appended() - 1;  // as above
  found.event = event;
  found.scope = "event";
  found.counter = field;
  found.value = value;
  record_inconsistency(found);
}

void Ledger::record_inconsistency(const LedgerInconsistency& inconsistency) noexcept {
  first_inconsistency_ = inconsistency;
  if (options_.abort_on_inconsistency) {
    std::fprintf(stderr, "vramledger: ledger inconsistent at %s\n",
                 inconsistency.to_string().c_str());
    std::abort();
  }
}

}  // namespace vramledger
