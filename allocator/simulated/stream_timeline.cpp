#include "allocator/simulated/stream_timeline.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "allocator/simulated/text_format.hpp"

namespace vramledger {

using simulated_detail::hex_address;

namespace {

Status unknown_event(EventHandle event, const char* caller) {
  return {ErrorCode::kInvalidArgument, std::string(caller) + ": unknown event " +
                                           hex_address(event) +
                                           " (never created or already destroyed)"};
}

}  // namespace

StreamTimeline::StreamTimeline() {
  streams_.emplace(StreamHandle{0}, Stream{});
}

// --- Streams ---

StreamHandle StreamTimeline::create_stream() {
  const StreamHandle handle = next_stream_++;
  streams_.emplace(handle, Stream{});
  return handle;
}

bool StreamTimeline::is_live(StreamHandle stream) const {
  auto it = streams_.find(stream);
  return it != streams_.end() && it->second.live;
}

Status StreamTimeline::check_live(StreamHandle stream, const char* caller) const {
  if (is_live(stream)) return Status::ok();
  return {ErrorCode::kInvalidStream, std::string(caller) + ": stream " + hex_address(stream) +
                                         " is unknown or destroyed on the simulated device"};
}

std::size_t StreamTimeline::live_stream_count() const {
  std::size_t count = 0;
  for (const auto& entry : streams_) count += entry.second.live ? 1 : 0;
  return count;
}

Status StreamTimeline::destroy_stream(StreamHandle stream) {
  if (stream == 0) {
    return {ErrorCode::kInvalidStream,
            "destroy_stream: stream 0 (the default stream) cannot be destroyed"};
  }
  if (Status status = check_live(stream, "destroy_stream"); !status) return status;
  Stream& state = streams_.at(stream);
  state.live = false;
  state.paused = false;  // nobody can resume it any more; its work finishes on its own
  if (busy_.contains(stream)) {
    propagate();  // drops it once idle
  } else {
    streams_.erase(stream);
  }
  return Status::ok();
}

Status StreamTimeline::pause_stream(StreamHandle stream) {
  if (Status status = check_live(stream, "pause_stream"); !status) return status;
  streams_.at(stream).paused = true;
  return Status::ok();
}

Status StreamTimeline::resume_stream(StreamHandle stream) {
  if (Status status = check_live(stream, "resume_stream"); !status) return status;
  streams_.at(stream).paused = false;
  if (busy_.contains(stream)) propagate();
  return Status::ok();
}

// --- Completion ---

bool StreamTimeline::is_complete(const WorkPoint& point) const {
  if (point.position == 0) return true;
  auto it = streams_.find(point.stream);
  // A stream is dropped only once destroyed and idle, so its work is all done.
  return it == streams_.end() || it->second.completed >= point.position;
}

bool StreamTimeline::precedes(const WorkPoint& point, StreamHandle stream,
                              std::uint64_t position, int depth) const {
  if (is_complete(point)) return true;
  if (stream == point.stream) return point.position < position;
  auto it = streams_.find(stream);
  if (it == streams_.end() || depth == 0) return false;
  for (const Barrier& barrier : it->second.barriers) {
    if (barrier.position >= position) break;  // in position order
    if (precedes(point, barrier.awaited.stream, barrier.awaited.position + 1, depth - 1)) {
      return true;
    }
  }
  return false;
}

bool StreamTimeline::orders_new_work_after(StreamHandle stream, EventHandle event) const {
  auto it = events_.find(event);
  if (it == events_.end() || !it->second.recorded) return true;
  auto waiter = streams_.find(stream);
  const std::uint64_t next = waiter == streams_.end() ? 1 : waiter->second.submitted + 1;
  constexpr int kMaxDepth = 8;
  return precedes(it->second.point, stream, next, kMaxDepth);
}

bool StreamTimeline::advance(Stream& stream) {
  const std::uint64_t limit =
      stream.paused ? std::max(stream.forced, stream.completed) : stream.submitted;
  const std::uint64_t before = stream.completed;
  while (stream.completed < limit) {
    if (stream.barriers.empty() || stream.barriers.front().position > limit) {
      stream.completed = limit;
      break;
    }
    const Barrier& barrier = stream.barriers.front();
    if (is_complete(barrier.awaited)) {
      stream.completed = barrier.position;
      stream.barriers.pop_front();
      continue;
    }
    // Work before the barrier is free to finish; that may even be what the barrier awaits
    // (a stream waiting on its own earlier event), so look again.
    if (barrier.position - 1 > stream.completed) {
      stream.completed = barrier.position - 1;
      continue;
    }
    break;
  }
  return stream.completed != before;
}

void StreamTimeline::propagate() {
  // Completing one stream's item can release another's barrier: repeat until nothing moves.
  bool moved = true;
  while (moved) {
    moved = false;
    for (auto it = busy_.begin(); it != busy_.end();) {
      Stream& stream = streams_.at(*it);
      moved = advance(stream) || moved;
      if (stream.completed == stream.submitted) {
        if (!stream.live) streams_.erase(*it);
        it = busy_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void StreamTimeline::force_complete(WorkPoint point) {
  // Barriers only await items submitted before them, so this walk cannot cycle.
  std::vector<WorkPoint> to_force{point};
  while (!to_force.empty()) {
    const WorkPoint next = to_force.back();
    to_force.pop_back();
    auto it = streams_.find(next.stream);
    if (it == streams_.end()) continue;
    Stream& stream = it->second;
    if (stream.completed >= next.position || stream.forced >= next.position) continue;
    stream.forced = next.position;
    for (const Barrier& barrier : stream.barriers) {
      if (barrier.position > next.position) break;
      to_force.push_back(barrier.awaited);
    }
  }
}

// --- Events ---

EventHandle StreamTimeline::create_event() {
  const EventHandle handle = next_event_++;
  events_.emplace(handle, Event{});
  return handle;
}

Status StreamTimeline::find_event(EventHandle event, const char* caller, Event** out) {
  auto it = events_.find(event);
  if (it == events_.end()) return unknown_event(event, caller);
  *out = &it->second;
  return Status::ok();
}

Status StreamTimeline::destroy_event(EventHandle event) {
  // As in CUDA, an event may be destroyed while pending; waits already enqueued keep their target.
  if (events_.erase(event) == 0) return unknown_event(event, "destroy_event");
  return Status::ok();
}

Status StreamTimeline::record_event(EventHandle event, StreamHandle stream) {
  Event* record = nullptr;
  if (Status status = find_event(event, "record_event", &record); !status) return status;
  if (Status status = check_live(stream, "record_event"); !status) return status;
  Stream& state = streams_.at(stream);
  const std::uint64_t position = ++state.submitted;
  record->recorded = true;
  record->point = WorkPoint{stream, position};
  if (!state.paused && state.barriers.empty()) {
    // Such a stream has finished everything before: the new item completes at once.
    state.completed = position;
  } else {
    busy_.insert(stream);  // it cannot complete now; nothing else can move either
  }
  return Status::ok();
}

Status StreamTimeline::query_event(EventHandle event, EventState* state) const {
  auto it = events_.find(event);
  if (it == events_.end()) return unknown_event(event, "query_event");
  const bool pending = it->second.recorded && !is_complete(it->second.point);
  *state = pending ? EventState::kPending : EventState::kComplete;
  return Status::ok();
}

Status StreamTimeline::synchronize_event(EventHandle event) {
  Event* record = nullptr;
  if (Status status = find_event(event, "synchronize_event", &record); !status) return status;
  if (!record->recorded || is_complete(record->point)) return Status::ok();
  const WorkPoint point = record->point;
  force_complete(point);
  propagate();
  if (!is_complete(point)) {
    return {ErrorCode::kInternal,
            "synchronize_event: simulated event " + hex_address(event) + " is still pending"};
  }
  return Status::ok();
}

Status StreamTimeline::stream_wait_event(StreamHandle stream, EventHandle event) {
  if (Status status = check_live(stream, "stream_wait_event"); !status) return status;
  Event* record = nullptr;
  if (Status status = find_event(event, "stream_wait_event", &record); !status) return status;
  // Waiting on completed or never-recorded work is a no-op, as in CUDA.
  if (!record->recorded || is_complete(record->point)) return Status::ok();
  Stream& state = streams_.at(stream);
  const std::uint64_t position = ++state.submitted;
  state.barriers.push_back(Barrier{position, record->point});
  busy_.insert(stream);
  return Status::ok();
}

void StreamTimeline::synchronize_device() {
  for (StreamHandle handle : busy_) {
    Stream& stream = streams_.at(handle);
    stream.forced = stream.submitted;
  }
  propagate();
}

}  // namespace vramledger
