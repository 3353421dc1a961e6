#include "accounting/classification/memory_profiler.hpp"

#include <stdexcept>

#include "accounting/tag_registry.hpp"

namespace vramledger {
namespace {

const char* phase_name(int phase) {
  static const char* const kNames[] = {"idle", "begun", "loaded", "profiling", "done"};
  return kNames[phase];
}

void warn_about(const char* when, const ProfileSnapshot& snapshot,
                std::vector<std::string>& warnings) {
  if (!snapshot.classification) return;
  const ProcessClassification& c = *snapshot.classification;
  if (c.missing_hook) warnings.push_back(std::string(when) + ": " + c.missing_hook->message);
  for (const std::string& problem : c.problems) {
    warnings.push_back(std::string(when) + ": " + problem);
  }
}

}  // namespace

MemoryProfiler::MemoryProfiler(std::vector<Ledger*> ledgers, ProfilerSources sources)
    : ledgers_(std::move(ledgers)), sources_(sources) {
  if (ledgers_.empty()) throw std::invalid_argument("MemoryProfiler: no ledger");
  for (const Ledger* ledger : ledgers_) {
    if (ledger == nullptr) throw std::invalid_argument("MemoryProfiler: null ledger");
  }
}

void MemoryProfiler::expect(Phase phase, const char* call) const {
  if (phase_ != phase) {
    throw std::logic_error(std::string("MemoryProfiler::") + call + " called in phase '" +
                           phase_name(static_cast<int>(phase_)) + "', needs '" +
                           phase_name(static_cast<int>(phase)) + "'");
  }
}

NonTorchBasis MemoryProfiler::non_torch_basis() const noexcept {
  if (sources_.process != nullptr) return NonTorchBasis::kProcessUsage;  // refined per sample
  if (sources_.non_torch != nullptr) return NonTorchBasis::kTrackerOnly;
  return NonTorchBasis::kNone;
}

ProfileSnapshot MemoryProfiler::snapshot() const {
  ProfileSnapshot out;
  std::vector<DeviceLedgerView> views;
  views.reserve(ledgers_.size());
  for (const Ledger* ledger : ledgers_) {
    const PoolCounters all = ledger->counters().aggregate();
    out.allocated += all.allocated_bytes.current;
    out.peak_allocated += all.allocated_bytes.peak;
    out.reserved += all.reserved_bytes.current;
    out.weights_tag += ledger->tag_usage(kWeightsTag).allocated_bytes.current;
    views.push_back({"ledger#" + std::to_string(views.size()), all, ledger->inconsistent()});
  }
  const NonTorchTracked tracked =
      sources_.non_torch != nullptr ? sources_.non_torch->sample() : NonTorchTracked::untracked();
  out.tracked_non_torch = tracked.hooked ? tracked.total() : 0;
  if (sources_.process != nullptr) {
    out.classification = classify_process(views, tracked, sources_.process->sample());
    // process usage - torch reserved: the tracked libraries plus the remainder.
    out.non_torch = out.classification->non_torch_bytes();
  } else {
    out.non_torch = out.tracked_non_torch;
  }
  return out;
}

void MemoryProfiler::begin() {
  expect(Phase::kIdle, "begin");
  at_begin_ = snapshot();
  phase_ = Phase::kBegun;
}

void MemoryProfiler::end_load() {
  expect(Phase::kBegun, "end_load");
  at_load_end_ = snapshot();
  phase_ = Phase::kLoaded;
}

void MemoryProfiler::begin_profile() {
  expect(Phase::kLoaded, "begin_profile");
  for (Ledger* ledger : ledgers_) ledger->reset_peaks();
  at_profile_begin_ = snapshot();
  phase_ = Phase::kProfiling;
}

void MemoryProfiler::end_profile() {
  expect(Phase::kProfiling, "end_profile");
  at_profile_end_ = snapshot();
  phase_ = Phase::kDone;
}

ProfileResult MemoryProfiler::result(const KvBudget& budget) const {
  expect(Phase::kDone, "result");
  ProfileResult r;
  const ProfileSnapshot& begin = at_begin_;
  const ProfileSnapshot& end = at_profile_end_;

  r.non_torch_basis = non_torch_basis();
  if (end.classification) {
    r.device_total_bytes = end.classification->device_total;
    const bool fallback = [&] {
      for (const ProfileSnapshot* s : {&begin, &end}) {
        if (s->classification->basis == ProcessUsageBasis::kDeviceUsedFallback) return true;
      }
      return false;
    }();
    if (fallback) {
      r.non_torch_basis = NonTorchBasis::kDeviceUsedFallback;
      r.warnings.push_back("non-torch figures use device used memory (" +
                           end.classification->caveat +
                           "): another process allocating during the profile moves them");
    }
  } else if (r.non_torch_basis == NonTorchBasis::kTrackerOnly) {
    r.warnings.push_back("no process memory source: non-torch memory is only what the tracker "
                         "saw; the CUDA context and untracked allocations are not counted");
  } else {
    r.warnings.push_back("no process memory source and no non-torch tracker: non-torch memory "
                         "and the CUDA context are not counted");
  }

  r.utilization = budget.utilization;
  r.budget_bytes = budget.resolve(r.device_total_bytes);
  if (budget.utilization && !budget.bytes && r.device_total_bytes == 0) {
    r.warnings.push_back("utilization budget without device total (no process source): budget 0");
  }

  r.baseline_bytes = begin.non_torch + begin.allocated;
  r.weights_bytes = at_load_end_.allocated - begin.allocated;
  r.other_torch_bytes = at_profile_begin_.allocated - at_load_end_.allocated;
  r.non_torch_increase_bytes = end.non_torch - begin.non_torch;
  r.peak_activation_bytes = end.peak_allocated - at_profile_begin_.allocated;
  r.kv_cache_budget_bytes = r.budget_bytes - r.baseline_bytes - r.weights_bytes -
                            r.other_torch_bytes - r.non_torch_increase_bytes -
                            r.peak_activation_bytes;
  r.weights_tag_bytes = end.weights_tag;
  r.non_torch_tracked_increase_bytes = end.tracked_non_torch - begin.tracked_non_torch;

  if (ledgers_.size() > 1) {
    r.warnings.push_back("several allocators: peak activation is the sum of their peaks, an "
                         "upper bound of the true joint peak");
  }
  warn_about("at begin", begin, r.warnings);
  warn_about("at end of load", at_load_end_, r.warnings);
  warn_about("at start of profile", at_profile_begin_, r.warnings);
  warn_about("at end of profile", end, r.warnings);
  if (r.kv_cache_budget_bytes < 0) {
    r.warnings.push_back("the budget is exceeded by " + std::to_string(-r.kv_cache_budget_bytes) +
                         " bytes before any KV cache: no room for it");
  }
  return r;
}

}  // namespace vramledger
