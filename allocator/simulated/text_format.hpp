// Small formatting helpers so every simulated-device message names numbers the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vramledger::simulated_detail {

// "0x7f0000200000"
std::string hex_address(std::uintptr_t address);
// "3145728 bytes (3.00 MiB)"; the exact count first because tests and users compare it.
std::string byte_count(std::size_t bytes);

}  // namespace vramledger::simulated_detail
