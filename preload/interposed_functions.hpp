// The functions the shim wraps, and how a looked-up real entry point becomes a wrapper.
//
// A caller can reach a memory function four ways: a direct call (bound to the shim's export),
// dlsym on a libcuda/libcudart handle, cuGetProcAddress, cudaGetDriverEntryPoint*. The last
// three hand out whatever pointer the real library returns; each function therefore has a few
// wrapper *variants*, each bound to one real pointer. Variant 0 is the shim's export, bound to
// the definition it hides; the others are bound on first use to a pointer a lookup returned
// (the driver may answer cuGetProcAddress with a pointer other than its exported symbol).
#pragma once

#include <cstdint>

#include "preload/wrapper_variants.hpp"

namespace vramledger::preload {

// One id per interposed function, in the order of the list in wrapper_variants.hpp.
enum class Fn : int {
  VL_DRIVER_FUNCTIONS(VL_FN_ID, VL_FN_ID)
  VL_RUNTIME_FUNCTIONS(VL_FN_ID, VL_FN_ID)
  kCount,
  kNone = -1
};

inline constexpr int kFnCount = static_cast<int>(Fn::kCount);
inline constexpr int kVariants = 4;
inline constexpr int kFirstRuntimeFn = 0 VL_DRIVER_FUNCTIONS(VL_FN_COUNT, VL_FN_COUNT);

// The exported symbol name of each function ("cuMemAlloc_v2", "cudaMalloc", ...).
const char* exported_name(Fn fn);
// The function a dlsym name names (exact exported names), or kNone.
Fn fn_by_exported_name(const char* name);
// The function cuGetProcAddress / cudaGetDriverEntryPoint* resolves `symbol` to for this
// version and flags, or kNone when the shim does not wrap it (e.g. the 32-bit cuMemAlloc of
// CUDA < 3.2, whose ABI differs).
Fn fn_by_driver_symbol(const char* symbol, int cuda_version, std::uint64_t flags);

// The real function behind wrapper `variant` of `fn` (resolving variant 0 lazily); nullptr when
// it cannot be found.
void* real_function(Fn fn, int variant);
// What a lookup should hand out for a real pointer `real` of `fn`: a wrapper bound to it, or
// `real` itself (counted as an unwrapped lookup) when every variant is taken.
void* wrap_entry(Fn fn, void* real);

// Defined by driver_hooks.cpp / runtime_hooks.cpp: the address of wrapper `variant` of `fn`.
void* driver_wrapper(Fn fn, int variant);
void* runtime_wrapper(Fn fn, int variant);

}  // namespace vramledger::preload
