// The binary trace reader (accounting/trace_file.cpp) allocates by what it reads, never by what
// the header claims: a 64-byte file claiming 2^60 records made read_trace reserve 2^20 records
// (tens of MiB) per call (found by fuzzing, tests/fuzz/). This program replaces operator new to
// see the largest single allocation.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <sstream>
#include <string>

#include "accounting/trace_file.hpp"

namespace {
std::atomic<std::size_t> largest_allocation{0};
}  // namespace

void* operator new(std::size_t size) {
  std::size_t seen = largest_allocation.load();
  while (size > seen && !largest_allocation.compare_exchange_weak(seen, size)) {
  }
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace vramledger {
namespace {

std::string header_claiming(std::uint64_t records) {
  std::string bytes(kTraceHeaderBytes, '\0');
  bytes.replace(0, 8, kTraceMagic, 8);
  auto put = [&](std::size_t offset, std::uint64_t value, int width) {
    for (int i = 0; i < width; ++i) bytes[offset + i] = static_cast<char>(value >> (8 * i));
  };
  put(8, kTraceVersion, 4);
  put(12, kTraceHeaderBytes, 4);
  put(16, kTraceRecordBytes, 4);
  put(24, records, 8);
  return bytes;
}

TEST(TraceFileMemory, AHeaderClaimingManyRecordsAllocatesLittle) {
  std::istringstream in(header_claiming(std::uint64_t{1} << 60));
  largest_allocation = 0;
  try {
    (void)read_trace(in);
    ADD_FAILURE() << "a header without its records was accepted";
  } catch (const TraceFormatError& error) {
    EXPECT_NE(std::string(error.what()).find("truncated record 0"), std::string::npos)
        << error.what();
  }
  EXPECT_LT(largest_allocation.load(), std::size_t{1} << 20)
      << "the reader allocated by the header's claim";
}

}  // namespace
}  // namespace vramledger
