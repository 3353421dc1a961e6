// Sleep and wake by tag name for the C API and Python (docs/sleep.md): names to tag ids, the
// refusals only the plugin can see (vramledger not installed, a device never used, a CUDA graph
// capture torch is running), then the default pool's CachingAllocator::sleep / wake; the name
// "graphs" stands for every CUDA graph pool of the device (DeviceAllocators::sleep_graph_pools).
#pragma once

#include <string>

#include "allocator/caching_allocator.hpp"

namespace vramledger::torch_plugin {

// In sleep(tags=...), offload and wake: every CUDA graph private pool of the device.
inline constexpr const char* kGraphPoolsName = "graphs";

// tags, offload: comma-separated names; an unknown name throws Error(kInvalidArgument), as do
// the refusals above; the policy's errors (OutOfMemoryError on a wake included) pass through.
SleepResult sleep_by_name(int device, const char* tags, const char* offload);
SleepResult wake_by_name(int device, const char* tags);  // null or "": every sleeping tag
std::string sleeping_tag_names(int device);             // comma-separated
// CachingAllocator::prepare_offload of the default pool: host memory pinned now for the next
// sleep's offload of `tags`. Returns the bytes kept ready.
std::size_t prepare_offload_by_name(int device, const char* tags);

}  // namespace vramledger::torch_plugin
