// The driver-like operations of the simulated device, named so tests can count them and make
// them fail on purpose.
#pragma once

#include <cstddef>
#include <string_view>

namespace vramledger {

enum class SimOp {
  kMemoryInfo,
  kAllocateSegment,
  kFreeSegment,
  kCreatePhysical,
  kReleasePhysical,
  kReserveAddress,
  kFreeAddress,
  kMapPages,
  kUnmapPages,
  kCreateEvent,
  kDestroyEvent,
  kRecordEvent,
  kQueryEvent,
  kSynchronizeEvent,
  kStreamWaitEvent,
  kSynchronizeDevice,
  kCopyToHost,
  kCopyToDevice,
  kCount
};

inline constexpr std::size_t kSimOpCount = static_cast<std::size_t>(SimOp::kCount);

// The DeviceBackend method name, e.g. "map_pages".
std::string_view to_string(SimOp op) noexcept;

}  // namespace vramledger
