#include "torch_plugin/pointer_registry.hpp"

namespace vramledger::torch_plugin {

PointerRegistry::Shard& PointerRegistry::shard_of(void* ptr) const {
  // Blocks are at least 512-byte aligned: drop the always-zero low bits, then mix so that
  // neighbouring blocks land in different shards.
  auto key = reinterpret_cast<std::uintptr_t>(ptr) >> 9;
  key ^= key >> 17;
  key *= 0x9E3779B97F4A7C15ull;
  return shards_[(key >> 58) % kShards];
}

void PointerRegistry::insert(void* ptr, const LiveAllocation& allocation) {
  Shard& shard = shard_of(ptr);
  std::lock_guard lock(shard.mutex);
  shard.entries[ptr] = allocation;
}

std::optional<LiveAllocation> PointerRegistry::take(void* ptr) {
  Shard& shard = shard_of(ptr);
  std::lock_guard lock(shard.mutex);
  auto it = shard.entries.find(ptr);
  if (it == shard.entries.end()) return std::nullopt;
  LiveAllocation allocation = it->second;
  shard.entries.erase(it);
  return allocation;
}

std::optional<LiveAllocation> PointerRegistry::find(void* ptr) const {
  Shard& shard = shard_of(ptr);
  std::lock_guard lock(shard.mutex);
  auto it = shard.entries.find(ptr);
  if (it == shard.entries.end()) return std::nullopt;
  return it->second;
}

bool PointerRegistry::mark_used_on_other_streams(void* ptr) {
  Shard& shard = shard_of(ptr);
  std::lock_guard lock(shard.mutex);
  auto it = shard.entries.find(ptr);
  if (it == shard.entries.end()) return false;
  it->second.used_on_other_streams = true;
  return true;
}

}  // namespace vramledger::torch_plugin
