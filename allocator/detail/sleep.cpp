// Sleep and wake by tag (docs/sleep.md): the physical memory under a tag's allocated blocks goes
// back to the device while their addresses stay reserved, so every pointer into them — and every
// CUDA graph that captured one — is valid again after the wake. Offloaded tags travel to host
// memory and back; the others come back with undefined contents (a KV cache).
//
// Pages are released a physical chunk at a time (a mapping is undone only whole). A page may go
// only when nothing awake needs its bytes: it lies wholly in a free block, or only sleeping
// blocks touch it. Pages shared with an awake block or with free bytes stay mapped for the whole
// sleep (unmapping takes only pages wholly inside free blocks, and an allocation maps only pages
// of its free block, which such a page is not). The sleeping bytes on mapped pages are
// "resident": the ledger is told (kSleepResident / kWakeResident), so reserved still splits
// exactly into its lines. Only sleep and wake change them — a wake of one tag maps a page it
// shares with another sleeping tag, a sleep releases it again — so both refresh every sleeping
// block's figure (refresh_all_resident).
//
// A sleeping block keeps its page-use marks (PageUse counts it as a user of its edge pages), so
// the paged inactive split, which counts free bytes on pages in use, does not change.
#include <algorithm>
#include <string>
#include <vector>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

namespace {

std::string tag_text(TagId tag) { return "tag #" + std::to_string(tag); }

std::string tags_text(std::span<const TagId> tags) {
  std::string text;
  for (TagId tag : tags) {
    if (!text.empty()) text += ", ";
    text += tag_text(tag);
  }
  return text;
}

}  // namespace

inline void CachingAllocator::Impl::refuse_asleep(TagId tag, DevicePtr ptr,
                                                  const char* action) const {
  throw Error(ErrorCode::kInvalidArgument,
              std::string(action) + (ptr != 0 ? " " + format_hex(ptr) : std::string()) + ": " +
                  tag_text(tag) +
                  " is asleep (vramledger sleep); its blocks have no memory behind them until "
                  "wake(). Nothing was changed.");
}

inline std::vector<TagId> CachingAllocator::Impl::sleeping_tags() const {
  std::lock_guard lock(mutex_);
  std::vector<TagId> tags;
  for (const auto& [tag, state] : sleeping_tags_) tags.push_back(tag);
  return tags;
}

inline bool CachingAllocator::Impl::is_asleep(DevicePtr ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = live_.find(ptr);
  return block != nullptr && block->state == BlockState::kSleeping;
}

// The allocated blocks of `tags`; throws, changing nothing, for a block of them still awaiting
// other streams after its free (it cannot be slept and would be freed under the sleep).
inline std::vector<Block*> CachingAllocator::Impl::blocks_to_sleep(
    std::span<const TagId> tags) const {
  std::vector<Block*> blocks;
  for (const auto& heaps : streams_) {
    for (int p = 0; p < 2; ++p) {
      for (AddressRange* range : heaps->ranges[p]) {
        for (Block* b = range->first; b != nullptr; b = b->next) {
          if (b->state == BlockState::kFree || b->state == BlockState::kSleeping) continue;
          if (std::find(tags.begin(), tags.end(), b->tag) == tags.end()) continue;
          if (b->state == BlockState::kPendingFree) {
            throw Error(ErrorCode::kInvalidArgument,
                        "cannot sleep " + tag_text(b->tag) + ": the block at " +
                            format_hex(b->address) +
                            " was freed and its memory still waits for other streams "
                            "(record_stream); nothing was put to sleep. Try again once that "
                            "work has finished.");
          }
          blocks.push_back(b);
        }
      }
    }
  }
  return blocks;
}

// The bytes of a sleeping block still on mapped pages, announced to the ledger as they change.
inline void CachingAllocator::Impl::refresh_resident(SleepingBlock& sleeping) {
  const Block& b = *sleeping.block;
  const std::size_t now = backed_bytes(*b.range, b.address, b.size).first;
  if (now > sleeping.resident) {
    emit(EventKind::kSleepResident, b.range->pool, b.range->owner->stream, b.address,
         now - sleeping.resident, 0, b.tag);
  } else if (now < sleeping.resident) {
    emit(EventKind::kWakeResident, b.range->pool, b.range->owner->stream, b.address,
         sleeping.resident - now, 0, b.tag);
  }
  sleeping.resident = now;
}

// Every sleeping block's resident figure, of sleeping_tags_ and `extra`, but for tags in `skip`.
inline void CachingAllocator::Impl::refresh_all_resident(std::map<TagId, SleepingTag>* extra,
                                                         std::span<const TagId> skip) {
  for (auto* tags : {&sleeping_tags_, extra}) {
    if (tags == nullptr) continue;
    for (auto& [tag, state] : *tags) {
      if (std::find(skip.begin(), skip.end(), tag) != skip.end()) continue;
      for (SleepingBlock& s : state.blocks) refresh_resident(s);
    }
  }
}

// Unmaps every mapped chunk under `blocks` (all asleep) whose pages nothing else needs (see the
// file comment), then gives all unmapped physical memory back to the device. Returns the bytes
// unmapped. Throws on a driver failure, leaving the books consistent with what was done.
inline std::size_t CachingAllocator::Impl::release_sleeping_pages(
    const std::vector<SleepingBlock*>& blocks) {
  enum : std::uint8_t { kSleeping = 1, kNeeded = 2 };
  std::vector<AddressRange*> spans;
  for (const SleepingBlock* s : blocks) {
    if (std::find(spans.begin(), spans.end(), s->block->range) == spans.end()) {
      spans.push_back(s->block->range);
    }
  }
  std::size_t unmapped = 0;
  for (AddressRange* span : spans) {
    // One pass over the span's blocks classifies every page they touch.
    std::vector<std::uint8_t> pages(span->page_use.size(), 0);
    auto touch = [&](std::size_t first, std::size_t last, const Block& b) {
      // An awake block's page, or free bytes on a page in use, is needed.
      const std::uint8_t flag = b.state == BlockState::kSleeping ? kSleeping : kNeeded;
      for (std::size_t i = first; i <= last && i < pages.size(); ++i) pages[i] |= flag;
    };
    for (const Block* b = span->first; b != nullptr; b = b->next) {
      const std::size_t first = page_of(*span, b->address);
      const std::size_t last = page_of(*span, b->end() - 1);
      if (b->state != BlockState::kFree) {
        touch(first, last, *b);
        continue;
      }
      // A free block needs only the pages it shares with others.
      const auto [whole_first, whole_last] = whole_pages(*span, b->address, b->end());
      if (first < whole_first) touch(first, first, *b);
      if (whole_last <= last) touch(std::max(whole_last, first), last, *b);
    }
    std::vector<std::size_t> heads;
    for (const SleepingBlock* s : blocks) {
      const Block& b = *s->block;
      if (b.range != span) continue;
      span->for_each_mapped(page_of(*span, b.address), page_of(*span, b.end() - 1) + 1,
                            [&](std::size_t page) {
                              heads.push_back(span->page_mapping[page].head);
                            });
    }
    std::sort(heads.begin(), heads.end());
    heads.erase(std::unique(heads.begin(), heads.end()), heads.end());
    for (std::size_t head : heads) {
      const std::size_t count = span->chunk_pages(head);
      std::size_t whole_free = 0;
      bool releasable = true;
      for (std::size_t i = head; i < head + count; ++i) {
        if (i >= pages.size() || (pages[i] & kNeeded) != 0) releasable = false;
        if (releasable && pages[i] == 0) ++whole_free;  // counted as a free mapped page
      }
      if (!releasable) continue;
      unmapped += unmap_chunk(*span, head, /*was_free=*/false) * page_bytes_;
      span->owner->free_mapped_pages[pool_index(span->pool)] -= whole_free;
    }
  }
  trim_free_physical(0);
  return unmapped;
}

inline SleepResult CachingAllocator::Impl::sleep(std::span<const TagId> tags,
                                                 std::span<const TagId> offload) {
  std::lock_guard lock(mutex_);
  auto refuse = [&](const std::string& why) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot sleep " + tags_text(tags) + ": " + why + "; nothing was changed");
  };
  if (tags.empty()) refuse("no tag named");
  for (std::size_t i = 0; i < tags.size(); ++i) {
    if (tags[i] == kUntagged) refuse("untagged memory cannot sleep (allocate under a tag)");
    if (sleeping_tags_.contains(tags[i])) refuse(tag_text(tags[i]) + " is already asleep");
    if (std::find(tags.begin(), tags.begin() + static_cast<std::ptrdiff_t>(i), tags[i]) !=
        tags.begin() + static_cast<std::ptrdiff_t>(i)) {
      refuse(tag_text(tags[i]) + " is named twice");
    }
  }
  for (TagId tag : offload) {
    if (std::find(tags.begin(), tags.end(), tag) == tags.end()) {
      refuse(tag_text(tag) + " is to be offloaded but is not among the tags to sleep");
    }
  }
  if (!paged_) {
    throw Error(ErrorCode::kNotSupported,
                "sleep needs the paged heap over virtual memory (backend '" +
                    backend_.info().name + "' without it cannot give part of a segment back)");
  }
  if (backend_.capture_underway()) {
    refuse("a CUDA graph capture is underway (sleep after the capture has ended)");
  }
  // Every kernel queued so far may touch the blocks: they must be done before pages go.
  throw_if_error(wait_for_device(), "waiting for the device before sleeping");
  if (!pending_.empty()) process_completed_frees_locked();
  const std::vector<Block*> blocks = blocks_to_sleep(tags);

  // Offload first: until the copies are done, nothing has changed.
  std::map<TagId, SleepingTag> asleep;
  for (TagId tag : tags) asleep[tag];
  for (Block* b : blocks) asleep[b->tag].blocks.push_back(SleepingBlock{b});
  SleepResult result;
  auto give_back_host = [&] {
    for (auto& [tag, state] : asleep) {
      if (state.host.data != nullptr) spare_host_.push_back(state.host);
      state.host = HostBuffer{};
    }
  };
  try {
    for (TagId tag : offload) result.offloaded_bytes += copy_out_to_host(asleep[tag]);
    throw_if_error(wait_for_device(), "waiting for the offload copies");
  } catch (...) {
    give_back_host();
    throw;
  }

  // The blocks sleep: out of allocated and active, into sleeping.
  std::vector<SleepingBlock*> sleeping;
  for (auto& [tag, state] : asleep) {
    for (SleepingBlock& s : state.blocks) {
      Block& b = *s.block;
      b.state = BlockState::kSleeping;
      sub_active(*b.range->owner, b.size);
      s.resident = b.size;  // all of it is on mapped pages until they are released
      emit(EventKind::kSleep, b.range->pool, b.range->owner->stream, b.address, b.size,
           b.requested, b.tag);
      emit(EventKind::kSleepResident, b.range->pool, b.range->owner->stream, b.address, b.size,
           0, b.tag);
      sleeping.push_back(&s);
      result.blocks++;
      result.bytes += b.size;
    }
  }
  std::string failure;
  try {
    result.released_bytes = release_sleeping_pages(sleeping);
  } catch (const std::exception& error) {
    failure = error.what();
  }
  refresh_all_resident(&asleep, {});
  for (SleepingBlock* s : sleeping) result.resident_bytes += s->resident;
  sleeping_tags_.merge(asleep);
  if (!failure.empty()) {
    throw Error(ErrorCode::kDriverError,
                tags_text(tags) + " are asleep and nothing is lost, but not all of their memory "
                "could be given back (" + failure + "); wake() them to use them again");
  }
  return result;
}

// Maps the pages under every block (throws OutOfMemoryError from acquire_physical; pages mapped
// on the way stay mapped, which the caller undoes).
inline void CachingAllocator::Impl::map_sleeping_blocks(const std::vector<SleepingBlock*>& blocks) {
  for (SleepingBlock* s : blocks) {
    Block& b = *s->block;
    map_pages_for(*b.range, b.address, b.size);
  }
}

inline SleepResult CachingAllocator::Impl::wake(std::span<const TagId> requested) {
  std::lock_guard lock(mutex_);
  std::vector<TagId> tags(requested.begin(), requested.end());
  if (tags.empty()) {
    for (const auto& [tag, state] : sleeping_tags_) tags.push_back(tag);
  }
  std::sort(tags.begin(), tags.end());
  tags.erase(std::unique(tags.begin(), tags.end()), tags.end());
  for (TagId tag : tags) {
    if (!sleeping_tags_.contains(tag)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "cannot wake " + tag_text(tag) +
                      ": it is not asleep (never put to sleep, or woken already); nothing was "
                      "changed");
    }
  }
  if (backend_.capture_underway()) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot wake " + tags_text(tags) +
                    " while a CUDA graph capture is underway; nothing was changed");
  }
  std::vector<SleepingBlock*> blocks;
  std::size_t missing = 0;
  for (TagId tag : tags) {
    for (SleepingBlock& s : sleeping_tags_.at(tag).blocks) {
      blocks.push_back(&s);
      missing += s.block->size - s.resident;
    }
  }
  SleepResult result;
  // A wake maps whole blocks at once, many GiB for a KV cache, and each chunk costs a create, a
  // map and an access call: chunks up to kWakeChunkBytes (instead of map_chunk_mb) cut those
  // calls for large blocks; a chunk lies under one block's pages, so it pins nothing extra.
  constexpr std::size_t kWakeChunkBytes = std::size_t{256} << 20;
  struct ChunkLimit {
    std::size_t& pages;
    std::size_t saved;
    ~ChunkLimit() { pages = saved; }
  } limit{max_chunk_pages_, max_chunk_pages_};
  max_chunk_pages_ = std::max(max_chunk_pages_, kWakeChunkBytes / page_bytes_);
  // Any failure: what this call mapped goes back, the tags stay asleep with their host copies.
  auto undo = [&](const std::exception& error) {
    std::string undo_failure;
    try {
      release_sleeping_pages(blocks);
    } catch (const std::exception& again) {
      undo_failure = std::string("; giving back what was mapped failed too: ") + again.what();
    }
    refresh_all_resident(nullptr, {});
    const std::string text = "cannot wake " + tags_text(tags) + " (" +
                             format_bytes_exact(missing) + " to map): " + error.what() +
                             undo_failure +
                             ". Nothing is lost: the tags stay asleep with their offloaded "
                             "copies; wake() again once memory is free";
    if (dynamic_cast<const OutOfMemoryError*>(&error) != nullptr) throw OutOfMemoryError(text);
    throw Error(ErrorCode::kDriverError, text);
  };
  try {
    try {
      map_sleeping_blocks(blocks);
    } catch (const OutOfMemoryError&) {
      // As an allocation does: the cache goes back to the device, then one more attempt.
      release_cached_locked();
      map_sleeping_blocks(blocks);
    }
    for (TagId tag : tags) result.offloaded_bytes += copy_back_offloaded(sleeping_tags_.at(tag));
    throw_if_error(wait_for_device(), "waiting for the restoring copies");
  } catch (const std::exception& error) {
    undo(error);
  }
  result.mapped_bytes = missing;
  refresh_all_resident(nullptr, tags);  // other tags' bytes on pages this wake mapped
  for (SleepingBlock* s : blocks) {
    Block& b = *s->block;
    emit(EventKind::kWakeResident, b.range->pool, b.range->owner->stream, b.address, s->resident,
         0, b.tag);
    b.state = BlockState::kAllocated;
    add_active_locked(*b.range->owner, b.size);
    emit(EventKind::kWake, b.range->pool, b.range->owner->stream, b.address, b.size, b.requested,
         b.tag);
    result.blocks++;
    result.bytes += b.size;
  }
  for (TagId tag : tags) {
    auto node = sleeping_tags_.extract(tag);
    if (node.mapped().host.data != nullptr) spare_host_.push_back(node.mapped().host);
  }
  return result;
}

}  // namespace vramledger
