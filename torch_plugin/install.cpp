#include "torch_plugin/install.hpp"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <exception>
#include <mutex>
#include <string>

#include "torch_plugin/vramledger_allocator.hpp"

namespace vramledger::torch_plugin {

namespace {

namespace c10_alloc = c10::cuda::CUDACachingAllocator;

std::mutex install_mutex;

const char* kHowToInstallEarly =
    "Install vramledger before anything allocates CUDA memory: call vramledger.install() right "
    "after `import torch`, or run the unmodified program as `vramledger run -- python app.py`.";

// Refuses when `current` has handed out or holds any device memory on any device.
void check_unused(c10_alloc::CUDAAllocator* current) {
  if (current == nullptr || !current->initialized()) return;  // torch never set it up
  const std::string name = current->name();
  const int devices = c10::cuda::device_count();
  for (int device = 0; device < devices; ++device) {
    c10::CachingDeviceAllocator::DeviceStats stats;
    try {
      stats = current->getDeviceStats(static_cast<c10::DeviceIndex>(device));
    } catch (const std::exception&) {
      TORCH_CHECK(false, "vramledger: cannot install: the current CUDA allocator '", name,
                  "' is already initialised and cannot say whether it handed out memory. ",
                  kHowToInstallEarly);
    }
    constexpr auto all = static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    const bool used = stats.allocation[all].allocated > 0 ||
                      stats.allocation[all].current > 0 ||
                      stats.reserved_bytes[all].current > 0 || stats.num_device_alloc > 0;
    TORCH_CHECK(!used, "vramledger: cannot install: PyTorch's CUDA allocator '", name,
                "' has already allocated memory on device ", device, " (",
                stats.allocation[all].current, " live blocks, ",
                stats.reserved_bytes[all].current, " bytes reserved). ", kHowToInstallEarly);
  }
}

}  // namespace

void install(std::string_view config_text) {
  std::lock_guard<std::mutex> lock(install_mutex);
  c10_alloc::CUDAAllocator* current = c10_alloc::allocator.load();
  VramledgerAllocator* ours = VramledgerAllocator::instance();
  if (ours != nullptr && current == ours) {
    TORCH_CHECK(config_text.empty() || config_text == ours->config_text(),
                "vramledger: already installed with config '", ours->config_text(),
                "'; cannot reinstall with '", std::string(config_text), "'");
    return;
  }
  check_unused(current);
  VramledgerAllocator* allocator = nullptr;
  try {
    allocator = &VramledgerAllocator::get_or_create(config_text);
  } catch (const std::exception& error) {
    TORCH_CHECK(false, "vramledger: cannot install: ", error.what());
  }
  // torch calls init() during its lazy CUDA initialisation; if that already happened, it will
  // not call ours, so do it here.
  if (current != nullptr && current->initialized() && !allocator->initialized()) {
    allocator->init(c10::cuda::device_count());
  }
  c10_alloc::allocator.store(allocator);
  c10::SetAllocator(c10::DeviceType::CUDA, allocator, /*priority=*/0);
  TORCH_CHECK(c10::GetAllocator(c10::DeviceType::CUDA) == allocator,
              "vramledger: installed as the CUDA caching allocator, but c10::SetAllocator(CUDA) "
              "kept another allocator registered with a higher priority");
}

bool installed() {
  VramledgerAllocator* ours = VramledgerAllocator::instance();
  return ours != nullptr && c10_alloc::allocator.load() == ours;
}

}  // namespace vramledger::torch_plugin
