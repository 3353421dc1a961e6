// The front cache of one thread for one allocator (docs/design.md, 5.2): the blocks it manages and
// the free ones among them ("parked"), binned by stream and exact size, so that a warm
// allocate/free pair of a repeated size takes one uncontended lock and touches only this
// thread's cache lines.
//
// A managed block is allocated from the heap's point of view (its Block stays allocated, its
// pages in use); the ledger counts a parked one as free (cached). Only the owning thread parks
// and pops; other threads, under the allocator's lock, flush parked blocks back to the heap
// (empty_cache, out-of-memory retry, release_stream), read them (census, segments) or take over
// a held block (a free from another thread, record_stream). Everything here is guarded by
// mutex(): the thread's ledger shard's mutex when the observer has shards, else its own. It is
// biased to the owning thread (allocator/biased_mutex.hpp), which takes it with OwnerLock.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "allocator/allocator_events.hpp"
#include "allocator/biased_mutex.hpp"
#include "allocator/detail/block.hpp"
#include "allocator/detail/block_address_map.hpp"
#include "allocator/detail/object_pool.hpp"

namespace vramledger {

// A block a front cache manages.
struct FrontBlock {
  Block* block = nullptr;     // the heap's; its fields are read only under the allocator's lock
  DevicePtr address = 0;
  std::size_t size = 0;       // the block's size
  std::size_t requested = 0;  // the user's request while held
  StreamHandle stream = 0;
  PoolKind pool = PoolKind::kSmall;
  bool parked = false;        // free from the user's view, waiting in a bin
};

class ThreadCache {
 public:
  static constexpr std::size_t kStreams = 4;  // streams with bins; others go to the heap
  static constexpr std::size_t kSizes = 16;   // distinct sizes binned per stream
  static constexpr std::size_t kDepth = 8;    // parked blocks per size

  ThreadCache() = default;
  ThreadCache(const ThreadCache&) = delete;
  ThreadCache& operator=(const ThreadCache&) = delete;

  BiasedMutex& mutex() noexcept { return shard != nullptr ? shard->mutex() : own_mutex_; }

  // A parked block of exactly `size` on `stream`, unparked; null when none.
  FrontBlock* pop(StreamHandle stream, std::size_t size) noexcept {
    StreamBins* bins = bins_of(stream);
    if (bins == nullptr) return nullptr;
    for (Bin& bin : bins->sizes) {
      if (bin.size != size || bin.count == 0) continue;
      FrontBlock* front = bin.blocks[--bin.count];
      front->parked = false;
      parked_bytes -= front->size;
      parked_changed();
      note_hit();
      streams_first_hit_ = !bins->hit;
      bins->hit = true;
      return front;
    }
    return nullptr;
  }

  // Blocks a park() pushed out of their bin to make room for another size.
  struct Evicted {
    std::array<FrontBlock*, kDepth> blocks{};
    std::size_t count = 0;
  };

  // Parks a held block. When its stream has no bin left for a new size, the parked blocks of
  // another size (round robin) are unparked into `evicted` (the caller takes them out of
  // `blocks` and returns them to their heaps), so the bins follow the sizes in use. False
  // (nothing changed) when the byte limit, the stream slots or the size's depth leave no room.
  bool park(FrontBlock* front, Evicted& evicted) noexcept {
    if (parked_bytes + front->size > max_parked_bytes) return false;
    StreamBins* bins = bins_of(front->stream);
    if (bins == nullptr) {
      if (streams_used_ < kStreams) {
        bins = &streams_[streams_used_++];
      } else {
        for (StreamBins& candidate : streams_) {  // a stream with nothing parked makes room
          bool idle = true;
          for (const Bin& bin : candidate.sizes) idle &= bin.count == 0;
          if (idle) {
            bins = &candidate;
            break;
          }
        }
        if (bins == nullptr) return false;
      }
      *bins = StreamBins{};
      bins->stream = front->stream;
    }
    Bin* target = nullptr;
    for (Bin& bin : bins->sizes) {
      if (bin.size == front->size) {
        if (bin.count == kDepth) return false;
        target = &bin;
        break;
      }
      if (bin.count == 0 && target == nullptr) target = &bin;
    }
    if (target == nullptr) {
      target = &bins->sizes[bins->next_victim++ % kSizes];
      for (std::uint32_t k = 0; k < target->count; ++k) {
        target->blocks[k]->parked = false;
        parked_bytes -= target->blocks[k]->size;
        evicted.blocks[evicted.count++] = target->blocks[k];
      }
      target->count = 0;
    }
    target->size = front->size;
    target->blocks[target->count++] = front;
    front->parked = true;
    parked_bytes += front->size;
    parked_changed();
    return true;
  }

  // After unpark_all(nullptr): forgets streams and sizes, for the next thread to use the cache.
  void reset() noexcept {
    streams_used_ = 0;
    recent_sizes_.fill(0);
    score_ = kInitialScore;
    escrow_ = kInitialScore;
    trial_interval_ = kFirstTrialInterval;
    in_trial_ = false;
  }

  // Whether a block of `size` the heaps just handed out should be managed here: the size was
  // asked for recently, and the bins have been serving requests. A workload of ever-new sizes
  // (a ring of random sizes) would otherwise fill the bins with blocks no request matches and pay
  // for parking and returning each of them; while pops mostly miss, only one miss in 16 adopts,
  // enough to notice when sizes start to repeat.
  bool worth_adopting(std::size_t size) noexcept {
    const std::size_t slot = static_cast<std::size_t>(((size >> 9) * 0x9E3779B97F4A7C15ull) >> 58);
    const bool seen = recent_sizes_[slot] == size;
    recent_sizes_[slot] = size;
    if (score_ > kMinScore) --score_;  // this request missed
    if (!seen) return false;
    if (shedding()) {
      // A trial now and then: the next hits show whether the ledger can count them cheaply again.
      // Each trial that ends in shedding again doubles the wait for the next: every block a
      // trial adopts is freed through the allocator's lock once the cache sheds again.
      if ((++probe_ & (trial_interval_ - 1)) != 0) return false;
      escrow_ = 0;
      in_trial_ = true;
      return true;
    }
    return score_ >= 0 || ++probe_ % 16 == 0;
  }
  void note_hit() noexcept {
    if (score_ < kMaxScore) ++score_;
    if (escrow_ < kMaxScore) ++escrow_;
    if (in_trial_ && escrow_ >= kInitialScore) {  // the trial succeeded: serving again
      in_trial_ = false;
      trial_interval_ = kFirstTrialInterval;
    }
  }

  // A hit the ledger's shard could not count within its credit took the ledger's slow path
  // (every shard's mutex; docs/design.md, 5.2): costlier than the heap's miss it saved. That
  // happens when the counters sit at their peaks, as a ring of live blocks keeps its count: the
  // escrow has no headroom to grant, and each hit and each heap allocation take it from the
  // other. While such hits outweigh the cheap ones (shedding()), the cache lets go of its
  // blocks as the user frees them (the heap frees them, counted by the ledger itself) and
  // adopts only a trial block now and then. Measured on the mixed ring (64 live blocks,
  // 512 B - 4 MiB, simulated device, one thread), before this: 16% of pairs took the shard's
  // slow path, 19% of heap allocations the ledger's exact path, and a pair cost 2-3x as much
  // as with front caches off.
  // A stream's first hit is exempt: the shard holds no credit for a stream it has not raised a
  // counter of yet, so that hit takes the slow path whatever the headroom (before, a thread's
  // first hits on two streams set its cache shedding at once).
  void note_slow_hit() noexcept {
    if (streams_first_hit_) return;
    note_slow_event();
  }
  // A miss whose allocation the stream's ledger shard could not count within its credit (the
  // per-stream fast path sent it down the ledger's slow path) weighs as a slow hit. A ring that
  // holds its count at the peak needs, at each allocation, exactly the credit the previous free
  // made; when the cache parked that free, the credit sits in the cache's shard, out of reach of
  // the stream's shard that counts the next miss (docs/design.md 5.4): ~5 slow events per
  // thousand pairs of the mixed ring with front caches, ~0.1-0.3 without. Shedding then frees
  // blocks through the heap, where the stream's shard counts free and allocation alike.
  void note_slow_miss() noexcept { note_slow_event(); }
  bool shedding() const noexcept { return escrow_ < 0; }

  // Calls take(front) for every parked block (of `stream` only, unless null), unparking them
  // all; the caller then removes them from `blocks`.
  template <typename Take>
  void unpark_all(const StreamHandle* stream, Take&& take) {
    for (std::size_t i = 0; i < streams_used_; ++i) {
      StreamBins& bins = streams_[i];
      if (stream != nullptr && bins.stream != *stream) continue;
      for (Bin& bin : bins.sizes) {
        for (std::uint32_t k = 0; k < bin.count; ++k) {
          bin.blocks[k]->parked = false;
          parked_bytes -= bin.blocks[k]->size;
          take(bin.blocks[k]);
        }
        bin.count = 0;
      }
    }
    parked_changed();
  }

  // ---- state (under mutex())
  // Whether any block is managed, or parked, here: readable by the owning thread without the
  // mutex. Only the owner adds blocks or parks them (others only take them away), so a zero it
  // reads stays zero until it adds one itself; the miss paths skip the mutex then (ever-new
  // sizes, a shedding cache: the mixed ring's pairs).
  bool manages_any() const noexcept { return managed_hint_.load(std::memory_order_relaxed) != 0; }
  bool has_parked() const noexcept { return parked_hint_.load(std::memory_order_relaxed) != 0; }
  // `blocks` changes only through these (under mutex()).
  void manage(DevicePtr address, FrontBlock* front) {
    blocks.insert(address, front);
    managed_hint_.store(blocks.size(), std::memory_order_relaxed);
  }
  void forget(DevicePtr address) {
    blocks.erase(address);
    managed_hint_.store(blocks.size(), std::memory_order_relaxed);
  }

  ObserverShard* shard = nullptr;  // the ledger's share for this thread, or null
  AddressMap<FrontBlock> blocks;   // every block managed here, held or parked, by address
  ObjectPool<FrontBlock> entries;
  std::size_t parked_bytes = 0;
  std::size_t max_parked_bytes = 0;
  // Set and read under the allocator's front registry lock (CachingAllocator::Impl).
  bool in_use = false;  // a live thread owns it; a retired one waits to be reused

 private:
  struct Bin {
    std::size_t size = 0;
    std::uint32_t count = 0;
    std::array<FrontBlock*, kDepth> blocks{};
  };
  struct StreamBins {
    StreamHandle stream = 0;
    std::array<Bin, kSizes> sizes{};
    std::size_t next_victim = 0;
    bool hit = false;  // a pop has hit these bins since they were given to the stream
  };

  StreamBins* bins_of(StreamHandle stream) noexcept {
    for (std::size_t i = 0; i < streams_used_; ++i) {
      if (streams_[i].stream == stream) return &streams_[i];
    }
    return nullptr;
  }

  void note_slow_event() noexcept {
    escrow_ = std::max(kMinScore, escrow_ - 1 - kSlowHitCost);
    if (in_trial_ && shedding()) {  // a trial failed (it began serving: escrow reset to 0)
      in_trial_ = false;
      trial_interval_ = std::min(trial_interval_ * 2, kLastTrialInterval);
    }
  }
  void parked_changed() noexcept { parked_hint_.store(parked_bytes, std::memory_order_relaxed); }

  std::atomic<std::size_t> managed_hint_{0};  // blocks.size()
  std::atomic<std::size_t> parked_hint_{0};   // parked_bytes

  // Hits minus misses of pops, bounded: below 0 the bins are not serving this thread's sizes.
  static constexpr int kMinScore = -64, kMaxScore = 64, kInitialScore = 8;
  static constexpr int kSlowHitCost = 4;  // a slow hit weighs as much as four cheap ones
  BiasedMutex own_mutex_;
  std::array<std::size_t, 64> recent_sizes_{};  // direct-mapped by size
  int score_ = kInitialScore;
  int escrow_ = kInitialScore;  // cheap hits minus weighted slow ones, bounded
  std::uint32_t probe_ = 0;
  // Seen-size misses between trials while shedding (a power of two).
  static constexpr std::uint32_t kFirstTrialInterval = 256, kLastTrialInterval = 4096;
  std::uint32_t trial_interval_ = kFirstTrialInterval;
  bool in_trial_ = false;  // a trial adopted; its hits or slow events decide it
  bool streams_first_hit_ = false;  // the latest pop was its stream's first hit
  std::array<StreamBins, kStreams> streams_{};
  std::size_t streams_used_ = 0;
};

// Events this thread's per-stream fast paths could not count in their stream's ledger shard
// (CachingAllocator::Impl::report_to_stream_shard): a front cache compares it around a miss.
inline thread_local std::uint32_t t_stream_shard_slow_paths = 0;

}  // namespace vramledger
