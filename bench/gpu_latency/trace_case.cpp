#include "bench/gpu_latency/trace_case.hpp"

#include <limits>
#include <stdexcept>

#include "bench/replay/workload_trace.hpp"

namespace vramledger::gpu_latency {

TraceOps load_trace_ops(const std::string& path) {
  const WorkloadTrace trace = read_workload_trace(path);
  if (trace.allocation_count > std::numeric_limits<std::uint32_t>::max()) {
    throw std::runtime_error(path + ": more allocations than a trace case replays (2^32)");
  }
  TraceOps ops;
  std::string name = path.substr(path.find_last_of('/') + 1);
  for (const char* suffix : {".gz", ".vlt"}) {
    if (name.ends_with(suffix)) name.resize(name.size() - std::string(suffix).size());
  }
  ops.name = name;
  ops.allocations = trace.allocation_count;
  ops.peak_requested_bytes = trace.peak_requested_bytes;
  ops.ops.reserve(trace.ops.size());
  for (const WorkloadOp& op : trace.ops) {
    TraceOps::Op out;
    out.slot = static_cast<std::uint32_t>(op.slot);
    switch (op.kind) {
      case WorkloadOp::Kind::kAlloc:
        out.allocate = true;
        out.stream = op.stream;
        out.bytes = op.bytes;
        break;
      case WorkloadOp::Kind::kFree:
      case WorkloadOp::Kind::kFreeRequested:
        break;
      case WorkloadOp::Kind::kFreeCompleted:
        continue;  // the peer's stream-ordered free already covered it
    }
    ops.ops.push_back(out);
  }
  ops.persistent.assign(ops.allocations, true);
  for (const TraceOps::Op& op : ops.ops) {
    if (!op.allocate) ops.persistent[op.slot] = false;
  }
  for (const bool kept : ops.persistent) ops.persistent_allocations += kept ? 1 : 0;
  return ops;
}

}  // namespace vramledger::gpu_latency
