// The helper thread that unmaps old addresses of moved chunks (background_unmaps.hpp).
#include "allocator/detail/background_unmaps.hpp"

#include <unistd.h>

#include <system_error>
#include <utility>

namespace vramledger {

BackgroundUnmaps::~BackgroundUnmaps() {
  if (in_forked_child()) {
    (void)helper_.release();  // the parent's thread: not ours to join (nor to destroy joinable)
    return;
  }
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (helper_ != nullptr) helper_->join();
  // Without a helper (it could not be started) queued jobs are the allocator's to finish; it
  // finishes every retiring mapping before it lets go of this object.
}

std::shared_ptr<UnmapJob> BackgroundUnmaps::submit(DevicePtr address, std::size_t bytes) {
  auto job = std::make_shared<UnmapJob>();
  job->address = address;
  job->bytes = bytes;
  pending_.fetch_add(1, std::memory_order_relaxed);
  if (in_forked_child()) return job;  // finish() will run it
  {
    std::lock_guard lock(mutex_);
    if (helper_ == nullptr && !stopping_) {
      try {
        helper_ = std::make_unique<std::thread>([this] { run_helper(); });
        helper_pid_ = static_cast<int>(getpid());
      } catch (const std::system_error&) {
        return job;  // no thread: finish() will run it
      }
    }
    queue_.push_back(job);
  }
  wake_.notify_one();
  return job;
}

bool BackgroundUnmaps::in_forked_child() const noexcept {
  // helper_pid_ is written once, before the helper exists; a fork copies it as it stood.
  return helper_pid_ != 0 && helper_pid_ != static_cast<int>(getpid());
}

Status BackgroundUnmaps::finish(UnmapJob& job) {
  if (in_forked_child()) {
    // A job the parent's helper was running will never end here: run it again.
    int running = UnmapJob::kRunning;
    job.state.compare_exchange_strong(running, UnmapJob::kQueued);
  }
  int expected = UnmapJob::kQueued;
  if (job.state.compare_exchange_strong(expected, UnmapJob::kRunning,
                                        std::memory_order_acq_rel)) {
    on_demand_.fetch_add(1, std::memory_order_relaxed);
    run(job);
    pending_.fetch_sub(1, std::memory_order_release);
  } else {
    while (expected == UnmapJob::kRunning) {
      job.state.wait(UnmapJob::kRunning, std::memory_order_acquire);
      expected = job.state.load(std::memory_order_acquire);
    }
    if (expected == UnmapJob::kFailed) {
      // Only the allocator's side touches a failed job: try once more, here.
      job.state.store(UnmapJob::kRunning, std::memory_order_relaxed);
      on_demand_.fetch_add(1, std::memory_order_relaxed);
      run(job);
    }
  }
  return job.status;
}

void BackgroundUnmaps::run(UnmapJob& job) {
  job.status = backend_.unmap_pages(job.address, job.bytes, 1);
  job.state.store(job.status.is_ok() ? UnmapJob::kDone : UnmapJob::kFailed,
                  std::memory_order_release);
  runs_ended_.fetch_add(1, std::memory_order_release);
  job.state.notify_all();
}

void BackgroundUnmaps::run_helper() {
  while (true) {
    std::shared_ptr<UnmapJob> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    int expected = UnmapJob::kQueued;
    if (job->state.compare_exchange_strong(expected, UnmapJob::kRunning,
                                           std::memory_order_acq_rel)) {
      by_helper_.fetch_add(1, std::memory_order_relaxed);
      run(*job);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }
}

}  // namespace vramledger
