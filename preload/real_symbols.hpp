// The real loader functions and the real CUDA libraries behind the shim's interposed symbols.
#pragma once

namespace vramledger::preload {

using DlsymFn = void* (*)(void*, const char*);
using DlopenFn = void* (*)(const char*, int);

// glibc's own dlsym / dlopen, found with dlvsym (which the shim does not interpose): the shim
// exports both names, so a plain dlsym(RTLD_NEXT, "dlsym") would find the shim itself.
DlsymFn real_dlsym();
DlopenFn real_dlopen();

enum class Library { kDriver, kRuntime };  // libcuda.so.1, libcudart.so.*

// The definition of `name` that the shim's own export hides: the next one in the global search
// order, else the one in an already-loaded libcuda / libcudart (which may have been dlopen'd
// RTLD_LOCAL, out of the global scope). Nullptr when none is loaded.
void* next_definition(Library library, const char* name);

// Directory of this shared object, with a trailing '/', in a static buffer ("" if unknown).
const char* shim_directory();

}  // namespace vramledger::preload
