// A DeviceBackend adaptor that makes calls of any backend fail at random, at a set rate from a
// seeded generator (reproducible runs): the real CUDA backends get the fault injection the
// simulated device has built in (allocator/simulated/fault_injector.hpp), so the policy's
// recovery paths run against the real driver (issue 16: at 10% failure, no byte lost).
//
// Two ways a call fails, as the driver's can:
//  * early: the call fails before reaching the inner backend (cudaMalloc, cuMemCreate or cuMemMap
//    refused), nothing done;
//  * late (allocate_segment, create_physical, map_pages only): the inner call succeeds, then the
//    adaptor undoes it through the inner backend and reports a failure (cuMemSetAccess failing
//    after cuMemMap, a runtime error after the driver allocated), so the real driver's memory
//    really comes and goes. If the undo itself fails, the call is reported successful instead:
//    the contract (on failure nothing changed) holds either way.
// Every injected message starts with "injected fault" so a test can tell it from a real failure.
// Release calls (free_segment, release_physical, unmap_pages, destroy_event) are never failed.
//
// Thread-safe (one mutex around the generator and the counters).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <random>
#include <span>
#include <string_view>

#include "allocator/forwarding_backend.hpp"

namespace vramledger {

enum class FaultPoint : unsigned {
  kAllocateSegment,  // cudaMalloc (segment heap)
  kCreatePhysical,   // cuMemCreate
  kMapPages,         // cuMemMap / cuMemSetAccess
  kCreateEvent,      // cudaEventCreate
  kRecordEvent,      // cudaEventRecord
  kQueryEvent,       // cudaEventQuery
  kCount
};
inline constexpr std::size_t kFaultPointCount = static_cast<std::size_t>(FaultPoint::kCount);

// "allocate_segment", ...; "?" for kCount.
std::string_view to_string(FaultPoint point) noexcept;

struct FaultPlan {
  double rate = 0.0;           // probability that one call of a chosen point fails, 0..1
  std::uint64_t seed = 1;
  std::uint32_t points = ~0u;  // bit (1 << FaultPoint) set: that point may fail
};

class FaultInjectingBackend final : public ForwardingBackend {
 public:
  // Throws Error(kInvalidArgument) unless 0 <= plan.rate <= 1.
  FaultInjectingBackend(DeviceBackend& inner, FaultPlan plan);

  // Changes the rate from now on (0 turns injection off, e.g. for a clean teardown).
  void set_rate(double rate);

  struct Counts {
    std::uint64_t calls = 0;     // calls of the point seen
    std::uint64_t early = 0;     // failed before the inner call
    std::uint64_t late = 0;      // inner call done, undone, failed
    std::uint64_t undo_failed = 0;  // late failure whose undo failed: reported successful
  };
  Counts counts(FaultPoint point) const;
  std::uint64_t injected_total() const;  // early + late over every point

  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override;
  Status create_physical(std::size_t bytes, PhysicalHandle* out) override;
  Status map_pages(DevicePtr va, std::size_t page_bytes,
                   std::span<const PhysicalHandle> handles) override;
  Status create_event(EventHandle* out) override;
  Status record_event(EventHandle event, StreamHandle stream) override;
  Status query_event(EventHandle event, EventState* state) override;

 private:
  enum class Decision { kPass, kEarly, kLate };
  // Counts the call and draws its fate; kLate only where `late_possible`.
  Decision decide(FaultPoint point, bool late_possible);
  void count_undo_failed(FaultPoint point);
  Status injected(FaultPoint point, Decision decision, ErrorCode code, std::string_view call);

  mutable std::mutex mutex_;
  FaultPlan plan_;
  std::mt19937_64 engine_;
  std::array<Counts, kFaultPointCount> counts_{};
};

}  // namespace vramledger
