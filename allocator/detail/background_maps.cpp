// The helper thread that maps pages while the stream waits on the GPU (background_maps.hpp).
#include "allocator/detail/background_maps.hpp"

#include <unistd.h>

#include <chrono>
#include <span>
#include <string>
#include <system_error>
#include <utility>

namespace vramledger {

BackgroundMaps::~BackgroundMaps() {
  if (in_forked_child()) {
    (void)helper_.release();  // the parent's thread: not ours to join
    return;
  }
  (void)finish_all();
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (helper_ != nullptr) helper_->join();
  if (counter_) {
    // The GPU may not have reached the last waits yet: they read the counter's memory.
    (void)backend_.synchronize_device();
    (void)backend_.destroy_host_counter(*counter_);
  }
}

bool BackgroundMaps::in_forked_child() const noexcept {
  return helper_pid_ != 0 && helper_pid_ != static_cast<int>(getpid());
}

bool BackgroundMaps::submit(StreamHandle stream, std::vector<MapJob::Piece> pieces) {
  if (in_forked_child() || poisoned()) return false;
  if (!counter_ && !counter_refused_) {
    HostCounter counter;
    if (backend_.create_host_counter(&counter).is_ok()) {
      counter_ = counter;
    } else {
      counter_refused_ = true;
    }
  }
  if (!counter_) return false;
  const std::uint32_t ticket = next_ticket_ + 1;
  if (!backend_.stream_wait_host_counter(stream, *counter_, ticket).is_ok()) return false;
  next_ticket_ = ticket;
  auto job = std::make_shared<MapJob>();
  job->pieces = std::move(pieces);
  job->ticket = ticket;
  pending_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard lock(order_mutex_);
    in_ticket_order_.push_back(job);
  }
  bool queued = false;
  {
    std::lock_guard lock(mutex_);
    if (helper_ == nullptr && !stopping_) {
      try {
        helper_ = std::make_unique<std::thread>([this] { run_helper(); });
        helper_pid_ = static_cast<int>(getpid());
      } catch (const std::system_error&) {
        // No thread: the job runs below, here.
      }
    }
    if (helper_ != nullptr && !stopping_) {
      queue_.push_back(job);
      queued = true;
    }
  }
  if (queued) {
    wake_.notify_one();
  } else {
    int expected = MapJob::kQueued;
    if (job->state.compare_exchange_strong(expected, MapJob::kRunning)) {
      on_demand_.fetch_add(1, std::memory_order_relaxed);
      run(*job);
    }
  }
  return true;
}

Status BackgroundMaps::finish_all() {
  std::deque<std::shared_ptr<MapJob>> jobs;
  {
    std::lock_guard lock(order_mutex_);
    jobs = in_ticket_order_;
  }
  for (const std::shared_ptr<MapJob>& job : jobs) {
    int expected = MapJob::kQueued;
    if (in_forked_child()) {
      // A job the parent's helper was running will never end here: run it again.
      int running = MapJob::kRunning;
      job->state.compare_exchange_strong(running, MapJob::kQueued);
    }
    if (job->state.compare_exchange_strong(expected, MapJob::kRunning,
                                           std::memory_order_acq_rel)) {
      on_demand_.fetch_add(1, std::memory_order_relaxed);
      run(*job);
    } else {
      while (expected == MapJob::kRunning) {
        job->state.wait(MapJob::kRunning, std::memory_order_acquire);
        expected = job->state.load(std::memory_order_acquire);
      }
    }
  }
  return poison();
}

Status BackgroundMaps::poison() const {
  if (!poisoned()) return Status::ok();
  std::lock_guard lock(poison_mutex_);
  return poison_;
}

void BackgroundMaps::run(MapJob& job) {
  constexpr int kTries = 3;
  Status status;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(attempt));
    std::size_t mapped = 0;
    status = Status::ok();
    for (; mapped < job.pieces.size(); ++mapped) {
      const MapJob::Piece& piece = job.pieces[mapped];
      status = backend_.map_pages(piece.address, piece.bytes,
                                  std::span<const PhysicalHandle>(&piece.handle, 1));
      if (!status.is_ok()) break;
    }
    if (status.is_ok()) break;
    for (std::size_t i = 0; i < mapped; ++i) {  // leave nothing of this try behind
      (void)backend_.unmap_pages(job.pieces[i].address, job.pieces[i].bytes, 1);
    }
  }
  job.status = status;
  if (!status.is_ok()) {
    std::lock_guard lock(poison_mutex_);
    if (!poisoned_.load(std::memory_order_relaxed)) {
      poison_ = Status(status.code(),
                       "a map made off the allocating thread (map_in_background) failed " +
                           std::to_string(kTries) + " times; work queued on its stream after the "
                           "allocation may meet unmapped memory: " + status.message());
      poisoned_.store(true, std::memory_order_release);
    }
  }
  job.state.store(status.is_ok() ? MapJob::kDone : MapJob::kFailed, std::memory_order_release);
  job.state.notify_all();
  pending_.fetch_sub(1, std::memory_order_release);
  raise_in_order();
}

void BackgroundMaps::raise_in_order() {
  std::lock_guard lock(order_mutex_);
  std::optional<std::uint32_t> passed;
  while (!in_ticket_order_.empty()) {
    const int state = in_ticket_order_.front()->state.load(std::memory_order_acquire);
    if (state != MapJob::kDone && state != MapJob::kFailed) break;
    passed = in_ticket_order_.front()->ticket;
    in_ticket_order_.pop_front();
  }
  if (!passed) return;
  // A raise that fails would leave the GPU waiting for ever: try again, then poison.
  Status status;
  for (int attempt = 0; attempt < 3; ++attempt) {
    status = backend_.raise_host_counter(*counter_, *passed);
    if (status.is_ok()) return;
  }
  std::lock_guard poison_lock(poison_mutex_);
  if (!poisoned_.load(std::memory_order_relaxed)) {
    poison_ = Status(status.code(), "raising the counter a stream waits on after maps made off "
                                    "the allocating thread failed: " + status.message());
    poisoned_.store(true, std::memory_order_release);
  }
}

void BackgroundMaps::run_helper() {
  while (true) {
    std::shared_ptr<MapJob> job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    int expected = MapJob::kQueued;
    if (job->state.compare_exchange_strong(expected, MapJob::kRunning,
                                           std::memory_order_acq_rel)) {
      by_helper_.fetch_add(1, std::memory_order_relaxed);
      run(*job);
    }
  }
}

}  // namespace vramledger
