// Reads workload traces (docs/workload_trace_format.md): what a program asked of its allocator.
//
// Memory is bounded by the trace's real content: ids may be any 64-bit number (each allocation
// gets a dense slot, so a huge id costs nothing), lines, streams, records and metadata have
// limits that fail with the line number, and gzip data is inflated as it is parsed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace vramledger {

// Limits of the reader; input beyond them is refused with the line number.
inline constexpr std::size_t kMaxWorkloadLineBytes = 4096;        // a record needs < 70
inline constexpr std::size_t kMaxWorkloadStreams = 4096;
inline constexpr std::size_t kMaxWorkloadRecords = std::size_t{1} << 27;  // 4 GiB of operations
inline constexpr std::size_t kMaxWorkloadMetadata = 1024;         // "# key: value" entries
// The allocator's largest supported request (16 TiB): larger sizes mean nothing on a device.
inline constexpr std::uint64_t kMaxWorkloadAllocationBytes = std::uint64_t{1} << 44;

struct WorkloadOp {
  enum class Kind : std::uint8_t { kAlloc, kFree, kFreeRequested, kFreeCompleted };
  Kind kind;
  std::uint32_t stream = 0;  // kAlloc only
  std::uint64_t id = 0;      // as written in the trace
  std::size_t bytes = 0;     // kAlloc only
  // The allocation's position among the trace's allocations (0, 1, ...): replays index their
  // pointers by it, so memory follows the number of allocations, not the size of the ids.
  std::uint64_t slot = 0;
};

struct WorkloadTrace {
  std::map<std::string, std::string> metadata;  // "# key: value" lines after the first
  std::vector<std::uint64_t> stream_handles;    // index -> original handle
  std::vector<WorkloadOp> ops;
  std::size_t allocation_count = 0;             // 'a' records; slots are below this
  // Peak of requested bytes between alloc and its (completed) free.
  std::size_t peak_requested_bytes = 0;
};

class WorkloadTraceError : public std::runtime_error {
 public:
  WorkloadTraceError(const std::string& source, std::size_t line, const std::string& what)
      : std::runtime_error(source + ":" + std::to_string(line) + ": " + what), line_(line) {}
  std::size_t line() const noexcept { return line_; }

 private:
  std::size_t line_;
};

// Parses and validates a whole trace; `source` names it in error messages. Every rejection
// (docs/workload_trace_format.md), a read error, and a limit above is a WorkloadTraceError.
WorkloadTrace parse_workload_trace(std::istream& in, const std::string& source);
// Reads a file, gunzipping it as it goes when it ends in ".gz" (needs zlib at build time);
// gzip data that expands more than 100-fold is refused.
WorkloadTrace read_workload_trace(const std::string& path);

}  // namespace vramledger
