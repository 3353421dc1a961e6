// Fuzz target: the binary event trace reader (accounting/trace_file.cpp). Any input is read or
// refused with TraceFormatError; what is read writes back to the same records.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "accounting/trace_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  vramledger::TraceFile file;
  try {
    file = vramledger::read_trace(in);
  } catch (const vramledger::TraceFormatError&) {
    return 0;
  }
  if (file.header.record_count != vramledger::kUnknownRecordCount &&
      file.header.record_count != file.records.size()) {
    std::abort();
  }
  std::ostringstream out;
  vramledger::TraceWriter writer(out, file.header);
  for (const vramledger::TraceRecord& record : file.records) writer.write(record);
  std::istringstream again(out.str());
  const vramledger::TraceFile reread = vramledger::read_trace(again);
  if (reread.records.size() != file.records.size()) std::abort();
  for (std::size_t i = 0; i < file.records.size(); ++i) {
    const vramledger::TraceRecord& a = file.records[i];
    const vramledger::TraceRecord& b = reread.records[i];
    if (a.time_ticks != b.time_ticks || a.address != b.address || a.size != b.size ||
        a.requested != b.requested || a.stream != b.stream || a.kind != b.kind ||
        a.pool != b.pool || a.tag != b.tag || a.inactive_split_delta != b.inactive_split_delta ||
        a.inactive_split_bytes_delta != b.inactive_split_bytes_delta) {
      std::abort();
    }
  }
  return 0;
}
