// Fences: per-stream events that prove, without blocking, that work queued on a stream before
// some free has finished, so pages freed then may be unmapped.
#include <algorithm>
#include <iterator>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {

// The thread stops until the GPU has run the work queued before `event` (or all queued work):
// the GPU's queue runs dry meanwhile, which an allocation avoids wherever it can.
inline Status CachingAllocator::Impl::wait_for_gpu_event(EventHandle event) {
  host_waits_.fetch_add(1, std::memory_order_relaxed);
  return backend_.synchronize_event(event);
}

inline Status CachingAllocator::Impl::wait_for_device() {
  host_waits_.fetch_add(1, std::memory_order_relaxed);
  return backend_.synchronize_device();
}

inline void CachingAllocator::Impl::poll_fences(StreamHeaps& heaps) {
  while (!heaps.outstanding_fences.empty()) {
    auto [event, sequence] = heaps.outstanding_fences.front();
    EventState state = EventState::kPending;
    throw_if_error(backend_.query_event(event, &state), "querying a fence event");
    if (state != EventState::kComplete) return;
    heaps.completed_fence = sequence;
    spare_events_.push_back(event);
    heaps.outstanding_fences.pop_front();
  }
}

// Records a fence covering every page freed on the stream so far, unless one already does.
inline void CachingAllocator::Impl::issue_fence(StreamHeaps& heaps) {
  if (!heaps.page_freed_since_last_fence) return;
  EventHandle event = take_event();
  Status status = backend_.record_event(event, heaps.stream);
  if (!status) {
    // The stream is gone (or broken): the only proof left is an idle device.
    spare_events_.push_back(event);
    throw_if_error(wait_for_device(),
                   "synchronizing the device after recording a fence failed (" +
                       status.message() + ")");
    mark_all_frees_idle(heaps);
    return;
  }
  heaps.outstanding_fences.emplace_back(event, heaps.next_fence);
  heaps.next_fence++;
  heaps.page_freed_since_last_fence = false;
}

// Waits once, for the oldest outstanding fence that covers `sequence` (the newest when none
// does): a stream runs its work in order, so the older fences are complete when it is. (It
// waited for each older fence in turn before: one stop of the thread, several blocking calls.)
inline void CachingAllocator::Impl::wait_for_fence(StreamHeaps& heaps, std::uint64_t sequence) {
  auto& fences = heaps.outstanding_fences;
  if (heaps.fence_done(sequence) || fences.empty()) return;
  auto covering = std::find_if(fences.begin(), fences.end(),
                               [&](const auto& entry) { return entry.second >= sequence; });
  if (covering == fences.end()) covering = std::prev(fences.end());
  throw_if_error(wait_for_gpu_event(covering->first), "waiting for a fence event");
  heaps.completed_fence = covering->second;
  const auto done = std::next(covering);
  for (auto it = fences.begin(); it != done; ++it) spare_events_.push_back(it->first);
  fences.erase(fences.begin(), done);
}

// After the whole device was synchronized: everything freed on the stream so far is idle, and
// the outstanding fences prove nothing more.
inline void CachingAllocator::Impl::mark_all_frees_idle(StreamHeaps& heaps) {
  for (auto& [event, sequence] : heaps.outstanding_fences) spare_events_.push_back(event);
  heaps.outstanding_fences.clear();
  heaps.completed_fence = heaps.next_fence;
  heaps.next_fence++;
  heaps.page_freed_since_last_fence = false;
}

}  // namespace vramledger
