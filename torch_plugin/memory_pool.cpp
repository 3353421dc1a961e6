#include "torch_plugin/memory_pool.hpp"

#include <utility>

namespace vramledger::torch_plugin {

MemoryPool::MemoryPool(DeviceBackend& backend, EventGate& gate, const AllocatorOptions& options)
    : observer_(gate, {0, 0}),
      policy_(std::make_unique<CachingAllocator>(backend, &observer_, options)) {}

MemoryPool::MemoryPool(c10::MempoolId_t id, DeviceBackend& segments, DeviceBackend& services,
                       std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> foreign,
                       EventGate& gate, const AllocatorOptions& options,
                       DeviceReservation& budget, bool sleepable)
    : id_(id),
      sleepable_(sleepable),
      private_backend_(
          std::make_unique<PrivatePoolBackend>(segments, services, std::move(foreign))),
      capped_backend_(std::make_unique<CappedBackend>(*private_backend_, budget)),
      observer_(gate, id) {
  AllocatorOptions pool_options = options;
  pool_options.use_paged_heap = false;
  if (sleepable_) {
    // A sleepable segment is exactly one physical chunk: sizes in whole chunks keep reserved
    // bytes equal to the device's (the defaults, 2 and 20 MiB, already are on NVIDIA GPUs).
    const std::size_t chunk = segments.info().granularity;
    auto whole = [chunk](std::size_t& bytes) { bytes = (bytes + chunk - 1) / chunk * chunk; };
    whole(pool_options.small_segment_bytes);
    whole(pool_options.large_segment_bytes);
    whole(pool_options.round_large_segment_bytes);
  }
  policy_ = std::make_unique<CachingAllocator>(*capped_backend_, &observer_, pool_options);
}

MemoryPool::~MemoryPool() {
  // The allocator returns its cached segments on destruction: that must be allowed now.
  if (private_backend_) private_backend_->allow_release(true);
  policy_.reset();
  capped_backend_.reset();
}

void MemoryPool::set_in_use(bool in_use) {
  if (private_backend_) private_backend_->allow_release(!in_use);
}

bool MemoryPool::holds_nothing() const {
  if (live_blocks.load() != 0) return false;
  const BlockCensus census = policy_->census();
  for (const auto& pool : census.pools) {
    // A sleeping pool's segments hold no memory but keep their addresses until the wake.
    if (pool.reserved_bytes != 0 || pool.active != 0 || pool.segment != 0) return false;
  }
  return census.free_physical_pages == 0;
}

}  // namespace vramledger::torch_plugin
