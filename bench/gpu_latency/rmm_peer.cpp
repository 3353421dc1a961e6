// Compiled against RMM's headers and RMM's own CCCL (cuda/, cub/, thrust/), given as -isystem
// ahead of anything else (bench/gpu_latency/meson.build); linked with librmm.so, which carries
// its own static CUDA runtime. The two runtimes share the device's primary context, so streams
// and device pointers pass between them.
#include "bench/gpu_latency/rmm_peer.hpp"

#include <cuda/stream_ref>
#include <rmm/error.hpp>
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/version_config.hpp>

#include <chrono>
#include <exception>
#include <optional>
#include <string>

namespace vramledger::gpu_latency {
namespace {

constexpr std::size_t kGiB = std::size_t{1} << 30;

// RMM's own default alignment (rmm::CUDA_ALLOCATION_ALIGNMENT), what cudaMalloc gives at least.
// RMM's allocate and deallocate both take it; a block is freed with the alignment it was
// allocated with.
constexpr std::size_t kAlignment = 256;

// The pool starts empty and grows on demand (by the larger of the request and its current size,
// from cudaMalloc), as the other allocators do; no maximum. RMM accepts 0 (any multiple of 256:
// it then takes nothing from upstream until the first allocation).
constexpr std::size_t kPoolInitialBytes = 0;

// The arena takes its whole global arena from cudaMalloc when it is built and never grows; its
// default is half the device's free memory, which would starve the peers measured after it. 16
// GiB holds the largest live set of the cases with room to spare: the ring of 64 blocks of up to
// 4 MiB for each of 16 threads (at most 4 GiB) and the 256 MiB pairs.
constexpr std::size_t kArenaBytes = 16 * kGiB;

[[noreturn]] void throw_rmm(const char* call, std::size_t bytes, const char* what_kind,
                            const std::exception& error) {
  std::string message = std::string("RMM ") + call;
  if (bytes != 0) message += " for " + std::to_string(bytes) + " B";
  message += " failed (";
  message += what_kind;
  message += "): ";
  message += error.what();
  throw PeerError(message);
}

// Runs `body`, turning RMM's exceptions into PeerError naming `call` and `bytes`.
template <class Body>
auto translating(const char* call, std::size_t bytes, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const PeerError&) {
    throw;
  } catch (const rmm::out_of_memory& error) {
    throw_rmm(call, bytes, "rmm::out_of_memory", error);
  } catch (const rmm::bad_alloc& error) {
    throw_rmm(call, bytes, "rmm::bad_alloc", error);
  } catch (const rmm::logic_error& error) {
    throw_rmm(call, bytes, "rmm::logic_error", error);
  } catch (const rmm::cuda_error& error) {
    throw_rmm(call, bytes, "rmm::cuda_error", error);
  } catch (const std::exception& error) {
    throw_rmm(call, bytes, "std::exception", error);
  }
}

using Clock = std::chrono::steady_clock;

}  // namespace

// Exactly one of the two is set, by kind_. Both RMM resources share their state between copies
// (cuda::mr::shared_resource): this is the only copy, so destroying it releases the memory.
struct RmmPeer::Resources {
  std::optional<rmm::mr::pool_memory_resource> pool;
  std::optional<rmm::mr::arena_memory_resource> arena;
};

RmmPeer::RmmPeer(Kind kind) : kind_(kind), resources_(std::make_unique<Resources>()) {
  // The upstream is passed by value (RMM holds it in a cuda::mr::any_resource); a
  // cuda_memory_resource holds no state.
  if (kind_ == Kind::kPool) {
    translating("pool_memory_resource(cuda_memory_resource, initial 0)", 0, [&] {
      resources_->pool.emplace(rmm::mr::cuda_memory_resource{}, kPoolInitialBytes);
    });
  } else {
    translating("arena_memory_resource(cuda_memory_resource, 16 GiB)", kArenaBytes, [&] {
      resources_->arena.emplace(rmm::mr::cuda_memory_resource{}, kArenaBytes);
    });
  }
}

RmmPeer::~RmmPeer() = default;

void* RmmPeer::allocate(std::size_t bytes, cudaStream_t stream) {
  if (kind_ == Kind::kPool) {
    return translating("pool_memory_resource::allocate", bytes, [&] {
      return resources_->pool->allocate(cuda::stream_ref{stream}, bytes, kAlignment);
    });
  }
  return translating("arena_memory_resource::allocate", bytes, [&] {
    return resources_->arena->allocate(cuda::stream_ref{stream}, bytes, kAlignment);
  });
}

void RmmPeer::deallocate(void* ptr, std::size_t bytes, cudaStream_t stream) {
  // noexcept in RMM: a CUDA error on this path is only printed (asserted in RMM's debug builds),
  // so there is nothing to translate.
  if (kind_ == Kind::kPool) {
    resources_->pool->deallocate(cuda::stream_ref{stream}, ptr, bytes, kAlignment);
  } else {
    resources_->arena->deallocate(cuda::stream_ref{stream}, ptr, bytes, kAlignment);
  }
}

GrowthSample RmmPeer::grow_cold(std::size_t bytes, cudaStream_t stream) {
  if (kind_ != Kind::kPool) {
    throw PeerError("RMM arena: no growth case (its global arena is taken whole when built)");
  }
  GrowthSample sample;
  translating("growth: pool_memory_resource", bytes, [&] {
    rmm::mr::pool_memory_resource pool(rmm::mr::cuda_memory_resource{}, kPoolInitialBytes);
    const auto start = Clock::now();
    void* ptr = pool.allocate(cuda::stream_ref{stream}, bytes, kAlignment);
    sample.alloc_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    pool.deallocate(cuda::stream_ref{stream}, ptr, bytes, kAlignment);
  });  // ~pool_memory_resource: every block it took goes back with cudaFree
  return sample;
}

std::string RmmPeer::describe() const {
  if (kind_ == Kind::kPool) {
    return "RMM " RMM_VERSION
           " pool_memory_resource over cuda_memory_resource (initial 0, grows on demand, "
           "no maximum; alignment 256)";
  }
  return "RMM " RMM_VERSION
         " arena_memory_resource over cuda_memory_resource (global arena 16 GiB taken at "
         "construction; per-thread and per-stream arenas; alignment 256)";
}

}  // namespace vramledger::gpu_latency
