// vLLM-style memory profiling from our own counters: the figures an engine needs to size its KV
// cache (weights, peak activation, non-torch increase, the rest), taken from the ledger and from
// this process's own device usage, so a neighbour process cannot move them.
//
//   MemoryProfiler profiler({&ledger}, {.process = &nvml_source});
//   profiler.begin();                  // baseline, before the model is loaded
//   load_model();
//   profiler.end_load();
//   { ProfileScope scope(profiler);    // begin_profile() ... end_profile()
//     run_dummy_forward(); }
//   ProfileResult result = profiler.result(KvBudget::of_utilization(0.9));
//
// begin_profile() resets the ledgers' peaks (as vLLM resets torch's) so the peak allocated inside
// the scope is the ledger's own peak: exact, not sampled. Calls must come in the order above;
// each throws std::logic_error otherwise. Ledger queries follow the ledger's rule: call these
// while no thread allocates, or under the allocator's lock.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accounting/classification/non_torch_tracked.hpp"
#include "accounting/classification/process_classification.hpp"
#include "accounting/classification/process_memory.hpp"
#include "accounting/classification/profile_result.hpp"
#include "accounting/ledger.hpp"

namespace vramledger {

struct ProfilerSources {
  ProcessMemorySource* process = nullptr;  // optional: NVML through ProbeProcessMemorySource
  NonTorchTracker* non_torch = nullptr;    // optional: the preload shim's per-library counts
};

// Everything the profiler reads at one instant.
struct ProfileSnapshot {
  std::int64_t allocated = 0;        // Σ allocated_bytes.current over the ledgers
  std::int64_t peak_allocated = 0;   // Σ allocated_bytes.peak (exact for one ledger; see docs)
  std::int64_t reserved = 0;         // Σ reserved_bytes.current
  std::int64_t weights_tag = 0;      // Σ allocated bytes under kWeightsTag
  std::int64_t non_torch = 0;        // per NonTorchBasis
  std::int64_t tracked_non_torch = 0;
  std::optional<ProcessClassification> classification;  // when a process source is given
};

class MemoryProfiler {
 public:
  // The ledgers of every allocator on the device; they and the sources must outlive the profiler.
  explicit MemoryProfiler(std::vector<Ledger*> ledgers, ProfilerSources sources = {});

  void begin();
  void end_load();
  void begin_profile();
  void end_profile();
  // Needs end_profile(). Device total comes from the process source (0 without one, so use a
  // byte budget then).
  ProfileResult result(const KvBudget& budget) const;

  // Reads the counters now (no phase change); also what each phase records.
  ProfileSnapshot snapshot() const;
  NonTorchBasis non_torch_basis() const noexcept;

 private:
  enum class Phase { kIdle, kBegun, kLoaded, kProfiling, kDone };
  void expect(Phase phase, const char* call) const;

  std::vector<Ledger*> ledgers_;
  ProfilerSources sources_;
  Phase phase_ = Phase::kIdle;
  ProfileSnapshot at_begin_, at_load_end_, at_profile_begin_, at_profile_end_;
};

// RAII: begin_profile() on construction, end_profile() on destruction (also when unwinding).
class ProfileScope {
 public:
  explicit ProfileScope(MemoryProfiler& profiler) : profiler_(profiler) {
    profiler_.begin_profile();
  }
  ~ProfileScope() {
    try {
      profiler_.end_profile();
    } catch (...) {  // a destructor must not throw; result() then reports the missing end
    }
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  MemoryProfiler& profiler_;
};

}  // namespace vramledger
