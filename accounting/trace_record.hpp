// One event as the trace stores it: fixed size, no pointers, so the ring buffer needs no
// allocation per event and the file format (docs/trace_format.md) is the same fields written
// little-endian in this order.
#pragma once

#include <cstdint>

#include "allocator/allocator_events.hpp"

namespace vramledger {

struct TraceRecord {
  std::uint64_t time_ticks = 0;  // the ledger's clock when it saw the event (cheap_clock.hpp)
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t requested = 0;
  std::uint64_t stream = 0;
  EventKind kind = EventKind::kAlloc;
  PoolKind pool = PoolKind::kLarge;
  TagId tag = kUntagged;
  std::int32_t inactive_split_delta = 0;
  std::int64_t inactive_split_bytes_delta = 0;

  friend bool operator==(const TraceRecord&, const TraceRecord&) = default;
};
static_assert(sizeof(TraceRecord) == 56, "the file format mirrors this layout");

inline TraceRecord make_trace_record(const AllocatorEvent& event, std::uint64_t ticks) noexcept {
  TraceRecord record;
  record.time_ticks = ticks;
  record.address = event.address;
  record.size = event.size;
  record.requested = event.requested;
  record.stream = event.stream;
  record.kind = event.kind;
  record.pool = event.pool;
  record.tag = event.tag;
  record.inactive_split_delta = event.inactive_split_delta;
  record.inactive_split_bytes_delta = event.inactive_split_bytes_delta;
  return record;
}

// The event a record came from, for replaying a trace into a fresh Ledger.
inline AllocatorEvent to_event(const TraceRecord& record) noexcept {
  AllocatorEvent event{record.kind};
  event.pool = record.pool;
  event.tag = record.tag;
  event.stream = static_cast<StreamHandle>(record.stream);
  event.address = static_cast<DevicePtr>(record.address);
  event.size = static_cast<std::size_t>(record.size);
  event.requested = static_cast<std::size_t>(record.requested);
  event.inactive_split_delta = record.inactive_split_delta;
  event.inactive_split_bytes_delta = record.inactive_split_bytes_delta;
  return event;
}

}  // namespace vramledger
