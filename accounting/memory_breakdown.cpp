#include "accounting/memory_breakdown.hpp"

namespace vramledger {

MemoryBreakdown compute_breakdown(const PoolCounters& pool) {
  MemoryBreakdown breakdown;
  breakdown.reserved = pool.reserved_bytes.current;
  breakdown.requested = pool.allocated_requested_bytes.current;
  breakdown.rounding = pool.allocated_bytes.current - pool.allocated_requested_bytes.current;
  breakdown.pending_frees = pool.pending_free_bytes();
  breakdown.fragmentation = pool.inactive_split_bytes.current;
  breakdown.unmapped_physical = pool.unmapped_physical_bytes();
  breakdown.sleeping_resident = pool.sleeping_resident_bytes.current;
  breakdown.sleeping = pool.sleeping_bytes.current;
  // The remainder by definition, so the lines always add up; it is >= 0 exactly when the
  // inactive split bytes are among the held, mapped free bytes, as they must be.
  breakdown.cached_usable = pool.cached_bytes() - breakdown.unmapped_physical -
                            breakdown.fragmentation;
  return breakdown;
}

}  // namespace vramledger
