// The adapter between torch's CUDAAllocator interface of one release and the plugin.
//
// VramledgerAllocator derives from VersionedAllocator, which overrides the virtual methods that
// exist only in some torch releases (torch_compat.hpp's feature table) and forwards each to a
// method of stable signature that the plugin implements once. So the plugin compiles against
// every supported release without a version test of its own, and a release that adds a pure
// virtual method fails to compile here, in one place, instead of at `new VramledgerAllocator`.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "torch_plugin/torch_compat.hpp"

namespace vramledger::torch_plugin {

// (device, requested bytes, bytes allocated before the request, device total): torch 2.12's
// OomRejectionObserver signature, kept here for every release.
using OomRejectionCallback =
    std::function<void(std::int64_t, std::size_t, std::size_t, std::size_t)>;

class VersionedAllocator : public c10::cuda::CUDACachingAllocator::CUDAAllocator {
 public:
#if VRAMLEDGER_TORCH_HAS_OOM_REJECTION
  void attachOomRejectionObserver(
      c10::cuda::CUDACachingAllocator::OomRejectionObserver observer) final {
    add_oom_rejection_observer(std::move(observer));
  }
#endif
#if VRAMLEDGER_TORCH_HAS_CONTEXT_FOR_POINTER
  std::shared_ptr<c10::GatheredContext> getContextForPointer(const void* ptr) final {
    return context_for_pointer(ptr);
  }
#endif
#if VRAMLEDGER_TORCH_HAS_CAPTURE_MARKS
  void markCaptureBegin(c10::DeviceIndex device) final { on_capture_marked(device, true); }
  void markCaptureEnd(c10::DeviceIndex device) final { on_capture_marked(device, false); }
#endif
#if VRAMLEDGER_TORCH_HAS_MEMORY_ANNOTATIONS
  bool supportsUserMetadata() final { return true; }
  void annotateMemory(const void* ptr, const std::string& metadata) final {
    annotate_allocation(ptr, metadata);
  }
#endif

 protected:
  // Called when an allocation is refused by the memory-fraction cap although the device had
  // room (what torch 2.12+ calls an OOM rejection). Observers are kept on every release.
  virtual void add_oom_rejection_observer(OomRejectionCallback observer) = 0;
  // The stack recorded when the live allocation at `ptr` was made, if history records stacks.
  virtual std::shared_ptr<c10::GatheredContext> context_for_pointer(const void* ptr) = 0;
  // torch says a real stream capture began (true) or ended (false) on `device`.
  virtual void on_capture_marked(c10::DeviceIndex device, bool begins) = 0;
  // Post-facto metadata for the live allocation at `ptr` (an "annotate" trace entry).
  virtual void annotate_allocation(const void* ptr, const std::string& metadata) = 0;
};

}  // namespace vramledger::torch_plugin
