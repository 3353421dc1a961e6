// Precompiled for every source of libvramledger_torch_objects (torch_plugin/meson.build): torch's
// allocator header, which most of them include, costs more to parse than the rest of such a
// source to compile. Only torch's headers belong here; a source still includes what it uses.
// (No #pragma once: GCC compiles this file as a main file, where it warns about one.)
#include <c10/cuda/CUDACachingAllocator.h>
