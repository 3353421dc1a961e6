// The bottom layer: what the policy may ask of a device. Every real backend (cudaMalloc, VMM,
// cudaMallocAsync) and the simulated device implement this interface; the policy never calls
// CUDA itself.
//
// Contract for every method: on failure nothing changed (a backend rolls back its own partial
// work) and the returned Status says what failed in words a user can act on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "allocator/errors.hpp"

namespace vramledger {

using DevicePtr = std::uintptr_t;       // device virtual address
using StreamHandle = std::uintptr_t;    // cudaStream_t value; 0 is the legacy default stream
using EventHandle = std::uintptr_t;     // cudaEvent_t value (or a simulated id)
using PhysicalHandle = std::uint64_t;   // CUmemGenericAllocationHandle (or a simulated id)

enum class EventState { kComplete, kPending };

struct BackendInfo {
  std::string name;                 // "simulated", "cuda_malloc", "vmm", "malloc_async"
  int device = 0;
  std::size_t total_bytes = 0;      // device capacity
  // Physical page size of the VMM API, or the size to which the driver rounds segments.
  std::size_t granularity = 2u << 20;
  bool supports_virtual_memory = false;  // create/reserve/map API available
  // Physical memory may be mapped at two addresses at once (cuMemMap allows it): the paged
  // heap's alias_pending_pages and unmap_in_background rely on it.
  bool allows_second_mapping = false;
  bool stream_ordered_segments = false;  // free_segment is ordered on the given stream
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  virtual const BackendInfo& info() const = 0;
  // Device-wide free and total bytes, as cudaMemGetInfo reports them.
  virtual Status memory_info(std::size_t* free_bytes, std::size_t* total_bytes) = 0;

  // --- Segments: contiguous, mapped memory at a fixed address (every backend). ---
  virtual Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) = 0;
  virtual Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) = 0;

  // --- Virtual memory (supports_virtual_memory only; the defaults return kNotSupported). ---
  // Physical memory of `bytes` (a multiple of granularity), not yet mapped anywhere.
  virtual Status create_physical(std::size_t bytes, PhysicalHandle* out);
  virtual Status release_physical(PhysicalHandle handle);
  virtual Status reserve_address_range(std::size_t bytes, DevicePtr* out);
  virtual Status free_address_range(DevicePtr base, std::size_t bytes);
  // Maps handles[i] (each created with page_bytes) at va + i * page_bytes and grants the device
  // read/write access to the whole run. One call per run so a backend can batch the access call.
  virtual Status map_pages(DevicePtr va, std::size_t page_bytes,
                           std::span<const PhysicalHandle> handles);
  // Unmaps `count` consecutive pages that map_pages mapped. The caller has already made sure
  // no device work still touches them.
  virtual Status unmap_pages(DevicePtr va, std::size_t page_bytes, std::size_t count);

  // --- Other GPUs. ---
  // Lets `peer_device` read and write this backend's memory, all of it now and every mapping
  // made later (copies and kernels between GPUs). Plain cudaMalloc memory needs nothing beyond
  // cudaDeviceEnablePeerAccess, which the caller does: the default does nothing.
  virtual Status grant_peer_access(int peer_device);

  // --- Streams and events. ---
  virtual Status create_event(EventHandle* out) = 0;
  virtual Status destroy_event(EventHandle event) = 0;
  virtual Status record_event(EventHandle event, StreamHandle stream) = 0;
  virtual Status query_event(EventHandle event, EventState* state) = 0;
  virtual Status synchronize_event(EventHandle event) = 0;
  virtual Status stream_wait_event(StreamHandle stream, EventHandle event) = 0;
  virtual Status synchronize_device() = 0;

  // --- Sleep and wake (CachingAllocator::sleep / wake, docs/sleep.md). ---
  // Host memory the device copies to and from at full speed (pinned on CUDA). The defaults use
  // the C heap.
  virtual Status allocate_host(std::size_t bytes, void** out);
  virtual Status free_host(void* host);
  // Queues a copy between device memory (mapped, ours) and host memory; the bytes are in place
  // once synchronize_device() returns. The defaults return kNotSupported.
  virtual Status copy_to_host(void* host, DevicePtr device, std::size_t bytes);
  virtual Status copy_to_device(DevicePtr device, const void* host, std::size_t bytes);
  // Whether a CUDA graph capture is underway that memory operations must not disturb (a backend
  // that cannot tell says false; the torch plugin checks torch's own capture state as well).
  virtual bool capture_underway() const { return false; }

  // --- Segments that sleep (CachingAllocator::sleep_pool, docs/sleep.md: CUDA graph pools). ---
  // The memory under a whole segment goes back to the device while its address stays reserved
  // (the caller has waited for the device), and comes back at the same address with undefined
  // contents. Only SleepableSegmentBackend offers it; the defaults return kNotSupported.
  virtual Status release_segment_memory(DevicePtr ptr, std::size_t bytes);
  virtual Status restore_segment_memory(DevicePtr ptr, std::size_t bytes);
};

}  // namespace vramledger
