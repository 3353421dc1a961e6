// Allocator configuration from a PYTORCH_CUDA_ALLOC_CONF-style string.
//
// Syntax: comma-separated `key:value` pairs; whitespace around keys, values and commas is
// ignored; an empty (or blank) string means all defaults. Each key may appear once.
//
//   backend               auto | simulated | cuda_malloc | vmm | malloc_async
//   round_bytes           request rounding in bytes; a power of two
//   small_size_limit_kb   largest small-pool request, KiB (0 = every request uses the large pool)
//   small_segment_mb      small-pool segment size, MiB (> 0, and >= small_size_limit_kb)
//   large_segment_mb      minimum large-pool segment size, MiB (> 0)
//   max_split_mb          cached blocks larger than a request by more than this are not split,
//                         MiB (0 = always split)
//   page_mb               paged heap page size, MiB (0 = the backend's granularity)
//   span_gb               paged heap span size, GiB (0 = twice the device memory)
//   max_free_mapped_mb    free mapped pages kept, MiB, or `unlimited` (0 = unmap at once)
//   max_free_physical_mb  free physical pages kept, MiB, or `unlimited` (0 = release at once)
//   map_chunk_mb          paged heap: largest physical chunk created and mapped at once, MiB
//                         (> 0; at most one page = map page by page)
//   cross_stream_slack_pct  paged heap: grow up to this percentage above the peak of active
//                         bytes before taking idle pages from another stream (0 = always take)
//   cross_stream_slack_permille  the same in thousandths (5 = 0.5%); give one of the two
//   cap_mb | cap_gb       cap on reserved bytes (0 = none); give one of the two
//   paged_heap            true | false (case-insensitive)
//   alias_pending_pages   true | false (default true): paged heap, reuse a stream's own pages
//                         whose last use is still queued at a new address by mapping them there
//   adopt_pending_frees   true | false (default true): before growing, make a stream wait on the
//                         GPU for other streams' uses of its pending frees and reuse them
//   place_by_mapped_pages true | false (default false): paged heap, place an allocation of 8
//                         pages or more where a free block's mapped pages are
//   sleepable_graph_pools true | false (default false): torch plugin on the VMM backend, CUDA graph
//                         pools that sleep(tags=[..., "graphs"]) can release (docs/sleep.md)
//   front_cache_mb        per-thread front caches: freed bytes each thread keeps for itself, by
//                         stream and exact size, MiB (0 = off, the default; docs/design.md 5.2)
//
// Units are binary: KiB = 2^10, MiB = 2^20, GiB = 2^30 bytes. Numbers are unsigned decimal
// integers. AllocatorOptions fields without a key keep their defaults.
//
// Every number is bounded by what a device can mean: round_bytes and page_mb at most 1 GiB,
// span_gb at most 8 TiB, cross_stream_slack_pct at most 10000 (_permille 100000), every other size at most 4 TiB
// (more memory than any device has). (A page, at most 1 GiB, always fits a span of >= 1 GiB.)
#pragma once

#include <string>
#include <string_view>

#include "allocator/allocator_options.hpp"

namespace vramledger {

struct Config {
  std::string backend = "auto";
  AllocatorOptions options;
};

// Throws Error(ErrorCode::kInvalidArgument) naming the offending key and value for unknown or
// duplicate keys, missing values, values that are not (non-negative, in-range) numbers, values
// beyond the bounds above, a round_bytes that is not a power of two, 0 where 0 means nothing,
// and unknown backends.
Config parse_config(std::string_view text);

// Every key, in the order of the table above, e.g. "backend:auto,round_bytes:512,...".
// parse_config(to_string(c)) reproduces c. Throws Error(kInvalidArgument) when c holds a value
// the syntax cannot express (not a whole number of the key's unit, one parse_config would
// reject, or a non-default field that has no key), rather than writing a string that would not
// round-trip.
std::string to_string(const Config& config);

}  // namespace vramledger
