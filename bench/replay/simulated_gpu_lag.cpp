#include "bench/replay/simulated_gpu_lag.hpp"

#include "allocator/errors.hpp"

namespace vramledger {

SimulatedGpuLag::SimulatedGpuLag(SimulatedDevice& device, std::vector<StreamHandle> streams,
                                 std::size_t lag_ops)
    : device_(device), streams_(std::move(streams)), lag_ops_(lag_ops) {
  for (StreamHandle stream : streams_) throw_if_error(device_.pause_stream(stream), "pausing a stream");
}

SimulatedGpuLag::~SimulatedGpuLag() {
  for (StreamHandle stream : streams_) (void)device_.resume_stream(stream);
}

void SimulatedGpuLag::after_operation() {
  if (lag_ops_ == 0 || ++since_batch_ < lag_ops_) return;
  since_batch_ = 0;
  ++batches_;
  // Resuming completes what each stream has queued; pausing again holds back what comes next.
  for (StreamHandle stream : streams_) {
    throw_if_error(device_.resume_stream(stream), "resuming a stream");
    throw_if_error(device_.pause_stream(stream), "pausing a stream");
  }
}

}  // namespace vramledger
