#include "allocator/detail/mapped_run_index.hpp"

#include <algorithm>

#include "allocator/detail/address_range.hpp"

namespace vramledger {

void MappedRunIndex::BlockList::push(Block* block) {
  block->run_list_prev = nullptr;
  block->run_list_next = head;
  if (head != nullptr) head->run_list_prev = block;
  head = block;
}

void MappedRunIndex::BlockList::unlink(Block* block) {
  if (block->run_list_prev != nullptr) {
    block->run_list_prev->run_list_next = block->run_list_next;
  } else {
    head = block->run_list_next;
  }
  if (block->run_list_next != nullptr) block->run_list_next->run_list_prev = block->run_list_prev;
  block->run_list_prev = block->run_list_next = nullptr;
}

void MappedRunIndex::on_insert(Block* block) {
  queued_.push(block);
  block->run_list = kQueued;
}

void MappedRunIndex::on_remove(Block* block) {
  if (block->run_list == kQueued) {
    queued_.unlink(block);
  } else if (block->run_list == kScanned) {
    drop_runs(block);
    scanned_.unlink(block);
  }
  block->run_list = kUntracked;
}

void MappedRunIndex::note_mapping_change(const AddressRange* span, std::size_t first,
                                         std::size_t end) {
  if (everything_changed_ || scanned_.head == nullptr) return;  // nothing scanned to go stale
  if (changes_.size() == kMaxChanges) {
    everything_changed_ = true;
    changes_.clear();
    return;
  }
  changes_.push_back({span, first, end});
}

bool MappedRunIndex::overlaps_a_change(const Block& block) const {
  const AddressRange& span = *block.range;
  const std::size_t first = page_at(block.address - span.base);
  const std::size_t end = page_at(block.end() - 1 - span.base) + 1;
  return std::any_of(changes_.begin(), changes_.end(), [&](const Change& change) {
    return change.span == &span && change.first < end && first < change.end;
  });
}

// Scanned blocks a mapping change overlaps go back to the queue; then every queued block is
// scanned.
void MappedRunIndex::sync() {
  if (everything_changed_ || !changes_.empty()) {
    for (Block* block = scanned_.head; block != nullptr;) {
      Block* next = block->run_list_next;
      if (everything_changed_ || overlaps_a_change(*block)) {
        drop_runs(block);
        scanned_.unlink(block);
        queued_.push(block);
        block->run_list = kQueued;
      }
      block = next;
    }
    changes_.clear();
    everything_changed_ = false;
  }
  while (Block* block = queued_.head) {
    queued_.unlink(block);
    scan(block);
    scanned_.push(block);
    block->run_list = kScanned;
  }
}

// Finds `block`'s runs of mapped pages, clipped to it, in address order, and bins them.
void MappedRunIndex::scan(Block* block) {
  const AddressRange& span = *block->range;
  MappedRun** tail = &block->mapped_runs;
  span.for_each_mapped_run(
      block->address, block->end(), page_at(block->address - span.base),
      page_at(block->end() - 1 - span.base) + 1, page_bytes_, [&](DevicePtr from, DevicePtr to) {
        MappedRun* run = runs_.create();
        run->block = block;
        run->from = from;
        run->bytes = to - from;
        run->bin = size_bins::bin_of(run->bytes);
        run->bin_prev = nullptr;
        run->bin_next = (*bins_)[run->bin];
        if (run->bin_next != nullptr) run->bin_next->bin_prev = run;
        (*bins_)[run->bin] = run;
        occupied_.set(run->bin);
        *tail = run;
        tail = &run->next_in_block;
      });
  *tail = nullptr;
}

void MappedRunIndex::drop_runs(Block* block) {
  for (MappedRun* run = block->mapped_runs; run != nullptr;) {
    MappedRun* next = run->next_in_block;
    if (run->bin_prev != nullptr) {
      run->bin_prev->bin_next = run->bin_next;
    } else {
      (*bins_)[run->bin] = run->bin_next;
      if ((*bins_)[run->bin] == nullptr) occupied_.clear(run->bin);
    }
    if (run->bin_next != nullptr) run->bin_next->bin_prev = run->bin_prev;
    runs_.destroy(run);
    run = next;
  }
  block->mapped_runs = nullptr;
}

// Bins are in length order, so the answer lies in the request's own bin (whose runs may be
// shorter than the request) or else in the first non-empty bin above it (whose runs all hold it).
const MappedRun* MappedRunIndex::tightest(std::size_t size) {
  if (!enabled()) return nullptr;  // no span block was ever inserted
  sync();
  const MappedRun* best = nullptr;
  const auto tightest_in = [&](std::uint32_t bin) {
    for (const MappedRun* run = (*bins_)[bin]; run != nullptr; run = run->bin_next) {
      if (run->bytes >= size && (best == nullptr || before(*run, *best))) best = run;
    }
  };
  const std::uint32_t own = size_bins::bin_of(size);
  tightest_in(own);
  if (best != nullptr) return best;
  const std::uint32_t above = occupied_.first_at_or_above(own + 1);
  if (above < size_bins::kBins) tightest_in(above);
  return best;
}

}  // namespace vramledger
