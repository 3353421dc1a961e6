// The free physical pool: created, unmapped chunks by size, and acquire_physical, which
// decides where the memory for new pages comes from (free chunks, idle pages of this or
// other streams, aliased pending pages, new memory within the cap).
#include <optional>
#include <vector>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

// A chunk in the free pool may still be mapped at an old, retiring address (aliasing): it is
// unmapped there before the chunk is mapped anywhere else or released (take_spare,
// release_chunk), so that a failure there leaves the chunk where it was.
inline void CachingAllocator::Impl::put_spare(PoolKind pool, PhysicalChunk chunk) {
  free_physical_[pool_index(pool)][chunk.pages].push_back(chunk.handle);
  free_physical_pages_[pool_index(pool)] += chunk.pages;
}

// The largest free chunk of at most `max_pages` pages, if any.
inline std::optional<PhysicalChunk> CachingAllocator::Impl::take_spare(PoolKind pool,
                                                                       std::size_t max_pages) {
  auto& spare = free_physical_[pool_index(pool)];
  auto it = spare.upper_bound(max_pages);
  if (it == spare.begin()) return std::nullopt;
  --it;
  PhysicalChunk chunk{it->second.back(), it->first};
  // May throw: nothing taken yet. Old addresses whose work is done may stay mapped meanwhile.
  if (retiring_mappings_ != 0) retire_handle(chunk.handle, /*only_if_unsafe=*/true);
  it->second.pop_back();
  if (it->second.empty()) spare.erase(it);
  free_physical_pages_[pool_index(pool)] -= chunk.pages;
  return chunk;
}

// Gives a free chunk back to the driver; if the driver refuses, it stays in the free pool.
inline void CachingAllocator::Impl::release_chunk(PoolKind pool, PhysicalChunk chunk) {
  if (retiring_mappings_ != 0) {
    try {
      retire_handle(chunk.handle);
    } catch (...) {
      put_spare(pool, chunk);
      throw;
    }
  }
  if (Status status = backend_.release_physical(chunk.handle); !status) {
    put_spare(pool, chunk);
    throw_if_error(status, "releasing " + format_bytes_exact(chunk.pages * page_bytes_) +
                               " of physical memory");
  }
  reserved_bytes_ -= chunk.pages * page_bytes_;
  emit(EventKind::kPhysicalRelease, pool, 0, 0, chunk.pages * page_bytes_);
}

// Gives free chunks of more than `max_pages` pages back to the driver; returns the pages freed.
inline std::size_t CachingAllocator::Impl::release_spare_larger_than(PoolKind pool,
                                                                     std::size_t max_pages) {
  std::size_t released = 0;
  while (true) {
    auto& spare = free_physical_[pool_index(pool)];
    auto it = spare.upper_bound(max_pages);
    if (it == spare.end()) return released;
    const std::size_t pages = it->first;
    std::optional<PhysicalChunk> chunk = take_spare(pool, pages);
    release_chunk(pool, *chunk);
    released += pages;
  }
}

// New physical memory of `pages` pages, or nullopt when the device or the cap says no.
inline std::optional<PhysicalChunk> CachingAllocator::Impl::create_chunk(PoolKind pool,
                                                                         std::size_t pages,
                                                                         std::string* shortage) {
  const std::size_t bytes = pages * page_bytes_;
  if (cap_ != 0 && reserved_bytes_ + bytes > cap_) {
    *shortage = "the cap of " + format_bytes_exact(cap_) + " is reached";
    return std::nullopt;
  }
  PhysicalHandle handle = 0;
  Status status = backend_.create_physical(bytes, &handle);
  if (status.code() == ErrorCode::kOutOfMemory) {
    *shortage = status.message();
    return std::nullopt;
  }
  throw_if_error(status,
                 [&] { return "creating " + format_bytes_exact(bytes) + " of physical memory"; });
  reserved_bytes_ += bytes;
  emit(EventKind::kPhysicalCreate, pool, 0, 0, bytes);
  return PhysicalChunk{handle, pages};
}

// The chunk size for filling a run of `run_pages` new pages. A chunk is unmapped only as a
// whole, so one that is partly in use pins its free pages where they are. Chunks are an eighth
// of the run (a large request gets few mappings, and its own chunks pin little once it is
// freed; a run under 8 pages is mapped page by page), at most map_chunk_bytes. Chosen on the
// trace corpus (bench/results/): every trace stays within 1.0024-1.0196 peak reserved / peak
// requested (page by page: 1.0015-1.0196) with 1.6-4.6x fewer creates, mappings and
// unmappings. Sizing chunks by the heap as well (1/512 of what is reserved) saved another ~25%
// of them but raised six of the eight traces' ratios by up to 0.6 points.
inline std::size_t CachingAllocator::Impl::chunk_pages_for(std::size_t run_pages) const {
  constexpr std::size_t kShareOfRun = 8;
  return std::clamp<std::size_t>(run_pages / kShareOfRun, 1, max_chunk_pages_);
}

// Idle memory of another stream is taken only once growing would cost more than the
// cross-stream slack: streams that hand work to each other (a side stream making inputs that
// the main stream consumes) otherwise take each other's pages at every step, and each move is
// an unmap and a map (measured on the H200: +76% step time on the two-stream workload).
//
// The slack is at least kMinSlackPages pages: a heap under ~200 MB has a 1% share smaller than
// one page, and two streams taking turns with a block each then traded a page at every
// allocation (an unmap and a map under the allocator's lock, ~70 us on the H200, where the
// warm pair costs ~0.3 us; test TwoSmallStreamsTakingTurnsKeepAPageEach).
inline bool CachingAllocator::Impl::may_grow_instead_of_taking_from_other_streams(
    std::size_t pages) const {
  if (options_.cross_stream_slack_permille == 0) return false;
  constexpr std::size_t kMinSlackPages = 2;
  const std::size_t permille = std::min<std::size_t>(options_.cross_stream_slack_permille, 100000);
  // Device memory (< 2^43 bytes) times at most 100,000 (< 2^17): far from overflowing 64 bits.
  const std::size_t peak = active_peak_;
  const std::size_t budget = peak + std::max(peak * permille / 1000, kMinSlackPages * page_bytes_);
  return reserved_bytes_ + pages * page_bytes_ <= budget;
}

// With cross_stream_cold_allocations (AllocatorOptions), another stream's idle pages are taken
// (beyond the slack, before growing) only when cold: that stream has served that many
// allocations since they became idle without needing them, or it is quiet (no allocation at
// all over the last kQuietLooks looks at other streams). Streams that allocate side by side
// otherwise hand pages back and forth at the margin of each one's working set, an unmap and a
// map under the allocator's lock each time: the mixed ring on 16 threads made 53 driver calls
// per thousand pairs on the H200 host's CPU (bench/results/gpu/2026-12-02-h200-session-11.md).
// The rule applies while at least cross_stream_cold_streams streams allocate: the one asking
// and every stream that is not quiet. Two streams passing work to each other keep trading
// within the slack (AllocatorOptions::cross_stream_cold_streams says why).
inline void CachingAllocator::Impl::note_look_at_other_streams(const StreamHeaps& requester) {
  ++looks_at_other_streams_;
  std::size_t allocating = 0;
  for (auto& heaps : streams_) {
    if (heaps->allocations != heaps->allocations_at_look) {
      heaps->allocations_at_look = heaps->allocations;
      heaps->look_when_moved = looks_at_other_streams_;
    }
    if (heaps.get() == &requester || !stream_is_quiet(*heaps)) ++allocating;
  }
  cold_rule_applies_ = options_.cross_stream_cold_allocations != 0 &&
                       allocating >= options_.cross_stream_cold_streams;
}

inline bool CachingAllocator::Impl::stream_is_quiet(const StreamHeaps& heaps) const {
  constexpr std::uint64_t kQuietLooks = 8;
  return looks_at_other_streams_ - heaps.look_when_moved >= kQuietLooks;
}

inline bool CachingAllocator::Impl::chunk_is_cold(const StreamHeaps& heaps,
                                                  const AddressRange& span, std::size_t head,
                                                  std::size_t pages) const {
  const std::uint64_t cold_after = options_.cross_stream_cold_allocations;
  if (!cold_rule_applies_ || stream_is_quiet(heaps)) return true;
  for (std::size_t page = head; page < head + pages; ++page) {
    if (heaps.allocations - span.page_idle_since[page] < cold_after) return false;
  }
  return true;
}

// Physical chunks that fill each run exactly, in order. Sources, cheapest in memory first:
// free chunks that fit, idle mapped chunks of the owner stream that fit, its own pages still
// in use (alias_pending_pages), new memory within the cross-stream slack, idle mapped chunks
// of other streams that fit, other streams' pages still in use (aliased after a GPU-side wait
// for their fence), new memory (in chunks of up to max_chunk_pages_, smaller when
// the device is short), then under pressure: free chunks too large for the run go back to the
// driver so smaller ones can be created, idle chunks of any size are unmapped, and finally
// pages still in use by their streams are waited for. Throws OutOfMemoryError (leaving what
// it gathered in the free pool) if all fall short.
inline std::vector<PhysicalChunk> CachingAllocator::Impl::acquire_physical(
    StreamHeaps& owner, PoolKind pool, const std::vector<std::pair<std::size_t, std::size_t>>& runs,
    const PageExclusion& exclusion) {
  std::vector<PhysicalChunk> chunks;
  std::string shortage;
  bool looked_at_other_streams = false;
  try {
    for (const auto& run : runs) {
      std::size_t needed = run.second;
      const std::size_t chunk_pages = chunk_pages_for(run.second);
      while (needed > 0) {
        std::optional<PhysicalChunk> chunk = take_spare(pool, needed);
        if (!chunk && unmap_idle_chunks(pool, needed, needed, /*wait=*/false, exclusion,
                                        StreamChoice::kOnly, &owner) > 0) {
          continue;
        }
        if (!chunk && options_.alias_pending_pages) {
          chunk = alias_pending_chunk(owner, pool, needed, exclusion);
        }
        if (!chunk && may_grow_instead_of_taking_from_other_streams(needed)) {
          chunk = create_chunk(pool, std::min(needed, chunk_pages), &shortage);
        }
        if (!chunk && !looked_at_other_streams && options_.cross_stream_cold_allocations != 0) {
          note_look_at_other_streams(owner);
          looked_at_other_streams = true;
        }
        if (!chunk && unmap_idle_chunks(pool, needed, needed, /*wait=*/false, exclusion,
                                        StreamChoice::kOthersCold, &owner) > 0) {
          continue;
        }
        if (!chunk && options_.alias_pending_pages) {
          chunk = alias_other_streams_pending_chunk(owner, pool, needed, exclusion);
        }
        for (std::size_t want = std::min(needed, chunk_pages); !chunk && want > 0;
             want /= 2) {
          chunk = create_chunk(pool, want, &shortage);
        }
        if (!chunk) {
          if (release_spare_larger_than(pool, needed) > 0 ||
              unmap_idle_chunks(pool, needed, SIZE_MAX, /*wait=*/false, exclusion) > 0 ||
              unmap_idle_chunks(pool, needed, SIZE_MAX, /*wait=*/true, exclusion) > 0) {
            continue;
          }
          throw OutOfMemoryError("need " + format_bytes_exact(needed * page_bytes_) +
                                 " more physical memory in pages of " +
                                 format_bytes_exact(page_bytes_) + ": " + shortage);
        }
        chunks.push_back(*chunk);
        needed -= chunk->pages;
      }
    }
  } catch (...) {
    for (const PhysicalChunk& chunk : chunks) put_spare(pool, chunk);
    throw;
  }
  return chunks;
}

}  // namespace vramledger
