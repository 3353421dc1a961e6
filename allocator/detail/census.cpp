// Queries: describe, segments, and the census that recounts every block, range and page (the
// ledger must agree with it at every instant; accounting/consistency.hpp), checking each
// range's invariants on the way.
#include <string>
#include <vector>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

inline AllocationInfo CachingAllocator::Impl::describe(DevicePtr ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = live_.find(ptr);
  if (block == nullptr) block = block_containing(ptr);
  if (block == nullptr ||
      (block->state != BlockState::kAllocated && block->state != BlockState::kSleeping)) {
    throw Error(ErrorCode::kInvalidPointer,
                "pointer " + format_hex(ptr) + " is not inside a live vramledger allocation");
  }
  AllocationInfo info;
  info.base = block->address;
  info.size = block->size;
  info.requested = block->requested;
  info.stream = block->range->owner->stream;
  info.tag = block->tag;
  info.segment_base = block->range->base;
  info.segment_size = block->range->size;
  return info;
}

inline std::vector<PhysicalPiece> CachingAllocator::Impl::physical_pieces(DevicePtr ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = live_.find(ptr);
  if (block == nullptr) block = block_containing(ptr);
  if (block != nullptr && block->state == BlockState::kSleeping) {
    throw Error(ErrorCode::kNotSupported,
                "pointer " + format_hex(ptr) + " is asleep: no physical memory behind it");
  }
  if (block == nullptr || block->state != BlockState::kAllocated) {
    throw Error(ErrorCode::kInvalidPointer,
                "pointer " + format_hex(ptr) + " is not inside a live vramledger allocation");
  }
  const AddressRange& range = *block->range;
  std::vector<PhysicalPiece> pieces;
  if (!range.is_span) return pieces;
  const std::size_t first = (block->address - range.base) / page_bytes_;
  const std::size_t last =
      (block->address + block->size - range.base + page_bytes_ - 1) / page_bytes_;
  for (std::size_t page = first; page < last;) {
    if (!range.is_mapped(page)) {
      throw Error(ErrorCode::kInternal, "page " + std::to_string(page) + " under the live block " +
                                            format_hex(block->address) + " is not mapped");
    }
    const std::size_t head = range.page_mapping[page].head;
    const std::size_t pages = range.chunk_pages(head);
    pieces.push_back(PhysicalPiece{range.base + head * page_bytes_, pages * page_bytes_,
                                   range.page_mapping[page].handle});
    page = head + pages;
  }
  return pieces;
}

inline std::vector<SegmentInfo> CachingAllocator::Impl::segments() const {
  std::lock_guard lock(mutex_);
  std::vector<SegmentInfo> result;
  for (const auto& heaps : streams_) {
    for (int p = 0; p < 2; ++p) {
      for (const AddressRange* range : heaps->ranges[p]) {
        SegmentInfo segment;
        segment.address = range->base;
        segment.size = range->size;
        segment.mapped_bytes = range->is_span            ? range->mapped_pages * page_bytes_
                               : range->memory_released ? 0
                                                        : range->size;
        segment.stream = heaps->stream;
        segment.pool = range->pool;
        segment.is_virtual_span = range->is_span;
        for (const Block* b = range->first; b != nullptr; b = b->next) {
          BlockInfo info;
          info.address = b->address;
          info.size = b->size;
          info.requested = b->requested;
          info.allocated = b->state == BlockState::kAllocated;
          info.active = b->is_active();
          info.mapped_bytes = backed_bytes(*range, b->address, b->size).first;
          info.tag = b->tag;
          segment.blocks.push_back(info);
        }
        result.push_back(std::move(segment));
      }
    }
  }
  front_segments_locked(result);  // parked blocks are free from the user's view
  return result;
}

inline BlockCensus CachingAllocator::Impl::census() const {
  std::lock_guard lock(mutex_);
  BlockCensus census;
  std::size_t live_seen = 0;
  std::size_t free_mapped[2] = {0, 0};
  check_active_bytes_locked();  // detail/active_bytes.cpp
  for (const auto& heaps : streams_) {
    const std::int64_t active_before =
        census.pools[0].active_bytes + census.pools[1].active_bytes;
    for (int p = 0; p < 2; ++p) {
      BlockCensus::PerPool& out = census.pools[p];
      for (const AddressRange* range : heaps->ranges[p]) {
        free_mapped[p] += count_range(*range, out, live_seen);
      }
      if (heaps->free[p].count() != count_free_blocks(*heaps, p)) {
        throw Error(ErrorCode::kInternal, "free index count disagrees with the block lists");
      }
    }
    // The active bytes its room accounting counted (detail/active_bytes.cpp) are its blocks'.
    const std::int64_t active =
        census.pools[0].active_bytes + census.pools[1].active_bytes - active_before;
    if (paged_ && active != static_cast<std::int64_t>(heaps->active_bytes)) {
      throw Error(ErrorCode::kInternal, "a stream's active bytes are counted as " +
                                            std::to_string(heaps->active_bytes) +
                                            ", its blocks hold " + std::to_string(active));
    }
  }
  if (live_seen != live_.size()) {
    throw Error(ErrorCode::kInternal, "address map holds " + std::to_string(live_.size()) +
                                          " blocks but ranges hold " +
                                          std::to_string(live_seen) + " active ones");
  }
  for (int p = 0; p < 2; ++p) {
    if (free_mapped[p] != free_mapped_pages(p)) {
      throw Error(ErrorCode::kInternal, "free mapped page count is stale: counted " +
                                            std::to_string(free_mapped_pages(p)) + ", found " +
                                            std::to_string(free_mapped[p]));
    }
    const auto held = static_cast<std::int64_t>(free_physical_pages_[p]);
    census.pools[p].reserved_bytes += held * static_cast<std::int64_t>(page_bytes_);
    census.free_physical_pages += held;
  }
  static_cast<PolicyFigures&>(census) = policy_figures_locked();
  front_census_locked(census);  // parked blocks are free from the user's view
  return census;
}

inline PolicyFigures CachingAllocator::Impl::policy_figures() const {
  std::lock_guard lock(mutex_);
  return policy_figures_locked();
}

inline PolicyFigures CachingAllocator::Impl::policy_figures_locked() const {
  PolicyFigures figures;
  figures.stream_heaps = static_cast<std::int64_t>(streams_.size());
  figures.lane_choices = static_cast<std::int64_t>(lane_choices_);
  figures.locked_allocations = static_cast<std::int64_t>(locked_allocations_);
  figures.room_shortfalls =
      static_cast<std::int64_t>(room_shortfalls_.load(std::memory_order_relaxed));
  figures.active_peak_rises = static_cast<std::int64_t>(peak_rises_);
  figures.streams_held_ns = static_cast<std::int64_t>(mutex_.streams_held_ns());
  figures.unmaps_in_background =
      static_cast<std::int64_t>(background_unmaps_.unmapped_by_helper());
  figures.unmaps_on_demand = static_cast<std::int64_t>(background_unmaps_.unmapped_on_demand());
  figures.unmaps_pending = static_cast<std::int64_t>(background_unmaps_.pending());
  figures.host_waits = static_cast<std::int64_t>(host_waits_.load(std::memory_order_relaxed));
  figures.peak_active_bytes = static_cast<std::int64_t>(active_peak_);
  return figures;
}

inline const Block* CachingAllocator::Impl::block_containing(DevicePtr ptr) const {
  for (const auto& heaps : streams_) {
    for (int p = 0; p < 2; ++p) {
      for (const AddressRange* range : heaps->ranges[p]) {
        if (ptr < range->base || ptr >= range->end()) continue;
        for (const Block* b = range->first; b != nullptr; b = b->next) {
          if (ptr >= b->address && ptr < b->end()) return b;
        }
      }
    }
  }
  return nullptr;
}

inline void CachingAllocator::Impl::throw_unknown_pointer(DevicePtr ptr, const char* action) const {
  const Block* inside = block_containing(ptr);
  if (inside != nullptr && inside->address == ptr && inside->state == BlockState::kFree) {
    throw Error(ErrorCode::kDoubleFree, std::string(action) + " " + format_hex(ptr) +
                                            ": this block was already freed");
  }
  if (inside != nullptr) {
    throw Error(ErrorCode::kInvalidPointer,
                std::string(action) + " " + format_hex(ptr) +
                    ": the pointer lies inside a block starting at " +
                    format_hex(inside->address) + " but is not its start");
  }
  throw Error(ErrorCode::kInvalidPointer, std::string(action) + " " + format_hex(ptr) +
                                              ": this pointer was not allocated by vramledger "
                                              "on this device");
}

// Bytes of [address, address + size) with memory behind them, and the longest such run.
inline std::pair<std::size_t, std::size_t> CachingAllocator::Impl::backed_bytes(
    const AddressRange& range, DevicePtr address, std::size_t size) const {
  if (!range.is_span) {  // a segment: memory behind every byte, unless its pool sleeps
    return range.memory_released ? std::pair<std::size_t, std::size_t>{0, 0}
                                 : std::pair<std::size_t, std::size_t>{size, size};
  }
  std::size_t total = 0;
  std::size_t longest = 0;
  std::size_t run = 0;
  std::size_t previous_page = SIZE_MAX;
  const DevicePtr end = address + size;
  range.for_each_mapped(page_of(range, address), page_of(range, end - 1) + 1,
                        [&](std::size_t page) {
                          const DevicePtr page_start = range.base + page * page_bytes_;
                          const std::size_t overlap = std::min(end, page_start + page_bytes_) -
                                                      std::max(address, page_start);
                          total += overlap;
                          const bool follows = previous_page != SIZE_MAX &&
                                               page == previous_page + 1;
                          run = follows ? run + overlap : overlap;
                          longest = std::max(longest, run);
                          previous_page = page;
                        });
  return {total, longest};
}

inline std::size_t CachingAllocator::Impl::count_free_blocks(const StreamHeaps& heaps,
                                                             int p) const {
  std::size_t count = 0;
  for (const AddressRange* range : heaps.ranges[p]) {
    for (const Block* b = range->first; b != nullptr; b = b->next) {
      if (b->state == BlockState::kFree) ++count;
    }
  }
  return count;
}

// Adds one range's blocks to the census, checking the range's own invariants on the way.
// Returns the number of free mapped pages found in it.
inline std::size_t CachingAllocator::Impl::count_range(const AddressRange& range,
                                                       BlockCensus::PerPool& out,
                                                       std::size_t& live_seen) const {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorCode::kInternal, "range at " + format_hex(range.base) + ": " + what);
  };
  std::vector<PageUse> recount(range.page_use.size());
  // A block's bytes on its first and last page, as mark_pages counts them.
  auto recount_edge_pages = [&](const Block* b) {
    const std::size_t first = page_of(range, b->address);
    const std::size_t last = page_of(range, b->end() - 1);
    for (std::size_t i : {first, last}) {
      const DevicePtr page_start = range.base + i * page_bytes_;
      recount[i].users++;
      recount[i].active_bytes +=
          std::min(b->end(), page_start + page_bytes_) - std::max(b->address, page_start);
      if (first == last) break;
    }
  };
  DevicePtr cursor = range.base;
  std::size_t active_blocks = 0;
  std::size_t free_mapped = 0;
  const Block* prev = nullptr;
  for (const Block* b = range.first; b != nullptr; prev = b, b = b->next) {
    if (b->address != cursor || b->prev != prev || b->range != &range || b->size == 0) {
      fail("blocks do not tile the range");
    }
    if (prev != nullptr && prev->state == BlockState::kFree && b->state == BlockState::kFree) {
      fail("two neighbouring free blocks were not merged");
    }
    cursor = b->end();
    if (b->state == BlockState::kSleeping) {  // detail/sleep.cpp: no count but its own
      ++active_blocks;
      ++live_seen;
      out.sleeping++;
      out.sleeping_bytes += static_cast<std::int64_t>(b->size);
      out.sleeping_resident_bytes +=
          static_cast<std::int64_t>(backed_bytes(range, b->address, b->size).first);
      if (range.is_span) recount_edge_pages(b);  // it keeps its page-use marks while asleep
      continue;
    }
    if (b->state == BlockState::kAllocated) {
      out.allocation++;
      out.allocated_bytes += static_cast<std::int64_t>(b->size);
    }
    if (b->is_active()) {
      ++active_blocks;
      ++live_seen;
      out.active++;
      out.active_bytes += static_cast<std::int64_t>(b->size);
      out.requested_bytes += static_cast<std::int64_t>(b->requested);
      if (range.is_span) {
        const std::size_t first = page_of(range, b->address);
        const std::size_t last = page_of(range, b->end() - 1);
        if (range.count_mapped(first, last + 1) != last - first + 1) {
          fail("an active block lies on an unmapped page");
        }
        recount_edge_pages(b);
      }
      continue;
    }
    const auto [backed, longest] = backed_bytes(range, b->address, b->size);
    out.free_bytes += static_cast<std::int64_t>(backed);
    out.largest_free_block = std::max(out.largest_free_block, static_cast<std::int64_t>(longest));
    if (!range.is_span && !range.memory_released && (b->prev != nullptr || b->next != nullptr)) {
      out.inactive_split++;
      out.inactive_split_bytes += static_cast<std::int64_t>(b->size);
    }
    if (range.is_span) {
      const auto [first, last] = whole_pages(range, b->address, b->end());
      free_mapped += range.count_mapped(first, last);
    }
  }
  if (cursor != range.end()) fail("blocks do not cover the whole range");
  if (active_blocks != range.active_blocks) fail("active block count is stale");
  if (!range.is_span) {
    out.segment++;  // a sleeping pool's segment keeps its address: still a segment
    if (!range.memory_released) out.reserved_bytes += static_cast<std::int64_t>(range.size);
    return 0;
  }
  out.virtual_bytes += static_cast<std::int64_t>(range.size);
  for (std::size_t i = 0; i < recount.size(); ++i) {
    const PageUse& page = range.page_use[i];
    if (page.users != recount[i].users || page.active_bytes != recount[i].active_bytes) {
      fail("page " + std::to_string(i) + " usage is stale");
    }
    if (page.users > 0 && page.active_bytes < page_bytes_) {
      out.inactive_split++;
      out.inactive_split_bytes += static_cast<std::int64_t>(page_bytes_ - page.active_bytes);
    }
  }
  const std::size_t mapped = range.count_mapped(0, range.mapped_bits.size() * 64);
  if (mapped != range.mapped_pages) fail("mapped page count is stale");
  out.mapped_bytes += static_cast<std::int64_t>(mapped * page_bytes_);
  out.reserved_bytes += static_cast<std::int64_t>(mapped * page_bytes_);
  return free_mapped;
}

}  // namespace vramledger
