// vramledger as PyTorch's CUDA allocator: a c10::cuda::CUDACachingAllocator::CUDAAllocator over
// one DeviceAllocators (backend, ledger, pools) per device, created on first use of the device.
//
// Built against the installed torch: the CUDAAllocator vtable changes between minor releases, so
// the plugin must be compiled for the torch it is loaded into (meson does that; see README).
//
// One instance per process, never destroyed (torch frees tensors during static destruction).
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "allocator/config.hpp"
#include "torch_plugin/capture_reuse.hpp"
#include "torch_plugin/device_allocators.hpp"
#include "torch_plugin/pointer_registry.hpp"
#include "torch_plugin/versioned_allocator.hpp"

namespace vramledger::torch_plugin {

namespace c10_alloc = c10::cuda::CUDACachingAllocator;

class VramledgerAllocator final : public VersionedAllocator {
 public:
  static constexpr int kMaxDevices = 64;

  // The process's instance, created with `config_text` on first call (later calls must pass
  // the same text or an empty one). Throws Error(kInvalidArgument) for a malformed config.
  static VramledgerAllocator& get_or_create(std::string_view config_text);
  // Null until get_or_create ran.
  static VramledgerAllocator* instance();

  const std::string& config_text() const { return config_text_; }
  const Config& config() const { return config_; }

  // --- vramledger's own entry points (C API, Python). ---
  // Allocates on `device` and `stream` (routing to a capturing graph's pool as torch would).
  // Returns null for 0 bytes; throws c10::OutOfMemoryError / c10::Error.
  void* malloc(std::size_t bytes, c10::DeviceIndex device, cudaStream_t stream);
  // Frees a pointer from malloc / allocate; null is ignored. A block asleep (docs/sleep.md) is
  // freed at its wake: torch's deleter must not throw.
  void free_block(void* ptr);
  // Frees deferred until the end of all captures, or until a wake (sleep_by_name.cpp).
  void process_deferred_frees();
  // The device's allocators if that device was used, else null.
  DeviceAllocators* device_if_created(c10::DeviceIndex device) const;
  std::vector<DeviceAllocators*> created_devices() const;
  DeviceAllocators& device_state(c10::DeviceIndex device);

  // --- c10::Allocator ---
  c10::DataPtr allocate(std::size_t n) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  // --- c10::DeviceAllocator ---
  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  using c10_alloc::CUDAAllocator::recordStream;  // the c10::Stream overload forwards to ours
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;

  // --- c10::cuda::CUDACachingAllocator::CUDAAllocator ---
  void* raw_alloc(std::size_t nbytes) override;
  void* raw_alloc_with_stream(std::size_t nbytes, cudaStream_t stream) override;
  void raw_delete(void* ptr) override;
  void init(int device_count) override;
  double getMemoryFraction(c10::DeviceIndex device) override;
  void setMemoryFraction(double fraction, c10::DeviceIndex device) override;
  std::vector<c10_alloc::StreamSegmentSize> getExpandableSegmentSizes(
      c10::DeviceIndex device) override;
  void enable(bool value) override;
  bool isEnabled() const override;
  void cacheInfo(c10::DeviceIndex device, std::size_t* largest_block) override;
  void* getBaseAllocation(void* ptr, std::size_t* size) override;
  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) override;
  c10_alloc::SnapshotInfo snapshot(c10::MempoolId_t mempool_id = {0, 0},
                                   bool include_traces = true) override;
  void beginAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                           std::function<bool(cudaStream_t)> filter) override;
  void endAllocateToPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  int getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  void createOrIncrefPool(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                          std::shared_ptr<c10_alloc::CUDAAllocator> allocator) override;
  void setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                   bool use_on_oom) override;
  void setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) override;
  bool checkPoolLiveAllocations(
      c10::DeviceIndex device, c10::MempoolId_t mempool_id,
      const std::unordered_set<void*>& expected_live_allocations) override;
  c10_alloc::ShareableHandle shareIpcHandle(void* ptr) override;
  std::shared_ptr<void> getIpcDevPtr(std::string handle) override;
  bool isHistoryEnabled() override;
  void recordHistory(bool enabled, c10_alloc::CreateContextFn context_recorder,
                     std::size_t alloc_trace_max_entries, c10_alloc::RecordContext when,
                     bool clear_history, const std::vector<std::string>& skip_actions) override;
  void recordAnnotation(const std::vector<std::pair<std::string, std::string>>& md) override;
  void pushCompileContext(std::string& md) override;
  void popCompileContext() override;
  void setUserMetadata(const std::string& metadata) override;
  std::string getUserMetadata() override;
  void attachOutOfMemoryObserver(c10_alloc::OutOfMemoryObserver observer) override;
  void attachAllocatorTraceTracker(c10_alloc::AllocatorTraceTracker tracker) override;
  void enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) override;
  cudaError_t memcpyAsync(void* dst, int dst_device, const void* src, int src_device,
                          std::size_t count, cudaStream_t stream, bool p2p_enabled) override;
  std::shared_ptr<c10_alloc::AllocatorState> getCheckpointState(
      c10::DeviceIndex device, c10::MempoolId_t id) override;
  c10_alloc::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device, std::shared_ptr<c10_alloc::AllocatorState> pps) override;
  std::string name() override;

  // Allocations refused by the memory-fraction cap although the device had room (torch 2.12+
  // reports them as num_oom_rejections; counted on every release).
  std::int64_t oom_rejections(c10::DeviceIndex device) const;

  // --- what releases newer than 2.11 added (versioned_allocator.hpp forwards to these; public
  // so that every release, and the self-test, can use them) ---
  void add_oom_rejection_observer(OomRejectionCallback observer) override;
  std::shared_ptr<c10::GatheredContext> context_for_pointer(const void* ptr) override;
  void on_capture_marked(c10::DeviceIndex device, bool begins) override;
  void annotate_allocation(const void* ptr, const std::string& metadata) override;

 private:
  VramledgerAllocator(Config config, std::string config_text);

  void* malloc_uncached(DeviceAllocators& state, std::size_t bytes, cudaStream_t stream);
  DevicePtr allocate_in(DeviceAllocators& device, MemoryPool& pool, std::size_t bytes,
                        cudaStream_t stream, MemoryPool** owner);
  [[noreturn]] void raise_out_of_memory(DeviceAllocators& device, MemoryPool& pool,
                                        std::size_t bytes, cudaStream_t stream,
                                        const std::string& detail);
  // During a capture: whether this free must wait (deferred or noted for capture reuse, done
  // here) rather than complete now.
  bool defer_free_during_capture(void* ptr, const LiveAllocation& found, DeviceAllocators& state);
  // Frees a block whose other-stream uses a capture has joined back (capture_reuse.hpp).
  void free_ordered_in_capture(void* ptr);
  std::vector<cudaStream_t> streams_used_by(void* ptr);
  void report_to_profiler(void* ptr, std::int64_t delta, c10::DeviceIndex device);
  std::size_t max_split_bytes() const { return config_.options.max_split_bytes; }

  const Config config_;
  const std::string config_text_;
  PointerRegistry registry_;

  std::array<std::atomic<DeviceAllocators*>, kMaxDevices> devices_{};
  mutable std::mutex devices_mutex_;  // creation, and the settings new devices inherit below
  std::array<double, kMaxDevices> memory_fractions_{};
  HistorySettings history_settings_;
  std::vector<c10_alloc::AllocatorTraceTracker> trace_trackers_;
  std::string user_metadata_;

  CaptureReuse capture_reuse_;
  std::mutex stream_uses_mutex_;
  std::unordered_map<void*, std::vector<cudaStream_t>> stream_uses_;  // record_stream, per block

  std::mutex oom_observers_mutex_;
  std::vector<c10_alloc::OutOfMemoryObserver> oom_observers_;
  std::vector<OomRejectionCallback> oom_rejection_observers_;
  std::array<std::atomic<std::int64_t>, kMaxDevices> oom_rejections_{};

  std::atomic<bool> initialized_{false};
  std::atomic<bool> enabled_{true};
  std::atomic<int> device_count_{0};
};

}  // namespace vramledger::torch_plugin
