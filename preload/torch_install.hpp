// Installing the vramledger torch allocator when torch's CUDA library appears
// (VRAMLEDGER_PRELOAD_INSTALL_TORCH=1; docs/preload.md says why it is opt-in).
#pragma once

extern "C" {
// dlopen while waiting for libc10_cuda: glibc's dlopen, then, once libc10_cuda is loaded, the
// plugin is loaded and vramledger_install() called — before torch can allocate, since torch's
// first allocation needs code that only runs after this dlopen returns.
__attribute__((visibility("hidden"))) void* dlopen_watching_for_torch(const char* file, int mode);
}

namespace vramledger::preload {

// The plugin to load: $VRAMLEDGER_TORCH_PLUGIN, else libvramledger_torch.so next to the shim.
const char* torch_plugin_path();

}  // namespace vramledger::preload
