#include "allocator/text_format.hpp"

#include <cinttypes>
#include <cstdio>
#include <iterator>

namespace vramledger {
namespace {

std::string with_unit(bool negative, std::uint64_t magnitude) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  char text[32];
  if (magnitude < 1024) {
    std::snprintf(text, sizeof(text), "%s%" PRIu64 " B", negative ? "-" : "", magnitude);
    return text;
  }
  double value = static_cast<double>(magnitude);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  std::snprintf(text, sizeof(text), "%s%.2f %s", negative ? "-" : "", value, kUnits[unit]);
  return text;
}

}  // namespace

std::string format_bytes(std::int64_t bytes) {
  const bool negative = bytes < 0;
  // Unsigned magnitude: -INT64_MIN does not fit in int64_t.
  return with_unit(negative, negative ? ~static_cast<std::uint64_t>(bytes) + 1
                                      : static_cast<std::uint64_t>(bytes));
}

std::string format_size(std::size_t bytes) { return with_unit(false, bytes); }

std::string format_bytes_exact(std::size_t bytes) {
  const std::string exact = std::to_string(bytes) + " bytes";
  if (bytes < (std::size_t{1} << 20)) return exact;
  return with_unit(false, bytes) + " (" + exact + ")";
}

std::string format_hex(std::uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof(text), "0x%" PRIx64, value);
  return text;
}

}  // namespace vramledger
