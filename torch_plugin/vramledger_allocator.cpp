#include "torch_plugin/vramledger_allocator.hpp"

#include <c10/core/Allocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "accounting/tag_registry.hpp"
#include "allocator/errors.hpp"
#include "torch_plugin/cuda_ipc.hpp"
#include "torch_plugin/device_stats.hpp"
#include "torch_plugin/oom_message.hpp"
#include "torch_plugin/pool_checkpoint.hpp"
#include "torch_plugin/routed_cache_release.hpp"
#include "torch_plugin/snapshot_segments.hpp"
#include "torch_plugin/torch_settings.hpp"

namespace vramledger::torch_plugin {

namespace {

std::atomic<VramledgerAllocator*> the_instance{nullptr};
std::mutex instance_mutex;

// The DataPtr deleter: a plain function, as torch's raw_deleter() contract requires.
void delete_block(void* ptr) {
  VramledgerAllocator* allocator = the_instance.load(std::memory_order_acquire);
  if (allocator != nullptr) allocator->free_block(ptr);
}

c10::DeviceIndex current_device() {
  c10::DeviceIndex device = 0;
  C10_CUDA_CHECK(c10::cuda::GetDevice(&device));
  return device;
}

// Device calls made while a CUDA graph may be capturing run in relaxed capture mode: cudaMalloc
// and event queries are "unsafe" in global mode and would invalidate the capture (torch's own
// allocator does the same).
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(bool real_device = true) {
    if (real_device && any_capture_underway()) guard_.emplace(cudaStreamCaptureModeRelaxed);
  }

 private:
  std::optional<c10::cuda::CUDAStreamCaptureModeGuard> guard_;
};

// Whether freeing this block now could record an event in a capturing stream (see free_block).
// Private pools use the segment heap, which records events only for record_stream uses.
// `real_device`: false on the simulated device, whose streams CUDA does not know.
bool must_wait_for_capture(const LiveAllocation& allocation, bool real_device) {
  if (allocation.used_on_other_streams) return true;
  if (allocation.pool->is_private()) return false;
  // The legacy and per-thread default streams cannot be captured, but recording an event on
  // them (or asking about them) while another stream captures is an implicit synchronisation
  // that breaks the capture: just wait.
  if (allocation.stream <= 2) return true;
  if (!real_device) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(reinterpret_cast<cudaStream_t>(allocation.stream), &status) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return true;
  }
  return status != cudaStreamCaptureStatusNone;
}

// A vramledger failure other than OOM becomes a c10::Error that names us.
[[noreturn]] void raise(const std::exception& error, const char* what_we_did) {
  TORCH_CHECK(false, "vramledger: ", what_we_did, ": ", error.what());
}

bool is_default_pool(c10::MempoolId_t id) { return id.first == 0 && id.second == 0; }

}  // namespace

// ------------------------------------------------------------------------------ instance

VramledgerAllocator& VramledgerAllocator::get_or_create(std::string_view config_text) {
  std::lock_guard<std::mutex> lock(instance_mutex);
  VramledgerAllocator* existing = the_instance.load(std::memory_order_acquire);
  if (existing != nullptr) {
    if (!config_text.empty() && config_text != existing->config_text_) {
      throw Error(ErrorCode::kInvalidArgument,
                  "vramledger is already configured with '" + existing->config_text_ +
                      "' in this process; it cannot be reconfigured with '" +
                      std::string(config_text) + "'");
    }
    return *existing;
  }
  Config config = parse_config(config_text);
  // Never deleted: tensors may still be freed during static destruction.
  auto* created = new VramledgerAllocator(std::move(config), std::string(config_text));
  the_instance.store(created, std::memory_order_release);
  return *created;
}

VramledgerAllocator* VramledgerAllocator::instance() {
  return the_instance.load(std::memory_order_acquire);
}

VramledgerAllocator::VramledgerAllocator(Config config, std::string config_text)
    : config_(std::move(config)), config_text_(std::move(config_text)) {
  memory_fractions_.fill(1.0);
}

DeviceAllocators* VramledgerAllocator::device_if_created(c10::DeviceIndex device) const {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  return devices_[device].load(std::memory_order_acquire);
}

std::vector<DeviceAllocators*> VramledgerAllocator::created_devices() const {
  std::vector<DeviceAllocators*> result;
  for (const auto& slot : devices_) {
    if (DeviceAllocators* device = slot.load(std::memory_order_acquire)) result.push_back(device);
  }
  return result;
}

DeviceAllocators& VramledgerAllocator::device_state(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "vramledger: invalid CUDA device ",
              static_cast<int>(device));
  if (DeviceAllocators* existing = devices_[device].load(std::memory_order_acquire)) {
    return *existing;
  }
  std::lock_guard<std::mutex> lock(devices_mutex_);
  if (DeviceAllocators* existing = devices_[device].load(std::memory_order_acquire)) {
    return *existing;
  }
  DeviceAllocators* created = nullptr;
  try {
    created = new DeviceAllocators(device, config_);  // lives as long as the process
  } catch (const std::exception& error) {
    raise(error, ("setting up CUDA device " + std::to_string(device)).c_str());
  }
  created->history().configure(history_settings_, false);
  for (const auto& tracker : trace_trackers_) created->history().attach_tracker(tracker);
  created->history().set_user_metadata(user_metadata_);
  if (memory_fractions_[device] < 1.0) {
    const auto total = static_cast<double>(created->backend_info().total_bytes);
    created->set_cap(std::max<std::size_t>(
        1, static_cast<std::size_t>(memory_fractions_[device] * total)));
  }
  devices_[device].store(created, std::memory_order_release);
  return *created;
}

// ------------------------------------------------------------------------------ allocation

void* VramledgerAllocator::malloc(std::size_t bytes, c10::DeviceIndex device,
                                  cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  DeviceAllocators& state = device_state(device);
  if (!enabled_.load(std::memory_order_relaxed)) return malloc_uncached(state, bytes, stream);
  if (!capture_reuse_.empty() && !state.is_simulated() && any_capture_underway()) {
    for (void* ready : capture_reuse_.take_ordered_before(stream)) free_ordered_in_capture(ready);
  }
  state.history().gather_context_for_alloc();
  const RelaxedCaptureMode relaxed(!state.is_simulated());
  MemoryPool& pool = state.acquire_pool_for(stream);
  MemoryPool* owner = &pool;
  const DevicePtr address = allocate_in(state, pool, bytes, stream, &owner);
  void* ptr = reinterpret_cast<void*>(address);
  registry_.insert(ptr, LiveAllocation{owner, device, bytes,
                                       reinterpret_cast<std::uintptr_t>(stream), false});
  if (c10::memoryProfilingEnabled()) {
    report_to_profiler(ptr, static_cast<std::int64_t>(bytes), device);
  }
  return ptr;
}

void* VramledgerAllocator::malloc_uncached(DeviceAllocators& state, std::size_t bytes,
                                           cudaStream_t stream) {
  DevicePtr address = 0;
  try {
    address = state.allocate_uncached(bytes, stream);
  } catch (const OutOfMemoryError& error) {
    raise_out_of_memory(state, state.default_pool(), bytes, stream,
                        std::string("caching disabled, cudaMalloc failed: ") + error.what());
  } catch (const std::exception& error) {
    raise(error, "allocation failed (caching disabled)");
  }
  void* ptr = reinterpret_cast<void*>(address);
  registry_.insert(ptr, LiveAllocation{nullptr, state.device(), bytes,
                                       reinterpret_cast<std::uintptr_t>(stream), false});
  return ptr;
}

DevicePtr VramledgerAllocator::allocate_in(DeviceAllocators& state, MemoryPool& pool,
                                           std::size_t bytes, cudaStream_t stream,
                                           MemoryPool** owner) {
  // More than the whole device: out of memory in torch's terms (its message and exception type,
  // which programs and tools parse), not a malformed request.
  if (bytes > state.backend_info().total_bytes) {
    state.record_refused_request(bytes, stream);
    state.release_block_of(pool);
    raise_out_of_memory(state, pool, bytes, stream, "the request is larger than the device");
  }
  const auto stream_handle = reinterpret_cast<StreamHandle>(stream);
  const TagId tag = current_tag();
  const std::size_t block = torch_power2_division_block(bytes);  // torch's rounding setting
  std::string failure;
  // One attempt in `pool`: the block, or nothing with `failure` set when it is out of memory. A
  // private pool may not return segments while graphs use it: for the caller that is simply out
  // of memory (PyTorch behaves the same way). Any other error ends the request.
  auto attempt = [&]() -> std::optional<DevicePtr> {
    try {
      return pool.policy().allocate(bytes, stream_handle, tag, block);
    } catch (const OutOfMemoryError& error) {
      failure = error.what();
    } catch (const Error& error) {
      if (!(pool.is_private() && error.code() == ErrorCode::kNotSupported)) {
        state.release_block_of(pool);
        raise(error, "allocation failed");
      }
      failure = error.what();
    }
    return std::nullopt;
  };
  if (std::optional<DevicePtr> address = attempt()) return *address;
  // Memory of pools torch released but whose blocks lingered: give it back, then try again.
  if (!pool.is_private() && !any_capture_underway() && state.has_retired_pools()) {
    state.empty_cache({0, 0});
    if (std::optional<DevicePtr> address = attempt()) return *address;
  }
  // Other libraries' idle memory in the preload shim's routed cache (routing mode only).
  if (!pool.is_private() && release_routed_cache_idle() > 0) {
    if (std::optional<DevicePtr> address = attempt()) return *address;
  }
  // Pools created with MemPool(use_on_oom=True) volunteer their memory last.
  if (!pool.is_private()) {
    std::vector<MemoryPool*> volunteers = state.acquire_oom_fallback_pools();
    std::optional<DevicePtr> result;
    for (MemoryPool* volunteer : volunteers) {
      if (!result) {
        try {
          result = volunteer->policy().allocate(bytes, stream_handle, tag, block);
          *owner = volunteer;
          continue;  // keep its acquisition: the block belongs to it now
        } catch (const Error&) {
          // try the next volunteer
        }
      }
      state.release_block_of(*volunteer);
    }
    if (result) return *result;
  }
  state.release_block_of(pool);
  raise_out_of_memory(state, pool, bytes, stream, failure);
}

void VramledgerAllocator::raise_out_of_memory(DeviceAllocators& state, MemoryPool& pool,
                                              std::size_t bytes, cudaStream_t stream,
                                              const std::string& detail) {
  std::size_t device_free = 0;
  std::size_t device_total = 0;
  if (!state.backend().memory_info(&device_free, &device_total).is_ok()) {
    device_total = state.backend_info().total_bytes;
  }
  state.history().record_oom(bytes, device_free, stream, pool.id());
  const LedgerCounters counters = state.counters();
  const auto& all = counters.aggregate();
  const auto allocated = static_cast<std::size_t>(std::max<std::int64_t>(0, all.allocated_bytes.current));
  const auto reserved = static_cast<std::size_t>(std::max<std::int64_t>(0, all.reserved_bytes.current));
  if (c10::memoryProfilingEnabled()) {
    c10::reportOutOfMemoryToProfiler(static_cast<std::int64_t>(bytes), allocated, reserved,
                                     c10::Device(c10::DeviceType::CUDA, state.device()));
  }
  // Refused by the memory-fraction cap while the device itself had room: torch 2.12+ calls this
  // an OOM rejection and tells its rejection observers (device, size, allocated, total).
  const bool rejected_by_cap = state.cap() != 0 && bytes <= device_free;
  std::vector<OomRejectionCallback> rejection_observers;
  std::vector<c10_alloc::OutOfMemoryObserver> observers;
  {
    std::lock_guard<std::mutex> lock(oom_observers_mutex_);
    observers = oom_observers_;
    if (rejected_by_cap) rejection_observers = oom_rejection_observers_;
  }
  if (rejected_by_cap) {
    oom_rejections_[static_cast<std::size_t>(state.device())].fetch_add(1);
    for (const auto& observer : rejection_observers) {
      observer(state.device(), bytes, allocated, device_total);
    }
  }
  for (const auto& observer : observers) {
    observer(state.device(), bytes, device_total, device_free);
  }
  TORCH_CHECK_WITH(OutOfMemoryError, false,
                   out_of_memory_message(state, pool, bytes, device_free, device_total,
                                         counters, detail));
}

void VramledgerAllocator::free_block(void* ptr) {
  if (ptr == nullptr) return;
  if (any_capture_underway()) {
    // The free may have to wait for the capture: look before taking the entry.
    const std::optional<LiveAllocation> found = registry_.find(ptr);
    TORCH_CHECK(found.has_value(), "vramledger: invalid device pointer ", ptr,
                " (not allocated by vramledger, or already freed)");
    if (found->pool != nullptr &&
        defer_free_during_capture(ptr, *found, *device_if_created(found->device))) {
      return;
    }
  }
  // One registry operation in the common case (no capture): take the entry at once.
  std::optional<LiveAllocation> taken = registry_.take(ptr);
  TORCH_CHECK(taken.has_value(), "vramledger: invalid device pointer ", ptr,
              " (not allocated by vramledger, or already freed)");
  DeviceAllocators& state = *device_if_created(taken->device);
  if (taken->pool == nullptr) {  // made while caching was disabled
    try {
      state.free_uncached(reinterpret_cast<DevicePtr>(ptr), taken->requested,
                          reinterpret_cast<cudaStream_t>(taken->stream));
    } catch (const std::exception& error) {
      registry_.insert(ptr, *taken);
      raise(error, "free failed");
    }
    return;
  }
  release_ipc_export(ptr);  // before the address can be handed out again (cuda_ipc.hpp)
  state.history().gather_context_for_free();
  {
    const RelaxedCaptureMode relaxed(!state.is_simulated());
    try {
      taken->pool->policy().deallocate(reinterpret_cast<DevicePtr>(ptr));
    } catch (const std::exception& error) {
      registry_.insert(ptr, *taken);  // the block stays allocated (the policy changed nothing)
      if (taken->pool->policy().is_asleep(reinterpret_cast<DevicePtr>(ptr))) {
        state.defer_free(ptr);  // freed by the wake (torch's deleter must not throw)
        return;
      }
      raise(error, "free failed");
    }
  }
  state.release_block_of(*taken->pool);
  if (taken->used_on_other_streams) {
    std::lock_guard<std::mutex> lock(stream_uses_mutex_);
    stream_uses_.erase(ptr);
  }
  if (c10::memoryProfilingEnabled()) {
    report_to_profiler(ptr, -static_cast<std::int64_t>(taken->requested), taken->device);
  }
}

bool VramledgerAllocator::defer_free_during_capture(void* ptr, const LiveAllocation& found,
                                                    DeviceAllocators& state) {
  if (!must_wait_for_capture(found, !state.is_simulated())) return false;
  // An event recorded in a capturing stream may not be queried until the capture ends, and a
  // free records events: on the streams that used a block (record_stream), and on the block's
  // own stream when the paged heap fences the pages it frees. Such frees complete when the
  // last capture ends (torch defers cross-stream frees the same way) — or, with torch's
  // graph_capture_record_stream_reuse, once the capture joins the other streams back.
  if (found.used_on_other_streams && found.pool->is_private() && !state.is_simulated() &&
      CaptureReuse::enabled() &&
      capture_reuse_.add(ptr, reinterpret_cast<cudaStream_t>(found.stream),
                         streams_used_by(ptr))) {
    return true;
  }
  state.defer_free(ptr);
  return true;
}

void VramledgerAllocator::free_ordered_in_capture(void* ptr) {
  std::optional<LiveAllocation> taken = registry_.take(ptr);
  if (!taken) return;
  DeviceAllocators& state = *device_if_created(taken->device);
  try {
    const RelaxedCaptureMode relaxed(!state.is_simulated());
    taken->pool->policy().deallocate_as_ordered(reinterpret_cast<DevicePtr>(ptr));
  } catch (const std::exception&) {
    registry_.insert(ptr, *taken);  // unchanged: it completes when the capture ends
    state.defer_free(ptr);
    return;
  }
  state.release_block_of(*taken->pool);
  {
    std::lock_guard<std::mutex> lock(stream_uses_mutex_);
    stream_uses_.erase(ptr);
  }
  if (c10::memoryProfilingEnabled()) {
    report_to_profiler(ptr, -static_cast<std::int64_t>(taken->requested), taken->device);
  }
}

std::vector<cudaStream_t> VramledgerAllocator::streams_used_by(void* ptr) {
  std::lock_guard<std::mutex> lock(stream_uses_mutex_);
  auto it = stream_uses_.find(ptr);
  return it == stream_uses_.end() ? std::vector<cudaStream_t>{} : it->second;
}

void VramledgerAllocator::process_deferred_frees() {
  if (any_capture_underway()) return;
  for (void* ptr : capture_reuse_.take_all()) free_block(ptr);
  for (DeviceAllocators* state : created_devices()) {
    for (void* ptr : state->take_deferred_frees()) free_block(ptr);
  }
}

void VramledgerAllocator::report_to_profiler(void* ptr, std::int64_t delta,
                                             c10::DeviceIndex device) {
  DeviceAllocators* state = device_if_created(device);
  if (state == nullptr) return;
  const LedgerCounters counters = state->counters();
  c10::reportMemoryUsageToProfiler(
      ptr, delta, static_cast<std::size_t>(counters.aggregate().allocated_bytes.current),
      static_cast<std::size_t>(counters.aggregate().reserved_bytes.current),
      c10::Device(c10::DeviceType::CUDA, device));
}

c10::DataPtr VramledgerAllocator::allocate(std::size_t n) {
  const c10::DeviceIndex device = current_device();
  void* ptr = nullptr;
  if (n != 0) ptr = malloc(n, device, c10::cuda::getCurrentCUDAStream(device).stream());
  return {ptr, ptr, &delete_block, c10::Device(c10::DeviceType::CUDA, device)};
}

c10::DeleterFnPtr VramledgerAllocator::raw_deleter() const { return &delete_block; }

void VramledgerAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  C10_CUDA_CHECK(cudaMemcpy(dest, src, count, cudaMemcpyDeviceToDevice));
}

void* VramledgerAllocator::raw_alloc(std::size_t nbytes) {
  const c10::DeviceIndex device = current_device();
  return malloc(nbytes, device, c10::cuda::getCurrentCUDAStream(device).stream());
}

void* VramledgerAllocator::raw_alloc_with_stream(std::size_t nbytes, cudaStream_t stream) {
  return malloc(nbytes, current_device(), stream);
}

void VramledgerAllocator::raw_delete(void* ptr) { free_block(ptr); }

void VramledgerAllocator::recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream) {
  // Like torch: memory that is not ours (or empty) is simply not tracked.
  if (ptr.get() == nullptr || ptr.get_deleter() != &delete_block) return;
  std::optional<LiveAllocation> found = registry_.find(ptr.get());
  if (!found || found->pool == nullptr) return;  // uncached memory: cudaFree synchronises
  registry_.mark_used_on_other_streams(ptr.get());
  {
    std::lock_guard<std::mutex> lock(stream_uses_mutex_);
    auto& uses = stream_uses_[ptr.get()];
    if (std::find(uses.begin(), uses.end(), stream.stream()) == uses.end()) {
      uses.push_back(stream.stream());
    }
  }
  try {
    found->pool->policy().record_stream(reinterpret_cast<DevicePtr>(ptr.get()),
                                        reinterpret_cast<StreamHandle>(stream.stream()));
  } catch (const std::exception& error) {
    raise(error, "record_stream failed");
  }
}

// ------------------------------------------------------------------------------ lifecycle

bool VramledgerAllocator::initialized() { return initialized_.load(); }

void VramledgerAllocator::init(int device_count) {
  // torch's per_process_memory_fraction setting, read (and validated, with torch's message) at
  // initialisation as torch's allocator does; devices created later start from it.
  const double fraction = torch_configured_memory_fraction();
  {
    std::lock_guard<std::mutex> lock(devices_mutex_);
    if (fraction < 1.0) memory_fractions_.fill(fraction);
  }
  if (fraction < 1.0) {
    for (DeviceAllocators* state : created_devices()) setMemoryFraction(fraction, state->device());
  }
  device_count_.store(device_count);
  initialized_.store(true);
}

void VramledgerAllocator::enable(bool value) { enabled_.store(value); }

bool VramledgerAllocator::isEnabled() const { return enabled_.load(); }

void VramledgerAllocator::emptyCache(c10::MempoolId_t mempool_id) {
  process_deferred_frees();
  for (DeviceAllocators* state : created_devices()) {
    const RelaxedCaptureMode relaxed(!state->is_simulated());
    try {
      state->empty_cache(mempool_id);
    } catch (const std::exception& error) {
      raise(error, "empty_cache failed");
    }
  }
}

// ------------------------------------------------------------------------------ statistics

c10::CachingDeviceAllocator::DeviceStats VramledgerAllocator::getDeviceStats(
    c10::DeviceIndex device) {
  DeviceAllocators* state = device_if_created(device);
  // A device never used holds nothing: all zeros, without creating a CUDA context for it.
  auto stats = to_device_stats(state ? state->counters() : LedgerCounters{}, max_split_bytes());
  if (state != nullptr) {
    add_release_specific_stats(oom_rejections(device), state->private_pool_reserved(), stats);
  }
  return stats;
}

void VramledgerAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  if (DeviceAllocators* state = device_if_created(device)) state->reset_accumulated();
  if (device >= 0 && device < kMaxDevices) oom_rejections_[device].store(0);
}

std::int64_t VramledgerAllocator::oom_rejections(c10::DeviceIndex device) const {
  if (device < 0 || device >= kMaxDevices) return 0;
  return oom_rejections_[device].load();
}

void VramledgerAllocator::resetPeakStats(c10::DeviceIndex device) {
  if (DeviceAllocators* state = device_if_created(device)) state->reset_peaks();
  imported_memory().reset_peaks(device);  // cuda_ipc.hpp
}

double VramledgerAllocator::getMemoryFraction(c10::DeviceIndex device) {
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "vramledger: invalid CUDA device ",
              static_cast<int>(device));
  std::lock_guard<std::mutex> lock(devices_mutex_);
  return memory_fractions_[device];
}

void VramledgerAllocator::setMemoryFraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK(fraction >= 0.0 && fraction <= 1.0, "vramledger: invalid memory fraction ",
              fraction, " (expected a value in [0, 1])");
  DeviceAllocators& state = device_state(device);
  {
    std::lock_guard<std::mutex> lock(devices_mutex_);
    memory_fractions_[device] = fraction;
  }
  // The fraction caps reserved memory (each pool's, like torch's per-device limit); 1 lifts it.
  std::size_t cap = 0;
  if (fraction < 1.0) {
    const auto total = static_cast<double>(state.backend_info().total_bytes);
    cap = std::max<std::size_t>(1, static_cast<std::size_t>(fraction * total));
  }
  state.set_cap(cap);
}

std::vector<c10_alloc::StreamSegmentSize> VramledgerAllocator::getExpandableSegmentSizes(
    c10::DeviceIndex device) {
  std::vector<c10_alloc::StreamSegmentSize> sizes;
  DeviceAllocators* state = device_if_created(device);
  if (state == nullptr) return sizes;
  state->for_each_pool({0, 0}, [&](MemoryPool& pool) {
    for (const SegmentInfo& segment : pool.policy().segments()) {
      if (!segment.is_virtual_span) continue;
      sizes.emplace_back(reinterpret_cast<cudaStream_t>(segment.stream),
                         segment.pool == PoolKind::kSmall, segment.mapped_bytes);
    }
  }, /*all_pools=*/false);
  return sizes;
}

void VramledgerAllocator::cacheInfo(c10::DeviceIndex device, std::size_t* largest_block) {
  DeviceAllocators& state = device_state(device);
  if (*largest_block == 0) {
    // torch's convention: a zero guess starts from the device's free memory.
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    if (state.backend().memory_info(&free_bytes, &total_bytes).is_ok()) {
      *largest_block = free_bytes;
    }
  }
  const BlockCensus census = state.default_pool().policy().census();
  const auto cached =
      census.pools[static_cast<int>(PoolKind::kLarge)].largest_free_block;
  *largest_block = std::max(*largest_block, static_cast<std::size_t>(std::max<std::int64_t>(0, cached)));
}

void* VramledgerAllocator::getBaseAllocation(void* ptr, std::size_t* size) {
  std::optional<LiveAllocation> found = registry_.find(ptr);
  TORCH_CHECK(found.has_value(), "vramledger: invalid device pointer ", ptr);
  if (found->pool == nullptr) {  // uncached: its own cudaMalloc segment
    if (size != nullptr) *size = found->requested;
    return ptr;
  }
  try {
    const AllocationInfo info = found->pool->policy().describe(reinterpret_cast<DevicePtr>(ptr));
    if (size != nullptr) *size = info.segment_size;
    return reinterpret_cast<void*>(info.segment_base);
  } catch (const std::exception& error) {
    raise(error, "getBaseAllocation failed");
  }
}

// ------------------------------------------------------------------------------ snapshot

c10_alloc::SnapshotInfo VramledgerAllocator::snapshot(c10::MempoolId_t mempool_id,
                                                      bool include_traces) {
  c10_alloc::SnapshotInfo result;
  int device_count = device_count_.load();
  if (device_count <= 0) device_count = c10::cuda::device_count();
  result.device_traces.resize(static_cast<std::size_t>(std::max(device_count, 0)));
  for (DeviceAllocators* state : created_devices()) {
    state->for_each_pool(mempool_id, [&](MemoryPool& pool) {
      append_snapshot_segments(pool.policy().segments(), state->device(), pool.id(),
                               state->history(), result.segments);
    }, /*all_pools=*/is_default_pool(mempool_id));
    if (include_traces) {
      const auto index = static_cast<std::size_t>(state->device());
      if (index >= result.device_traces.size()) result.device_traces.resize(index + 1);
      result.device_traces[index] = state->history().entries();
      for (auto& annotation : state->history().annotations()) {
        result.external_annotations.push_back(std::move(annotation));
      }
    }
    // After the copy, as torch does: a snapshot's trace ends with the last allocator event, and
    // the marker correlates it with the next snapshot.
    state->history().record_snapshot_marker();
  }
  std::sort(result.segments.begin(), result.segments.end(),
            [](const auto& a, const auto& b) { return a.address < b.address; });

  auto& meta = result.config_metadata;
  meta.garbage_collection_threshold = 0.0;
  meta.max_split_size = max_split_bytes() == 0 ? std::numeric_limits<std::size_t>::max()
                                               : max_split_bytes();
  meta.pinned_num_register_threads = 1;
  DeviceAllocators* any = created_devices().empty() ? nullptr : created_devices().front();
  meta.expandable_segments = any != nullptr && any->default_pool_is_paged();
  meta.release_lock_on_malloc = false;
  meta.pinned_use_host_register = false;
  meta.graph_capture_record_stream_reuse = false;
  meta.last_allocator_settings = "vramledger:" + config_text_;
  // Rounding of requests: vramledger has no torch-style power-of-two divisions threshold and no
  // cached-size limit, which torch reports as 0.
  compat::fill_round_config_metadata(meta, 0, 0);
  return result;
}

// ------------------------------------------------------------------------------ pools

void VramledgerAllocator::beginAllocateToPool(c10::DeviceIndex device,
                                              c10::MempoolId_t mempool_id,
                                              std::function<bool(cudaStream_t)> filter) {
  device_state(device).begin_allocate_to_pool(mempool_id, std::move(filter));
}

void VramledgerAllocator::endAllocateToPool(c10::DeviceIndex device,
                                            c10::MempoolId_t mempool_id) {
  device_state(device).end_allocate_to_pool(mempool_id);
  process_deferred_frees();  // no-op unless this was the last capture
}

void VramledgerAllocator::releasePool(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  DeviceAllocators& state = device_state(device);
  const RelaxedCaptureMode relaxed(!state.is_simulated());
  state.release_pool(mempool_id);
}

int VramledgerAllocator::getPoolUseCount(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  DeviceAllocators* state = device_if_created(device);
  return state ? state->pool_use_count(mempool_id) : 0;
}

void VramledgerAllocator::createOrIncrefPool(c10::DeviceIndex device,
                                             c10::MempoolId_t mempool_id,
                                             std::shared_ptr<c10_alloc::CUDAAllocator> allocator) {
  // MemPool(allocator=<vramledger itself>) is an ordinary private pool.
  if (allocator.get() == this) allocator.reset();
  device_state(device).create_or_incref_pool(mempool_id, std::move(allocator));
}

void VramledgerAllocator::setUseOnOOM(c10::DeviceIndex device, c10::MempoolId_t mempool_id,
                                      bool use_on_oom) {
  DeviceAllocators* state = device_if_created(device);
  if (state == nullptr) {
    TORCH_CHECK(!use_on_oom, "vramledger: setUseOnOOM: no memory pool on device ",
                static_cast<int>(device));
    return;
  }
  state->set_use_on_oom(mempool_id, use_on_oom);
}

void VramledgerAllocator::setNoSplit(c10::DeviceIndex device, c10::MempoolId_t mempool_id) {
  device_state(device).set_no_split(mempool_id);
}

bool VramledgerAllocator::checkPoolLiveAllocations(
    c10::DeviceIndex device, c10::MempoolId_t mempool_id,
    const std::unordered_set<void*>& expected_live_allocations) {
  DeviceAllocators* state = device_if_created(device);
  if (state == nullptr) return expected_live_allocations.empty();
  std::size_t live = 0;
  bool all_expected = true;
  state->for_each_pool(mempool_id, [&](MemoryPool& pool) {
    if (pool.id() != mempool_id) return;
    for (const SegmentInfo& segment : pool.policy().segments()) {
      for (const BlockInfo& block : segment.blocks) {
        if (!block.allocated) continue;
        ++live;
        if (!expected_live_allocations.count(reinterpret_cast<void*>(block.address))) {
          all_expected = false;
        }
      }
    }
  }, /*all_pools=*/false);
  return all_expected && live == expected_live_allocations.size();
}

std::shared_ptr<c10_alloc::AllocatorState> VramledgerAllocator::getCheckpointState(
    c10::DeviceIndex device, c10::MempoolId_t id) {
  TORCH_CHECK(!is_default_pool(id), "vramledger: getCheckpointState: only private pools (CUDA "
              "graph pools) can be checkpointed, not the default pool");
  auto checkpoint = std::make_shared<PoolCheckpoint>();
  checkpoint->device = device;
  checkpoint->pool = id;
  DeviceAllocators* state = device_if_created(device);
  bool found = false;
  if (state != nullptr) {
    state->for_each_pool(id, [&](MemoryPool& pool) {
      if (pool.id() != id || found) return;
      found = true;
      for (const SegmentInfo& segment : pool.policy().segments()) {
        for (const BlockInfo& block : segment.blocks) {
          if (!block.allocated) continue;
          checkpoint->allocations.push_back(
              {block.address, block.requested, segment.stream, block.tag});
        }
      }
    }, /*all_pools=*/false);
  }
  TORCH_CHECK(found, "vramledger: getCheckpointState: no memory pool ", pool_name(id),
              " on device ", static_cast<int>(device));
  return checkpoint;
}

c10_alloc::CheckpointDelta VramledgerAllocator::setCheckpointPoolState(
    c10::DeviceIndex device, std::shared_ptr<c10_alloc::AllocatorState> pps) {
  auto checkpoint = std::dynamic_pointer_cast<PoolCheckpoint>(pps);
  TORCH_CHECK(checkpoint != nullptr, "vramledger: setCheckpointPoolState: the state was not made "
              "by vramledger's getCheckpointState (was the allocator changed in between?)");
  TORCH_CHECK(checkpoint->device == device, "vramledger: setCheckpointPoolState: the checkpoint "
              "is of device ", static_cast<int>(checkpoint->device), ", not ",
              static_cast<int>(device));
  // Frees recorded on other streams complete only after every capture (free_block): restoring
  // then could not put blocks back where they were.
  TORCH_CHECK(!any_capture_underway(), "vramledger: setCheckpointPoolState: cannot restore a "
              "pool while a CUDA graph is being captured");
  DeviceAllocators* state = device_if_created(device);
  MemoryPool* pool = nullptr;
  if (state != nullptr) {
    state->for_each_pool(checkpoint->pool, [&](MemoryPool& candidate) {
      if (candidate.id() != checkpoint->pool || pool != nullptr) return;
      candidate.live_blocks.fetch_add(1);  // keeps the pool alive while we work on it
      pool = &candidate;
    }, /*all_pools=*/false);
  }
  TORCH_CHECK(pool != nullptr, "vramledger: setCheckpointPoolState: no memory pool ",
              pool_name(checkpoint->pool), " on device ", static_cast<int>(device));
  struct Hold {
    DeviceAllocators& state;
    MemoryPool& pool;
    ~Hold() { state.release_block_of(pool); }
  } hold{*state, *pool};

  // Every block the pool handed out is freed (torch drops the deleters of their storages) ...
  c10_alloc::CheckpointDelta delta;
  for (const SegmentInfo& segment : pool->policy().segments()) {
    for (const BlockInfo& block : segment.blocks) {
      if (block.allocated) delta.ptrs_freed.push_back(reinterpret_cast<void*>(block.address));
    }
  }
  for (void* ptr : delta.ptrs_freed) free_block(ptr);
  pool->policy().process_completed_frees();
  // ... and the checkpoint's blocks come back where they were, with fresh DataPtrs torch hands
  // to the storages still alive.
  const RelaxedCaptureMode relaxed(!state->is_simulated());
  for (const PoolCheckpoint::Allocation& allocation : checkpoint->allocations) {
    DevicePtr address = 0;
    try {
      address = pool->policy().allocate_at(allocation.address, allocation.requested,
                                           allocation.stream, allocation.tag);
    } catch (const std::exception& error) {
      raise(error, "restoring a checkpointed CUDA graph pool");
    }
    pool->live_blocks.fetch_add(1);
    void* ptr = reinterpret_cast<void*>(address);
    registry_.insert(ptr, LiveAllocation{pool, device, allocation.requested, allocation.stream,
                                         false});
    if (c10::memoryProfilingEnabled()) {
      report_to_profiler(ptr, static_cast<std::int64_t>(allocation.requested), device);
    }
    delta.dataptrs_allocd.emplace_back(ptr, ptr, &delete_block,
                                       c10::Device(c10::DeviceType::CUDA, device));
  }
  return delta;
}

// ------------------------------------------------------------------------------ IPC
// shareIpcHandle and getIpcDevPtr: cuda_ipc.cpp (docs/ipc.md).

// ------------------------------------------------------------------------------ history

bool VramledgerAllocator::isHistoryEnabled() {
  std::lock_guard<std::mutex> lock(devices_mutex_);
  return history_settings_.enabled;
}

void VramledgerAllocator::recordHistory(bool enabled, c10_alloc::CreateContextFn context_recorder,
                                        std::size_t alloc_trace_max_entries,
                                        c10_alloc::RecordContext when, bool clear_history,
                                        const std::vector<std::string>& skip_actions) {
  HistorySettings settings;
  settings.enabled = enabled;
  settings.context_recorder = context_recorder;
  settings.max_entries = alloc_trace_max_entries;
  settings.when = when;
  for (const std::string& action : skip_actions) {
    const auto index =
        static_cast<std::size_t>(c10::CachingDeviceAllocator::parseTraceEntryAction(action));
    if (settings.skip.size() <= index) settings.skip.resize(index + 1, false);
    settings.skip[index] = true;
  }
  std::lock_guard<std::mutex> lock(devices_mutex_);
  history_settings_ = settings;
  for (DeviceAllocators* state : created_devices()) {
    state->history().configure(settings, clear_history);
  }
}

void VramledgerAllocator::recordAnnotation(
    const std::vector<std::pair<std::string, std::string>>& md) {
  if (DeviceAllocators* state = device_if_created(current_device())) {
    state->history().record_annotation(md);
  }
}

void VramledgerAllocator::pushCompileContext(std::string& md) { push_compile_context(md); }

void VramledgerAllocator::popCompileContext() { pop_compile_context(); }

void VramledgerAllocator::setUserMetadata(const std::string& metadata) {
  std::lock_guard<std::mutex> lock(devices_mutex_);
  user_metadata_ = metadata;
  for (DeviceAllocators* state : created_devices()) state->history().set_user_metadata(metadata);
}

std::string VramledgerAllocator::getUserMetadata() {
  std::lock_guard<std::mutex> lock(devices_mutex_);
  return user_metadata_;
}

void VramledgerAllocator::attachOutOfMemoryObserver(c10_alloc::OutOfMemoryObserver observer) {
  std::lock_guard<std::mutex> lock(oom_observers_mutex_);
  oom_observers_.push_back(std::move(observer));
}

void VramledgerAllocator::attachAllocatorTraceTracker(c10_alloc::AllocatorTraceTracker tracker) {
  std::lock_guard<std::mutex> lock(devices_mutex_);
  trace_trackers_.push_back(tracker);
  for (DeviceAllocators* state : created_devices()) state->history().attach_tracker(tracker);
}

// ------------------------------------------------------------------------------ peers

void VramledgerAllocator::enablePeerAccess(c10::DeviceIndex dev, c10::DeviceIndex dev_to_access) {
  {
    const c10::cuda::CUDAGuard guard(dev);
    const cudaError_t error = cudaDeviceEnablePeerAccess(dev_to_access, 0);
    if (error == cudaErrorPeerAccessAlreadyEnabled) {
      (void)cudaGetLastError();  // already enabled is fine; clear the sticky error
    } else {
      C10_CUDA_CHECK(error);
    }
  }
  // That covers cudaMalloc memory only: our VMM pages and cudaMallocAsync pools on dev_to_access
  // must grant dev access themselves (kernels on dev read tensors of dev_to_access directly).
  DeviceAllocators& target = device_state(dev_to_access);
  const c10::cuda::CUDAGuard guard(dev_to_access);
  if (Status status = target.backend().grant_peer_access(dev); !status.is_ok()) {
    TORCH_CHECK(false, "vramledger: letting device ", static_cast<int>(dev), " access device ",
                static_cast<int>(dev_to_access), "'s memory: ", status.message());
  }
}

cudaError_t VramledgerAllocator::memcpyAsync(void* dst, int dst_device, const void* src,
                                             int src_device, std::size_t count,
                                             cudaStream_t stream, bool p2p_enabled) {
  // Peer access only covers cudaMalloc memory: pages we map ourselves (vmm) are accessible to
  // their own device alone, and so is cudaMallocAsync pool memory (unless the pool's access is
  // widened), so across devices the driver must stage the copy.
  const auto peer_accessible = [this](int device) {
    DeviceAllocators* state = device_if_created(static_cast<c10::DeviceIndex>(device));
    return state == nullptr || state->memory_is_peer_accessible();
  };
  if (dst_device == src_device ||
      (p2p_enabled && peer_accessible(dst_device) && peer_accessible(src_device))) {
    return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
  }
  return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
}

std::string VramledgerAllocator::name() { return "vramledger"; }

// ------------------------------------------------------------------------------ newer releases

void VramledgerAllocator::add_oom_rejection_observer(OomRejectionCallback observer) {
  std::lock_guard<std::mutex> lock(oom_observers_mutex_);
  oom_rejection_observers_.push_back(std::move(observer));
}

std::shared_ptr<c10::GatheredContext> VramledgerAllocator::context_for_pointer(const void* ptr) {
  std::optional<LiveAllocation> found = registry_.find(const_cast<void*>(ptr));
  if (!found) return nullptr;
  DeviceAllocators* state = device_if_created(found->device);
  return state ? state->history().context_of(reinterpret_cast<std::uintptr_t>(ptr)) : nullptr;
}

void VramledgerAllocator::on_capture_marked(c10::DeviceIndex /*device*/, bool /*begins*/) {
  // Nothing to do: vramledger asks CUDA whether a stream captures (cudaStreamIsCapturing) at
  // the moments it matters, and routes allocations by begin/endAllocateToPool.
}

void VramledgerAllocator::annotate_allocation(const void* ptr, const std::string& metadata) {
  std::optional<LiveAllocation> found = registry_.find(const_cast<void*>(ptr));
  TORCH_CHECK(found.has_value(), "vramledger: annotate: ", ptr,
              " is not the base address of a live vramledger allocation");
  if (DeviceAllocators* state = device_if_created(found->device)) {
    state->history().record_memory_annotation(reinterpret_cast<std::uintptr_t>(ptr),
                                              found->requested, metadata);
  }
}

}  // namespace vramledger::torch_plugin
