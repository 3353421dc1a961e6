// The trace as a file: a 64-byte header, then little-endian fixed-size records
// (docs/trace_format.md). Records can be written as they arrive (record count "unknown", read to
// the end) or all at once from an EventTrace (count known, checked on reading).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "accounting/event_trace.hpp"
#include "accounting/trace_record.hpp"
#include "allocator/errors.hpp"

namespace vramledger {

inline constexpr char kTraceMagic[8] = {'V', 'R', 'L', 'T', 'R', 'A', 'C', 'E'};
inline constexpr std::uint32_t kTraceVersion = 2;
inline constexpr std::uint32_t kTraceHeaderBytes = 64;
inline constexpr std::uint32_t kTraceRecordBytes = 56;
inline constexpr std::uint64_t kUnknownRecordCount = ~std::uint64_t{0};

struct TraceFileHeader {
  std::uint64_t record_count = kUnknownRecordCount;
  std::uint64_t first_sequence = 0;    // stream position of the first record (= records dropped)
  std::uint64_t ticks_per_second = 0;  // rate of time_ticks; 0: records carry no time
  std::uint64_t origin_ticks = 0;      // a time_ticks value ...
  std::uint64_t origin_unix_ns = 0;    // ... and the wall-clock time it corresponds to

  friend bool operator==(const TraceFileHeader&, const TraceFileHeader&) = default;
};

// Malformed or truncated input. offset() is the byte offset of the first wrong or missing byte.
class TraceFormatError : public Error {
 public:
  TraceFormatError(std::uint64_t offset, const std::string& message)
      : Error(ErrorCode::kInvalidArgument,
              "trace file, byte offset " + std::to_string(offset) + ": " + message),
        offset_(offset) {}
  std::uint64_t offset() const noexcept { return offset_; }

 private:
  std::uint64_t offset_;
};

// Header describing `trace` as it is now (count, first sequence, clock calibration).
TraceFileHeader make_trace_header(const EventTrace& trace);

// Writes the header at construction and one record per write(). The stream must be binary.
// Throws Error(kInvalidArgument) when the stream fails.
class TraceWriter {
 public:
  TraceWriter(std::ostream& out, const TraceFileHeader& header);
  void write(const TraceRecord& record);
  std::uint64_t records_written() const noexcept { return records_written_; }

 private:
  std::ostream& out_;
  std::uint64_t records_written_ = 0;
};

// The whole trace with its record count in the header.
void write_trace(std::ostream& out, const EventTrace& trace);

// Reads and validates the header at construction; next() yields records in order. Throws
// TraceFormatError for bad magic, an unsupported version or flags, impossible sizes, an unknown
// event kind or pool, a truncated header or record, fewer records than the header promises, or
// bytes after the last promised record.
class TraceReader {
 public:
  explicit TraceReader(std::istream& in);
  const TraceFileHeader& header() const noexcept { return header_; }
  // False at the end of the records.
  bool next(TraceRecord& record);
  std::uint64_t offset() const noexcept { return offset_; }  // bytes consumed so far

 private:
  std::istream& in_;
  TraceFileHeader header_;
  std::vector<std::uint8_t> record_buffer_;  // one record as stored (record size from the header)
  std::uint64_t offset_ = 0;
  std::uint64_t records_read_ = 0;
};

struct TraceFile {
  TraceFileHeader header;
  std::vector<TraceRecord> records;
};
TraceFile read_trace(std::istream& in);

}  // namespace vramledger
