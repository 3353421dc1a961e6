// The shim's log lines: one at load, one for the torch install. To stderr with write(2) (no
// stdio buffers to flush at exit), unless VRAMLEDGER_PRELOAD_LOG=0.
#pragma once

namespace vramledger::preload {

void log_line(const char* format, ...) __attribute__((format(printf, 1, 2)));

}  // namespace vramledger::preload
