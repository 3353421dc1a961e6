// The policy layer: a caching allocator over any DeviceBackend.
//
// Two heap shapes share one block model (blocks tile address ranges; free neighbours merge):
//  * segment heap (backends without VMM): ranges are backend segments, split and merged inside,
//    released whole when entirely free — PyTorch's model;
//  * paged heap (VMM backends): ranges are large reserved virtual spans per stream and pool;
//    physical pages are mapped only under pages some live block touches, and a page no live block
//    touches can be unmapped and re-mapped anywhere else, so holes in virtual space cost nothing.
//
// Streams: a freed block returns to the free lists of the stream it was allocated on. Blocks used
// on other streams (record_stream) become reusable only after events recorded on those streams
// at free time have completed.
//
// Thread safety: every public method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "allocator/allocator_events.hpp"
#include "allocator/allocator_options.hpp"
#include "allocator/device_backend.hpp"

namespace vramledger {

// The policy's running figures: read without walking any block (CachingAllocator::
// policy_figures), so a program may ask for them every step; also part of the census.
struct PolicyFigures {
  std::int64_t stream_heaps = 0;  // heaps in use: one per stream, one per lane of a stream
  // Times a thread kept waiting for its lane's lock was given a lane (a new one, one its thread
  // left, or its own again): a figure that keeps rising means threads pass between lanes.
  std::int64_t lane_choices = 0;
  // Allocations the per-stream fast path left to the allocator's lock once it was open (growth,
  // pages to map, pending frees, a lane change): each stops every stream's thread meanwhile.
  std::int64_t locked_allocations = 0;
  // Paged heap: of those, the ones whose stream's room for active bytes was short while the
  // spare and every other stream's room together could not cover it (detail/active_bytes.cpp);
  // and the times the peak of active bytes rose (any path): a shortfall that raised no peak
  // found room that was moving between streams.
  std::int64_t room_shortfalls = 0;
  std::int64_t active_peak_rises = 0;
  // Nanoseconds the allocator's lock was held (every stream's lock with it) while the per-stream
  // fast path was open: time each stream's thread may have waited.
  std::int64_t streams_held_ns = 0;
  // Paged heap: old addresses of moved chunks unmapped by the helper thread, and those the
  // allocator unmapped itself because it needed them gone before the helper got to them
  // (AllocatorOptions::unmap_in_background; detail/background_unmaps.hpp).
  std::int64_t unmaps_in_background = 0;
  std::int64_t unmaps_on_demand = 0;
  std::int64_t unmaps_pending = 0;  // handed to the helper, not yet run (or still running)
  // Times the allocator stopped its calling thread until the GPU had run queued work (a fence
  // event or the whole device): the GPU's queue runs dry meanwhile. Allocations avoid it; a
  // release, empty_cache, sleep or a device short of memory may need it.
  std::int64_t host_waits = 0;
  // Paged heap: the highest sum of active bytes (both pools) so far — the cross-stream slack's
  // base (AllocatorOptions::cross_stream_slack_permille); 0 on the segment heap.
  std::int64_t peak_active_bytes = 0;
};

// Recount of the allocator's state computed by walking every block, segment and page. The ledger
// must agree with it at every instant (see accounting/consistency.hpp). Its policy figures are
// the running ones (PolicyFigures), as they stood at the walk.
struct BlockCensus : PolicyFigures {
  struct PerPool {
    std::int64_t allocation = 0;            // allocated blocks
    std::int64_t allocated_bytes = 0;
    std::int64_t requested_bytes = 0;       // requested sizes of active blocks (torch's meaning)
    std::int64_t active = 0;                // allocated + awaiting cross-stream completion
    std::int64_t active_bytes = 0;
    std::int64_t inactive_split = 0;
    std::int64_t inactive_split_bytes = 0;
    std::int64_t segment = 0;               // backend segments (segment heap)
    std::int64_t reserved_bytes = 0;        // physical bytes held from the backend
    std::int64_t mapped_bytes = 0;          // paged heap: physical bytes mapped
    std::int64_t virtual_bytes = 0;         // paged heap: address space reserved
    std::int64_t free_bytes = 0;            // inactive block bytes backed by memory (cached)
    std::int64_t largest_free_block = 0;    // largest inactive block fully backed by memory
    std::int64_t sleeping = 0;              // blocks asleep (sleep by tag, docs/sleep.md)
    std::int64_t sleeping_bytes = 0;        // their bytes: address space, no memory behind
    std::int64_t sleeping_resident_bytes = 0;  // their bytes on pages kept for neighbours
  };
  PerPool pools[2];  // indexed by PoolKind
  std::int64_t free_physical_pages = 0;     // created, unmapped, held for reuse
};

// Description of one address range and its blocks, for snapshots and reports.
struct BlockInfo {
  DevicePtr address = 0;
  std::size_t size = 0;
  std::size_t requested = 0;
  bool allocated = false;
  bool active = false;          // allocated, or freed but pending other streams
  std::size_t mapped_bytes = 0; // bytes of this block that have memory behind them
  TagId tag = kUntagged;
};
struct SegmentInfo {
  DevicePtr address = 0;
  std::size_t size = 0;            // address-range size
  std::size_t mapped_bytes = 0;    // physical bytes mapped under it (== size for segments)
  StreamHandle stream = 0;
  PoolKind pool = PoolKind::kLarge;
  bool is_virtual_span = false;    // paged heap span rather than a backend segment
  std::vector<BlockInfo> blocks;   // in address order, tiling the range
};

// What a pointer we handed out refers to.
struct AllocationInfo {
  DevicePtr base = 0;          // start of the block
  std::size_t size = 0;
  std::size_t requested = 0;
  StreamHandle stream = 0;
  TagId tag = kUntagged;
  DevicePtr segment_base = 0;  // start of the range the block lives in
  std::size_t segment_size = 0;
};

// One physical chunk under a block (CachingAllocator::physical_pieces).
struct PhysicalPiece {
  DevicePtr va = 0;  // where the chunk is mapped, whole
  std::size_t bytes = 0;
  PhysicalHandle handle = 0;
  friend bool operator==(const PhysicalPiece&, const PhysicalPiece&) = default;
};

// What one sleep or wake did (docs/sleep.md).
struct SleepResult {
  std::size_t blocks = 0;
  std::size_t bytes = 0;            // block bytes put to sleep or woken
  std::size_t offloaded_bytes = 0;  // copied to the host (sleep) or back (wake)
  std::size_t released_bytes = 0;   // sleep: physical memory given back to the device
  std::size_t mapped_bytes = 0;     // wake: block bytes that had no memory and have it again
  std::size_t resident_bytes = 0;   // sleep: block bytes left on pages kept for neighbours

  // Sums what several sleeps or wakes did (tags and graph pools, several pools).
  SleepResult& operator+=(const SleepResult& other) {
    blocks += other.blocks;
    bytes += other.bytes;
    offloaded_bytes += other.offloaded_bytes;
    released_bytes += other.released_bytes;
    mapped_bytes += other.mapped_bytes;
    resident_bytes += other.resident_bytes;
    return *this;
  }
};

class CachingAllocator {
 public:
  // The backend and the observer must outlive the allocator. `observer` may be null.
  CachingAllocator(DeviceBackend& backend, AllocatorObserver* observer,
                   AllocatorOptions options = {});
  ~CachingAllocator();  // returns every cached byte to the backend; live blocks are leaked
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // Throws Error(kInvalidArgument) for size 0 or sizes that overflow rounding,
  // OutOfMemoryError (with the observer's account) when neither the cache nor the device nor
  // the cap allows it, Error(kInvalidStream / kDriverError) for backend failures.
  // block_bytes: a larger block to hand out for these `bytes` (an integration applying its own
  // rounding, e.g. torch's roundup_power2_divisions); requested stays `bytes`, allocated is the
  // block. 0: the policy's own rounding only.
  DevicePtr allocate(std::size_t bytes, StreamHandle stream, TagId tag = kUntagged,
                     std::size_t block_bytes = 0);
  // Allocates `bytes` at exactly `address`, which must lie with the whole rounded size in one
  // free block of `stream`'s heap for that size (e.g. restoring a checkpointed private pool).
  // Never asks the device for new ranges. Throws Error(kInvalidArgument) naming what holds the
  // bytes when they are not free, and the errors of allocate() for mapping failures.
  DevicePtr allocate_at(DevicePtr address, std::size_t bytes, StreamHandle stream,
                        TagId tag = kUntagged);
  // Throws Error(kInvalidPointer) for pointers we do not own and Error(kDoubleFree) for blocks
  // already freed; in both cases nothing changes.
  void deallocate(DevicePtr ptr);
  // Frees a block whose uses on other streams (record_stream) the caller has proven to be
  // ordered before any later work of the block's own stream — e.g. a CUDA graph capture in
  // which those streams were joined back into it: free at once, no events recorded.
  void deallocate_as_ordered(DevicePtr ptr);
  // The block holding ptr is also used on `stream`: its memory is reused only after work queued
  // there before the free has completed.
  void record_stream(DevicePtr ptr, StreamHandle stream);

  // Returns every cached byte the backend can take back (free segments, free pages).
  void empty_cache();
  // Completes pending cross-stream frees whose events finished (done implicitly on allocate).
  void process_completed_frees();
  // Returns once every old address handed to the helper thread (unmap_in_background) is
  // unmapped, so that the backend's mappings and call counts match the heap's view now.
  void finish_background_unmaps();

  void set_cap(std::size_t cap_bytes);  // 0 = no cap
  // AllocatorOptions::no_split from now on (blocks already split stay as they are).
  void set_no_split(bool no_split);
  std::size_t cap() const;

  // Queries.
  bool owns(DevicePtr ptr) const;
  AllocationInfo describe(DevicePtr ptr) const;  // throws kInvalidPointer like deallocate
  // The physical memory under an allocated block of the paged heap, chunk by chunk in address
  // order, each chunk mapped whole at `va` (the first and last may reach past the block): what a
  // CUDA IPC export shares (docs/ipc.md). Empty for a block of a backend segment. Throws
  // kInvalidPointer like describe, kNotSupported for a sleeping block (no memory behind it).
  std::vector<PhysicalPiece> physical_pieces(DevicePtr ptr) const;
  std::vector<SegmentInfo> segments() const;
  BlockCensus census() const;
  // The census's policy figures alone: the allocator's lock, no walk, never throws.
  PolicyFigures policy_figures() const;
  const AllocatorOptions& options() const;
  DeviceBackend& backend() const;

  // Sleep and wake by tag (docs/sleep.md; the paged heap only). sleep(): after waiting for the
  // device, the allocated blocks of `tags` go to sleep: their physical pages go back to the
  // device, their addresses stay reserved (every pointer stays valid for after the wake). Tags
  // in `offload` (each also in `tags`) are copied to host memory first and restored by wake();
  // the others' contents are discarded. Pages a sleeping block shares with a block that stays
  // awake, with free bytes, or with a block of another sleeping tag stay mapped (resident).
  // Refused with nothing changed (Error kInvalidArgument): an empty list, kUntagged, a tag
  // already asleep, `offload` not within `tags`, a block of the tags freed and still awaiting
  // other streams, a CUDA graph capture underway; kNotSupported without VMM. While asleep,
  // freeing, record_stream on or allocating under a sleeping tag throws kInvalidArgument.
  SleepResult sleep(std::span<const TagId> tags, std::span<const TagId> offload = {});
  // Wakes `tags` (empty: every sleeping tag): memory mapped again under every block, offloaded
  // contents copied back. A tag not asleep is refused (kInvalidArgument) with nothing changed;
  // too little device memory throws OutOfMemoryError and leaves the tags asleep, nothing lost
  // (wake again later).
  SleepResult wake(std::span<const TagId> tags = {});
  std::vector<TagId> sleeping_tags() const;
  bool is_asleep(DevicePtr ptr) const;  // the block starting at ptr is asleep
  // Frees the host memory kept from earlier sleeps for the next one.
  void release_sleep_host_memory();
  // Pins, now, host memory for offloading each of `tags` (its allocated bytes) and keeps it for
  // the next sleep, so that sleep pays only for the copy: an engine calls it once at start-up,
  // after loading its weights. Pinning runs outside the allocator's lock. Returns the bytes kept
  // ready for these tags (buffers already kept count). kNotSupported without VMM.
  std::size_t prepare_offload(std::span<const TagId> tags);
  std::size_t kept_sleep_host_bytes() const;  // host memory kept for the next sleep

  // The whole allocator sleeps (docs/sleep.md): a CUDA graph's private pool, i.e. the segment
  // heap over segments that can give their memory back and keep their address
  // (SleepableSegmentBackend). After waiting for the device, every segment's memory goes back,
  // free blocks included (a graph writes its intermediates there on every replay); every
  // address stays reserved and allocated blocks sleep (out of allocated/active, into sleeping).
  // With `offload` the allocated blocks' contents go to host memory first and come back on
  // wake_pool(); otherwise all contents come back undefined (a replay rewrites what the graph
  // computes). Refused with nothing changed: asleep already, a freed block still awaiting other
  // streams, a capture underway (kInvalidArgument); the paged heap, front caches, or segments
  // that cannot sleep (kNotSupported). While asleep, allocating, freeing and record_stream
  // throw kInvalidArgument.
  SleepResult sleep_pool(bool offload = false);
  // Memory again under every segment, at the same addresses; offloaded contents restored. Not
  // asleep (never slept, woken twice): kInvalidArgument. Too little memory: OutOfMemoryError,
  // the pool stays asleep with its host copies, nothing lost (wake_pool again later).
  SleepResult wake_pool();
  bool pool_asleep() const;

  // Forgets about a stream (e.g. destroyed): its cached blocks are returned to the backend;
  // blocks still allocated on it keep working until freed.
  void release_stream(StreamHandle stream);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
  AllocatorObserver* observer_ = nullptr;  // attached for the allocator's whole life
};

}  // namespace vramledger
