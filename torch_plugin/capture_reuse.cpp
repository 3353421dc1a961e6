#include "torch_plugin/capture_reuse.hpp"

#include <c10/cuda/CUDAAllocatorConfig.h>

#include <algorithm>
#include <unordered_set>

namespace vramledger::torch_plugin {

namespace {

// The nodes `stream`'s next captured work will depend on; false when it is not capturing.
bool capture_position(cudaStream_t stream, std::vector<cudaGraphNode_t>* out) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* nodes = nullptr;
  std::size_t count = 0;
  if (cudaStreamGetCaptureInfo(stream, &status, nullptr, nullptr, &nodes, nullptr, &count) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (status != cudaStreamCaptureStatusActive) return false;
  out->clear();
  for (std::size_t i = 0; i < count; ++i) out->push_back(nodes[i]);
  return true;
}

// `from` and every node it depends on, directly or not.
bool ancestors(const std::vector<cudaGraphNode_t>& from,
               std::unordered_set<cudaGraphNode_t>* seen) {
  std::vector<cudaGraphNode_t> todo;
  for (cudaGraphNode_t node : from) todo.push_back(node);
  std::vector<cudaGraphNode_t> parents;
  while (!todo.empty()) {
    cudaGraphNode_t node = todo.back();
    todo.pop_back();
    if (!seen->insert(node).second) continue;
    std::size_t count = 0;
    if (cudaGraphNodeGetDependencies(node, nullptr, nullptr, &count) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    parents.resize(count);
    if (count != 0 &&
        cudaGraphNodeGetDependencies(node, parents.data(), nullptr, &count) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    for (std::size_t i = 0; i < count && i < parents.size(); ++i) todo.push_back(parents[i]);
  }
  return true;
}

}  // namespace

bool CaptureReuse::enabled() {
  return c10::cuda::CUDACachingAllocator::CUDAAllocatorConfig::graph_capture_record_stream_reuse();
}

bool CaptureReuse::add(void* ptr, cudaStream_t owner, const std::vector<cudaStream_t>& streams) {
  Pending pending;
  pending.ptr = ptr;
  pending.owner = owner;
  std::vector<cudaGraphNode_t> position;
  for (cudaStream_t stream : streams) {
    if (!capture_position(stream, &position)) return false;
    for (cudaGraphNode_t node : position) pending.markers.push_back(node);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back(std::move(pending));
  recount_locked();
  return true;
}

std::vector<void*> CaptureReuse::take_ordered_before(cudaStream_t stream) {
  std::vector<void*> ready;
  std::lock_guard<std::mutex> lock(mutex_);
  if (std::none_of(pending_.begin(), pending_.end(),
                   [&](const Pending& pending) { return pending.owner == stream; })) {
    return ready;
  }
  std::vector<cudaGraphNode_t> position;
  if (!capture_position(stream, &position)) return ready;
  std::unordered_set<cudaGraphNode_t> before;
  if (!ancestors(position, &before)) return ready;
  auto ordered = [&](const Pending& pending) {
    return std::all_of(pending.markers.begin(), pending.markers.end(),
                       [&](cudaGraphNode_t node) { return before.count(node) != 0; });
  };
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->owner == stream && ordered(*it)) {
      ready.push_back(it->ptr);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
  recount_locked();
  return ready;
}

std::vector<void*> CaptureReuse::take_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<void*> all;
  for (const Pending& pending : pending_) all.push_back(pending.ptr);
  pending_.clear();
  recount_locked();
  return all;
}

}  // namespace vramledger::torch_plugin
