// tool_flags.hpp's checks as CLI11 validators, for the tools built with CLI11. The value is
// checked as text, before CLI11 converts it (CLI11's own PositiveNumber and Range let NaN
// through: every comparison with NaN is false).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "bench/replay/tool_flags.hpp"

namespace vramledger {

inline CLI::Validator capacity_gib_validator() {
  return CLI::Validator(
      [](std::string& text) {
        double gib = 0;
        return parse_capacity_gib(text, gib);
      },
      "GIB");
}

inline CLI::Validator whole_number_validator(std::uint64_t min, std::uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) {
        std::uint64_t value = 0;
        return parse_whole_number(text, min, max, value);
      },
      "N");
}

}  // namespace vramledger
