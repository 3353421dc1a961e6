#include "allocator/simulated/simulated_memory.hpp"

#include <algorithm>
#include <limits>
#include <string>

#include "allocator/simulated/text_format.hpp"

namespace vramledger {

using simulated_detail::byte_count;
using simulated_detail::hex_address;

namespace {

constexpr std::size_t kMaxSize = std::numeric_limits<std::size_t>::max();

// value rounded up to a multiple of `multiple` (> 0); false when that does not fit.
bool round_up(std::size_t value, std::size_t multiple, std::size_t* out) {
  const std::size_t remainder = value % multiple;
  if (remainder == 0) {
    *out = value;
    return true;
  }
  const std::size_t missing = multiple - remainder;
  if (value > kMaxSize - missing) return false;
  *out = value + missing;
  return true;
}

Status invalid(std::string message) {
  return {ErrorCode::kInvalidArgument, std::move(message)};
}

std::string handle_text(PhysicalHandle handle) {
  return "physical handle " + hex_address(handle);
}

}  // namespace

SimulatedMemory::SimulatedMemory(const SimulatedDeviceOptions& options)
    : capacity_bytes_(options.capacity_bytes),
      granularity_(options.granularity),
      segment_rounding_(options.segment_rounding),
      allow_aliased_mappings_(options.allow_aliased_mappings) {
  if (granularity_ == 0 || (granularity_ & (granularity_ - 1)) != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "simulated device: granularity must be a power of two, got " +
                    std::to_string(granularity_));
  }
  if (segment_rounding_ == 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "simulated device: segment_rounding must be positive (1 = no rounding)");
  }
}

Status SimulatedMemory::check_capacity(std::size_t bytes, const char* what) const {
  const std::size_t free_bytes = capacity_bytes_ - physical_bytes_in_use_;
  if (bytes <= free_bytes) return Status::ok();
  return {ErrorCode::kOutOfMemory, std::string(what) + " needs " + byte_count(bytes) +
                                       " but only " + byte_count(free_bytes) + " of " +
                                       byte_count(capacity_bytes_) +
                                       " are free on the simulated device (" +
                                       byte_count(physical_bytes_in_use_) + " in use)"};
}

Status SimulatedMemory::take_addresses(std::size_t bytes, const char* what, DevicePtr* out) {
  std::size_t region = 0;
  // One spare granule after each region keeps regions apart, so overruns are caught.
  const bool fits =
      round_up(bytes, granularity_, &region) && region <= kMaxSize - granularity_ &&
      next_address_ <= std::numeric_limits<DevicePtr>::max() - (region + granularity_);
  if (!fits) {
    return {ErrorCode::kOutOfMemory, std::string(what) + " of " + byte_count(bytes) +
                                         ": the simulated virtual address space is exhausted"};
  }
  *out = next_address_;
  next_address_ += region + granularity_;
  return Status::ok();
}

// --- Segments ---

Status SimulatedMemory::allocate_segment(std::size_t bytes, DevicePtr* out) {
  if (bytes == 0) return invalid("allocate_segment of 0 bytes");
  std::size_t charged = 0;
  if (!round_up(bytes, segment_rounding_, &charged)) {
    return {ErrorCode::kOutOfMemory,
            "allocate_segment of " + byte_count(bytes) + " exceeds any device capacity"};
  }
  if (Status status = check_capacity(charged, "allocate_segment"); !status) return status;
  DevicePtr base = 0;
  if (Status status = take_addresses(charged, "allocate_segment", &base); !status) return status;
  segments_.emplace(base, Segment{bytes, charged});
  physical_bytes_in_use_ += charged;
  *out = base;
  return Status::ok();
}

Status SimulatedMemory::free_segment(DevicePtr ptr, std::size_t bytes) {
  auto it = segments_.find(ptr);
  if (it == segments_.end()) {
    auto after = segments_.upper_bound(ptr);
    if (after != segments_.begin()) {
      auto holder = std::prev(after);
      if (ptr - holder->first < holder->second.bytes) {
        return invalid("free_segment(" + hex_address(ptr) +
                       "): address lies inside the segment at " + hex_address(holder->first) +
                       ", not at its start");
      }
    }
    return invalid("free_segment(" + hex_address(ptr) +
                   "): no live segment starts there (never allocated or already freed)");
  }
  if (it->second.bytes != bytes) {
    return invalid("free_segment(" + hex_address(ptr) + ") was told " + byte_count(bytes) +
                   " but the segment was allocated with " + byte_count(it->second.bytes));
  }
  physical_bytes_in_use_ -= it->second.charged_bytes;
  segments_.erase(it);
  return Status::ok();
}

// --- Physical handles ---

Status SimulatedMemory::create_physical(std::size_t bytes, PhysicalHandle* out) {
  if (bytes == 0 || bytes % granularity_ != 0) {
    return invalid("create_physical of " + byte_count(bytes) +
                   ": size must be a positive multiple of the granularity, " +
                   byte_count(granularity_));
  }
  if (Status status = check_capacity(bytes, "create_physical"); !status) return status;
  const PhysicalHandle handle = next_handle_++;
  physical_.emplace(handle, Physical{bytes, false, 0});
  physical_bytes_in_use_ += bytes;
  *out = handle;
  return Status::ok();
}

Status SimulatedMemory::release_physical(PhysicalHandle handle) {
  auto it = physical_.find(handle);
  if (it == physical_.end()) {
    return invalid("release_physical: unknown " + handle_text(handle) +
                   " (never created or already released)");
  }
  if (it->second.mappings != 0) {
    return invalid("release_physical: " + handle_text(handle) + " is still mapped at " +
                   hex_address(it->second.mapped_at) + "; unmap it first");
  }
  physical_bytes_in_use_ -= it->second.bytes;
  physical_.erase(it);
  return Status::ok();
}

// --- Address ranges ---

Status SimulatedMemory::reserve_address_range(std::size_t bytes, DevicePtr* out) {
  if (bytes == 0 || bytes % granularity_ != 0) {
    return invalid("reserve_address_range of " + byte_count(bytes) +
                   ": size must be a positive multiple of the granularity, " +
                   byte_count(granularity_));
  }
  DevicePtr base = 0;
  if (Status status = take_addresses(bytes, "reserve_address_range", &base); !status) {
    return status;
  }
  ranges_.emplace(base, AddressRange{bytes, 0});
  reserved_address_bytes_ += bytes;
  *out = base;
  return Status::ok();
}

Status SimulatedMemory::free_address_range(DevicePtr base, std::size_t bytes) {
  auto it = ranges_.find(base);
  if (it == ranges_.end()) {
    auto holder = range_containing(base, 1);
    if (holder != ranges_.end()) {
      return invalid("free_address_range(" + hex_address(base) +
                     "): address lies inside the range at " + hex_address(holder->first) +
                     "; only a whole range can be freed");
    }
    return invalid("free_address_range(" + hex_address(base) +
                   "): no reserved range starts there (never reserved or already freed)");
  }
  if (it->second.bytes != bytes) {
    return invalid("free_address_range(" + hex_address(base) + ") was told " + byte_count(bytes) +
                   " but the range has " + byte_count(it->second.bytes) +
                   "; only a whole range can be freed");
  }
  if (it->second.mapped_bytes != 0) {
    return invalid("free_address_range(" + hex_address(base) + "): " +
                   byte_count(it->second.mapped_bytes) + " are still mapped in it; unmap first");
  }
  reserved_address_bytes_ -= bytes;
  ranges_.erase(it);
  return Status::ok();
}

std::map<DevicePtr, SimulatedMemory::AddressRange>::iterator SimulatedMemory::range_containing(
    DevicePtr va, std::size_t bytes) {
  auto after = ranges_.upper_bound(va);
  if (after == ranges_.begin()) return ranges_.end();
  auto holder = std::prev(after);
  const std::size_t offset = va - holder->first;
  if (offset >= holder->second.bytes || bytes > holder->second.bytes - offset) return ranges_.end();
  return holder;
}

bool SimulatedMemory::overlaps_mapping(DevicePtr va, std::size_t bytes) const {
  auto at_or_after = mappings_.lower_bound(va);
  if (at_or_after != mappings_.end() && at_or_after->first - va < bytes) return true;
  if (at_or_after == mappings_.begin()) return false;
  auto before = std::prev(at_or_after);
  return va - before->first < before->second.bytes;
}

// --- Mappings ---

Status SimulatedMemory::map_pages(DevicePtr va, std::size_t page_bytes,
                                  std::span<const PhysicalHandle> handles) {
  // Messages are built only on failure: mapping is on the policy's hot path.
  auto fail = [va](const std::string& why) {
    return invalid("map_pages(" + hex_address(va) + "): " + why);
  };
  if (handles.empty()) return fail("no handles to map");
  if (page_bytes == 0 || page_bytes % granularity_ != 0) {
    return fail("page size " + byte_count(page_bytes) +
                " is not a positive multiple of the granularity, " + byte_count(granularity_));
  }
  if (va % granularity_ != 0) {
    return fail("address is not aligned to the granularity, " + byte_count(granularity_));
  }
  if (handles.size() > kMaxSize / page_bytes) {
    return fail(std::to_string(handles.size()) + " pages of " + byte_count(page_bytes) +
                " overflow the address space");
  }
  const std::size_t total = handles.size() * page_bytes;
  auto range = range_containing(va, total);
  if (range == ranges_.end()) {
    return fail("the " + byte_count(total) +
                " to map do not lie inside one reserved address range");
  }
  if (overlaps_mapping(va, total))
    return fail("part of the " + byte_count(total) + " is already mapped");

  // Validate the handles, marking each as mapped on the way; on failure the marks are undone
  // and nothing has changed.
  std::size_t marked = 0;
  auto undo_marks = [&] {
    for (std::size_t j = 0; j < marked; ++j) --physical_.find(handles[j])->second.mappings;
  };
  for (std::size_t i = 0; i < handles.size(); ++i) {
    const PhysicalHandle handle = handles[i];
    auto which = [&] { return "handles[" + std::to_string(i) + "] = " + handle_text(handle); };
    auto it = physical_.find(handle);
    std::string problem;
    if (it == physical_.end()) {
      problem = which() + " is unknown (never created or released)";
    } else if (it->second.bytes != page_bytes) {
      problem = which() + " holds " + byte_count(it->second.bytes) + ", not the page size " +
                byte_count(page_bytes);
    } else if (it->second.mappings != 0) {
      // Marked earlier in this call? (Not "mapped_at lies in this run": mapped_at is the latest
      // of the handle's mappings, and may name an address since unmapped while an older
      // mapping of the handle lives on, as an old address awaiting its unmap does.)
      const bool marked_by_us =
          std::find(handles.begin(), handles.begin() + static_cast<std::ptrdiff_t>(i), handle) !=
          handles.begin() + static_cast<std::ptrdiff_t>(i);
      if (marked_by_us) {
        problem = which() + " appears twice in one call";
      } else if (!allow_aliased_mappings_) {
        problem = which() + " is already mapped at " + hex_address(it->second.mapped_at);
      }
    }
    if (!problem.empty()) {
      undo_marks();
      return fail(problem);
    }
    ++it->second.mappings;
    it->second.mapped_at = va + i * page_bytes;
    ++marked;
  }

  // Every check passed: record the whole run.
  auto hint = mappings_.lower_bound(va);
  for (std::size_t i = 0; i < handles.size(); ++i) {
    hint = std::next(mappings_.emplace_hint(hint, va + i * page_bytes,
                                            Mapping{page_bytes, handles[i], range->first}));
  }
  range->second.mapped_bytes += total;
  mapped_bytes_ += total;
  return Status::ok();
}

Status SimulatedMemory::unmap_pages(DevicePtr va, std::size_t page_bytes, std::size_t count) {
  auto fail = [va](const std::string& why) {
    return invalid("unmap_pages(" + hex_address(va) + "): " + why);
  };
  if (count == 0) return fail("count of 0 pages");
  if (page_bytes == 0) return fail("page size of 0 bytes");
  if (count > kMaxSize / page_bytes) {
    return fail(std::to_string(count) + " pages of " + byte_count(page_bytes) +
                " overflow the address space");
  }
  const auto first = mappings_.find(va);
  auto it = first;
  for (std::size_t i = 0; i < count; ++i, ++it) {
    const DevicePtr page = va + i * page_bytes;
    if (it == mappings_.end() || it->first != page) {
      return fail("no page is mapped at " + hex_address(page) + " (page " + std::to_string(i) +
                  " of " + std::to_string(count) + ")");
    }
    if (it->second.bytes != page_bytes) {
      return fail("the page at " + hex_address(page) + " was mapped with " +
                  byte_count(it->second.bytes) + ", not " + byte_count(page_bytes));
    }
  }
  // All pages are mapped and consecutive, hence in one range (ranges never touch each other).
  AddressRange& range = ranges_.find(first->second.range_base)->second;
  for (auto page = first; page != it; ++page) {
    --physical_.find(page->second.handle)->second.mappings;
  }
  mappings_.erase(first, it);
  const std::size_t total = count * page_bytes;
  range.mapped_bytes -= total;
  mapped_bytes_ -= total;
  return Status::ok();
}

// --- Queries ---

bool SimulatedMemory::is_range_accessible(DevicePtr ptr, std::size_t bytes) const {
  if (bytes == 0) return true;
  if (ptr > std::numeric_limits<DevicePtr>::max() - bytes) return false;
  const DevicePtr end = ptr + bytes;

  // Segments stand alone (a spare granule separates all regions), so one must hold it all.
  if (auto after = segments_.upper_bound(ptr); after != segments_.begin()) {
    const auto& [base, segment] = *std::prev(after);
    if (ptr - base < segment.bytes) return end - base <= segment.bytes;
  }

  auto after = mappings_.upper_bound(ptr);
  if (after == mappings_.begin()) return false;
  auto page = std::prev(after);
  if (ptr - page->first >= page->second.bytes) return false;
  DevicePtr covered_until = page->first + page->second.bytes;
  while (covered_until < end) {
    ++page;
    if (page == mappings_.end() || page->first != covered_until) return false;
    covered_until += page->second.bytes;
  }
  return true;
}

std::vector<SimulatedMemory::MemoryPiece> SimulatedMemory::memory_behind(DevicePtr ptr,
                                                                        std::size_t bytes) const {
  std::vector<MemoryPiece> pieces;
  if (bytes == 0 || ptr > std::numeric_limits<DevicePtr>::max() - bytes) return pieces;
  const DevicePtr end = ptr + bytes;
  if (auto after = segments_.upper_bound(ptr); after != segments_.begin()) {
    const auto& [base, segment] = *std::prev(after);
    if (ptr - base < segment.bytes) {
      pieces.push_back({base, ptr - base, std::min<DevicePtr>(end, base + segment.bytes) - base});
      return pieces;
    }
  }
  auto page = mappings_.upper_bound(ptr);
  if (page != mappings_.begin()) --page;
  for (; page != mappings_.end() && page->first < end; ++page) {
    const DevicePtr first = std::max(ptr, page->first);
    const DevicePtr last = std::min(end, page->first + page->second.bytes);
    if (first >= last) continue;
    pieces.push_back({page->second.handle, first - page->first, last - page->first});
  }
  return pieces;
}

}  // namespace vramledger
