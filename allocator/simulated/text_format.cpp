#include "allocator/simulated/text_format.hpp"

#include <cstdio>
#include <iterator>

namespace vramledger::simulated_detail {

std::string hex_address(std::uintptr_t address) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "0x%llx", static_cast<unsigned long long>(address));
  return buffer;
}

std::string byte_count(std::size_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  std::string text = std::to_string(bytes) + " bytes";
  if (bytes < 1024) return text;
  double scaled = static_cast<double>(bytes);
  std::size_t unit = 0;
  scaled /= 1024.0;
  while (scaled >= 1024.0 && unit + 1 < std::size(kUnits)) {
    scaled /= 1024.0;
    ++unit;
  }
  char buffer[48];
  std::snprintf(buffer, sizeof buffer, " (%.2f %s)", scaled, kUnits[unit]);
  return text + buffer;
}

}  // namespace vramledger::simulated_detail
