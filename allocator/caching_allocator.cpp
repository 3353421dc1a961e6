// The policy's front door: requests (allocate, allocate_at), the out-of-memory retry, and the
// public facade of CachingAllocator. The tiers a request walks live in allocator/detail/, their
// shared state in detail/policy_state.hpp; docs/design.md describes the walk.
#include "allocator/caching_allocator.hpp"

#include <bit>
#include <mutex>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

inline CachingAllocator::Impl::Impl(DeviceBackend& backend, AllocatorObserver* observer,
                                    AllocatorOptions options)
    : backend_(backend), observer_(observer), options_(options), cap_(options.cap_bytes) {
  front_enabled_ = options_.front_cache_bytes != 0 &&
                   (observer_ == nullptr || observer_->has_shards());
  front_max_block_ = options_.front_cache_bytes / 4;
  front_id_ = next_front_id();
  // Own-stream operations under their stream's lock (detail/stream_fast_path.cpp), a front
  // cache's misses included.
  stream_path_possible_ = true;
  unmap_in_background_ = options_.unmap_in_background && backend_.info().allows_second_mapping;
  if (options_.round_bytes == 0 || (options_.round_bytes & (options_.round_bytes - 1)) != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "round_bytes must be a power of two, got " + std::to_string(options_.round_bytes));
  }
  const BackendInfo& info = backend_.info();
  paged_ = options_.use_paged_heap && info.supports_virtual_memory;
  if (options_.small_size_limit == 0) {
    options_.small_size_limit = paged_ ? std::size_t{64} << 10 : std::size_t{1} << 20;
  }
  if (paged_) {
    const std::size_t granularity = std::max<std::size_t>(info.granularity, 1);
    page_bytes_ = options_.page_bytes == 0 ? granularity : options_.page_bytes;
    if (page_bytes_ % granularity != 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "page size " + format_bytes_exact(page_bytes_) +
                      " is not a multiple of the device granularity " +
                      format_bytes_exact(granularity));
    }
    if (std::has_single_bit(page_bytes_)) {
      page_shift_ = static_cast<unsigned>(std::countr_zero(page_bytes_));
    }
    std::size_t large_span = options_.span_bytes;
    if (large_span == 0) {
      large_span = info.total_bytes != 0 ? info.total_bytes : (std::size_t{1} << 40);
    }
    span_bytes_[pool_index(PoolKind::kLarge)] = round_up(large_span, page_bytes_);
    max_chunk_pages_ = std::max<std::size_t>(1, options_.map_chunk_bytes / page_bytes_);
    span_bytes_[pool_index(PoolKind::kSmall)] =
        round_up(std::max(page_bytes_, large_span / 8), page_bytes_);
    // Each stream's blocks lie in spans of its own, the smaller ones span_bytes_[small] long:
    // regions no longer than that hold, mostly, one stream's blocks (ShardedBlockMap).
    const std::size_t small_span = span_bytes_[pool_index(PoolKind::kSmall)];
    live_.shard_by_region(static_cast<unsigned>(std::bit_width(small_span) - 1));
  } else {
    // Segment heap: a segment is one stream's, and segments are at least small_segment_bytes
    // (2 MiB), sized and (cudaMalloc) aligned in whole 2 MiB: regions that long hold one
    // segment's blocks. Spread by block, every operation of every thread locked one of the
    // same 16 shards (the mixed ring on two threads of the VM, own streams: 168-180 ns a pair
    // -> 109-115; bench/results/2026-12-05-session-28-cpu.md).
    live_.shard_by_region(static_cast<unsigned>(std::bit_width(options_.small_segment_bytes) - 1));
  }
}

inline DevicePtr CachingAllocator::Impl::allocate(std::size_t bytes, StreamHandle stream, TagId tag,
                                                  std::size_t block_bytes) {
  return allocate_from_heaps(bytes, request_size(bytes, block_bytes), stream, tag);
}

// The heaps serve a request: under its stream's lock when the per-stream fast path can, else
// under the allocator's. A front cache's miss (detail/front_cache.cpp) names its cache: with
// `adopt` the block is managed by it from now on; with `return_parked` its parked blocks go back
// to their heaps first (the allocator's lock then).
inline DevicePtr CachingAllocator::Impl::allocate_from_heaps(std::size_t bytes, std::size_t size,
                                                             StreamHandle stream, TagId tag,
                                                             ThreadCache* cache, bool adopt,
                                                             bool return_parked) {
  const PoolKind pool = pool_for(size);
  const bool stream_path = stream_path_.load(std::memory_order_acquire);
  if (stream_path && !return_parked) {
    if (const DevicePtr ptr =
            stream_allocate(bytes, size, pool, stream, tag, adopt ? cache : nullptr)) {
      return ptr;
    }
  }
  const bool waited = !mutex_.try_lock();
  if (waited) mutex_.lock();
  std::lock_guard lock(mutex_, std::adopt_lock);
  if (waited) note_allocator_lock_waited();  // detail/stream_lanes.cpp
  locked_allocations_ += stream_path ? 1 : 0;
  if (return_parked) [[unlikely]] return_parked_locked(*cache);
  Block* block = allocate_block_locked(bytes, size, pool, stream, tag);
  if (adopt && block->size <= front_max_block_) adopt_front_block(*cache, block, bytes, stream);
  return block->address;
}

// The block size a request gets; throws for 0 and impossible sizes. The throws are out of line:
// their messages' strings gave this function a frame of its own, a call and ~30 instructions on
// every allocation (callgrind, front-cache pair).
inline std::size_t CachingAllocator::Impl::request_size(std::size_t bytes,
                                                        std::size_t block_bytes) const {
  if (bytes == 0 || bytes > kMaxRequestBytes) [[unlikely]] refuse_request(bytes);
  return round_up(block_bytes > bytes && block_bytes <= kMaxRequestBytes ? block_bytes : bytes,
                  options_.round_bytes);
}

void CachingAllocator::Impl::refuse_request(std::size_t bytes) {
  if (bytes == 0) {
    throw Error(ErrorCode::kInvalidArgument, "cannot allocate 0 bytes");
  }
  throw Error(ErrorCode::kInvalidArgument,
              "request of " + format_bytes_exact(bytes) + " exceeds the largest supported size " +
                  format_bytes_exact(kMaxRequestBytes));
}

// A block from the heaps, handed out and announced; once more after releasing the cache.
inline Block* CachingAllocator::Impl::allocate_block_locked(std::size_t bytes, std::size_t size,
                                                            PoolKind pool, StreamHandle stream,
                                                            TagId tag) {
  refuse_if_asleep(tag, 0, "allocate");  // detail/sleep.cpp
  if (!pending_.empty()) process_completed_frees_locked();
  StreamHeaps& heaps = heaps_for_thread(stream);  // its lane (detail/stream_lanes.cpp)
  Block* block = nullptr;
  try {
    block = allocate_once(heaps, pool, size);
  } catch (const OutOfMemoryError&) {
    emit(EventKind::kAllocRetry, pool, stream, 0, size, bytes, tag);
    release_cached_locked();
    try {
      block = allocate_once(heaps, pool, size);
    } catch (const OutOfMemoryError& error) {
      // The failed attempt may have gathered physical pages (kept spare for the next request):
      // they go back too, so after an OOM the process holds its live blocks only and other
      // pools under the same cap can use the memory (the plugin's self-test found 96 MiB held).
      release_cached_locked();
      emit(EventKind::kOutOfMemory, pool, stream, 0, size, bytes, tag);
      throw OutOfMemoryError(describe_oom(bytes, stream, error.what()));
    }
  }
  hand_out(block, bytes, stream, tag);
  return block;
}

inline DevicePtr CachingAllocator::Impl::allocate_at(DevicePtr address, std::size_t bytes,
                                                     StreamHandle stream, TagId tag) {
  if (bytes == 0 || bytes > kMaxRequestBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "allocate_at: cannot allocate " + format_bytes_exact(bytes));
  }
  const std::size_t size = round_up(bytes, options_.round_bytes);
  const PoolKind pool = pool_for(size);
  std::lock_guard lock(mutex_);
  refuse_if_asleep(tag, address, "allocate_at");  // detail/sleep.cpp
  if (!pending_.empty()) process_completed_frees_locked();
  StreamHeaps& heaps = heaps_holding(stream, pool, address);
  Block* block = free_block_holding(heaps, pool, address, size);
  FreeBlockIndex& index = heaps.free[pool_index(pool)];
  if (block->range->is_span) back_with_pages(*block, address, size);  // throws, nothing changed
  index.remove(block);
  set_inactive_split(block, false);
  if (block->address < address) {
    Block* front = block;
    block = split_front(front, address - front->address);
    index.insert(front);
    refresh_inactive_split(front);
  }
  if (block->size > size) {
    Block* rest = split_front(block, size);
    index.insert(rest);
    refresh_inactive_split(rest);
  }
  if (block->range->is_span) mark_pages(*block, +1);
  return hand_out(block, bytes, stream, tag);
}

// Makes a block just taken from the free lists the user's, and announces it.
inline DevicePtr CachingAllocator::Impl::hand_out(Block* block, std::size_t bytes,
                                                  StreamHandle stream, TagId tag,
                                                  SplitDelta& split) {
  block->requested = bytes;
  block->tag = tag;
  block->state = BlockState::kAllocated;
  block->range->active_blocks++;
  block->range->owner->allocations++;
  add_active(*block->range->owner, block->size);  // its room holds it (detail/active_bytes.cpp)
  live_.insert(block->address, block);
  split.home = block->range->owner->ledger_shard;
  emit_with(split, EventKind::kAlloc, block->range->pool, stream, block->address, block->size,
            bytes, tag);
  return block->address;
}

// The free block of `heaps` holding [address, address + size), or an error saying why none.
inline Block* CachingAllocator::Impl::free_block_holding(StreamHeaps& heaps, PoolKind pool,
                                                         DevicePtr address, std::size_t size) {
  auto refuse = [&](const std::string& why) -> Block* {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot place " + format_bytes_exact(size) + " at " + format_hex(address) +
                    " on stream " + format_hex(heaps.stream) + ": " + why);
  };
  for (AddressRange* range : heaps.ranges[pool_index(pool)]) {
    if (address < range->base || address >= range->end()) continue;
    if (size > range->end() - address) return refuse("the bytes run past the end of its range");
    for (Block* b = range->first; b != nullptr; b = b->next) {
      if (address >= b->end()) continue;
      if (b->state != BlockState::kFree) {
        return refuse(std::string("the bytes are ") +
                      (b->state == BlockState::kAllocated   ? "allocated"
                       : b->state == BlockState::kSleeping ? "asleep"
                                                           : "awaiting a free") +
                      " (block at " + format_hex(b->address) + ")");
      }
      if (address + size > b->end()) {
        return refuse("only " + format_bytes_exact(b->end() - address) + " are free there");
      }
      return b;
    }
  }
  return refuse("no range of this allocator's " +
                std::string(pool == PoolKind::kSmall ? "small" : "large") +
                " pool on that stream holds the address");
}

inline void CachingAllocator::Impl::set_cap(std::size_t cap) {
  std::lock_guard lock(mutex_);
  cap_ = cap;
}

inline void CachingAllocator::Impl::set_no_split(bool no_split) {
  std::lock_guard lock(mutex_);
  options_.no_split = no_split;
}

inline std::size_t CachingAllocator::Impl::cap() const {
  std::lock_guard lock(mutex_);
  return cap_;
}

inline bool CachingAllocator::Impl::owns(DevicePtr ptr) const {
  std::lock_guard lock(mutex_);
  const Block* block = live_.find(ptr);
  return block != nullptr && block->state == BlockState::kAllocated;
}

inline StreamHeaps& CachingAllocator::Impl::heaps_for(StreamHandle stream, std::uint32_t lane) {
  if (last_stream_ != nullptr && last_stream_->stream == stream && last_stream_->lane == lane) {
    return *last_stream_;
  }
  for (auto& heaps : streams_) {
    if (heaps->stream == stream && heaps->lane == lane) {
      last_stream_ = heaps.get();
      return *heaps;
    }
  }
  streams_.push_back(std::make_unique<StreamHeaps>());
  streams_.back()->stream = stream;
  streams_.back()->lane = lane;
  last_stream_ = streams_.back().get();
  // Locked now as the rest of the allocator's lock is; open to the fast path once it is released.
  if (stream_path_.load(std::memory_order_relaxed)) {
    publish_stream_locked(*last_stream_);
  } else if (stream_path_possible_ && streams_.size() >= 2) {
    start_stream_path_locked();
  }
  return *last_stream_;
}

// The lane of `stream` whose `pool` ranges hold `address` (allocate_at), else lane 0's heaps.
inline StreamHeaps& CachingAllocator::Impl::heaps_holding(StreamHandle stream, PoolKind pool,
                                                          DevicePtr address) {
  for (auto& heaps : streams_) {
    if (heaps->stream != stream) continue;
    for (const AddressRange* range : heaps->ranges[pool_index(pool)]) {
      if (address >= range->base && address < range->end()) return *heaps;
    }
  }
  return heaps_for(stream, 0);
}

// One attempt; throws OutOfMemoryError with nothing changed when memory is short.
inline Block* CachingAllocator::Impl::allocate_once(StreamHeaps& heaps, PoolKind pool,
                                                    std::size_t size) {
  return paged_ ? allocate_paged(heaps, pool, size) : allocate_from_segments(heaps, pool, size);
}

inline std::string CachingAllocator::Impl::describe_oom(std::size_t bytes, StreamHandle stream,
                                                        const char* cause) const {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  const bool known = backend_.memory_info(&free_bytes, &total_bytes).is_ok();
  // Error adds "out of memory: " in front (errors.hpp).
  std::string text = "tried to allocate " + format_bytes_exact(bytes) +
                     " on device " + std::to_string(backend_.info().device) + " (stream " +
                     format_hex(stream) + ", backend " + backend_.info().name + "). ";
  text += "vramledger holds " + format_bytes_exact(reserved_bytes_) + " reserved";
  if (cap_ != 0) text += " under a cap of " + format_bytes_exact(cap_);
  if (known) {
    text += "; the device has " + format_bytes_exact(free_bytes) + " free of " +
            format_bytes_exact(total_bytes);
  }
  text += ". Cause: ";
  text += cause;
  if (observer_ != nullptr) {
    const std::string account = observer_->describe();
    if (!account.empty()) text += "\n" + account;
  }
  return text;
}

// -------------------------------------------------------------------- public facade

CachingAllocator::CachingAllocator(DeviceBackend& backend, AllocatorObserver* observer,
                                   AllocatorOptions options)
    : impl_(std::make_unique<Impl>(backend, observer, options)), observer_(observer) {
  // Front caches: detail/front_cache.cpp. Each entry point below that a parked or front-held
  // block changes goes through it first.
  if (observer_ != nullptr) observer_->attach_allocator();
}
CachingAllocator::~CachingAllocator() {
  impl_.reset();  // returns the cache, still reporting to the observer
  if (observer_ != nullptr) observer_->detach_allocator();
}

DevicePtr CachingAllocator::allocate(std::size_t bytes, StreamHandle stream, TagId tag,
                                     std::size_t block_bytes) {
  return impl_->front_allocate(bytes, stream, tag, block_bytes);
}
DevicePtr CachingAllocator::allocate_at(DevicePtr address, std::size_t bytes, StreamHandle stream,
                                        TagId tag) {
  impl_->flush_front_caches();  // parked blocks may hold the bytes
  return impl_->allocate_at(address, bytes, stream, tag);
}
void CachingAllocator::deallocate(DevicePtr ptr) { impl_->front_deallocate(ptr); }
void CachingAllocator::deallocate_as_ordered(DevicePtr ptr) {
  impl_->front_detach(ptr);
  impl_->deallocate_as_ordered(ptr);
}
void CachingAllocator::record_stream(DevicePtr ptr, StreamHandle stream) {
  impl_->front_detach(ptr);  // a block used on other streams never goes back to a front cache
  impl_->record_stream(ptr, stream);
}
void CachingAllocator::empty_cache() { impl_->empty_cache(); }
void CachingAllocator::process_completed_frees() { impl_->process_completed_frees(); }
void CachingAllocator::finish_background_unmaps() { impl_->finish_background_unmaps(); }
void CachingAllocator::set_cap(std::size_t cap_bytes) { impl_->set_cap(cap_bytes); }
void CachingAllocator::set_no_split(bool no_split) { impl_->set_no_split(no_split); }
std::size_t CachingAllocator::cap() const { return impl_->cap(); }
bool CachingAllocator::owns(DevicePtr ptr) const {
  bool owned = false;
  return impl_->front_owns(ptr, &owned) ? owned : impl_->owns(ptr);
}
AllocationInfo CachingAllocator::describe(DevicePtr ptr) const {
  AllocationInfo info;
  return impl_->front_describe(ptr, &info) ? info : impl_->describe(ptr);
}
std::vector<PhysicalPiece> CachingAllocator::physical_pieces(DevicePtr ptr) const {
  return impl_->physical_pieces(ptr);  // a block a front cache manages is allocated in its heap
}
std::vector<SegmentInfo> CachingAllocator::segments() const { return impl_->segments(); }
BlockCensus CachingAllocator::census() const { return impl_->census(); }
PolicyFigures CachingAllocator::policy_figures() const { return impl_->policy_figures(); }
const AllocatorOptions& CachingAllocator::options() const { return impl_->options(); }
DeviceBackend& CachingAllocator::backend() const { return impl_->backend(); }
void CachingAllocator::release_stream(StreamHandle stream) { impl_->release_stream(stream); }
SleepResult CachingAllocator::sleep(std::span<const TagId> tags, std::span<const TagId> offload) {
  return impl_->sleep(tags, offload);  // tagged blocks never sit in a front cache
}
SleepResult CachingAllocator::wake(std::span<const TagId> tags) { return impl_->wake(tags); }
std::vector<TagId> CachingAllocator::sleeping_tags() const { return impl_->sleeping_tags(); }
bool CachingAllocator::is_asleep(DevicePtr ptr) const { return impl_->is_asleep(ptr); }
void CachingAllocator::release_sleep_host_memory() { impl_->release_sleep_host_memory(); }
std::size_t CachingAllocator::prepare_offload(std::span<const TagId> tags) {
  return impl_->prepare_offload(tags);
}
std::size_t CachingAllocator::kept_sleep_host_bytes() const {
  return impl_->kept_sleep_host_bytes();
}
SleepResult CachingAllocator::sleep_pool(bool offload) { return impl_->sleep_pool(offload); }
SleepResult CachingAllocator::wake_pool() { return impl_->wake_pool(); }
bool CachingAllocator::pool_asleep() const { return impl_->pool_asleep(); }

}  // namespace vramledger
