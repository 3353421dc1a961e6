// Fuzz target: the allocation API as an operation stream. The input's bytes are read as a program
// of operations on a CachingAllocator over a small simulated device (256 MiB, so requests beyond
// it, caps and injected driver faults happen): allocate (any size, 0 and more than the device
// included), free, record_stream, frees of interior / foreign / already freed pointers,
// empty_cache, process_completed_frees, paused and resumed streams, caps, injected faults of
// every driver call the policy makes. After every operation:
//  * any exception is a vramledger::Error of a code that operation may end in (an injected fault
//    carries the code it was injected with: kDriverError or kOutOfMemory; never kInternal, never
//    another exception type), and a refused free leaves the block owned;
//  * cheap invariants: the ledger counts exactly the blocks the program holds and their requested
//    bytes, and the simulated device holds exactly the bytes the ledger says are reserved;
//  * the ledger agrees with a census recount (check_consistency) and the census counts exactly
//    the blocks the program holds: after every operation that ended in an error (where books
//    are most easily lost), every kFullCheckEvery operations and at the end of the program. A
//    recount after every operation ran at ~85 executions/s under ASan; a hole the recount would
//    see stays in the books, so a later recount still finds it;
// and at the end, with faults cleared and everything freed, empty_cache leaves 0 bytes reserved
// and the simulated device holds no physical memory. A violation prints what and aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace {

using namespace vramledger;

[[noreturn]] void violation(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fuzz_allocation_ops: %s %s\n", what, detail);
  std::abort();
}

// Reads the input byte by byte; 0 once it is used up (the program then ends).
class Program {
 public:
  Program(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool done() const { return at_ >= size_; }
  std::uint8_t next() { return at_ < size_ ? data_[at_++] : 0; }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

constexpr SimOp kFaultableOps[] = {
    SimOp::kAllocateSegment, SimOp::kFreeSegment,    SimOp::kCreatePhysical,
    SimOp::kReleasePhysical, SimOp::kReserveAddress, SimOp::kFreeAddress,
    SimOp::kMapPages,        SimOp::kUnmapPages,     SimOp::kCreateEvent,
    SimOp::kRecordEvent,     SimOp::kQueryEvent,     SimOp::kSynchronizeEvent,
    SimOp::kSynchronizeDevice};

bool one_of(ErrorCode code, std::initializer_list<ErrorCode> allowed) {
  for (ErrorCode a : allowed) {
    if (a == code) return true;
  }
  return false;
}

// Runs `action`; an exception must be a vramledger Error with one of the `allowed` codes.
template <typename Action>
bool attempt(Action&& action, std::initializer_list<ErrorCode> allowed) {
  try {
    action();
    return true;
  } catch (const Error& error) {
    if (!one_of(error.code(), allowed)) violation("unexpected error:", error.what());
    return false;
  } catch (const std::exception& error) {
    violation("an exception that is not a vramledger::Error:", error.what());
  }
}

constexpr int kFullCheckEvery = 16;
constexpr std::size_t kLargestRequest = std::size_t{1} << 44;  // the policy's (16 TiB)

constexpr std::size_t kDeviceBytes = std::size_t{256} << 20;

// Sizes from 0 up to 1 GiB (4 times the device), and above the largest request the policy takes.
// A small device and sizes bounded by a few times it, because the work of a request grows with
// its pages: with a 2 GiB device and requests up to 2^39 B (before) most of the run went into
// creating, mapping and releasing pages for requests that then failed (~85 executions/s). Most
// requests are below 32 MiB (exponent < 25); 1 in 17 is larger, 1 in 256 above the largest
// request: every out-of-memory error builds the ledger's whole account into its message, which
// was half of the run when a third of the requests could not fit.
std::size_t request_size(Program& program) {
  const std::uint8_t code = program.next();
  const std::size_t mantissa = program.next();
  if (code == 255) return kLargestRequest + 1 + mantissa;  // refused at once: kInvalidArgument
  const unsigned exponent = code < 240 ? code % 25u : 25u + (code - 240u) % 5u;
  return ((std::size_t{256} + mantissa) << exponent) >> 8;  // 0 when exponent < 8 and small
}

class Run {
 public:
  explicit Run(std::uint8_t shape)
      : device_(device_options(shape)), ledger_(ledger_options()),
        allocator_(std::make_unique<CachingAllocator>(device_, &ledger_, allocator_options(shape))) {
    streams_ = {0, device_.create_stream(), device_.create_stream()};
  }

  void step(Program& program) {
    failed_ = false;
    const std::uint8_t op = program.next() % 16;
    switch (op) {
      case 0: case 1: case 2: case 3: allocate(program); break;
      case 4: case 5: case 6: free_live(program); break;
      case 7:
        if (!live_.empty()) {
          const DevicePtr ptr = pick_live(program);
          attempt([&] { allocator_->record_stream(ptr, pick_stream(program)); },
                  {ErrorCode::kDriverError, ErrorCode::kOutOfMemory});
        }
        break;
      case 8: free_bad_pointer(program); break;
      case 9:
        attempt([&] { allocator_->empty_cache(); },
                {ErrorCode::kDriverError, ErrorCode::kOutOfMemory});
        break;
      case 10:
        attempt([&] { allocator_->process_completed_frees(); },
                {ErrorCode::kDriverError, ErrorCode::kOutOfMemory});
        break;
      case 11: {
        const StreamHandle stream = pick_stream(program);
        (void)((program.next() & 1) != 0 ? device_.pause_stream(stream)
                                         : device_.resume_stream(stream));
        break;
      }
      case 12: (void)device_.synchronize_device(); break;
      case 13: {
        const std::uint8_t steps = program.next();
        allocator_->set_cap(steps == 0 ? 0 : std::size_t{steps} << 20);  // 1 MiB .. 255 MiB
        break;
      }
      case 14: {
        const SimOp target = kFaultableOps[program.next() % std::size(kFaultableOps)];
        const std::uint64_t nth = 1 + program.next() % 4;
        device_.inject_failure_at(target, nth,
                                  (program.next() & 1) != 0 ? ErrorCode::kOutOfMemory
                                                            : ErrorCode::kDriverError);
        break;
      }
      default:
        if (!live_.empty()) {
          const DevicePtr ptr = pick_live(program);
          const AllocationInfo info = allocator_->describe(ptr);
          if (info.base != ptr || info.size < info.requested) violation("describe() disagrees");
        }
        break;
    }
    if (failed_ || ++steps_ % kFullCheckEvery == 0) {
      check();
    } else {
      check_cheap();
    }
  }

  void finish() {
    device_.clear_faults();
    for (StreamHandle stream : streams_) (void)device_.resume_stream(stream);
    allocator_->set_cap(0);
    check();  // the program's last operations, before the frees below change the books
    for (DevicePtr ptr : live_) allocator_->deallocate(ptr);  // no fault left: must succeed
    live_.clear();
    live_requested_ = 0;
    if (!device_.synchronize_device().is_ok()) violation("synchronize_device failed at the end");
    allocator_->empty_cache();
    check();
    const BlockCensus census = allocator_->census();
    if (census.pools[0].reserved_bytes + census.pools[1].reserved_bytes != 0) {
      violation("bytes still reserved after freeing everything and empty_cache");
    }
    if (device_.physical_bytes_in_use() != 0) violation("the device still holds physical memory");
    allocator_.reset();  // before the ledger it reports to
  }

 private:
  static SimulatedDeviceOptions device_options(std::uint8_t shape) {
    SimulatedDeviceOptions options;
    options.capacity_bytes = kDeviceBytes;
    options.supports_virtual_memory = (shape & 1) != 0;
    return options;
  }
  static LedgerOptions ledger_options() {
    LedgerOptions options;
    // No trace: it is not what is fuzzed here, and its ring is aligned to 2 MiB (for huge pages),
    // which under ASan cost a 2 MiB mapping per input (353 instead of 533 executions per CPU s).
    options.trace_capacity = 0;
    options.abort_on_inconsistency = true;
    return options;
  }
  static AllocatorOptions allocator_options(std::uint8_t shape) {
    AllocatorOptions options;
    options.alias_pending_pages = (shape & 2) != 0;
    return options;
  }

  // Runs `action` as attempt() does, remembering a failure for the check after the operation.
  template <typename Action>
  bool attempt(Action&& action, std::initializer_list<ErrorCode> allowed) {
    const bool ok = ::attempt(std::forward<Action>(action), allowed);
    failed_ = failed_ || !ok;
    return ok;
  }

  StreamHandle pick_stream(Program& program) { return streams_[program.next() % streams_.size()]; }
  DevicePtr pick_live(Program& program) {
    return live_[(std::size_t{program.next()} << 8 | program.next()) % live_.size()];
  }
  bool is_live(DevicePtr ptr) const {
    for (DevicePtr p : live_) {
      if (p == ptr) return true;
    }
    return false;
  }

  void allocate(Program& program) {
    const std::size_t bytes = request_size(program);
    const StreamHandle stream = pick_stream(program);
    DevicePtr ptr = 0;
    if (attempt([&] { ptr = allocator_->allocate(bytes, stream); },
                {ErrorCode::kOutOfMemory, ErrorCode::kDriverError, ErrorCode::kInvalidArgument})) {
      if (bytes == 0) violation("an allocation of 0 bytes succeeded");
      if (bytes > kLargestRequest) violation("an allocation above the largest request succeeded");
      live_.push_back(ptr);
      live_requested_ += bytes;
    }
  }

  void free_live(Program& program) {
    if (live_.empty()) return;
    const std::size_t index = (std::size_t{program.next()} << 8 | program.next()) % live_.size();
    const DevicePtr ptr = live_[index];
    const std::size_t requested = allocator_->describe(ptr).requested;
    if (attempt([&] { allocator_->deallocate(ptr); },
                {ErrorCode::kDriverError, ErrorCode::kOutOfMemory})) {
      live_requested_ -= requested;
      live_[index] = live_.back();
      live_.pop_back();
      freed_.push_back(ptr);
    } else if (!allocator_->owns(ptr)) {
      violation("a refused free lost its block");
    }
  }

  void free_bad_pointer(Program& program) {
    DevicePtr ptr = 0x1000 + program.next();  // foreign
    const std::uint8_t kind = program.next() % 3;
    if (kind == 1 && !live_.empty()) ptr = pick_live(program) + 1 + program.next();  // interior
    if (kind == 2 && !freed_.empty()) {
      ptr = freed_[program.next() % freed_.size()];  // freed before (unless handed out again)
      if (is_live(ptr)) return;
    }
    if (attempt([&] { allocator_->deallocate(ptr); },
                {ErrorCode::kInvalidPointer, ErrorCode::kDoubleFree})) {
      violation("a free of a pointer the program does not hold succeeded");
    }
  }

  // After every operation: what the ledger's counters and the device say, without a recount.
  void check_cheap() {
    const LedgerCounters counters = ledger_.counters();
    const PoolCounters& all = counters.aggregate();
    if (all.allocation.current != static_cast<std::int64_t>(live_.size())) {
      violation("the ledger's allocated blocks differ from the blocks the program holds");
    }
    if (all.allocated_requested_bytes.current != static_cast<std::int64_t>(live_requested_)) {
      violation("the ledger's requested bytes differ from what the program asked for");
    }
    if (all.reserved_bytes.current != static_cast<std::int64_t>(device_.physical_bytes_in_use())) {
      violation("the ledger's reserved bytes differ from what the device holds");
    }
  }

  void check() {
    check_cheap();
    const BlockCensus census = allocator_->census();
    const ConsistencyReport report = check_consistency(ledger_, census);
    if (!report.ok()) violation("ledger != census:", report.to_string().c_str());
    if (census.pools[0].allocation + census.pools[1].allocation !=
        static_cast<std::int64_t>(live_.size())) {
      violation("the census's allocated blocks differ from the blocks the program holds");
    }
  }

  SimulatedDevice device_;
  Ledger ledger_;
  std::unique_ptr<CachingAllocator> allocator_;
  std::vector<StreamHandle> streams_;
  std::vector<DevicePtr> live_;
  std::vector<DevicePtr> freed_;
  std::size_t live_requested_ = 0;  // the requested bytes of live_
  std::uint64_t steps_ = 0;
  bool failed_ = false;  // an operation of this step ended in an error
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  Program program(data, size);
  Run run(program.next());
  while (!program.done()) run.step(program);
  run.finish();
  return 0;
}
