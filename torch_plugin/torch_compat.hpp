// Which torch the plugin is compiled against, and what that release's allocator interface has.
//
// The one place where torch releases are told apart. torch's CUDAAllocator vtable and its
// statistics structs change with every minor release; the plugin supports 2.11 through 2.15.
// Each difference is one row of the feature table below (the release that introduced it), and
// the code that depends on it lives in exactly one adapter: torch_plugin/versioned_allocator.hpp
// for virtual methods, and the inline functions at the end of this file for struct fields. No
// other file of the plugin tests TORCH_VERSION_*.
//
// Supporting a new release: compile against it (scripts/check_torch_versions.sh VERSION), diff
// c10/cuda/CUDACachingAllocator.h and c10/core/CachingDeviceAllocator.h against the previous
// release, add a row per difference, and raise kTorchMinorMax (and meson.build's range).
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/headeronly/version.h>

#include <cstdint>
#include <utility>
#include <vector>

// Keep in step with torch_plugin/meson.build, which refuses an unsupported torch before any
// compiler runs; this is the backstop for builds that bypass it.
#if TORCH_VERSION_MAJOR != 2 || TORCH_VERSION_MINOR < 11 || TORCH_VERSION_MINOR > 15
#error "vramledger's torch plugin supports torch 2.11 to 2.15; this torch is " TORCH_VERSION
#endif

// --- Feature table: the torch minor release (2.x) that introduced each difference. ------------
// 2.12: CUDAAllocator::attachOomRejectionObserver (pure virtual) and DeviceStats::num_oom_rejections
#define VRAMLEDGER_TORCH_HAS_OOM_REJECTION (TORCH_VERSION_MINOR >= 12)
// 2.12: CUDAAllocator::getContextForPointer (allocation traceback by pointer)
#define VRAMLEDGER_TORCH_HAS_CONTEXT_FOR_POINTER (TORCH_VERSION_MINOR >= 12)
// 2.13: CUDAAllocator::markCaptureBegin/markCaptureEnd (a real stream capture started/ended)
#define VRAMLEDGER_TORCH_HAS_CAPTURE_MARKS (TORCH_VERSION_MINOR >= 13)
// 2.13: DeviceStats::reserved_bytes_by_private_pools
#define VRAMLEDGER_TORCH_HAS_PRIVATE_POOL_STATS (TORCH_VERSION_MINOR >= 13)
// 2.13: SnapshotInfo's config metadata gains max_round_threshold and max_cached_size
#define VRAMLEDGER_TORCH_HAS_ROUND_CONFIG_METADATA (TORCH_VERSION_MINOR >= 13)
// 2.14: CUDAAllocator::supportsUserMetadata / annotateMemory and the "annotate" trace action
#define VRAMLEDGER_TORCH_HAS_MEMORY_ANNOTATIONS (TORCH_VERSION_MINOR >= 14)

namespace vramledger::torch_plugin::compat {

inline constexpr int kTorchMinorMin = 11;
inline constexpr int kTorchMinorMax = 15;
// The release the plugin was compiled against ("2.15"), for the load-time check.
inline constexpr int kBuiltTorchMajor = TORCH_VERSION_MAJOR;
inline constexpr int kBuiltTorchMinor = TORCH_VERSION_MINOR;

using StatArray = c10::CachingAllocator::StatArray;
using DeviceStats = c10::CachingDeviceAllocator::DeviceStats;

// What the plugin counts that only some releases can report.
struct ReleaseSpecificStats {
  std::int64_t num_oom_rejections = 0;
  // Reserved bytes of each private pool (CUDA graph pools, MemPools), torch's StatArray layout.
  std::vector<std::pair<c10::MempoolId_t, StatArray>> reserved_bytes_by_private_pool;
};

// Copies the fields this release has; the others have nowhere to go.
inline void fill_release_specific_stats([[maybe_unused]] const ReleaseSpecificStats& from,
                                        [[maybe_unused]] DeviceStats& to) {
#if VRAMLEDGER_TORCH_HAS_OOM_REJECTION
  to.num_oom_rejections = from.num_oom_rejections;
#endif
#if VRAMLEDGER_TORCH_HAS_PRIVATE_POOL_STATS
  for (const auto& [id, stats] : from.reserved_bytes_by_private_pool) {
    to.reserved_bytes_by_private_pools[id] = stats;
  }
#endif
}

// The rounding settings of the snapshot's allocator-config metadata (2.13+).
template <typename ConfigMetadata>
void fill_round_config_metadata([[maybe_unused]] ConfigMetadata& meta,
                                [[maybe_unused]] std::size_t max_round_threshold,
                                [[maybe_unused]] std::size_t max_cached_size) {
#if VRAMLEDGER_TORCH_HAS_ROUND_CONFIG_METADATA
  meta.max_round_threshold = max_round_threshold;
  meta.max_cached_size = max_cached_size;
#endif
}

// The trace action of a post-facto annotation of a live allocation ("annotate", 2.14+). False
// on releases whose TraceEntry has no such action: there is nothing to record the annotation in.
inline bool annotate_trace_action(
    [[maybe_unused]] c10::cuda::CUDACachingAllocator::TraceEntry::Action* action) {
#if VRAMLEDGER_TORCH_HAS_MEMORY_ANNOTATIONS
  *action = c10::cuda::CUDACachingAllocator::TraceEntry::Action::ANNOTATE;
  return true;
#else
  return false;
#endif
}

}  // namespace vramledger::torch_plugin::compat
