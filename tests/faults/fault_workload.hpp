// The workload of the fault tests (issue 16): a long random mix of allocate, free, record_stream,
// completed-free processing and empty_cache through a CachingAllocator whose backend is a
// FaultInjectingBackend, checked after every operation. Shared by the CPU test over the simulated
// device (tests/faults/) and the GPU test over the real backends (tests/gpu/), which differ only
// in how they read the device's own view of the memory held (simulated accounting, NVML).
//
// What "no byte lost" means here, checked after every operation:
//  * the ledger agrees with a census recount of the allocator's blocks (check_consistency);
//  * the census counts exactly the blocks the workload holds (a failed allocate or free changed
//    nothing, a successful one changed one block);
//  * every exception is a vramledger Error whose message names an injected fault (a clean error),
//    and a failed free leaves the block owned (it is freed again later);
// and every `device_check_every` operations, after each empty_cache and at the end: the device's
// own count of bytes this process holds (`device_held`) equals the census's reserved bytes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/fault_injecting_backend.hpp"

namespace vramledger::fault_test {

struct FaultWorkloadOptions {
  std::uint64_t operations = 100'000;
  std::uint64_t seed = 16;
  std::vector<StreamHandle> streams = {0};  // allocations go to all of them; record_stream too
  std::size_t max_live = 96;                // past it, only frees
  std::size_t min_bytes = 512;              // requests are log-uniform in [min, max]
  std::size_t max_bytes = std::size_t{64} << 20;
  std::uint64_t device_check_every = 256;
  // Bytes the device says this process holds beyond the baseline; null: no device check.
  std::function<Status(std::int64_t*)> device_held;
  // Queues a little work on a stream (so frees after record_stream stay pending); may be null.
  std::function<void(StreamHandle)> queue_work;
  // Stops early (before `operations`, then the teardown and its checks) once this much time has
  // passed; zero: no limit. For the GPU test, whose speed depends on the driver.
  std::chrono::milliseconds time_limit{0};
};

struct FaultWorkloadResult {
  std::uint64_t operations = 0;          // done (fewer when a problem or the time limit stopped it)
  bool stopped_by_time_limit = false;
  double seconds = 0;                    // the operations and their checks, not the teardown
  std::uint64_t allocations = 0;         // succeeded
  std::uint64_t allocations_through_faults = 0;  // succeeded although a fault was injected in them
  std::uint64_t frees = 0;               // succeeded
  std::uint64_t out_of_memory = 0;       // allocate: OutOfMemoryError (after the policy's retry)
  std::uint64_t driver_errors = 0;       // allocate: Error(kDriverError)
  std::uint64_t failed_frees = 0;        // deallocate refused (block kept, freed later)
  std::uint64_t other_errors = 0;        // empty_cache / process_completed_frees / record_stream
  std::uint64_t empty_caches = 0;
  std::uint64_t device_checks = 0;
  std::int64_t peak_reserved = 0;        // census, bytes
  std::string first_oom_message;         // an example for the docs
  std::string first_driver_error;
  std::string problem;                   // empty when every check passed
};

// Runs the workload, then frees everything with injection off (backend.set_rate(0)), empties the
// cache and checks the census reserves 0 bytes and the device holds 0 bytes beyond the baseline.
FaultWorkloadResult run_fault_workload(CachingAllocator& allocator, const Ledger& ledger,
                                       FaultInjectingBackend& backend,
                                       const FaultWorkloadOptions& options);

// One line of figures: operations, outcomes, injected faults per point.
std::string summarize(const FaultWorkloadResult& result, const FaultInjectingBackend& backend);

}  // namespace vramledger::fault_test
