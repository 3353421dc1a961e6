#include "torch_plugin/oom_message.hpp"

#include <c10/core/CachingDeviceAllocator.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <sstream>

#include "torch_plugin/device_allocators.hpp"
#include "torch_plugin/memory_pool.hpp"
#include "torch_plugin/oom_note.hpp"
#include "torch_plugin/process_report.hpp"

namespace vramledger::torch_plugin {

namespace {

// torch refuses anything this large before formatting it ("more than 1EB").
constexpr std::size_t kOneExabyte = std::size_t{1} << 60;

std::string size_text(std::int64_t bytes) {
  return c10::CachingAllocator::format_size(static_cast<std::uint64_t>(std::max<std::int64_t>(0, bytes)));
}

// The additive account of the process on this device; empty when it cannot be gathered (an
// OOM message must never fail to be built).
std::string additive_account(DeviceAllocators& state) {
  try {
    const ProcessReport report = gather_process_report(state.device(), &state);
    const ProcessClassification& lines = report.classification;
    std::ostringstream out;
    out << " vramledger's account of this process on GPU " << static_cast<int>(state.device())
        << " (" << size_text(lines.process_usage) << ", from " << report.process_memory_source
        << "):";
    bool first = true;
    for (const NamedBytes& line : lines.lines()) {
      if (line.bytes == 0) continue;
      out << (first ? " " : "; ") << line.name << " " << size_text(line.bytes);
      first = false;
    }
    if (!lines.non_torch_hooked) {
      out << " (non-torch memory by library needs `vramledger run`, which loads the LD_PRELOAD "
             "shim)";
    }
    out << ".";
    return out.str();
  } catch (const std::exception&) {
    return {};
  }
}

}  // namespace

std::string out_of_memory_message(DeviceAllocators& state, const MemoryPool& pool,
                                  std::size_t requested, std::size_t device_free,
                                  std::size_t device_total, const LedgerCounters& counters,
                                  const std::string& detail) {
  using c10::CachingAllocator::format_size;
  if (requested >= kOneExabyte) return "CUDA out of memory. Tried to allocate more than 1EB memory.";
  const auto& all = counters.aggregate();
  const std::int64_t allocated = all.allocated_bytes.current;
  const std::int64_t reserved = all.reserved_bytes.current;
  std::ostringstream out;
  // torch's wording first.
  out << "CUDA out of memory. Tried to allocate " << format_size(requested) << ". GPU "
      << static_cast<int>(state.device()) << " has a total capacity of " << format_size(device_total)
      << " of which " << format_size(device_free) << " is free. Of the allocated memory "
      << size_text(allocated) << " is allocated by PyTorch, and "
      << size_text(reserved - allocated) << " is reserved by PyTorch but unallocated.";
  if (state.cap() != 0) {
    out << " The memory fraction set for this process caps PyTorch at "
        << format_size(state.cap()) << ".";
  }
  if (pool.is_private()) out << " The request was for a private memory pool (CUDA graph or MemPool).";
  // Where the reserved memory is: what torch's message leaves the user to guess.
  std::int64_t private_pools = 0;
  for (const auto& [id, per_kind] : state.private_pool_reserved()) private_pools += per_kind[0].current;
  std::int64_t largest_free = 0;
  try {
    const BlockCensus census = state.default_pool().policy().census();
    for (const auto& kind : census.pools) largest_free = std::max(largest_free, kind.largest_free_block);
  } catch (const std::exception&) {
  }
  out << " Largest free cached block: " << size_text(largest_free)
      << "; graph and other private pools hold " << size_text(private_pools) << ".";
  out << additive_account(state);
  if (!detail.empty()) out << " vramledger: " << detail;
  // The budget board's account of the other instances on this GPU, when one is kept.
  const std::string note = oom_note(static_cast<int>(state.device()));
  if (!note.empty()) out << " " << note;
  return out.str();
}

}  // namespace vramledger::torch_plugin
