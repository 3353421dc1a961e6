// What a profiling scope measured (memory_profiler.hpp) and the KV-cache budget it leaves, with
// the log lines an engine prints. docs/classification.md, "Profiling", defines every field; in
// short, for a budget B:
//
//   B = baseline + weights + other_torch + non_torch_increase + peak_activation + kv_cache_budget
//
// exactly, so kv_cache_budget may be negative (it does not fit) and is never clamped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accounting/classification/process_classification.hpp"

namespace vramledger {

// How much device memory this instance may use in total.
struct KvBudget {
  std::optional<double> utilization;      // fraction of the device's total memory
  std::optional<std::int64_t> bytes;      // or a fixed per-instance budget

  static KvBudget of_utilization(double fraction) { return {fraction, std::nullopt}; }
  static KvBudget of_bytes(std::int64_t budget) { return {std::nullopt, budget}; }
  // floor(utilization * total) or the fixed bytes.
  std::int64_t resolve(std::int64_t device_total_bytes) const;
};

// Where the non-torch figures came from (docs/classification.md, "Non-torch memory").
enum class NonTorchBasis {
  kProcessUsage,        // process usage (NVML per-process) - torch reserved: neighbours excluded
  kDeviceUsedFallback,  // device used - torch reserved: a neighbour moves it (vLLM's figure)
  kTrackerOnly,         // no process source: only what the tracker counted
  kNone,                // no process source, no tracker: non-torch memory is not measured
};
const char* to_string(NonTorchBasis basis) noexcept;

struct ProfileResult {
  std::int64_t budget_bytes = 0;           // KvBudget resolved
  std::int64_t device_total_bytes = 0;
  std::optional<double> utilization;       // set when the budget was a utilization

  std::int64_t baseline_bytes = 0;         // non-torch + torch allocated at begin()
  std::int64_t weights_bytes = 0;          // allocated increase across the load phase
  std::int64_t other_torch_bytes = 0;      // allocated increase between load end and profile start
  std::int64_t non_torch_increase_bytes = 0;  // non-torch at end_profile - non-torch at begin
  std::int64_t peak_activation_bytes = 0;  // peak allocated in the profile - allocated at its start
  std::int64_t kv_cache_budget_bytes = 0;  // the rest; negative when the model does not fit

  std::int64_t weights_tag_bytes = 0;      // allocated bytes under tag "weights" (cross-check)
  std::int64_t non_torch_tracked_increase_bytes = 0;  // tracker total at end - at begin

  NonTorchBasis non_torch_basis = NonTorchBasis::kNone;
  std::vector<std::string> warnings;       // caveats, missing hooks, a budget that does not fit

  // baseline + weights + other_torch + non_torch_increase + peak_activation + kv == budget.
  std::int64_t accounted_bytes() const noexcept {
    return baseline_bytes + weights_bytes + other_torch_bytes + non_torch_increase_bytes +
           peak_activation_bytes + kv_cache_budget_bytes;
  }
  // vLLM's log lines: the budget, then "model weights take X GiB; non_torch_memory takes Y GiB;
  // PyTorch activation peak memory takes Z GiB; the rest of the memory reserved for KV Cache is
  // W GiB.", then what the four figures leave out (baseline, other torch), then warnings.
  std::vector<std::string> log_lines() const;
};

// "%.2f" of bytes / 2^30, as vLLM prints GiB.
std::string format_gib(std::int64_t bytes);

}  // namespace vramledger
