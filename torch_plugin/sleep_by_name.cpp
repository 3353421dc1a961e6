#include "torch_plugin/sleep_by_name.hpp"

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "accounting/tag_registry.hpp"
#include "allocator/text_format.hpp"
#include "torch_plugin/cuda_ipc.hpp"
#include "torch_plugin/device_allocators.hpp"
#include "torch_plugin/vramledger_allocator.hpp"

namespace {

using vramledger::AllocationInfo;
using vramledger::CachingAllocator;
using vramledger::DevicePtr;
using vramledger::Error;
using vramledger::ErrorCode;
using vramledger::TagId;
using vramledger::torch_plugin::DeviceAllocators;
using vramledger::torch_plugin::VramledgerAllocator;

// The name that stands for every CUDA graph pool of the device in sleep and wake (docs/sleep.md).
constexpr std::string_view kGraphs = vramledger::torch_plugin::kGraphPoolsName;

// Whether the comma-separated `names` include "graphs".
bool names_graphs(const char* names) {
  const std::string_view text = names == nullptr ? std::string_view() : std::string_view(names);
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view name = text.substr(start, end - start);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (name == kGraphs) return true;
    start = end + 1;
  }
  return false;
}

// Tag ids of `names`, "graphs" left out (graph pools are not a tag).
std::vector<TagId> tag_ids(const char* names, bool must_exist) {
  std::vector<TagId> ids;
  const std::string_view text = names == nullptr ? std::string_view() : std::string_view(names);
  std::size_t start = 0;
  while (start <= text.size()) {
    std::size_t end = text.find(',', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view name = text.substr(start, end - start);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    if (!name.empty() && name != kGraphs) {
      const std::optional<TagId> id = vramledger::TagRegistry::global().find(name);
      if (!id && must_exist) {
        throw vramledger::Error(vramledger::ErrorCode::kInvalidArgument,
                                "unknown tag '" + std::string(name) +
                                    "': no allocation scope was ever opened under that name "
                                    "(vramledger.tag); nothing was changed");
      }
      if (id) ids.push_back(*id);
    }
    start = end + 1;
  }
  return ids;
}

DeviceAllocators& device_for_sleep(int device, const char* what) {
  // Installed as torch's allocator, or serving the pluggable functions: the same instance.
  VramledgerAllocator* instance = VramledgerAllocator::instance();
  if (instance == nullptr) {
    throw vramledger::Error(vramledger::ErrorCode::kInvalidArgument,
                            std::string(what) + ": vramledger has allocated nothing in this "
                            "process (vramledger.install() before the first CUDA allocation)");
  }
  if (device < 0 || device >= VramledgerAllocator::kMaxDevices) {
    throw vramledger::Error(vramledger::ErrorCode::kInvalidArgument,
                            std::string(what) + ": invalid device " + std::to_string(device));
  }
  DeviceAllocators* state = instance->device_if_created(static_cast<c10::DeviceIndex>(device));
  if (state == nullptr) {
    throw vramledger::Error(vramledger::ErrorCode::kInvalidArgument,
                            std::string(what) + ": vramledger never allocated on device " +
                                std::to_string(device));
  }
  // Torch's own capture state: a graph capturing on any device, or on this thread's stream.
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (!state->is_simulated()) {
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device));
    if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) (void)cudaGetLastError();
  }
  if (vramledger::torch_plugin::any_capture_underway() || status != cudaStreamCaptureStatusNone) {
    throw vramledger::Error(vramledger::ErrorCode::kInvalidArgument,
                            std::string(what) + " refused: a CUDA graph capture is underway; "
                            "nothing was changed");
  }
  return *state;
}

// A tag with blocks exported by CUDA IPC must not sleep: the importers' mappings and the
// descriptors would keep the old pages alive outside the books, and the wake would give this
// process new pages the importers never see (docs/ipc.md). Refused before anything changes.
void refuse_exported_blocks(DeviceAllocators& state, const std::vector<TagId>& ids) {
  if (ids.empty()) return;
  const CachingAllocator& policy = state.default_pool().policy();
  std::size_t count = 0;
  DevicePtr first = 0;
  TagId tag = vramledger::kUntagged;
  for (const DevicePtr block : vramledger::torch_plugin::ipc_exported_blocks()) {
    if (!policy.owns(block)) continue;
    const AllocationInfo info = policy.describe(block);
    if (std::find(ids.begin(), ids.end(), info.tag) == ids.end()) continue;
    if (count++ == 0) {
      first = block;
      tag = info.tag;
    }
  }
  if (count == 0) return;
  throw Error(ErrorCode::kInvalidArgument,
              "cannot sleep tag '" + vramledger::tag_name(tag) + "': " + std::to_string(count) +
                  " of its blocks (the first at " + vramledger::format_hex(first) +
                  ") are shared with other processes by CUDA IPC; free them in every process "
                  "first (docs/ipc.md); nothing was changed");
}

}  // namespace

namespace vramledger::torch_plugin {

// Tags first (the default pool), then the graph pools; a refusal of the graphs (checked ahead
// where it can be) wakes the tags again, so nothing changes.
SleepResult sleep_by_name(int device, const char* tags, const char* offload) {
  DeviceAllocators& state = device_for_sleep(device, "sleep");
  const std::vector<TagId> sleep_ids = tag_ids(tags, /*must_exist=*/true);
  const std::vector<TagId> offload_ids = tag_ids(offload, /*must_exist=*/true);
  const bool graphs = names_graphs(tags);
  const bool offload_graphs = names_graphs(offload);
  refuse_exported_blocks(state, sleep_ids);
  if (offload_graphs && !graphs) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot sleep: \"graphs\" is to be offloaded but is not among the tags to sleep; "
                "nothing was changed");
  }
  if (!graphs) return state.default_pool().policy().sleep(sleep_ids, offload_ids);
  if (!state.graph_pools_can_sleep() || state.graphs_asleep()) {
    return state.sleep_graph_pools(offload_graphs);  // refuses, nothing changed
  }
  SleepResult result;
  if (!sleep_ids.empty()) result = state.default_pool().policy().sleep(sleep_ids, offload_ids);
  try {
    result += state.sleep_graph_pools(offload_graphs);
  } catch (const Error& error) {
    if (state.graphs_asleep() || sleep_ids.empty()) throw;  // asleep, nothing lost; or no tags
    try {
      state.default_pool().policy().wake(sleep_ids);
    } catch (const std::exception& again) {
      throw Error(error.code(), std::string(error.what()) + "; the tags slept before it could "
                                "not wake again (" + again.what() + "): wake() them later");
    }
    throw Error(error.code(), std::string(error.what()) + " (the tags woke again)");
  }
  return result;
}

SleepResult wake_by_name(int device, const char* tags) {
  DeviceAllocators& state = device_for_sleep(device, "wake");
  const std::vector<TagId> ids = tag_ids(tags, /*must_exist=*/true);
  const bool all = tags == nullptr || std::string_view(tags).find_first_not_of(" ,") ==
                                          std::string_view::npos;
  const bool graphs = all ? state.graphs_asleep() : names_graphs(tags);
  if (graphs && !state.graphs_asleep()) state.wake_graph_pools();  // refuses, nothing changed
  SleepResult result;
  if (all || !ids.empty()) result = state.default_pool().policy().wake(ids);
  if (graphs) result += state.wake_graph_pools();
  // Tensors torch freed while they slept go now (VramledgerAllocator::free_block).
  if (VramledgerAllocator* instance = VramledgerAllocator::instance()) {
    instance->process_deferred_frees();
  }
  return result;
}

std::size_t prepare_offload_by_name(int device, const char* tags) {
  DeviceAllocators& state = device_for_sleep(device, "prepare_offload");
  if (names_graphs(tags)) {
    throw Error(ErrorCode::kInvalidArgument,
                "prepare_offload: \"graphs\" (the CUDA graph pools) pins its host memory in "
                "sleep (a graph's live outputs are small); name tags only; nothing was pinned");
  }
  const std::vector<TagId> ids = tag_ids(tags, /*must_exist=*/true);
  return state.default_pool().policy().prepare_offload(ids);
}

std::string sleeping_tag_names(int device) {
  std::string text;
  VramledgerAllocator* instance = VramledgerAllocator::instance();
  if (instance == nullptr || device < 0 || device >= VramledgerAllocator::kMaxDevices) return text;
  if (DeviceAllocators* state = instance->device_if_created(static_cast<c10::DeviceIndex>(device))) {
    for (TagId tag : state->default_pool().policy().sleeping_tags()) {
      if (!text.empty()) text += ',';
      text += tag_name(tag);
    }
    if (state->graphs_asleep()) {
      if (!text.empty()) text += ',';
      text += kGraphs;
    }
  }
  return text;
}

}  // namespace vramledger::torch_plugin
