// Host memory for offloaded tags (docs/sleep.md): the pinned buffers a sleep copies a tag's
// blocks into and a wake copies them back from, kept between sleeps (pinning gigabytes costs
// seconds), prepared ahead by prepare_offload, and given back on request or at exit. The sleep
// and the wake themselves are in sleep.cpp.
#include <algorithm>
#include <vector>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

inline HostBuffer CachingAllocator::Impl::take_host_buffer(std::size_t bytes) {
  // The smallest kept buffer that fits; else a new one.
  auto best = spare_host_.end();
  for (auto it = spare_host_.begin(); it != spare_host_.end(); ++it) {
    if (it->bytes >= bytes && (best == spare_host_.end() || it->bytes < best->bytes)) best = it;
  }
  if (best != spare_host_.end()) {
    const HostBuffer buffer = *best;
    spare_host_.erase(best);
    return buffer;
  }
  HostBuffer buffer;
  throw_if_error(backend_.allocate_host(bytes, &buffer.data),
                 "allocating " + format_bytes_exact(bytes) + " of host memory for offloading");
  buffer.bytes = bytes;
  return buffer;
}

// Pins host memory for the next sleep now (an engine's start-up) instead of in that sleep:
// pinning gigabytes costs seconds (pinned_host_memory.hpp). Each named tag gets a kept buffer
// of its allocated bytes unless one already fits; pinning runs without the lock, so allocations
// go on meanwhile. Returns the bytes of host memory kept for these tags.
inline std::size_t CachingAllocator::Impl::prepare_offload(std::span<const TagId> tags) {
  std::vector<std::size_t> missing;
  std::size_t ready = 0;
  {
    std::lock_guard lock(mutex_);
    if (!paged_) {
      throw Error(ErrorCode::kNotSupported,
                  "prepare_offload: sleep needs the paged heap over virtual memory (backend '" +
                      backend_.info().name + "')");
    }
    std::map<TagId, std::size_t> bytes;
    for (TagId tag : tags) {
      if (tag == kUntagged) {
        throw Error(ErrorCode::kInvalidArgument,
                    "prepare_offload: untagged memory cannot sleep; nothing was pinned");
      }
      if (!sleeping_tags_.contains(tag)) bytes[tag] = 0;  // a sleeping tag holds its copy
    }
    for (const auto& heaps : streams_) {
      for (int p = 0; p < 2; ++p) {
        for (AddressRange* range : heaps->ranges[p]) {
          for (Block* b = range->first; b != nullptr; b = b->next) {
            const auto it = bytes.find(b->tag);
            if (it != bytes.end() && b->state == BlockState::kAllocated) it->second += b->size;
          }
        }
      }
    }
    // Largest need first, each matched with the smallest kept buffer that fits (as sleep takes
    // them, take_host_buffer).
    std::vector<std::size_t> needs;
    for (const auto& [tag, size] : bytes) {
      if (size != 0) needs.push_back(size);
    }
    std::sort(needs.rbegin(), needs.rend());
    std::vector<bool> claimed(spare_host_.size(), false);
    for (std::size_t need : needs) {
      std::size_t best = spare_host_.size();
      for (std::size_t i = 0; i < spare_host_.size(); ++i) {
        if (claimed[i] || spare_host_[i].bytes < need) continue;
        if (best == spare_host_.size() || spare_host_[i].bytes < spare_host_[best].bytes) best = i;
      }
      if (best == spare_host_.size()) {
        missing.push_back(need);
      } else {
        claimed[best] = true;
        ready += spare_host_[best].bytes;
      }
    }
  }
  std::vector<HostBuffer> pinned;
  for (std::size_t bytes : missing) {
    HostBuffer buffer;
    const Status status = backend_.allocate_host(bytes, &buffer.data);
    if (!status.is_ok()) {
      for (const HostBuffer& done : pinned) (void)backend_.free_host(done.data);
      throw_if_error(status, "prepare_offload: pinning " + format_bytes_exact(bytes) +
                                 " of host memory (nothing was kept)");
    }
    buffer.bytes = bytes;
    pinned.push_back(buffer);
    ready += bytes;
  }
  std::lock_guard lock(mutex_);
  spare_host_.insert(spare_host_.end(), pinned.begin(), pinned.end());
  return ready;
}

// Takes a host buffer for `state`'s blocks and queues their copies into it, noting each block's
// offset (the caller waits for the device); returns their bytes, and takes no buffer for none.
// Throws at the first copy the backend refuses, the buffer left in `state.host`.
inline std::size_t CachingAllocator::Impl::copy_out_to_host(SleepingTag& state) {
  std::size_t bytes = 0;
  for (const SleepingBlock& s : state.blocks) bytes += s.block->size;
  if (bytes == 0) return 0;
  state.host = take_host_buffer(bytes);
  std::size_t offset = 0;
  for (SleepingBlock& s : state.blocks) {
    throw_if_error(backend_.copy_to_host(static_cast<char*>(state.host.data) + offset,
                                         s.block->address, s.block->size),
                   "offloading " + format_bytes_exact(s.block->size) + " at " +
                       format_hex(s.block->address));
    s.host_offset = offset;
    offset += s.block->size;
  }
  return bytes;
}

// Queues the copies of `state`'s offloaded blocks back from its host copy (the caller waits for
// the device); returns their bytes. Throws at the first copy the backend refuses.
inline std::size_t CachingAllocator::Impl::copy_back_offloaded(const SleepingTag& state) {
  std::size_t bytes = 0;
  for (const SleepingBlock& s : state.blocks) {
    if (s.host_offset == SIZE_MAX) continue;
    throw_if_error(backend_.copy_to_device(s.block->address,
                                           static_cast<const char*>(state.host.data) + s.host_offset,
                                           s.block->size),
                   "restoring " + format_bytes_exact(s.block->size) + " at " +
                       format_hex(s.block->address));
    bytes += s.block->size;
  }
  return bytes;
}

inline std::size_t CachingAllocator::Impl::kept_sleep_host_bytes() const {
  std::lock_guard lock(mutex_);
  std::size_t bytes = 0;
  for (const HostBuffer& buffer : spare_host_) bytes += buffer.bytes;
  return bytes;
}

inline void CachingAllocator::Impl::release_sleep_host_memory() {
  std::lock_guard lock(mutex_);
  release_sleep_host_memory_locked();
}

inline void CachingAllocator::Impl::release_sleep_host_memory_locked() noexcept {
  for (const HostBuffer& buffer : spare_host_) (void)backend_.free_host(buffer.data);
  spare_host_.clear();
}

// At destruction: host copies of tags still asleep go too (their blocks are leaked with every
// other live block, as release_everything_at_exit leaves them).
inline void CachingAllocator::Impl::release_sleep_state_at_exit() noexcept {
  for (auto& [tag, state] : sleeping_tags_) {
    if (state.host.data != nullptr) spare_host_.push_back(state.host);
    state.host = HostBuffer{};
  }
  if (pool_sleep_.host.data != nullptr) spare_host_.push_back(pool_sleep_.host);  // pool_sleep.cpp
  pool_sleep_.host = HostBuffer{};
  release_sleep_host_memory_locked();
}

}  // namespace vramledger
