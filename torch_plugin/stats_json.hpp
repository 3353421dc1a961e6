// vramledger's statistics as JSON, for the C API and the Python package: every ledger counter
// per pool under torch's key names, the counters torch does not have (mapped and virtual bytes,
// requested bytes of allocated blocks), fragmentation figures and per-tag usage.
#pragma once

#include <string>

namespace vramledger::torch_plugin {

class DeviceAllocators;

// {"device": 0, "backend": "vmm", ..., "allocated_bytes": {"all": {"current": ...}, ...}, ...}
std::string stats_json(const DeviceAllocators& device);
// The same for a device vramledger never used: every counter zero.
std::string empty_stats_json(int device);

}  // namespace vramledger::torch_plugin
