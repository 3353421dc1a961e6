#include "accounting/trace_file.hpp"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace vramledger {
namespace {

EventTrace sample_trace(std::size_t capacity, std::uint64_t events) {
  EventTrace trace(capacity);
  for (std::uint64_t i = 0; i < events; ++i) {
    AllocatorEvent event{static_cast<EventKind>(i % static_cast<std::uint64_t>(EventKind::kCount))};
    event.pool = i % 2 ? PoolKind::kSmall : PoolKind::kLarge;
    event.tag = static_cast<TagId>(1000 + i);
    event.stream = 0x7fff00000000 + i;
    event.address = 0x7f0000000000 + 512 * i;
    event.size = 512 * (i + 1);
    event.requested = 500 * (i + 1);
    trace.append(event, 1'000'000 + i * 37);
  }
  return trace;
}

std::string serialized(const EventTrace& trace) {
  std::ostringstream out(std::ios::binary);
  write_trace(out, trace);
  return out.str();
}

std::uint64_t format_error_offset(const std::string& bytes) {
  std::istringstream in(bytes, std::ios::binary);
  try {
    read_trace(in);
  } catch (const TraceFormatError& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(error.what()).find("byte offset " + std::to_string(error.offset())),
              std::string::npos)
        << error.what();
    return error.offset();
  }
  ADD_FAILURE() << "expected a TraceFormatError";
  return ~std::uint64_t{0};
}

std::string error_message(const std::string& bytes) {
  std::istringstream in(bytes, std::ios::binary);
  try {
    read_trace(in);
  } catch (const TraceFormatError& error) {
    return error.what();
  }
  return "";
}

TEST(TraceFile, RoundTripKeepsEveryField) {
  const EventTrace trace = sample_trace(64, 40);
  const std::string bytes = serialized(trace);
  EXPECT_EQ(bytes.size(), kTraceHeaderBytes + 40 * kTraceRecordBytes);
  std::istringstream in(bytes, std::ios::binary);
  const TraceFile file = read_trace(in);
  EXPECT_EQ(file.header.record_count, 40u);
  EXPECT_EQ(file.header.first_sequence, 0u);
  EXPECT_GT(file.header.ticks_per_second, 0u);
  EXPECT_EQ(file.header.origin_ticks, trace.clock_origin().ticks);
  EXPECT_EQ(file.header.origin_unix_ns, trace.clock_origin().unix_ns);
  EXPECT_EQ(file.records, trace.to_vector());
}

TEST(TraceFile, WrappedTraceRecordsItsFirstSequence) {
  const EventTrace trace = sample_trace(8, 20);
  std::istringstream in(serialized(trace), std::ios::binary);
  const TraceFile file = read_trace(in);
  EXPECT_EQ(file.header.first_sequence, 12u);
  EXPECT_EQ(file.records, trace.to_vector());
}

TEST(TraceFile, LayoutIsLittleEndianAsDocumented) {
  EventTrace trace(1);
  AllocatorEvent event{EventKind::kMap};
  event.pool = PoolKind::kSmall;
  event.tag = 0x0102;
  event.address = 0x1122334455667788;
  trace.append(event, 0x0A0B0C0D);
  const std::string bytes = serialized(trace);
  EXPECT_EQ(bytes.substr(0, 8), "VRLTRACE");
  EXPECT_EQ(bytes[8], 2);  // version
  EXPECT_EQ(static_cast<unsigned char>(bytes[12]), 64);
  EXPECT_EQ(static_cast<unsigned char>(bytes[16]), 56);
  EXPECT_EQ(bytes[24], 1);  // record count
  const std::size_t record = kTraceHeaderBytes;
  EXPECT_EQ(static_cast<unsigned char>(bytes[record + 0]), 0x0D);
  EXPECT_EQ(static_cast<unsigned char>(bytes[record + 8]), 0x88);
  EXPECT_EQ(static_cast<unsigned char>(bytes[record + 15]), 0x11);
  EXPECT_EQ(bytes[record + 40], static_cast<char>(EventKind::kMap));
  EXPECT_EQ(bytes[record + 41], 0);  // small pool
  EXPECT_EQ(bytes[record + 42], 0x02);
  EXPECT_EQ(bytes[record + 43], 0x01);
}

TEST(TraceFile, StreamingWriterWithUnknownCountReadsToTheEnd) {
  const EventTrace trace = sample_trace(16, 10);
  std::ostringstream out(std::ios::binary);
  TraceFileHeader header = make_trace_header(trace);
  header.record_count = kUnknownRecordCount;
  TraceWriter writer(out, header);
  for (const TraceRecord& record : trace) writer.write(record);
  EXPECT_EQ(writer.records_written(), 10u);

  std::istringstream in(out.str(), std::ios::binary);
  TraceReader reader(in);
  EXPECT_EQ(reader.header().record_count, kUnknownRecordCount);
  std::vector<TraceRecord> records;
  TraceRecord record;
  while (reader.next(record)) records.push_back(record);
  EXPECT_EQ(records, trace.to_vector());
  EXPECT_EQ(reader.offset(), out.str().size());
}

TEST(TraceFile, EmptyTraceRoundTrips) {
  const EventTrace trace(4);
  std::istringstream in(serialized(trace), std::ios::binary);
  const TraceFile file = read_trace(in);
  EXPECT_EQ(file.header.record_count, 0u);
  EXPECT_TRUE(file.records.empty());
}

TEST(TraceFile, RejectsBadMagicAtItsOffset) {
  std::string bytes = serialized(sample_trace(4, 2));
  bytes[3] = 'X';
  EXPECT_EQ(format_error_offset(bytes), 3u);
  EXPECT_NE(error_message(bytes).find("not a vramledger trace"), std::string::npos);
  EXPECT_EQ(format_error_offset("PK\x03\x04"), 0u);  // a short file of another kind
}

TEST(TraceFile, RejectsTruncatedHeader) {
  const std::string bytes = serialized(sample_trace(4, 2)).substr(0, 30);
  EXPECT_EQ(format_error_offset(bytes), 30u);
  EXPECT_NE(error_message(bytes).find("truncated header"), std::string::npos);
  EXPECT_EQ(format_error_offset(""), 0u);
}

TEST(TraceFile, RejectsUnsupportedVersionFlagsAndSizes) {
  const std::string good = serialized(sample_trace(4, 2));
  std::string bytes = good;
  bytes[8] = 3;
  EXPECT_EQ(format_error_offset(bytes), 8u);
  EXPECT_NE(error_message(bytes).find("unsupported format version 3"), std::string::npos);
  bytes = good;
  bytes[12] = 32;
  EXPECT_EQ(format_error_offset(bytes), 12u);
  bytes = good;
  bytes[16] = 40;
  EXPECT_EQ(format_error_offset(bytes), 16u);
  bytes = good;
  bytes[19] = 1;  // record size 16 MiB + 48
  EXPECT_EQ(format_error_offset(bytes), 16u);
  bytes = good;
  bytes[20] = 1;
  EXPECT_EQ(format_error_offset(bytes), 20u);
}

TEST(TraceFile, RejectsTruncatedRecord) {
  const std::string good = serialized(sample_trace(4, 3));
  const std::string bytes = good.substr(0, good.size() - 5);
  EXPECT_EQ(format_error_offset(bytes), bytes.size());
  const std::string message = error_message(bytes);
  EXPECT_NE(message.find("truncated record 2"), std::string::npos) << message;
  EXPECT_NE(message.find("declares 3 records"), std::string::npos) << message;
}

TEST(TraceFile, RejectsMissingRecords) {
  const std::string good = serialized(sample_trace(4, 3));
  const std::string bytes = good.substr(0, kTraceHeaderBytes + kTraceRecordBytes);
  EXPECT_EQ(format_error_offset(bytes), kTraceHeaderBytes + kTraceRecordBytes);
  EXPECT_NE(error_message(bytes).find("truncated record 1"), std::string::npos);
}

TEST(TraceFile, RejectsTrailingBytes) {
  const std::string good = serialized(sample_trace(4, 3));
  EXPECT_EQ(format_error_offset(good + "junk"), good.size());
  EXPECT_NE(error_message(good + "junk").find("after the 3 records"), std::string::npos);
}

TEST(TraceFile, RejectsTruncatedRecordWhenStreaming) {
  std::string bytes = serialized(sample_trace(4, 2));
  for (int i = 24; i < 32; ++i) bytes[i] = '\xff';  // count unknown
  bytes.resize(bytes.size() - 1);
  EXPECT_EQ(format_error_offset(bytes), bytes.size());
}

TEST(TraceFile, RejectsUnknownKindAndPoolAtTheFieldOffset) {
  const std::string good = serialized(sample_trace(4, 3));
  std::string bytes = good;
  const std::size_t second_record = kTraceHeaderBytes + kTraceRecordBytes;
  bytes[second_record + 40] = static_cast<char>(EventKind::kCount);
  EXPECT_EQ(format_error_offset(bytes), second_record + 40);
  EXPECT_NE(error_message(bytes).find("record 1 has unknown event kind"), std::string::npos);
  bytes = good;
  bytes[second_record + 41] = 2;
  EXPECT_EQ(format_error_offset(bytes), second_record + 41);
  EXPECT_NE(error_message(bytes).find("unknown pool 2"), std::string::npos);
}

TEST(TraceFile, SkipsFieldsOfALongerHeaderAndRecord) {
  // A later revision may append fields; version-1 readers skip what they do not know.
  const EventTrace trace = sample_trace(4, 2);
  const std::string good = serialized(trace);
  std::string bytes = good.substr(0, kTraceHeaderBytes);
  bytes[12] = static_cast<char>(kTraceHeaderBytes + 8);
  bytes[16] = static_cast<char>(kTraceRecordBytes + 4);
  bytes += std::string(8, '\x7f');
  for (std::size_t i = 0; i < 2; ++i) {
    bytes += good.substr(kTraceHeaderBytes + i * kTraceRecordBytes, kTraceRecordBytes);
    bytes += "XXXX";
  }
  std::istringstream in(bytes, std::ios::binary);
  EXPECT_EQ(read_trace(in).records, trace.to_vector());
}

TEST(TraceFile, WriterReportsAFailedStream) {
  std::ostringstream out(std::ios::binary);
  out.setstate(std::ios::badbit);
  EXPECT_THROW(write_trace(out, sample_trace(4, 1)), Error);
}

}  // namespace
}  // namespace vramledger
