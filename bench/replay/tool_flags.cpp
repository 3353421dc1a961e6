#include "bench/replay/tool_flags.hpp"

#include <charconv>
#include <cmath>
#include <system_error>

namespace vramledger {

namespace {
// Appended piecewise: GCC 12 at -O3 warns (-Wrestrict, a false positive) on "'" + string + "'".
std::string quote(std::string_view text) {
  std::string quoted;
  quoted.reserve(text.size() + 2);
  quoted.push_back('\'');
  quoted.append(text);
  quoted.push_back('\'');
  return quoted;
}
}  // namespace

std::string parse_capacity_gib(std::string_view text, double& gib) {
  const std::string quoted = quote(text);
  double value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value,
                                            std::chars_format::fixed | std::chars_format::scientific);
  if (text.empty() || error == std::errc::invalid_argument || end != text.data() + text.size()) {
    return "expected a number of GiB, got " + quoted;
  }
  // from_chars reads "nan" and "inf" too; out-of-range exponents are result_out_of_range.
  if (error == std::errc::result_out_of_range || !std::isfinite(value) ||
      value < kMinCapacityGib || value > kMaxCapacityGib) {
    return "must be a finite number of GiB from 0.0009765625 (1 MiB) to 4096 (4 TiB), got " +
           quoted;
  }
  gib = value;
  return {};
}

std::string parse_whole_number(std::string_view text, std::uint64_t min, std::uint64_t max,
                               std::uint64_t& value) {
  const std::string quoted = quote(text);
  std::uint64_t parsed = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), parsed);
  const std::string range = "between " + std::to_string(min) + " and " + std::to_string(max);
  if (text.empty() || error == std::errc::invalid_argument || end != text.data() + text.size()) {
    return "expected a whole number " + range + ", got " + quoted;
  }
  if (error == std::errc::result_out_of_range || parsed < min || parsed > max) {
    return "must be " + range + ", got " + quoted;
  }
  value = parsed;
  return {};
}

}  // namespace vramledger
