#include "bench/gpu_latency/torch_native_peer.hpp"

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAFunctions.h>

#include <chrono>
#include <cstdlib>

#ifndef VRAMLEDGER_TORCH_VERSION
#define VRAMLEDGER_TORCH_VERSION "unknown"
#endif

namespace vramledger::gpu_latency {
namespace c10_alloc = c10::cuda::CUDACachingAllocator;
namespace {

using Clock = std::chrono::steady_clock;

// c10::Error's what() carries a C++ backtrace; the first part is what a reader needs.
[[noreturn]] void rethrow_as_peer_error(const c10::Error& error, const std::string& during) {
  throw PeerError("torch: " + during + ": " + error.what_without_backtrace());
}

}  // namespace

TorchNativePeer::TorchNativePeer(bool expandable_segments) : expandable_(expandable_segments) {
  allocator_ = c10_alloc::get();
  if (allocator_ == nullptr) {
    throw PeerError("torch: c10::cuda::CUDACachingAllocator::get() is null");
  }
  const std::string name = allocator_->name();
  if (name != "native") {
    throw PeerError("torch: the CUDA allocator in this process is '" + name +
                    "', not torch's native caching allocator (is PYTORCH_CUDA_ALLOC_CONF or "
                    "PYTORCH_ALLOC_CONF selecting another backend?)");
  }
  try {
    // What torch's lazy CUDA init does (CUDAHooks::init): one DeviceCachingAllocator per device.
    const int devices = c10::cuda::device_count();
    if (devices <= kDevice) throw PeerError("torch: c10::cuda::device_count() found no device 0");
    allocator_->init(devices);
  } catch (const c10::Error& error) {
    rethrow_as_peer_error(error, "initialising the native allocator");
  }
}

TorchNativePeer::~TorchNativePeer() {
  try {
    allocator_->emptyCache();
  } catch (const c10::Error&) {
    // At exit: nothing left to report to.
  }
}

std::string TorchNativePeer::describe() const {
  std::string text = allocator_->name() +
                     " (c10::cuda::CUDACachingAllocator::get()->name(); vramledger not installed "
                     "into torch here), torch " VRAMLEDGER_TORCH_VERSION;
  for (const char* variable : {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    if (const char* value = std::getenv(variable); value != nullptr && *value != '\0') {
      text += std::string(", ") + variable + "=" + value;
    }
  }
  if (expandable_) text += ", growth under expandable_segments:True";
  return text;
}

void TorchNativePeer::set_expandable(bool on) {
  try {
    c10::CachingAllocator::setAllocatorSettings(on ? "expandable_segments:True"
                                                   : "expandable_segments:False");
  } catch (const c10::Error& error) {
    rethrow_as_peer_error(error, on ? "setting expandable_segments:True"
                                    : "setting expandable_segments:False");
  }
}

void TorchNativePeer::prepare_growth() {
  try {
    allocator_->emptyCache();
    if (!expandable_) return;
    set_expandable(true);
    // The setting is read at each segment creation; make sure it took: the block of a fresh
    // allocation must sit in an expandable segment.
    cudaStream_t stream = nullptr;
    void* probe = allocator_->raw_alloc_with_stream(std::size_t{2} << 20, stream);
    bool expandable = false;
    for (const auto& segment : allocator_->snapshot({0, 0}, false).segments) {
      const auto address = reinterpret_cast<std::size_t>(probe);
      if (address >= segment.address && address < segment.address + segment.total_size) {
        expandable = segment.is_expandable;
      }
    }
    allocator_->raw_delete(probe);
    allocator_->emptyCache();
    if (!expandable) {
      set_expandable(false);
      throw PeerError(
          "torch: expandable_segments:True was set but a new block did not land in an "
          "expandable segment (torch built without driver API support?)");
    }
  } catch (const c10::Error& error) {
    rethrow_as_peer_error(error, "preparing the growth loop");
  }
}

GrowthSample TorchNativePeer::grow_cold(std::size_t bytes, cudaStream_t stream) {
  GrowthSample sample;
  const auto start = Clock::now();
  void* ptr = allocator_->raw_alloc_with_stream(bytes, stream);
  sample.alloc_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  allocator_->raw_delete(ptr);
  allocator_->emptyCache();
  return sample;
}

void TorchNativePeer::finish_growth() {
  allocator_->emptyCache();
  if (expandable_) set_expandable(false);
}

}  // namespace vramledger::gpu_latency
