// Sleep and wake of a whole pool (docs/sleep.md): the segment heap of a CUDA graph's private
// pool, over segments that give their memory back and keep their address
// (SleepableSegmentBackend). The graph captured raw pointers into every segment — its outputs
// in allocated blocks, its intermediates in blocks freed during the capture — so every segment
// sleeps whole and comes back at the same address.
//
// Books, as the tag sleep keeps them (sleep.cpp): an allocated block sleeps (kSleep: out of
// allocated and active, into sleeping) with all its bytes resident at first (kSleepResident);
// each segment whose memory went back is announced (kSegmentSleep: reserved -= size, still a
// segment), its sleeping blocks' bytes stop being resident and its free blocks stop counting as
// inactive split (they have no memory). A segment whose release failed keeps its memory and
// its sleeping bytes stay resident, so reserved still splits exactly into its lines. Wake is
// the mirror image.
#include <string>
#include <vector>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

inline bool CachingAllocator::Impl::pool_asleep() const {
  std::lock_guard lock(mutex_);
  return pool_asleep_;
}

inline void CachingAllocator::Impl::refuse_pool_asleep(DevicePtr ptr, const char* action) const {
  throw Error(ErrorCode::kInvalidArgument,
              std::string(action) + (ptr != 0 ? " " + format_hex(ptr) : std::string()) +
                  ": this memory pool (a CUDA graph's) is asleep (vramledger sleep); it has no "
                  "memory behind it until wake(). Nothing was changed.");
}

// The segment's memory went back: its free bytes are no longer cached memory nor inactive split
// (the split change travels on kSegmentSleep), its sleeping blocks no longer resident.
inline void CachingAllocator::Impl::segment_lost_memory(AddressRange& range) {
  for (Block* b = range.first; b != nullptr; b = b->next) {
    if (b->state == BlockState::kFree) set_inactive_split(b, false);
  }
  range.memory_released = true;
  reserved_bytes_ -= range.size;
  emit(EventKind::kSegmentSleep, range.pool, range.owner->stream, range.base, range.size);
  for (SleepingBlock& s : pool_sleep_.blocks) {
    if (s.block->range != &range || s.resident == 0) continue;
    emit(EventKind::kWakeResident, range.pool, range.owner->stream, s.block->address, s.resident,
         0, s.block->tag);
    s.resident = 0;
  }
}

inline void CachingAllocator::Impl::segment_got_memory(AddressRange& range) {
  range.memory_released = false;
  for (Block* b = range.first; b != nullptr; b = b->next) {
    if (b->state == BlockState::kFree) refresh_inactive_split(b);
  }
  reserved_bytes_ += range.size;
  emit(EventKind::kSegmentWake, range.pool, range.owner->stream, range.base, range.size);
  for (SleepingBlock& s : pool_sleep_.blocks) {
    if (s.block->range != &range || s.resident == s.block->size) continue;
    emit(EventKind::kSleepResident, range.pool, range.owner->stream, s.block->address,
         s.block->size - s.resident, 0, s.block->tag);
    s.resident = s.block->size;
  }
}

inline SleepResult CachingAllocator::Impl::sleep_pool(bool offload) {
  std::lock_guard lock(mutex_);
  auto refuse = [](ErrorCode code, const std::string& why) {
    throw Error(code, "cannot put this memory pool to sleep: " + why + "; nothing was changed");
  };
  if (pool_asleep_) refuse(ErrorCode::kInvalidArgument, "it is asleep already");
  if (paged_) {
    refuse(ErrorCode::kNotSupported,
           "the paged heap sleeps by tag (sleep(tags)), not as a whole pool");
  }
  if (front_enabled_) refuse(ErrorCode::kNotSupported, "its front caches are on (front_cache_mb)");
  if (backend_.capture_underway()) {
    refuse(ErrorCode::kInvalidArgument, "a CUDA graph capture is underway");
  }
  // Every kernel queued so far (a replay) may touch the segments: done before memory goes.
  throw_if_error(wait_for_device(), "waiting for the device before sleeping");
  if (!pending_.empty()) process_completed_frees_locked();
  std::vector<AddressRange*> ranges;
  SleepingTag asleep;
  for (const auto& heaps : streams_) {
    for (int p = 0; p < 2; ++p) {
      for (AddressRange* range : heaps->ranges[p]) {
        ranges.push_back(range);
        for (Block* b = range->first; b != nullptr; b = b->next) {
          if (b->state == BlockState::kPendingFree) {
            refuse(ErrorCode::kInvalidArgument,
                   "the block at " + format_hex(b->address) +
                       " was freed and still waits for other streams (record_stream); try "
                       "again once that work has finished");
          }
          if (b->state == BlockState::kAllocated) asleep.blocks.push_back(SleepingBlock{b});
        }
      }
    }
  }
  SleepResult result;
  if (offload) {  // first: until the copies are done, nothing has changed
    try {
      result.offloaded_bytes = copy_out_to_host(asleep);
      throw_if_error(wait_for_device(), "waiting for the offload copies");
    } catch (...) {
      if (asleep.host.data != nullptr) spare_host_.push_back(asleep.host);
      throw;
    }
  }
  // The first release tells whether these segments can sleep at all (kNotSupported on plain
  // cudaMalloc segments): nothing has changed yet.
  std::size_t released = 0;
  Status failure = Status::ok();
  for (AddressRange* range : ranges) {
    failure = backend_.release_segment_memory(range->base, range->size);
    if (!failure.is_ok()) break;
    ++released;
  }
  if (!failure.is_ok() && released == 0) {
    if (asleep.host.data != nullptr) spare_host_.push_back(asleep.host);
    refuse(failure.code(), failure.message());
  }
  pool_sleep_ = std::move(asleep);
  pool_asleep_ = true;
  for (SleepingBlock& s : pool_sleep_.blocks) {
    Block& b = *s.block;
    b.state = BlockState::kSleeping;
    sub_active(*b.range->owner, b.size);
    s.resident = b.size;  // on memory until its segment is announced released
    emit_block(EventKind::kSleep, &b);
    emit(EventKind::kSleepResident, b.range->pool, b.range->owner->stream, b.address, b.size, 0,
         b.tag);
    result.blocks++;
    result.bytes += b.size;
  }
  for (std::size_t i = 0; i < released; ++i) {
    segment_lost_memory(*ranges[i]);
    result.released_bytes += ranges[i]->size;
  }
  for (const SleepingBlock& s : pool_sleep_.blocks) result.resident_bytes += s.resident;
  if (!failure.is_ok()) {
    throw Error(ErrorCode::kDriverError,
                "the memory pool is asleep and nothing is lost, but " +
                    std::to_string(ranges.size() - released) + " of its " +
                    std::to_string(ranges.size()) + " segments kept their memory (" +
                    failure.message() + "); wake() it to use it again");
  }
  return result;
}

inline SleepResult CachingAllocator::Impl::wake_pool() {
  std::lock_guard lock(mutex_);
  if (!pool_asleep_) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot wake this memory pool: it is not asleep (never put to sleep, or woken "
                "already); nothing was changed");
  }
  if (backend_.capture_underway()) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot wake this memory pool while a CUDA graph capture is underway; nothing "
                "was changed");
  }
  std::vector<AddressRange*> ranges;
  std::size_t missing = 0;
  for (const auto& heaps : streams_) {
    for (int p = 0; p < 2; ++p) {
      for (AddressRange* range : heaps->ranges[p]) {
        if (!range->memory_released) continue;
        ranges.push_back(range);
        missing += range->size;
      }
    }
  }
  SleepResult result;
  std::size_t restored = 0;
  try {
    for (AddressRange* range : ranges) {
      ensure_within_cap(range->size);
      throw_if_error(backend_.restore_segment_memory(range->base, range->size),
                     "mapping memory again under the " + format_bytes_exact(range->size) +
                         " segment at " + format_hex(range->base));
      segment_got_memory(*range);
      ++restored;
    }
    result.offloaded_bytes += copy_back_offloaded(pool_sleep_);
    throw_if_error(wait_for_device(), "waiting for the restoring copies");
  } catch (const std::exception& error) {
    // What this call mapped goes back: the pool stays asleep with its host copy.
    std::string undo_failure;
    for (std::size_t i = 0; i < restored; ++i) {
      const Status status = backend_.release_segment_memory(ranges[i]->base, ranges[i]->size);
      if (status.is_ok()) {
        segment_lost_memory(*ranges[i]);
      } else if (undo_failure.empty()) {
        undo_failure = "; giving back what was mapped failed too (" + status.message() +
                       "), so some of its memory stays resident";
      }
    }
    const std::string text = "cannot wake this memory pool (" + format_bytes_exact(missing) +
                             " to map): " + error.what() + undo_failure +
                             ". Nothing is lost: it stays asleep with its offloaded copy; "
                             "wake() again once memory is free";
    if (dynamic_cast<const OutOfMemoryError*>(&error) != nullptr) throw OutOfMemoryError(text);
    throw Error(ErrorCode::kDriverError, text);
  }
  result.mapped_bytes = missing;
  for (SleepingBlock& s : pool_sleep_.blocks) {
    Block& b = *s.block;
    emit(EventKind::kWakeResident, b.range->pool, b.range->owner->stream, b.address, s.resident,
         0, b.tag);
    b.state = BlockState::kAllocated;
    add_active_locked(*b.range->owner, b.size);
    emit_block(EventKind::kWake, &b);
    result.blocks++;
    result.bytes += b.size;
  }
  if (pool_sleep_.host.data != nullptr) spare_host_.push_back(pool_sleep_.host);
  pool_sleep_ = SleepingTag{};
  pool_asleep_ = false;
  return result;
}

}  // namespace vramledger
