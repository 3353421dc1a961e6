#include "accounting/trace_file.hpp"

#include <algorithm>
#include <array>
#include <cstring>
#include <istream>
#include <ostream>

namespace vramledger {
namespace {

// Explicit byte order, independent of the host: the format is little-endian everywhere.
void put_u16(std::uint8_t* out, std::uint16_t value) {
  for (int i = 0; i < 2; ++i) out[i] = static_cast<std::uint8_t>(value >> (8 * i));
}
void put_u32(std::uint8_t* out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<std::uint8_t>(value >> (8 * i));
}
void put_u64(std::uint8_t* out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::uint8_t>(value >> (8 * i));
}
std::uint16_t get_u16(const std::uint8_t* in) {
  return static_cast<std::uint16_t>(in[0] | (in[1] << 8));
}
std::uint32_t get_u32(const std::uint8_t* in) {
  std::uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | in[i];
  return value;
}
std::uint64_t get_u64(const std::uint8_t* in) {
  std::uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | in[i];
  return value;
}

// Field offsets inside the header and a record (docs/trace_format.md).
namespace header_field {
constexpr std::size_t kMagic = 0, kVersion = 8, kHeaderBytes = 12, kRecordBytes = 16, kFlags = 20,
                      kRecordCount = 24, kFirstSequence = 32, kTicksPerSecond = 40,
                      kOriginTicks = 48, kOriginUnixNs = 56;
}
namespace record_field {
constexpr std::size_t kTime = 0, kAddress = 8, kSize = 16, kRequested = 24, kStream = 32,
                      kKind = 40, kPool = 41, kTag = 42, kSplitDelta = 44, kSplitBytesDelta = 48;
}

// Longer records than this version's are allowed (later fields are skipped) but bounded, so that a
// corrupt size cannot make the reader allocate gigabytes.
constexpr std::uint32_t kMaxRecordBytes = 4096;

void check_stream(const std::ostream& out, const char* what) {
  if (!out) throw Error(ErrorCode::kInvalidArgument, std::string("trace file: cannot write ") + what);
}

// Reads up to `count` bytes; returns how many arrived.
std::size_t read_up_to(std::istream& in, std::uint8_t* buffer, std::size_t count) {
  in.read(reinterpret_cast<char*>(buffer), static_cast<std::streamsize>(count));
  return static_cast<std::size_t>(in.gcount());
}

}  // namespace

TraceFileHeader make_trace_header(const EventTrace& trace) {
  TraceFileHeader header;
  header.record_count = trace.size();
  header.first_sequence = trace.first_sequence();
  header.ticks_per_second = ticks_per_second(trace.clock_source());
  header.origin_ticks = trace.clock_origin().ticks;
  header.origin_unix_ns = trace.clock_origin().unix_ns;
  return header;
}

TraceWriter::TraceWriter(std::ostream& out, const TraceFileHeader& header) : out_(out) {
  std::array<std::uint8_t, kTraceHeaderBytes> bytes{};
  std::memcpy(bytes.data() + header_field::kMagic, kTraceMagic, sizeof(kTraceMagic));
  put_u32(bytes.data() + header_field::kVersion, kTraceVersion);
  put_u32(bytes.data() + header_field::kHeaderBytes, kTraceHeaderBytes);
  put_u32(bytes.data() + header_field::kRecordBytes, kTraceRecordBytes);
  put_u32(bytes.data() + header_field::kFlags, 0);
  put_u64(bytes.data() + header_field::kRecordCount, header.record_count);
  put_u64(bytes.data() + header_field::kFirstSequence, header.first_sequence);
  put_u64(bytes.data() + header_field::kTicksPerSecond, header.ticks_per_second);
  put_u64(bytes.data() + header_field::kOriginTicks, header.origin_ticks);
  put_u64(bytes.data() + header_field::kOriginUnixNs, header.origin_unix_ns);
  out_.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  check_stream(out_, "the header");
}

void TraceWriter::write(const TraceRecord& record) {
  std::array<std::uint8_t, kTraceRecordBytes> bytes{};
  put_u64(bytes.data() + record_field::kTime, record.time_ticks);
  put_u64(bytes.data() + record_field::kAddress, record.address);
  put_u64(bytes.data() + record_field::kSize, record.size);
  put_u64(bytes.data() + record_field::kRequested, record.requested);
  put_u64(bytes.data() + record_field::kStream, record.stream);
  bytes[record_field::kKind] = static_cast<std::uint8_t>(record.kind);
  bytes[record_field::kPool] = static_cast<std::uint8_t>(record.pool);
  put_u16(bytes.data() + record_field::kTag, record.tag);
  put_u32(bytes.data() + record_field::kSplitDelta,
          static_cast<std::uint32_t>(record.inactive_split_delta));
  put_u64(bytes.data() + record_field::kSplitBytesDelta,
          static_cast<std::uint64_t>(record.inactive_split_bytes_delta));
  out_.write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  check_stream(out_, "a record");
  ++records_written_;
}

void write_trace(std::ostream& out, const EventTrace& trace) {
  TraceWriter writer(out, make_trace_header(trace));
  for (const TraceRecord& record : trace) writer.write(record);
  out.flush();
  check_stream(out, "the trace (flush failed)");
}

TraceReader::TraceReader(std::istream& in) : in_(in) {
  std::array<std::uint8_t, kTraceHeaderBytes> bytes{};
  const std::size_t got = read_up_to(in_, bytes.data(), bytes.size());
  // The magic is checked first so that "not a trace at all" is reported as such, even when short.
  const std::size_t magic_bytes = std::min(got, sizeof(kTraceMagic));
  for (std::size_t i = 0; i < magic_bytes; ++i) {
    if (bytes[i] != static_cast<std::uint8_t>(kTraceMagic[i])) {
      throw TraceFormatError(i, "not a vramledger trace (bad magic; expected \"VRLTRACE\")");
    }
  }
  if (got < bytes.size()) {
    throw TraceFormatError(got, "truncated header: expected " + std::to_string(bytes.size()) +
                                    " bytes, the file ends after " + std::to_string(got));
  }
  const std::uint32_t version = get_u32(bytes.data() + header_field::kVersion);
  if (version != kTraceVersion) {
    throw TraceFormatError(header_field::kVersion,
                           "unsupported format version " + std::to_string(version) +
                               " (this reader knows version " + std::to_string(kTraceVersion) +
                               ")");
  }
  const std::uint32_t header_bytes = get_u32(bytes.data() + header_field::kHeaderBytes);
  if (header_bytes < kTraceHeaderBytes) {
    throw TraceFormatError(header_field::kHeaderBytes,
                           "header size " + std::to_string(header_bytes) + " is below the " +
                               std::to_string(kTraceHeaderBytes) + " bytes this version requires");
  }
  const std::uint32_t record_bytes = get_u32(bytes.data() + header_field::kRecordBytes);
  if (record_bytes < kTraceRecordBytes || record_bytes > kMaxRecordBytes) {
    throw TraceFormatError(header_field::kRecordBytes,
                           "record size " + std::to_string(record_bytes) +
                               " is outside the range " + std::to_string(kTraceRecordBytes) +
                               ".." + std::to_string(kMaxRecordBytes) + " bytes");
  }
  const std::uint32_t flags = get_u32(bytes.data() + header_field::kFlags);
  if (flags != 0) {
    throw TraceFormatError(header_field::kFlags,
                           "unknown flags " + std::to_string(flags) + " (this version defines none)");
  }
  record_buffer_.resize(record_bytes);
  header_.record_count = get_u64(bytes.data() + header_field::kRecordCount);
  header_.first_sequence = get_u64(bytes.data() + header_field::kFirstSequence);
  header_.ticks_per_second = get_u64(bytes.data() + header_field::kTicksPerSecond);
  header_.origin_ticks = get_u64(bytes.data() + header_field::kOriginTicks);
  header_.origin_unix_ns = get_u64(bytes.data() + header_field::kOriginUnixNs);
  offset_ = got;

  // A longer header (a later minor revision) carries fields this reader does not know: skip them.
  for (std::uint64_t extra = header_bytes - kTraceHeaderBytes; extra > 0;) {
    std::array<std::uint8_t, 256> skipped{};
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(extra, skipped.size()));
    const std::size_t skipped_now = read_up_to(in_, skipped.data(), want);
    offset_ += skipped_now;
    if (skipped_now < want) {
      throw TraceFormatError(offset_, "truncated header: it declares " +
                                          std::to_string(header_bytes) + " bytes");
    }
    extra -= skipped_now;
  }
}

bool TraceReader::next(TraceRecord& record) {
  const bool count_known = header_.record_count != kUnknownRecordCount;
  if (count_known && records_read_ == header_.record_count) {
    if (in_.peek() != std::istream::traits_type::eof()) {
      throw TraceFormatError(offset_, "unexpected data after the " +
                                          std::to_string(header_.record_count) +
                                          " records the header declares");
    }
    return false;
  }

  std::vector<std::uint8_t>& bytes = record_buffer_;
  const std::size_t got = read_up_to(in_, bytes.data(), bytes.size());
  const std::uint64_t record_start = offset_;
  offset_ += got;
  if (got == 0 && !count_known) return false;
  if (got < bytes.size()) {
    std::string message = "truncated record " + std::to_string(records_read_) + ": expected " +
                          std::to_string(bytes.size()) + " bytes from offset " +
                          std::to_string(record_start) + ", the file ends after " +
                          std::to_string(got);
    if (count_known) {
      message += " (the header declares " + std::to_string(header_.record_count) + " records)";
    }
    throw TraceFormatError(offset_, message);
  }

  const std::uint8_t kind = bytes[record_field::kKind];
  if (kind >= static_cast<std::uint8_t>(EventKind::kCount)) {
    throw TraceFormatError(record_start + record_field::kKind,
                           "record " + std::to_string(records_read_) + " has unknown event kind " +
                               std::to_string(kind));
  }
  const std::uint8_t pool = bytes[record_field::kPool];
  if (pool > static_cast<std::uint8_t>(PoolKind::kLarge)) {
    throw TraceFormatError(record_start + record_field::kPool,
                           "record " + std::to_string(records_read_) + " has unknown pool " +
                               std::to_string(pool));
  }
  record.time_ticks = get_u64(bytes.data() + record_field::kTime);
  record.address = get_u64(bytes.data() + record_field::kAddress);
  record.size = get_u64(bytes.data() + record_field::kSize);
  record.requested = get_u64(bytes.data() + record_field::kRequested);
  record.stream = get_u64(bytes.data() + record_field::kStream);
  record.kind = static_cast<EventKind>(kind);
  record.pool = static_cast<PoolKind>(pool);
  record.tag = get_u16(bytes.data() + record_field::kTag);
  record.inactive_split_delta =
      static_cast<std::int32_t>(get_u32(bytes.data() + record_field::kSplitDelta));
  record.inactive_split_bytes_delta =
      static_cast<std::int64_t>(get_u64(bytes.data() + record_field::kSplitBytesDelta));
  ++records_read_;
  return true;
}

TraceFile read_trace(std::istream& in) {
  TraceReader reader(in);
  TraceFile file;
  file.header = reader.header();
  if (file.header.record_count != kUnknownRecordCount) {
    // A small head start only: the count is the file's claim, not its content, and a 64-byte
    // file claiming 2^60 records must not make the reader allocate tens of MiB (found by
    // fuzzing: a reserve of 2^20 records per call). The vector grows with what is really read.
    file.records.reserve(static_cast<std::size_t>(
        std::min<std::uint64_t>(file.header.record_count, std::uint64_t{1} << 10)));
  }
  TraceRecord record;
  while (reader.next(record)) file.records.push_back(record);
  return file;
}

}  // namespace vramledger
