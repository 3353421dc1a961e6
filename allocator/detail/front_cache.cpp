// Front caches: each thread keeps the blocks it freed, by stream and exact size, and hands them
// out again without the allocator's lock (thread_cache.hpp; docs/design.md, 5.2). A warm pair
// is then one uncontended lock, a pop and a push, and the ledger shard's update of this thread's
// own counters (accounting/ledger_shard.hpp).
//
// Which lock guards what: a cache's bins and its map are under its mutex(); a Block's fields,
// Block::front included, under its stream's lock, which the allocator's mutex_ includes (a miss
// adopts its block on the per-stream fast path, detail/stream_fast_path.cpp). Only the owning
// thread parks and pops; everything that reaches into another thread's cache (flushes, the
// census, a free or record_stream from another thread, retiring) holds mutex_ first.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "allocator/detail/policy_state.hpp"

namespace vramledger {
// Named, not anonymous: the inline member functions below (external linkage) use these.
namespace front_cache_detail {

// This thread's caches by allocator id: what the hot path scans. Zero-initialised plain data,
// so reaching it costs no guard check.
struct FrontLookup {
  std::array<std::uint64_t, 4> ids;
  std::array<ThreadCache*, 4> caches;
  std::size_t next;
};
thread_local FrontLookup t_front_lookup{};

// Which allocators are alive, so that a thread's exit returns its caches only to those. Thread
// exit and allocator destruction both hold this mutex (then the allocator's own).
struct FrontLifetime {
  std::mutex mutex;
  std::unordered_map<std::uint64_t, void*> live;  // front id -> Impl
};
FrontLifetime& front_lifetime() {
  static FrontLifetime lifetime;
  return lifetime;
}

using RetireFn = void (*)(void* impl, const std::shared_ptr<ThreadCache>& cache);

// Owns this thread's caches; at thread exit gives each back to its allocator, if still alive.
struct FrontHolder {
  struct Entry {
    std::uint64_t id;
    std::shared_ptr<ThreadCache> cache;
    void* impl;
    RetireFn retire;
  };
  std::vector<Entry> entries;

  FrontHolder() = default;
  FrontHolder(const FrontHolder&) = delete;
  FrontHolder& operator=(const FrontHolder&) = delete;
  ~FrontHolder() {
    FrontLifetime& lifetime = front_lifetime();
    std::lock_guard lock(lifetime.mutex);
    for (const Entry& entry : entries) {
      if (lifetime.live.count(entry.id) != 0) entry.retire(entry.impl, entry.cache);
    }
  }
};
thread_local FrontHolder t_front_holder;

inline AllocatorEvent front_event(EventKind kind, const FrontBlock& front) {
  AllocatorEvent event{kind};
  event.pool = front.pool;
  event.tag = kUntagged;
  event.stream = front.stream;
  event.address = front.address;
  event.size = front.size;
  event.requested = front.requested;
  return event;
}

}  // namespace front_cache_detail

using namespace front_cache_detail;

inline std::uint64_t CachingAllocator::Impl::next_front_id() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

inline void CachingAllocator::Impl::retire_front_cache_of(
    void* impl, const std::shared_ptr<ThreadCache>& cache) {
  static_cast<Impl*>(impl)->retire_front_cache(cache);
}

inline ThreadCache* CachingAllocator::Impl::front_cache_if_any() const {
  for (std::size_t i = 0; i < t_front_lookup.ids.size(); ++i) {
    if (t_front_lookup.ids[i] == front_id_) return t_front_lookup.caches[i];
  }
  for (const FrontHolder::Entry& entry : t_front_holder.entries) {
    if (entry.id == front_id_) return entry.cache.get();
  }
  return nullptr;
}

// This thread's cache, made on first use; null when the observer refuses a shard.
inline ThreadCache* CachingAllocator::Impl::front_cache_of_thread() {
  for (std::size_t i = 0; i < t_front_lookup.ids.size(); ++i) {
    if (t_front_lookup.ids[i] == front_id_) [[likely]] return t_front_lookup.caches[i];
  }
  return make_front_cache_of_thread();
}

// Out of the hot path: the thread's cache is not in the lookup array yet (or any more).
ThreadCache* CachingAllocator::Impl::make_front_cache_of_thread() {
  ThreadCache* found = front_cache_if_any();
  if (found == nullptr) {
    FrontLifetime& lifetime = front_lifetime();
    std::lock_guard lifetime_lock(lifetime.mutex);
    // Forget caches of allocators destroyed since.
    auto& entries = t_front_holder.entries;
    std::erase_if(entries, [&](const FrontHolder::Entry& entry) {
      return lifetime.live.count(entry.id) == 0;
    });
    std::lock_guard lock(mutex_);
    lifetime.live.emplace(front_id_, this);
    std::shared_ptr<ThreadCache> cache;
    {
      std::lock_guard registry(front_mutex_);
      for (const auto& candidate : front_caches_) {
        if (!candidate->in_use) {
          cache = candidate;  // a retired thread's, empty
          break;
        }
      }
      if (cache == nullptr) cache = front_caches_.emplace_back(std::make_shared<ThreadCache>());
      cache->in_use = true;
    }
    cache->max_parked_bytes = options_.front_cache_bytes;
    if (observer_ != nullptr) {
      cache->shard = observer_->open_shard();
      if (cache->shard == nullptr) {
        std::lock_guard registry(front_mutex_);
        cache->in_use = false;
        return nullptr;
      }
    }
    {
      BiasedMutex& mutex = cache->mutex();
      std::lock_guard bias_lock(mutex);
      mutex.bias_to_this_thread();
    }
    entries.push_back({front_id_, cache, this, &Impl::retire_front_cache_of});
    found = cache.get();
  }
  const std::size_t slot = t_front_lookup.next++ % t_front_lookup.ids.size();
  t_front_lookup.ids[slot] = front_id_;
  t_front_lookup.caches[slot] = found;
  return found;
}

inline DevicePtr CachingAllocator::Impl::front_allocate(std::size_t bytes, StreamHandle stream,
                                                        TagId tag, std::size_t block_bytes) {
  if (!front_enabled_ || tag != kUntagged) return allocate(bytes, stream, tag, block_bytes);
  const std::size_t size = request_size(bytes, block_bytes);
  if (size > front_max_block_) return allocate(bytes, stream, tag, block_bytes);
  ThreadCache* cache = front_cache_of_thread();
  if (cache == nullptr) return allocate(bytes, stream, tag, block_bytes);
  if (cache->has_parked()) {
    BiasedMutex& mutex = cache->mutex();
    mutex.lock_as_owner();
    if (FrontBlock* front = cache->pop(stream, size)) {
      front->requested = bytes;
      const AllocatorEvent event = front_event(EventKind::kAlloc, *front);
      ObserverShard* shard = cache->shard;
      if (shard == nullptr || shard->try_apply(event)) [[likely]] {
        mutex.unlock_as_owner();
        return event.address;
      }
      // Past this shard's credit: the ledger's slow path. The block is this thread's already
      // (unparked), so nobody else can touch it meanwhile.
      cache->note_slow_hit();
      mutex.unlock_as_owner();
      shard->apply_slow(event);
      return event.address;
    }
    mutex.unlock_as_owner();
  }
  // A miss: the heaps, as allocate() asks them; the block is managed by this cache from now on
  // if worth it. (The adoption's bookkeeping is this thread's alone: no lock.) A shedding cache
  // serves nothing: its parked blocks go back too, before the heap looks for memory they hold
  // (on the VMM backend they would otherwise cost new pages and mappings).
  const bool adopt = cache->worth_adopting(size);
  const std::uint32_t slow_before = t_stream_shard_slow_paths;
  const DevicePtr address = allocate_from_heaps(bytes, size, stream, tag, cache, adopt,
                                                cache->shedding() && cache->has_parked());
  if (t_stream_shard_slow_paths != slow_before) [[unlikely]] cache->note_slow_miss();
  return address;
}

// Under the block's stream lock (or the allocator's): `block`, just handed out, is managed by
// `cache` from now on.
inline void CachingAllocator::Impl::adopt_front_block(ThreadCache& cache, Block* block,
                                                      std::size_t bytes, StreamHandle stream) {
  OwnerLock cache_lock(cache.mutex());  // a miss of this thread's
  FrontBlock* front = cache.entries.create();
  front->block = block;
  front->address = block->address;
  front->size = block->size;
  front->requested = bytes;
  front->stream = stream;
  front->pool = block->range->pool;
  front->parked = false;
  cache.manage(block->address, front);
  block->front = &cache;
}

inline void CachingAllocator::Impl::front_deallocate(DevicePtr ptr) {
  if (!front_enabled_) return deallocate(ptr);
  ThreadCache* cache = front_cache_if_any();
  if (cache != nullptr && cache->manages_any()) {
    BiasedMutex& mutex = cache->mutex();
    mutex.lock_as_owner();
    if (FrontBlock* front = cache->blocks.find(ptr)) {
      if (front->parked) {
        mutex.unlock_as_owner();
        throw Error(ErrorCode::kDoubleFree, "pointer " + format_hex(ptr) + " was already freed");
      }
      if (cache->shedding()) [[unlikely]] {
        // The shard's hits cost more than they save (ThreadCache::note_slow_hit): the heap frees
        // it, as a block of another thread's cache. Only this thread can free it meanwhile.
        mutex.unlock_as_owner();
        return deallocate(ptr);
      }
      const AllocatorEvent event = front_event(EventKind::kFree, *front);
      ObserverShard* shard = cache->shard;
      if (shard != nullptr && !shard->try_apply(event)) [[unlikely]] {
        mutex.unlock_as_owner();
        shard->apply_slow(event);  // counted free before it can be popped again
        mutex.lock_as_owner();
      }
      ThreadCache::Evicted evicted;
      if (cache->park(front, evicted)) [[likely]] {
        if (evicted.count == 0) [[likely]] {
          mutex.unlock_as_owner();
          return;
        }
        // Its bin went to this size: the blocks of the size before go back to their heaps.
        std::array<Block*, ThreadCache::kDepth> returning{};
        for (std::size_t i = 0; i < evicted.count; ++i) {
          returning[i] = evicted.blocks[i]->block;
          cache->forget(evicted.blocks[i]->address);
          cache->entries.destroy(evicted.blocks[i]);
        }
        mutex.unlock_as_owner();
        std::lock_guard lock(mutex_);
        for (std::size_t i = 0; i < evicted.count; ++i) return_front_block_locked(returning[i]);
        return;
      }
      // No room in this thread's bins: back to its heap.
      Block* block = front->block;
      cache->forget(ptr);
      cache->entries.destroy(front);
      mutex.unlock_as_owner();
      std::lock_guard lock(mutex_);
      return_front_block_locked(block);
      return;
    }
    mutex.unlock_as_owner();
  }
  deallocate(ptr);  // a block of no front cache, or of another thread's (frees.cpp)
}

// `block`, parked and already taken out of its cache, goes back to its heap. The ledger counted
// it free at the user's free; the heap's event changes only the inactive split it carries.
inline void CachingAllocator::Impl::return_front_block_locked(Block* block) {
  block->front = nullptr;
  live_.erase(block->address);
  returning_front_block_ = true;
  struct Reset {
    bool& flag;
    ~Reset() { flag = false; }
  } reset{returning_front_block_};
  complete_free(block, EventKind::kFree);
}

// A held block leaves its front cache for good and becomes the heap's own (a free or
// record_stream from another thread, its thread's exit). Throws kDoubleFree for a parked one.
inline FrontBlock CachingAllocator::Impl::detach_front_block_locked(Block* block,
                                                                    const char* action) {
  ThreadCache& cache = *block->front;
  FrontBlock detached;
  {
    std::lock_guard cache_lock(cache.mutex());
    FrontBlock* front = cache.blocks.find(block->address);
    if (front == nullptr) {
      throw Error(ErrorCode::kInternal, std::string(action) + " on " +
                                            format_hex(block->address) +
                                            ": its front cache is returning it");
    }
    if (front->parked) {
      throw Error(ErrorCode::kDoubleFree, std::string(action) + " on " +
                                              format_hex(block->address) +
                                              ", which was already freed");
    }
    detached = *front;
    cache.forget(block->address);
    cache.entries.destroy(front);
  }
  block->front = nullptr;
  block->requested = detached.requested;  // what the ledger counted at the last allocation
  // The allocation the shard counted must reach the trace before the heap's free of it.
  if (cache.shard != nullptr) cache.shard->publish();
  return detached;
}

inline void CachingAllocator::Impl::front_detach(DevicePtr ptr) {
  if (!front_enabled_) return;
  std::lock_guard lock(mutex_);
  Block* block = live_.find(ptr);
  if (block != nullptr && block->front != nullptr && block->state == BlockState::kAllocated) {
    detach_front_block_locked(block, "record_stream");
  }
}

inline void CachingAllocator::Impl::flush_front_caches() {
  if (!front_enabled_) return;
  std::lock_guard lock(mutex_);
  flush_front_caches_locked(nullptr);
}

// Every parked block of one cache back to its heap.
inline void CachingAllocator::Impl::return_parked_locked(ThreadCache& cache) {
  std::vector<Block*> returning;
  {
    std::lock_guard cache_lock(cache.mutex());
    cache.unpark_all(nullptr, [&](FrontBlock* front) {
      returning.push_back(front->block);
      cache.forget(front->address);
      cache.entries.destroy(front);
    });
  }
  for (Block* block : returning) return_front_block_locked(block);
}

// Under the allocator's lock, before its heap grows: the stream's parked blocks back to their
// heaps; how many went. Most growth finds nothing parked (the mixed ring's caches shed): the
// caches' hints say so without the registry's mutex or any cache's (front_caches_ changes only
// under the allocator's lock). A block parked meanwhile is as if parked just after.
inline std::size_t CachingAllocator::Impl::return_parked_before_growth_locked(StreamHandle stream) {
  if (!front_enabled_) return 0;
  const bool any = std::any_of(front_caches_.begin(), front_caches_.end(),
                               [](const auto& cache) { return cache->has_parked(); });
  return any ? flush_front_caches_locked(&stream) : 0;
}

// Every parked block (of `stream` only, unless null) back to its heap; how many went.
inline std::size_t CachingAllocator::Impl::flush_front_caches_locked(const StreamHandle* stream) {
  if (!front_enabled_) return 0;
  std::vector<Block*> returning;
  {
    std::lock_guard registry(front_mutex_);
    for (const auto& cache : front_caches_) {
      std::lock_guard cache_lock(cache->mutex());
      cache->unpark_all(stream, [&](FrontBlock* front) {
        returning.push_back(front->block);
        cache->forget(front->address);
        cache->entries.destroy(front);
      });
    }
  }
  for (Block* block : returning) return_front_block_locked(block);
  return returning.size();
}

// A thread's cache at its exit (or the allocator's end): parked blocks back to their heaps,
// held ones the heaps' own, the ledger shard folded and closed; the cache waits for reuse.
inline void CachingAllocator::Impl::retire_front_cache_locked(ThreadCache& cache) {
  std::vector<Block*> returning;
  ObserverShard* shard = nullptr;
  {
    std::lock_guard registry(front_mutex_);
    std::lock_guard cache_lock(cache.mutex());
    cache.unpark_all(nullptr, [&](FrontBlock* front) {
      returning.push_back(front->block);
      cache.forget(front->address);
      cache.entries.destroy(front);
    });
    std::vector<FrontBlock*> held;
    cache.blocks.for_each([&](FrontBlock* front) { held.push_back(front); });
    for (FrontBlock* front : held) {
      front->block->front = nullptr;
      front->block->requested = front->requested;
      cache.forget(front->address);
      cache.entries.destroy(front);
    }
    cache.reset();
    cache.mutex().unbias();  // its thread is leaving; the next one biases it to itself
    shard = cache.shard;
    cache.in_use = false;
  }
  for (Block* block : returning) return_front_block_locked(block);
  if (shard != nullptr) {
    cache.shard = nullptr;  // its mutex is the shard's: nobody holds it now (mutex_ is ours)
    observer_->close_shard(shard);
  }
}

inline void CachingAllocator::Impl::retire_front_cache(const std::shared_ptr<ThreadCache>& cache) {
  std::lock_guard lock(mutex_);
  retire_front_cache_locked(*cache);
}

inline void CachingAllocator::Impl::retire_front_caches() {
  if (!front_enabled_) return;
  FrontLifetime& lifetime = front_lifetime();
  std::lock_guard lifetime_lock(lifetime.mutex);
  lifetime.live.erase(front_id_);
  std::lock_guard lock(mutex_);
  for (const auto& cache : front_caches_) {
    try {
      retire_front_cache_locked(*cache);
    } catch (...) {
      // Best effort, as the rest of the teardown: the device may be gone.
    }
  }
}

}  // namespace vramledger
