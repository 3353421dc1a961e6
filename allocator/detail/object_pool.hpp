// Recycles objects of one type without touching the heap on the hot path: objects are carved
// from chunks that live as long as the pool.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>
#include <vector>

namespace vramledger {

template <typename T, std::size_t kChunkSize = 256>
class ObjectPool {
 public:
  ObjectPool() = default;
  ObjectPool(const ObjectPool&) = delete;
  ObjectPool& operator=(const ObjectPool&) = delete;
  ~ObjectPool() {
    // Objects still handed out are owned by the caller's data structures, which are being torn
    // down with the pool; destroy the ones on the free list only.
    while (free_ != nullptr) {
      Slot* next = free_->next;
      free_->next = nullptr;
      free_ = next;
    }
  }

  template <typename... Args>
  T* create(Args&&... args) {
    if (free_ == nullptr) grow();
    Slot* slot = free_;
    free_ = slot->next;
    return ::new (static_cast<void*>(slot->storage)) T(std::forward<Args>(args)...);
  }

  void destroy(T* object) {
    object->~T();
    Slot* slot = reinterpret_cast<Slot*>(object);
    slot->next = free_;
    free_ = slot;
  }

 private:
  union Slot {
    Slot* next;
    alignas(T) unsigned char storage[sizeof(T)];
  };

  void grow() {
    auto chunk = std::make_unique<Slot[]>(kChunkSize);
    for (std::size_t i = 0; i < kChunkSize; ++i) {
      chunk[i].next = free_;
      free_ = &chunk[i];
    }
    chunks_.push_back(std::move(chunk));
  }

  Slot* free_ = nullptr;
  std::vector<std::unique_ptr<Slot[]>> chunks_;
};

}  // namespace vramledger
