// torch's memory history (torch.cuda.memory._record_memory_history): a bounded list of c10
// TraceEntry records per device, stack contexts of live blocks, annotations, and the trace
// trackers torch attaches (c10d registers NCCL buffers through them).
//
// Entries are built from vramledger's own allocator events, so what torch's snapshot viewer shows
// is exactly what the ledger counted. Stack contexts are gathered by the caller before it enters
// the allocator (gathering can take the GIL, which must never happen under an allocator lock) and
// handed over through a thread-local slot.
//
// Thread safety: on_event is called under the device's EventGate lock; everything else takes the
// history's own lock. Lock order: allocator -> gate -> history.
#pragma once

#include <c10/cuda/CUDACachingAllocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "allocator/allocator_events.hpp"

namespace vramledger::torch_plugin {

namespace c10_alloc = c10::cuda::CUDACachingAllocator;

struct HistorySettings {
  bool enabled = false;
  c10_alloc::CreateContextFn context_recorder = nullptr;
  std::size_t max_entries = 1;
  c10_alloc::RecordContext when = c10_alloc::RecordContext::NEVER;
  std::vector<bool> skip;  // indexed by TraceEntry::Action
};

class TorchHistory {
 public:
  explicit TorchHistory(c10::DeviceIndex device) : device_(device) {}

  // Replaces the settings (torch's recordHistory); clear_history drops recorded entries.
  void configure(HistorySettings settings, bool clear_history);
  bool enabled() const;
  // Whether on_event records anything (history enabled or a trace tracker attached).
  bool active() const noexcept { return active_.load(std::memory_order_acquire); }
  void attach_tracker(c10_alloc::AllocatorTraceTracker tracker);

  // Called by the plugin before allocating or freeing: gathers the caller's stack when the
  // settings ask for it and parks it for the events that follow on this thread.
  void gather_context_for_alloc();
  void gather_context_for_free();

  // An allocator event of the pool `pool_id`, under the gate lock.
  void on_event(const AllocatorEvent& event, c10::MempoolId_t pool_id) noexcept;
  // Entries the allocator itself cannot emit: OOM (addr = device free bytes) and SNAPSHOT.
  void record_oom(std::size_t requested, std::size_t device_free, void* stream,
                  c10::MempoolId_t pool_id);
  void record_snapshot_marker();
  // torch 2.14's annotateMemory: an "annotate" entry (addr = the allocation's base, the payload
  // as its user metadata) for a live allocation; ignored where the release has no such entry.
  void record_memory_annotation(std::uintptr_t address, std::size_t size,
                                const std::string& metadata);
  void record_annotation(const std::vector<std::pair<std::string, std::string>>& metadata);

  std::vector<c10_alloc::TraceEntry> entries() const;
  std::vector<c10::CachingDeviceAllocator::AnnotationEntry> annotations() const;
  std::shared_ptr<c10::GatheredContext> context_of(std::uintptr_t address) const;

  void set_user_metadata(const std::string& metadata);
  std::string user_metadata() const;

 private:
  void append(c10_alloc::TraceEntry::Action action, std::size_t addr, std::size_t size,
              void* stream, c10::MempoolId_t pool_id,
              std::shared_ptr<c10::GatheredContext> context,
              const std::string* user_metadata = nullptr);

  const c10::DeviceIndex device_;
  mutable std::mutex mutex_;
  HistorySettings settings_;
  // enabled || trackers attached; read without the lock so the event path costs one load when
  // nobody records history.
  std::atomic<bool> active_{false};
  std::vector<c10_alloc::AllocatorTraceTracker> trackers_;
  std::deque<c10_alloc::TraceEntry> entries_;
  std::vector<c10::CachingDeviceAllocator::AnnotationEntry> annotations_;
  std::unordered_map<std::uintptr_t, std::shared_ptr<c10::GatheredContext>> live_contexts_;
  std::string user_metadata_;
};

// Compile-context stack of this thread (torch's pushCompileContext / popCompileContext).
void push_compile_context(const std::string& context);
void pop_compile_context();

}  // namespace vramledger::torch_plugin
