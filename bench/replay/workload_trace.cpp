#include "bench/replay/workload_trace.hpp"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <limits>
#include <new>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "bench/replay/bounded_line_reader.hpp"

namespace vramledger {

namespace {

constexpr std::string_view kFirstLine = "# vramledger workload trace v1";
// The ledger counts bytes in int64: more live bytes than that cannot be accounted.
constexpr std::uint64_t kMaxLiveRequestedBytes = std::numeric_limits<std::int64_t>::max();

// Text from the trace as it may appear in a message: at most 40 bytes, bytes outside printable
// ASCII as \xNN, so a hostile trace cannot write control sequences to the user's terminal.
std::string printable(std::string_view text) {
  constexpr std::size_t kMaxShown = 40;
  std::string shown;
  for (std::size_t i = 0; i < text.size() && i < kMaxShown; ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if (byte >= 0x20 && byte < 0x7f && byte != '\\') {
      shown.push_back(static_cast<char>(byte));
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      shown += "\\x";
      shown.push_back(kHex[byte >> 4]);
      shown.push_back(kHex[byte & 0xf]);
    }
  }
  if (text.size() > kMaxShown) shown += "...";
  return shown;
}

// Splits on single spaces.
std::vector<std::string_view> fields_of(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t start = 0;
  while (start <= line.size()) {
    const std::size_t space = line.find(' ', start);
    const std::size_t end = space == std::string_view::npos ? line.size() : space;
    fields.push_back(line.substr(start, end - start));
    if (space == std::string_view::npos) break;
    start = space + 1;
  }
  return fields;
}

class LineParser {
 public:
  LineParser(const std::string& source, std::size_t line) : source_(source), line_(line) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw WorkloadTraceError(source_, line_, what);
  }

  std::uint64_t number(std::string_view text, const char* what) const {
    std::uint64_t value = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
      fail(std::string("bad ") + what + " '" + printable(text) + "'" +
           (error == std::errc::result_out_of_range ? " (too large)" : ""));
    }
    return value;
  }

 private:
  const std::string& source_;
  std::size_t line_;
};

// The parser proper, over any line source.
WorkloadTrace parse_lines(ByteSource& bytes, const std::string& source) {
  WorkloadTrace trace;
  enum class State : std::uint8_t { kLive, kAwaitingCompletion };
  struct LiveBlock {
    State state;
    std::size_t bytes;
    std::uint64_t slot;
  };
  std::unordered_map<std::uint64_t, LiveBlock> live;
  std::unordered_set<std::uint64_t> seen;
  std::uint64_t requested = 0;
  std::size_t line_number = 0;
  bool in_header = true;
  BoundedLineReader reader(bytes, kMaxWorkloadLineBytes);
  std::string_view text;
  try {
    for (;;) {
      const BoundedLineReader::Status status = reader.next(text);
      if (status == BoundedLineReader::Status::kEnd) break;
      ++line_number;
      LineParser parser(source, line_number);
      if (status == BoundedLineReader::Status::kTooLong) {
        parser.fail("line longer than " + std::to_string(kMaxWorkloadLineBytes) +
                    " bytes" + (line_number == 1 ? ": not a vramledger workload trace" : ""));
      }
      if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
      if (line_number == 1) {
        if (text != kFirstLine) {
          parser.fail("not a vramledger workload trace: the first line must be '" +
                      std::string(kFirstLine) + "'");
        }
        continue;
      }
      if (text.empty()) continue;
      if (text[0] == '#') {
        const std::size_t colon = text.find(": ");
        if (in_header && colon != std::string_view::npos && colon > 2) {
          if (trace.metadata.size() >= kMaxWorkloadMetadata) {
            parser.fail("more than " + std::to_string(kMaxWorkloadMetadata) +
                        " metadata lines");
          }
          trace.metadata[std::string(text.substr(2, colon - 2))] =
              std::string(text.substr(colon + 2));
        }
        continue;
      }
      in_header = false;
      const auto fields = fields_of(text);
      auto expect_fields = [&](std::size_t count) {
        if (fields.size() != count) {
          parser.fail("record '" + printable(fields[0]) + "' needs " +
                      std::to_string(count - 1) + " field(s), got " +
                      std::to_string(fields.size() - 1));
        }
      };
      if (fields[0] == "s") {
        expect_fields(3);
        const std::uint64_t index = parser.number(fields[1], "stream index");
        if (index != trace.stream_handles.size()) {
          parser.fail("streams must be declared in order: expected index " +
                      std::to_string(trace.stream_handles.size()));
        }
        if (trace.stream_handles.size() >= kMaxWorkloadStreams) {
          parser.fail("more than " + std::to_string(kMaxWorkloadStreams) + " streams");
        }
        trace.stream_handles.push_back(parser.number(fields[2], "stream handle"));
        continue;
      }
      if (trace.ops.size() >= kMaxWorkloadRecords) {
        parser.fail("more than " + std::to_string(kMaxWorkloadRecords) +
                    " records: split the trace");
      }
      WorkloadOp op{};
      if (fields[0] == "a") {
        expect_fields(4);
        op.kind = WorkloadOp::Kind::kAlloc;
        op.id = parser.number(fields[1], "id");
        const std::uint64_t bytes = parser.number(fields[2], "size");
        const std::uint64_t stream = parser.number(fields[3], "stream index");
        if (bytes == 0) parser.fail("allocation " + std::to_string(op.id) + " has size 0");
        if (bytes > kMaxWorkloadAllocationBytes) {
          parser.fail("allocation " + std::to_string(op.id) + " of " + std::to_string(bytes) +
                      " bytes exceeds the largest supported request (" +
                      std::to_string(kMaxWorkloadAllocationBytes) + " bytes)");
        }
        op.bytes = static_cast<std::size_t>(bytes);
        if (stream >= trace.stream_handles.size()) {
          parser.fail("stream " + std::to_string(stream) + " was not declared");
        }
        op.stream = static_cast<std::uint32_t>(stream);
        if (!seen.insert(op.id).second) {
          parser.fail("id " + std::to_string(op.id) + " allocated twice");
        }
        if (requested > kMaxLiveRequestedBytes - op.bytes) {
          parser.fail("live allocations exceed " + std::to_string(kMaxLiveRequestedBytes) +
                      " bytes");
        }
        op.slot = trace.allocation_count++;
        live[op.id] = {State::kLive, op.bytes, op.slot};
        requested += op.bytes;
        trace.peak_requested_bytes =
            std::max(trace.peak_requested_bytes, static_cast<std::size_t>(requested));
      } else if (fields[0] == "f" || fields[0] == "r" || fields[0] == "c") {
        expect_fields(2);
        op.id = parser.number(fields[1], "id");
        auto it = live.find(op.id);
        const char kind = fields[0][0];
        if (kind == 'c') {
          op.kind = WorkloadOp::Kind::kFreeCompleted;
          if (it == live.end() || it->second.state != State::kAwaitingCompletion) {
            parser.fail("completion of id " + std::to_string(op.id) +
                        " without a pending free ('r')");
          }
        } else {
          op.kind = kind == 'f' ? WorkloadOp::Kind::kFree : WorkloadOp::Kind::kFreeRequested;
          if (it == live.end() || it->second.state != State::kLive) {
            parser.fail("free of id " + std::to_string(op.id) + ", which is not live");
          }
        }
        op.slot = it->second.slot;
        if (kind == 'r') {
          it->second.state = State::kAwaitingCompletion;
        } else {
          requested -= it->second.bytes;
          live.erase(it);
        }
      } else {
        parser.fail("unknown record '" + printable(fields[0]) + "'");
      }
      trace.ops.push_back(op);
    }
  } catch (const InputError& error) {
    throw WorkloadTraceError(source, line_number + 1, error.what());
  } catch (const std::bad_alloc&) {
    throw WorkloadTraceError(source, line_number,
                             "out of memory while reading the trace (" +
                                 std::to_string(trace.ops.size()) + " records read)");
  }
  if (line_number == 0) throw WorkloadTraceError(source, 0, "empty input");
  return trace;
}

}  // namespace

WorkloadTrace parse_workload_trace(std::istream& in, const std::string& source) {
  IstreamByteSource bytes(in);
  return parse_lines(bytes, source);
}

WorkloadTrace read_workload_trace(const std::string& path) {
  const bool gzipped = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  if (!gzipped) {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      throw WorkloadTraceError(path, 0, std::string("cannot open: ") + std::strerror(errno));
    }
    return parse_workload_trace(in, path);
  }
  try {
    GzipByteSource bytes(path);
    return parse_lines(bytes, path);
  } catch (const InputError& error) {  // from opening; parse_lines reports its own
    throw WorkloadTraceError(path, 0, error.what());
  }
}

}  // namespace vramledger
