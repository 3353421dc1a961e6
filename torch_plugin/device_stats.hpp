// The ledger's counters in torch's DeviceStats shape (torch.cuda.memory_stats keys): the
// aggregate and the small/large pools, with torch's meaning for every key (docs/stats.md).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "accounting/ledger_counters.hpp"
#include "torch_plugin/private_pool_stats.hpp"

namespace vramledger::torch_plugin {

// max_split_bytes: AllocatorOptions::max_split_bytes (0 = no limit, reported as torch does).
c10::CachingDeviceAllocator::DeviceStats to_device_stats(const LedgerCounters& counters,
                                                         std::size_t max_split_bytes);

// Adds what only newer torch releases report (torch_compat.hpp decides which fields exist):
// num_oom_rejections and reserved_bytes_by_private_pools.
void add_release_specific_stats(
    std::int64_t oom_rejections,
    const std::vector<std::pair<c10::MempoolId_t, PrivatePoolStats::PerKind>>& private_pools,
    c10::CachingDeviceAllocator::DeviceStats& stats);

}  // namespace vramledger::torch_plugin
