// The foundation issue's randomized test: a long random mix of every operation the policy offers,
// with injected driver faults, checked after every single step against an independent reference
// model, the ledger/census consistency check and the simulated device's own view of memory.
//
// Replay a failure with VRAMLEDGER_STRESS_SEED=<seed printed in the failure>; change its length
// with VRAMLEDGER_STRESS_OPS (default 1,000,000; the sanitizer builds of scripts/run_tests.sh run
// fewer).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "accounting/tag_registry.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "allocator/text_format.hpp"
#include "tests/stress/concat.hpp"
#include "tests/stress/reference_model.hpp"
#include "tests/stress/stress_env.hpp"

namespace vramledger::stress {
namespace {

constexpr std::size_t kKiB = std::size_t{1} << 10;
constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

// Sizes are log-uniform in [512 B, 1 GiB]: the mean is ~51 MiB, so ~200 live blocks hold ~10 GiB
// on a 12 GiB device — close enough to full that out-of-memory, retries and cap refusals happen.
constexpr std::size_t kMinRequest = 512;
constexpr std::size_t kMaxRequest = kGiB;
constexpr std::size_t kDeviceCapacity = 12 * kGiB;
constexpr std::size_t kMaxLive = 200;
constexpr std::size_t kStreamCount = 4;          // stream 0 and three created ones
constexpr std::uint64_t kFullWalkEvery = 1024;    // segment walk against the model
constexpr std::uint64_t kDrainCheckpoints = 4;    // full drains inside the run (plus the final)
constexpr std::size_t kRecentOps = 24;            // shown when a check fails

enum class Op : std::uint8_t {
  kAllocate,
  kFree,
  kRecordStream,
  kPauseStream,
  kResumeStream,
  kEmptyCache,
  kProcessCompletedFrees,
  kSynchronizeDevice,
  kChangeTag,
  kInjectFault,
  kClearFaults,
  kSetCap,
  kCount
};

const char* op_name(Op op) {
  static constexpr std::array<const char*, static_cast<std::size_t>(Op::kCount)> names = {
      "allocate", "free", "record_stream", "pause_stream", "resume_stream", "empty_cache",
      "process_completed_frees", "synchronize_device", "change_tag", "inject_fault",
      "clear_faults", "set_cap"};
  return names[static_cast<std::size_t>(op)];
}

// Relative weights; allocate and free dominate as in real programs.
constexpr std::array<unsigned, static_cast<std::size_t>(Op::kCount)> kWeights = {
    340, 300, 80, 30, 35, 8, 20, 8, 30, 25, 9, 15};

// Driver calls whose failure the policy must survive with nothing lost.
constexpr std::array<SimOp, 13> kFaultableOps = {
    SimOp::kAllocateSegment, SimOp::kFreeSegment,    SimOp::kCreatePhysical,
    SimOp::kReleasePhysical, SimOp::kReserveAddress, SimOp::kFreeAddress,
    SimOp::kMapPages,        SimOp::kUnmapPages,     SimOp::kCreateEvent,
    SimOp::kRecordEvent,     SimOp::kQueryEvent,     SimOp::kSynchronizeEvent,
    SimOp::kSynchronizeDevice};

// What one step did, kept in a ring for the failure message.
struct StepRecord {
  std::uint64_t step = 0;
  Op op = Op::kAllocate;
  DevicePtr address = 0;
  std::uint64_t value = 0;  // bytes, stream, cap, ... depending on op
  std::string outcome;
};

// kPaged: the paged heap without AllocatorOptions::alias_pending_pages, on a device that refuses
// a second mapping of memory; kPagedAliasing: with it (the default: pending pages are mapped at a
// new address too, for another stream after a GPU-side wait).
enum class Heap { kSegment, kPaged, kPagedAliasing };

const char* heap_name(Heap heap) {
  switch (heap) {
    case Heap::kSegment: return "segment";
    case Heap::kPaged: return "paged";
    case Heap::kPagedAliasing: return "paged_aliasing";
  }
  return "?";
}

class RandomizedStress : public testing::TestWithParam<Heap> {
 protected:
  RandomizedStress()
      : seed_(env_u64("VRAMLEDGER_STRESS_SEED", 0x5eed'2026)),
        ops_(env_u64("VRAMLEDGER_STRESS_OPS", 1'000'000)),
        rng_(seed_ ^ (GetParam() == Heap::kPaged            ? 0x9a9e0ull
                      : GetParam() == Heap::kPagedAliasing ? 0xa1a5ull
                                                            : 0x5e9ull)),
        device_(device_options()) {
    AllocatorOptions options;
    options.alias_pending_pages = GetParam() == Heap::kPagedAliasing;
    allocator_ = std::make_unique<CachingAllocator>(device_, &ledger_, options);
    streams_.push_back(0);
    while (streams_.size() < kStreamCount) streams_.push_back(device_.create_stream());
    paused_.assign(kStreamCount, false);
    for (const char* name : {"stress.weights", "stress.activations", "stress.gradients",
                             "stress.workspace"}) {
      tags_.push_back(register_tag(name));
    }
  }

  SimulatedDeviceOptions device_options() const {
    SimulatedDeviceOptions options;
    options.capacity_bytes = kDeviceCapacity;
    options.supports_virtual_memory = GetParam() != Heap::kSegment;
    options.allow_aliased_mappings = GetParam() == Heap::kPagedAliasing;
    return options;
  }

  // ------------------------------------------------------------------ random choices

  std::size_t uniform(std::size_t n) { return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_); }

  std::size_t log_uniform_size() {
    std::uniform_real_distribution<double> exponent(std::log2(double(kMinRequest)),
                                                    std::log2(double(kMaxRequest)));
    const auto bytes = static_cast<std::size_t>(std::exp2(exponent(rng_)));
    return std::clamp(bytes, kMinRequest, kMaxRequest);
  }

  Op pick_op() {
    // Keep the live set moderate so per-step checks stay cheap: past the limit, only free.
    if (model_.size() >= kMaxLive) return Op::kFree;
    return static_cast<Op>(op_distribution_(rng_));
  }

  // ------------------------------------------------------------------ operations

  // Runs `action`; an Error is an acceptable outcome for operations that reach the driver (the
  // check after the step proves nothing was lost). Returns the outcome text.
  template <typename Action>
  std::string attempt(Action&& action) {
    try {
      action();
      return "ok";
    } catch (const Error& error) {
      ++errors_seen_;
      return concat("error: ", error.what());
    }
  }

  // Returns a problem found by the step's own checks (the common checks run afterwards).
  std::optional<std::string> do_step(StepRecord& record) {
    switch (record.op) {
      case Op::kAllocate: {
        const std::size_t bytes = log_uniform_size();
        const StreamHandle stream = streams_[uniform(streams_.size())];
        const TagId tag = current_tag();
        record.value = bytes;
        DevicePtr ptr = 0;
        try {
          ptr = allocator_->allocate(bytes, stream, tag);
        } catch (const OutOfMemoryError&) {
          ++ooms_;
          record.outcome = "out of memory";
          return std::nullopt;
        } catch (const Error& error) {
          // Only injected driver faults may fail an allocation for another reason.
          ++errors_seen_;
          record.outcome = concat("error: ", error.what());
          if (error.code() != ErrorCode::kDriverError) return concat("allocate failed: ", record.outcome);
          return std::nullopt;
        }
        record.address = ptr;
        record.outcome = "ok";
        ++allocations_;
        const AllocationInfo info = allocator_->describe(ptr);
        if (info.base != ptr || info.requested != bytes || info.stream != stream ||
            info.tag != tag || info.size < bytes) {
          return concat("describe() of the new block disagrees: base ", format_hex(info.base), " size ",
                        info.size, " requested ", info.requested, " stream ", format_hex(info.stream),
                        " tag ", info.tag);
        }
        const LiveBlock block{bytes, info.size, stream, tag};
        if (auto overlap = model_.insert(ptr, block)) return overlap;
        // The memory behind the new block, at whatever address, is not still used by queued
        // work that the new block's stream is not ordered after.
        if (auto hazard = device_.find_hazard(stream, ptr, info.size)) {
          return concat("use-before-ready hazard: ", *hazard);
        }
        return check_accessible(ptr, block);
      }
      case Op::kFree: {
        if (model_.empty()) return std::nullopt;
        const DevicePtr ptr = model_.nth(uniform(model_.size()));
        const LiveBlock freed = model_.blocks().at(ptr);
        record.address = ptr;
        record.outcome = attempt([&] { allocator_->deallocate(ptr); });
        // Strong guarantee: a failed free (an injected record_event fault) leaves it allocated.
        const bool still_owned = allocator_->owns(ptr);
        if (record.outcome == "ok") {
          if (still_owned) return concat("freed block ", format_hex(ptr), " is still owned");
          model_.erase(ptr);
          note_work_still_using(ptr, freed);
        } else if (!still_owned) {
          return concat("free of ", format_hex(ptr), " failed but the block is gone: ", record.outcome);
        }
        return std::nullopt;
      }
      case Op::kRecordStream: {
        if (model_.empty()) return std::nullopt;
        const DevicePtr ptr = model_.nth(uniform(model_.size()));
        const StreamHandle stream = streams_[uniform(streams_.size())];
        record.address = ptr;
        record.value = stream;
        record.outcome = attempt([&] { allocator_->record_stream(ptr, stream); });
        if (record.outcome != "ok") return concat("record_stream failed: ", record.outcome);
        // The user's kernel on that stream, using the block (pending while the stream is paused).
        const EventHandle token = device_.enqueue_user_work(stream);
        if (token != 0) {
          device_.note_user_work_uses(token, ptr, model_.blocks().at(ptr).size);
          user_work_.push_back(token);
        }
        return std::nullopt;
      }
      case Op::kPauseStream:
      case Op::kResumeStream: {
        const std::size_t index = uniform(streams_.size());
        const bool pause = record.op == Op::kPauseStream;
        record.value = streams_[index];
        const Status status = pause ? device_.pause_stream(streams_[index])
                                    : device_.resume_stream(streams_[index]);
        record.outcome = status ? "ok" : status.message();
        paused_[index] = pause;
        return std::nullopt;
      }
      case Op::kEmptyCache:
        record.outcome = attempt([&] { allocator_->empty_cache(); });
        return std::nullopt;
      case Op::kProcessCompletedFrees:
        record.outcome = attempt([&] { allocator_->process_completed_frees(); });
        return std::nullopt;
      case Op::kSynchronizeDevice: {
        const Status status = device_.synchronize_device();
        record.outcome = status ? "ok" : status.message();
        return std::nullopt;
      }
      case Op::kChangeTag: {
        const std::size_t choice = uniform(tags_.size() + 1);
        tag_scope_.reset();
        if (choice < tags_.size()) tag_scope_.emplace(tags_[choice]);
        record.value = current_tag();
        record.outcome = "ok";
        return std::nullopt;
      }
      case Op::kInjectFault: {
        const SimOp op = kFaultableOps[uniform(kFaultableOps.size())];
        const ErrorCode code = uniform(3) == 0 ? ErrorCode::kOutOfMemory : ErrorCode::kDriverError;
        const std::uint64_t nth = 1 + uniform(4);
        device_.inject_failure_at(op, nth, code);
        record.value = static_cast<std::uint64_t>(op);
        record.outcome = concat(to_string(op), " call +", nth, " fails with ", to_string(code));
        ++faults_injected_;
        return std::nullopt;
      }
      case Op::kClearFaults:
        device_.clear_faults();
        record.outcome = "ok";
        return std::nullopt;
      case Op::kSetCap: {
        // Mostly no cap; sometimes a cap around (and below) what is reserved now.
        const std::size_t reserved = reserved_bytes();
        std::size_t cap = 0;
        switch (uniform(4)) {
          case 0: cap = reserved + uniform(4) * kGiB; break;
          case 1: cap = std::max<std::size_t>(reserved / 2, 64 * kMiB); break;
          default: cap = 0; break;
        }
        allocator_->set_cap(cap);
        record.value = cap;
        record.outcome = "ok";
        return std::nullopt;
      }
      case Op::kCount: break;
    }
    return "unknown op";
  }

  // ------------------------------------------------------------------ checks

  std::size_t reserved_bytes() const {
    return static_cast<std::size_t>(
        ledger_.counters().pools[stat_pool_index(StatPool::kAggregate)].reserved_bytes.current);
  }

  // Driver calls that can take memory away from an address.
  std::uint64_t removal_call_count() const {
    return device_.call_count(SimOp::kUnmapPages) + device_.call_count(SimOp::kFreeSegment) +
           device_.call_count(SimOp::kFreeAddress);
  }

  // Paged heap: a block freed while its stream is paused may still be read by the user's work
  // queued there (a token stands for it); its pages must stay mapped until that work is done,
  // however the allocator splits, merges or reuses the freed bytes. (The segment heap returns
  // segments with cudaFree, which waits for the device itself.)
  // Every heap: that work's memory must not serve new work that could run before it
  // (find_hazard, checked at each allocation).
  void note_work_still_using(DevicePtr address, const LiveBlock& block) {
    const EventHandle token = device_.enqueue_user_work(block.stream);
    if (token == 0) return;
    device_.note_user_work_uses(token, address, block.size);
    if (GetParam() == Heap::kSegment) {
      user_work_.push_back(token);
      return;
    }
    if (device_.user_work_done(token)) return;
    in_flight_.push_back({address, block.size, token});
  }
  std::optional<std::string> check_in_flight() {
    for (std::size_t i = 0; i < in_flight_.size();) {
      const InFlight& work = in_flight_[i];
      if (device_.user_work_done(work.token)) {
        in_flight_[i] = in_flight_.back();
        in_flight_.pop_back();
        continue;
      }
      if (!device_.is_range_accessible(work.address, work.size)) {
        return concat("freed block ", format_hex(work.address), " (", work.size,
                      " B) lost its pages while work queued before its free may still use them");
      }
      ++i;
    }
    return std::nullopt;
  }

  std::optional<std::string> check_accessible(DevicePtr address, const LiveBlock& block) const {
    if (device_.is_range_accessible(address, block.size)) return std::nullopt;
    return concat("live block [", format_hex(address), ", +", block.size,
                  ") is not accessible on the device");
  }

  // The checks run after every step. O(blocks): the census walk, one lookup per live block.
  std::optional<std::string> check_step(std::uint64_t step) {
    BlockCensus census;
    try {
      census = allocator_->census();
    } catch (const Error& error) {
      return concat("census() found a broken invariant: ", error.what());
    }
    const ConsistencyReport report = check_consistency(ledger_, census);
    if (!report.ok()) return concat("ledger and census disagree:\n", report.to_string());

    std::int64_t allocation = 0, allocated_bytes = 0, reserved = 0;
    for (const auto& pool : census.pools) {
      allocation += pool.allocation;
      allocated_bytes += pool.allocated_bytes;
      reserved += pool.reserved_bytes;
    }
    if (allocation != static_cast<std::int64_t>(model_.size()) ||
        allocated_bytes != static_cast<std::int64_t>(model_.allocated_bytes())) {
      return concat("census counts ", allocation, " blocks / ", allocated_bytes,
                    " bytes allocated, the model ", model_.size(), " / ",
                    model_.allocated_bytes());
    }
    // No byte lost or invented: the device holds exactly what the allocator says it reserved.
    if (device_.physical_bytes_in_use() != static_cast<std::size_t>(reserved)) {
      return concat("device holds ", device_.physical_bytes_in_use(),
                    " physical bytes, the allocator reserved ", reserved);
    }
    // Every live block is accessible. Memory only disappears through the driver calls that
    // take it away, so the whole live set is rescanned only after a step that made one; after
    // other steps only the new block can have changed (checked in do_step).
    const std::uint64_t removals = removal_call_count();
    if (removals != removals_at_last_scan_) {
      removals_at_last_scan_ = removals;
      ++full_access_scans_;
      if (auto problem = check_in_flight()) return problem;
      for (const auto& [address, block] : model_.blocks()) {
        if (auto problem = check_accessible(address, block)) return problem;
      }
    }
    if (step % kFullWalkEvery == 0) {
      forget_finished_user_work();
      if (auto problem = model_.compare_with(allocator_->segments())) return problem;
    }
    return std::nullopt;
  }

  // Frees everything, lets every stream finish, empties the cache and checks that nothing stays
  // reserved. Faults and the cap are cleared first: this is the "no byte lost" proof.
  std::optional<std::string> drain() {
    device_.clear_faults();
    allocator_->set_cap(0);
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      if (paused_[i]) (void)device_.resume_stream(streams_[i]);
      paused_[i] = false;
    }
    while (!model_.empty()) {
      const DevicePtr ptr = model_.blocks().begin()->first;
      try {
        allocator_->deallocate(ptr);
      } catch (const Error& error) {
        return concat("drain: free of ", format_hex(ptr), " failed: ", error.what());
      }
      model_.erase(ptr);
    }
    try {
      allocator_->empty_cache();
    } catch (const Error& error) {
      return concat("drain: empty_cache failed: ", error.what());
    }
    if (auto problem = check_step(0)) return concat("drain: ", *problem);
    forget_finished_user_work();
    if (reserved_bytes() != 0 || device_.physical_bytes_in_use() != 0 ||
        device_.mapped_bytes() != 0 || device_.live_segment_count() != 0 ||
        device_.live_physical_handle_count() != 0) {
      return concat("drain: memory left behind: reserved ", reserved_bytes(), ", device physical ",
                    device_.physical_bytes_in_use(), ", mapped ", device_.mapped_bytes(),
                    ", segments ", device_.live_segment_count(), ", physical handles ",
                    device_.live_physical_handle_count());
    }
    return std::nullopt;
  }

  std::string recent_steps() const {
    std::string text;
    for (const StepRecord& r : recent_) {
      text += concat("  step ", r.step, ": ", op_name(r.op));
      if (r.address != 0) text += concat(" ", format_hex(r.address));
      if (r.value != 0) text += concat(" value=", r.value);
      text += concat(" -> ", r.outcome, "\n");
    }
    return text;
  }

  std::string where(std::uint64_t step) const {
    return concat("seed ", seed_, " (VRAMLEDGER_STRESS_SEED), heap ",
                  heap_name(GetParam()), ", step ", step,
                  "\nrecent steps:\n", recent_steps());
  }

  const std::uint64_t seed_;
  const std::uint64_t ops_;
  std::mt19937_64 rng_;
  std::discrete_distribution<int> op_distribution_{kWeights.begin(), kWeights.end()};
  SimulatedDevice device_;
  Ledger ledger_;
  std::unique_ptr<CachingAllocator> allocator_;
  ReferenceModel model_;
  std::vector<StreamHandle> streams_;
  std::vector<bool> paused_;
  struct InFlight {
    DevicePtr address;
    std::size_t size;
    EventHandle token;
  };
  std::vector<InFlight> in_flight_;
  std::vector<EventHandle> user_work_;  // other user work noted for find_hazard

  // Releases the tokens of user work that has finished (user_work_done forgets them).
  void forget_finished_user_work() {
    std::erase_if(user_work_, [&](EventHandle token) { return device_.user_work_done(token); });
  }
  std::vector<TagId> tags_;
  std::optional<TagScope> tag_scope_;
  std::deque<StepRecord> recent_;

  std::uint64_t removals_at_last_scan_ = 0;
  std::uint64_t allocations_ = 0, ooms_ = 0, errors_seen_ = 0, faults_injected_ = 0;
  std::uint64_t full_access_scans_ = 0;
};

TEST_P(RandomizedStress, EveryStepKeepsTheBooksExact) {
  const std::uint64_t drain_every = std::max<std::uint64_t>(ops_ / (kDrainCheckpoints + 1), 1);
  for (std::uint64_t step = 1; step <= ops_; ++step) {
    StepRecord record;
    record.step = step;
    record.op = pick_op();
    std::optional<std::string> problem = do_step(record);
    recent_.push_back(std::move(record));
    if (recent_.size() > kRecentOps) recent_.pop_front();
    if (!problem) problem = check_step(step);
    if (problem) FAIL() << *problem << "\n" << where(step);
    if (step % drain_every == 0) {
      if (auto drained = drain()) FAIL() << *drained << "\n" << where(step);
    }
  }
  if (auto drained = drain()) FAIL() << *drained << "\n" << where(ops_);

  // Destroying the allocator returns the address space and events too.
  allocator_.reset();
  EXPECT_EQ(device_.reserved_address_bytes(), 0u);
  EXPECT_EQ(device_.live_address_range_count(), 0u);
  EXPECT_EQ(device_.live_event_count(), 0u);

  // The mix must actually have exercised the interesting paths.
  EXPECT_GT(allocations_, ops_ / 5);
  EXPECT_GT(ooms_, 0u) << "no out-of-memory in the run: the device is too large for the mix";
  EXPECT_GT(faults_injected_, 0u);
  std::printf("seed %llu: %llu steps, %llu allocations, %llu out of memory, %llu other errors, "
              "%llu faults injected, %llu injected failures hit, %llu full accessibility scans\n",
              static_cast<unsigned long long>(seed_), static_cast<unsigned long long>(ops_),
              static_cast<unsigned long long>(allocations_), static_cast<unsigned long long>(ooms_),
              static_cast<unsigned long long>(errors_seen_),
              static_cast<unsigned long long>(faults_injected_),
              static_cast<unsigned long long>([&] {
                std::uint64_t hit = 0;
                for (SimOp op : kFaultableOps) hit += device_.injected_failure_count(op);
                return hit;
              }()),
              static_cast<unsigned long long>(full_access_scans_));
}

INSTANTIATE_TEST_SUITE_P(Heaps, RandomizedStress,
                         testing::Values(Heap::kSegment, Heap::kPaged, Heap::kPagedAliasing),
                         [](const testing::TestParamInfo<Heap>& info) {
                           return heap_name(info.param);
                         });

}  // namespace
}  // namespace vramledger::stress
