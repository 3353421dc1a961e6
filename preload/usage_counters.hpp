// Per-category live bytes and peaks plus the shim's health counters, all atomics, so hooks on
// any thread update them without locks and vramledger_preload_stats reads them at any time.
#pragma once

#include <cstdint>

#include "preload/allocation_table.hpp"
#include "abi/vramledger_preload.h"

namespace vramledger::preload {

// A successful allocation of `bytes` by `category` under `key`.
// routed: served by the routed cache rather than the driver.
void record_allocation(KeyKind kind, std::uint64_t key, std::uint64_t bytes, Category category,
                       bool routed = false);
// A free in two steps, so that no other thread can be handed the same address between the real
// free and its bookkeeping (a cache reuses addresses at once): the record is taken out of the
// table before the real call, then either accounted as freed or put back.
bool take_record(KeyKind kind, std::uint64_t key, AllocationRecord* out);
void account_free(const AllocationRecord& record);
void restore_record(KeyKind kind, std::uint64_t key, const AllocationRecord& record);
void count_untracked_free();
void record_failed_allocation(Category category);

void count_intercepted_call();
void count_unwrapped_lookup();
void add_overhead_ns(std::uint64_t ns);
void set_torch_install_state(int state);

void fill_stats(vramledger_preload_stats* out);
std::uint64_t overhead_ns();

}  // namespace vramledger::preload
