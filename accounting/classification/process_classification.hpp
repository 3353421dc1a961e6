// design.md §4: this process's memory on one device, at one instant, split into lines that are
// each >= 0 and add up exactly to the driver's per-process figure. docs/classification.md defines
// every line.
//
//   torch: requested, rounding, pending frees, cached usable, fragmentation, unmapped physical
// + non-torch tracked, one line per library (only when a tracker is hooked)
// + remainder: context, modules, driver (and untracked non-torch when no tracker is hooked)
// = process usage                      other processes: device used - process usage (apart)
//
// The remainder is computed, so the sum is exact by construction; a negative remainder means
// something allocated memory we were not told about and is reported as a missing hook with the
// deficit, never clamped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "accounting/classification/device_ledger_view.hpp"
#include "accounting/classification/non_torch_tracked.hpp"
#include "accounting/classification/process_memory.hpp"
#include "accounting/memory_breakdown.hpp"

namespace vramledger {

enum class ProcessUsageBasis {
  kNvmlPerProcess,      // process usage is NVML's per-process figure: other processes excluded
  kDeviceUsedFallback,  // per-process figure unavailable: process usage := device used, so the
                        // remainder also holds every other process's memory (caveat)
};
const char* to_string(ProcessUsageBasis basis) noexcept;

struct NamedBytes {
  std::string name;
  std::int64_t bytes = 0;
  friend bool operator==(const NamedBytes&, const NamedBytes&) = default;
};

// The classified lines do not add up without a negative remainder: memory was allocated by a
// path no hook saw (or a tracker over-counted). deficit_bytes = -(remainder) > 0.
struct MissingHook {
  std::int64_t deficit_bytes = 0;
  std::string message;
};

struct ProcessClassification {
  // torch lines, summed over every allocator of the device (torch.reserved == their sum).
  MemoryBreakdown torch;
  int allocators = 0;

  bool non_torch_hooked = false;
  std::vector<NamedBytes> non_torch_by_library;  // by library name; empty when not hooked

  // Remainder: process usage minus every line above. Named "context, modules, driver" when a
  // tracker is hooked, "context, modules, driver + untracked non-torch" when not, and in the
  // device-used fallback it also contains other processes.
  std::int64_t remainder = 0;

  std::int64_t process_usage = 0;  // what the lines sum to
  ProcessUsageBasis basis = ProcessUsageBasis::kNvmlPerProcess;
  std::string caveat;  // non-empty in the fallback: why, and what the remainder then contains

  // Context only, never part of the sum. Absent in the fallback (unknown).
  std::optional<std::int64_t> other_processes;
  std::int64_t device_used = 0;
  std::int64_t device_total = 0;

  std::optional<MissingHook> missing_hook;
  // Every other reason to distrust the figures: a negative torch or library line (a ledger event
  // is missing), an inconsistent ledger, a negative "other processes" (samples taken apart).
  std::vector<std::string> problems;

  std::int64_t non_torch_tracked_total() const noexcept;
  // Everything in the process that is not held by torch's allocators: tracked non-torch plus the
  // remainder, i.e. process_usage - torch.reserved. What profiling calls non-torch memory.
  std::int64_t non_torch_bytes() const noexcept { return process_usage - torch.reserved; }
  // Sum of every line; equals process_usage by construction.
  std::int64_t sum() const noexcept;
  bool all_lines_non_negative() const noexcept;
  bool trustworthy() const noexcept { return !missing_hook && problems.empty(); }
  // Every line in report order, with its label (the remainder's label depends on the flags).
  std::vector<NamedBytes> lines() const;
  std::string remainder_label() const;
};

ProcessClassification classify_process(const std::vector<DeviceLedgerView>& allocators,
                                       const NonTorchTracked& non_torch,
                                       const ProcessMemory& process);

}  // namespace vramledger
