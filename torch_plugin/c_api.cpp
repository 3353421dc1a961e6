// The C functions of vramledger_c_api.h: thin wrappers that turn exceptions into return codes
// (except vramledger_malloc, which must throw like every torch allocator).
#include "abi/vramledger_c_api.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "accounting/tag_registry.hpp"
#include "torch_plugin/graph_pools.hpp"
#include "torch_plugin/install.hpp"
#include "torch_plugin/oom_note.hpp"
#include "torch_plugin/process_report.hpp"
#include "torch_plugin/sleep_by_name.hpp"
#include "torch_plugin/stats_json.hpp"
#include "torch_plugin/vramledger_allocator.hpp"

namespace {

using vramledger::torch_plugin::DeviceAllocators;
using vramledger::torch_plugin::VramledgerAllocator;

thread_local std::string last_error;
thread_local std::string process_report_result;  // vramledger_process_report's result
thread_local std::vector<std::unique_ptr<vramledger::TagScope>> tag_scopes;

int fail(const std::exception& error) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&error);
  last_error = c10_error ? c10_error->what_without_backtrace() : error.what();
  return -1;
}

// The instance the pluggable functions use: the installed one, or one configured from
// VRAMLEDGER_CONF on first use.
VramledgerAllocator& allocator() {
  if (VramledgerAllocator* existing = VramledgerAllocator::instance()) return *existing;
  const char* conf = std::getenv("VRAMLEDGER_CONF");
  return VramledgerAllocator::get_or_create(conf ? conf : "");
}

std::size_t copy_out(const std::string& text, char* buffer, std::size_t capacity) {
  if (buffer != nullptr && capacity > 0) {
    const std::size_t n = text.size() < capacity - 1 ? text.size() : capacity - 1;
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return text.size();
}

vramledger_stat to_c(const vramledger::Stat& stat) {
  return {stat.current, stat.peak, stat.allocated, stat.freed};
}

}  // namespace

extern "C" {

int vramledger_install(const char* conf) {
  try {
    vramledger::torch_plugin::install(conf ? conf : "");
    last_error.clear();
    return 0;
  } catch (const std::exception& error) {
    return fail(error);
  }
}

int vramledger_is_installed(void) { return vramledger::torch_plugin::installed() ? 1 : 0; }

const char* vramledger_last_error(void) { return last_error.c_str(); }

void* vramledger_malloc(size_t size, int device, vramledger_stream_t stream) {
  return allocator().malloc(size, static_cast<c10::DeviceIndex>(device),
                            reinterpret_cast<cudaStream_t>(stream));
}

void* vramledger_try_malloc(size_t size, int device, vramledger_stream_t stream) {
  try {
    return vramledger_malloc(size, device, stream);
  } catch (const std::exception& error) {
    fail(error);
    return nullptr;
  }
}

void vramledger_free(void* ptr, size_t /*size*/, int /*device*/, vramledger_stream_t /*stream*/) {
  // The block knows its size, device and stream; torch's arguments are only a cross-check we
  // do not need.
  VramledgerAllocator* instance = VramledgerAllocator::instance();
  if (instance != nullptr) instance->free_block(ptr);
}

int vramledger_get_stats(int device, vramledger_stats* out) {
  if (out == nullptr || device < 0 || device >= VramledgerAllocator::kMaxDevices) return -1;
  *out = vramledger_stats{};
  VramledgerAllocator* instance = VramledgerAllocator::instance();
  DeviceAllocators* state =
      instance ? instance->device_if_created(static_cast<c10::DeviceIndex>(device)) : nullptr;
  if (state == nullptr) return 0;
  const vramledger::LedgerCounters counters = state->counters();
  const vramledger::PoolCounters& all = counters.aggregate();
  out->allocation = to_c(all.allocation);
  out->segment = to_c(all.segment);
  out->active = to_c(all.active);
  out->inactive_split = to_c(all.inactive_split);
  out->allocated_bytes = to_c(all.allocated_bytes);
  out->reserved_bytes = to_c(all.reserved_bytes);
  out->active_bytes = to_c(all.active_bytes);
  out->inactive_split_bytes = to_c(all.inactive_split_bytes);
  out->requested_bytes = to_c(all.requested_bytes);
  out->mapped_bytes = to_c(all.mapped_bytes);
  out->virtual_bytes = to_c(all.virtual_bytes);
  out->num_alloc_retries = counters.num_alloc_retries;
  out->num_ooms = counters.num_ooms;
  out->num_device_alloc = counters.num_device_alloc;
  out->num_device_free = counters.num_device_free;
  return 0;
}

size_t vramledger_stats_json(int device, char* buffer, size_t capacity) {
  try {
    VramledgerAllocator* instance = VramledgerAllocator::instance();
    std::string text;
    if (device < 0) {
      text = "[";
      if (instance != nullptr) {
        bool first = true;
        for (DeviceAllocators* state : instance->created_devices()) {
          if (!first) text += ',';
          first = false;
          text += vramledger::torch_plugin::stats_json(*state);
        }
      }
      text += "]";
    } else {
      DeviceAllocators* state =
          instance ? instance->device_if_created(static_cast<c10::DeviceIndex>(device)) : nullptr;
      text = state ? vramledger::torch_plugin::stats_json(*state)
                   : vramledger::torch_plugin::empty_stats_json(device);
    }
    return copy_out(text, buffer, capacity);
  } catch (const std::exception& error) {
    fail(error);
    return copy_out("", buffer, capacity);
  }
}

size_t vramledger_report(char* buffer, size_t capacity) {
  try {
    VramledgerAllocator* instance = VramledgerAllocator::instance();
    std::string text;
    if (instance == nullptr) {
      text = "vramledger: not in use in this process\n";
    } else {
      text = std::string("vramledger: ") +
             (vramledger::torch_plugin::installed() ? "installed as torch's CUDA allocator"
                                                    : "not installed (pluggable use only)") +
             ", config '" + instance->config_text() + "'\n";
      const auto devices = instance->created_devices();
      if (devices.empty()) text += "vramledger: no CUDA memory allocated yet\n";
      for (DeviceAllocators* state : devices) text += state->report();
    }
    return copy_out(text, buffer, capacity);
  } catch (const std::exception& error) {
    fail(error);
    return copy_out("", buffer, capacity);
  }
}

const char* vramledger_process_report(int device, const char* format) {
  try {
    const std::string_view kind = format ? format : "";
    if (kind != "" && kind != "text" && kind != "json") {
      last_error = "vramledger_process_report: format must be \"text\" or \"json\", not \"" +
                   std::string(kind) + "\"";
      return nullptr;
    }
    if (device < 0 || device >= VramledgerAllocator::kMaxDevices) {
      last_error = "vramledger_process_report: invalid device " + std::to_string(device);
      return nullptr;
    }
    VramledgerAllocator* instance = VramledgerAllocator::instance();
    DeviceAllocators* state =
        instance ? instance->device_if_created(static_cast<c10::DeviceIndex>(device)) : nullptr;
    const auto report = vramledger::torch_plugin::gather_process_report(device, state);
    process_report_result = kind == "json" ? vramledger::torch_plugin::process_report_json(report)
                                         : vramledger::torch_plugin::process_report_text(report);
    last_error.clear();
    return process_report_result.c_str();
  } catch (const std::exception& error) {
    fail(error);
    return nullptr;
  }
}

int vramledger_empty_cache(void) {
  try {
    if (VramledgerAllocator* instance = VramledgerAllocator::instance()) instance->emptyCache();
    return 0;
  } catch (const std::exception& error) {
    return fail(error);
  }
}

void vramledger_reset_peak_stats(int device) {
  if (VramledgerAllocator* instance = VramledgerAllocator::instance()) {
    if (device >= 0 && device < VramledgerAllocator::kMaxDevices) {
      instance->resetPeakStats(static_cast<c10::DeviceIndex>(device));
    }
  }
}

void vramledger_reset_accumulated_stats(int device) {
  if (VramledgerAllocator* instance = VramledgerAllocator::instance()) {
    if (device >= 0 && device < VramledgerAllocator::kMaxDevices) {
      instance->resetAccumulatedStats(static_cast<c10::DeviceIndex>(device));
    }
  }
}

int vramledger_tag_push(const char* name) {
  try {
    tag_scopes.push_back(std::make_unique<vramledger::TagScope>(std::string_view(name ? name : "")));
    return 0;
  } catch (const std::exception& error) {
    return fail(error);
  }
}

void vramledger_tag_pop(void) {
  if (!tag_scopes.empty()) tag_scopes.pop_back();
}

int vramledger_set_oom_note(int device, const char* note) {
  try {
    if (device < 0) throw std::invalid_argument("vramledger_set_oom_note: invalid device " + std::to_string(device));
    vramledger::torch_plugin::set_oom_note(device, note ? note : "");
    return 0;
  } catch (const std::exception& error) {
    return fail(error);
  }
}

// Sleep and wake by tag: torch_plugin/sleep_by_name.cpp, docs/sleep.md.
static void fill_sleep_result(vramledger_sleep_result* out, const vramledger::SleepResult& result) {
  if (out == nullptr) return;
  *out = {result.blocks,          result.bytes,        result.offloaded_bytes,
          result.released_bytes,  result.mapped_bytes, result.resident_bytes};
}

int vramledger_sleep(int device, const char* tags, const char* offload,
                     vramledger_sleep_result* out) {
  try {
    fill_sleep_result(out, vramledger::torch_plugin::sleep_by_name(device, tags, offload));
    return 0;
  } catch (const std::exception& error) {
    return fail(error);
  }
}

int vramledger_wake(int device, const char* tags, vramledger_sleep_result* out) {
  try {
    fill_sleep_result(out, vramledger::torch_plugin::wake_by_name(device, tags));
    return 0;
  } catch (const vramledger::OutOfMemoryError& error) {
    fail(error);
    return -2;  // nothing lost: the tags stay asleep, wake again later
  } catch (const std::exception& error) {
    return fail(error);
  }
}

int vramledger_prepare_offload(int device, const char* tags, uint64_t* kept_bytes) {
  try {
    const std::size_t bytes = vramledger::torch_plugin::prepare_offload_by_name(device, tags);
    if (kept_bytes != nullptr) *kept_bytes = bytes;
    return 0;
  } catch (const std::exception& error) {
    return fail(error);
  }
}

// Per private pool (CUDA graphs, MemPool): torch_plugin/graph_pools.hpp, docs/graphs.md.
size_t vramledger_graph_pools(int device, char* buffer, size_t capacity) {
  try {
    VramledgerAllocator* instance = VramledgerAllocator::instance();
    DeviceAllocators* state =
        instance != nullptr && device >= 0 && device < VramledgerAllocator::kMaxDevices
            ? instance->device_if_created(static_cast<c10::DeviceIndex>(device))
            : nullptr;
    return copy_out(state ? vramledger::torch_plugin::graph_pools_json(*state) : "[]", buffer,
                    capacity);
  } catch (const std::exception& error) {
    fail(error);
    return copy_out("", buffer, capacity);
  }
}

size_t vramledger_sleeping_tags(int device, char* buffer, size_t capacity) {
  return copy_out(vramledger::torch_plugin::sleeping_tag_names(device), buffer, capacity);
}

}  // extern "C"
