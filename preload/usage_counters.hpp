// Per-category live bytes and peaks plus the shim's health counters, all atomics, so hooks on
// any thread update them without locks and vramledger_preload_stats reads them at any time.
#pragma once

#include <cstdint>

#include "preload/allocation_table.hpp"
#include "preload/vramledger_preload.h"

namespace vramledger::preload {

// A successful allocation of `bytes` by `category` under `key`.
void record_allocation(KeyKind kind, std::uint64_t key, std::uint64_t bytes, Category category);
// A successful free of `key` (any category: the record says which).
void record_free(KeyKind kind, std::uint64_t key);
void record_failed_allocation(Category category);

void count_intercepted_call();
void count_unwrapped_lookup();
void add_overhead_ns(std::uint64_t ns);
void set_torch_install_state(int state);

void fill_stats(vramledger_preload_stats* out);
std::uint64_t overhead_ns();

}  // namespace vramledger::preload
