// BM_Trace: a recorded program's own allocations and frees (a workload trace,
// docs/workload_trace_format.md) through one allocator, host time only: what the allocator's CPU
// costs that program per operation, beside every other allocator in the same run.
//
// Why: warm fixed-size pairs and the synthetic ring do not show what a real program's pattern
// costs. T5 training allocates ~2,600 blocks a step whose best fit by size often lies over
// unmapped pages (bench/results/2026-12-04-t5-replay-cpu.md), a path the warm pairs never take;
// its step time is set by the host CPU, so the allocator's CPU per operation there is what its
// step time follows.
//
// A first, untimed pass replays the whole trace: `a` allocates, `f` and `r` free (the peer's free
// is stream-ordered as the program's was; nothing is launched, so `c` has nothing left to do).
// The blocks never freed (the program's parameters and optimizer state) stay allocated; every
// later pass replays the rest of the trace around them, as the program's next steps would. One
// more untimed pass settles the layout, then each iteration is one pass. Stream index i of the
// trace runs on the benchmark's stream i mod 16.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

namespace vramledger::gpu_latency {

struct TraceOps {
  struct Op {
    bool allocate = false;
    std::uint32_t stream = 0;  // allocations: the trace's stream index
    std::uint32_t slot = 0;    // the allocation's dense slot (WorkloadOp::slot)
    std::size_t bytes = 0;     // allocations
  };
  std::string name;  // the file name without folders and .vlt[.gz]
  std::vector<Op> ops;
  std::vector<bool> persistent;  // by slot: never freed in the trace
  std::size_t persistent_allocations = 0;
  std::size_t allocations = 0;
  std::size_t peak_requested_bytes = 0;
};

// Reads `path` (throws WorkloadTraceError with the line, or std::runtime_error).
TraceOps load_trace_ops(const std::string& path);

// A block the replay holds: freed with the size and stream it was allocated with.
struct TraceBlock {
  void* ptr = nullptr;
  std::size_t bytes = 0;
  cudaStream_t stream = nullptr;
};

// Operations of a pass after the first (the persistent allocations are made once).
inline std::size_t repeated_ops(const TraceOps& trace) {
  return trace.ops.size() - trace.persistent_allocations;
}

// One pass of `trace` through `peer`: all of it (`first`), or all but the persistent
// allocations, which the first pass made. `stream_of(i)` gives the stream of the trace's stream
// index i. `live` has trace.allocations entries, empty but for the persistent blocks after the
// first pass; those stay in it (free_trace_blocks). Throws what the peer throws, the blocks
// allocated so far kept in `live`.
// `after_op()` runs before each operation replayed (the simulated GPU's lag, --simulated-lag-ops).
template <class Peer, class StreamOf, class AfterOp>
void replay_trace_once(Peer& peer, const TraceOps& trace, StreamOf&& stream_of,
                       std::vector<TraceBlock>& live, bool first, AfterOp&& after_op) {
  for (const TraceOps::Op& op : trace.ops) {
    if (!first && trace.persistent[op.slot]) continue;
    after_op();
    TraceBlock& block = live[op.slot];
    if (op.allocate) {
      block.stream = stream_of(op.stream);
      block.bytes = op.bytes;
      block.ptr = peer.allocate(op.bytes, block.stream);
    } else {
      void* const ptr = block.ptr;
      block.ptr = nullptr;
      peer.deallocate(ptr, block.bytes, block.stream);
    }
  }
}

// Frees every block left in `live`; the first error is rethrown after all were tried.
template <class Peer>
void free_trace_blocks(Peer& peer, std::vector<TraceBlock>& live) {
  std::exception_ptr first;
  for (TraceBlock& block : live) {
    if (block.ptr == nullptr) continue;
    try {
      peer.deallocate(block.ptr, block.bytes, block.stream);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    block.ptr = nullptr;
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace vramledger::gpu_latency
