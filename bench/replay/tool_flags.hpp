// Numeric command-line values of the replay tools (vramledger-replay, -report, -demo), checked
// before use: NaN, infinity, negative, fractional or out-of-range numbers are refused with a
// message, never cast (a cast of NaN or of an out-of-range double is undefined behaviour) or
// wrapped (a step count of 2^32 used to become 0).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>


namespace vramledger {

// Simulated device memory, in GiB: 1 MiB up to 4 TiB (the configuration's largest device).
inline constexpr double kMinCapacityGib = 1.0 / 1024;
inline constexpr double kMaxCapacityGib = 4096;

// Empty when `text` is a decimal number of GiB in [kMinCapacityGib, kMaxCapacityGib] (stored
// in `gib`), else why not.
std::string parse_capacity_gib(std::string_view text, double& gib);

// Empty when `text` is a whole decimal number in [min, max] (stored in `value`), else why not.
// No sign, no spaces, no hex.
std::string parse_whole_number(std::string_view text, std::uint64_t min, std::uint64_t max,
                               std::uint64_t& value);

}  // namespace vramledger
