// The allocator's lock, built of a global lock and one lock per published stream
// (docs/design.md 4). lock() takes the global lock, then every published stream's lock in slot
// order: whoever holds it excludes every other operation, as the one lock did. The per-stream
// fast path takes only its stream's lock (StreamHeaps::mutex), found here without any lock.
//
// Streams get a slot at their first use while slots remain (kSlots); later ones, and every
// stream of an allocator without the fast path, are served under the allocator's lock only.
// A published StreamHeaps is never destroyed before the allocator (release_stream withdraws
// it), so a fast path that found it may still lock it and see that it is closed.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#include "allocator/biased_mutex.hpp"
#include "allocator/steady_time.hpp"
#include "allocator/detail/stream_heaps.hpp"

namespace vramledger {

class StreamLocks {
 public:
  static constexpr std::size_t kSlots = 64;

  // Lockable (std::lock_guard): the global lock, then the published streams' locks.
  void lock() noexcept {
    global_.lock();
    lock_published_streams();
  }
  // lock() if the global lock is free now; false (nothing taken) if another thread holds it.
  bool try_lock() noexcept {
    if (!global_.try_lock()) return false;
    lock_published_streams();
    return true;
  }
  void unlock() noexcept {
    const std::size_t used = used_.load(std::memory_order_relaxed);
    for (std::size_t i = used; i-- > 0;) {
      if (StreamHeaps* heaps = slots_[i].heaps.load(std::memory_order_relaxed)) {
        heaps->mutex.unlock();
      }
    }
    if (held_since_ns_ != 0) {
      streams_held_ns_ += steady_now_ns() - held_since_ns_;
      held_since_ns_ = 0;
    }
    global_.unlock();
  }

  // Nanoseconds (steady clock) the lock was held while streams were published: time every
  // stream's fast path had to wait (the benchmarks' streams_held_pct). Under lock(). Not
  // measured with no stream published, where the lock is every operation's (two clock reads
  // would be a fifth of a warm pair).
  std::uint64_t streams_held_ns() const noexcept { return streams_held_ns_; }

  // The published heaps of `stream`'s lane `lane`, or nullptr; no lock taken or needed. The
  // caller locks its mutex and checks `open` before using it.
  StreamHeaps* find(StreamHandle stream, std::uint32_t lane) const noexcept {
    const std::size_t used = used_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < used; ++i) {
      if (slots_[i].stream.load(std::memory_order_relaxed) != stream) continue;
      StreamHeaps* heaps = slots_[i].heaps.load(std::memory_order_acquire);
      if (heaps != nullptr && heaps->lane == lane) return heaps;
    }
    return nullptr;
  }

  // Calls `visit` with every published heaps until it returns true; no lock taken or needed
  // (as find): the caller locks what it uses, with try_lock only if it holds a stream's lock, or
  // touches only atomics (a room of active bytes, detail/active_bytes.cpp).
  template <typename Visit>
  void for_each_published(Visit&& visit) const {
    const std::size_t used = used_.load(std::memory_order_acquire);
    for (std::size_t i = 0; i < used; ++i) {
      StreamHeaps* heaps = slots_[i].heaps.load(std::memory_order_acquire);
      if (heaps != nullptr && visit(*heaps)) return;
    }
  }

  // A hint: whether the allocator's lock is held (or being taken) now. A stream lock found held
  // while it is was most likely held as part of it, not by another thread of the stream.
  bool global_held() const noexcept { return global_.is_locked(); }

  // Slots not yet given out (under lock()).
  std::size_t slots_left() const noexcept {
    return kSlots - used_.load(std::memory_order_relaxed);
  }

  // Under lock(): `heaps`, new and unlocked, gets a slot; it is locked now, as lock() would
  // have locked it, and open. False (nothing changed) when no slot is left.
  bool publish(StreamHeaps& heaps) noexcept {
    const std::size_t used = used_.load(std::memory_order_relaxed);
    if (used == kSlots) return false;
    heaps.mutex.lock();
    heaps.open.store(true, std::memory_order_relaxed);
    slots_[used].stream.store(heaps.stream, std::memory_order_relaxed);
    slots_[used].heaps.store(&heaps, std::memory_order_release);
    used_.store(used + 1, std::memory_order_release);
    return true;
  }

  // Under lock(): `heaps` leaves its slot (for good: slots are not reused, so at most kSlots
  // heaps are ever kept for late fast paths) and its lock is released, as unlock() will no
  // longer see it.
  void withdraw(StreamHeaps& heaps) noexcept {
    const std::size_t used = used_.load(std::memory_order_relaxed);
    for (std::size_t i = 0; i < used; ++i) {
      if (slots_[i].heaps.load(std::memory_order_relaxed) != &heaps) continue;
      heaps.open.store(false, std::memory_order_relaxed);
      slots_[i].heaps.store(nullptr, std::memory_order_relaxed);
      heaps.mutex.unlock();
      return;
    }
  }

 private:
  // With the global lock held: every published stream's lock, in slot order. Those biased to
  // other threads are revoked with one process-wide barrier for all (BiasedMutex).
  void lock_published_streams() noexcept {
    static_assert(kSlots <= 64, "one bit per slot");
    const std::size_t used = used_.load(std::memory_order_relaxed);
    held_since_ns_ = used != 0 ? steady_now_ns() : 0;
    std::uint64_t revoking = 0;  // finish_lock only those: one taken on its owner's path holds
                                 // no inner lock, so its revocation flags are another's to touch
    for (std::size_t i = 0; i < used; ++i) {
      if (StreamHeaps* heaps = slots_[i].heaps.load(std::memory_order_relaxed)) {
        if (heaps->mutex.lock_deferring_barrier()) revoking |= std::uint64_t{1} << i;
      }
    }
    if (revoking == 0) [[likely]] return;
    BiasedMutex::process_wide_barrier();
    for (std::size_t i = 0; i < used; ++i) {
      if ((revoking >> i & 1) == 0) continue;
      slots_[i].heaps.load(std::memory_order_relaxed)->mutex.finish_lock();
    }
  }

  struct Slot {
    std::atomic<StreamHandle> stream{0};
    std::atomic<StreamHeaps*> heaps{nullptr};
  };
  // Biased to the thread that takes it most (allocator/biased_mutex.hpp): a single-threaded
  // program's every operation then takes it with plain stores.
  AutoBiasedMutex global_;
  std::atomic<std::size_t> used_{0};
  std::uint64_t held_since_ns_ = 0;    // under lock(); 0: not timed (no stream published)
  std::uint64_t streams_held_ns_ = 0;  // under lock()
  std::array<Slot, kSlots> slots_{};
};

}  // namespace vramledger
