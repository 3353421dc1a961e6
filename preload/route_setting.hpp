// VRAMLEDGER_PRELOAD_ROUTE, parsed: which libraries' allocations the routing mode serves from
// vramledger's cache. Separate from routing.cpp (which loads the cache) so the parser can be
// fuzzed on its own (tests/fuzz/fuzz_route_setting.cpp). libc only, no allocation: it runs in the
// shim's load-time constructor.
#pragma once

#include <cstddef>

#include "preload/categories.hpp"

namespace vramledger::preload {

// "1" (every non-torch library but NCCL), "all" (NCCL too), or a comma-separated list of
// category names (nccl,cublas,cudnn,triton,jit,user,unknown). On success sets wanted[c] for each
// routed category (others untouched) and returns true; otherwise writes a reason naming the
// setting and the bad name into `error` (always NUL-terminated, at most error_size bytes, the
// echoed text cut at 64 bytes with control bytes written as '?') and leaves `wanted` unchanged.
bool parse_route_setting(const char* text, bool (&wanted)[kCategoryCount], char* error,
                         std::size_t error_size);

}  // namespace vramledger::preload
