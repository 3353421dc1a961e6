#include "torch_plugin/device_stats.hpp"

#include <limits>

#include "torch_plugin/torch_compat.hpp"

namespace vramledger::torch_plugin {

namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingAllocator::StatArray;
using c10::CachingAllocator::StatType;

c10::CachingAllocator::Stat to_c10(const Stat& stat) {
  c10::CachingAllocator::Stat out;
  out.current = stat.current;
  out.peak = stat.peak;
  out.allocated = stat.allocated;
  out.freed = stat.freed;
  return out;
}

// Copies one counter of every pool: torch's StatType order (aggregate, small, large) is the
// ledger's StatPool order.
template <typename Member>
void copy_stat(const LedgerCounters& counters, Member member, StatArray& out) {
  static_assert(static_cast<std::size_t>(StatType::NUM_TYPES) == kStatPoolCount);
  static_assert(static_cast<std::size_t>(StatType::AGGREGATE) ==
                stat_pool_index(StatPool::kAggregate));
  static_assert(static_cast<std::size_t>(StatType::SMALL_POOL) == stat_pool_index(StatPool::kSmall));
  static_assert(static_cast<std::size_t>(StatType::LARGE_POOL) == stat_pool_index(StatPool::kLarge));
  for (std::size_t i = 0; i < kStatPoolCount; ++i) out[i] = to_c10(counters.pools[i].*member);
}

}  // namespace

DeviceStats to_device_stats(const LedgerCounters& counters, std::size_t max_split_bytes) {
  DeviceStats stats;
  copy_stat(counters, &PoolCounters::allocation, stats.allocation);
  copy_stat(counters, &PoolCounters::segment, stats.segment);
  copy_stat(counters, &PoolCounters::active, stats.active);
  copy_stat(counters, &PoolCounters::inactive_split, stats.inactive_split);
  copy_stat(counters, &PoolCounters::allocated_bytes, stats.allocated_bytes);
  copy_stat(counters, &PoolCounters::reserved_bytes, stats.reserved_bytes);
  copy_stat(counters, &PoolCounters::active_bytes, stats.active_bytes);
  copy_stat(counters, &PoolCounters::inactive_split_bytes, stats.inactive_split_bytes);
  copy_stat(counters, &PoolCounters::requested_bytes, stats.requested_bytes);
  stats.num_alloc_retries = counters.num_alloc_retries;
  stats.num_ooms = counters.num_ooms;
  stats.num_device_alloc = counters.num_device_alloc;
  stats.num_device_free = counters.num_device_free;
  // No oversize blocks (blocks above max_split_size) and no all-stream synchronisation in our
  // policy: torch's counters for them stay zero.
  // torch reports "no limit" as SIZE_MAX cast to int64, i.e. -1.
  stats.max_split_size = max_split_bytes == 0
                             ? static_cast<std::int64_t>(std::numeric_limits<std::size_t>::max())
                             : static_cast<std::int64_t>(max_split_bytes);
  return stats;
}

void add_release_specific_stats(
    std::int64_t oom_rejections,
    const std::vector<std::pair<c10::MempoolId_t, PrivatePoolStats::PerKind>>& private_pools,
    DeviceStats& stats) {
  compat::ReleaseSpecificStats extra;
  extra.num_oom_rejections = oom_rejections;
  for (const auto& [id, per_kind] : private_pools) {
    StatArray converted;
    for (std::size_t i = 0; i < kStatPoolCount; ++i) converted[i] = to_c10(per_kind[i]);
    extra.reserved_bytes_by_private_pool.emplace_back(id, converted);
  }
  compat::fill_release_specific_stats(extra, stats);
}

}  // namespace vramledger::torch_plugin
