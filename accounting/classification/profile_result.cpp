#include "accounting/classification/profile_result.hpp"

#include <cmath>
#include <cstdio>

namespace vramledger {

std::int64_t KvBudget::resolve(std::int64_t device_total_bytes) const {
  if (bytes) return *bytes;
  if (utilization) {
    // long double keeps every byte of a 2^47-byte device exact before the floor.
    return static_cast<std::int64_t>(
        std::floor(static_cast<long double>(*utilization) *
                   static_cast<long double>(device_total_bytes)));
  }
  return 0;
}

const char* to_string(NonTorchBasis basis) noexcept {
  switch (basis) {
    case NonTorchBasis::kProcessUsage: return "process_usage";
    case NonTorchBasis::kDeviceUsedFallback: return "device_used_fallback";
    case NonTorchBasis::kTrackerOnly: return "tracker_only";
    case NonTorchBasis::kNone: return "none";
  }
  return "unknown";
}

std::string format_gib(std::int64_t bytes) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.2f",
                static_cast<double>(bytes) / static_cast<double>(std::int64_t{1} << 30));
  return text;
}

std::vector<std::string> ProfileResult::log_lines() const {
  std::vector<std::string> lines;
  if (utilization) {
    char fraction[32];
    std::snprintf(fraction, sizeof(fraction), "%.2f", *utilization);
    lines.push_back("the current instance can use total_gpu_memory (" +
                    format_gib(device_total_bytes) + "GiB) x gpu_memory_utilization (" +
                    fraction + ") = " + format_gib(budget_bytes) + "GiB");
  } else {
    lines.push_back("the current instance can use a per-instance budget of " +
                    format_gib(budget_bytes) + "GiB");
  }
  lines.push_back("model weights take " + format_gib(weights_bytes) +
                  "GiB; non_torch_memory takes " + format_gib(non_torch_increase_bytes) +
                  "GiB; PyTorch activation peak memory takes " +
                  format_gib(peak_activation_bytes) +
                  "GiB; the rest of the memory reserved for KV Cache is " +
                  format_gib(kv_cache_budget_bytes) + "GiB.");
  // The four figures above do not include what the process held before loading; say it, so the
  // lines add up to the budget.
  lines.push_back("memory in use before loading (CUDA context, modules, driver, earlier "
                  "allocations) takes " + format_gib(baseline_bytes) +
                  "GiB; other PyTorch allocations kept from loading to profiling take " +
                  format_gib(other_torch_bytes) + "GiB; non-torch figures from " +
                  to_string(non_torch_basis) + ".");
  for (const std::string& warning : warnings) lines.push_back("WARNING: " + warning);
  return lines;
}

}  // namespace vramledger
