#include "torch_plugin/torch_history.hpp"

#include <c10/util/ApproximateClock.h>

#include <utility>

#include "torch_plugin/torch_compat.hpp"

namespace vramledger::torch_plugin {

namespace {

using Action = c10_alloc::TraceEntry::Action;
using c10_alloc::RecordContext;

// Context gathered by the plugin for the next allocator events on this thread.
thread_local std::shared_ptr<c10::GatheredContext> pending_context;
thread_local std::vector<std::string> compile_contexts;

// torch's action for an allocator event; false when torch has none (physical pages and address
// ranges are below what torch's trace describes; OOM is recorded by the plugin, which knows the
// device's free memory).
bool action_of(EventKind kind, Action* action) {
  switch (kind) {
    case EventKind::kAlloc: *action = Action::ALLOC; return true;
    case EventKind::kFreeRequested: *action = Action::FREE_REQUESTED; return true;
    case EventKind::kFreeCompleted: *action = Action::FREE_COMPLETED; return true;
    case EventKind::kSegmentCreate: *action = Action::SEGMENT_ALLOC; return true;
    case EventKind::kSegmentRelease: *action = Action::SEGMENT_FREE; return true;
    case EventKind::kMap: *action = Action::SEGMENT_MAP; return true;
    case EventKind::kUnmap: *action = Action::SEGMENT_UNMAP; return true;
    // A sleeping graph pool's segment loses and regains its memory at the same address, as an
    // expandable segment unmaps and maps pages (docs/sleep.md).
    case EventKind::kSegmentSleep: *action = Action::SEGMENT_UNMAP; return true;
    case EventKind::kSegmentWake: *action = Action::SEGMENT_MAP; return true;
    default: return false;
  }
}

}  // namespace

void TorchHistory::configure(HistorySettings settings, bool clear_history) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (settings.max_entries == 0) settings.max_entries = 1;
  settings_ = std::move(settings);
  // Like torch: turning recording off drops what was recorded.
  if (clear_history || !settings_.enabled) {
    entries_.clear();
    annotations_.clear();
  }
  if (!settings_.enabled || settings_.when == RecordContext::NEVER) live_contexts_.clear();
  while (entries_.size() > settings_.max_entries) entries_.pop_front();
  active_.store(settings_.enabled || !trackers_.empty(), std::memory_order_release);
}

bool TorchHistory::enabled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return settings_.enabled;
}

void TorchHistory::attach_tracker(c10_alloc::AllocatorTraceTracker tracker) {
  std::lock_guard<std::mutex> lock(mutex_);
  trackers_.push_back(std::move(tracker));
  active_.store(true, std::memory_order_release);
}

void TorchHistory::gather_context_for_alloc() {
  if (!active_.load(std::memory_order_acquire)) return;
  c10_alloc::CreateContextFn recorder = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (settings_.enabled && settings_.when != RecordContext::NEVER) {
      recorder = settings_.context_recorder;
    }
  }
  pending_context = recorder ? recorder() : nullptr;
}

void TorchHistory::gather_context_for_free() {
  if (!active_.load(std::memory_order_acquire)) return;
  c10_alloc::CreateContextFn recorder = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (settings_.enabled && settings_.when == RecordContext::ALL) {
      recorder = settings_.context_recorder;
    }
  }
  pending_context = recorder ? recorder() : nullptr;
}

void TorchHistory::on_event(const AllocatorEvent& event, c10::MempoolId_t pool_id) noexcept {
  if (!active_.load(std::memory_order_acquire)) return;
  if (event.kind == EventKind::kFree) {
    // torch's trace has no combined entry: a free that completes at once is both.
    AllocatorEvent part = event;
    part.kind = EventKind::kFreeRequested;
    on_event(part, pool_id);
    part.kind = EventKind::kFreeCompleted;
    on_event(part, pool_id);
    return;
  }
  Action action{};
  if (!action_of(event.kind, &action)) return;
  try {
    std::shared_ptr<c10::GatheredContext> context;
    if (event.kind == EventKind::kAlloc || event.kind == EventKind::kFreeRequested) {
      context = pending_context;  // gathered by this thread's caller; may be null
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (settings_.enabled && settings_.when != RecordContext::NEVER) {
      if (event.kind == EventKind::kAlloc && context) {
        live_contexts_[event.address] = context;
      } else if (event.kind == EventKind::kFreeCompleted) {
        live_contexts_.erase(event.address);
      }
    }
    // STATE keeps stacks for live blocks only; the trace gets them from ALLOC upwards.
    if (settings_.when == RecordContext::STATE || settings_.when == RecordContext::NEVER) {
      context = nullptr;
    }
    // Like torch, block entries carry the size the program asked for.
    const bool block_entry = event.kind == EventKind::kAlloc ||
                             event.kind == EventKind::kFreeRequested ||
                             event.kind == EventKind::kFreeCompleted;
    append(action, event.address, block_entry ? event.requested : event.size,
           reinterpret_cast<void*>(event.stream), pool_id, std::move(context));
  } catch (...) {
    // History is best effort: losing an entry must never fail an allocation.
  }
}

void TorchHistory::append(Action action, std::size_t addr, std::size_t size, void* stream,
                          c10::MempoolId_t pool_id,
                          std::shared_ptr<c10::GatheredContext> context,
                          const std::string* user_metadata) {
  // torch's value outside any torch.compile region.
  const std::string compile_context =
      compile_contexts.empty() ? std::string("N/A") : compile_contexts.back();
  c10_alloc::TraceEntry entry(action, device_, addr, size, stream, pool_id,
                              c10::getApproximateTime(), std::move(context), compile_context,
                              user_metadata != nullptr ? *user_metadata : user_metadata_);
  for (const auto& tracker : trackers_) tracker(entry);
  if (!settings_.enabled) return;
  const auto index = static_cast<std::size_t>(action);
  if (index < settings_.skip.size() && settings_.skip[index]) return;
  if (entries_.size() >= settings_.max_entries) entries_.pop_front();
  entries_.push_back(std::move(entry));
}

void TorchHistory::record_oom(std::size_t requested, std::size_t device_free, void* stream,
                              c10::MempoolId_t pool_id) {
  if (!active_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  // torch's convention: for OOM the address field carries the device's free bytes.
  append(Action::OOM, device_free, requested, stream, pool_id, nullptr);
}

void TorchHistory::record_snapshot_marker() {
  if (!active_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  append(Action::SNAPSHOT, 0, 0, nullptr, {0, 0}, nullptr);
}

void TorchHistory::record_memory_annotation(std::uintptr_t address, std::size_t size,
                                            const std::string& metadata) {
  Action action{};
  if (!compat::annotate_trace_action(&action)) return;
  if (!active_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  append(action, address, size, nullptr, {0, 0}, nullptr, &metadata);
}

void TorchHistory::record_annotation(
    const std::vector<std::pair<std::string, std::string>>& metadata) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!settings_.enabled) return;
  c10::CachingDeviceAllocator::AnnotationEntry entry(device_, c10::getApproximateTime());
  for (const auto& [name, value] : metadata) entry.recordUserMetadata(name, value);
  annotations_.push_back(std::move(entry));
}

std::vector<c10_alloc::TraceEntry> TorchHistory::entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {entries_.begin(), entries_.end()};
}

std::vector<c10::CachingDeviceAllocator::AnnotationEntry> TorchHistory::annotations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return annotations_;
}

std::shared_ptr<c10::GatheredContext> TorchHistory::context_of(std::uintptr_t address) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_contexts_.find(address);
  return it == live_contexts_.end() ? nullptr : it->second;
}

void TorchHistory::set_user_metadata(const std::string& metadata) {
  std::lock_guard<std::mutex> lock(mutex_);
  user_metadata_ = metadata;
}

std::string TorchHistory::user_metadata() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return user_metadata_;
}

void push_compile_context(const std::string& context) { compile_contexts.push_back(context); }

void pop_compile_context() {
  if (!compile_contexts.empty()) compile_contexts.pop_back();
}

}  // namespace vramledger::torch_plugin
