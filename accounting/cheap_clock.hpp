// The ledger timestamps every event, so reading the clock must cost a few nanoseconds. Two cheap
// sources, chosen per ledger: the CPU's cycle counter (precise; its cost varies from ~1 ns
// overlapped on bare metal to ~15 ns under some hypervisors) and the kernel's coarse monotonic
// clock (a few ns through the vDSO, but only as fine as a scheduler tick, 1-4 ms). Converting
// ticks to seconds happens lazily, off the hot path, when a trace is written or a report printed.
#pragma once

#include <chrono>
#include <cstdint>
#include <ctime>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace vramledger {

enum class ClockSource : std::uint8_t {
  kCycleCounter,     // TSC on x86 (invariant: constant rate, synchronised across cores), cntvct on arm64
  kCoarseMonotonic,  // CLOCK_MONOTONIC_COARSE in nanoseconds
  kNone,             // no time at all: records are ordered by their sequence only
};

inline std::uint64_t cycle_counter_now() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#elif defined(__aarch64__)
  std::uint64_t value;
  asm volatile("mrs %0, cntvct_el0" : "=r"(value));
  return value;
#else
  return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
#endif
}

inline std::uint64_t coarse_monotonic_now_ns() noexcept {
#if defined(CLOCK_MONOTONIC_COARSE)
  timespec now;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &now);
  return static_cast<std::uint64_t>(now.tv_sec) * 1'000'000'000u +
         static_cast<std::uint64_t>(now.tv_nsec);
#else
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
#endif
}

inline std::uint64_t read_clock(ClockSource source) noexcept {
  switch (source) {
    case ClockSource::kCycleCounter: return cycle_counter_now();
    case ClockSource::kCoarseMonotonic: return coarse_monotonic_now_ns();
    case ClockSource::kNone: break;
  }
  return 0;
}

// Ticks per second of `source` (0 for kNone). For the cycle counter on x86 it is measured once
// per process, so the first call takes ~10 ms.
std::uint64_t ticks_per_second(ClockSource source);

// A tick value paired with the wall-clock time at which it was read, so that trace times can be
// shown as calendar times later.
struct ClockOrigin {
  std::uint64_t ticks = 0;
  std::uint64_t unix_ns = 0;
};
ClockOrigin capture_clock_origin(ClockSource source) noexcept;

}  // namespace vramledger
