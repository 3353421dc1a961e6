#include "allocator/caching_allocator.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <deque>
#include <limits>
#include <map>
#include <optional>
#include <mutex>
#include <utility>

#include "allocator/detail/address_range.hpp"
#include "allocator/detail/block.hpp"
#include "allocator/detail/block_address_map.hpp"
#include "allocator/detail/free_block_index.hpp"
#include "allocator/detail/object_pool.hpp"
#include "allocator/spin_mutex.hpp"

namespace vramledger {

namespace {

// Larger requests are certainly mistakes (the largest GPUs hold well under 1 TiB); refusing them
// early also keeps every size computation below far from overflow.
constexpr std::size_t kMaxRequestBytes = std::size_t{1} << 44;  // 16 TiB

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

std::string format_bytes(std::size_t bytes) {
  char text[64];
  const double b = static_cast<double>(bytes);
  if (bytes >= (std::size_t{1} << 30)) {
    std::snprintf(text, sizeof text, "%.2f GiB (%zu bytes)", b / (1u << 30), bytes);
  } else if (bytes >= (std::size_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.2f MiB (%zu bytes)", b / (1u << 20), bytes);
  } else {
    std::snprintf(text, sizeof text, "%zu bytes", bytes);
  }
  return text;
}

std::string format_pointer(DevicePtr ptr) {
  char text[32];
  std::snprintf(text, sizeof text, "0x%" PRIxPTR, ptr);
  return text;
}

constexpr int pool_index(PoolKind pool) { return static_cast<int>(pool); }

}  // namespace

// Free lists, ranges and fences of one stream.
struct StreamHeaps {
  StreamHandle stream = 0;
  FreeBlockIndex free[2];
  std::vector<AddressRange*> ranges[2];
  // Fences prove, without blocking, that work queued on the stream before some free has
  // finished, so the freed pages may be unmapped. A page freed while next_fence == n is idle
  // once fence n has completed.
  std::uint64_t next_fence = 1;
  std::uint64_t completed_fence = 0;
  bool page_freed_since_last_fence = false;
  std::deque<std::pair<EventHandle, std::uint64_t>> outstanding_fences;
  // Old addresses of chunks aliased to a new address of this stream (alias_pending_pages): still
  // mapped until fence `fence` completes, then unmapped.
  struct RetiringMapping {
    AddressRange* span;
    std::size_t head;
    std::size_t pages;
    std::uint64_t fence;
    PhysicalHandle handle;  // now also mapped at the new address
  };
  std::vector<RetiringMapping> retiring;
};

struct PendingEvent {
  Block* block;
  EventHandle event;
};

class CachingAllocator::Impl {
 public:
  Impl(DeviceBackend& backend, AllocatorObserver* observer, AllocatorOptions options)
      : backend_(backend), observer_(observer), options_(options), cap_(options.cap_bytes) {
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
                    "page size " + format_bytes(page_bytes_) +
                        " is not a multiple of the device granularity " +
                        format_bytes(granularity));
      }
      std::size_t large_span = options_.span_bytes;
      if (large_span == 0) {
        large_span = info.total_bytes != 0 ? info.total_bytes : (std::size_t{1} << 40);
      }
      span_bytes_[pool_index(PoolKind::kLarge)] = round_up(large_span, page_bytes_);
      max_chunk_pages_ = std::max<std::size_t>(1, options_.map_chunk_bytes / page_bytes_);
      span_bytes_[pool_index(PoolKind::kSmall)] =
          round_up(std::max(page_bytes_, large_span / 8), page_bytes_);
    }
  }

  ~Impl() { release_everything_at_exit(); }

  // ---------------------------------------------------------------- public operations

  DevicePtr allocate(std::size_t bytes, StreamHandle stream, TagId tag) {
    if (bytes == 0) {
      throw Error(ErrorCode::kInvalidArgument, "cannot allocate 0 bytes");
    }
    if (bytes > kMaxRequestBytes) {
      throw Error(ErrorCode::kInvalidArgument,
                  "request of " + format_bytes(bytes) + " exceeds the largest supported size " +
                      format_bytes(kMaxRequestBytes));
    }
    const std::size_t size = round_up(bytes, options_.round_bytes);
    const PoolKind pool = size <= options_.small_size_limit ? PoolKind::kSmall : PoolKind::kLarge;

    std::lock_guard lock(mutex_);
    if (!pending_.empty()) process_completed_frees_locked();
    StreamHeaps& heaps = heaps_for(stream);
    Block* block = nullptr;
    try {
      block = allocate_once(heaps, pool, size);
    } catch (const OutOfMemoryError&) {
      emit(EventKind::kAllocRetry, pool, stream, 0, size, bytes, tag);
      release_cached_locked();
      try {
        block = allocate_once(heaps, pool, size);
      } catch (const OutOfMemoryError& error) {
        emit(EventKind::kOutOfMemory, pool, stream, 0, size, bytes, tag);
        throw OutOfMemoryError(describe_oom(bytes, stream, error.what()));
      }
    }
    return hand_out(block, bytes, stream, tag);
  }

  DevicePtr allocate_at(DevicePtr address, std::size_t bytes, StreamHandle stream, TagId tag) {
    if (bytes == 0 || bytes > kMaxRequestBytes) {
      throw Error(ErrorCode::kInvalidArgument,
                  "allocate_at: cannot allocate " + format_bytes(bytes));
    }
    const std::size_t size = round_up(bytes, options_.round_bytes);
    const PoolKind pool = size <= options_.small_size_limit ? PoolKind::kSmall : PoolKind::kLarge;
    std::lock_guard lock(mutex_);
    if (!pending_.empty()) process_completed_frees_locked();
    StreamHeaps& heaps = heaps_for(stream);
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
  DevicePtr hand_out(Block* block, std::size_t bytes, StreamHandle stream, TagId tag) {
    block->requested = bytes;
    block->tag = tag;
    block->state = BlockState::kAllocated;
    block->range->active_blocks++;
    live_.insert(block->address, block);
    emit(EventKind::kAlloc, block->range->pool, stream, block->address, block->size, bytes, tag);
    return block->address;
  }

  // The free block of `heaps` holding [address, address + size), or an error saying why none.
  Block* free_block_holding(StreamHeaps& heaps, PoolKind pool, DevicePtr address,
                            std::size_t size) {
    auto refuse = [&](const std::string& why) -> Block* {
      throw Error(ErrorCode::kInvalidArgument,
                  "cannot place " + format_bytes(size) + " at " + format_pointer(address) +
                      " on stream " + format_pointer(heaps.stream) + ": " + why);
    };
    for (AddressRange* range : heaps.ranges[pool_index(pool)]) {
      if (address < range->base || address >= range->end()) continue;
      if (size > range->end() - address) return refuse("the bytes run past the end of its range");
      for (Block* b = range->first; b != nullptr; b = b->next) {
        if (address >= b->end()) continue;
        if (b->state != BlockState::kFree) {
          return refuse(std::string("the bytes are ") +
                        (b->state == BlockState::kAllocated ? "allocated" : "awaiting a free") +
                        " (block at " + format_pointer(b->address) + ")");
        }
        if (address + size > b->end()) {
          return refuse("only " + format_bytes(b->end() - address) + " are free there");
        }
        return b;
      }
    }
    return refuse("no range of this allocator's " +
                  std::string(pool == PoolKind::kSmall ? "small" : "large") +
                  " pool on that stream holds the address");
  }

  void deallocate(DevicePtr ptr) {
    std::lock_guard lock(mutex_);
    Block* block = live_.find(ptr);
    if (block == nullptr) throw_unknown_pointer(ptr, "free");
    if (block->state == BlockState::kPendingFree) {
      throw Error(ErrorCode::kDoubleFree,
                  "pointer " + format_pointer(ptr) +
                      " was already freed (its memory still waits for other streams)");
    }
    if (block->stream_uses.empty()) {
      live_.erase(ptr);
      complete_free(block, EventKind::kFree);
      return;
    }
    // Record an event on every other stream that used the block; all or nothing.
    std::vector<EventHandle> events;
    events.reserve(block->stream_uses.size());
    for (StreamHandle use : block->stream_uses) {
      EventHandle event = 0;
      try {
        event = take_event();
      } catch (...) {
        spare_events_.insert(spare_events_.end(), events.begin(), events.end());
        throw;
      }
      Status status = backend_.record_event(event, use);
      if (!status) {
        spare_events_.push_back(event);
        spare_events_.insert(spare_events_.end(), events.begin(), events.end());
        throw Error(status.code(),
                    "cannot free " + format_pointer(ptr) + ": recording its use on stream " +
                        format_pointer(use) + " failed (" + status.message() +
                        "); the block stays allocated. If that stream was destroyed, call "
                        "release_stream() for it first.");
      }
      events.push_back(event);
    }
    block->state = BlockState::kPendingFree;
    block->pending_events = static_cast<int>(events.size());
    for (EventHandle event : events) pending_.push_back({block, event});
    emit_block(EventKind::kFreeRequested, block);
  }

  void record_stream(DevicePtr ptr, StreamHandle stream) {
    std::lock_guard lock(mutex_);
    Block* block = live_.find(ptr);
    if (block == nullptr) throw_unknown_pointer(ptr, "record_stream on");
    if (block->state != BlockState::kAllocated) {
      throw Error(ErrorCode::kDoubleFree,
                  "record_stream on " + format_pointer(ptr) + ", which was already freed");
    }
    if (stream == block->range->owner->stream) return;
    if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) ==
        block->stream_uses.end()) {
      block->stream_uses.push_back(stream);
    }
  }

  void empty_cache() {
    std::lock_guard lock(mutex_);
    process_completed_frees_locked();
    release_cached_locked();
  }

  void process_completed_frees() {
    std::lock_guard lock(mutex_);
    process_completed_frees_locked();
  }

  void set_cap(std::size_t cap) {
    std::lock_guard lock(mutex_);
    cap_ = cap;
  }
  void set_no_split(bool no_split) {
    std::lock_guard lock(mutex_);
    options_.no_split = no_split;
  }
  std::size_t cap() const {
    std::lock_guard lock(mutex_);
    return cap_;
  }

  bool owns(DevicePtr ptr) const {
    std::lock_guard lock(mutex_);
    const Block* block = live_.find(ptr);
    return block != nullptr && block->state == BlockState::kAllocated;
  }

  AllocationInfo describe(DevicePtr ptr) const {
    std::lock_guard lock(mutex_);
    const Block* block = live_.find(ptr);
    if (block == nullptr) block = block_containing(ptr);
    if (block == nullptr || block->state != BlockState::kAllocated) {
      throw Error(ErrorCode::kInvalidPointer,
                  "pointer " + format_pointer(ptr) + " is not inside a live vramledger allocation");
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

  std::vector<SegmentInfo> segments() const {
    std::lock_guard lock(mutex_);
    std::vector<SegmentInfo> result;
    for (const auto& heaps : streams_) {
      for (int p = 0; p < 2; ++p) {
        for (const AddressRange* range : heaps->ranges[p]) {
          SegmentInfo segment;
          segment.address = range->base;
          segment.size = range->size;
          segment.mapped_bytes = range->is_span ? range->mapped_pages * page_bytes_ : range->size;
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
    return result;
  }

  BlockCensus census() const {
    std::lock_guard lock(mutex_);
    BlockCensus census;
    std::size_t live_seen = 0;
    std::size_t free_mapped[2] = {0, 0};
    for (const auto& heaps : streams_) {
      for (int p = 0; p < 2; ++p) {
        BlockCensus::PerPool& out = census.pools[p];
        for (const AddressRange* range : heaps->ranges[p]) {
          free_mapped[p] += count_range(*range, out, live_seen);
        }
        if (heaps->free[p].count() != count_free_blocks(*heaps, p)) {
          throw Error(ErrorCode::kInternal, "free index count disagrees with the block lists");
        }
      }
    }
    if (live_seen != live_.size()) {
      throw Error(ErrorCode::kInternal, "address map holds " + std::to_string(live_.size()) +
                                            " blocks but ranges hold " +
                                            std::to_string(live_seen) + " active ones");
    }
    for (int p = 0; p < 2; ++p) {
      if (free_mapped[p] != free_mapped_pages_[p]) {
        throw Error(ErrorCode::kInternal, "free mapped page count is stale: counted " +
                                              std::to_string(free_mapped_pages_[p]) + ", found " +
                                              std::to_string(free_mapped[p]));
      }
      const auto held = static_cast<std::int64_t>(free_physical_pages_[p]);
      census.pools[p].reserved_bytes += held * static_cast<std::int64_t>(page_bytes_);
      census.free_physical_pages += held;
    }
    return census;
  }

  const AllocatorOptions& options() const { return options_; }
  DeviceBackend& backend() const { return backend_; }

  void release_stream(StreamHandle stream) {
    std::lock_guard lock(mutex_);
    throw_if_error(backend_.synchronize_device(), "release_stream: synchronizing the device");
    // Uses on the released stream are complete now; forget them.
    live_.for_each([&](Block* block) {
      auto& uses = block->stream_uses;
      uses.erase(std::remove(uses.begin(), uses.end(), stream), uses.end());
    });
    process_completed_frees_locked();
    auto it = std::find_if(streams_.begin(), streams_.end(),
                           [&](const auto& h) { return h->stream == stream; });
    if (it == streams_.end()) return;
    StreamHeaps& heaps = **it;
    mark_all_frees_idle(heaps);
    for (int p = 0; p < 2; ++p) release_idle_ranges(heaps, p, /*free_spans=*/true);
    trim_free_physical(0);
    if (heaps.ranges[0].empty() && heaps.ranges[1].empty()) {
      if (last_stream_ == &heaps) last_stream_ = nullptr;
      streams_.erase(it);
    }
  }

 private:
  // ---------------------------------------------------------------- events

  void emit(EventKind kind, PoolKind pool, StreamHandle stream, DevicePtr address,
            std::size_t size, std::size_t requested = 0, TagId tag = kUntagged) {
    if (kind == EventKind::kAlloc) {
      active_bytes_ += size;
      peak_active_bytes_ = std::max(peak_active_bytes_, active_bytes_);
    } else if (kind == EventKind::kFree || kind == EventKind::kFreeCompleted) {
      active_bytes_ -= size;
    }
    if (observer_ == nullptr) return;
    AllocatorEvent event;
    event.kind = kind;
    event.pool = pool;
    event.tag = tag;
    event.stream = stream;
    event.address = address;
    event.size = size;
    event.requested = requested;
    event.inactive_split_delta = pending_split_count_;
    event.inactive_split_bytes_delta = pending_split_bytes_;
    pending_split_count_ = 0;
    pending_split_bytes_ = 0;
    observer_->on_event(event);
  }

  // Inactive split changes wait for the event of the operation that caused them and travel on
  // it (see AllocatorEvent), so the fast path sends one event per call.
  void note_split_change(int count, std::int64_t bytes) {
    pending_split_count_ += count;
    pending_split_bytes_ += bytes;
  }
  void emit_block(EventKind kind, const Block* block) {
    emit(kind, block->range->pool, block->range->owner->stream, block->address, block->size,
         block->requested, block->tag);
  }

  // ---------------------------------------------------------------- streams

  StreamHeaps& heaps_for(StreamHandle stream) {
    if (last_stream_ != nullptr && last_stream_->stream == stream) return *last_stream_;
    for (auto& heaps : streams_) {
      if (heaps->stream == stream) {
        last_stream_ = heaps.get();
        return *heaps;
      }
    }
    streams_.push_back(std::make_unique<StreamHeaps>());
    streams_.back()->stream = stream;
    last_stream_ = streams_.back().get();
    return *last_stream_;
  }

  EventHandle take_event() {
    if (!spare_events_.empty()) {
      EventHandle event = spare_events_.back();
      spare_events_.pop_back();
      return event;
    }
    EventHandle event = 0;
    throw_if_error(backend_.create_event(&event), "creating an event");
    return event;
  }

  // ---------------------------------------------------------------- allocation

  // One attempt; throws OutOfMemoryError with nothing changed when memory is short.
  Block* allocate_once(StreamHeaps& heaps, PoolKind pool, std::size_t size) {
    return paged_ ? allocate_paged(heaps, pool, size) : allocate_from_segments(heaps, pool, size);
  }

  Block* allocate_from_segments(StreamHeaps& heaps, PoolKind pool, std::size_t size) {
    FreeBlockIndex& index = heaps.free[pool_index(pool)];
    Block* block = index.find(size);
    if (block == nullptr) block = add_segment(heaps, pool, size);
    index.remove(block);
    set_inactive_split(block, false);
    const std::size_t remainder = block->size - size;
    const std::size_t min_remainder =
        pool == PoolKind::kSmall ? options_.round_bytes : options_.small_size_limit + 1;
    if (remainder >= min_remainder && !options_.no_split) {
      Block* rest = split_front(block, size);
      index.insert(rest);
      refresh_inactive_split(rest);
    }
    return block;
  }

  std::size_t segment_size_for(PoolKind pool, std::size_t size) const {
    if (options_.no_split) return round_up(size, options_.round_large_segment_bytes);
    if (pool == PoolKind::kSmall) return std::max(options_.small_segment_bytes, size);
    if (size < options_.large_segment_bytes / 2) return options_.large_segment_bytes;
    return round_up(size, options_.round_large_segment_bytes);
  }

  Block* add_segment(StreamHeaps& heaps, PoolKind pool, std::size_t size) {
    const std::size_t bytes = segment_size_for(pool, size);
    ensure_within_cap(bytes);
    DevicePtr base = 0;
    throw_if_error(backend_.allocate_segment(bytes, heaps.stream, &base),
                   "allocating a " + format_bytes(bytes) + " segment");
    reserved_bytes_ += bytes;
    emit(EventKind::kSegmentCreate, pool, heaps.stream, base, bytes);
    return add_range(heaps, pool, base, bytes, /*is_span=*/false);
  }

  Block* add_range(StreamHeaps& heaps, PoolKind pool, DevicePtr base, std::size_t bytes,
                   bool is_span) {
    auto* range = new AddressRange;
    range->base = base;
    range->size = bytes;
    range->owner = &heaps;
    range->pool = pool;
    range->is_span = is_span;
    Block* block = block_pool_.create();
    block->address = base;
    block->size = bytes;
    block->range = range;
    range->first = block;
    heaps.ranges[pool_index(pool)].push_back(range);
    heaps.free[pool_index(pool)].insert(block);
    return block;
  }

  // Splits `block` into [address, address + size) (kept in `block`) and the rest (returned).
  Block* split_front(Block* block, std::size_t size) {
    Block* rest = block_pool_.create();
    rest->address = block->address + size;
    rest->size = block->size - size;
    rest->range = block->range;
    // A free remainder is as busy as the block was: work queued before its free may still use it.
    rest->freed_at_fence = block->freed_at_fence;
    rest->prev = block;
    rest->next = block->next;
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    return rest;
  }

  void ensure_within_cap(std::size_t more) const {
    if (cap_ != 0 && reserved_bytes_ + more > cap_) {
      throw OutOfMemoryError("the cap of " + format_bytes(cap_) + " would be exceeded: " +
                             format_bytes(reserved_bytes_) + " reserved, " + format_bytes(more) +
                             " more needed");
    }
  }

  // ---------------------------------------------------------------- paged heap

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

  std::size_t page_of(const AddressRange& span, DevicePtr address) const {
    return (address - span.base) / page_bytes_;
  }
  // Pages lying entirely inside [address, end): [first, last).
  std::pair<std::size_t, std::size_t> whole_pages(const AddressRange& span, DevicePtr address,
                                                  DevicePtr end) const {
    const std::size_t first = (address - span.base + page_bytes_ - 1) / page_bytes_;
    const std::size_t last = (end - span.base) / page_bytes_;
    return {first, std::max(first, last)};
  }
  // Calls visit(page) for every mapped page in [first, last).
  template <typename Visit>
  static void for_each_mapped(const AddressRange& span, std::size_t first, std::size_t last,
                              Visit&& visit) {
    last = std::min(last, span.mapped_bits.size() * 64);
    for (std::size_t word = first / 64; word * 64 < last; ++word) {
      std::uint64_t bits = span.mapped_bits[word];
      while (bits != 0) {
        const std::size_t page = word * 64 + static_cast<std::size_t>(std::countr_zero(bits));
        bits &= bits - 1;
        if (page >= first && page < last) visit(page);
      }
    }
  }

  Block* allocate_paged(StreamHeaps& heaps, PoolKind pool, std::size_t size) {
    FreeBlockIndex& index = heaps.free[pool_index(pool)];
    Block* block = index.find(size);
    if (block == nullptr) {
      block = add_span(heaps, pool, size);
    } else if (pages_to_map(*block->range, block->address, size) > 0) {
      block = fit_needing_fewest_new_pages(index, size, block);
    }
    back_with_pages(*block, block->address, size);  // throws with nothing changed
    index.remove(block);
    if (block->size > size) index.insert(split_front(block, size));
    mark_pages(*block, +1);
    return block;
  }

  // Maps every page under [address, address + size), which lies in the free block `block`, and
  // takes the block's free mapped pages that the allocation uses out of the free count. Throws
  // with nothing changed.
  void back_with_pages(const Block& block, DevicePtr address, std::size_t size) {
    AddressRange& span = *block.range;
    const auto [whole_first, whole_last] = whole_pages(span, block.address, block.end());
    const std::size_t lo = std::max(page_of(span, address), whole_first);
    const std::size_t hi = std::min(page_of(span, address + size - 1) + 1, whole_last);
    const std::size_t reused = hi > lo ? span.count_mapped(lo, hi) : 0;
    map_pages_for(span, address, size);
    free_mapped_pages_[pool_index(span.pool)] -= reused;
  }

  // The best fit by size needs new pages, which costs driver calls and, when no page is free
  // anywhere, memory: look at a few other fits for one that needs fewer.
  Block* fit_needing_fewest_new_pages(const FreeBlockIndex& index, std::size_t size,
                                      Block* best_fit) const {
    constexpr int kCandidates = 8;
    Block* best = best_fit;
    std::size_t best_pages = pages_to_map(*best_fit->range, best_fit->address, size);
    index.for_each_fit(size, kCandidates, [&](Block* candidate) {
      if (best_pages == 0) return;
      const std::size_t pages = pages_to_map(*candidate->range, candidate->address, size);
      if (pages < best_pages) {
        best = candidate;
        best_pages = pages;
      }
    });
    return best;
  }

  std::size_t pages_to_map(const AddressRange& span, DevicePtr address, std::size_t size) const {
    const std::size_t first = page_of(span, address);
    const std::size_t last = page_of(span, address + size - 1);
    return last - first + 1 - span.count_mapped(first, last + 1);
  }

  Block* add_span(StreamHeaps& heaps, PoolKind pool, std::size_t size) {
    const std::size_t bytes = std::max(span_bytes_[pool_index(pool)], round_up(size, page_bytes_));
    DevicePtr base = 0;
    throw_if_error(backend_.reserve_address_range(bytes, &base),
                   "reserving " + format_bytes(bytes) + " of address space");
    emit(EventKind::kVirtualReserve, pool, heaps.stream, base, bytes);
    return add_range(heaps, pool, base, bytes, /*is_span=*/true);
  }

  // Maps every page under [address, address + size). Each run of unmapped pages is filled with
  // as few physical chunks as the free physical pool and max_chunk_pages_ allow; a first or last
  // page the allocation only partly covers gets a chunk of its own, since a neighbour may come
  // to share it and would otherwise pin the allocation's whole chunk after it is freed. On
  // failure nothing is mapped that was not before; physical memory obtained on the way stays in
  // the free physical pool.
  void map_pages_for(AddressRange& span, DevicePtr address, std::size_t size) {
    const std::size_t first = page_of(span, address);
    const std::size_t last = page_of(span, address + size - 1);
    if (span.count_mapped(first, last + 1) == last - first + 1) return;
    // An old address of aliased memory is still mapped until its work is done.
    if (span.any_retiring(first, last + 1)) {
      retire_mappings(*span.owner, /*wait=*/true, &span, first, last + 1);
    }
    const bool first_shared = (address - span.base) % page_bytes_ != 0;
    const bool last_shared = (address + size - span.base) % page_bytes_ != 0;
    std::vector<std::pair<std::size_t, std::size_t>> runs;  // (first page, pages)
    for (std::size_t i = first; i <= last; ++i) {
      if (span.is_mapped(i)) continue;
      const bool starts_run = (i == first + 1 && first_shared) || (i == last && last_shared);
      if (!runs.empty() && runs.back().first + runs.back().second == i && !starts_run) {
        runs.back().second++;
      } else {
        runs.emplace_back(i, 1);
      }
    }
    const std::vector<PhysicalChunk> chunks =
        acquire_physical(*span.owner, span.pool, runs, PageExclusion{&span, first, last});
    std::size_t next = 0;
    std::vector<std::size_t> mapped_heads;
    for (const auto& [run_first, run_pages] : runs) {
      std::size_t page = run_first;
      while (page < run_first + run_pages) {
        const PhysicalChunk chunk = chunks[next];
        const DevicePtr va = span.base + page * page_bytes_;
        Status status = backend_.map_pages(va, chunk.pages * page_bytes_,
                                           std::span<const PhysicalHandle>(&chunk.handle, 1));
        if (!status) {
          // Undo this call's mappings; keep all physical memory for later.
          for (std::size_t k = next; k < chunks.size(); ++k) put_spare(span.pool, chunks[k]);
          std::size_t undone = 0;
          try {
            for (; undone < mapped_heads.size(); ++undone) {
              unmap_chunk(span, mapped_heads[undone], /*was_free=*/false);
            }
          } catch (...) {
            // What stays mapped lies wholly in the free block the allocation would have used.
            for (; undone < mapped_heads.size(); ++undone) {
              free_mapped_pages_[pool_index(span.pool)] += span.chunk_pages(mapped_heads[undone]);
            }
            throw;
          }
          throw_if_error(status, "mapping " + format_bytes(chunk.pages * page_bytes_) + " at " +
                                     format_pointer(va));
        }
        span.set_chunk_mapped(page, chunk);
        mapped_heads.push_back(page);
        emit(EventKind::kMap, span.pool, span.owner->stream, va, chunk.pages * page_bytes_);
        page += chunk.pages;
        ++next;
      }
    }
  }

  // Unmaps the chunk mapped from page `head` on, which no active block touches; its memory goes
  // to the free physical pool. Returns its page count.
  std::size_t unmap_chunk(AddressRange& span, std::size_t head, bool was_free) {
    const DevicePtr va = span.base + head * page_bytes_;
    const std::size_t pages = span.chunk_pages(head);
    throw_if_error(backend_.unmap_pages(va, pages * page_bytes_, 1),
                   "unmapping the " + format_bytes(pages * page_bytes_) + " at " +
                       format_pointer(va));
    put_spare(span.pool, span.clear_chunk_mapped(head));
    if (was_free) free_mapped_pages_[pool_index(span.pool)] -= pages;
    emit(EventKind::kUnmap, span.pool, span.owner->stream, va, pages * page_bytes_);
    return pages;
  }

  // ---- the free physical pool: created, unmapped chunks by size

  // A chunk in the free pool may still be mapped at an old, retiring address (aliasing): it is
  // unmapped there before the chunk is mapped anywhere else or released (take_spare,
  // release_chunk), so that a failure there leaves the chunk where it was.
  void put_spare(PoolKind pool, PhysicalChunk chunk) {
    free_physical_[pool_index(pool)][chunk.pages].push_back(chunk.handle);
    free_physical_pages_[pool_index(pool)] += chunk.pages;
  }
  // The largest free chunk of at most `max_pages` pages, if any.
  std::optional<PhysicalChunk> take_spare(PoolKind pool, std::size_t max_pages) {
    auto& spare = free_physical_[pool_index(pool)];
    auto it = spare.upper_bound(max_pages);
    if (it == spare.begin()) return std::nullopt;
    --it;
    PhysicalChunk chunk{it->second.back(), it->first};
    if (retiring_mappings_ != 0) retire_handle(chunk.handle);  // may throw: nothing taken yet
    it->second.pop_back();
    if (it->second.empty()) spare.erase(it);
    free_physical_pages_[pool_index(pool)] -= chunk.pages;
    return chunk;
  }
  // Gives a free chunk back to the driver; if the driver refuses, it stays in the free pool.
  void release_chunk(PoolKind pool, PhysicalChunk chunk) {
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
      throw_if_error(status, "releasing " + format_bytes(chunk.pages * page_bytes_) +
                                 " of physical memory");
    }
    reserved_bytes_ -= chunk.pages * page_bytes_;
    emit(EventKind::kPhysicalRelease, pool, 0, 0, chunk.pages * page_bytes_);
  }
  // Gives free chunks of more than `max_pages` pages back to the driver; returns the pages freed.
  std::size_t release_spare_larger_than(PoolKind pool, std::size_t max_pages) {
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
  std::optional<PhysicalChunk> create_chunk(PoolKind pool, std::size_t pages,
                                            std::string* shortage) {
    const std::size_t bytes = pages * page_bytes_;
    if (cap_ != 0 && reserved_bytes_ + bytes > cap_) {
      *shortage = "the cap of " + format_bytes(cap_) + " is reached";
      return std::nullopt;
    }
    PhysicalHandle handle = 0;
    Status status = backend_.create_physical(bytes, &handle);
    if (status.code() == ErrorCode::kOutOfMemory) {
      *shortage = status.message();
      return std::nullopt;
    }
    throw_if_error(status, "creating " + format_bytes(bytes) + " of physical memory");
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
  std::size_t chunk_pages_for(std::size_t run_pages) const {
    constexpr std::size_t kShareOfRun = 8;
    return std::clamp<std::size_t>(run_pages / kShareOfRun, 1, max_chunk_pages_);
  }

  // Idle memory of another stream is taken only once growing would cost more than the
  // cross-stream slack: streams that hand work to each other (a side stream making inputs that
  // the main stream consumes) otherwise take each other's pages at every step, and each move is
  // an unmap and a map (measured on the H200: +76% step time on the two-stream workload).
  bool may_grow_instead_of_taking_from_other_streams(std::size_t pages) const {
    if (options_.cross_stream_slack_percent == 0) return false;
    const std::size_t percent = std::min<std::size_t>(options_.cross_stream_slack_percent, 10000);
    const std::size_t budget = peak_active_bytes_ + peak_active_bytes_ * percent / 100;
    return reserved_bytes_ + pages * page_bytes_ <= budget;
  }

  // Physical chunks that fill each run exactly, in order. Sources, cheapest in memory first:
  // free chunks that fit, idle mapped chunks of the owner stream that fit, its own pages still
  // in use (alias_pending_pages), new memory within the cross-stream slack, idle mapped chunks
  // of other streams that fit, new memory (in chunks of up to max_chunk_pages_, smaller when
  // the device is short), then under pressure: free chunks too large for the run go back to the
  // driver so smaller ones can be created, idle chunks of any size are unmapped, and finally
  // pages still in use by their streams are waited for. Throws OutOfMemoryError (leaving what
  // it gathered in the free pool) if all fall short.
  std::vector<PhysicalChunk> acquire_physical(
      StreamHeaps& owner, PoolKind pool,
      const std::vector<std::pair<std::size_t, std::size_t>>& runs,
      const PageExclusion& exclusion) {
    std::vector<PhysicalChunk> chunks;
    std::string shortage;
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
          if (!chunk && unmap_idle_chunks(pool, needed, needed, /*wait=*/false, exclusion,
                                          StreamChoice::kOthers, &owner) > 0) {
            continue;
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
            throw OutOfMemoryError("need " + format_bytes(needed * page_bytes_) +
                                   " more physical memory in pages of " +
                                   format_bytes(page_bytes_) + ": " + shortage);
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

  // alias_pending_pages: a chunk of `owner`'s own, wholly inside a free block whose last use is
  // still queued (so it cannot be unmapped yet), of at most `max_pages` pages. Its physical
  // memory leaves the old address (which turns retiring: still mapped in the driver, unusable)
  // for the caller to map at the new one. Work queued on the stream before the free runs before
  // anything the new address is used for, so the sharing is safe; the ledger sees an unmap here.
  std::optional<PhysicalChunk> alias_pending_chunk(StreamHeaps& owner, PoolKind pool,
                                                   std::size_t max_pages,
                                                   const PageExclusion& exclusion) {
    retire_mappings(owner, /*wait=*/false);
    const int p = pool_index(pool);
    for (AddressRange* span : owner.ranges[p]) {
      if (!span->is_span) continue;
      for (Block* b = span->first; b != nullptr; b = b->next) {
        if (b->state != BlockState::kFree || b->freed_at_fence <= owner.completed_fence) continue;
        const auto [first, last] = whole_pages(*span, b->address, b->end());
        if (first >= last || span->count_mapped(first, last) == 0) continue;
        std::optional<std::size_t> head;
        for_each_mapped(*span, first, last, [&](std::size_t page) {
          if (head || !span->is_chunk_head(page)) return;
          const std::size_t pages = span->chunk_pages(page);
          if (pages <= max_pages && page + pages <= last &&
              !exclusion.intersects(span, page, pages)) {
            head = page;
          }
        });
        if (!head) continue;
        issue_fence(owner);  // the fence that will prove the old address idle must exist
        const PhysicalChunk chunk = span->clear_chunk_mapped(*head);
        span->set_retiring(*head, chunk.pages, true);
        owner.retiring.push_back({span, *head, chunk.pages, b->freed_at_fence, chunk.handle});
        ++retiring_mappings_;
        free_mapped_pages_[p] -= chunk.pages;
        emit(EventKind::kUnmap, pool, owner.stream, span->base + *head * page_bytes_,
             chunk.pages * page_bytes_);
        return chunk;
      }
    }
    return std::nullopt;
  }

  // Unmaps the old addresses of aliased chunks once the work queued before their free has
  // finished (with `wait`, waiting for it); only those in pages [first, last) of `span` when
  // one is given.
  void retire_mappings(StreamHeaps& heaps, bool wait, const AddressRange* span = nullptr,
                       std::size_t first = 0, std::size_t last = SIZE_MAX) {
    if (heaps.retiring.empty()) return;
    poll_fences(heaps);
    for (std::size_t i = 0; i < heaps.retiring.size();) {
      const StreamHeaps::RetiringMapping& r = heaps.retiring[i];
      const bool wanted =
          span == nullptr || (r.span == span && r.head < last && r.head + r.pages > first);
      if (!wanted || (!wait && r.fence > heaps.completed_fence)) {
        ++i;
        continue;
      }
      retire(heaps, i);
    }
  }

  // Unmaps retiring mapping `index` of `heaps`, waiting for its fence first if need be.
  void retire(StreamHeaps& heaps, std::size_t index) {
    const StreamHeaps::RetiringMapping r = heaps.retiring[index];
    if (r.fence > heaps.completed_fence) {
      ++alias_waits_;
      wait_for_fence(heaps, r.fence);
      if (r.fence > heaps.completed_fence) {
        throw_if_error(backend_.synchronize_device(), "waiting for aliased pages");
        mark_all_frees_idle(heaps);
      }
    }
    const DevicePtr va = r.span->base + r.head * page_bytes_;
    throw_if_error(backend_.unmap_pages(va, r.pages * page_bytes_, 1),
                   "unmapping the old address " + format_pointer(va) + " of aliased memory");
    r.span->set_retiring(r.head, r.pages, false);
    heaps.retiring[index] = heaps.retiring.back();
    heaps.retiring.pop_back();
    --retiring_mappings_;
  }

  // Physical memory leaving its stream (the free physical pool, the driver) must no longer be
  // mapped at an old address whose work may still run.
  void retire_handle(PhysicalHandle handle) {
    for (auto& heaps : streams_) {
      for (std::size_t i = 0; i < heaps->retiring.size(); ++i) {
        if (heaps->retiring[i].handle == handle) {
          retire(*heaps, i);
          return;
        }
      }
    }
  }

  enum class StreamChoice { kAll, kOnly, kOthers };

  // Unmaps free mapped chunks of `pool` of at most `max_chunk` pages, until at least `count`
  // pages are unmapped, moving their memory to the free physical pool. A chunk qualifies when
  // all its pages lie wholly inside one free block; without `wait`, only when the stream that
  // freed it has provably finished with it. `choice` limits the streams looked at
  // (their own or the others of `stream`). Returns the pages unmapped.
  std::size_t unmap_idle_chunks(PoolKind pool, std::size_t count, std::size_t max_chunk,
                                bool wait, const PageExclusion& exclusion,
                                StreamChoice choice = StreamChoice::kAll,
                                const StreamHeaps* stream = nullptr) {
    const int p = pool_index(pool);
    std::size_t unmapped = 0;
    for (auto& heaps : streams_) {
      if (choice == StreamChoice::kOnly && heaps.get() != stream) continue;
      if (choice == StreamChoice::kOthers && heaps.get() == stream) continue;
      for (AddressRange* span : heaps->ranges[p]) {
        if (!span->is_span) continue;
        for (Block* b = span->first; b != nullptr; b = b->next) {
          if (unmapped >= count || free_mapped_pages_[p] == 0) return unmapped;
          if (b->state != BlockState::kFree) continue;
          const auto [first, last] = whole_pages(*span, b->address, b->end());
          if (first >= last || span->count_mapped(first, last) == 0) continue;
          std::vector<std::size_t> heads;
          for_each_mapped(*span, first, last, [&](std::size_t page) {
            if (!span->is_chunk_head(page)) return;
            const std::size_t pages = span->chunk_pages(page);
            if (pages <= max_chunk && page + pages <= last &&
                !exclusion.intersects(span, page, pages)) {
              heads.push_back(page);
            }
          });
          if (heads.empty()) continue;
          if (b->freed_at_fence > heaps->completed_fence) {
            issue_fence(*heaps);
            poll_fences(*heaps);
            if (wait) wait_for_fence(*heaps, b->freed_at_fence);
            if (b->freed_at_fence > heaps->completed_fence) continue;
          }
          for (std::size_t head : heads) {
            if (unmapped >= count) break;
            unmapped += unmap_chunk(*span, head, /*was_free=*/true);
          }
        }
      }
    }
    return unmapped;
  }

  // Adds (+1) or removes (-1) the block's bytes on its first and last page and announces the
  // change of those pages' free bytes (the paged heap's inactive split: free bytes on pages that
  // active blocks hold, which no page-sized request can use).
  void mark_pages(const Block& block, int direction) {
    AddressRange& span = *block.range;
    const std::size_t first = page_of(span, block.address);
    const std::size_t last = page_of(span, block.end() - 1);
    mark_edge_page(span, block, first, direction);
    if (last != first) mark_edge_page(span, block, last, direction);
  }

  void mark_edge_page(AddressRange& span, const Block& block, std::size_t index, int direction) {
    PageUse& page = span.page_use[index];
    const DevicePtr page_start = span.base + index * page_bytes_;
    const std::size_t overlap =
        std::min(block.end(), page_start + page_bytes_) - std::max(block.address, page_start);
    const std::size_t old_fragment = page.users > 0 ? page_bytes_ - page.active_bytes : 0;
    if (direction > 0) {
      page.users++;
      page.active_bytes += overlap;
    } else {
      page.users--;
      page.active_bytes -= overlap;
    }
    const std::size_t new_fragment = page.users > 0 ? page_bytes_ - page.active_bytes : 0;
    if (old_fragment == new_fragment) return;
    note_split_change((new_fragment > 0 ? 1 : 0) - (old_fragment > 0 ? 1 : 0),
                      static_cast<std::int64_t>(new_fragment) -
                          static_cast<std::int64_t>(old_fragment));
  }

  // ---------------------------------------------------------------- fences

  void poll_fences(StreamHeaps& heaps) {
    while (!heaps.outstanding_fences.empty()) {
      auto [event, sequence] = heaps.outstanding_fences.front();
      EventState state = EventState::kPending;
      throw_if_error(backend_.query_event(event, &state), "querying a fence event");
      if (state != EventState::kComplete) return;
      heaps.completed_fence = sequence;
      spare_events_.push_back(event);
      heaps.outstanding_fences.pop_front();
    }
  }

  // Records a fence covering every page freed on the stream so far, unless one already does.
  void issue_fence(StreamHeaps& heaps) {
    if (!heaps.page_freed_since_last_fence) return;
    EventHandle event = take_event();
    Status status = backend_.record_event(event, heaps.stream);
    if (!status) {
      // The stream is gone (or broken): the only proof left is an idle device.
      spare_events_.push_back(event);
      throw_if_error(backend_.synchronize_device(),
                     "synchronizing the device after recording a fence failed (" +
                         status.message() + ")");
      mark_all_frees_idle(heaps);
      return;
    }
    heaps.outstanding_fences.emplace_back(event, heaps.next_fence);
    heaps.next_fence++;
    heaps.page_freed_since_last_fence = false;
  }

  void wait_for_fence(StreamHeaps& heaps, std::uint64_t sequence) {
    while (heaps.completed_fence < sequence && !heaps.outstanding_fences.empty()) {
      auto [event, fence] = heaps.outstanding_fences.front();
      throw_if_error(backend_.synchronize_event(event), "waiting for a fence event");
      heaps.completed_fence = fence;
      spare_events_.push_back(event);
      heaps.outstanding_fences.pop_front();
    }
  }

  // After the whole device was synchronized: everything freed on the stream so far is idle, and
  // the outstanding fences prove nothing more.
  void mark_all_frees_idle(StreamHeaps& heaps) {
    for (auto& [event, sequence] : heaps.outstanding_fences) spare_events_.push_back(event);
    heaps.outstanding_fences.clear();
    heaps.completed_fence = heaps.next_fence;
    heaps.next_fence++;
    heaps.page_freed_since_last_fence = false;
  }

  // ---------------------------------------------------------------- freeing

  // `kind` is kFree for a free that completes at once, else kFreeCompleted.
  void complete_free(Block* block, EventKind kind) {
    AddressRange& range = *block->range;
    StreamHeaps& owner = *range.owner;
    if (range.is_span) mark_pages(*block, -1);
    AllocatorEvent event{kind};  // sent once the merges below have added their split changes
    event.pool = range.pool;
    event.stream = owner.stream;
    event.address = block->address;
    event.size = block->size;
    event.requested = block->requested;
    event.tag = block->tag;
    const DevicePtr freed_start = block->address;
    const DevicePtr freed_end = block->end();
    block->state = BlockState::kFree;
    block->requested = 0;
    block->tag = kUntagged;
    block->stream_uses.clear();
    block->pending_events = 0;
    range.active_blocks--;

    FreeBlockIndex& index = owner.free[pool_index(range.pool)];
    if (Block* prev = block->prev; prev != nullptr && prev->state == BlockState::kFree) {
      index.remove(prev);
      set_inactive_split(prev, false);
      prev->size += block->size;
      unlink(block);
      block = prev;
    }
    if (Block* next = block->next; next != nullptr && next->state == BlockState::kFree) {
      index.remove(next);
      set_inactive_split(next, false);
      block->size += next->size;
      unlink(next);
    }
    index.insert(block);
    refresh_inactive_split(block);
    emit(event.kind, event.pool, event.stream, event.address, event.size, event.requested,
         event.tag);
    if (!range.is_span) return;

    // Pages the freed bytes touched that now lie wholly in free space.
    const auto [whole_first, whole_last] = whole_pages(range, block->address, block->end());
    const std::size_t lo = std::max(page_of(range, freed_start), whole_first);
    const std::size_t hi = std::min(page_of(range, freed_end - 1) + 1, whole_last);
    if (hi > lo) free_mapped_pages_[pool_index(range.pool)] += range.count_mapped(lo, hi);
    // Work queued on the stream so far may still touch these bytes.
    block->freed_at_fence = owner.next_fence;
    owner.page_freed_since_last_fence = true;
    if (options_.max_free_mapped_bytes != SIZE_MAX) trim_free_mapped(range.pool);
  }

  // Removes `block` from its range's list (its bytes were merged into a neighbour).
  void unlink(Block* block) {
    if (block->prev != nullptr) block->prev->next = block->next;
    if (block->next != nullptr) block->next->prev = block->prev;
    if (block->range->first == block) block->range->first = block->next;
    block_pool_.destroy(block);
  }

  void process_completed_frees_locked() {
    for (std::size_t i = 0; i < pending_.size();) {
      PendingEvent entry = pending_[i];
      EventState state = EventState::kPending;
      throw_if_error(backend_.query_event(entry.event, &state),
                     "querying a cross-stream free event");
      if (state != EventState::kComplete) {
        ++i;
        continue;
      }
      spare_events_.push_back(entry.event);
      pending_[i] = pending_.back();
      pending_.pop_back();
      if (--entry.block->pending_events == 0) {
        live_.erase(entry.block->address);
        complete_free(entry.block, EventKind::kFreeCompleted);
      }
    }
  }

  // Segment heap: torch's meaning of inactive split — a free block sharing its segment.
  void refresh_inactive_split(Block* block) {
    if (block->range->is_span) return;
    const bool split = block->state == BlockState::kFree &&
                       (block->prev != nullptr || block->next != nullptr);
    set_inactive_split(block, split);
  }
  void set_inactive_split(Block* block, bool value) {
    if (block->counted_inactive_split == value) return;
    block->counted_inactive_split = value;
    note_split_change(value ? 1 : -1, value ? static_cast<std::int64_t>(block->size)
                                            : -static_cast<std::int64_t>(block->size));
  }

  // ---------------------------------------------------------------- giving memory back

  void release_cached_locked() {
    if (paged_) {
      // One fence per stream covers every page freed so far; wait for all of them.
      for (auto& heaps : streams_) {
        if (heaps->page_freed_since_last_fence || !heaps->outstanding_fences.empty()) {
          issue_fence(*heaps);
          wait_for_fence(*heaps, heaps->next_fence - 1);
        }
        retire_mappings(*heaps, /*wait=*/true);
      }
    }
    for (auto& heaps : streams_) {
      for (int p = 0; p < 2; ++p) release_idle_ranges(*heaps, p);
    }
    if (paged_) {
      for (PoolKind pool : {PoolKind::kSmall, PoolKind::kLarge}) {
        unmap_idle_chunks(pool, SIZE_MAX, SIZE_MAX, /*wait=*/true, PageExclusion{});
      }
    }
    trim_free_physical(0);
  }

  // Segment heap: returns fully free segments. Paged heap: unmaps the pages of spans with no
  // active block, and with free_spans also gives their address space back.
  void release_idle_ranges(StreamHeaps& heaps, int p, bool free_spans = false) {
    auto& ranges = heaps.ranges[p];
    for (std::size_t i = 0; i < ranges.size();) {
      AddressRange* range = ranges[i];
      if (range->active_blocks != 0) {
        ++i;
        continue;
      }
      if (range->is_span) {
        std::vector<std::size_t> heads;
        for_each_mapped(*range, 0, range->mapped_bits.size() * 64, [&](std::size_t page) {
          if (range->is_chunk_head(page)) heads.push_back(page);
        });
        for (std::size_t head : heads) unmap_chunk(*range, head, /*was_free=*/true);
        if (!free_spans) {
          ++i;
          continue;
        }
        retire_mappings(heaps, /*wait=*/true, range);
        throw_if_error(backend_.free_address_range(range->base, range->size),
                       "freeing the address span at " + format_pointer(range->base));
        heaps.free[p].remove(range->first);
        block_pool_.destroy(range->first);
        emit(EventKind::kVirtualRelease, range->pool, heaps.stream, range->base, range->size);
        delete range;
        ranges[i] = ranges.back();
        ranges.pop_back();
        continue;
      }
      Block* block = range->first;
      throw_if_error(backend_.free_segment(range->base, range->size, heaps.stream),
                     "returning the " + format_bytes(range->size) + " segment at " +
                         format_pointer(range->base));
      heaps.free[p].remove(block);
      set_inactive_split(block, false);
      block_pool_.destroy(block);
      reserved_bytes_ -= range->size;
      emit(EventKind::kSegmentRelease, range->pool, heaps.stream, range->base, range->size);
      delete range;
      ranges[i] = ranges.back();
      ranges.pop_back();
    }
  }

  void trim_free_mapped(PoolKind pool) {
    const int p = pool_index(pool);
    const std::size_t keep = options_.max_free_mapped_bytes / page_bytes_;
    if (free_mapped_pages_[p] <= keep) return;
    unmap_idle_chunks(pool, free_mapped_pages_[p] - keep, SIZE_MAX, /*wait=*/false,
                      PageExclusion{});
    trim_free_physical(options_.max_free_physical_bytes);
  }

  // Releases free physical chunks beyond `keep_bytes` to the driver, largest first.
  void trim_free_physical(std::size_t keep_bytes) {
    if (!paged_) return;
    for (PoolKind pool : {PoolKind::kSmall, PoolKind::kLarge}) {
      while (free_physical_pages_[pool_index(pool)] * page_bytes_ > keep_bytes) {
        release_chunk(pool, *take_spare(pool, SIZE_MAX));
      }
    }
  }

  // Best effort at destruction: the device may already be gone, so errors are ignored. Ranges
  // that still hold live blocks are left alone: their memory belongs to whoever holds them.
  void release_everything_at_exit() noexcept {
    (void)backend_.synchronize_device();
    for (auto& heaps : streams_) {
      for (const auto& r : heaps->retiring) {
        (void)backend_.unmap_pages(r.span->base + r.head * page_bytes_, r.pages * page_bytes_, 1);
      }
      heaps->retiring.clear();
      retiring_mappings_ = 0;
    }
    for (auto& heaps : streams_) {
      for (int p = 0; p < 2; ++p) {
        for (AddressRange* range : heaps->ranges[p]) {
          if (range->active_blocks == 0) {
            if (range->is_span) {
              bool all_unmapped = true;
              for_each_mapped(*range, 0, range->mapped_bits.size() * 64, [&](std::size_t page) {
                if (!range->is_chunk_head(page)) return;
                const std::size_t bytes = range->chunk_pages(page) * page_bytes_;
                if (backend_.unmap_pages(range->base + page * page_bytes_, bytes, 1)) {
                  (void)backend_.release_physical(range->page_mapping[page].handle);
                } else {
                  all_unmapped = false;
                }
              });
              if (all_unmapped) (void)backend_.free_address_range(range->base, range->size);
            } else {
              (void)backend_.free_segment(range->base, range->size, heaps->stream);
            }
          }
          for (Block* b = range->first; b != nullptr;) {
            Block* next = b->next;
            block_pool_.destroy(b);
            b = next;
          }
          delete range;
        }
      }
      for (auto& [event, sequence] : heaps->outstanding_fences) {
        (void)backend_.destroy_event(event);
      }
    }
    for (const PendingEvent& entry : pending_) (void)backend_.destroy_event(entry.event);
    for (EventHandle event : spare_events_) (void)backend_.destroy_event(event);
    for (auto& spare : free_physical_) {
      for (auto& [pages, handles] : spare) {
        for (PhysicalHandle handle : handles) (void)backend_.release_physical(handle);
      }
    }
  }

  // ---------------------------------------------------------------- queries and errors

  const Block* block_containing(DevicePtr ptr) const {
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

  [[noreturn]] void throw_unknown_pointer(DevicePtr ptr, const char* action) const {
    const Block* inside = block_containing(ptr);
    if (inside != nullptr && inside->address == ptr && inside->state == BlockState::kFree) {
      throw Error(ErrorCode::kDoubleFree, std::string(action) + " " + format_pointer(ptr) +
                                              ": this block was already freed");
    }
    if (inside != nullptr) {
      throw Error(ErrorCode::kInvalidPointer,
                  std::string(action) + " " + format_pointer(ptr) +
                      ": the pointer lies inside a block starting at " +
                      format_pointer(inside->address) + " but is not its start");
    }
    throw Error(ErrorCode::kInvalidPointer, std::string(action) + " " + format_pointer(ptr) +
                                                ": this pointer was not allocated by vramledger "
                                                "on this device");
  }

  std::string describe_oom(std::size_t bytes, StreamHandle stream, const char* cause) const {
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    const bool known = backend_.memory_info(&free_bytes, &total_bytes).is_ok();
    std::string text = "out of memory: tried to allocate " + format_bytes(bytes) +
                       " on device " + std::to_string(backend_.info().device) + " (stream " +
                       format_pointer(stream) + ", backend " + backend_.info().name + "). ";
    text += "vramledger holds " + format_bytes(reserved_bytes_) + " reserved";
    if (cap_ != 0) text += " under a cap of " + format_bytes(cap_);
    if (known) {
      text += "; the device has " + format_bytes(free_bytes) + " free of " +
              format_bytes(total_bytes);
    }
    text += ". Cause: ";
    text += cause;
    if (observer_ != nullptr) {
      const std::string account = observer_->describe();
      if (!account.empty()) text += "\n" + account;
    }
    return text;
  }

  // Bytes of [address, address + size) with memory behind them, and the longest such run.
  std::pair<std::size_t, std::size_t> backed_bytes(const AddressRange& range, DevicePtr address,
                                                   std::size_t size) const {
    if (!range.is_span) return {size, size};
    std::size_t total = 0;
    std::size_t longest = 0;
    std::size_t run = 0;
    std::size_t previous_page = SIZE_MAX;
    const DevicePtr end = address + size;
    for_each_mapped(range, page_of(range, address), page_of(range, end - 1) + 1,
                    [&](std::size_t page) {
                      const DevicePtr page_start = range.base + page * page_bytes_;
                      const std::size_t overlap = std::min(end, page_start + page_bytes_) -
                                                  std::max(address, page_start);
                      total += overlap;
                      run = (previous_page != SIZE_MAX && page == previous_page + 1) ? run + overlap
                                                                                     : overlap;
                      longest = std::max(longest, run);
                      previous_page = page;
                    });
    return {total, longest};
  }

  std::size_t count_free_blocks(const StreamHeaps& heaps, int p) const {
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
  std::size_t count_range(const AddressRange& range, BlockCensus::PerPool& out,
                          std::size_t& live_seen) const {
    auto fail = [&](const std::string& what) {
      throw Error(ErrorCode::kInternal, "range at " + format_pointer(range.base) + ": " + what);
    };
    std::vector<PageUse> recount(range.page_use.size());
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
          for (std::size_t i : {first, last}) {
            const DevicePtr page_start = range.base + i * page_bytes_;
            recount[i].users++;
            recount[i].active_bytes += std::min(b->end(), page_start + page_bytes_) -
                                       std::max(b->address, page_start);
            if (first == last) break;
          }
        }
        continue;
      }
      const auto [backed, longest] = backed_bytes(range, b->address, b->size);
      out.free_bytes += static_cast<std::int64_t>(backed);
      out.largest_free_block = std::max(out.largest_free_block, static_cast<std::int64_t>(longest));
      if (!range.is_span && (b->prev != nullptr || b->next != nullptr)) {
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
      out.segment++;
      out.reserved_bytes += static_cast<std::int64_t>(range.size);
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

  // ---------------------------------------------------------------- state

  mutable SpinMutex mutex_;  // see spin_mutex.hpp: std::mutex collapsed under 4+ threads
  DeviceBackend& backend_;
  AllocatorObserver* observer_;
  AllocatorOptions options_;
  std::size_t cap_;
  bool paged_ = false;
  std::size_t page_bytes_ = 0;
  std::size_t span_bytes_[2] = {0, 0};
  std::size_t reserved_bytes_ = 0;
  // Bytes of active blocks (allocated, or freed and awaiting other streams) and their peak: the
  // base of the cross-stream slack (may_grow_instead_of_taking_from_other_streams).
  std::size_t active_bytes_ = 0;
  std::size_t peak_active_bytes_ = 0;
  std::uint64_t alias_waits_ = 0;  // allocations that waited for an aliased old address
  std::size_t retiring_mappings_ = 0;  // over every stream's `retiring`
  std::int32_t pending_split_count_ = 0;    // see note_split_change
  std::int64_t pending_split_bytes_ = 0;

  ObjectPool<Block> block_pool_;
  BlockAddressMap live_;  // allocated and pending-free blocks by start address
  std::vector<std::unique_ptr<StreamHeaps>> streams_;
  StreamHeaps* last_stream_ = nullptr;
  std::vector<PendingEvent> pending_;
  std::vector<EventHandle> spare_events_;

  std::size_t free_mapped_pages_[2] = {0, 0};  // mapped pages wholly inside free blocks
  // Created, unmapped, ready to map: handles by chunk size in pages.
  std::map<std::size_t, std::vector<PhysicalHandle>> free_physical_[2];
  std::size_t free_physical_pages_[2] = {0, 0};
  std::size_t max_chunk_pages_ = 1;  // largest chunk created at once
};

// -------------------------------------------------------------------- public facade

CachingAllocator::CachingAllocator(DeviceBackend& backend, AllocatorObserver* observer,
                                   AllocatorOptions options)
    : impl_(std::make_unique<Impl>(backend, observer, options)) {}
CachingAllocator::~CachingAllocator() = default;

DevicePtr CachingAllocator::allocate(std::size_t bytes, StreamHandle stream, TagId tag) {
  return impl_->allocate(bytes, stream, tag);
}
DevicePtr CachingAllocator::allocate_at(DevicePtr address, std::size_t bytes, StreamHandle stream,
                                        TagId tag) {
  return impl_->allocate_at(address, bytes, stream, tag);
}
void CachingAllocator::deallocate(DevicePtr ptr) { impl_->deallocate(ptr); }
void CachingAllocator::record_stream(DevicePtr ptr, StreamHandle stream) {
  impl_->record_stream(ptr, stream);
}
void CachingAllocator::empty_cache() { impl_->empty_cache(); }
void CachingAllocator::process_completed_frees() { impl_->process_completed_frees(); }
void CachingAllocator::set_cap(std::size_t cap_bytes) { impl_->set_cap(cap_bytes); }
void CachingAllocator::set_no_split(bool no_split) { impl_->set_no_split(no_split); }
std::size_t CachingAllocator::cap() const { return impl_->cap(); }
bool CachingAllocator::owns(DevicePtr ptr) const { return impl_->owns(ptr); }
AllocationInfo CachingAllocator::describe(DevicePtr ptr) const { return impl_->describe(ptr); }
std::vector<SegmentInfo> CachingAllocator::segments() const { return impl_->segments(); }
BlockCensus CachingAllocator::census() const { return impl_->census(); }
const AllocatorOptions& CachingAllocator::options() const { return impl_->options(); }
DeviceBackend& CachingAllocator::backend() const { return impl_->backend(); }
void CachingAllocator::release_stream(StreamHandle stream) { impl_->release_stream(stream); }

}  // namespace vramledger
