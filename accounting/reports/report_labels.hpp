// What a report says about where its figures come from. The ledger does not know which device
// its allocator serves, so the caller names it (Prometheus needs it as a label, JSON records it).
#pragma once

namespace vramledger {

struct ReportLabels {
  int device = 0;
};

}  // namespace vramledger
