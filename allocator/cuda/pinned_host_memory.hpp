// Pinned host memory for offloading sleeping tags (docs/sleep.md, "Host memory"). Pinning is the
// cost of a first sleep: cudaHostAlloc of 8 GiB took 5.2 s on the H200 (bench/sleep, commit
// 829973a) against 0.2 s for the copy itself, because the kernel faults, zeroes and pins 4 KiB
// pages one at a time on one thread. Two ways, chosen by VRAMLEDGER_SLEEP_PIN:
//
//   host_alloc (default)  cudaHostAlloc, as before.
//   register              an anonymous mapping asked for transparent huge pages, faulted in from
//                         several threads at once (VRAMLEDGER_SLEEP_PIN_THREADS, default: the
//                         cores, at most 16), then one cudaHostRegister over all of it: the
//                         driver pins pages that already exist, 2 MiB at a time where the kernel
//                         gave huge pages.
//
// Faulting 2 GiB on the 2-core development VM: 1.8–2.8 s in 4 KiB pages, 0.35–0.6 s with huge
// pages (/tmp program in the issue-17 report; noisy shared VM). Which way pins faster on the GPU
// machine is measured by bench/sleep/bench_sleep.py, which runs vramledger with each.
#pragma once

#include <cstddef>
#include <string>

#include "allocator/errors.hpp"

namespace vramledger {

enum class PinMethod { kHostAlloc, kRegister };

// VRAMLEDGER_SLEEP_PIN: unset or "host_alloc" -> kHostAlloc, "register" -> kRegister; anything
// else is an Error naming the accepted values.
PinMethod pin_method_from_environment();
std::string to_string(PinMethod method);

// Host memory of `bytes` the device copies to and from at full speed; free it with free_pinned.
// The current CUDA device must be set (cudaHostRegister and cudaHostAlloc map it for every
// device anyway). On failure nothing is held.
Status allocate_pinned(std::size_t bytes, PinMethod method, void** out);
Status free_pinned(void* host);

// The pre-faulting step of kRegister on its own (no CUDA): maps `bytes` of anonymous memory,
// asks for huge pages and touches every 4 KiB page from `threads` threads. Returns null on
// failure (errno set by mmap). Release with unmap_prefaulted.
void* map_prefaulted(std::size_t bytes, unsigned threads);
void unmap_prefaulted(void* data, std::size_t bytes);
unsigned default_pin_threads();

}  // namespace vramledger
