#include "bench/replay/workload_trace.hpp"

#include <charconv>
#include <fstream>
#include <sstream>
#include <string_view>
#include <unordered_map>

#ifdef VRAMLEDGER_HAVE_ZLIB
#include <zlib.h>
#endif

namespace vramledger {

namespace {

constexpr std::string_view kFirstLine = "# vramledger workload trace v1";

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
      fail(std::string("bad ") + what + " '" + std::string(text) + "'" +
           (error == std::errc::result_out_of_range ? " (too large)" : ""));
    }
    return value;
  }

 private:
  const std::string& source_;
  std::size_t line_;
};

}  // namespace

WorkloadTrace parse_workload_trace(std::istream& in, const std::string& source) {
  WorkloadTrace trace;
  enum class State : std::uint8_t { kLive, kAwaitingCompletion };
  std::unordered_map<std::uint64_t, std::pair<State, std::size_t>> live;  // id -> state, bytes
  std::unordered_map<std::uint64_t, bool> seen;
  std::size_t requested = 0;
  std::string text;
  std::size_t line_number = 0;
  bool in_header = true;
  while (std::getline(in, text)) {
    ++line_number;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    LineParser parser(source, line_number);
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
      if (in_header && colon != std::string::npos && colon > 2) {
        trace.metadata[text.substr(2, colon - 2)] = text.substr(colon + 2);
      }
      continue;
    }
    in_header = false;
    const auto fields = fields_of(text);
    auto expect_fields = [&](std::size_t count) {
      if (fields.size() != count) {
        parser.fail("record '" + std::string(fields[0]) + "' needs " + std::to_string(count - 1) +
                    " field(s), got " + std::to_string(fields.size() - 1));
      }
    };
    if (fields[0] == "s") {
      expect_fields(3);
      const std::uint64_t index = parser.number(fields[1], "stream index");
      if (index != trace.stream_handles.size()) {
        parser.fail("streams must be declared in order: expected index " +
                    std::to_string(trace.stream_handles.size()));
      }
      trace.stream_handles.push_back(parser.number(fields[2], "stream handle"));
      continue;
    }
    WorkloadOp op{};
    if (fields[0] == "a") {
      expect_fields(4);
      op.kind = WorkloadOp::Kind::kAlloc;
      op.id = parser.number(fields[1], "id");
      op.bytes = static_cast<std::size_t>(parser.number(fields[2], "size"));
      const std::uint64_t stream = parser.number(fields[3], "stream index");
      if (op.bytes == 0) parser.fail("allocation " + std::to_string(op.id) + " has size 0");
      if (stream >= trace.stream_handles.size()) {
        parser.fail("stream " + std::to_string(stream) + " was not declared");
      }
      op.stream = static_cast<std::uint32_t>(stream);
      if (!seen.emplace(op.id, true).second) {
        parser.fail("id " + std::to_string(op.id) + " allocated twice");
      }
      live[op.id] = {State::kLive, op.bytes};
      requested += op.bytes;
      trace.peak_requested_bytes = std::max(trace.peak_requested_bytes, requested);
      trace.max_id = std::max(trace.max_id, op.id);
    } else if (fields[0] == "f" || fields[0] == "r" || fields[0] == "c") {
      expect_fields(2);
      op.id = parser.number(fields[1], "id");
      auto it = live.find(op.id);
      const char kind = fields[0][0];
      if (kind == 'c') {
        op.kind = WorkloadOp::Kind::kFreeCompleted;
        if (it == live.end() || it->second.first != State::kAwaitingCompletion) {
          parser.fail("completion of id " + std::to_string(op.id) + " without a pending free ('r')");
        }
      } else {
        op.kind = kind == 'f' ? WorkloadOp::Kind::kFree : WorkloadOp::Kind::kFreeRequested;
        if (it == live.end() || it->second.first != State::kLive) {
          parser.fail("free of id " + std::to_string(op.id) + ", which is not live");
        }
      }
      if (kind == 'r') {
        it->second.first = State::kAwaitingCompletion;
      } else {
        requested -= it->second.second;
        live.erase(it);
      }
    } else {
      parser.fail("unknown record '" + std::string(fields[0]) + "'");
    }
    trace.ops.push_back(op);
  }
  if (line_number == 0) throw WorkloadTraceError(source, 0, "empty input");
  return trace;
}

WorkloadTrace read_workload_trace(const std::string& path) {
  const bool gzipped = path.size() > 3 && path.compare(path.size() - 3, 3, ".gz") == 0;
  if (!gzipped) {
    std::ifstream in(path);
    if (!in) throw WorkloadTraceError(path, 0, "cannot open");
    return parse_workload_trace(in, path);
  }
#ifdef VRAMLEDGER_HAVE_ZLIB
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) throw WorkloadTraceError(path, 0, "cannot open");
  std::string data;
  char buffer[1 << 16];
  int got = 0;
  while ((got = gzread(file, buffer, sizeof buffer)) > 0) data.append(buffer, static_cast<std::size_t>(got));
  int error = 0;
  const char* message = gzerror(file, &error);
  const bool failed = got < 0 || (error != Z_OK && error != Z_STREAM_END);
  const std::string why = failed ? message : "";
  gzclose(file);
  if (failed) throw WorkloadTraceError(path, 0, "corrupt or truncated gzip data: " + why);
  std::istringstream in(data);
  return parse_workload_trace(in, path);
#else
  throw WorkloadTraceError(path, 0, "built without zlib: gunzip the trace first");
#endif
}

}  // namespace vramledger
