// What every memory hook does after calling the real function: attribute, record, time.
#pragma once

#include <cstdint>

#include "preload/allocation_table.hpp"

#define VRAMLEDGER_PRELOAD_EXPORT extern "C" __attribute__((visibility("default")))

namespace vramledger::preload {

// Returned when the real function cannot be found (no libcuda / libcudart loaded): the driver's
// CUDA_ERROR_NOT_INITIALIZED and the runtime's cudaErrorInitializationError are both 3.
inline constexpr int kNotInitialized = 3;

// Marks this thread as inside a runtime hook (cudaMalloc...): libcudart then calls the driver
// through wrapped entry points, and those nested calls must not count the same bytes again.
class RuntimeCallScope {
 public:
  RuntimeCallScope();
  ~RuntimeCallScope();
  RuntimeCallScope(const RuntimeCallScope&) = delete;
  RuntimeCallScope& operator=(const RuntimeCallScope&) = delete;
};

// True when the current driver hook runs inside a runtime hook on this thread.
bool inside_runtime_call();

// result: the real function's return value (0 = success). A failed call records nothing.
void after_allocation(int result, KeyKind kind, std::uint64_t key, std::uint64_t bytes,
                      const void* return_address, bool nested);
// Brackets a freeing call: constructed before the real function, finish()ed with its result.
class FreeInProgress {
 public:
  FreeInProgress(KeyKind kind, std::uint64_t key, bool nested);
  FreeInProgress(const FreeInProgress&) = delete;
  FreeInProgress& operator=(const FreeInProgress&) = delete;
  void finish(int result);
  // The call was not made after all: the record goes back, nothing is counted.
  void cancel();

 private:
  KeyKind kind_;
  std::uint64_t key_;
  bool nested_;
  bool recorded_ = false;
  AllocationRecord record_{};
};

// Routing mode (routing.hpp): offers an allocation / a free to the routed cache before the real
// function is called. kRouteDeclined, or the routed call's CUresult (already recorded).
int try_routed_allocation(std::uint64_t bytes, std::uint64_t* out, const void* return_address);
int try_routed_free(std::uint64_t pointer);

}  // namespace vramledger::preload
