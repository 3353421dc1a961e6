// Reserved bytes of each private memory pool (CUDA graph pools, torch.cuda.MemPool), with
// torch's Stat meaning (current, peak, allocated, freed) per pool kind: what torch 2.13+ reports
// as DeviceStats::reserved_bytes_by_private_pools.
//
// Fed the same event stream as the device's ledger, by the EventGate, under its lock. A pool
// that torch released keeps its entry (current 0, peak and totals kept) until the next reset,
// as in torch.
#pragma once

#include <c10/core/Allocator.h>

#include <array>
#include <cstddef>
#include <map>
#include <utility>
#include <vector>

#include "accounting/ledger_counters.hpp"
#include "accounting/stat.hpp"
#include "allocator/allocator_events.hpp"

namespace vramledger::torch_plugin {

class PrivatePoolStats {
 public:
  // Indexed as torch's StatType: aggregate, small pool, large pool.
  using PerKind = std::array<Stat, kStatPoolCount>;

  void on_event(const AllocatorEvent& event, c10::MempoolId_t pool_id) noexcept {
    if (pool_id.first == 0 && pool_id.second == 0) return;  // the default pool
    // A sleeping graph pool's segments hold no memory (kSegmentSleep / kSegmentWake).
    const bool grows = event.kind == EventKind::kSegmentCreate ||
                       event.kind == EventKind::kPhysicalCreate ||
                       event.kind == EventKind::kSegmentWake;
    const bool shrinks = event.kind == EventKind::kSegmentRelease ||
                         event.kind == EventKind::kPhysicalRelease ||
                         event.kind == EventKind::kSegmentSleep;
    if (!grows && !shrinks) return;
    PerKind* stats = nullptr;
    try {
      stats = &reserved_[pool_id];
    } catch (...) {
      return;  // out of host memory: this statistic is best effort, the ledger is not
    }
    const auto amount = static_cast<std::int64_t>(event.size);
    for (std::size_t index : {stat_pool_index(StatPool::kAggregate), stat_pool_index(event.pool)}) {
      if (grows) {
        (*stats)[index].increase(amount);
      } else {
        (*stats)[index].decrease(amount);
      }
    }
  }

  std::vector<std::pair<c10::MempoolId_t, PerKind>> reserved_bytes() const {
    return {reserved_.begin(), reserved_.end()};
  }
  void reset_peaks() noexcept {
    for (auto& [id, stats] : reserved_) {
      for (Stat& stat : stats) stat.reset_peak();
    }
  }
  // Pools with nothing reserved any more are forgotten here (torch drops deleted pools then).
  void reset_accumulated() noexcept {
    for (auto it = reserved_.begin(); it != reserved_.end();) {
      for (Stat& stat : it->second) stat.reset_accumulated();
      if (it->second[0].current == 0) {
        it = reserved_.erase(it);
      } else {
        ++it;
      }
    }
  }

 private:
  std::map<c10::MempoolId_t, PerKind> reserved_;
};

}  // namespace vramledger::torch_plugin
