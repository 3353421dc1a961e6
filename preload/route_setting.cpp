#include "preload/route_setting.hpp"

#include <cstdio>
#include <cstring>

namespace vramledger::preload {

namespace {

// Routed by default: every non-torch library but NCCL, which shares its buffers with other
// processes through cudaIpcGetMemHandle; a handle names a whole driver allocation, and a routed
// pointer is a piece of one (the receiver would map the wrong bytes). "all" adds NCCL.
constexpr Category kRoutedByDefault[] = {VRAMLEDGER_PRELOAD_CUBLAS, VRAMLEDGER_PRELOAD_CUDNN,
                                         VRAMLEDGER_PRELOAD_TRITON, VRAMLEDGER_PRELOAD_JIT,
                                         VRAMLEDGER_PRELOAD_USER, VRAMLEDGER_PRELOAD_UNKNOWN};

// The echo of user text in a message: at most 64 bytes, control and non-ASCII bytes as '?', so
// an environment variable cannot write escape sequences to the terminal through the log line.
constexpr std::size_t kEchoBytes = 64;
void printable(const char* text, std::size_t length, char (&out)[kEchoBytes + 4]) {
  const std::size_t shown = length < kEchoBytes ? length : kEchoBytes;
  for (std::size_t i = 0; i < shown; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    out[i] = byte >= 0x20 && byte < 0x7f ? static_cast<char>(byte) : '?';
  }
  std::size_t end = shown;
  if (shown < length) {
    for (int i = 0; i < 3; ++i) out[end++] = '.';
  }
  out[end] = '\0';
}

int category_by_name(const char* name, std::size_t length) {
  if (length == 3 && std::strncmp(name, "jit", 3) == 0) return VRAMLEDGER_PRELOAD_JIT;
  for (int c = 0; c < kCategoryCount; ++c) {
    const char* known = category_name(c);
    if (std::strlen(known) == length && std::strncmp(known, name, length) == 0) return c;
  }
  return -1;
}

bool routable(int category) {
  return category >= 0 && category != VRAMLEDGER_PRELOAD_TORCH &&
         category != VRAMLEDGER_PRELOAD_VRAMLEDGER && category != VRAMLEDGER_PRELOAD_ROUTED_CACHE;
}

}  // namespace

bool parse_route_setting(const char* text, bool (&wanted)[kCategoryCount], char* error,
                         std::size_t error_size) {
  bool chosen[kCategoryCount] = {};
  if (std::strcmp(text, "1") == 0 || std::strcmp(text, "all") == 0) {
    for (Category c : kRoutedByDefault) chosen[c] = true;
    if (text[0] == 'a') chosen[VRAMLEDGER_PRELOAD_NCCL] = true;
  } else {
    const char* at = text;
    while (true) {
      const char* end = std::strchr(at, ',');
      const std::size_t length =
          end != nullptr ? static_cast<std::size_t>(end - at) : std::strlen(at);
      const int c = category_by_name(at, length);
      if (!routable(c)) {
        char setting[kEchoBytes + 4];
        char name[kEchoBytes + 4];
        printable(text, std::strlen(text), setting);
        printable(at, length, name);
        std::snprintf(error, error_size,
                      "VRAMLEDGER_PRELOAD_ROUTE=%s: '%s' is not a routable library (1, all, or "
                      "a list of: nccl,cublas,cudnn,triton,jit,user,unknown)",
                      setting, name);
        return false;
      }
      chosen[c] = true;
      if (end == nullptr) break;
      at = end + 1;
    }
  }
  for (int c = 0; c < kCategoryCount; ++c) wanted[c] = wanted[c] || chosen[c];
  return true;
}

}  // namespace vramledger::preload
