#include "allocator/text_format.hpp"

#include <charconv>
#include <iterator>

namespace vramledger {
namespace {

// std::to_chars, not snprintf: the same text (to_chars with a precision is defined as printf's
// "%.2f"), without parsing a format and without the locale. Error messages and the ledger's
// account, which an out-of-memory error carries, are made of these figures, and snprintf was a
// quarter of the time of a program of failing requests (the allocation-ops fuzz target).
std::string with_unit(bool negative, std::uint64_t magnitude) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  char text[32];
  char* end = text;
  if (negative) *end++ = '-';
  if (magnitude < 1024) {
    end = std::to_chars(end, std::end(text), magnitude).ptr;
    return std::string(text, end) + " B";
  }
  double value = static_cast<double>(magnitude);
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < std::size(kUnits)) {
    value /= 1024.0;
    ++unit;
  }
  end = std::to_chars(end, std::end(text), value, std::chars_format::fixed, 2).ptr;
  return std::string(text, end) + " " + kUnits[unit];
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
  char text[24] = "0x";
  const char* end = std::to_chars(text + 2, std::end(text), value, 16).ptr;
  return std::string(text, static_cast<std::size_t>(end - text));
}

}  // namespace vramledger
