#include "allocator/fault_injecting_backend.hpp"

#include <string>

#include "allocator/text_format.hpp"

namespace vramledger {

namespace {

std::size_t index_of(FaultPoint point) { return static_cast<std::size_t>(point); }

bool valid_rate(double rate) { return rate >= 0.0 && rate <= 1.0; }  // false for NaN

}  // namespace

std::string_view to_string(FaultPoint point) noexcept {
  switch (point) {
    case FaultPoint::kAllocateSegment: return "allocate_segment";
    case FaultPoint::kCreatePhysical: return "create_physical";
    case FaultPoint::kMapPages: return "map_pages";
    case FaultPoint::kCreateEvent: return "create_event";
    case FaultPoint::kRecordEvent: return "record_event";
    case FaultPoint::kQueryEvent: return "query_event";
    case FaultPoint::kCount: break;
  }
  return "?";
}

FaultInjectingBackend::FaultInjectingBackend(DeviceBackend& inner, FaultPlan plan)
    : ForwardingBackend(inner), plan_(plan), engine_(plan.seed) {
  if (!valid_rate(plan.rate)) {
    throw Error(ErrorCode::kInvalidArgument,
                "fault rate " + std::to_string(plan.rate) + " is not between 0 and 1");
  }
}

void FaultInjectingBackend::set_rate(double rate) {
  if (!valid_rate(rate)) {
    throw Error(ErrorCode::kInvalidArgument,
                "fault rate " + std::to_string(rate) + " is not between 0 and 1");
  }
  const std::lock_guard lock(mutex_);
  plan_.rate = rate;
}

FaultInjectingBackend::Counts FaultInjectingBackend::counts(FaultPoint point) const {
  const std::lock_guard lock(mutex_);
  return counts_.at(index_of(point));
}

std::uint64_t FaultInjectingBackend::injected_total() const {
  const std::lock_guard lock(mutex_);
  std::uint64_t total = 0;
  for (const Counts& c : counts_) total += c.early + c.late;
  return total;
}

FaultInjectingBackend::Decision FaultInjectingBackend::decide(FaultPoint point, bool late_possible) {
  const std::lock_guard lock(mutex_);
  Counts& c = counts_[index_of(point)];
  ++c.calls;
  if ((plan_.points & (1u << index_of(point))) == 0 || plan_.rate <= 0.0) return Decision::kPass;
  if (std::uniform_real_distribution<double>(0.0, 1.0)(engine_) >= plan_.rate) {
    return Decision::kPass;
  }
  // Half of the failures of calls that can fail late do, so the undo path gets as much use.
  if (late_possible && (engine_() & 1u) != 0) {
    ++c.late;
    return Decision::kLate;
  }
  ++c.early;
  return Decision::kEarly;
}

void FaultInjectingBackend::count_undo_failed(FaultPoint point) {
  const std::lock_guard lock(mutex_);
  Counts& c = counts_[index_of(point)];
  --c.late;  // not a failure after all: the caller got the resource
  ++c.undo_failed;
}

Status FaultInjectingBackend::injected(FaultPoint point, Decision decision, ErrorCode code,
                                       std::string_view call) {
  std::string message = "injected fault (";
  message += to_string(point);
  message += decision == Decision::kLate ? ", after the call succeeded and was undone): "
                                         : ", before the call): ";
  message += call;
  message += " failed";
  return {code, std::move(message)};
}

Status FaultInjectingBackend::allocate_segment(std::size_t bytes, StreamHandle stream,
                                               DevicePtr* out) {
  const Decision decision = decide(FaultPoint::kAllocateSegment, true);
  if (decision == Decision::kEarly) {
    return injected(FaultPoint::kAllocateSegment, decision, ErrorCode::kOutOfMemory,
                    "cudaMalloc of " + format_bytes_exact(bytes));
  }
  DevicePtr ptr = 0;
  Status status = inner().allocate_segment(bytes, stream, &ptr);
  if (!status.is_ok() || decision == Decision::kPass) {
    if (status.is_ok()) *out = ptr;
    return status;
  }
  if (!inner().free_segment(ptr, bytes, stream).is_ok()) {
    count_undo_failed(FaultPoint::kAllocateSegment);
    *out = ptr;
    return Status::ok();
  }
  return injected(FaultPoint::kAllocateSegment, decision, ErrorCode::kDriverError,
                  "cudaMalloc of " + format_bytes_exact(bytes));
}

Status FaultInjectingBackend::create_physical(std::size_t bytes, PhysicalHandle* out) {
  const Decision decision = decide(FaultPoint::kCreatePhysical, true);
  if (decision == Decision::kEarly) {
    return injected(FaultPoint::kCreatePhysical, decision, ErrorCode::kOutOfMemory,
                    "cuMemCreate of " + format_bytes_exact(bytes));
  }
  PhysicalHandle handle = 0;
  Status status = inner().create_physical(bytes, &handle);
  if (!status.is_ok() || decision == Decision::kPass) {
    if (status.is_ok()) *out = handle;
    return status;
  }
  if (!inner().release_physical(handle).is_ok()) {
    count_undo_failed(FaultPoint::kCreatePhysical);
    *out = handle;
    return Status::ok();
  }
  return injected(FaultPoint::kCreatePhysical, decision, ErrorCode::kDriverError,
                  "cuMemCreate of " + format_bytes_exact(bytes));
}

Status FaultInjectingBackend::map_pages(DevicePtr va, std::size_t page_bytes,
                                        std::span<const PhysicalHandle> handles) {
  const Decision decision = decide(FaultPoint::kMapPages, !handles.empty());
  if (decision == Decision::kEarly) {
    return injected(FaultPoint::kMapPages, decision, ErrorCode::kDriverError,
                    "cuMemMap at " + format_hex(va));
  }
  Status status = inner().map_pages(va, page_bytes, handles);
  if (!status.is_ok() || decision == Decision::kPass) return status;
  if (!inner().unmap_pages(va, page_bytes, handles.size()).is_ok()) {
    count_undo_failed(FaultPoint::kMapPages);
    return Status::ok();
  }
  return injected(FaultPoint::kMapPages, decision, ErrorCode::kDriverError,
                  "cuMemSetAccess at " + format_hex(va));
}

Status FaultInjectingBackend::create_event(EventHandle* out) {
  const Decision decision = decide(FaultPoint::kCreateEvent, false);
  if (decision != Decision::kPass) {
    return injected(FaultPoint::kCreateEvent, decision, ErrorCode::kDriverError, "cudaEventCreate");
  }
  return inner().create_event(out);
}

Status FaultInjectingBackend::record_event(EventHandle event, StreamHandle stream) {
  const Decision decision = decide(FaultPoint::kRecordEvent, false);
  if (decision != Decision::kPass) {
    return injected(FaultPoint::kRecordEvent, decision, ErrorCode::kDriverError,
                    "cudaEventRecord on stream " + format_hex(stream));
  }
  return inner().record_event(event, stream);
}

Status FaultInjectingBackend::query_event(EventHandle event, EventState* state) {
  const Decision decision = decide(FaultPoint::kQueryEvent, false);
  if (decision != Decision::kPass) {
    return injected(FaultPoint::kQueryEvent, decision, ErrorCode::kDriverError, "cudaEventQuery");
  }
  return inner().query_event(event, state);
}

}  // namespace vramledger
