// Fuzz target: the workload trace reader (bench/replay/workload_trace.cpp). Any input is
// accepted or refused with WorkloadTraceError; an accepted trace's slots index its allocations
// (the replay's pointer table is sized by allocation_count) and its peak is the peak of what it
// holds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <unordered_map>

#include "bench/replay/workload_trace.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  vramledger::WorkloadTrace trace;
  try {
    trace = vramledger::parse_workload_trace(in, "fuzz");
  } catch (const vramledger::WorkloadTraceError&) {
    return 0;
  }
  // Recount what the reader promises from its own output.
  std::unordered_map<std::uint64_t, std::size_t> live_bytes_by_slot;
  std::size_t live = 0;
  std::size_t peak = 0;
  for (const vramledger::WorkloadOp& op : trace.ops) {
    if (op.slot >= trace.allocation_count) std::abort();
    switch (op.kind) {
      case vramledger::WorkloadOp::Kind::kAlloc:
        if (op.stream >= trace.stream_handles.size() || op.bytes == 0) std::abort();
        if (!live_bytes_by_slot.emplace(op.slot, op.bytes).second) std::abort();
        live += op.bytes;
        peak = live > peak ? live : peak;
        break;
      case vramledger::WorkloadOp::Kind::kFree:
      case vramledger::WorkloadOp::Kind::kFreeCompleted: {
        auto it = live_bytes_by_slot.find(op.slot);
        if (it == live_bytes_by_slot.end()) std::abort();
        live -= it->second;
        live_bytes_by_slot.erase(it);
        break;
      }
      case vramledger::WorkloadOp::Kind::kFreeRequested:
        if (!live_bytes_by_slot.contains(op.slot)) std::abort();
        break;
    }
  }
  if (peak != trace.peak_requested_bytes) std::abort();
  return 0;
}
