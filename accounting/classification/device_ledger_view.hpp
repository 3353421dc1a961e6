// One allocator's counters on a device, copied at one instant. A device may have several
// allocators (the default pool, CUDA graph pools, MemPools), each with its own ledger; the
// classification adds them up.
#pragma once

#include <string>

#include "accounting/ledger.hpp"
#include "accounting/ledger_counters.hpp"

namespace vramledger {

struct DeviceLedgerView {
  std::string name;         // "default", "graph_pool#3", ... (for reports only)
  PoolCounters aggregate;   // the ledger's "all" counters
  bool inconsistent = false;  // the ledger's sticky inconsistency flag

  // Call under the allocator's lock (or while nothing allocates), like every ledger query.
  static DeviceLedgerView of(const Ledger& ledger, std::string name = "default") {
    return {std::move(name), ledger.counters().aggregate(), ledger.inconsistent()};
  }
};

}  // namespace vramledger
