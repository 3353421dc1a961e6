#include "tests/faults/fault_workload.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <random>
#include <sstream>

#include "accounting/consistency.hpp"

namespace vramledger::fault_test {

namespace {

enum class Op { kAllocate, kFree, kRecordStream, kQueueWork, kProcessFrees, kEmptyCache };

// Relative weights: allocate and free dominate; empty_cache is rare because it sends every cached
// byte back to the driver (the next operations then call it again, where faults are injected).
constexpr unsigned kWeights[] = {450, 400, 80, 30, 38, 2};

std::int64_t census_reserved(const BlockCensus& census) {
  return census.pools[0].reserved_bytes + census.pools[1].reserved_bytes;
}
std::int64_t census_allocations(const BlockCensus& census) {
  return census.pools[0].allocation + census.pools[1].allocation;
}

bool names_injected_fault(const std::exception& error) {
  return std::string(error.what()).find("injected fault") != std::string::npos;
}

class Run {
 public:
  Run(CachingAllocator& allocator, const Ledger& ledger, FaultInjectingBackend& backend,
      const FaultWorkloadOptions& options)
      : allocator_(allocator), ledger_(ledger), backend_(backend), options_(options),
        rng_(options.seed), op_choice_(std::begin(kWeights), std::end(kWeights)) {}

  FaultWorkloadResult run() {
    using Clock = std::chrono::steady_clock;
    const Clock::time_point start = Clock::now();
    for (std::uint64_t step = 0; step < options_.operations && result_.problem.empty(); ++step) {
      if (options_.time_limit.count() > 0 && step % 64 == 0 &&
          Clock::now() - start >= options_.time_limit) {
        result_.stopped_by_time_limit = true;
        break;
      }
      const Op op = pick();
      do_op(op);
      result_.operations = step + 1;
      if (!result_.problem.empty()) break;
      check_blocks(op);
      if (result_.problem.empty() &&
          (op == Op::kEmptyCache || (step + 1) % options_.device_check_every == 0)) {
        check_device("after operation " + std::to_string(step + 1));
      }
    }
    result_.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (result_.problem.empty()) teardown();
    return result_;
  }

 private:
  Op pick() {
    if (live_.size() >= options_.max_live) return Op::kFree;
    Op op = static_cast<Op>(op_choice_(rng_));
    if (op == Op::kQueueWork && !options_.queue_work) op = Op::kProcessFrees;
    return op;
  }

  std::size_t uniform(std::size_t n) {
    return std::uniform_int_distribution<std::size_t>(0, n - 1)(rng_);
  }
  std::size_t request_size() {
    std::uniform_real_distribution<double> exponent(std::log2(double(options_.min_bytes)),
                                                    std::log2(double(options_.max_bytes)));
    return std::clamp(static_cast<std::size_t>(std::exp2(exponent(rng_))), options_.min_bytes,
                      options_.max_bytes);
  }

  void fail(const std::string& what) {
    if (result_.problem.empty()) {
      result_.problem = "operation " + std::to_string(result_.operations + 1) + ": " + what;
    }
  }

  // An error an operation may end in: a vramledger Error naming an injected fault. Anything
  // else (another exception type, a real driver failure) is a problem.
  bool clean(const std::exception& error, const char* during) {
    if (dynamic_cast<const Error*>(&error) == nullptr) {
      fail(std::string(during) + " threw something other than vramledger::Error: " + error.what());
      return false;
    }
    if (!names_injected_fault(error)) {
      fail(std::string(during) + " failed without an injected fault: " + error.what());
      return false;
    }
    return true;
  }

  void do_op(Op op) {
    switch (op) {
      case Op::kAllocate: return allocate();
      case Op::kFree: return free_one();
      case Op::kRecordStream: {
        if (live_.empty()) return;
        try {
          allocator_.record_stream(live_[uniform(live_.size())],
                                   options_.streams[uniform(options_.streams.size())]);
        } catch (const std::exception& error) {
          if (clean(error, "record_stream")) ++result_.other_errors;
        }
        return;
      }
      case Op::kQueueWork: {
        const StreamHandle stream = options_.streams[uniform(options_.streams.size())];
        options_.queue_work(stream);
        if (!live_.empty()) {  // a block used by that work: its free waits for it
          try {
            allocator_.record_stream(live_[uniform(live_.size())], stream);
          } catch (const std::exception& error) {
            if (clean(error, "record_stream")) ++result_.other_errors;
          }
        }
        return;
      }
      case Op::kProcessFrees:
        try {
          allocator_.process_completed_frees();
        } catch (const std::exception& error) {
          if (clean(error, "process_completed_frees")) ++result_.other_errors;
        }
        return;
      case Op::kEmptyCache:
        ++result_.empty_caches;
        try {
          allocator_.empty_cache();
        } catch (const std::exception& error) {
          if (clean(error, "empty_cache")) ++result_.other_errors;
        }
        return;
    }
  }

  void allocate() {
    const std::size_t bytes = request_size();
    const StreamHandle stream = options_.streams[uniform(options_.streams.size())];
    const std::uint64_t injected_before = backend_.injected_total();
    try {
      const DevicePtr ptr = allocator_.allocate(bytes, stream);
      const AllocationInfo info = allocator_.describe(ptr);
      if (info.base != ptr || info.size < bytes || info.requested != bytes) {
        return fail("describe() of a new block disagrees with the request of " +
                    std::to_string(bytes) + " bytes");
      }
      live_.push_back(ptr);
      ++result_.allocations;
      if (backend_.injected_total() != injected_before) ++result_.allocations_through_faults;
    } catch (const OutOfMemoryError& error) {
      if (!clean(error, "allocate")) return;
      ++result_.out_of_memory;
      if (result_.first_oom_message.empty()) result_.first_oom_message = error.what();
    } catch (const std::exception& error) {
      if (!clean(error, "allocate")) return;
      if (static_cast<const Error&>(error).code() != ErrorCode::kDriverError) {
        return fail(std::string("allocate: an injected fault became ") + error.what());
      }
      ++result_.driver_errors;
      if (result_.first_driver_error.empty()) result_.first_driver_error = error.what();
    }
  }

  void free_one() {
    if (live_.empty()) return;
    const std::size_t at = uniform(live_.size());
    const DevicePtr ptr = live_[at];
    try {
      allocator_.deallocate(ptr);
      live_[at] = live_.back();
      live_.pop_back();
      ++result_.frees;
    } catch (const std::exception& error) {
      if (!clean(error, "deallocate")) return;
      ++result_.failed_frees;
      if (!allocator_.owns(ptr)) fail("a failed free lost its block: " + std::string(error.what()));
    }
  }

  void check_blocks(Op op) {
    const BlockCensus census = allocator_.census();
    const ConsistencyReport report = check_consistency(ledger_, census);
    if (!report.ok()) return fail("ledger != census: " + report.to_string());
    if (census_allocations(census) != static_cast<std::int64_t>(live_.size())) {
      return fail("the census counts " + std::to_string(census_allocations(census)) +
                  " allocated blocks, the workload holds " + std::to_string(live_.size()) +
                  " (after op " + std::to_string(static_cast<int>(op)) + ")");
    }
    result_.peak_reserved = std::max(result_.peak_reserved, census_reserved(census));
  }

  void check_device(const std::string& when) {
    if (!options_.device_held) return;
    std::int64_t held = 0;
    const Status status = options_.device_held(&held);
    if (!status.is_ok()) return fail("reading the device's usage failed: " + status.message());
    ++result_.device_checks;
    const std::int64_t reserved = census_reserved(allocator_.census());
    if (held != reserved) {
      fail(when + ": the device holds " + std::to_string(held) + " B for this process, the census " +
           std::to_string(reserved) + " B reserved");
    }
  }

  void teardown() {
    backend_.set_rate(0.0);
    for (const DevicePtr ptr : live_) {
      try {
        allocator_.deallocate(ptr);
      } catch (const std::exception& error) {
        return fail(std::string("teardown: free without faults failed: ") + error.what());
      }
    }
    live_.clear();
    const Status synced = allocator_.backend().synchronize_device();
    if (!synced.is_ok()) return fail("teardown: synchronize_device: " + synced.message());
    allocator_.empty_cache();
    check_blocks(Op::kEmptyCache);
    if (!result_.problem.empty()) return;
    const BlockCensus census = allocator_.census();
    if (census_reserved(census) != 0) {
      return fail("teardown: " + std::to_string(census_reserved(census)) +
                  " B still reserved after freeing everything and empty_cache");
    }
    check_device("teardown");
  }

  CachingAllocator& allocator_;
  const Ledger& ledger_;
  FaultInjectingBackend& backend_;
  const FaultWorkloadOptions& options_;
  std::mt19937_64 rng_;
  std::discrete_distribution<int> op_choice_;
  std::vector<DevicePtr> live_;
  FaultWorkloadResult result_;
};

}  // namespace

FaultWorkloadResult run_fault_workload(CachingAllocator& allocator, const Ledger& ledger,
                                       FaultInjectingBackend& backend,
                                       const FaultWorkloadOptions& options) {
  return Run(allocator, ledger, backend, options).run();
}

std::string summarize(const FaultWorkloadResult& r, const FaultInjectingBackend& backend) {
  std::ostringstream out;
  out << r.operations << " operations in " << r.seconds << " s"
      << (r.stopped_by_time_limit ? " (stopped by the time limit)" : "") << ": " << r.allocations << " allocations ("
      << r.allocations_through_faults << " succeeded through an injected fault), " << r.frees
      << " frees; clean errors: " << r.out_of_memory << " out of memory, " << r.driver_errors
      << " driver errors, " << r.failed_frees << " refused frees, " << r.other_errors
      << " others; " << r.empty_caches << " empty_cache, " << r.device_checks
      << " device checks, peak reserved " << r.peak_reserved << " B; injected (calls/early/late):";
  for (std::size_t i = 0; i < kFaultPointCount; ++i) {
    const auto point = static_cast<FaultPoint>(i);
    const FaultInjectingBackend::Counts c = backend.counts(point);
    if (c.calls == 0) continue;
    out << " " << to_string(point) << " " << c.calls << "/" << c.early << "/" << c.late;
    if (c.undo_failed != 0) out << " (undo failed " << c.undo_failed << ")";
  }
  return out.str();
}

}  // namespace vramledger::fault_test
