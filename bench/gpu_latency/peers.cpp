#include <cstdlib>
#include "bench/gpu_latency/peers.hpp"

#include <chrono>
#include <limits>
#include <string_view>
#include <utility>

#include "accounting/consistency.hpp"
#include "allocator/cuda/cuda_backend_factory.hpp"

namespace vramledger::gpu_latency {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point start, Clock::time_point end) {
  return std::chrono::duration<double>(end - start).count();
}

void check_cuda(cudaError_t error, const char* call) {
  if (error != cudaSuccess) throw_cuda(error, call, 0);
}

}  // namespace

void throw_cuda(cudaError_t error, const char* call, std::size_t bytes) {
  (void)cudaGetLastError();  // a failed call must not surface again in the next check
  std::string message = std::string(call) + " failed";
  if (bytes != 0) message += " for " + std::to_string(bytes) + " B";
  message += ": ";
  message += cudaGetErrorName(error);
  message += " (";
  message += cudaGetErrorString(error);
  message += ")";
  throw PeerError(message);
}

// --------------------------------------------------------------------------- GatedLedger

LedgerOptions GatedLedger::ledger_options() {
  LedgerOptions options;
  const char* capacity = std::getenv("VRAMLEDGER_BENCH_TRACE_CAPACITY");
  if (capacity != nullptr && *capacity != '\0') {
    options.trace_capacity = std::strtoull(capacity, nullptr, 10);
  }
  // What the timestamps cost: "none" leaves them out, "cycle" reads the cycle counter.
  if (const char* clock = std::getenv("VRAMLEDGER_BENCH_CLOCK"); clock != nullptr) {
    if (std::string_view(clock) == "none") options.clock = ClockSource::kNone;
    if (std::string_view(clock) == "cycle") options.clock = ClockSource::kCycleCounter;
  }
  return options;
}

std::string GatedLedger::describe() const {
  std::lock_guard<SpinMutex> lock(mutex_);
  return ledger_.describe();
}

std::string GatedLedger::check_against(const CachingAllocator& allocator) const {
  // The census is taken with nothing allocating (between benchmarks), so the two agree only if
  // every event reached the ledger.
  const BlockCensus census = allocator.census();
  std::lock_guard<SpinMutex> lock(mutex_);
  return check_consistency(ledger_, census).to_string();
}

bool GatedLedger::consistent_with(const CachingAllocator& allocator) const {
  const BlockCensus census = allocator.census();
  std::lock_guard<SpinMutex> lock(mutex_);
  return check_consistency(ledger_, census).ok();
}

// --------------------------------------------------------------------------- VramledgerPeer

VramledgerPeer::VramledgerPeer(const std::string& conf, std::shared_ptr<DeviceBackend> backend,
                               BackendFactory make_backend)
    : conf_(conf),
      config_(parse_config(conf)),
      backend_(std::move(backend)),
      make_backend_(std::move(make_backend)),
      allocator_(std::make_unique<CachingAllocator>(*backend_, &ledger_, config_.options)) {
  ledger_.prefault_trace();
}

std::unique_ptr<VramledgerPeer> VramledgerPeer::on_gpu(const std::string& backend_name,
                                                      const std::string& extra_conf) {
  const std::string conf = "backend:" + backend_name + extra_conf;
  const std::string name = parse_config(conf).backend;  // rejects unknown names with a clear error
  BackendFactory factory = [name] { return make_cuda_backend(name, kDevice); };
  std::shared_ptr<DeviceBackend> backend = factory();
  return std::make_unique<VramledgerPeer>(conf, std::move(backend), std::move(factory));
}

VramledgerPeer::~VramledgerPeer() {
  growth_backend_.reset();
  allocator_.reset();  // before the ledger it reports to and the backend it returns memory to
}

std::string VramledgerPeer::describe() const {
  const bool paged = config_.options.use_paged_heap && backend_->info().supports_virtual_memory;
  return std::string(paged ? "paged heap" : "segment heap") + " on " + backend_->info().name +
         " (conf " + conf_ + ", ledger attached)";
}

void VramledgerPeer::prepare_growth() {
  growth_backend_ = make_backend_();
}

GrowthSample VramledgerPeer::grow_cold(std::size_t bytes, cudaStream_t stream) {
  GatedLedger ledger;  // declared first: the allocator reports to it until destroyed
  GrowthSample sample;
  {
    CachingAllocator allocator(*growth_backend_, &ledger, config_.options);
    const auto start = Clock::now();
    const DevicePtr ptr = allocator.allocate(bytes, reinterpret_cast<StreamHandle>(stream));
    sample.alloc_seconds = seconds_between(start, Clock::now());
    allocator.deallocate(ptr);
  }  // ~CachingAllocator: cached segments / pages and spans go back to the driver
  return sample;
}

// --------------------------------------------------------------------------- CudaMallocPeer

GrowthSample CudaMallocPeer::grow_cold(std::size_t bytes, cudaStream_t stream) {
  GrowthSample sample;
  const auto start = Clock::now();
  void* ptr = allocate(bytes, stream);
  sample.alloc_seconds = seconds_between(start, Clock::now());
  deallocate(ptr, bytes, stream);
  return sample;
}

// --------------------------------------------------------------------------- MallocAsyncPeer

MallocAsyncPeer::MallocAsyncPeer() {
  int supported = 0;
  check_cuda(cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, kDevice),
             "cudaDeviceGetAttribute(cudaDevAttrMemoryPoolsSupported)");
  if (supported == 0) throw PeerError("device 0 does not support memory pools (cudaMallocAsync)");
  check_cuda(cudaDeviceGetDefaultMemPool(&pool_, kDevice), "cudaDeviceGetDefaultMemPool");
  check_cuda(cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &previous_threshold_),
             "cudaMemPoolGetAttribute(ReleaseThreshold)");
  std::uint64_t keep_everything = std::numeric_limits<std::uint64_t>::max();
  check_cuda(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep_everything),
             "cudaMemPoolSetAttribute(ReleaseThreshold, UINT64_MAX)");
}

MallocAsyncPeer::~MallocAsyncPeer() {
  if (pool_ == nullptr) return;
  // Best effort at exit: errors are ignored (the process is ending), but not left pending.
  if (cudaDeviceSynchronize() != cudaSuccess ||
      cudaMemPoolTrimTo(pool_, 0) != cudaSuccess ||
      cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &previous_threshold_) !=
          cudaSuccess) {
    (void)cudaGetLastError();
  }
}

void MallocAsyncPeer::trim() {
  // Frees queued on a stream count only once the stream reached them.
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  check_cuda(cudaMemPoolTrimTo(pool_, 0), "cudaMemPoolTrimTo(0)");
}

GrowthSample MallocAsyncPeer::grow_cold(std::size_t bytes, cudaStream_t stream) {
  GrowthSample sample;
  const auto start = Clock::now();
  void* ptr = allocate(bytes, stream);
  sample.alloc_seconds = seconds_between(start, Clock::now());
  deallocate(ptr, bytes, stream);
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  check_cuda(cudaMemPoolTrimTo(pool_, 0), "cudaMemPoolTrimTo(0)");
  return sample;
}

}  // namespace vramledger::gpu_latency
