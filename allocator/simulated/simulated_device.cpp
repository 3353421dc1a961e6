#include "allocator/simulated/simulated_device.hpp"

#include <algorithm>
#include <numeric>
#include <string>

#include "allocator/simulated/text_format.hpp"

namespace vramledger {

namespace {

BackendInfo make_info(const SimulatedDeviceOptions& options) {
  BackendInfo info;
  info.name = "simulated";
  info.device = options.device;
  info.total_bytes = options.capacity_bytes;
  // BackendInfo::granularity is the VMM page size, or without VMM the segment rounding.
  info.granularity =
      options.supports_virtual_memory ? options.granularity : options.segment_rounding;
  info.supports_virtual_memory = options.supports_virtual_memory;
  info.allows_second_mapping = options.supports_virtual_memory && options.allow_aliased_mappings;
  info.stream_ordered_segments = false;
  return info;
}

std::size_t index_of(SimOp op) {
  const auto index = static_cast<std::size_t>(op);
  if (index >= kSimOpCount) {
    throw Error(ErrorCode::kInvalidArgument, "SimOp::kCount is not an operation");
  }
  return index;
}

}  // namespace

SimulatedDevice::SimulatedDevice(SimulatedDeviceOptions options)
    : options_(options), info_(make_info(options)), memory_(options) {}

SimulatedDevice::~SimulatedDevice() = default;

Status SimulatedDevice::begin_call(SimOp op) {
  const std::size_t index = static_cast<std::size_t>(op);
  ++call_counts_[index];
  const ErrorCode injected = faults_.on_call(op);
  if (injected == ErrorCode::kOk) return Status::ok();
  return {injected, "injected failure of " + std::string(to_string(op)) + " (call #" +
                        std::to_string(call_counts_[index]) +
                        "); the simulated device changed nothing"};
}

Status SimulatedDevice::vmm_not_supported(SimOp op) const {
  return {ErrorCode::kNotSupported,
          std::string(to_string(op)) +
              ": this simulated device was configured without virtual memory management"};
}

// --- DeviceBackend: memory ---

Status SimulatedDevice::memory_info(std::size_t* free_bytes, std::size_t* total_bytes) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kMemoryInfo); !status) return status;
  *free_bytes = memory_.capacity_bytes() - memory_.physical_bytes_in_use();
  *total_bytes = memory_.capacity_bytes();
  return Status::ok();
}

Status SimulatedDevice::allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kAllocateSegment); !status) return status;
  if (Status status = timeline_.check_live(stream, "allocate_segment"); !status) return status;
  return memory_.allocate_segment(bytes, out);
}

Status SimulatedDevice::free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle /*stream*/) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kFreeSegment); !status) return status;
  Status status = memory_.free_segment(ptr, bytes);
  if (status) contents_.forget(ptr);
  return status;
}

Status SimulatedDevice::create_physical(std::size_t bytes, PhysicalHandle* out) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kCreatePhysical); !status) return status;
  if (!options_.supports_virtual_memory) return vmm_not_supported(SimOp::kCreatePhysical);
  return memory_.create_physical(bytes, out);
}

Status SimulatedDevice::release_physical(PhysicalHandle handle) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kReleasePhysical); !status) return status;
  if (!options_.supports_virtual_memory) return vmm_not_supported(SimOp::kReleasePhysical);
  Status status = memory_.release_physical(handle);
  if (status) contents_.forget(handle);
  return status;
}

Status SimulatedDevice::reserve_address_range(std::size_t bytes, DevicePtr* out) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kReserveAddress); !status) return status;
  if (!options_.supports_virtual_memory) return vmm_not_supported(SimOp::kReserveAddress);
  return memory_.reserve_address_range(bytes, out);
}

Status SimulatedDevice::free_address_range(DevicePtr base, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kFreeAddress); !status) return status;
  if (!options_.supports_virtual_memory) return vmm_not_supported(SimOp::kFreeAddress);
  return memory_.free_address_range(base, bytes);
}

Status SimulatedDevice::map_pages(DevicePtr va, std::size_t page_bytes,
                                  std::span<const PhysicalHandle> handles) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kMapPages); !status) return status;
  if (!options_.supports_virtual_memory) return vmm_not_supported(SimOp::kMapPages);
  return memory_.map_pages(va, page_bytes, handles);
}

Status SimulatedDevice::unmap_pages(DevicePtr va, std::size_t page_bytes, std::size_t count) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kUnmapPages); !status) return status;
  if (!options_.supports_virtual_memory) return vmm_not_supported(SimOp::kUnmapPages);
  return memory_.unmap_pages(va, page_bytes, count);
}

// --- DeviceBackend: events ---

Status SimulatedDevice::create_event(EventHandle* out) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kCreateEvent); !status) return status;
  *out = timeline_.create_event();
  return Status::ok();
}

Status SimulatedDevice::destroy_event(EventHandle event) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kDestroyEvent); !status) return status;
  return timeline_.destroy_event(event);
}

Status SimulatedDevice::record_event(EventHandle event, StreamHandle stream) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kRecordEvent); !status) return status;
  return timeline_.record_event(event, stream);
}

Status SimulatedDevice::query_event(EventHandle event, EventState* state) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kQueryEvent); !status) return status;
  return timeline_.query_event(event, state);
}

Status SimulatedDevice::synchronize_event(EventHandle event) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kSynchronizeEvent); !status) return status;
  return timeline_.synchronize_event(event);
}

Status SimulatedDevice::stream_wait_event(StreamHandle stream, EventHandle event) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kStreamWaitEvent); !status) return status;
  return timeline_.stream_wait_event(stream, event);
}

Status SimulatedDevice::synchronize_device() {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kSynchronizeDevice); !status) return status;
  timeline_.synchronize_device();
  return Status::ok();
}

// --- Work the test stands for ---

EventHandle SimulatedDevice::enqueue_user_work(StreamHandle stream) {
  std::lock_guard lock(mutex_);
  const EventHandle token = timeline_.create_event();
  if (!timeline_.record_event(token, stream)) {
    (void)timeline_.destroy_event(token);
    return 0;
  }
  return token;
}

bool SimulatedDevice::user_work_done(EventHandle token) {
  std::lock_guard lock(mutex_);
  EventState state = EventState::kComplete;
  if (timeline_.query_event(token, &state) && state == EventState::kPending) return false;
  (void)timeline_.destroy_event(token);
  return true;
}

void SimulatedDevice::note_user_work_uses(EventHandle token, DevicePtr ptr, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  EventState state = EventState::kComplete;
  if (!timeline_.query_event(token, &state) || state == EventState::kComplete) return;
  noted_uses_.push_back({token, memory_.memory_behind(ptr, bytes)});
}

std::optional<std::string> SimulatedDevice::find_hazard(StreamHandle stream, DevicePtr ptr,
                                                        std::size_t bytes) {
  std::lock_guard lock(mutex_);
  const std::vector<SimulatedMemory::MemoryPiece> wanted = memory_.memory_behind(ptr, bytes);
  for (std::size_t i = 0; i < noted_uses_.size();) {
    const NotedUse& use = noted_uses_[i];
    EventState state = EventState::kComplete;
    if (!timeline_.query_event(use.token, &state) || state == EventState::kComplete) {
      noted_uses_[i] = std::move(noted_uses_.back());
      noted_uses_.pop_back();
      continue;
    }
    ++i;
    if (timeline_.orders_new_work_after(stream, use.token)) continue;
    for (const auto& a : use.pieces) {
      for (const auto& b : wanted) {
        if (a.owner == b.owner && a.begin < b.end && b.begin < a.end) {
          return "new work on stream " + simulated_detail::hex_address(stream) + " at " + simulated_detail::hex_address(ptr) +
                 " may run before earlier work (token " + simulated_detail::hex_address(use.token) +
                 ") that still uses the same memory (" + simulated_detail::hex_address(a.owner) + " +" +
                 std::to_string(std::max(a.begin, b.begin)) + ")";
        }
      }
    }
  }
  return std::nullopt;
}

// --- Streams ---

StreamHandle SimulatedDevice::create_stream() {
  std::lock_guard lock(mutex_);
  return timeline_.create_stream();
}

Status SimulatedDevice::destroy_stream(StreamHandle stream) {
  std::lock_guard lock(mutex_);
  return timeline_.destroy_stream(stream);
}

Status SimulatedDevice::pause_stream(StreamHandle stream) {
  std::lock_guard lock(mutex_);
  return timeline_.pause_stream(stream);
}

Status SimulatedDevice::resume_stream(StreamHandle stream) {
  std::lock_guard lock(mutex_);
  return timeline_.resume_stream(stream);
}

bool SimulatedDevice::is_stream_live(StreamHandle stream) const {
  std::lock_guard lock(mutex_);
  return timeline_.is_live(stream);
}

// --- Queries ---

std::size_t SimulatedDevice::physical_bytes_in_use() const {
  std::lock_guard lock(mutex_);
  return memory_.physical_bytes_in_use();
}

bool SimulatedDevice::is_range_accessible(DevicePtr ptr, std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  return memory_.is_range_accessible(ptr, bytes);
}

std::size_t SimulatedDevice::mapped_bytes() const {
  std::lock_guard lock(mutex_);
  return memory_.mapped_bytes();
}

std::size_t SimulatedDevice::reserved_address_bytes() const {
  std::lock_guard lock(mutex_);
  return memory_.reserved_address_bytes();
}

std::size_t SimulatedDevice::live_segment_count() const {
  std::lock_guard lock(mutex_);
  return memory_.segment_count();
}

std::size_t SimulatedDevice::live_physical_handle_count() const {
  std::lock_guard lock(mutex_);
  return memory_.physical_handle_count();
}

std::size_t SimulatedDevice::live_address_range_count() const {
  std::lock_guard lock(mutex_);
  return memory_.address_range_count();
}

std::size_t SimulatedDevice::live_event_count() const {
  std::lock_guard lock(mutex_);
  return timeline_.live_event_count();
}

std::size_t SimulatedDevice::live_stream_count() const {
  std::lock_guard lock(mutex_);
  return timeline_.live_stream_count();
}

// --- Counters and faults ---

std::uint64_t SimulatedDevice::call_count(SimOp op) const {
  const std::size_t index = index_of(op);
  std::lock_guard lock(mutex_);
  return call_counts_[index];
}

std::uint64_t SimulatedDevice::total_call_count() const {
  std::lock_guard lock(mutex_);
  return std::accumulate(call_counts_.begin(), call_counts_.end(), std::uint64_t{0});
}

void SimulatedDevice::reset_call_counts() {
  std::lock_guard lock(mutex_);
  call_counts_.fill(0);
  faults_.reset_injected_counts();
}

void SimulatedDevice::inject_failure_at(SimOp op, std::uint64_t nth_call_from_now, ErrorCode code) {
  std::lock_guard lock(mutex_);
  faults_.fail_at(op, nth_call_from_now, code);
}

void SimulatedDevice::inject_failure_rate(SimOp op, double fraction, std::uint64_t seed,
                                          ErrorCode code) {
  std::lock_guard lock(mutex_);
  faults_.fail_at_rate(op, fraction, seed, code);
}

void SimulatedDevice::clear_faults() {
  std::lock_guard lock(mutex_);
  faults_.clear();
}

std::uint64_t SimulatedDevice::injected_failure_count(SimOp op) const {
  std::lock_guard lock(mutex_);
  return faults_.injected_count(op);
}

// --- Sleep and wake: copies and contents ---

Status SimulatedDevice::copy_to_host(void* host, DevicePtr device, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kCopyToHost); !status) return status;
  if (!memory_.is_range_accessible(device, bytes)) {
    return {ErrorCode::kInvalidArgument, "copy_to_host: " + std::to_string(bytes) +
                                             " bytes at " + simulated_detail::hex_address(device) +
                                             " are not all mapped"};
  }
  contents_.read(memory_.memory_behind(device, bytes), host);
  return Status::ok();
}

Status SimulatedDevice::copy_to_device(DevicePtr device, const void* host, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (Status status = begin_call(SimOp::kCopyToDevice); !status) return status;
  if (!memory_.is_range_accessible(device, bytes)) {
    return {ErrorCode::kInvalidArgument, "copy_to_device: " + std::to_string(bytes) +
                                             " bytes at " + simulated_detail::hex_address(device) +
                                             " are not all mapped"};
  }
  contents_.write(memory_.memory_behind(device, bytes), host);
  return Status::ok();
}

bool SimulatedDevice::capture_underway() const {
  std::lock_guard lock(mutex_);
  return capture_underway_;
}

void SimulatedDevice::set_capture_underway(bool underway) {
  std::lock_guard lock(mutex_);
  capture_underway_ = underway;
}

Status SimulatedDevice::write_bytes(DevicePtr device, const void* data, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  if (!memory_.is_range_accessible(device, bytes)) {
    return {ErrorCode::kInvalidArgument, "write_bytes: not all mapped at " + simulated_detail::hex_address(device)};
  }
  contents_.write(memory_.memory_behind(device, bytes), data);
  return Status::ok();
}

Status SimulatedDevice::read_bytes(DevicePtr device, void* out, std::size_t bytes) const {
  std::lock_guard lock(mutex_);
  if (!memory_.is_range_accessible(device, bytes)) {
    return {ErrorCode::kInvalidArgument, "read_bytes: not all mapped at " + simulated_detail::hex_address(device)};
  }
  contents_.read(memory_.memory_behind(device, bytes), out);
  return Status::ok();
}

}  // namespace vramledger
