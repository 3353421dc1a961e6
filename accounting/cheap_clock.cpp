#include "accounting/cheap_clock.hpp"

#include <thread>

namespace vramledger {
namespace {

std::uint64_t measure_cycle_counter_rate() {
#if defined(__aarch64__)
  std::uint64_t frequency;
  asm volatile("mrs %0, cntfrq_el0" : "=r"(frequency));
  return frequency;
#elif defined(__x86_64__) || defined(__i386__)
  // Calibrated against steady_clock over a short sleep; 10 ms gives ~1e-4 relative precision,
  // plenty for timelines.
  using Clock = std::chrono::steady_clock;
  const auto start_time = Clock::now();
  const std::uint64_t start_ticks = cycle_counter_now();
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto end_time = Clock::now();
  const std::uint64_t end_ticks = cycle_counter_now();
  const auto elapsed_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(end_time - start_time).count();
  if (elapsed_ns <= 0) return 1'000'000'000;
  const long double rate = static_cast<long double>(end_ticks - start_ticks) * 1e9L /
                           static_cast<long double>(elapsed_ns);
  return rate < 1 ? 1 : static_cast<std::uint64_t>(rate);
#else
  using Period = std::chrono::steady_clock::period;
  return static_cast<std::uint64_t>(Period::den / Period::num);
#endif
}

}  // namespace

std::uint64_t ticks_per_second(ClockSource source) {
  switch (source) {
    case ClockSource::kCycleCounter: {
      static const std::uint64_t rate = measure_cycle_counter_rate();
      return rate;
    }
    case ClockSource::kCoarseMonotonic: return 1'000'000'000;
    case ClockSource::kNone: break;
  }
  return 0;
}

ClockOrigin capture_clock_origin(ClockSource source) noexcept {
  ClockOrigin origin;
  origin.ticks = read_clock(source);
  const auto since_epoch = std::chrono::system_clock::now().time_since_epoch();
  origin.unix_ns = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch).count());
  return origin;
}

}  // namespace vramledger
