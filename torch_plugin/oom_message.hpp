// The message of vramledger's torch.OutOfMemoryError.
//
// It starts with torch's own wording ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0
// has a total capacity of ... of which ... is free. ..."), because tools and tests parse it, and
// then adds what torch cannot say: the process's additive account at the moment of failure
// (live, cached, fragmentation with the largest free block, graph and other private pools,
// non-torch memory by library, context), whose lines sum to the process's usage.
#pragma once

#include <c10/core/Allocator.h>

#include <cstddef>
#include <string>

#include "accounting/ledger_counters.hpp"

namespace vramledger::torch_plugin {

class DeviceAllocators;
class MemoryPool;

// device_free / device_total: the driver's figures at the failure. detail: the policy's reason.
std::string out_of_memory_message(DeviceAllocators& state, const MemoryPool& pool,
                                  std::size_t requested, std::size_t device_free,
                                  std::size_t device_total, const LedgerCounters& counters,
                                  const std::string& detail);

}  // namespace vramledger::torch_plugin
