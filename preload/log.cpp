#include "preload/log.hpp"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace vramledger::preload {

void log_line(const char* format, ...) {
  const char* setting = std::getenv("VRAMLEDGER_PRELOAD_LOG");
  if (setting != nullptr && std::strcmp(setting, "1") != 0) return;
  char line[1024] = "vramledger-preload: ";
  const size_t prefix = std::strlen(line);
  va_list args;
  va_start(args, format);
  std::vsnprintf(line + prefix, sizeof(line) - prefix - 1, format, args);
  va_end(args);
  const size_t length = std::strlen(line);
  line[length] = '\n';
  ssize_t ignored = write(STDERR_FILENO, line, length + 1);
  (void)ignored;
}

}  // namespace vramledger::preload
