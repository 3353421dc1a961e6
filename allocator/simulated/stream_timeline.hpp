// Streams and events of the simulated device, with completion under the test's control.
//
// Model: each stream is a queue of work items, numbered 1, 2, ... in submission order. Recording
// an event enqueues an item and remembers (stream, item); the event is complete once the stream
// has completed that item. A stream completes its items in order, at once, unless
//  * it is paused: items queued while paused wait for resume_stream (or a synchronize below);
//  * it waits on an event (stream_wait_event on a pending event enqueues a barrier item): items
//    from the barrier on wait until the awaited item completes on the other stream.
// Work submitted before a pause has already completed (unless a barrier holds it).
//
// synchronize_event on a pending event stands for the device finishing that work: the event's
// stream (and every stream it transitively waits on) completes its items up to the awaited
// points even while paused; the streams stay paused for later work. synchronize_device does the
// same for everything queued so far.
//
// Stream 0 always exists and cannot be destroyed; it is an ordinary stream here (the legacy
// default stream's implicit synchronisation with other streams is not modelled). A destroyed
// stream can no longer be used, but its queued work still completes as the device would: it is
// unpaused, then finishes as soon as its barriers allow. Handles are never reused.
//
// Not synchronised: SimulatedDevice calls it under its own lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <set>
#include <unordered_map>

#include "allocator/device_backend.hpp"

namespace vramledger {

class StreamTimeline {
 public:
  // Distinct ranges so a handle of one kind passed as the other is rejected.
  static constexpr StreamHandle kFirstStreamHandle = 0x5000'0001;
  static constexpr EventHandle kFirstEventHandle = 0xE000'0001;

  StreamTimeline();

  StreamHandle create_stream();
  Status destroy_stream(StreamHandle stream);
  Status pause_stream(StreamHandle stream);
  Status resume_stream(StreamHandle stream);
  bool is_live(StreamHandle stream) const;
  // Ok for a live stream, else kInvalidStream naming `caller`.
  Status check_live(StreamHandle stream, const char* caller) const;

  EventHandle create_event();
  Status destroy_event(EventHandle event);
  Status record_event(EventHandle event, StreamHandle stream);
  Status query_event(EventHandle event, EventState* state) const;
  Status synchronize_event(EventHandle event);
  Status stream_wait_event(StreamHandle stream, EventHandle event);
  void synchronize_device();

  // Whether work enqueued on `stream` now would run after the work item `event` was recorded
  // at: that item is complete, on the same stream, or awaited (directly or through other
  // streams' barriers) by a barrier the stream has not passed. An unknown event counts as
  // complete.
  bool orders_new_work_after(StreamHandle stream, EventHandle event) const;

  std::size_t live_stream_count() const;  // stream 0 included
  std::size_t live_event_count() const { return events_.size(); }
  // Streams (live or destroyed) with queued work not yet complete.
  std::size_t busy_stream_count() const { return busy_.size(); }

 private:
  // Item `position` of `stream`; position 0 is "nothing", always complete.
  struct WorkPoint {
    StreamHandle stream = 0;
    std::uint64_t position = 0;
  };
  struct Barrier {
    std::uint64_t position = 0;  // the barrier's own item on the waiting stream
    WorkPoint awaited;
  };
  struct Stream {
    bool live = true;
    bool paused = false;
    std::uint64_t submitted = 0;
    std::uint64_t completed = 0;
    std::uint64_t forced = 0;      // completes up to here even while paused
    std::deque<Barrier> barriers;  // not yet passed, in position order
  };
  struct Event {
    bool recorded = false;  // never-recorded events count as complete, as in CUDA
    WorkPoint point;
  };

  bool is_complete(const WorkPoint& point) const;
  // Whether `point` completes before item `position` of `stream` can run (`depth` bounds the
  // walk through other streams' barriers).
  bool precedes(const WorkPoint& point, StreamHandle stream, std::uint64_t position,
                int depth) const;
  // Lets the stream complete what it can; true when it moved.
  bool advance(Stream& stream);
  // Advances every busy stream until nothing moves, then drops idle destroyed streams.
  void propagate();
  // Makes the device finish `point` and everything it depends on (see synchronize_event).
  void force_complete(WorkPoint point);
  Status find_event(EventHandle event, const char* caller, Event** out);

  std::unordered_map<StreamHandle, Stream> streams_;  // live ones, and destroyed ones still busy
  std::set<StreamHandle> busy_;                       // completed < submitted
  std::unordered_map<EventHandle, Event> events_;
  StreamHandle next_stream_ = kFirstStreamHandle;
  EventHandle next_event_ = kFirstEventHandle;
};

}  // namespace vramledger
