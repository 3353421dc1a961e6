#include "allocator/simulated/text_format.hpp"

#include "allocator/text_format.hpp"

namespace vramledger::simulated_detail {

std::string hex_address(std::uintptr_t address) { return format_hex(address); }

std::string byte_count(std::size_t bytes) {
  std::string text = std::to_string(bytes) + " bytes";
  if (bytes < 1024) return text;
  return text + " (" + format_size(bytes) + ")";
}

}  // namespace vramledger::simulated_detail
