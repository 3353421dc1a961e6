// Tags say what an allocation is for ("weights", "kv_cache", ...). The ledger keeps counters per
// TagId in fixed arrays, so ids are small and bounded; names live here, once per process.
//
// Integrations pass current_tag() to CachingAllocator::allocate; code marks a region with a
// TagScope. The current tag is per thread, so scopes on one thread never leak into another.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "allocator/allocator_events.hpp"

namespace vramledger {

inline constexpr std::size_t kMaxTags = 1024;         // ids 0 .. kMaxTags-1
inline constexpr std::size_t kMaxTagNameBytes = 128;
inline constexpr TagId kWeightsTag = 1;
inline constexpr TagId kKvCacheTag = 2;
inline constexpr TagId kActivationsTag = 3;

// Process-wide, thread-safe. Registration takes a lock; looking a name up by id does not (names
// are written once, before their id is published, and never change).
class TagRegistry {
 public:
  static TagRegistry& global();

  // Returns the id of `name`, registering it if new. Throws Error(kInvalidArgument) for an empty
  // or over-long name, or when all kMaxTags ids are taken.
  TagId intern(std::string_view name);
  std::optional<TagId> find(std::string_view name) const;
  // "untagged" for 0, the registered name, or "tag#N" for an id nobody registered.
  std::string name(TagId id) const;
  std::size_t size() const noexcept { return published_.load(std::memory_order_acquire); }

  TagRegistry();
  TagRegistry(const TagRegistry&) = delete;
  TagRegistry& operator=(const TagRegistry&) = delete;

 private:
  mutable std::mutex mutex_;
  std::unordered_map<std::string, TagId> ids_by_name_;  // guarded by mutex_
  std::array<std::string, kMaxTags> names_;
  std::atomic<std::size_t> published_{0};  // names_[0 .. published_) are readable
};

TagId register_tag(std::string_view name);  // TagRegistry::global().intern(name)
std::string tag_name(TagId id);             // TagRegistry::global().name(id)

namespace detail {
inline thread_local TagId current_tag_of_thread = kUntagged;
}

// The tag of the innermost TagScope on this thread (kUntagged outside any scope).
inline TagId current_tag() noexcept { return detail::current_tag_of_thread; }

// Sets the current tag for this thread until destroyed, then restores the previous one. Scopes
// nest; they must be destroyed in reverse order of creation (automatic with block scope).
class [[nodiscard]] TagScope {
 public:
  explicit TagScope(TagId tag) noexcept : previous_(detail::current_tag_of_thread) {
    detail::current_tag_of_thread = tag;
  }
  explicit TagScope(std::string_view name) : TagScope(register_tag(name)) {}
  ~TagScope() { detail::current_tag_of_thread = previous_; }
  TagScope(const TagScope&) = delete;
  TagScope& operator=(const TagScope&) = delete;

 private:
  TagId previous_;
};

}  // namespace vramledger
