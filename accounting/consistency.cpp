#include "accounting/consistency.hpp"

namespace vramledger {
namespace {

using CensusField = std::int64_t BlockCensus::PerPool::*;
using LedgerField = Stat PoolCounters::*;

struct ComparedCounter {
  const char* name;
  LedgerField ledger;
  CensusField census;
};

constexpr ComparedCounter kCompared[] = {
    {"allocation", &PoolCounters::allocation, &BlockCensus::PerPool::allocation},
    {"allocated_bytes", &PoolCounters::allocated_bytes, &BlockCensus::PerPool::allocated_bytes},
    {"requested_bytes", &PoolCounters::requested_bytes, &BlockCensus::PerPool::requested_bytes},
    {"active", &PoolCounters::active, &BlockCensus::PerPool::active},
    {"active_bytes", &PoolCounters::active_bytes, &BlockCensus::PerPool::active_bytes},
    {"inactive_split", &PoolCounters::inactive_split, &BlockCensus::PerPool::inactive_split},
    {"inactive_split_bytes", &PoolCounters::inactive_split_bytes,
     &BlockCensus::PerPool::inactive_split_bytes},
    {"segment", &PoolCounters::segment, &BlockCensus::PerPool::segment},
    {"reserved_bytes", &PoolCounters::reserved_bytes, &BlockCensus::PerPool::reserved_bytes},
    {"mapped_bytes", &PoolCounters::mapped_bytes, &BlockCensus::PerPool::mapped_bytes},
    {"virtual_bytes", &PoolCounters::virtual_bytes, &BlockCensus::PerPool::virtual_bytes},
    {"sleeping", &PoolCounters::sleeping, &BlockCensus::PerPool::sleeping},
    {"sleeping_bytes", &PoolCounters::sleeping_bytes, &BlockCensus::PerPool::sleeping_bytes},
    {"sleeping_resident_bytes", &PoolCounters::sleeping_resident_bytes,
     &BlockCensus::PerPool::sleeping_resident_bytes},
};

BlockCensus::PerPool sum_of_pools(const BlockCensus& census) {
  BlockCensus::PerPool sum;
  for (const ComparedCounter& counter : kCompared) {
    sum.*counter.census = census.pools[0].*counter.census + census.pools[1].*counter.census;
  }
  sum.free_bytes = census.pools[0].free_bytes + census.pools[1].free_bytes;
  return sum;
}

void compare_pool(const char* scope, const PoolCounters& ledger,
                  const BlockCensus::PerPool& census, std::vector<ConsistencyMismatch>& out) {
  for (const ComparedCounter& counter : kCompared) {
    const std::int64_t ledger_value = (ledger.*counter.ledger).current;
    const std::int64_t census_value = census.*counter.census;
    if (ledger_value != census_value) {
      out.push_back({std::string(scope) + "." + counter.name, ledger_value, census_value});
    }
  }
}

}  // namespace

ConsistencyReport check_consistency(const Ledger& ledger, const BlockCensus& census) {
  const LedgerCounters counters = ledger.counters();
  ConsistencyReport report;
  report.ledger_inconsistency = ledger.first_inconsistency();

  const BlockCensus::PerPool aggregate = sum_of_pools(census);
  compare_pool(to_string(StatPool::kAggregate), counters.aggregate(), aggregate,
               report.mismatches);
  compare_pool(to_string(StatPool::kSmall), counters.pool(StatPool::kSmall),
               census.pools[static_cast<std::size_t>(PoolKind::kSmall)], report.mismatches);
  compare_pool(to_string(StatPool::kLarge), counters.pool(StatPool::kLarge),
               census.pools[static_cast<std::size_t>(PoolKind::kLarge)], report.mismatches);

  // Every held byte is active, in a free block, an unmapped physical page, or under a sleeping
  // block on a page kept for neighbours. Checked on the aggregate only: a physical page may be
  // created for one pool and mapped under the other.
  const PoolCounters& all = counters.aggregate();
  const std::int64_t held_free = all.cached_bytes() - all.unmapped_physical_bytes();
  if (held_free != aggregate.free_bytes) {
    report.mismatches.push_back(
        {"all.free_bytes (reserved - active - sleeping resident - unmapped physical)", held_free,
         aggregate.free_bytes});
  }
  return report;
}

std::string ConsistencyReport::to_string() const {
  if (ok()) return "consistent";
  std::string text;
  if (ledger_inconsistency) {
    text += "ledger inconsistent since " + ledger_inconsistency->to_string() + "\n";
  }
  for (const ConsistencyMismatch& mismatch : mismatches) {
    text += mismatch.name + ": ledger " + std::to_string(mismatch.ledger) + ", census " +
            std::to_string(mismatch.census) + " (ledger - census = " +
            std::to_string(mismatch.ledger - mismatch.census) + ")\n";
  }
  return text;
}

}  // namespace vramledger
