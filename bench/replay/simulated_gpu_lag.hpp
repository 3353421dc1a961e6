// A GPU that runs behind the CPU, for replays on the simulated device.
//
// On the simulated device every queued item completes at once, so a freed block's pages are idle
// as soon as it is freed. A real GPU runs behind the CPU that queues its work: the paged heap must
// wait for a stream's fence before it moves that stream's freed pages, and grows meanwhile (on the
// H200, Llama-style training peaked 5% above its simulated replay). This model keeps every stream
// paused and completes the work queued on all of them once every `lag_ops` replayed operations,
// so a fence stays pending for up to that many operations (half of it on average).
#pragma once

#include <cstddef>
#include <vector>

#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {

class SimulatedGpuLag {
 public:
  // Pauses `streams` (their queued work then completes only in this model's batches).
  SimulatedGpuLag(SimulatedDevice& device, std::vector<StreamHandle> streams, std::size_t lag_ops);
  ~SimulatedGpuLag();  // resumes every stream: all queued work completes
  SimulatedGpuLag(const SimulatedGpuLag&) = delete;
  SimulatedGpuLag& operator=(const SimulatedGpuLag&) = delete;

  // Called after each replayed operation.
  void after_operation();
  std::size_t batches_completed() const { return batches_; }

 private:
  SimulatedDevice& device_;
  std::vector<StreamHandle> streams_;
  std::size_t lag_ops_;
  std::size_t since_batch_ = 0;
  std::size_t batches_ = 0;
};

}  // namespace vramledger
