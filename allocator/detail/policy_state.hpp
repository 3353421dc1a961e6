// The caching allocator's state, declared once for every tier of the policy (as mimalloc's
// types.h is for its files). CachingAllocator (caching_allocator.hpp) is the contract; its Impl,
// declared here, holds every field of every tier, and each tier defines its member functions in
// a file of its own, named for its tier (`detail/paged_heap.cpp`, `detail/frees.cpp`, ...);
// docs/design.md ("allocator/detail/ — the policy, one tier per file") maps every file and
// walks a request through them.
//
// The tiers are compiled as one translation unit (allocator/meson.build, Meson's unity build)
// and their member functions are defined `inline`, as they were when the policy was one class
// body: GCC then inlines the hot path across the files as before (compiled separately, a warm
// allocate+free pair cost 7-13 ns more). A tier file must therefore be listed with the others in
// allocator/meson.build; one compiled on its own fails to link.
//
// Locking: one allocator lock per allocator (one allocator per device; StreamLocks: a global lock
// and every published stream's). The public operations take it; every other member function
// expects it held (the `_locked` suffix marks the two that public operations also call). The
// per-stream fast path (detail/stream_fast_path.cpp) takes only its stream's lock; the front
// caches' fast path only its thread's cache mutex; the lock order is in docs/design.md, section 4.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "allocator/caching_allocator.hpp"
#include "allocator/detail/address_range.hpp"
#include "allocator/detail/background_unmaps.hpp"
#include "allocator/detail/block.hpp"
#include "allocator/detail/block_address_map.hpp"
#include "allocator/detail/free_block_index.hpp"
#include "allocator/detail/object_pool.hpp"
#include "allocator/detail/sharded_block_map.hpp"
#include "allocator/detail/sleep_state.hpp"
#include "allocator/detail/stream_heaps.hpp"
#include "allocator/detail/stream_lanes.hpp"
#include "allocator/detail/stream_locks.hpp"
#include "allocator/detail/thread_cache.hpp"
#include "allocator/spin_mutex.hpp"
#include "allocator/text_format.hpp"

namespace vramledger {

struct PendingEvent {
  Block* block;
  EventHandle event;
};

class CachingAllocator::Impl {
 public:
  Impl(DeviceBackend& backend, AllocatorObserver* observer, AllocatorOptions options);
  ~Impl() {
    retire_front_caches();  // their parked blocks back to the heaps, their ledger shards closed
    close_stream_shards();  // what the streams' ledger shards counted, folded into the ledger
    release_everything_at_exit();
    release_sleep_state_at_exit();
  }

  // ---- public operations (the facade forwards to these; each takes the lock)

  // caching_allocator.cpp
  DevicePtr allocate(std::size_t bytes, StreamHandle stream, TagId tag, std::size_t block_bytes);
  DevicePtr allocate_from_heaps(std::size_t bytes, std::size_t size, StreamHandle stream,
                                TagId tag, ThreadCache* cache = nullptr, bool adopt = false,
                                bool return_parked = false);
  DevicePtr allocate_at(DevicePtr address, std::size_t bytes, StreamHandle stream, TagId tag);
  void set_cap(std::size_t cap);
  void set_no_split(bool no_split);
  std::size_t cap() const;
  bool owns(DevicePtr ptr) const;
  const AllocatorOptions& options() const { return options_; }
  DeviceBackend& backend() const { return backend_; }
  // detail/frees.cpp
  void deallocate(DevicePtr ptr);
  void deallocate_as_ordered(DevicePtr ptr);
  void record_stream(DevicePtr ptr, StreamHandle stream);
  void process_completed_frees();
  void finish_background_unmaps();
  // detail/cache_release.cpp
  void empty_cache();
  void release_stream(StreamHandle stream);
  // detail/front_cache.cpp, front_cache_queries.cpp: front caches (each falls back to the heaps)
  DevicePtr front_allocate(std::size_t bytes, StreamHandle stream, TagId tag,
                           std::size_t block_bytes);
  void front_deallocate(DevicePtr ptr);
  bool front_owns(DevicePtr ptr, bool* owned) const;
  bool front_describe(DevicePtr ptr, AllocationInfo* info) const;
  void front_detach(DevicePtr ptr);
  void flush_front_caches();
  // detail/sleep.cpp
  SleepResult sleep(std::span<const TagId> tags, std::span<const TagId> offload);
  SleepResult wake(std::span<const TagId> tags);
  std::vector<TagId> sleeping_tags() const;
  bool is_asleep(DevicePtr ptr) const;
  // detail/sleep_host_copies.cpp
  void release_sleep_host_memory();
  std::size_t prepare_offload(std::span<const TagId> tags);
  std::size_t kept_sleep_host_bytes() const;
  // detail/pool_sleep.cpp
  SleepResult sleep_pool(bool offload);
  SleepResult wake_pool();
  bool pool_asleep() const;
  // detail/census.cpp
  AllocationInfo describe(DevicePtr ptr) const;
  std::vector<PhysicalPiece> physical_pieces(DevicePtr ptr) const;
  std::vector<SegmentInfo> segments() const;
  BlockCensus census() const;
  PolicyFigures policy_figures() const;
  PolicyFigures policy_figures_locked() const;

 private:
  // Larger requests are certainly mistakes (the largest GPUs hold well under 1 TiB); refusing
  // them early also keeps every size computation below far from overflow.
  static constexpr std::size_t kMaxRequestBytes = std::size_t{1} << 44;  // 16 TiB

  // A mask when `multiple` is a power of two (every allocation rounds; a division costs tens of
  // cycles). Not std::has_single_bit: on baseline x86-64 that calls libgcc's __popcountdi2.
  static std::size_t round_up(std::size_t value, std::size_t multiple) {
    if ((multiple & (multiple - 1)) == 0) return (value + multiple - 1) & ~(multiple - 1);
    return (value + multiple - 1) / multiple * multiple;
  }
  static constexpr int pool_index(PoolKind pool) { return static_cast<int>(pool); }

  // ---- events (detail/policy_events.cpp; every operation sends one)

  void emit(EventKind kind, PoolKind pool, StreamHandle stream, DevicePtr address,
            std::size_t size, std::size_t requested = 0, TagId tag = kUntagged);
  // `split`: the split changes this event carries (and clears): the allocator's for operations
  // under its lock, the operation's own on the per-stream fast path.
  void emit_with(SplitDelta& split, EventKind kind, PoolKind pool, StreamHandle stream,
                 DevicePtr address, std::size_t size, std::size_t requested = 0,
                 TagId tag = kUntagged);
  void note_split_change(int count, std::int64_t bytes, SplitDelta& split);
  void emit_block(EventKind kind, const Block* block);

  // ---- active bytes and their exact peak, per stream's heaps (detail/active_bytes.cpp)

  bool take_active_room(StreamHeaps& heaps, std::size_t bytes);
  void ensure_active_room_locked(StreamHeaps& heaps, std::size_t bytes);
  void add_active(StreamHeaps& heaps, std::size_t bytes);
  void add_active_locked(StreamHeaps& heaps, std::size_t bytes);
  void sub_active(StreamHeaps& heaps, std::size_t bytes);
  void give_back_active_room_locked(StreamHeaps& heaps);
  void check_active_bytes_locked() const;

  // ---- requests (caching_allocator.cpp)
  DevicePtr hand_out(Block* block, std::size_t bytes, StreamHandle stream, TagId tag,
                     SplitDelta& split);
  // Under the allocator's lock.
  DevicePtr hand_out(Block* block, std::size_t bytes, StreamHandle stream, TagId tag) {
    ensure_active_room_locked(*block->range->owner, block->size);
    return hand_out(block, bytes, stream, tag, pending_split_);
  }
  Block* free_block_holding(StreamHeaps& heaps, PoolKind pool, DevicePtr address,
                            std::size_t size);
  StreamHeaps& heaps_for(StreamHandle stream, std::uint32_t lane);
  StreamHeaps& heaps_holding(StreamHandle stream, PoolKind pool, DevicePtr address);
  Block* allocate_once(StreamHeaps& heaps, PoolKind pool, std::size_t size);
  std::string describe_oom(std::size_t bytes, StreamHandle stream, const char* cause) const;

  // ---- blocks tiling address ranges (detail/block_tiling.cpp)

  Block* add_range(StreamHeaps& heaps, PoolKind pool, DevicePtr base, std::size_t bytes,
                   bool is_span);
  Block* split_front(Block* block, std::size_t size);
  void unlink(Block* block);
  void refresh_inactive_split(Block* block, SplitDelta& split);
  void set_inactive_split(Block* block, bool value, SplitDelta& split);
  void refresh_inactive_split(Block* block) { refresh_inactive_split(block, pending_split_); }
  void set_inactive_split(Block* block, bool value) {
    set_inactive_split(block, value, pending_split_);
  }

  // ---- segment heap (detail/segment_heap.cpp)

  Block* allocate_from_segments(StreamHeaps& heaps, PoolKind pool, std::size_t size);
  void take_from_segment(FreeBlockIndex& index, PoolKind pool, Block* block, std::size_t size,
                         SplitDelta& split);
  std::size_t segment_size_for(PoolKind pool, std::size_t size) const;
  Block* add_segment(StreamHeaps& heaps, PoolKind pool, std::size_t size);
  void ensure_within_cap(std::size_t more) const;

  // ---- paged heap (detail/paged_heap.cpp)

  // Which streams' idle pages unmap_idle_chunks looks at, relative to a given stream:
  // kOthersCold, only other streams' chunks that are cold (chunk_is_cold).
  enum class StreamChoice { kAll, kOnly, kOthersCold };

  // Whole pages in `bytes`: a shift when the page size is a power of two (every device's
  // granularity is), since a paged allocation asks this ~20 times and a 64-bit division costs
  // tens of cycles.
  std::size_t pages_in(std::size_t bytes) const {
    return page_shift_ != kNoPageShift ? bytes >> page_shift_ : bytes / page_bytes_;
  }
  std::size_t page_of(const AddressRange& span, DevicePtr address) const {
    return pages_in(address - span.base);
  }
  // Pages lying entirely inside [address, end): [first, last).
  std::pair<std::size_t, std::size_t> whole_pages(const AddressRange& span, DevicePtr address,
                                                  DevicePtr end) const {
    const std::size_t first = pages_in(address - span.base + page_bytes_ - 1);
    const std::size_t last = pages_in(end - span.base);
    return {first, std::max(first, last)};
  }
  Block* allocate_paged(StreamHeaps& heaps, PoolKind pool, std::size_t size);
  Block* take_from_span(FreeBlockIndex& index, Block* block, DevicePtr address, std::size_t size,
                        SplitDelta& split);
  void back_with_pages(const Block& block, DevicePtr address, std::size_t size);
  // Where an allocation goes in a free block and what that costs: (must wait for an old
  // address, pages to map), compared lexicographically.
  struct Placement {
    Block* block = nullptr;
    DevicePtr address = 0;
    std::pair<bool, std::size_t> cost;
    bool needs_nothing() const { return cost == std::pair{false, std::size_t{0}}; }
  };
  Placement place_at(Block* candidate, DevicePtr address, std::size_t size) const;
  Placement best_place_in(Block* candidate, std::size_t size) const;
  Placement placement_needing_fewest_new_pages(const FreeBlockIndex& index, std::size_t size,
                                               Block* best_fit) const;
  Placement placement_when_best_fit_needs_pages(FreeBlockIndex& index, PoolKind pool,
                                                std::size_t size, Block* best_fit) const;
  bool idle_mapped_memory_is_plentiful(PoolKind pool) const;
  // Every stream's StreamHeaps::free_mapped_pages of pool `p`: exact under the allocator's lock;
  // under one stream's lock (the fast path), others' as they stand (streams_ itself changes only
  // under the allocator's lock).
  std::size_t free_mapped_pages(int p) const {
    std::size_t pages = 0;
    for (const auto& heaps : streams_) pages += heaps->free_mapped_pages[p];
    return pages;
  }
  std::optional<Placement> tightest_mapped_run(FreeBlockIndex& index, std::size_t size) const;
  std::optional<Placement> tightest_mapped_run_by_walk(const FreeBlockIndex& index,
                                                       std::size_t size) const;
  std::size_t pages_to_map(const AddressRange& span, DevicePtr address, std::size_t size) const;
  Block* add_span(StreamHeaps& heaps, PoolKind pool, std::size_t size);
  void map_pages_for(AddressRange& span, DevicePtr address, std::size_t size);
  std::size_t unmap_chunk(AddressRange& span, std::size_t head, bool was_free);
  std::size_t unmap_idle_chunk(AddressRange& span, std::size_t head, std::uint64_t freed_at_fence);
  bool waits_for_gpu(const AddressRange& span, std::size_t first, std::size_t last) const;
  bool any_retiring_behind_fence(const StreamHeaps& heaps) const;
  std::vector<Block*> free_blocks_with_mapped_pages(StreamHeaps& heaps, int p) const;
  std::size_t unmap_idle_chunks(PoolKind pool, std::size_t count, std::size_t max_chunk,
                                bool wait, const PageExclusion& exclusion,
                                StreamChoice choice = StreamChoice::kAll,
                                const StreamHeaps* stream = nullptr);
  void mark_pages(const Block& block, int direction, SplitDelta& split);
  void mark_pages(const Block& block, int direction) { mark_pages(block, direction, pending_split_); }
  void mark_edge_page(AddressRange& span, const Block& block, std::size_t index, int direction,
                      SplitDelta& split);

  // ---- the free physical pool (detail/physical_pool.cpp)

  void put_spare(PoolKind pool, PhysicalChunk chunk);
  std::optional<PhysicalChunk> take_spare(PoolKind pool, std::size_t max_pages);
  void release_chunk(PoolKind pool, PhysicalChunk chunk);
  std::size_t release_spare_larger_than(PoolKind pool, std::size_t max_pages);
  std::optional<PhysicalChunk> create_chunk(PoolKind pool, std::size_t pages,
                                            std::string* shortage);
  std::size_t chunk_pages_for(std::size_t run_pages) const;
  bool may_grow_instead_of_taking_from_other_streams(std::size_t pages) const;
  void note_look_at_other_streams(const StreamHeaps& requester);
  bool stream_is_quiet(const StreamHeaps& heaps) const;
  bool chunk_is_cold(const StreamHeaps& heaps, const AddressRange& span, std::size_t head,
                     std::size_t pages) const;
  std::vector<PhysicalChunk> acquire_physical(
      StreamHeaps& owner, PoolKind pool,
      const std::vector<std::pair<std::size_t, std::size_t>>& runs,
      const PageExclusion& exclusion);

  // ---- fences (detail/fences.cpp)

  void poll_fences(StreamHeaps& heaps);
  // Every wait of the calling thread for the GPU goes through these two (counted in host_waits_).
  Status wait_for_gpu_event(EventHandle event);
  Status wait_for_device();
  void issue_fence(StreamHeaps& heaps);
  void wait_for_fence(StreamHeaps& heaps, std::uint64_t sequence);
  void mark_all_frees_idle(StreamHeaps& heaps);

  // ---- aliasing of pending pages (detail/page_aliasing.cpp)

  std::optional<PhysicalChunk> alias_pending_chunk(StreamHeaps& owner, PoolKind pool,
                                                   std::size_t max_pages,
                                                   const PageExclusion& exclusion,
                                                   StreamHeaps* requester = nullptr);
  std::optional<PhysicalChunk> alias_other_streams_pending_chunk(StreamHeaps& requester,
                                                                 PoolKind pool,
                                                                 std::size_t max_pages,
                                                                 const PageExclusion& exclusion);
  bool order_after_fence(StreamHeaps& waiter, StreamHeaps& owner, std::uint64_t sequence);
  void retire_mappings(StreamHeaps& heaps, bool wait, const AddressRange* span = nullptr,
                       std::size_t first = 0, std::size_t last = SIZE_MAX);
  void retire(StreamHeaps& heaps, std::size_t index);
  void retire_handle(PhysicalHandle handle, bool only_if_unsafe = false);
  void hand_to_helper(StreamHeaps::RetiringMapping& r);
  // Retires every entry of heaps.retiring for which `which(entry)` holds.
  template <typename Which>
  void retire_each(StreamHeaps& heaps, Which&& which) {
    for (std::size_t i = 0; i < heaps.retiring.size();) {
      if (which(heaps.retiring[i])) {
        retire(heaps, i);  // moves the last entry to i
      } else {
        ++i;
      }
    }
  }

  // ---- frees (detail/frees.cpp)

  EventHandle take_event();
  void complete_free(Block* block, EventKind kind, SplitDelta& split);
  void complete_free(Block* block, EventKind kind) { complete_free(block, kind, pending_split_); }

  // ---- the per-stream fast path (detail/stream_fast_path.cpp; docs/design.md 4)
  void start_stream_path_locked();
  void publish_stream_locked(StreamHeaps& heaps);
  void withdraw_stream_locked(StreamHeaps& heaps);
  void close_stream_shards() noexcept;
  void report_to_stream_shard(ObserverShard& shard, const AllocatorEvent& event);
  bool stream_path_open_locked() const;
  bool stream_free_allowed_locked(const StreamHeaps& heaps, const Block* block) const;
  DevicePtr stream_allocate(std::size_t bytes, std::size_t size, PoolKind pool,
                            StreamHandle stream, TagId tag, ThreadCache* adopt_into = nullptr);
  bool stream_deallocate(DevicePtr ptr);
  void process_completed_frees_locked();
  std::size_t adopt_pending_frees(StreamHeaps& owner, PoolKind pool);

  // ---- lanes: heaps of their own for threads contending on one stream (detail/stream_lanes.cpp)

  static constexpr std::uint32_t kMaxLanes = 32;       // per stream (at most 64: a bit mask)
  static constexpr std::size_t kSlotsKeptForStreams = 16;  // of StreamLocks::kSlots
  static constexpr std::uint64_t kWaitsBeforeStreamPath = 64;
  LaneChoice* lane_choice_of_thread(StreamHandle stream) const;
  bool note_lane_lock(LaneChoice* choice, StreamHandle stream, bool waited);
  StreamHeaps& heaps_for_thread(StreamHandle stream);
  std::uint32_t new_lane_for(StreamHandle stream, std::uint32_t current);
  void note_allocator_lock_waited();

  // ---- giving memory back (detail/cache_release.cpp)

  void release_cached_locked();
  void release_idle_ranges(StreamHeaps& heaps, int p, bool free_spans = false);
  void trim_free_mapped(PoolKind pool);
  void trim_free_physical(std::size_t keep_bytes);
  void release_everything_at_exit() noexcept;

  // ---- sleep and wake by tag (detail/sleep.cpp)

  // Throws kInvalidArgument when `tag` is asleep: `action` ("free", ...) names the refused call.
  void refuse_if_asleep(TagId tag, DevicePtr ptr, const char* action) const {
    if (pool_asleep_) [[unlikely]] refuse_pool_asleep(ptr, action);  // detail/pool_sleep.cpp
    if (!sleeping_tags_.empty() && sleeping_tags_.contains(tag)) refuse_asleep(tag, ptr, action);
  }
  [[noreturn]] void refuse_asleep(TagId tag, DevicePtr ptr, const char* action) const;
  std::vector<Block*> blocks_to_sleep(std::span<const TagId> tags) const;
  std::size_t release_sleeping_pages(const std::vector<SleepingBlock*>& blocks);
  void refresh_resident(SleepingBlock& sleeping);
  void refresh_all_resident(std::map<TagId, SleepingTag>* extra, std::span<const TagId> skip);
  void map_sleeping_blocks(const std::vector<SleepingBlock*>& blocks);
  // The host copies of offloaded tags (detail/sleep_host_copies.cpp).
  std::size_t copy_out_to_host(SleepingTag& state);
  std::size_t copy_back_offloaded(const SleepingTag& state);
  HostBuffer take_host_buffer(std::size_t bytes);
  void release_sleep_host_memory_locked() noexcept;
  void release_sleep_state_at_exit() noexcept;

  // ---- sleep and wake of the whole pool (detail/pool_sleep.cpp)

  [[noreturn]] void refuse_pool_asleep(DevicePtr ptr, const char* action) const;
  void segment_lost_memory(AddressRange& range);
  void segment_got_memory(AddressRange& range);

  // ---- queries and errors (detail/census.cpp)

  const Block* block_containing(DevicePtr ptr) const;
  [[noreturn]] void throw_unknown_pointer(DevicePtr ptr, const char* action) const;
  std::pair<std::size_t, std::size_t> backed_bytes(const AddressRange& range, DevicePtr address,
                                                   std::size_t size) const;
  std::size_t count_free_blocks(const StreamHeaps& heaps, int p) const;
  std::size_t count_range(const AddressRange& range, BlockCensus::PerPool& out,
                          std::size_t& live_seen) const;

  // ---------------------------------------------------------------- state

  // The allocator's lock: a global lock (an AutoBiasedMutex over a SpinMutex; std::mutex
  // collapsed under 4+ threads), then the published streams' locks (stream_locks.hpp). Taken
  // whole by every operation but the per-stream fast path, which takes one stream's lock.
  mutable StreamLocks mutex_;
  // Whether own-stream operations may run under their stream's lock: possible without front
  // caches; started (stream_path_) once a second stream is used, if the observer accepts
  // concurrent events then (start_stream_path). A single stream gains nothing from it and would
  // pay the shards' and the ledger's locks.
  bool stream_path_possible_ = false;
  std::atomic<bool> stream_path_{false};
  // Allocations that found the allocator's lock held (note_allocator_lock_waited); under it.
  std::uint64_t allocator_lock_waits_ = 0;
  // Lanes given to threads that asked (new_lane_for), under it; BlockCensus::lane_choices.
  std::uint64_t lane_choices_ = 0;
  // Allocations served under it while the stream path was open; BlockCensus::locked_allocations.
  std::uint64_t locked_allocations_ = 0;
  DeviceBackend& backend_;
  AllocatorObserver* observer_;
  AllocatorOptions options_;
  std::size_t cap_;
  bool paged_ = false;
  std::size_t page_bytes_ = 0;
  static constexpr unsigned kNoPageShift = 64;
  unsigned page_shift_ = kNoPageShift;  // log2(page_bytes_) when it is a power of two
  std::size_t span_bytes_[2] = {0, 0};
  std::size_t reserved_bytes_ = 0;
  // Bytes of active blocks (allocated, or freed and awaiting other streams) and their peak: the
  // base of the cross-stream slack (may_grow_instead_of_taking_from_other_streams), paged heap
  // only. Counted per stream's heaps (StreamHeaps::active_bytes, active_room) so that streams on
  // their fast paths share no cache line; Σ active_bytes + Σ active_room + active_spare_ ==
  // active_peak_ at all times (detail/active_bytes.cpp). The peak changes only under the
  // allocator's lock; the spare, shared, only when a stream's own room runs short or overflows.
  std::size_t active_peak_ = 0;
  struct alignas(64) SpareRoom {  // a cache line of its own
    std::atomic<std::size_t> bytes{0};
  };
  SpareRoom active_spare_;
  // PolicyFigures::room_shortfalls (counted on fast paths) and active_peak_rises (under the
  // allocator's lock).
  std::atomic<std::uint64_t> room_shortfalls_{0};
  std::uint64_t peak_rises_ = 0;
  // Times the calling thread blocked until the GPU finished queued work (wait_for_gpu_event,
  // wait_for_device): BlockCensus::host_waits. Atomic: read by census() without the waits' lock.
  std::atomic<std::uint64_t> host_waits_{0};
  std::size_t retiring_mappings_ = 0;  // over every stream's `retiring`
  // Unmaps of retiring old addresses, run off the allocating thread: unmap_in_background, on a
  // backend that allows a second mapping of the same memory.
  BackgroundUnmaps background_unmaps_{backend_};
  bool unmap_in_background_ = false;
  std::uint64_t looks_at_other_streams_ = 0;  // note_look_at_other_streams
  // Whether the last look found enough streams allocating for the cold rule (chunk_is_cold);
  // read only after a look, in the same acquire_physical.
  bool cold_rule_applies_ = false;
  SplitDelta pending_split_;  // see note_split_change; the fast path keeps its own

  ShardedBlockMap live_;  // allocated and pending-free blocks by start address
  std::vector<std::unique_ptr<StreamHeaps>> streams_;
  // Released streams' heaps that were published: kept, empty, until the allocator goes, since a
  // fast path may still be about to lock one (stream_locks.hpp).
  std::vector<std::unique_ptr<StreamHeaps>> withdrawn_streams_;
  StreamHeaps* last_stream_ = nullptr;
  std::vector<PendingEvent> pending_;
  std::vector<EventHandle> spare_events_;

  // Created, unmapped, ready to map: handles by chunk size in pages.
  std::map<std::size_t, std::vector<PhysicalHandle>> free_physical_[2];
  std::size_t free_physical_pages_[2] = {0, 0};
  std::size_t max_chunk_pages_ = 1;  // largest chunk created at once

  // ---- sleep and wake (detail/sleep.cpp): tags asleep and their blocks; host buffers to reuse
  std::map<TagId, SleepingTag> sleeping_tags_;
  std::vector<HostBuffer> spare_host_;
  // ---- the whole pool asleep (detail/pool_sleep.cpp): its allocated blocks, its host copy
  bool pool_asleep_ = false;
  SleepingTag pool_sleep_;

  // ---- front caches (detail/front_cache.cpp, thread_cache.hpp; docs/design.md, 5.2)
  // Lock order: mutex_ (or one stream's lock: adoption) -> front_mutex_ -> a ThreadCache's
  // mutex(); the observer's lock sits between those and the caches' (a cache's mutex is its
  // ledger shard's). A thread holding a cache's mutex takes no other lock.
  bool front_enabled_ = false;
  std::size_t front_max_block_ = 0;  // larger blocks never enter a front cache
  std::uint64_t front_id_ = 0;       // never reused: thread-local lookups key on it
  bool returning_front_block_ = false;  // see emit
  mutable SpinMutex front_mutex_;       // front_caches_
  std::vector<std::shared_ptr<ThreadCache>> front_caches_;

  static std::uint64_t next_front_id();
  static void retire_front_cache_of(void* impl, const std::shared_ptr<ThreadCache>& cache);
  ThreadCache* front_cache_of_thread();
  [[gnu::noinline]] ThreadCache* make_front_cache_of_thread();
  ThreadCache* front_cache_if_any() const;
  void adopt_front_block(ThreadCache& cache, Block* block, std::size_t bytes, StreamHandle stream);
  Block* allocate_block_locked(std::size_t bytes, std::size_t size, PoolKind pool,
                               StreamHandle stream, TagId tag);
  std::size_t request_size(std::size_t bytes, std::size_t block_bytes) const;
  [[noreturn, gnu::cold, gnu::noinline]] static void refuse_request(std::size_t bytes);
  PoolKind pool_for(std::size_t size) const {
    return size <= options_.small_size_limit ? PoolKind::kSmall : PoolKind::kLarge;
  }
  void return_front_block_locked(Block* block);
  std::size_t flush_front_caches_locked(const StreamHandle* stream);
  std::size_t return_parked_before_growth_locked(StreamHandle stream);
  void return_parked_locked(ThreadCache& cache);
  FrontBlock detach_front_block_locked(Block* block, const char* action);
  void retire_front_cache_locked(ThreadCache& cache);
  void retire_front_cache(const std::shared_ptr<ThreadCache>& cache);
  void retire_front_caches();
  void front_census_locked(BlockCensus& census) const;
  void front_segments_locked(std::vector<SegmentInfo>& segments) const;
};

}  // namespace vramledger
