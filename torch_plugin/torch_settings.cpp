#include "torch_plugin/torch_settings.hpp"

#include <c10/core/AllocatorConfig.h>
#include <c10/cuda/CUDAAllocatorConfig.h>

#include <bit>

namespace vramledger::torch_plugin {

namespace {

// torch's smallest block: below divisions × this, dividing is not worth it.
constexpr std::size_t kTorchMinBlock = 512;

}  // namespace

std::size_t torch_power2_division_block(std::size_t bytes) {
  // torch's device-generic config (its CUDA alias is deprecated since 2.11).
  const std::size_t divisions =
      c10::CachingAllocator::AcceleratorAllocatorConfig::roundup_power2_divisions(bytes);
  if (divisions <= 1 || bytes <= kTorchMinBlock * divisions) return 0;
  const std::size_t upper = std::bit_ceil(bytes);  // the power of two at or above
  if (upper == bytes) return 0;
  const std::size_t lower = upper / 2;
  const std::size_t step = lower / divisions;
  if (step == 0) return 0;
  return lower + (bytes - lower + step - 1) / step * step;
}

double torch_configured_memory_fraction() {
  return c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::per_process_memory_fraction();
}

}  // namespace vramledger::torch_plugin
