// Knobs of the stress tests, read from the environment so a failing run can be replayed (seed)
// and so sanitizer builds can run fewer operations (scripts/run_tests.sh sets them).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace vramledger::stress {

// The value of environment variable `name` as an unsigned number, or `fallback` when unset or
// empty. Accepts decimal or 0x-prefixed hexadecimal; anything else aborts the test run loudly,
// because a silently ignored seed would make a "replay" test something else.
inline std::uint64_t env_u64(const char* name, std::uint64_t fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 0);
  if (end == text || *end != '\0') {
    throw std::invalid_argument(std::string(name) + "='" + text + "' is not a number");
  }
  return value;
}

}  // namespace vramledger::stress
