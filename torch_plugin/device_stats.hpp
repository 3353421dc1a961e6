// The ledger's counters in torch's DeviceStats shape (torch.cuda.memory_stats keys): the
// aggregate and the small/large pools, with torch's meaning for every key (docs/stats.md).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <cstddef>

#include "accounting/ledger_counters.hpp"

namespace vramledger::torch_plugin {

// max_split_bytes: AllocatorOptions::max_split_bytes (0 = no limit, reported as torch does).
c10::CachingDeviceAllocator::DeviceStats to_device_stats(const LedgerCounters& counters,
                                                         std::size_t max_split_bytes);

}  // namespace vramledger::torch_plugin
