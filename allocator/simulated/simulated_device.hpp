// A test double for the CUDA driver: a DeviceBackend with exact physical accounting, the VMM
// rules the real driver enforces, streams and events whose completion the test controls, call
// counters and fault injection. Used by unit tests and by offline trace replay.
//
// Rules (details in simulated_memory.hpp and stream_timeline.hpp):
//  * capacity limits segment bytes (rounded up to segment_rounding) plus physical handles;
//  * addresses are never reused and regions never touch, so stale pointers are detectable;
//  * caller mistakes return kInvalidArgument, unknown or destroyed streams kInvalidStream,
//    lack of memory kOutOfMemory; a failed call changes nothing;
//  * free_segment is not stream-ordered: its stream argument is ignored (it may be destroyed);
//  * every DeviceBackend call counts once per SimOp, failed or not; create/destroy/pause/resume
//    of streams are test controls and are not counted;
//  * an injected failure happens before anything else, changes nothing, and its message starts
//    with "injected failure".
//
// Thread safety: every method may be called from any thread (one internal mutex).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "allocator/device_backend.hpp"
#include "allocator/simulated/fault_injector.hpp"
#include "allocator/simulated/sim_op.hpp"
#include "allocator/simulated/simulated_contents.hpp"
#include "allocator/simulated/simulated_device_options.hpp"
#include "allocator/simulated/simulated_memory.hpp"
#include "allocator/simulated/stream_timeline.hpp"

namespace vramledger {

class SimulatedDevice : public DeviceBackend {
 public:
  // Throws Error(kInvalidArgument) for a granularity that is not a power of two or a zero
  // segment_rounding.
  explicit SimulatedDevice(SimulatedDeviceOptions options = {});
  ~SimulatedDevice() override;
  SimulatedDevice(const SimulatedDevice&) = delete;
  SimulatedDevice& operator=(const SimulatedDevice&) = delete;

  // --- DeviceBackend ---
  const BackendInfo& info() const override { return info_; }
  Status memory_info(std::size_t* free_bytes, std::size_t* total_bytes) override;
  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override;
  Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) override;
  Status create_physical(std::size_t bytes, PhysicalHandle* out) override;
  Status release_physical(PhysicalHandle handle) override;
  Status reserve_address_range(std::size_t bytes, DevicePtr* out) override;
  Status free_address_range(DevicePtr base, std::size_t bytes) override;
  Status map_pages(DevicePtr va, std::size_t page_bytes,
                   std::span<const PhysicalHandle> handles) override;
  Status unmap_pages(DevicePtr va, std::size_t page_bytes, std::size_t count) override;
  Status create_event(EventHandle* out) override;
  Status destroy_event(EventHandle event) override;
  Status record_event(EventHandle event, StreamHandle stream) override;
  Status query_event(EventHandle event, EventState* state) override;
  // A pending event: simulates the device finishing the work up to it (even on a paused
  // stream, which stays paused for later work) — see stream_timeline.hpp.
  Status synchronize_event(EventHandle event) override;
  Status stream_wait_event(StreamHandle stream, EventHandle event) override;
  // Completes all work queued so far on every stream; paused streams stay paused.
  Status synchronize_device() override;
  // Copies through the mapping of the moment: the bytes are stored per physical handle or
  // segment (simulated_contents.hpp). Unmapped or unknown addresses are kInvalidArgument.
  Status copy_to_host(void* host, DevicePtr device, std::size_t bytes) override;
  Status copy_to_device(DevicePtr device, const void* host, std::size_t bytes) override;
  // A CUDA graph capture as the test declares it (set_capture_underway).
  bool capture_underway() const override;

  // --- Streams the test controls (stream 0 always exists) ---
  StreamHandle create_stream();
  // kInvalidStream for stream 0 and for unknown or destroyed streams. Queued work still completes.
  Status destroy_stream(StreamHandle stream);
  // Events recorded on a paused stream stay pending until it resumes.
  Status pause_stream(StreamHandle stream);
  // Completes the stream's queued work (except what still waits on other streams' events).
  Status resume_stream(StreamHandle stream);
  bool is_stream_live(StreamHandle stream) const;

  // --- Work the test stands for (no call counted, no fault injected) ---
  // Enqueues an item on `stream`, standing for a kernel the user launched there, and returns a
  // token for it (0 when the stream is unknown). With the stream paused, it stays pending.
  EventHandle enqueue_user_work(StreamHandle stream);
  // Whether that work has completed; the token is forgotten once it has.
  bool user_work_done(EventHandle token);
  // That work reads or writes [ptr, ptr + bytes): the memory behind those addresses now (a
  // physical handle's bytes, a segment's bytes) stays in use by it until it completes.
  void note_user_work_uses(EventHandle token, DevicePtr ptr, std::size_t bytes);
  // A use-before-ready hazard: new work on `stream` touching [ptr, ptr + bytes) could run
  // while noted work that uses the same memory — at any address — has not finished and is not
  // ordered before it. Returns a description, or nothing when every such use is ordered first.
  std::optional<std::string> find_hazard(StreamHandle stream, DevicePtr ptr,
                                         std::size_t bytes);

  // --- Test controls for sleep and wake ---
  void set_capture_underway(bool underway);
  // The user's kernels writing and reading device memory (no call counted, no fault injected);
  // kInvalidArgument when a byte is not accessible.
  Status write_bytes(DevicePtr device, const void* data, std::size_t bytes);
  Status read_bytes(DevicePtr device, void* out, std::size_t bytes) const;

  // --- Queries for tests ---
  const SimulatedDeviceOptions& options() const { return options_; }
  std::size_t physical_bytes_in_use() const;
  // Every byte of [ptr, ptr + bytes) lies in a live segment or a mapped page (true for bytes 0).
  bool is_range_accessible(DevicePtr ptr, std::size_t bytes) const;
  std::size_t mapped_bytes() const;
  std::size_t reserved_address_bytes() const;
  std::size_t live_segment_count() const;
  std::size_t live_physical_handle_count() const;
  std::size_t live_address_range_count() const;
  std::size_t live_event_count() const;
  std::size_t live_stream_count() const;  // stream 0 included

  // --- Call counters ---
  std::uint64_t call_count(SimOp op) const;
  // Sum over all operations.
  std::uint64_t total_call_count() const;
  // Zeroes call counts and injected-failure counts; armed failures stay armed.
  void reset_call_counts();

  // --- Fault injection ---
  // The nth_call_from_now-th next call of `op` (1 = the very next) fails with `code`, once.
  // Throws Error(kInvalidArgument) for 0, SimOp::kCount or ErrorCode::kOk.
  void inject_failure_at(SimOp op, std::uint64_t nth_call_from_now,
                         ErrorCode code = ErrorCode::kDriverError);
  // Each later call of `op` fails with probability `fraction`, drawn from a generator seeded
  // with `seed` (reproducible). Replaces an earlier rate for `op`. Throws Error(kInvalidArgument)
  // unless 0 <= fraction <= 1.
  void inject_failure_rate(SimOp op, double fraction, std::uint64_t seed,
                           ErrorCode code = ErrorCode::kDriverError);
  // Disarms all armed failures (counts are kept).
  void clear_faults();
  std::uint64_t injected_failure_count(SimOp op) const;

 private:
  struct NotedUse {
    EventHandle token = 0;
    std::vector<SimulatedMemory::MemoryPiece> pieces;
  };
  std::vector<NotedUse> noted_uses_;  // pending user work and the memory it touches

  // Counts the call and returns the injected failure, if one is due. Lock held.
  Status begin_call(SimOp op);
  Status vmm_not_supported(SimOp op) const;

  const SimulatedDeviceOptions options_;
  const BackendInfo info_;

  mutable std::mutex mutex_;
  SimulatedMemory memory_;
  SimulatedContents contents_;
  bool capture_underway_ = false;
  StreamTimeline timeline_;
  FaultInjector faults_;
  std::array<std::uint64_t, kSimOpCount> call_counts_{};
};

}  // namespace vramledger
