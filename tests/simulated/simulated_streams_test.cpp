// Streams and events of the simulated device: pause/resume, waits, synchronisation, destruction.
#include <gtest/gtest.h>

#include <span>
#include <string>

#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

class SimulatedStreamsTest : public ::testing::Test {
 protected:
  EventHandle event() {
    EventHandle out = 0;
    EXPECT_TRUE(device.create_event(&out).is_ok());
    return out;
  }
  EventHandle recorded_on(StreamHandle stream) {
    const EventHandle out = event();
    const Status status = device.record_event(out, stream);
    EXPECT_TRUE(status.is_ok()) << status.message();
    return out;
  }
  EventState state(EventHandle e) {
    EventState out = EventState::kComplete;
    const Status status = device.query_event(e, &out);
    EXPECT_TRUE(status.is_ok()) << status.message();
    return out;
  }
  bool pending(EventHandle e) { return state(e) == EventState::kPending; }
  void wait(StreamHandle stream, EventHandle e) {
    const Status status = device.stream_wait_event(stream, e);
    EXPECT_TRUE(status.is_ok()) << status.message();
  }
  void ok(const Status& status) { EXPECT_TRUE(status.is_ok()) << status.message(); }

  SimulatedDevice device;
};

TEST_F(SimulatedStreamsTest, DefaultStreamAlwaysExists) {
  EXPECT_TRUE(device.is_stream_live(0));
  EXPECT_EQ(device.live_stream_count(), 1u);
  EXPECT_EQ(device.destroy_stream(0).code(), ErrorCode::kInvalidStream);
  EXPECT_TRUE(device.is_stream_live(0));
  EXPECT_FALSE(pending(recorded_on(0)));
}

TEST_F(SimulatedStreamsTest, StreamsAreDistinctAndNeverReused) {
  const StreamHandle a = device.create_stream();
  const StreamHandle b = device.create_stream();
  EXPECT_NE(a, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(device.live_stream_count(), 3u);
  ok(device.destroy_stream(a));
  EXPECT_FALSE(device.is_stream_live(a));
  EXPECT_EQ(device.live_stream_count(), 2u);
  const StreamHandle c = device.create_stream();
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
}

TEST_F(SimulatedStreamsTest, UnknownOrDestroyedStreamsAreInvalid) {
  const StreamHandle gone = device.create_stream();
  ok(device.destroy_stream(gone));
  const EventHandle e = event();
  for (StreamHandle bad : {gone, StreamHandle{0xbad}}) {
    DevicePtr ptr = 0;
    EXPECT_EQ(device.record_event(e, bad).code(), ErrorCode::kInvalidStream);
    EXPECT_EQ(device.stream_wait_event(bad, e).code(), ErrorCode::kInvalidStream);
    EXPECT_EQ(device.allocate_segment(1024, bad, &ptr).code(), ErrorCode::kInvalidStream);
    EXPECT_EQ(device.pause_stream(bad).code(), ErrorCode::kInvalidStream);
    EXPECT_EQ(device.resume_stream(bad).code(), ErrorCode::kInvalidStream);
    EXPECT_EQ(device.destroy_stream(bad).code(), ErrorCode::kInvalidStream);
  }
  const Status status = device.record_event(e, gone);
  EXPECT_NE(status.message().find("record_event"), std::string::npos) << status.message();
  EXPECT_EQ(device.physical_bytes_in_use(), 0u);
}

TEST_F(SimulatedStreamsTest, UnknownEventsAreInvalidArguments) {
  const EventHandle e = event();
  ok(device.destroy_event(e));
  EventState out = EventState::kComplete;
  for (EventHandle bad : {e, EventHandle{0x1234}}) {
    EXPECT_EQ(device.query_event(bad, &out).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(device.synchronize_event(bad).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(device.destroy_event(bad).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(device.record_event(bad, 0).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(device.stream_wait_event(0, bad).code(), ErrorCode::kInvalidArgument);
  }
  // A stream handle is not an event handle.
  const StreamHandle stream = device.create_stream();
  EXPECT_EQ(device.query_event(stream, &out).code(), ErrorCode::kInvalidArgument);
}

TEST_F(SimulatedStreamsTest, EventLifecycleAndCount) {
  EXPECT_EQ(device.live_event_count(), 0u);
  const EventHandle a = event();
  const EventHandle b = event();
  EXPECT_NE(a, b);
  EXPECT_EQ(device.live_event_count(), 2u);
  EXPECT_FALSE(pending(a));  // never recorded counts as complete, as in CUDA
  ok(device.synchronize_event(a));
  ok(device.destroy_event(a));
  EXPECT_EQ(device.live_event_count(), 1u);
}

TEST_F(SimulatedStreamsTest, EventsOnRunningStreamsCompleteAtOnce) {
  const StreamHandle s = device.create_stream();
  EXPECT_FALSE(pending(recorded_on(s)));
  EXPECT_FALSE(pending(recorded_on(0)));
}

TEST_F(SimulatedStreamsTest, PausedStreamKeepsNewEventsPendingUntilResumed) {
  const StreamHandle s = device.create_stream();
  const EventHandle before = recorded_on(s);
  ok(device.pause_stream(s));
  ok(device.pause_stream(s));  // idempotent
  const EventHandle first = recorded_on(s);
  const EventHandle second = recorded_on(s);
  EXPECT_FALSE(pending(before));  // work before the pause had finished
  EXPECT_TRUE(pending(first));
  EXPECT_TRUE(pending(second));
  EXPECT_FALSE(pending(recorded_on(0)));  // other streams are unaffected
  ok(device.resume_stream(s));
  EXPECT_FALSE(pending(first));
  EXPECT_FALSE(pending(second));
  EXPECT_FALSE(pending(recorded_on(s)));
  ok(device.resume_stream(s));  // resuming a running stream is harmless
}

TEST_F(SimulatedStreamsTest, ReRecordingMovesTheEvent) {
  const StreamHandle s = device.create_stream();
  ok(device.pause_stream(s));
  const EventHandle e = recorded_on(s);
  EXPECT_TRUE(pending(e));
  ok(device.record_event(e, 0));
  EXPECT_FALSE(pending(e));
  ok(device.record_event(e, s));
  EXPECT_TRUE(pending(e));
}

TEST_F(SimulatedStreamsTest, SynchronizeEventFinishesWorkUpToThatEventOnly) {
  const StreamHandle s = device.create_stream();
  ok(device.pause_stream(s));
  const EventHandle first = recorded_on(s);
  const EventHandle second = recorded_on(s);
  const EventHandle third = recorded_on(s);
  ok(device.synchronize_event(second));
  EXPECT_FALSE(pending(first));
  EXPECT_FALSE(pending(second));
  EXPECT_TRUE(pending(third));
  // The stream stays paused for later work.
  EXPECT_TRUE(pending(recorded_on(s)));
  ok(device.resume_stream(s));
  EXPECT_FALSE(pending(third));
}

TEST_F(SimulatedStreamsTest, SynchronizeDeviceFinishesEverythingQueued) {
  const StreamHandle a = device.create_stream();
  const StreamHandle b = device.create_stream();
  ok(device.pause_stream(a));
  ok(device.pause_stream(b));
  const EventHandle on_a = recorded_on(a);
  wait(b, on_a);
  const EventHandle on_b = recorded_on(b);
  ok(device.synchronize_device());
  EXPECT_FALSE(pending(on_a));
  EXPECT_FALSE(pending(on_b));
  EXPECT_TRUE(pending(recorded_on(a)));  // still paused afterwards
  EXPECT_TRUE(pending(recorded_on(b)));
}

TEST_F(SimulatedStreamsTest, WaitHoldsLaterWorkOfTheWaitingStream) {
  const StreamHandle producer = device.create_stream();
  const StreamHandle consumer = device.create_stream();
  ok(device.pause_stream(producer));
  const EventHandle produced = recorded_on(producer);
  const EventHandle before_wait = recorded_on(consumer);
  wait(consumer, produced);
  const EventHandle after_wait = recorded_on(consumer);
  EXPECT_FALSE(pending(before_wait));
  EXPECT_TRUE(pending(after_wait));
  ok(device.resume_stream(producer));
  EXPECT_FALSE(pending(produced));
  EXPECT_FALSE(pending(after_wait));
  EXPECT_FALSE(pending(recorded_on(consumer)));
}

TEST_F(SimulatedStreamsTest, WaitingOnFinishedOrUnrecordedEventsIsANoOp) {
  const StreamHandle s = device.create_stream();
  wait(s, recorded_on(0));
  wait(s, event());
  EXPECT_FALSE(pending(recorded_on(s)));
}

TEST_F(SimulatedStreamsTest, WaitCapturesTheEventAsRecordedAtWaitTime) {
  const StreamHandle producer = device.create_stream();
  const StreamHandle consumer = device.create_stream();
  ok(device.pause_stream(producer));
  const EventHandle e = recorded_on(producer);
  wait(consumer, e);
  ok(device.record_event(e, 0));  // re-recording does not retarget the earlier wait
  ok(device.destroy_event(e));    // nor does destroying it
  const EventHandle after = recorded_on(consumer);
  EXPECT_TRUE(pending(after));
  ok(device.resume_stream(producer));
  EXPECT_FALSE(pending(after));
}

TEST_F(SimulatedStreamsTest, WaitsChainAcrossStreams) {
  const StreamHandle a = device.create_stream();
  const StreamHandle b = device.create_stream();
  const StreamHandle c = device.create_stream();
  ok(device.pause_stream(a));
  const EventHandle on_a = recorded_on(a);
  wait(b, on_a);
  const EventHandle on_b = recorded_on(b);
  wait(c, on_b);
  const EventHandle on_c = recorded_on(c);
  const EventHandle later_on_a = recorded_on(a);
  EXPECT_TRUE(pending(on_b));
  EXPECT_TRUE(pending(on_c));
  // Synchronising the end of the chain finishes exactly what it depends on.
  ok(device.synchronize_event(on_c));
  EXPECT_FALSE(pending(on_a));
  EXPECT_FALSE(pending(on_b));
  EXPECT_FALSE(pending(on_c));
  EXPECT_TRUE(pending(later_on_a));
}

TEST_F(SimulatedStreamsTest, ResumingInTheMiddleOfAChain) {
  const StreamHandle a = device.create_stream();
  const StreamHandle b = device.create_stream();
  ok(device.pause_stream(a));
  ok(device.pause_stream(b));
  const EventHandle on_a = recorded_on(a);
  wait(b, on_a);
  const EventHandle on_b = recorded_on(b);
  ok(device.resume_stream(b));  // b runs, but still waits for a
  EXPECT_TRUE(pending(on_b));
  ok(device.resume_stream(a));
  EXPECT_FALSE(pending(on_b));
}

TEST_F(SimulatedStreamsTest, PausedWaiterStaysPendingAfterItsDependencyFinishes) {
  const StreamHandle a = device.create_stream();
  const StreamHandle b = device.create_stream();
  ok(device.pause_stream(a));
  const EventHandle on_a = recorded_on(a);
  wait(b, on_a);
  ok(device.pause_stream(b));
  const EventHandle on_b = recorded_on(b);
  ok(device.resume_stream(a));
  EXPECT_FALSE(pending(on_a));
  EXPECT_TRUE(pending(on_b));
  ok(device.resume_stream(b));
  EXPECT_FALSE(pending(on_b));
}

TEST_F(SimulatedStreamsTest, AStreamMayWaitOnItsOwnEarlierWork) {
  const StreamHandle s = device.create_stream();
  ok(device.pause_stream(s));
  const EventHandle first = recorded_on(s);
  wait(s, first);
  const EventHandle second = recorded_on(s);
  EXPECT_TRUE(pending(second));
  ok(device.resume_stream(s));
  EXPECT_FALSE(pending(first));
  EXPECT_FALSE(pending(second));
}

TEST_F(SimulatedStreamsTest, DestroyedStreamStillFinishesItsWork) {
  const StreamHandle s = device.create_stream();
  ok(device.pause_stream(s));
  const EventHandle e = recorded_on(s);
  EXPECT_TRUE(pending(e));
  ok(device.destroy_stream(s));
  EXPECT_FALSE(pending(e));  // queryable and complete: the device finished it
  ok(device.synchronize_event(e));
}

TEST_F(SimulatedStreamsTest, DestroyedWaiterFinishesOnlyOnceItsDependencyDoes) {
  const StreamHandle a = device.create_stream();
  const StreamHandle b = device.create_stream();
  ok(device.pause_stream(a));
  const EventHandle on_a = recorded_on(a);
  wait(b, on_a);
  const EventHandle on_b = recorded_on(b);
  ok(device.destroy_stream(b));
  EXPECT_TRUE(pending(on_b));
  ok(device.resume_stream(a));
  EXPECT_FALSE(pending(on_b));
}

TEST_F(SimulatedStreamsTest, WaitOnEventOfADestroyedStream) {
  const StreamHandle a = device.create_stream();
  const StreamHandle b = device.create_stream();
  ok(device.pause_stream(b));
  const EventHandle on_b = recorded_on(b);
  wait(a, on_b);
  const EventHandle on_a = recorded_on(a);
  EXPECT_TRUE(pending(on_a));
  ok(device.destroy_stream(b));
  EXPECT_FALSE(pending(on_a));
  wait(a, on_b);  // long finished
  EXPECT_FALSE(pending(recorded_on(a)));
}

TEST_F(SimulatedStreamsTest, ManyPendingEventsResolveInOrder) {
  const StreamHandle s = device.create_stream();
  ok(device.pause_stream(s));
  std::vector<EventHandle> events;
  for (int i = 0; i < 100; ++i) events.push_back(recorded_on(s));
  ok(device.synchronize_event(events[49]));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(pending(events[i]), i >= 50) << i;
  ok(device.resume_stream(s));
  for (EventHandle e : events) EXPECT_FALSE(pending(e));
}

// find_hazard: memory still used by queued work may serve new work only on a stream ordered
// after that work — the same stream, or one that waits (even through a third stream) on an
// event recorded after it; the memory is recognised at any address it is mapped at.
TEST_F(SimulatedStreamsTest, FindHazardFollowsStreamOrderAndAliases) {
  const std::size_t page = device.info().granularity;
  PhysicalHandle handle = 0;
  ok(device.create_physical(page, &handle));
  DevicePtr old_va = 0, new_va = 0;
  ok(device.reserve_address_range(page, &old_va));
  ok(device.reserve_address_range(page, &new_va));
  ok(device.map_pages(old_va, page, std::span(&handle, 1)));
  const StreamHandle owner = device.create_stream();
  const StreamHandle other = device.create_stream();
  const StreamHandle third = device.create_stream();
  ok(device.pause_stream(owner));
  const EventHandle work = device.enqueue_user_work(owner);
  device.note_user_work_uses(work, old_va, page);
  ok(device.map_pages(new_va, page, std::span(&handle, 1)));  // an alias of the same memory

  EXPECT_FALSE(device.find_hazard(owner, new_va, page)) << "stream order covers the owner";
  const auto hazard = device.find_hazard(other, new_va, page);
  ASSERT_TRUE(hazard.has_value());
  EXPECT_NE(hazard->find("may run before earlier work"), std::string::npos) << *hazard;
  EXPECT_FALSE(device.find_hazard(other, new_va + page, page)) << "other memory is free to use";

  const EventHandle after_work = recorded_on(owner);
  wait(third, after_work);
  const EventHandle third_waits = recorded_on(third);
  wait(other, third_waits);
  EXPECT_FALSE(device.find_hazard(other, new_va, page)) << "ordered through the third stream";

  ok(device.resume_stream(owner));
  EXPECT_TRUE(device.user_work_done(work));
  ok(device.unmap_pages(old_va, page, 1));
  ok(device.unmap_pages(new_va, page, 1));
  ok(device.release_physical(handle));
}

}  // namespace
}  // namespace vramledger
