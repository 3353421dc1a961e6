// Physical memory and address space of the simulated device: cudaMalloc-style segments, VMM
// physical handles, reserved address ranges and the page mappings between them.
//
// It enforces what the real driver enforces and rejects a bad request without changing anything.
// Every caller mistake (malformed size, misaligned or unknown address, unknown handle, a state
// conflict such as a page already mapped) is reported as kInvalidArgument, as the driver reports
// CUDA_ERROR_INVALID_VALUE; lack of memory or address space is kOutOfMemory.
//
// Addresses come from one cursor that only moves up, with an unused granule between any two
// regions, so no address is ever handed out twice and a stale or overrunning pointer never lands
// in live memory. Not synchronised: SimulatedDevice calls it under its own lock.
#pragma once

#include <cstddef>
#include <map>
#include <span>
#include <unordered_map>
#include <vector>

#include "allocator/device_backend.hpp"
#include "allocator/simulated/simulated_device_options.hpp"

namespace vramledger {

class SimulatedMemory {
 public:
  // Where the address cursor starts: a typical CUDA device address on x86-64 Linux.
  static constexpr DevicePtr kFirstAddress = 0x7f0000000000;
  static constexpr PhysicalHandle kFirstPhysicalHandle = 0x9000'0001;

  // Throws Error(kInvalidArgument) for a granularity that is not a power of two or a zero
  // segment_rounding.
  explicit SimulatedMemory(const SimulatedDeviceOptions& options);

  Status allocate_segment(std::size_t bytes, DevicePtr* out);
  // `bytes` must be the size the segment was allocated with.
  Status free_segment(DevicePtr ptr, std::size_t bytes);

  Status create_physical(std::size_t bytes, PhysicalHandle* out);
  Status release_physical(PhysicalHandle handle);
  Status reserve_address_range(std::size_t bytes, DevicePtr* out);
  Status free_address_range(DevicePtr base, std::size_t bytes);
  Status map_pages(DevicePtr va, std::size_t page_bytes, std::span<const PhysicalHandle> handles);
  Status unmap_pages(DevicePtr va, std::size_t page_bytes, std::size_t count);

  // True when every byte of [ptr, ptr + bytes) lies in a live segment's requested bytes or in a
  // mapped page. An empty range touches no memory and is accessible.
  bool is_range_accessible(DevicePtr ptr, std::size_t bytes) const;

  // The memory behind the accessible parts of [ptr, ptr + bytes): pieces of physical handles
  // (offsets into the handle) or of segments (offsets into the segment), whatever address
  // they are reached through — so memory aliased at two addresses is recognised as the same.
  struct MemoryPiece {
    std::uint64_t owner = 0;  // a PhysicalHandle, or a segment's base address
    std::size_t begin = 0;
    std::size_t end = 0;
  };
  std::vector<MemoryPiece> memory_behind(DevicePtr ptr, std::size_t bytes) const;

  std::size_t capacity_bytes() const { return capacity_bytes_; }
  // Segment bytes after rounding plus every physical handle, mapped or not.
  std::size_t physical_bytes_in_use() const { return physical_bytes_in_use_; }
  std::size_t mapped_bytes() const { return mapped_bytes_; }
  // Address space held by reserve_address_range (segments not included).
  std::size_t reserved_address_bytes() const { return reserved_address_bytes_; }
  std::size_t segment_count() const { return segments_.size(); }
  std::size_t physical_handle_count() const { return physical_.size(); }
  std::size_t address_range_count() const { return ranges_.size(); }

 private:
  struct Segment {
    std::size_t bytes = 0;          // as requested: the accessible part
    std::size_t charged_bytes = 0;  // after segment_rounding: what capacity pays
  };
  struct AddressRange {
    std::size_t bytes = 0;
    std::size_t mapped_bytes = 0;
  };
  struct Mapping {
    std::size_t bytes = 0;
    PhysicalHandle handle = 0;
    DevicePtr range_base = 0;
  };
  struct Physical {
    std::size_t bytes = 0;
    std::size_t mappings = 0;  // addresses it is mapped at (more than 1 only when aliasing)
    DevicePtr mapped_at = 0;   // the latest of them
  };

  // Ok when `bytes` more of physical memory fit, else why they do not.
  Status check_capacity(std::size_t bytes, const char* what) const;
  // Hands out a fresh, never-used address region of at least `bytes`.
  Status take_addresses(std::size_t bytes, const char* what, DevicePtr* out);
  // The reserved range holding all of [va, va + bytes), or ranges_.end().
  std::map<DevicePtr, AddressRange>::iterator range_containing(DevicePtr va, std::size_t bytes);
  bool overlaps_mapping(DevicePtr va, std::size_t bytes) const;

  const std::size_t capacity_bytes_;
  const std::size_t granularity_;
  const std::size_t segment_rounding_;
  const bool allow_aliased_mappings_;

  DevicePtr next_address_ = kFirstAddress;
  PhysicalHandle next_handle_ = kFirstPhysicalHandle;

  std::map<DevicePtr, Segment> segments_;
  std::map<DevicePtr, AddressRange> ranges_;
  std::map<DevicePtr, Mapping> mappings_;  // by page address; pages never overlap
  std::unordered_map<PhysicalHandle, Physical> physical_;

  std::size_t physical_bytes_in_use_ = 0;
  std::size_t mapped_bytes_ = 0;
  std::size_t reserved_address_bytes_ = 0;
};

}  // namespace vramledger
