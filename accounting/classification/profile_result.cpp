#include "accounting/classification/profile_result.hpp"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace vramledger {

namespace {

__extension__ typedef __int128 Int128;

// floor(fraction * total) computed exactly from the double's binary value (Python's
// math.floor(Fraction(fraction) * total) gives the same byte), so both sides agree to the byte.
std::int64_t exact_floor_product(double fraction, std::int64_t total) {
  if (!(fraction >= 0 && fraction <= 1) || total < 0) {  // also keeps the product in range
    throw std::invalid_argument("KvBudget: utilization must lie in [0, 1]");
  }
  if (fraction == 0 || total == 0) return 0;
  int exponent = 0;
  const double mantissa = std::frexp(fraction, &exponent);  // fraction = mantissa * 2^exponent
  const auto integer_mantissa = static_cast<std::int64_t>(std::ldexp(mantissa, 53));  // exact
  const Int128 product = static_cast<Int128>(integer_mantissa) * total;
  const int shift = exponent - 53;
  if (shift >= 0) return static_cast<std::int64_t>(product << shift);
  if (shift <= -127) return 0;
  return static_cast<std::int64_t>(product >> -shift);  // product >= 0: shifting floors
}

}  // namespace

std::int64_t KvBudget::resolve(std::int64_t device_total_bytes) const {
  if (bytes) return *bytes;
  if (utilization) return exact_floor_product(*utilization, device_total_bytes);
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
