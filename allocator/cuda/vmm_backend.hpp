// Backend over the driver's virtual memory management API (cuMemCreate / cuMemMap): the policy
// creates physical pages itself, so reserved bytes are exactly the physical memory held, and a
// free page can be unmapped and mapped again under any other virtual range.
//
// Segments (allocate_segment) come from cudaMalloc so the interface is complete; the paged heap
// does not use them.
#pragma once

#include <atomic>
#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

#include "allocator/cuda/cuda_runtime_backend.hpp"
#include "allocator/cuda/vmm_properties.hpp"

namespace vramledger {

class VmmBackend final : public CudaRuntimeBackend {
 public:
  // How unmap_pages undoes a run of pages that were mapped one cuMemMap per page.
  enum class UnmapMode {
    kAuto,      // probe once at construction: batched when the driver accepts it, else per page
    kPerPage,   // one cuMemUnmap per page (always legal)
    kBatched,   // one cuMemUnmap over the whole run
  };

  // Throws Error(kNotSupported) when the device lacks VMM, Error otherwise when it is unusable.
  explicit VmmBackend(int device, UnmapMode unmap_mode = UnmapMode::kAuto);

  Status allocate_segment(std::size_t bytes, StreamHandle stream, DevicePtr* out) override;
  Status free_segment(DevicePtr ptr, std::size_t bytes, StreamHandle stream) override;

  Status create_physical(std::size_t bytes, PhysicalHandle* out) override;
  Status release_physical(PhysicalHandle handle) override;
  Status reserve_address_range(std::size_t bytes, DevicePtr* out) override;
  Status free_address_range(DevicePtr base, std::size_t bytes) override;
  // One cuMemMap per handle, then ONE cuMemSetAccess over the whole run. On failure the pages
  // this call mapped are unmapped again. Measured on the H200 (driver 580.159.04): cuMemMap costs
  // ~1 us per page, cuMemSetAccess ~23 us per separately mapped 2 MiB page whether it is called
  // once for the run or once per page — so mapping cost scales with the number of handles, and
  // only larger physical chunks make it cheaper (a 64 MiB chunk: ~47 us in all).
  //
  // Handles must come from create_physical: the driver does not validate them (a made-up handle
  // crashed the process inside cuMemRelease, measured), so neither can this backend.
  Status map_pages(DevicePtr va, std::size_t page_bytes,
                   std::span<const PhysicalHandle> handles) override;
  Status unmap_pages(DevicePtr va, std::size_t page_bytes, std::size_t count) override;

  // Whether unmap_pages uses one cuMemUnmap per run (decided by the mode and, for kAuto, the
  // probe). Measured on the H200: legal, but it saves only ~3% (32 pages: 463 us vs 477 us);
  // unmapping costs ~14 us per mapping either way.
  bool batched_unmap() const { return batched_unmap_; }
  const VmmProperties& properties() const { return props_; }

  // Sets read/write access for `peer_device` on every page mapped now, and includes it in the
  // access of every later mapping. Idempotent. Costs one cuMemSetAccess per run of contiguous
  // mappings.
  Status grant_peer_access(int peer_device) override;

  // Maps two pages separately, unmaps them with one cuMemUnmap, then checks that both virtual
  // pages are really free by mapping them again. *legal is false when the driver refuses the
  // batched call or leaves a page mapped. Holds 2 pages of memory for the duration.
  Status probe_batched_unmap(bool* legal);

 private:
  Status unmap_each(DevicePtr va, std::size_t page_bytes, std::size_t count);

  Status set_access_locked(DevicePtr va, std::size_t bytes) const;

  VmmProperties props_;
  // Pages are created exportable (POSIX fd) until the driver refuses once (create_physical).
  std::atomic<bool> exportable_{true};
  bool batched_unmap_ = false;
  // Guards the two below: a peer granted access while a run is being mapped must see it.
  mutable std::mutex access_mutex_;
  std::vector<CUmemAccessDesc> access_;          // this device first, then granted peers
  std::map<DevicePtr, std::size_t> mappings_;    // every live mapping: address -> bytes
};

}  // namespace vramledger
