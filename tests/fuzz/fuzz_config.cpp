// Fuzz target: the configuration parser (allocator/config.cpp). Any input either parses or
// throws vramledger::Error(kInvalidArgument); what parses must survive to_string and parse back
// to the same string (the round trip config.hpp promises).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "allocator/config.hpp"
#include "allocator/errors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  vramledger::Config config;
  try {
    config = vramledger::parse_config(text);
  } catch (const vramledger::Error& error) {
    if (error.code() != vramledger::ErrorCode::kInvalidArgument) std::abort();
    return 0;
  }
  const std::string written = vramledger::to_string(config);
  if (vramledger::to_string(vramledger::parse_config(written)) != written) std::abort();
  return 0;
}
