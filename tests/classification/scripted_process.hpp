// A scripted process for the classification tests: a ledger fed allocator events by hand and a
// fake NVML (ManualProcessMemorySource) that sees every byte the script gives the driver, so the
// right answer of every line is known exactly.
#pragma once

#include <cstdint>

#include "accounting/classification/manual_process_memory_source.hpp"
#include "accounting/classification/non_torch_tracked.hpp"
#include "accounting/ledger.hpp"

namespace vramledger::testing {

inline constexpr std::int64_t kMiB = std::int64_t{1} << 20;
inline constexpr std::int64_t kGiB = std::int64_t{1} << 30;

inline LedgerOptions classification_ledger_options() {
  LedgerOptions options;
  options.trace_capacity = 64;
  options.abort_on_inconsistency = false;
  return options;
}

class ScriptedProcess {
 public:
  // A device of `device_total` bytes on which this process starts with a CUDA context of
  // `context` bytes and neighbours already use `neighbours` bytes.
  ScriptedProcess(std::int64_t device_total, std::int64_t context, std::int64_t neighbours)
      : ledger(classification_ledger_options()) {
    ProcessMemory memory;
    memory.device_total_bytes = device_total;
    memory.device_used_bytes = context + neighbours;
    memory.process_used_bytes = context;
    nvml.set(memory);
  }

  // torch's allocator takes a segment from the driver.
  void create_segment(std::int64_t size) {
    send({.kind = EventKind::kSegmentCreate, .address = next_address_, .size = as_size(size)});
    next_address_ += static_cast<DevicePtr>(size);
    nvml.add_own_bytes(size);
  }
  void release_segment(std::int64_t size) {
    send({.kind = EventKind::kSegmentRelease, .address = 0, .size = as_size(size)});
    nvml.add_own_bytes(-size);
  }
  // A block inside the segments (the script keeps allocated <= reserved).
  DevicePtr alloc(std::int64_t size, std::int64_t requested, TagId tag = kUntagged) {
    const DevicePtr address = next_block_++;
    send({.kind = EventKind::kAlloc, .tag = tag, .stream = 1, .address = address,
          .size = as_size(size), .requested = as_size(requested)});
    return address;
  }
  void free(DevicePtr address, std::int64_t size, std::int64_t requested,
            TagId tag = kUntagged) {
    send({.kind = EventKind::kFree, .tag = tag, .stream = 1, .address = address,
          .size = as_size(size), .requested = as_size(requested)});
  }
  // Freed by the user, still used by another stream.
  void free_pending(DevicePtr address, std::int64_t size, std::int64_t requested) {
    send({.kind = EventKind::kFreeRequested, .stream = 1, .address = address,
          .size = as_size(size), .requested = as_size(requested)});
  }
  // A non-torch library allocates through the driver; the tracker (when hooked) sees it.
  void library_alloc(const std::string& library, std::int64_t bytes) {
    tracked.bytes_by_library[library] += bytes;
    nvml.add_own_bytes(bytes);
  }

  Ledger ledger;
  ManualProcessMemorySource nvml;
  NonTorchTracked tracked{.hooked = true, .bytes_by_library = {}};

 private:
  static std::size_t as_size(std::int64_t bytes) { return static_cast<std::size_t>(bytes); }
  void send(const AllocatorEvent& event) { ledger.on_event(event); }

  DevicePtr next_address_ = 0x100000000;
  DevicePtr next_block_ = 0x700000000;
};

// A NonTorchTracker reading the script's counts.
class ScriptedTracker final : public NonTorchTracker {
 public:
  explicit ScriptedTracker(const ScriptedProcess& process) : process_(process) {}
  NonTorchTracked sample() override { return process_.tracked; }

 private:
  const ScriptedProcess& process_;
};

}  // namespace vramledger::testing
