// Old addresses of moved chunks, unmapped by a helper thread (docs/design.md, 3.1).
//
// When the paged heap moves an idle chunk to where a request needs pages, the chunk is mapped at
// the new address first and stays mapped at the old one, which retires (StreamHeaps::retiring:
// unusable until unmapped). The unmap (~20-26 us on the H200, a third of a move) then runs here,
// off the allocating thread, which on ViT training made ~250 moves in each peak step. Measured
// on the H200 (bench/vmm_sync_probe, 2026-12-03): chunk moves on one thread did not slow kernel
// launches on another (20,000 launches: 98.8 ms alone, 97.9 ms beside the moves).
//
// Ownership: the allocator, under its lock, submits jobs and alone decides when an old address
// must be gone (finish()); the helper only runs jobs nobody has started, and never takes the
// allocator's lock, so the allocator may wait for it while holding that lock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "allocator/device_backend.hpp"

namespace vramledger {

// One unmap of one old address. State moves queued -> running -> done or failed; whoever moves
// it out of queued (the helper, or finish() on the allocator's side) runs the unmap.
struct UnmapJob {
  enum State : int { kQueued, kRunning, kDone, kFailed };
  DevicePtr address = 0;
  std::size_t bytes = 0;
  std::atomic<int> state{kQueued};
  Status status;  // the driver's answer; written before state turns kDone or kFailed
};

class BackgroundUnmaps {
 public:
  explicit BackgroundUnmaps(DeviceBackend& backend) : backend_(backend) {}
  BackgroundUnmaps(const BackgroundUnmaps&) = delete;
  BackgroundUnmaps& operator=(const BackgroundUnmaps&) = delete;
  // Runs every job still queued, then stops the helper.
  ~BackgroundUnmaps();

  // Queues the unmap of [address, address + bytes); the helper thread starts on first use. If it
  // cannot be started the job stays queued and finish() runs it.
  std::shared_ptr<UnmapJob> submit(DevicePtr address, std::size_t bytes);

  // After this returns ok, the job's address is unmapped: run here if the helper had not started
  // it, else waited for. A job that failed on the helper is tried again here; a failure here is
  // returned (the job can be finished again later).
  Status finish(UnmapJob& job);

  static bool done(const UnmapJob& job) noexcept {
    return job.state.load(std::memory_order_acquire) == UnmapJob::kDone;
  }

  // Unmaps run by the helper (failed ones included), and by finish(): because the helper had
  // not started them yet, or to retry one that failed.
  std::uint64_t unmapped_by_helper() const noexcept {
    return by_helper_.load(std::memory_order_relaxed);
  }
  std::uint64_t unmapped_on_demand() const noexcept {
    return on_demand_.load(std::memory_order_relaxed);
  }
  // Runs ended so far, failed ones included (each turns a job kDone or kFailed): while it stands
  // still, no job has become done, so a look for done jobs would find none new.
  std::uint64_t runs_ended() const noexcept { return runs_ended_.load(std::memory_order_acquire); }
  // Jobs submitted that nobody has run yet, or whose first run has not ended.
  std::uint64_t pending() const noexcept { return pending_.load(std::memory_order_acquire); }

 private:
  void run_helper();
  void run(UnmapJob& job);

  // A child forked after the helper started has no helper, and may have inherited mutex_ held:
  // there, submit() leaves jobs for finish() and touches neither.
  bool in_forked_child() const noexcept;

  DeviceBackend& backend_;
  std::mutex mutex_;  // queue_, stopping_, helper_ (never held while unmapping)
  std::condition_variable wake_;
  std::deque<std::shared_ptr<UnmapJob>> queue_;
  bool stopping_ = false;
  std::unique_ptr<std::thread> helper_;
  int helper_pid_ = 0;  // the process the helper runs in
  std::atomic<std::uint64_t> by_helper_{0};
  std::atomic<std::uint64_t> on_demand_{0};
  std::atomic<std::uint64_t> pending_{0};
  std::atomic<std::uint64_t> runs_ended_{0};
};

}  // namespace vramledger
