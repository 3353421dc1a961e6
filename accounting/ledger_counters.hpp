// The ledger's counters as plain, copyable values. Names follow torch's memory_stats keys
// (docs/stats.md defines each one and how they sum to reserved).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "accounting/stat.hpp"
#include "allocator/allocator_events.hpp"

namespace vramledger {

// torch's StatType order: the aggregate first, then one entry per pool.
enum class StatPool : std::size_t { kAggregate = 0, kSmall = 1, kLarge = 2 };
inline constexpr std::size_t kStatPoolCount = 3;

constexpr std::size_t stat_pool_index(StatPool pool) noexcept {
  return static_cast<std::size_t>(pool);
}
constexpr std::size_t stat_pool_index(PoolKind pool) noexcept {
  return 1 + static_cast<std::size_t>(pool);
}
// torch's key fragments: "all", "small_pool", "large_pool".
const char* to_string(StatPool pool) noexcept;

struct PoolCounters {
  // The six an allocate/free pair touches come first and together: three cache lines.
  Stat allocation;                 // blocks allocated (between kAlloc and kFreeRequested)
  Stat active;                     // blocks active (between kAlloc and kFreeCompleted)
  Stat allocated_bytes;
  Stat active_bytes;
  Stat requested_bytes;            // requested sizes of active blocks (torch's meaning)
  Stat allocated_requested_bytes;  // requested sizes of allocated blocks (beyond torch)
  Stat segment;                    // backend segments held (segment heap)
  Stat inactive_split;             // free blocks counted as inactive split
  Stat reserved_bytes;             // physical memory held: segments + VMM physical pages
  Stat inactive_split_bytes;
  Stat mapped_bytes;               // VMM: physical bytes mapped into address ranges
  Stat virtual_bytes;              // VMM: address space reserved
  Stat physical_bytes;             // VMM physical pages held (beyond torch; part of reserved)
  // Sleep by tag (docs/sleep.md): blocks asleep are neither allocated nor active. Their bytes
  // are address space only, except those on pages kept mapped for neighbours (resident, part
  // of reserved).
  Stat sleeping;
  Stat sleeping_bytes;
  Stat sleeping_resident_bytes;

  // Held bytes no block uses, waits for or sleeps on: free blocks plus unmapped physical pages.
  std::int64_t cached_bytes() const noexcept {
    return reserved_bytes.current - active_bytes.current - sleeping_resident_bytes.current;
  }
  // Freed by the user, still in use by other streams.
  std::int64_t pending_free_bytes() const noexcept {
    return active_bytes.current - allocated_bytes.current;
  }
  std::int64_t segment_bytes() const noexcept {
    return reserved_bytes.current - physical_bytes.current;
  }
  std::int64_t unmapped_physical_bytes() const noexcept {
    return physical_bytes.current - mapped_bytes.current;
  }

  friend bool operator==(const PoolCounters&, const PoolCounters&) = default;
};

// Every Stat of a PoolCounters with its name, in declaration order: the one list that
// for_each_stat and the ledger's pool-by-pool sums walk.
struct PoolStatMember {
  const char* name;
  Stat PoolCounters::*member;
};
inline constexpr std::array<PoolStatMember, 16> kPoolStatMembers = {{
    {"allocation", &PoolCounters::allocation},
    {"active", &PoolCounters::active},
    {"allocated_bytes", &PoolCounters::allocated_bytes},
    {"active_bytes", &PoolCounters::active_bytes},
    {"requested_bytes", &PoolCounters::requested_bytes},
    {"allocated_requested_bytes", &PoolCounters::allocated_requested_bytes},
    {"segment", &PoolCounters::segment},
    {"inactive_split", &PoolCounters::inactive_split},
    {"reserved_bytes", &PoolCounters::reserved_bytes},
    {"inactive_split_bytes", &PoolCounters::inactive_split_bytes},
    {"mapped_bytes", &PoolCounters::mapped_bytes},
    {"virtual_bytes", &PoolCounters::virtual_bytes},
    {"physical_bytes", &PoolCounters::physical_bytes},
    {"sleeping", &PoolCounters::sleeping},
    {"sleeping_bytes", &PoolCounters::sleeping_bytes},
    {"sleeping_resident_bytes", &PoolCounters::sleeping_resident_bytes},
}};
// None missing: as many distinct members as PoolCounters has Stats.
static_assert(sizeof(PoolCounters) == kPoolStatMembers.size() * sizeof(Stat));
static_assert([] {
  for (std::size_t i = 0; i < kPoolStatMembers.size(); ++i) {
    for (std::size_t j = i + 1; j < kPoolStatMembers.size(); ++j) {
      if (kPoolStatMembers[i].member == kPoolStatMembers[j].member) return false;
    }
  }
  return true;
}());

// Calls visit(name, stat) for every Stat of a PoolCounters (const or not), in declaration order.
template <typename Pool, typename Visit>
void for_each_stat(Pool& pool, Visit&& visit) {
  for (const PoolStatMember& stat : kPoolStatMembers) visit(stat.name, pool.*stat.member);
}

struct LedgerCounters {
  std::array<PoolCounters, kStatPoolCount> pools;  // indexed by stat_pool_index
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_device_alloc = 0;  // kSegmentCreate + kPhysicalCreate
  std::int64_t num_device_free = 0;   // kSegmentRelease + kPhysicalRelease
  std::int64_t num_maps = 0;          // kMap events (one per mapped run)
  std::int64_t num_unmaps = 0;        // kUnmap events
  // Largest aggregate active_bytes seen while aggregate reserved_bytes stood at its peak.
  std::int64_t active_bytes_at_peak_reserved = 0;
  std::uint64_t events = 0;  // events seen since construction (never reset)

  const PoolCounters& aggregate() const noexcept { return pools[0]; }
  const PoolCounters& pool(StatPool which) const noexcept { return pools[stat_pool_index(which)]; }
  const PoolCounters& pool(PoolKind which) const noexcept { return pools[stat_pool_index(which)]; }
  // The driver calls behind these counts: maps, unmaps, device allocations and frees.
  std::int64_t driver_calls() const noexcept {
    return num_maps + num_unmaps + num_device_alloc + num_device_free;
  }

  friend bool operator==(const LedgerCounters&, const LedgerCounters&) = default;
};

// What the ledger keeps per stream and per tag.
struct UsageStats {
  Stat allocation;
  Stat allocated_bytes;
  Stat requested_bytes;  // of active blocks, as in PoolCounters
  Stat active_bytes;

  friend bool operator==(const UsageStats&, const UsageStats&) = default;
};

template <typename Usage, typename Visit>
void for_each_usage_stat(Usage& usage, Visit&& visit) {
  visit("allocation", usage.allocation);
  visit("allocated_bytes", usage.allocated_bytes);
  visit("requested_bytes", usage.requested_bytes);
  visit("active_bytes", usage.active_bytes);
}

struct StreamUsage {
  StreamHandle stream = 0;
  bool is_overflow = false;  // the shared entry for streams beyond the table's capacity
  UsageStats usage;
};

struct TagUsage {
  TagId tag = kUntagged;
  bool is_overflow = false;  // the shared entry for ids >= kMaxTags
  UsageStats usage;
};

}  // namespace vramledger
