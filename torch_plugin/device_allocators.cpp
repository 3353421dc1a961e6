#include "torch_plugin/device_allocators.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <string_view>
#include <utility>

#include "accounting/text_report.hpp"
#include "allocator/cuda/cuda_backend_factory.hpp"
#include "allocator/errors.hpp"
#include "allocator/simulated/simulated_device.hpp"
#include "torch_plugin/capped_backend.hpp"

namespace vramledger::torch_plugin {

bool simulated_backend_allowed() {
  const char* value = std::getenv("VRAMLEDGER_TORCH_ALLOW_SIMULATED");
  return value != nullptr && std::string_view(value) == "1";
}

namespace {

std::unique_ptr<DeviceBackend> make_backend(const std::string& name, int device) {
  if (name == "simulated") {
    // Fake addresses: only the plugin's own tests (no GPU) may ask for it.
    if (!simulated_backend_allowed()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "backend:simulated has no device memory and cannot serve torch; use auto, "
                  "cuda_malloc, vmm or malloc_async");
    }
    SimulatedDeviceOptions options;
    options.device = device;
    return std::make_unique<SimulatedDevice>(options);
  }
  if (name != "auto") return make_cuda_backend(name, device);
  // auto: physical pages of our own where the driver offers them (exact reserved bytes, pages
  // reusable anywhere), plain cudaMalloc segments otherwise.
  try {
    return make_cuda_backend("vmm", device);
  } catch (const Error& error) {
    if (error.code() != ErrorCode::kNotSupported) throw;
    return make_cuda_backend("cuda_malloc", device);
  }
}

}  // namespace

std::string pool_name(c10::MempoolId_t id) {
  // Appended piece by piece: g++ 12 warns (-Wrestrict, a false positive) on "literal" + string&&.
  std::string name("(");
  name += std::to_string(id.first);
  name += ", ";
  name += std::to_string(id.second);
  name += ')';
  return name;
}

DeviceAllocators::DeviceAllocators(c10::DeviceIndex device, const Config& config)
    : device_(device),
      config_(config),
      backend_(make_backend(config.backend, device)),
      history_(device),
      gate_(ledger_, history_) {
  paged_ = config_.options.use_paged_heap && backend_->info().supports_virtual_memory;
  simulated_ = backend_->info().name == "simulated";
  cap_bytes_ = config_.options.cap_bytes;
  capped_backend_ = std::make_unique<CappedBackend>(*backend_, reservation_);
  default_pool_ = std::make_unique<MemoryPool>(*capped_backend_, gate_, config_.options);
}

DeviceAllocators::~DeviceAllocators() = default;

MemoryPool& DeviceAllocators::acquire_pool_for(cudaStream_t stream) {
  if (route_count_.load(std::memory_order_acquire) > 0) {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    for (const Route& route : routes_) {
      if (route.filter(stream)) {
        MemoryPool& pool = private_pool_locked(route.id);
        pool.live_blocks.fetch_add(1);
        return pool;
      }
    }
  }
  return *default_pool_;  // never destroyed: no need to count its blocks
}

std::vector<MemoryPool*> DeviceAllocators::acquire_oom_fallback_pools() {
  std::vector<MemoryPool*> pools;
  std::lock_guard<std::mutex> lock(pools_mutex_);
  for (auto& [id, pool] : private_pools_) {
    if (pool->use_on_oom) {
      pool->live_blocks.fetch_add(1);
      pools.push_back(pool.get());
    }
  }
  return pools;
}

void DeviceAllocators::release_block_of(MemoryPool& pool) {
  if (!pool.is_private()) return;
  if (pool.live_blocks.fetch_sub(1) != 1) return;
  std::lock_guard<std::mutex> lock(pools_mutex_);
  if (!retired_pools_.empty()) destroy_empty_retired_locked();
}

MemoryPool& DeviceAllocators::private_pool_locked(c10::MempoolId_t id) {
  auto it = private_pools_.find(id);
  TORCH_CHECK(it != private_pools_.end(), "vramledger: no memory pool ", pool_name(id),
              " on device ", static_cast<int>(device_));
  return *it->second;
}

void DeviceAllocators::create_or_incref_pool(c10::MempoolId_t id,
                                             std::shared_ptr<c10_alloc::CUDAAllocator> foreign) {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  // Ids {n, 0} are the ones torch makes for a capture without a pool (graph_pool_handle(false));
  // MemPool objects and graph_pool_handle() use {0, n}.
  const bool graph_pool = id.first != 0 && id.second == 0;
  create_or_incref_pool_locked(id, std::move(foreign), graph_pool);
}

void DeviceAllocators::create_or_incref_pool_locked(
    c10::MempoolId_t id, std::shared_ptr<c10_alloc::CUDAAllocator> foreign, bool graph_pool) {
  TORCH_CHECK(id.first != 0 || id.second != 0,
              "vramledger: (0, 0) names the default pool, not a private one");
  auto it = private_pools_.find(id);
  if (it != private_pools_.end()) {
    TORCH_CHECK(it->second->use_count > 0, "vramledger: memory pool ", pool_name(id),
                " was already released");
    it->second->use_count++;
    return;
  }
  DeviceBackend* segments = &plain_segment_backend_locked();
  const bool sleepable = graph_pool && foreign == nullptr && graph_pools_can_sleep();
  if (sleepable) {
    if (!graph_segment_backend_) {
      graph_segment_backend_ = std::make_unique<SleepableSegmentBackend>(*backend_);
    }
    segments = graph_segment_backend_.get();
  }
  AllocatorOptions options = config_.options;
  options.cap_bytes = cap_bytes_;
  options.no_split = no_split_pools_.erase(id) > 0;
  auto pool = std::make_unique<MemoryPool>(id, *segments, *backend_, std::move(foreign), gate_,
                                           options, reservation_, sleepable);
  pool->use_count = 1;
  pool->set_in_use(true);
  private_pools_.emplace(id, std::move(pool));
}

namespace {
std::atomic<int> routes_on_all_devices{0};
}

bool any_capture_underway() { return routes_on_all_devices.load(std::memory_order_acquire) > 0; }

void DeviceAllocators::begin_allocate_to_pool(c10::MempoolId_t id, StreamFilter filter) {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  for (const Route& route : routes_) {
    TORCH_CHECK(route.id != id, "vramledger: already allocating to memory pool ", pool_name(id));
  }
  create_or_incref_pool_locked(id, nullptr, /*graph_pool=*/true);
  routes_.push_back({id, std::move(filter)});
  route_count_.fetch_add(1, std::memory_order_release);
  routes_on_all_devices.fetch_add(1, std::memory_order_release);
}

void DeviceAllocators::end_allocate_to_pool(c10::MempoolId_t id) {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  auto it = std::find_if(routes_.begin(), routes_.end(),
                         [&](const Route& route) { return route.id == id; });
  TORCH_CHECK(it != routes_.end(), "vramledger: not allocating to memory pool ", pool_name(id));
  routes_.erase(it);
  route_count_.fetch_sub(1, std::memory_order_release);
  routes_on_all_devices.fetch_sub(1, std::memory_order_release);
}

void DeviceAllocators::release_pool(c10::MempoolId_t id) {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  auto it = private_pools_.find(id);
  TORCH_CHECK(it != private_pools_.end(), "vramledger: releasePool: no memory pool ",
              pool_name(id), " on device ", static_cast<int>(device_));
  if (--it->second->use_count > 0) return;
  retire_locked(it);
}

void DeviceAllocators::retire_locked(
    std::map<c10::MempoolId_t, std::unique_ptr<MemoryPool>>::iterator it) {
  std::unique_ptr<MemoryPool> pool = std::move(it->second);
  private_pools_.erase(it);
  pool->use_on_oom = false;
  pool->set_in_use(false);  // no graph or MemPool refers to it: its segments may be returned
  retired_pools_.push_back(std::move(pool));
  destroy_empty_retired_locked();
}

void DeviceAllocators::destroy_empty_retired_locked() {
  // Returning segments (cudaFree) during a capture would break it; wait for the next chance.
  if (route_count_.load(std::memory_order_acquire) > 0 || any_capture_underway()) return;
  for (std::size_t i = 0; i < retired_pools_.size();) {
    MemoryPool& pool = *retired_pools_[i];
    bool destroy = false;
    try {
      pool.policy().empty_cache();
      destroy = pool.holds_nothing();
    } catch (const std::exception&) {
      destroy = false;  // keep it; a later empty_cache tries again
    }
    if (destroy) {
      retired_pools_[i] = std::move(retired_pools_.back());
      retired_pools_.pop_back();
    } else {
      ++i;
    }
  }
}

int DeviceAllocators::pool_use_count(c10::MempoolId_t id) {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  auto it = private_pools_.find(id);
  return it == private_pools_.end() ? 0 : it->second->use_count;
}

void DeviceAllocators::set_use_on_oom(c10::MempoolId_t id, bool use_on_oom) {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  auto it = private_pools_.find(id);
  if (it == private_pools_.end()) {
    TORCH_CHECK(!use_on_oom, "vramledger: setUseOnOOM: no memory pool ", pool_name(id));
    return;  // torch clears the flag on pools it is about to release
  }
  it->second->use_on_oom = use_on_oom;
}

void DeviceAllocators::set_no_split(c10::MempoolId_t id) {
  TORCH_CHECK(id.first != 0 || id.second != 0,
              "vramledger: setNoSplit: (0, 0) names the default pool, not a private one");
  std::lock_guard<std::mutex> lock(pools_mutex_);
  auto it = private_pools_.find(id);
  if (it == private_pools_.end()) {
    no_split_pools_.insert(id);
    return;
  }
  it->second->policy().set_no_split(true);
}

void DeviceAllocators::empty_cache(c10::MempoolId_t id) {
  const bool default_pool = id.first == 0 && id.second == 0;
  // While a graph captures, releasing would record and wait on events in captured streams (the
  // paged heap fences freed pages): the cache is kept until the capture is over.
  if (default_pool && !any_capture_underway()) default_pool_->policy().empty_cache();
  std::lock_guard<std::mutex> lock(pools_mutex_);
  destroy_empty_retired_locked();
}

SleepResult DeviceAllocators::sleep_graph_pools(bool offload) {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  if (!config_.options.sleepable_graph_pools) {
    throw Error(ErrorCode::kNotSupported,
                "cannot sleep the CUDA graph pools: they are plain cudaMalloc segments unless "
                "vramledger is installed with sleepable_graph_pools:true (backend:vmm) before the "
                "graphs are captured (docs/sleep.md); nothing was changed");
  }
  if (!graph_pools_can_sleep()) {
    throw Error(ErrorCode::kNotSupported,
                "cannot sleep the CUDA graph pools: backend '" + backend_->info().name +
                    "' has no virtual memory, so they are cudaMalloc segments that cannot give "
                    "their memory back and keep their addresses (use backend:vmm); nothing was "
                    "changed");
  }
  if (graphs_asleep_) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot sleep the CUDA graph pools: they are asleep already; nothing was changed");
  }
  std::vector<MemoryPool*> pools;
  for (auto& [id, pool] : private_pools_) {
    if (pool->sleepable()) pools.push_back(pool.get());
  }
  for (auto& pool : retired_pools_) {
    if (pool->sleepable()) pools.push_back(pool.get());
  }
  SleepResult result;
  std::string partial;  // a pool asleep with some memory kept (its error), nothing lost
  for (std::size_t i = 0; i < pools.size(); ++i) {
    try {
      result += pools[i]->policy().sleep_pool(offload);
    } catch (const std::exception& error) {
      if (pools[i]->policy().pool_asleep()) {
        partial = error.what();
        continue;
      }
      // Refused, nothing changed in this pool: the ones before it wake again.
      for (std::size_t j = 0; j < i; ++j) {
        try {
          pools[j]->policy().wake_pool();
        } catch (const std::exception&) {
          graphs_asleep_ = true;  // still asleep, nothing lost: wake(["graphs"]) later
        }
      }
      throw Error(ErrorCode::kInvalidArgument,
                  "cannot sleep CUDA graph pool " + pool_name(pools[i]->id()) + ": " +
                      error.what() +
                      (graphs_asleep_ ? std::string(" (and some pools slept before it could not "
                                                    "wake again: wake([\"graphs\"]) later)")
                                      : std::string(" (the pools slept before it woke again)")));
    }
  }
  graphs_asleep_ = true;
  if (!partial.empty()) {
    throw Error(ErrorCode::kDriverError,
                "the CUDA graph pools are asleep, but one kept some memory: " + partial);
  }
  return result;
}

SleepResult DeviceAllocators::wake_graph_pools() {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  if (!graphs_asleep_) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot wake the CUDA graph pools: they are not asleep (never put to sleep, or "
                "woken already); nothing was changed");
  }
  std::vector<MemoryPool*> pools;
  for (auto& [id, pool] : private_pools_) {
    if (pool->sleepable() && pool->policy().pool_asleep()) pools.push_back(pool.get());
  }
  for (auto& pool : retired_pools_) {
    if (pool->sleepable() && pool->policy().pool_asleep()) pools.push_back(pool.get());
  }
  SleepResult result;
  for (MemoryPool* pool : pools) {
    try {
      result += pool->policy().wake_pool();
    } catch (const OutOfMemoryError&) {
      // As an allocation does: the default pool's cache goes back, then one more attempt.
      default_pool_->policy().empty_cache();
      result += pool->policy().wake_pool();
    }
  }
  graphs_asleep_ = false;
  destroy_empty_retired_locked();  // graphs destroyed while their pools slept
  return result;
}

bool DeviceAllocators::graphs_asleep() const {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  return graphs_asleep_;
}

void DeviceAllocators::set_cap(std::size_t cap_bytes) { reservation_.set_cap(cap_bytes); }

bool DeviceAllocators::has_retired_pools() const {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  return !retired_pools_.empty();
}

std::size_t DeviceAllocators::cap() const { return reservation_.cap(); }

void DeviceAllocators::for_each_pool(c10::MempoolId_t id,
                                     const std::function<void(MemoryPool&)>& visit,
                                     bool all_pools) {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  const bool is_default = id.first == 0 && id.second == 0;
  if (all_pools || is_default) visit(*default_pool_);
  for (auto& [pool_id, pool] : private_pools_) {
    if (all_pools || pool_id == id) visit(*pool);
  }
  for (auto& pool : retired_pools_) {
    if (all_pools || pool->id() == id) visit(*pool);
  }
}

LedgerCounters DeviceAllocators::counters() const {
  auto lock = gate_.lock();
  return ledger_.counters();
}

Ledger::ShardTally DeviceAllocators::shard_tally() const {
  auto lock = gate_.lock();
  return ledger_.shard_tally();
}

DeviceBackend& DeviceAllocators::plain_segment_backend_locked() {
  const bool plain_segments =
      backend_->info().name == "cuda_malloc" || backend_->info().name == "simulated";
  if (!pool_segment_backend_ && !plain_segments) {
    pool_segment_backend_ = make_cuda_backend("cuda_malloc", device_);
  }
  return pool_segment_backend_ ? *pool_segment_backend_ : *backend_;
}

DevicePtr DeviceAllocators::allocate_uncached(std::size_t bytes, cudaStream_t stream) {
  DeviceBackend* segments = nullptr;
  {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    segments = &plain_segment_backend_locked();
  }
  DevicePtr ptr = 0;
  throw_if_error(segments->allocate_segment(bytes, reinterpret_cast<StreamHandle>(stream), &ptr),
                 "cudaMalloc with caching disabled");
  uncached_bytes_.fetch_add(static_cast<std::int64_t>(bytes));
  return ptr;
}

void DeviceAllocators::free_uncached(DevicePtr ptr, std::size_t bytes, cudaStream_t stream) {
  DeviceBackend* segments = nullptr;
  {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    segments = &plain_segment_backend_locked();
  }
  throw_if_error(segments->free_segment(ptr, bytes, reinterpret_cast<StreamHandle>(stream)),
                 "cudaFree with caching disabled");
  uncached_bytes_.fetch_sub(static_cast<std::int64_t>(bytes));
}

void DeviceAllocators::record_refused_request(std::size_t bytes, cudaStream_t stream) {
  AllocatorEvent event{EventKind::kOutOfMemory};
  event.size = bytes;
  event.requested = bytes;
  event.stream = reinterpret_cast<StreamHandle>(stream);
  gate_.on_event(event, {0, 0});
}

std::vector<std::pair<c10::MempoolId_t, PrivatePoolStats::PerKind>>
DeviceAllocators::private_pool_reserved() const {
  auto lock = gate_.lock();
  return gate_.private_pools_locked().reserved_bytes();
}

DeviceLedgerView DeviceAllocators::ledger_view() const {
  auto lock = gate_.lock();
  return DeviceLedgerView::of(ledger_, "device " + std::to_string(device_));
}

std::vector<TagUsage> DeviceAllocators::per_tag() const {
  auto lock = gate_.lock();
  return ledger_.per_tag();
}

void DeviceAllocators::reset_peaks() {
  auto lock = gate_.lock();
  ledger_.reset_peaks();
  gate_.private_pools_locked().reset_peaks();
}

void DeviceAllocators::reset_accumulated() {
  auto lock = gate_.lock();
  ledger_.reset_accumulated();
  gate_.private_pools_locked().reset_accumulated();
}

std::string DeviceAllocators::describe() const { return gate_.describe(); }

std::string DeviceAllocators::report() const {
  std::size_t private_pools = 0;
  std::size_t retired_pools = 0;
  {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    private_pools = private_pools_.size();
    retired_pools = retired_pools_.size();
  }
  std::string text = "vramledger: CUDA device " + std::to_string(device_) + ", backend " +
                     backend_->info().name + (paged_ ? " (paged heap)" : " (segment heap)") +
                     ", " + std::to_string(private_pools) + " private pools in use, " +
                     std::to_string(retired_pools) + " released but still holding blocks\n";
  auto lock = gate_.lock();
  text += counters_report(ledger_);
  return text;
}

void DeviceAllocators::defer_free(void* ptr) {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  deferred_frees_.push_back(ptr);
}

std::vector<void*> DeviceAllocators::take_deferred_frees() {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  return std::exchange(deferred_frees_, {});
}

}  // namespace vramledger::torch_plugin
