// Policy knobs. Parsed from a PYTORCH_CUDA_ALLOC_CONF-style string by allocator/config.hpp.
#pragma once

#include <cstddef>
#include <cstdint>

namespace vramledger {

struct AllocatorOptions {
  // Requests are rounded up to a multiple of this (bytes, power of two).
  std::size_t round_bytes = 512;
  // Per-thread front caches (docs/design.md, 5.2): the most bytes of freed blocks each thread
  // keeps for itself, by stream and exact size, in front of the heaps; 0 = off. Blocks up to a
  // quarter of it enter. Needs an observer with shards (the Ledger) or none. Off by default
  // until measured on a GPU: parked blocks are cached memory no other stream can use before an
  // empty_cache or an out-of-memory retry returns them.
  std::size_t front_cache_bytes = 0;
  // Requests of at most this many bytes come from the small pool. 0 picks the heap's default:
  // 1 MiB for the segment heap (PyTorch's), 64 KiB for the paged heap, where pages are shared by
  // neighbours anyway and a low limit measured best on the trace corpus (bench/results/).
  std::size_t small_size_limit = 0;
  // Segment heap: segment sizes for small requests and the minimum for large ones; large requests
  // above large_segment_bytes get a segment rounded to round_large_segment_bytes.
  std::size_t small_segment_bytes = 2u << 20;
  std::size_t large_segment_bytes = 20u << 20;
  std::size_t round_large_segment_bytes = 2u << 20;
  // Segment heap: a free block larger than a request by more than this is not split (avoids
  // carving big cached blocks into slivers); 0 = always split.
  std::size_t max_split_bytes = 0;
  // Paged heap: page size (a multiple of the backend granularity; 0 = granularity) and the size
  // of each virtual span reserved per stream and pool (0 = 2x device memory).
  std::size_t page_bytes = 0;
  std::size_t span_bytes = 0;
  // Paged heap: free mapped pages kept before idle ones are unmapped (their physical memory then
  // waits in the free physical pool), and free unmapped physical pages kept before they are
  // released to the driver. Unlimited by default: like PyTorch, cache until memory is needed —
  // pages are taken back from other ranges on demand anyway.
  std::size_t max_free_mapped_bytes = SIZE_MAX;
  std::size_t max_free_physical_bytes = SIZE_MAX;
  // Paged heap: the largest piece of physical memory created and mapped at once. A run of pages
  // an allocation needs is filled with as few chunks as possible: the driver's cost is per
  // mapping, not per byte (bench/results/gpu/), but a chunk is unmapped only as a whole, so
  // idle memory moves between addresses in coarser pieces. page_bytes (or less) = page by page.
  // 4 MiB: 16 MiB pinned idle pages at the peak (Llama-style training 1.027 on the H200;
  // bench/results/2026-12-02-replay-map-chunk.md).
  std::size_t map_chunk_bytes = std::size_t{4} << 20;
  // Paged heap: idle pages are taken from the requesting stream's own addresses first, then from
  // other streams'. Before the latter (an unmap and a map each), grow reserved memory while it
  // stays within this many thousandths above the peak of active bytes, so streams that pass work
  // to each other keep their own pages; 0 = always take. On real training with inputs made on a
  // side stream (H200) a slack of 2% took steps from 1.80x to 0.98x native's time (unmaps 2,513
  // -> 146) for a peak of 1.0099 instead of 1.0024 of peak requested (docs/configuration.md).
  // Per mille (keys cross_stream_slack_pct and cross_stream_slack_permille), since the default
  // of 1% by construction holds the two-stream trace at ~1.01 and 0.5% is worth measuring
  // (bench/results/2026-12-02-replay-placement-candidates.md).
  std::size_t cross_stream_slack_permille = 10;
  // Paged heap: beyond the slack, another stream's idle pages are taken only once that stream
  // has served this many allocations since they became idle (or has made none over its last 8
  // looks: a quiet stream), and its pages still in use are aliased only from a quiet stream;
  // 0 = any idle page is taken. The rule applies only while at least
  // cross_stream_cold_streams streams allocate (below). For many threads each allocating on its
  // own stream, which otherwise hand pages back and forth under the allocator's lock (an unmap
  // and a map each): 1024 cut the mixed ring's driver calls at 16 threads from 9.6-15 to 1.8 per
  // thousand pairs (simulated device), while each stream keeps its working set.
  std::size_t cross_stream_cold_allocations = 1024;
  // The cold rule applies while at least this many streams allocate (the one asking, and those
  // that allocated within the last 8 looks at other streams); 2 or less = always. Two streams
  // that pass work to each other (a side stream making the main stream's inputs) trade pages
  // within the slack at a step's pace: under the rule each keeps its working set and the corpus's
  // two-stream trace went from 1.0099 to 1.0333 of peak requested, hence 3 by default
  // (docs/configuration.md).
  std::size_t cross_stream_cold_streams = 3;
  // Lanes per stream (docs/design.md 4): heaps of its own, on the same stream, for a thread kept
  // waiting for its stream's lock by other threads of the stream. 1 = no lanes (threads of one
  // stream share its heaps: less memory cached, more waiting); at most 32.
  std::size_t stream_lanes = 32;
  // Hard cap on reserved (physical) bytes; 0 = none.
  std::size_t cap_bytes = 0;
  // Segment heap: never split a block, so every allocation owns a whole segment sized to it
  // (torch.cuda.MemPool(no_split=True), e.g. for memory NCCL registers segment by segment).
  bool no_split = false;
  // Use the paged heap when the backend supports virtual memory.
  bool use_paged_heap = true;
  // Paged heap: when a stream needs pages and its own free pages are still used by work queued
  // before their free, map their physical memory at the new address too instead of growing
  // (stream order makes the new use safe); the old address is unmapped once that work has
  // finished, and is not used until then. Without it, which pages are reusable depends on how far
  // the GPU has got (docs/configuration.md).
  bool alias_pending_pages = true;
  // Paged heap: a chunk moved to a new address is mapped there first and unmapped at its old
  // address by a helper thread, off the allocating thread (a move was ~55 us of its time on the
  // H200, a third of it the unmap); the old address is unusable until then. Off: the allocating
  // thread unmaps first, then maps (detail/background_unmaps.hpp, docs/configuration.md).
  bool unmap_in_background = true;
  // Before growing, a stream's blocks still awaiting other streams (record_stream) are made
  // reusable by queueing a GPU-side wait on those streams' events (stream-ordered reuse, as
  // cudaMallocAsync's internal dependencies) instead of waiting for the CPU to see them complete.
  bool adopt_pending_frees = true;
  // Paged heap: when the best fit needs new pages, an allocation of 8 pages or more may go
  // anywhere in a candidate free block — its back, or where a run of mapped pages starts —
  // whichever needs the fewest new pages. On the lag replays: 25-30% fewer map + unmap calls
  // than front placement at the same peak reserved; but on real GPT-2 training on the H200 it
  // made more (3,978 maps and 1,149 unmaps against 3,603 and 733), so it is off
  // (docs/configuration.md).
  bool place_by_mapped_pages = false;
  // torch plugin, VMM backend: CUDA graph private pools are built from sleepable segments (one
  // address reservation + one physical chunk each), so sleep(tags=[..., "graphs"]) can release
  // them and a captured graph replays after the wake. Off by default: graph pools are then
  // cudaMalloc segments, as in PyTorch, which PyTorch's own graph tests were checked against
  // (docs/sleep.md).
  bool sleepable_graph_pools = false;
};

}  // namespace vramledger
