#include "accounting/text_report.hpp"

#include "accounting/consistency.hpp"
#include "accounting/counters_text.hpp"
#include "accounting/fragmentation.hpp"

namespace vramledger {

std::string counters_report(const Ledger& ledger) { return ledger.describe(); }

std::string text_report(const Ledger& ledger, const BlockCensus& census) {
  const CountersAccount account = ledger.counters_account();
  std::string out = counters_text(account, measure_fragmentation(account.counters, census));
  const ConsistencyReport consistency = check_consistency(ledger, census);
  if (consistency.ok()) {
    out += "consistency with the block census: ok\n";
  } else {
    out += "CONSISTENCY CHECK FAILED (ledger vs block census):\n" + consistency.to_string();
  }
  return out;
}

}  // namespace vramledger
