#include "torch_plugin/ipc_imports.hpp"

namespace vramledger::torch_plugin {

std::shared_ptr<void> ImportedMemory::open(int device, const IpcHandle& handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  Key key{device, static_cast<char>(handle.kind) + handle.payload};
  auto it = mappings_.find(key);
  if (it != mappings_.end()) {
    if (std::shared_ptr<void> shared = it->second.users.lock()) return shared;
    // Its last user is gone and its release waits for this lock: close it here (the driver
    // would refuse a second open of the same handle) and leave the release nothing to do.
    close_locked(it);
  }
  DevicePtr base = 0;
  std::size_t bytes = 0;
  const Status status = driver_.open(device, handle, &base, &bytes);
  if (!status.is_ok()) throw Error(status.code(), status.message());
  const std::uint64_t generation = next_generation_++;
  // The deleter only finds its entry again: the mapping is closed under the lock, so a later
  // open of the same handle never sees a half-closed one.
  std::shared_ptr<void> shared(reinterpret_cast<void*>(base), [this, key, generation](void*) {
    release(key, generation);
  });
  mappings_[key] = Mapping{shared, base, bytes, generation};
  ImportedFigures& figures = figures_[device];
  figures.bytes.increase(static_cast<std::int64_t>(bytes));
  figures.mappings.increase(1);
  return shared;
}

void ImportedMemory::release(const Key& key, std::uint64_t generation) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = mappings_.find(key);
  if (it == mappings_.end() || it->second.generation != generation) return;  // closed by open
  close_locked(it);
}

void ImportedMemory::close_locked(std::map<Key, Mapping>::iterator it) {
  const int device = it->first.first;
  const Mapping mapping = it->second;
  mappings_.erase(it);
  ImportedFigures& figures = figures_[device];
  // A refused close (the context is going away at exit, typically) is counted closed all the
  // same: the mapping cannot be used or closed again, and the driver drops it with the context.
  if (!driver_.close(device, mapping.base).is_ok()) ++figures.close_failures;
  figures.bytes.decrease(static_cast<std::int64_t>(mapping.bytes));
  figures.mappings.decrease(1);
}

ImportedFigures ImportedMemory::figures(int device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = figures_.find(device);
  return it == figures_.end() ? ImportedFigures{} : it->second;
}

void ImportedMemory::reset_peaks(int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  ImportedFigures& figures = figures_[device];
  figures.bytes.reset_peak();
  figures.mappings.reset_peak();
}

}  // namespace vramledger::torch_plugin
