// How vramledger writes byte counts and addresses in every message and report, in one place, so
// a figure in an error reads the same as in the ledger's account.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace vramledger {

// "1.50 GiB", "512 B", "-4.00 KiB": binary units, two decimals (docs/stats.md). Signed: a
// ledger line is negative when an event is missing, and is printed so.
std::string format_bytes(std::int64_t bytes);
// The same for sizes, whose full unsigned range must print right ("16.00 EiB" for SIZE_MAX).
std::string format_size(std::size_t bytes);
// For error messages: "3.00 MiB (3145728 bytes)" from 1 MiB on, "4096 bytes" below; the exact
// count because users compare it with what they asked for.
std::string format_bytes_exact(std::size_t bytes);
// "0x7f0000200000": device addresses and stream handles.
std::string format_hex(std::uint64_t value);

}  // namespace vramledger
