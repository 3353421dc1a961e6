#include "accounting/classification/process_classification.hpp"

#include "allocator/text_format.hpp"

namespace vramledger {
namespace {

void add_into(MemoryBreakdown& total, const MemoryBreakdown& part) {
  total.requested += part.requested;
  total.rounding += part.rounding;
  total.pending_frees += part.pending_frees;
  total.cached_usable += part.cached_usable;
  total.fragmentation += part.fragmentation;
  total.unmapped_physical += part.unmapped_physical;
  total.sleeping_resident += part.sleeping_resident;
  total.reserved += part.reserved;
  total.sleeping += part.sleeping;
}

void check_torch_lines(const DeviceLedgerView& view, const MemoryBreakdown& lines,
                       std::vector<std::string>& problems) {
  if (view.inconsistent) {
    problems.push_back("allocator '" + view.name +
                       "': ledger inconsistent (an event was missing or malformed)");
  }
  if (!lines.all_lines_non_negative()) {
    problems.push_back("allocator '" + view.name +
                       "': a torch line is negative (an allocator event is missing)");
  }
}

}  // namespace

const char* to_string(ProcessUsageBasis basis) noexcept {
  switch (basis) {
    case ProcessUsageBasis::kNvmlPerProcess: return "nvml_per_process";
    case ProcessUsageBasis::kDeviceUsedFallback: return "device_used_fallback";
  }
  return "unknown";
}

std::int64_t ProcessClassification::non_torch_tracked_total() const noexcept {
  std::int64_t total = 0;
  for (const NamedBytes& line : non_torch_by_library) total += line.bytes;
  return total;
}

std::int64_t ProcessClassification::sum() const noexcept {
  return torch.sum() + non_torch_tracked_total() + remainder;
}

bool ProcessClassification::all_lines_non_negative() const noexcept {
  for (const NamedBytes& line : lines()) {
    if (line.bytes < 0) return false;
  }
  return true;
}

std::string ProcessClassification::remainder_label() const {
  std::string label = "context, modules, driver";
  if (!non_torch_hooked) label += " + untracked non-torch";
  if (basis == ProcessUsageBasis::kDeviceUsedFallback) label += " + other processes";
  return label;
}

std::vector<NamedBytes> ProcessClassification::lines() const {
  std::vector<NamedBytes> out = {
      {"torch live, requested", torch.requested},
      {"torch live, rounding", torch.rounding},
      {"torch pending frees", torch.pending_frees},
      {"torch cached, usable", torch.cached_usable},
      {"torch fragmentation", torch.fragmentation},
      {"torch unmapped physical", torch.unmapped_physical},
  };
  // Sleep by tag (docs/sleep.md): only while some sleeping block's page is kept for a neighbour.
  if (torch.sleeping_resident != 0) out.push_back({"torch asleep, kept pages", torch.sleeping_resident});
  for (const NamedBytes& library : non_torch_by_library) {
    out.push_back({"non-torch: " + library.name, library.bytes});
  }
  out.push_back({remainder_label(), remainder});
  return out;
}

ProcessClassification classify_process(const std::vector<DeviceLedgerView>& allocators,
                                       const NonTorchTracked& non_torch,
                                       const ProcessMemory& process) {
  ProcessClassification result;
  for (const DeviceLedgerView& view : allocators) {
    const MemoryBreakdown lines = compute_breakdown(view.aggregate);
    check_torch_lines(view, lines, result.problems);
    add_into(result.torch, lines);
    ++result.allocators;
  }

  result.non_torch_hooked = non_torch.hooked;
  if (non_torch.hooked) {
    for (const auto& [library, bytes] : non_torch.bytes_by_library) {
      result.non_torch_by_library.push_back({library, bytes});
      if (bytes < 0) {
        result.problems.push_back("non-torch library '" + library +
                                  "' has negative live bytes (a free without its allocation)");
      }
    }
  } else if (!non_torch.bytes_by_library.empty()) {
    result.problems.push_back("non-torch bytes given without hooked=true: ignored");
  }

  result.device_used = process.device_used_bytes;
  result.device_total = process.device_total_bytes;
  if (process.process_used_bytes) {
    result.basis = ProcessUsageBasis::kNvmlPerProcess;
    result.process_usage = *process.process_used_bytes;
    result.other_processes = process.device_used_bytes - *process.process_used_bytes;
    if (*result.other_processes < 0) {
      result.problems.push_back(
          "other processes negative: device and process figures were sampled apart");
    }
  } else {
    result.basis = ProcessUsageBasis::kDeviceUsedFallback;
    result.process_usage = process.device_used_bytes;
    result.caveat = "per-process usage unavailable (" +
                    (process.process_used_unavailable.empty() ? std::string("no reason given")
                                                              : process.process_used_unavailable) +
                    "): process usage is the whole device's used memory, so the remainder also "
                    "holds every other process's memory and the driver's reservations";
  }

  // The remainder closes the sum exactly; it is never clamped.
  result.remainder = result.process_usage - result.torch.sum() - result.non_torch_tracked_total();
  if (result.remainder < 0) {
    const std::int64_t deficit = -result.remainder;
    result.missing_hook = MissingHook{
        deficit,
        "MISSING HOOK: the classified lines exceed process usage (" +
            std::string(to_string(result.basis)) + ") by " + std::to_string(deficit) +
            " bytes (" + format_bytes(deficit) +
            "): a release reached the driver without its event reaching us, a tracker counts "
            "torch's own driver calls, or the process sample is stale"};
  }
  return result;
}

}  // namespace vramledger
