// The ledger counts events; the census recounts the allocator's blocks. They must agree at every
// instant (take both under the allocator's lock, or while nothing allocates).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"

namespace vramledger {

struct ConsistencyMismatch {
  std::string name;  // "<pool>.<counter>", e.g. "large_pool.allocated_bytes"
  std::int64_t ledger = 0;
  std::int64_t census = 0;
};

struct ConsistencyReport {
  std::vector<ConsistencyMismatch> mismatches;
  // The ledger's own sticky flag (a counter went negative, or an event was malformed).
  std::optional<LedgerInconsistency> ledger_inconsistency;

  bool ok() const noexcept { return mismatches.empty() && !ledger_inconsistency; }
  // One line per problem; "consistent" when there is none.
  std::string to_string() const;
};

// Compares, for the small pool, the large pool and the aggregate (census small + large):
// allocation, allocated_bytes, requested_bytes, active, active_bytes, inactive_split,
// inactive_split_bytes, segment, reserved_bytes, mapped_bytes, virtual_bytes. For the aggregate
// also the held-bytes identity: reserved - active - unmapped physical == census free_bytes.
ConsistencyReport check_consistency(const Ledger& ledger, const BlockCensus& census);

}  // namespace vramledger
