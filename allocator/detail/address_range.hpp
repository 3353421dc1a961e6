// An address range the policy carves blocks from: either a backend segment (memory fixed behind
// every byte) or a virtual span of the paged heap (pages mapped on demand).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "allocator/allocator_events.hpp"
#include "allocator/detail/block.hpp"
#include "allocator/detail/mapped_run_index.hpp"

namespace vramledger {

// Use of one page of a virtual span by the blocks that start or end on it. A page strictly
// inside an active block is covered whole and needs no count; only pages shared by several
// blocks (or partly free) are the edge pages of every active block touching them.
struct PageUse {
  std::uint32_t users = 0;       // active blocks whose first or last page this is
  std::size_t active_bytes = 0;  // their bytes on this page
};

// Physical memory created in one piece (one cuMemCreate): `pages` pages, mapped and unmapped only
// as a whole. Mapping a run of pages as few chunks is what amortises the driver's per-mapping
// cost (cuMemMap + cuMemSetAccess cost about the same for 2 MiB as for 64 MiB).
struct PhysicalChunk {
  PhysicalHandle handle = 0;
  std::size_t pages = 0;
};

// What backs one mapped page: its chunk's handle and the chunk's first page in the span.
struct PageMapping {
  PhysicalHandle handle = 0;
  std::size_t head = 0;
};

// Bits set in `bits`, inline: std::popcount compiles to a call of libgcc's __popcountdi2 on
// baseline x86-64 (no POPCNT instruction assumed).
inline std::size_t bits_set(std::uint64_t bits) {
  bits -= (bits >> 1) & 0x5555555555555555ull;
  bits = (bits & 0x3333333333333333ull) + ((bits >> 2) & 0x3333333333333333ull);
  bits = (bits + (bits >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return static_cast<std::size_t>((bits * 0x0101010101010101ull) >> 56);
}

// Cache-line aligned: its stream's operations write it (active_blocks, the page maps), and
// ranges of different streams, created one after another, would otherwise share lines.
struct alignas(64) AddressRange {
  DevicePtr base = 0;
  std::size_t size = 0;
  StreamHeaps* owner = nullptr;
  PoolKind pool = PoolKind::kLarge;
  bool is_span = false;
  // A segment of a sleeping pool (detail/pool_sleep.cpp): address kept, no memory behind it.
  bool memory_released = false;
  Block* first = nullptr;
  std::size_t active_blocks = 0;

  // Virtual spans only; pages past the end of these vectors were never touched.
  std::vector<PageUse> page_use;
  std::vector<PageMapping> page_mapping;
  std::vector<std::uint64_t> mapped_bits;
  std::size_t mapped_pages = 0;
  // The owner's index of free blocks' mapped runs for this span's pool, told of every change of
  // mapped_bits (set_chunk_mapped, clear_chunk_mapped).
  MappedRunIndex* run_index = nullptr;
  // The owner stream's clock (StreamHeaps::allocations) when each page last became wholly free.
  std::vector<std::uint64_t> page_idle_since;
  // Pages whose physical memory was aliased to another address of the same stream
  // (AllocatorOptions::alias_pending_pages) or moved (unmap_in_background): still mapped in the
  // driver until the work queued before their free has finished, so neither usable nor
  // mappable; unmapped in mapped_bits. A page retires for one old address at a time, so
  // retiring_fence holds, for each retiring page, the owner stream's fence that proves that
  // work done (StreamHeaps::RetiringMapping::fence): whether a placement would wait is then a
  // look at its own pages, not at every retiring mapping of the stream (~350 of them on ViT's
  // trace at a lag of 1000 operations, looked at for each fit considered).
  std::vector<std::uint64_t> retiring_bits;
  std::vector<std::uint64_t> retiring_fence;
  std::size_t retiring_pages = 0;

  DevicePtr end() const { return base + size; }

  bool is_mapped(std::size_t page) const {
    return page / 64 < mapped_bits.size() && (mapped_bits[page / 64] >> (page % 64) & 1) != 0;
  }
  // Number of mapped pages in [first, last). The single page of a small block's allocation or
  // free is the common case: it stays inline, the loop does not (perf, the paged heap's warm
  // 512 B pair: the call alone was ~2.5% of it).
  std::size_t count_mapped(std::size_t first, std::size_t last) const {
    if (last == first + 1) [[likely]] return is_mapped(first) ? 1 : 0;
    return count_mapped_words(first, last);
  }
  [[gnu::noinline]] std::size_t count_mapped_words(std::size_t first, std::size_t last) const {
    std::size_t count = 0;
    last = std::min(last, mapped_bits.size() * 64);
    while (first < last) {
      const std::size_t word = first / 64;
      const std::size_t bit = first % 64;
      const std::size_t take = std::min<std::size_t>(64 - bit, last - first);
      std::uint64_t bits = mapped_bits[word] >> bit;
      if (take < 64) bits &= (std::uint64_t{1} << take) - 1;
      count += bits_set(bits);
      first += take;
    }
    return count;
  }
  // The first page in [from, to) that is mapped (`mapped`) or not (`!mapped`), else `to`; a
  // word of the bitmap at a time (a span's free tail runs to twice the device's pages).
  std::size_t next_page(bool mapped, std::size_t from, std::size_t to) const {
    const std::size_t known = mapped_bits.size() * 64;  // pages past it were never mapped
    while (from < std::min(to, known)) {
      std::uint64_t bits = mapped ? mapped_bits[from / 64] : ~mapped_bits[from / 64];
      bits &= ~std::uint64_t{0} << (from % 64);
      if (bits != 0) return std::min(to, from / 64 * 64 + std::countr_zero(bits));
      from = from / 64 * 64 + 64;
    }
    return mapped ? to : std::min(to, std::max(from, known));
  }
  // Calls visit(from, to) for each run of mapped pages among pages [first_page, end_page), the
  // pages that [address, end) touches, clipped to [address, end), in address order.
  template <typename Visit>
  void for_each_mapped_run(DevicePtr address, DevicePtr end, std::size_t first_page,
                           std::size_t end_page, std::size_t page_bytes, Visit&& visit) const {
    for (std::size_t first = next_page(true, first_page, end_page); first < end_page;
         first = next_page(true, first, end_page)) {
      const std::size_t run_end = next_page(false, first, end_page);
      visit(std::max(address, base + first * page_bytes),
            std::min(end, base + run_end * page_bytes));
      first = run_end;
    }
  }
  // Calls visit(page) for every mapped page in [first, last).
  template <typename Visit>
  void for_each_mapped(std::size_t first, std::size_t last, Visit&& visit) const {
    first_mapped(first, last, [&](std::size_t page) {
      visit(page);
      return false;
    });
  }
  // The first mapped page in [first, last), in address order, for which take(page) holds.
  template <typename Take>
  std::optional<std::size_t> first_mapped(std::size_t first, std::size_t last, Take&& take) const {
    last = std::min(last, mapped_bits.size() * 64);
    for (std::size_t word = first / 64; word * 64 < last; ++word) {
      std::uint64_t bits = mapped_bits[word];
      if (word == first / 64) bits &= ~std::uint64_t{0} << (first % 64);
      while (bits != 0) {
        const std::size_t page = word * 64 + static_cast<std::size_t>(std::countr_zero(bits));
        if (page >= last) return std::nullopt;
        bits &= bits - 1;
        if (take(page)) return page;
      }
    }
    return std::nullopt;
  }

  void grow_pages(std::size_t page_count) {
    if (page_use.size() >= page_count) return;
    page_use.resize(page_count);
    page_mapping.resize(page_count);
    page_idle_since.resize(page_count, 0);
    mapped_bits.resize((page_count + 63) / 64, 0);
  }
  // Marks pages [first, first + pages) retiring until `fence` completes, or no longer retiring.
  void set_retiring(std::size_t first, std::size_t pages, bool retiring, std::uint64_t fence = 0) {
    const std::size_t end = first + pages;
    retiring_bits.resize(std::max(retiring_bits.size(), (end + 63) / 64), 0);
    if (retiring && retiring_fence.size() < end) retiring_fence.resize(end, 0);
    for (std::size_t page = first; page < end; ++page) {
      const std::uint64_t bit = std::uint64_t{1} << (page % 64);
      if (retiring) retiring_fence[page] = fence;
      const bool was = (retiring_bits[page / 64] & bit) != 0;
      if (was == retiring) continue;
      retiring_bits[page / 64] ^= bit;
      retiring ? ++retiring_pages : --retiring_pages;
    }
  }
  // Any retiring page in [first, last).
  bool any_retiring(std::size_t first, std::size_t last) const {
    return any_retiring_after(first, last, std::nullopt);
  }
  // Any retiring page in [first, last) whose fence is later than `completed_fence` (any at all
  // without one).
  bool any_retiring_after(std::size_t first, std::size_t last,
                          std::optional<std::uint64_t> completed_fence) const {
    if (retiring_pages == 0) return false;
    last = std::min(last, retiring_bits.size() * 64);
    while (first < last) {
      std::uint64_t bits = retiring_bits[first / 64] & (~std::uint64_t{0} << (first % 64));
      const std::size_t word_end = std::min(last, first / 64 * 64 + 64);
      while (bits != 0) {
        const std::size_t page = first / 64 * 64 + static_cast<std::size_t>(std::countr_zero(bits));
        if (page >= word_end) break;
        if (!completed_fence || retiring_fence[page] > *completed_fence) return true;
        bits &= bits - 1;
      }
      first = word_end;
    }
    return false;
  }
  // Records that `chunk` is mapped at pages [first, first + chunk.pages).
  void set_chunk_mapped(std::size_t first, PhysicalChunk chunk) {
    grow_pages(first + chunk.pages);
    for (std::size_t page = first; page < first + chunk.pages; ++page) {
      mapped_bits[page / 64] |= std::uint64_t{1} << (page % 64);
      page_mapping[page] = PageMapping{chunk.handle, first};
    }
    mapped_pages += chunk.pages;
    if (run_index != nullptr) run_index->note_mapping_change(this, first, first + chunk.pages);
  }
  // Forgets the chunk mapped from page `head` on (which must be its first page); returns it.
  PhysicalChunk clear_chunk_mapped(std::size_t head) {
    const PhysicalChunk chunk{page_mapping[head].handle, chunk_pages(head)};
    for (std::size_t page = head; page < head + chunk.pages; ++page) {
      mapped_bits[page / 64] &= ~(std::uint64_t{1} << (page % 64));
      page_mapping[page] = PageMapping{};
    }
    mapped_pages -= chunk.pages;
    if (run_index != nullptr) run_index->note_mapping_change(this, head, head + chunk.pages);
    return chunk;
  }
  bool is_chunk_head(std::size_t page) const {
    return is_mapped(page) && page_mapping[page].head == page;
  }
  // Pages of the chunk whose first page is `head`.
  std::size_t chunk_pages(std::size_t head) const {
    std::size_t page = head;
    while (page < page_mapping.size() && is_mapped(page) && page_mapping[page].head == head) {
      ++page;
    }
    return page - head;
  }
};

// Where a page-level operation must not take pages from: the pages an allocation is about to
// use.
struct PageExclusion {
  const AddressRange* span = nullptr;
  std::size_t first = 0;
  std::size_t last = 0;  // inclusive
  // Whether any of the pages [from, from + count) is excluded.
  bool intersects(const AddressRange* range, std::size_t from, std::size_t count) const {
    return range == span && from <= last && from + count > first;
  }
};

}  // namespace vramledger
