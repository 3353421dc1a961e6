// Reads workload traces (docs/workload_trace_format.md): what a program asked of its allocator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <istream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace vramledger {

struct WorkloadOp {
  enum class Kind : std::uint8_t { kAlloc, kFree, kFreeRequested, kFreeCompleted };
  Kind kind;
  std::uint32_t stream = 0;  // kAlloc only
  std::uint64_t id = 0;
  std::size_t bytes = 0;     // kAlloc only
};

struct WorkloadTrace {
  std::map<std::string, std::string> metadata;  // "# key: value" lines after the first
  std::vector<std::uint64_t> stream_handles;    // index -> original handle
  std::vector<WorkloadOp> ops;
  std::uint64_t max_id = 0;
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

// Parses and validates a whole trace; `source` names it in error messages.
WorkloadTrace parse_workload_trace(std::istream& in, const std::string& source);
// Reads a file, gunzipping it when it ends in ".gz" (needs zlib at build time).
WorkloadTrace read_workload_trace(const std::string& path);

}  // namespace vramledger
