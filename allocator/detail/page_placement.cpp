// Where a paged allocation goes when its best fit by size lies over unmapped pages: the cost of
// a place (a wait for the GPU, pages to map), a few fits and places inside them, and the
// tightest free run of mapped pages when idle mapped memory is plentiful. Reads only a stream's
// free index, its spans and the plentiful rule's figures, so the stream's fast path makes the
// same choice under its own lock (detail/stream_fast_path.cpp). The choices set the corpus's
// fragmentation figures: a cheaper way to a choice must make the same one.
#include <algorithm>
#include <cassert>
#include <limits>
#include <optional>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

// What placing `size` bytes at `address` of `candidate` costs: whether the CPU would have to
// wait for the GPU (an old address of aliased memory still in use: map_pages_for waits for its
// fence, draining the GPU's queue), then how many pages must be mapped (driver calls, and
// memory when no page is free anywhere).
inline CachingAllocator::Impl::Placement CachingAllocator::Impl::place_at(Block* candidate,
                                                                         DevicePtr address,
                                                                         std::size_t size) const {
  const AddressRange& span = *candidate->range;
  const std::size_t first = page_of(span, address);
  const std::size_t last = page_of(span, address + size - 1);
  return Placement{candidate, address,
                   {waits_for_gpu(span, first, last + 1), pages_to_map(span, address, size)}};
}

// Whether `heaps` has an old address still mapped for work queued before its free.
inline bool CachingAllocator::Impl::any_retiring_behind_fence(const StreamHeaps& heaps) const {
  for (const StreamHeaps::RetiringMapping& r : heaps.retiring) {
    if (!heaps.fence_done(r.fence)) return true;
  }
  return false;
}

// Whether mapping pages [first, last) of `span` would wait for the GPU: an old address there is
// still mapped for work queued before its free. Old addresses whose work is done cost nothing
// here, whether or not the helper thread has unmapped them yet (so the layout does not depend
// on how fast it runs).
inline bool CachingAllocator::Impl::waits_for_gpu(const AddressRange& span, std::size_t first,
                                                  std::size_t last) const {
  return span.any_retiring_after(first, last, span.owner->completed_fence);
}

// With place_by_mapped_pages, where inside `candidate` (a free block of at least `size` bytes)
// an allocation of kPlacedMinPages pages or more needs the fewest new pages: its front, its
// back, or the start of one of its runs of mapped pages. Otherwise (and for smaller
// allocations) its front. Small allocations stay packed at the front: placed anywhere they
// leave partly used pages behind them, which cost the small generation trace 2-3 points of
// peak reserved on the lag replays, while the mappings they would save are few (a mapping
// costs ~30 us whatever its size, so the large allocations, mapped in up to 8 chunks each,
// are where the driver calls are: docs/configuration.md).
inline CachingAllocator::Impl::Placement CachingAllocator::Impl::best_place_in(
    Block* candidate, std::size_t size) const {
  constexpr std::size_t kPlacedMinPages = 8;
  Placement best = place_at(candidate, candidate->address, size);
  if (!options_.place_by_mapped_pages || size < kPlacedMinPages * page_bytes_) return best;
  auto consider = [&](DevicePtr address) {
    if (address < candidate->address || address + size > candidate->end()) return;
    const Placement place = place_at(candidate, address, size);
    if (place.cost < best.cost) best = place;
  };
  consider(candidate->end() - size);
  const AddressRange& span = *candidate->range;
  const auto [first, last] = whole_pages(span, candidate->address, candidate->end());
  if (first >= last || span.count_mapped(first, last) == 0) return best;
  constexpr int kRuns = 16;  // bounds the work in a block with scattered mapped pages
  int runs = 0;
  std::size_t previous = SIZE_MAX;
  span.for_each_mapped(first, last, [&](std::size_t page) {
    if (runs >= kRuns || best.cost.second == 0) return;
    if (previous == SIZE_MAX || page != previous + 1) {  // a run of mapped pages starts here
      ++runs;
      consider(span.base + page * page_bytes_);
    }
    previous = page;
  });
  return best;
}

// The best fit by size needs new pages: look at a few other fits (and, with
// place_by_mapped_pages, at places inside each) for one that needs no wait and fewer pages.
// The first five fits by size (the best fit among them): the fewer looked at, the closer the
// choice stays to the best fit by size. Eight (until 2026-12-02) saved the most mappings at the
// time of each choice but cost more later: on the corpus's lag replays with 4 MiB chunks, five
// made 13% fewer steady-state driver calls and held every trace but two_stream (bound by the
// cross-stream slack) within 1.0098 at 24 lags, where eight reached 1.0115; six and seven took
// vit_train to 1.013, three and fewer took gpt2_generate past 1.03
// (bench/results/2026-12-02-replay-placement-candidates.md).
inline CachingAllocator::Impl::Placement
CachingAllocator::Impl::placement_needing_fewest_new_pages(const FreeBlockIndex& index,
                                                            std::size_t size,
                                                            Block* best_fit) const {
  constexpr int kCandidates = 5;
  Placement best = best_place_in(best_fit, size);
  const auto consider = [&](Block* candidate) {
    const Placement place = best_place_in(candidate, size);
    if (place.cost < best.cost) best = place;
  };
  index.for_each_fit(size, kCandidates, [&](Block* candidate) {
    if (!best.needs_nothing()) consider(candidate);
  });
  // Each of them would stop the thread until the GPU has run the work still using an old
  // address there: the GPU's queue would run dry. Any fit that does not wait is better, however
  // many pages it must map (the span's unmapped tail always is one).
  if (best.cost.first) index.for_each_fit(size, std::numeric_limits<int>::max(), consider);
  return best;
}

// Where an allocation goes when its best fit by size, `best_fit`, needs pages mapped: the place
// among a few fits needing the fewest, or, if that still needs some while idle mapped memory is
// plentiful, the tightest free run of mapped pages. Reads only `index`, its spans and the
// plentiful rule's figures, so a stream's fast path makes the same choice under its own lock
// (detail/stream_fast_path.cpp).
inline CachingAllocator::Impl::Placement
CachingAllocator::Impl::placement_when_best_fit_needs_pages(FreeBlockIndex& index,
                                                            PoolKind pool, std::size_t size,
                                                            Block* best_fit) const {
  Placement best = placement_needing_fewest_new_pages(index, size, best_fit);
  if (best.cost.second > 0 && idle_mapped_memory_is_plentiful(pool)) {
    if (const std::optional<Placement> run = tightest_mapped_run(index, size)) best = *run;
  }
  return best;
}

// Whether free mapped pages make up at least kPlentifulIdlePercent of reserved memory. A step
// of a program smaller than its peak (GPT-2 training: a random sequence length per step) leaves
// that much idle; then an allocation that fits in a free run of mapped pages anywhere goes there
// (tightest_mapped_run) instead of moving pages under the best fit by size (an unmap and a map
// per chunk, ~50 us of CPU in the allocating thread on the H200). Below it (the heap at its
// peak), moving idle pages under the best fit keeps the live blocks packed. On the corpus's lag
// replays (0, 30, 100, 1000 operations), the driver calls made while reserved memory was not
// growing fell from 58,382 to 16,815 (gpt2_train: 11,490 to 612), every trace within its
// guard (bench/results/2026-12-02-replay-steady-state-calls.md). Reusing in place whatever the
// idle memory cut them to 12,958 but took gpt2_generate (446 MB: a 2 MiB page is 0.47%) to
// 1.0431; from 2% to 10% it moves by a page either way (3% is the level that kept it within
// 1.02 without aliasing and 1.03 with it at every lag).
//
// Also asked on a stream's fast path (detail/stream_fast_path.cpp), under that stream's lock:
// reserved_bytes_ changes only under the allocator's lock, which holds that one too, and other
// streams' free mapped pages are read as they stand.
inline bool CachingAllocator::Impl::idle_mapped_memory_is_plentiful(PoolKind pool) const {
  constexpr std::size_t kPlentifulIdlePercent = 3;
  return free_mapped_pages(pool_index(pool)) * page_bytes_ * 100 >=
         reserved_bytes_ * kPlentifulIdlePercent;
}

// The tightest run of mapped pages, within one free block of `index`, that holds `size` bytes
// at its start, or nullopt; among runs of the same length, the first that a walk over
// index.for_each_fit would reach (bins ascending, newest block first, runs in address order),
// which the corpus figures depend on. Its pages are mapped, so the allocation needs no driver
// call (a page still mapped at an old address of aliased memory counts as unmapped in
// mapped_bits). Found in the index's runs by length (detail/mapped_run_index.hpp): walking
// every fit instead was ~40% of the paged heap's CPU on the GPT-2 and T5 training traces (12,397
// calls visiting 37.5 fits each on GPT-2's; bench/results/2026-12-05-session-31-cpu.md).
inline std::optional<CachingAllocator::Impl::Placement>
CachingAllocator::Impl::tightest_mapped_run(FreeBlockIndex& index, std::size_t size) const {
  std::optional<Placement> found;
  if (const MappedRun* run = index.mapped_runs().tightest(size)) {
    found = Placement{run->block, run->from, {false, 0}};
  }
#ifndef NDEBUG
  // Debug builds (the sanitizer runs): the walk the index replaces chooses the same.
  const std::optional<Placement> walked = tightest_mapped_run_by_walk(index, size);
  assert(walked.has_value() == found.has_value());
  assert(!found || (walked->block == found->block && walked->address == found->address));
#endif
  return found;
}

// The same choice by walking every fit and scanning its pages: the definition the index must
// match, for debug builds' checks and tests.
inline std::optional<CachingAllocator::Impl::Placement>
CachingAllocator::Impl::tightest_mapped_run_by_walk(const FreeBlockIndex& index,
                                                    std::size_t size) const {
  std::optional<Placement> best;
  std::size_t best_bytes = SIZE_MAX;
  index.for_each_fit(size, std::numeric_limits<int>::max(), [&](Block* block) {
    if (!block->range->is_span || best_bytes == size) return;
    const AddressRange& span = *block->range;
    span.for_each_mapped_run(block->address, block->end(), page_of(span, block->address),
                             page_of(span, block->end() - 1) + 1, page_bytes_,
                             [&](DevicePtr from, DevicePtr to) {
                               if (to - from >= size && to - from < best_bytes) {
                                 best_bytes = to - from;
                                 best = Placement{block, from, {false, 0}};
                               }
                             });
  });
  return best;
}

inline std::size_t CachingAllocator::Impl::pages_to_map(const AddressRange& span, DevicePtr address,
                                                        std::size_t size) const {
  const std::size_t first = page_of(span, address);
  const std::size_t last = page_of(span, address + size - 1);
  return last - first + 1 - span.count_mapped(first, last + 1);
}

}  // namespace vramledger
