// Fuzz target: the LD_PRELOAD shim's VRAMLEDGER_PRELOAD_ROUTE parser (preload/route_setting.cpp),
// which runs in the shim's load-time constructor of every program `vramledger run` starts. Any
// text either routes a set of libraries (never torch, vramledger itself or the routed cache; "1"
// and "all" exactly their documented sets) or is refused with a message that is NUL-terminated
// within the buffer, names the setting, and echoes only printable bytes; a refusal changes
// nothing.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "preload/route_setting.hpp"

using vramledger::preload::kCategoryCount;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);  // cut at the first NUL
  bool wanted[kCategoryCount] = {};
  char error[256];
  std::memset(error, 'x', sizeof error);
  const bool routed = vramledger::preload::parse_route_setting(text.c_str(), wanted, error,
                                                               sizeof error);
  if (routed) {
    if (wanted[VRAMLEDGER_PRELOAD_TORCH] || wanted[VRAMLEDGER_PRELOAD_VRAMLEDGER] ||
        wanted[VRAMLEDGER_PRELOAD_ROUTED_CACHE]) {
      std::abort();
    }
    bool any = false;
    for (bool w : wanted) any = any || w;
    if (!any) std::abort();  // accepted, yet nothing routed
    if (std::strcmp(text.c_str(), "1") == 0 && wanted[VRAMLEDGER_PRELOAD_NCCL]) std::abort();
    if (std::strcmp(text.c_str(), "all") == 0 && !wanted[VRAMLEDGER_PRELOAD_NCCL]) std::abort();
    return 0;
  }
  for (bool w : wanted) {
    if (w) std::abort();  // a refusal changed the routed set
  }
  const void* end = std::memchr(error, '\0', sizeof error);
  if (end == nullptr) std::abort();
  if (std::strncmp(error, "VRAMLEDGER_PRELOAD_ROUTE=", 25) != 0) std::abort();
  for (const char* c = error; c != end; ++c) {
    const auto byte = static_cast<unsigned char>(*c);
    if (byte < 0x20 || byte >= 0x7f) std::abort();  // a control byte echoed to the terminal
  }
  return 0;
}
