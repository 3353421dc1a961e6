#include "accounting/tag_registry.hpp"

#include "allocator/errors.hpp"

namespace vramledger {

TagRegistry::TagRegistry() {
  // Fixed ids so that integrations and reports agree on them without a lookup.
  const std::array<std::string_view, 4> predefined = {"untagged", "weights", "kv_cache",
                                                      "activations"};
  for (std::size_t id = 0; id < predefined.size(); ++id) {
    names_[id] = std::string(predefined[id]);
    ids_by_name_.emplace(names_[id], static_cast<TagId>(id));
  }
  published_.store(predefined.size(), std::memory_order_release);
}

TagRegistry& TagRegistry::global() {
  // Never destroyed: threads may still leave TagScopes or print reports during exit.
  static TagRegistry* const registry = new TagRegistry();
  return *registry;
}

TagId TagRegistry::intern(std::string_view name) {
  if (name.empty()) throw Error(ErrorCode::kInvalidArgument, "tag name must not be empty");
  if (name.size() > kMaxTagNameBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                "tag name longer than " + std::to_string(kMaxTagNameBytes) + " bytes: '" +
                    std::string(name.substr(0, 32)) + "...'");
  }
  std::lock_guard lock(mutex_);
  if (const auto found = ids_by_name_.find(std::string(name)); found != ids_by_name_.end()) {
    return found->second;
  }
  const std::size_t id = published_.load(std::memory_order_relaxed);
  if (id >= kMaxTags) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot register tag '" + std::string(name) + "': all " +
                    std::to_string(kMaxTags) + " tag ids are in use");
  }
  names_[id] = std::string(name);
  ids_by_name_.emplace(names_[id], static_cast<TagId>(id));
  published_.store(id + 1, std::memory_order_release);
  return static_cast<TagId>(id);
}

std::optional<TagId> TagRegistry::find(std::string_view name) const {
  std::lock_guard lock(mutex_);
  const auto found = ids_by_name_.find(std::string(name));
  if (found == ids_by_name_.end()) return std::nullopt;
  return found->second;
}

std::string TagRegistry::name(TagId id) const {
  if (id < published_.load(std::memory_order_acquire)) return names_[id];
  return "tag#" + std::to_string(id);
}

TagId register_tag(std::string_view name) { return TagRegistry::global().intern(name); }

std::string tag_name(TagId id) { return TagRegistry::global().name(id); }

}  // namespace vramledger
