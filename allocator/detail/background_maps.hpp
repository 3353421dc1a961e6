// Maps made by a helper thread while the stream waits for them on the GPU (map_in_background,
// docs/design.md 3.1).
//
// A move costs the allocating thread an unmap (left to BackgroundUnmaps) and a map plus an access
// grant, 30-45 us on the H200. On ViT training, whose peak steps move ~250 chunks and whose
// allocating thread is the bottleneck there, that was the whole of the step-time excess over
// native. The pointer must not reach the GPU before its pages are mapped, but the CPU only has to
// hand it out: here the map is queued for a helper thread, and the stream is made to wait on the
// GPU (DeviceBackend::stream_wait_host_counter) until the helper has raised a counter past the
// job's ticket. The bench/vmm_sync_probe measured that moves on another thread do not slow the
// GPU's work (+0.03 us of GPU time per move) nor the launching thread's launches.
//
// Ordering: the counter is raised in ticket order (a job done out of order waits for those
// before it). Everything that touches the pages of a queued job from the CPU runs finish_all()
// first (empty_cache, sleep, teardown, census); a chunk taken from an idle block needs nothing:
// its block was freed after the wait and its fence has completed, so the GPU has passed the wait,
// so the counter, raised only after the map, is past the job.
//
// Failure: the helper tries a job three times; if it still fails, the allocator is poisoned (every
// later call raises the error) and the counter is raised anyway, so that the GPU does not wait for
// ever: work queued behind the wait will meet unmapped memory. The option is off by default.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "allocator/device_backend.hpp"

namespace vramledger {

// The maps of one allocation, in order.
struct MapJob {
  enum State : int { kQueued, kRunning, kDone, kFailed };
  struct Piece {
    DevicePtr address = 0;
    std::size_t bytes = 0;
    PhysicalHandle handle = 0;
  };
  std::vector<Piece> pieces;
  std::uint32_t ticket = 0;
  std::atomic<int> state{kQueued};
  Status status;  // the driver's answer; written before state turns kDone or kFailed
};

class BackgroundMaps {
 public:
  explicit BackgroundMaps(DeviceBackend& backend) : backend_(backend) {}
  BackgroundMaps(const BackgroundMaps&) = delete;
  BackgroundMaps& operator=(const BackgroundMaps&) = delete;
  // Finishes every job, stops the helper, destroys the counter.
  ~BackgroundMaps();

  // Queues `pieces` for the helper and makes `stream` wait for them on the GPU. Returns false,
  // having queued nothing, when that cannot be done (no counter, a capturing stream, no thread,
  // a forked child): the caller maps in place. Under the allocator's lock.
  bool submit(StreamHandle stream, std::vector<MapJob::Piece> pieces);

  // Every job submitted so far has run (here if the helper had not started it). Returns the
  // first failure the allocator has not yet been told of (the poison, see above).
  Status finish_all();

  // The error of a job that failed three times, once and for all; ok otherwise.
  Status poison() const;
  bool poisoned() const noexcept { return poisoned_.load(std::memory_order_acquire); }

  std::uint64_t mapped_by_helper() const noexcept { return by_helper_.load(std::memory_order_relaxed); }
  std::uint64_t mapped_on_demand() const noexcept { return on_demand_.load(std::memory_order_relaxed); }
  // Jobs submitted whose run has not ended.
  std::uint64_t pending() const noexcept { return pending_.load(std::memory_order_acquire); }

 private:
  void run_helper();
  // Runs a job taken out of kQueued: three tries, then the poison.
  void run(MapJob& job);
  // Raises the counter past every job done in ticket order (the helper's or finish_all's).
  void raise_in_order();
  bool in_forked_child() const noexcept;

  DeviceBackend& backend_;
  std::optional<HostCounter> counter_;  // created on first submit; empty if that failed
  bool counter_refused_ = false;
  std::uint32_t next_ticket_ = 0;  // under the allocator's lock

  std::mutex mutex_;  // queue_, stopping_, helper_ (never held while mapping)
  std::condition_variable wake_;
  std::deque<std::shared_ptr<MapJob>> queue_;
  bool stopping_ = false;
  std::unique_ptr<std::thread> helper_;
  int helper_pid_ = 0;

  std::mutex order_mutex_;  // in_ticket_order_, raised_
  std::deque<std::shared_ptr<MapJob>> in_ticket_order_;  // submitted, not yet passed by the counter

  mutable std::mutex poison_mutex_;
  Status poison_;
  std::atomic<bool> poisoned_{false};

  std::atomic<std::uint64_t> by_helper_{0};
  std::atomic<std::uint64_t> on_demand_{0};
  std::atomic<std::uint64_t> pending_{0};
};

}  // namespace vramledger
