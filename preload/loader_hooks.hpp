// The C side of the dlsym / dlopen interposition (loader_stubs.S holds the exported symbols).
#pragma once

namespace vramledger::preload {

// Points the stubs at glibc (and dlopen at the torch watch when `watch_torch`). Called from the
// shim's constructor; before it runs, the stubs use slow paths that resolve glibc lazily.
void init_loader_hooks(bool watch_torch);
// dlopen goes straight to glibc again (after the torch watch has done its work).
void stop_dlopen_watch();

}  // namespace vramledger::preload
