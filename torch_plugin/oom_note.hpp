// A caller-supplied sentence appended to vramledger's OutOfMemoryError message, per device.
//
// The budget board (python/vramledger/board, docs/board.md) caps a process at its claim; when
// that cap refuses an allocation, the user needs to see who else holds the GPU. The board is
// read in Python, so Python keeps this note current (vramledger_set_oom_note, refreshed with
// each publish) and the OOM path only copies a string: it never reads shared memory or takes
// more than one short lock while failing.
#pragma once

#include <string>

namespace vramledger::torch_plugin {

// Empty text removes the note. device: a CUDA device index >= 0.
void set_oom_note(int device, std::string text);
std::string oom_note(int device);

}  // namespace vramledger::torch_plugin
