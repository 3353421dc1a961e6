// The workload trace reader (bench/replay/workload_trace.*): every rejection documented in
// docs/workload_trace_format.md, the limits that bound its memory, and hostile input (huge ids,
// endless lines, failing streams, gzip bombs) ending in errors that name the line.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <new>
#include <sstream>
#include <streambuf>
#include <string>
#include <unistd.h>

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "bench/replay/replayer.hpp"
#include "bench/replay/workload_trace.hpp"

#ifdef VRAMLEDGER_HAVE_ZLIB
#include <zlib.h>
#endif

namespace vramledger {
namespace {

constexpr const char* kHeader = "# vramledger workload trace v1\n";

WorkloadTrace parse(const std::string& text) {
  std::istringstream in(text);
  return parse_workload_trace(in, "t.vlt");
}

// Parsing fails at `line` with a message containing `words`.
void expect_rejected(const std::string& text, std::size_t line, const std::string& words) {
  try {
    (void)parse(text);
    ADD_FAILURE() << "accepted:\n" << text;
  } catch (const WorkloadTraceError& error) {
    EXPECT_EQ(error.line(), line) << error.what();
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos)
        << "message lacks '" << words << "': " << error.what();
    EXPECT_EQ(std::string(error.what()).rfind("t.vlt:" + std::to_string(line) + ": ", 0), 0u)
        << error.what();
  }
}

// --- The documented rejections (docs/workload_trace_format.md), each with its line number ---

TEST(WorkloadTraceRejects, UnknownRecordLetter) {
  expect_rejected(std::string(kHeader) + "s 0 0\nx 1\n", 3, "unknown record 'x'");
}

TEST(WorkloadTraceRejects, MissingField) {
  expect_rejected(std::string(kHeader) + "s 0 0\na 1 100\n", 3, "needs 3 field(s), got 2");
}

TEST(WorkloadTraceRejects, ExtraField) {
  expect_rejected(std::string(kHeader) + "s 0 0\na 1 100 0\nf 1 2\n", 4,
                  "needs 1 field(s), got 2");
}

TEST(WorkloadTraceRejects, DoubleSpaceIsAnEmptyField) {
  expect_rejected(std::string(kHeader) + "s 0 0\na  1 100 0\n", 3, "needs 3 field(s)");
}

TEST(WorkloadTraceRejects, NonNumericNumbers) {
  expect_rejected(std::string(kHeader) + "s 0 0\na one 100 0\n", 3, "bad id 'one'");
  expect_rejected(std::string(kHeader) + "s 0 0\na 1 -5 0\n", 3, "bad size '-5'");
  expect_rejected(std::string(kHeader) + "s 0 0\na 1 0x10 0\n", 3, "bad size '0x10'");
  expect_rejected(std::string(kHeader) + "s 0 zero\n", 2, "bad stream handle 'zero'");
}

TEST(WorkloadTraceRejects, OverflowingNumbers) {
  expect_rejected(std::string(kHeader) + "s 0 0\na 18446744073709551616 1 0\n", 3,
                  "(too large)");
}

TEST(WorkloadTraceRejects, SizeZero) {
  expect_rejected(std::string(kHeader) + "s 0 0\na 7 0 0\n", 3, "allocation 7 has size 0");
}

TEST(WorkloadTraceRejects, IdAllocatedTwice) {
  // Even after it was freed: ids are allocated once.
  expect_rejected(std::string(kHeader) + "s 0 0\na 7 1 0\nf 7\na 7 1 0\n", 5,
                  "id 7 allocated twice");
}

TEST(WorkloadTraceRejects, FreeOfAnIdNotLive) {
  expect_rejected(std::string(kHeader) + "s 0 0\nf 3\n", 3, "free of id 3, which is not live");
  expect_rejected(std::string(kHeader) + "s 0 0\na 3 1 0\nf 3\nf 3\n", 5, "not live");
  // A delayed free is not live either.
  expect_rejected(std::string(kHeader) + "s 0 0\na 3 1 0\nr 3\nf 3\n", 5, "not live");
}

TEST(WorkloadTraceRejects, CompletionWithoutPendingFree) {
  expect_rejected(std::string(kHeader) + "s 0 0\na 3 1 0\nc 3\n", 4,
                  "completion of id 3 without a pending free ('r')");
}

TEST(WorkloadTraceRejects, UndeclaredStream) {
  expect_rejected(std::string(kHeader) + "s 0 0\na 1 1 1\n", 3, "stream 1 was not declared");
}

TEST(WorkloadTraceRejects, StreamsOutOfOrder) {
  expect_rejected(std::string(kHeader) + "s 1 0\n", 2,
                  "streams must be declared in order: expected index 0");
}

TEST(WorkloadTraceRejects, MissingOrDifferentFirstLine) {
  expect_rejected("s 0 0\n", 1, "not a vramledger workload trace");
  expect_rejected("# vramledger workload trace v2\n", 1, "the first line must be");
}

TEST(WorkloadTraceRejects, EmptyInput) { expect_rejected("", 0, "empty input"); }

// Text echoed from a hostile trace cannot drive the terminal (escape sequences) or flood it.
TEST(WorkloadTraceRejects, EchoedTextIsPrintableAndShort) {
  expect_rejected(std::string(kHeader) + "s 0 0\n\x1b[2J\x07 1\n", 3,
                  "unknown record '\\x1b[2J\\x07'");
  expect_rejected(std::string(kHeader) + "s 0 0\na " + std::string(1000, '7') + "x 1 0\n", 3,
                  "bad id '7777777777777777777777777777777777777777...'");
}

// --- What it accepts ---

TEST(WorkloadTraceAccepts, CrlfMetadataAndNoFinalNewline) {
  const WorkloadTrace trace = parse(
      "# vramledger workload trace v1\r\n# source: test\r\ns 0 9\r\na 1 100 0\r\nr 1\r\nc 1");
  EXPECT_EQ(trace.metadata.at("source"), "test");
  EXPECT_EQ(trace.ops.size(), 3u);
  EXPECT_EQ(trace.peak_requested_bytes, 100u);
  EXPECT_EQ(trace.stream_handles.at(0), 9u);
}

// --- Hostile input: crashes, runaway memory, silent truncation ---

// An id near 2^64 once sized the replay's pointer table by the id: a crash (vector bounds) or
// gigabytes for one allocation. Allocations get dense slots instead.
TEST(WorkloadTraceHostile, HugeIdsTakeOneSlotEach) {
  const WorkloadTrace trace = parse(std::string(kHeader) +
                                    "s 0 0\na 18446744073709551615 100 0\na 4294967296000 50 0\n"
                                    "f 18446744073709551615\nf 4294967296000\n");
  EXPECT_EQ(trace.allocation_count, 2u);
  EXPECT_EQ(trace.ops[0].slot, 0u);
  EXPECT_EQ(trace.ops[1].slot, 1u);
  EXPECT_EQ(trace.ops[2].slot, 0u);
  EXPECT_EQ(trace.ops[3].slot, 1u);

  SimulatedDevice device(SimulatedDeviceOptions{});
  Ledger ledger;
  CachingAllocator allocator(device, &ledger, AllocatorOptions{});
  const ReplayResult result =
      replay_workload(trace, allocator, ledger, [](std::uint32_t) { return StreamHandle{0}; });
  EXPECT_EQ(result.allocations, 2u);
  EXPECT_EQ(result.peak_requested_bytes, 150);
}

// /dev/zero as a trace: no newline ever comes. The reader stops at the line limit.
TEST(WorkloadTraceHostile, EndlessLineIsRefused) {
  expect_rejected(std::string(1 << 20, '\0'), 1, "line longer than 4096 bytes");
  expect_rejected(std::string(kHeader) + "# " + std::string(1 << 20, 'x'), 2,
                  "line longer than 4096 bytes");
}

TEST(WorkloadTraceHostile, DevZeroIsRefused) {
  if (!std::filesystem::exists("/dev/zero")) GTEST_SKIP() << "no /dev/zero";
  try {
    (void)read_workload_trace("/dev/zero");
    ADD_FAILURE() << "accepted /dev/zero";
  } catch (const WorkloadTraceError& error) {
    EXPECT_NE(std::string(error.what()).find("line longer than"), std::string::npos)
        << error.what();
  }
}

// A stream that fails mid-way (here: memory runs out inside it) used to end the read loop as if
// the trace had ended, and the replay exited 0 with part of the trace.
class FailingBuffer : public std::streambuf {
 public:
  explicit FailingBuffer(std::string text) : text_(std::move(text)) {
    setg(text_.data(), text_.data(), text_.data() + text_.size());
  }

 protected:
  int_type underflow() override { throw std::bad_alloc(); }

 private:
  std::string text_;
};

TEST(WorkloadTraceHostile, ReadErrorIsNotTheEnd) {
  FailingBuffer buffer(std::string(kHeader) + "s 0 0\na 1 100 0\n");
  std::istream in(&buffer);
  try {
    (void)parse_workload_trace(in, "t.vlt");
    ADD_FAILURE() << "a failing stream was read as a complete trace";
  } catch (const WorkloadTraceError& error) {
    EXPECT_NE(std::string(error.what()).find("read error"), std::string::npos) << error.what();
  }
}

// 200,000 streams took minutes (the policy looks streams up one by one); the reader's limit
// stops such a trace at once.
TEST(WorkloadTraceHostile, TooManyStreams) {
  std::string text = kHeader;
  for (std::size_t i = 0; i <= kMaxWorkloadStreams; ++i) {
    text += "s " + std::to_string(i) + " " + std::to_string(i) + "\n";
  }
  expect_rejected(text, kMaxWorkloadStreams + 2, "more than 4096 streams");
  text.resize(text.rfind("s 4096"));
  EXPECT_EQ(parse(text).stream_handles.size(), kMaxWorkloadStreams);
}

TEST(WorkloadTraceHostile, SizeBeyondAnyDevice) {
  expect_rejected(std::string(kHeader) + "s 0 0\na 1 17592186044417 0\n", 3,
                  "exceeds the largest supported request");
  EXPECT_EQ(parse(std::string(kHeader) + "s 0 0\na 1 17592186044416 0\n").peak_requested_bytes,
            std::size_t{1} << 44);
}

TEST(WorkloadTraceHostile, TooManyMetadataLines) {
  std::string text = kHeader;
  for (std::size_t i = 0; i <= kMaxWorkloadMetadata; ++i) {
    text += "# key" + std::to_string(i) + ": value\n";
  }
  expect_rejected(text, kMaxWorkloadMetadata + 2, "more than 1024 metadata lines");
}

TEST(WorkloadTraceHostile, MissingFileNamesTheReason) {
  try {
    (void)read_workload_trace("/nonexistent/trace.vlt");
    ADD_FAILURE();
  } catch (const WorkloadTraceError& error) {
    EXPECT_NE(std::string(error.what()).find("cannot open: No such file"), std::string::npos)
        << error.what();
  }
}

#ifdef VRAMLEDGER_HAVE_ZLIB
class GzipFile {
 public:
  explicit GzipFile(const std::string& name)
      : path_(std::filesystem::temp_directory_path() /
              (name + "." + std::to_string(::getpid()) + ".vlt.gz")) {}
  ~GzipFile() { std::filesystem::remove(path_); }
  // `head`, then `text` `repeat` times.
  void write(const std::string& head, const std::string& text = "", std::size_t repeat = 0) {
    gzFile file = gzopen(path_.c_str(), "wb9");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(gzwrite(file, head.data(), static_cast<unsigned>(head.size())),
              static_cast<int>(head.size()));
    for (std::size_t i = 0; i < repeat; ++i) {
      ASSERT_EQ(gzwrite(file, text.data(), static_cast<unsigned>(text.size())),
                static_cast<int>(text.size()));
    }
    gzclose(file);
  }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

void expect_file_rejected(const std::string& path, const std::string& words) {
  try {
    (void)read_workload_trace(path);
    ADD_FAILURE() << "accepted " << path;
  } catch (const WorkloadTraceError& error) {
    EXPECT_NE(std::string(error.what()).find(words), std::string::npos)
        << "message lacks '" << words << "': " << error.what();
  }
}

// 64 MiB of blank lines in ~64 KiB of gzip: refused after the first few MiB, not inflated whole.
TEST(WorkloadTraceGzip, BombIsRefusedEarly) {
  GzipFile bomb("bomb");
  // A valid start, so only the expansion can stop it.
  bomb.write(kHeader, std::string(1 << 20, '\n'), 64);
  expect_file_rejected(bomb.path(), "expands more than 100-fold");
}

TEST(WorkloadTraceGzip, TruncatedDataIsAnError) {
  GzipFile whole("whole");
  std::string text = kHeader;
  text += "s 0 0\n";
  for (int i = 0; i < 20000; ++i) {
    text += "a " + std::to_string(i) + " 512 0\nf " + std::to_string(i) + "\n";
  }
  whole.write(text);
  EXPECT_EQ(read_workload_trace(whole.path()).allocation_count, 20000u);
  const auto size = std::filesystem::file_size(whole.path());
  std::filesystem::resize_file(whole.path(), size / 2);
  expect_file_rejected(whole.path(), "corrupt or truncated gzip data");
}

TEST(WorkloadTraceGzip, NotGzipAtAllIsReadAsText) {
  GzipFile plain("plain");
  {
    std::ofstream out(plain.path(), std::ios::binary);
    out << kHeader << "s 0 0\na 1 8 0\n";
  }
  EXPECT_EQ(read_workload_trace(plain.path()).allocation_count, 1u);
}
#endif

}  // namespace
}  // namespace vramledger
