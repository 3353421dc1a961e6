// A mutex biased towards one thread, its owner: the owner takes and releases it with plain
// loads and stores, no atomic read-modify-write; any other thread pays for both sides
// (docs/design.md, 5.1 "A lock biased to its thread").
//
// Why: a front cache's warm allocate+free pair takes its thread's lock twice, and the four
// atomic instructions (lock cmpxchg, xchg) were a quarter of the pair (simulated device, 2-core
// VM, session 26: 56 ns with them, 41 ns without). Other threads reach into a cache rarely (a
// flush, a read of exact statistics, a free of another thread's block), so they do the work.
//
// How: the owner announces itself (`owner_busy_ = 1`), then reads `state_`; a thread that wants
// the lock from the owner takes `inner_` (which also orders it against other such threads),
// writes `state_ = kRevoking`, makes every running thread of the process execute a full memory
// barrier (membarrier(2), MEMBARRIER_CMD_PRIVATE_EXPEDITED), and waits until `owner_busy_` is 0.
// The barrier stands in for the one the owner's side leaves out (Dekker's store-then-load on
// both sides): either the owner sees kRevoking and goes to `inner_`, or the other thread sees
// the owner busy and waits for it. A revocation costs a system call with interrupts to every
// CPU running the process (4-16 us on the VM), so a mutex revoked more than once per
// kFastLocksPerRevocation owner locks stops being biased (the owner then takes `inner_` too,
// as an unbiased mutex), until the owner has taken it kRebiasAfter times with no other thread.
//
// Without membarrier (old kernel, seccomp) nothing is biased: every thread takes `inner_`.
// Under ThreadSanitizer, which cannot see membarrier's ordering, both sides use sequentially
// consistent operations instead, which order them by themselves (Dekker), so TSan checks the
// protocol.
#pragma once

#include <atomic>
#include <cstdint>

#include "allocator/spin_mutex.hpp"

#if defined(__SANITIZE_THREAD__)
#define VRAMLEDGER_BIASED_SEQ_CST 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define VRAMLEDGER_BIASED_SEQ_CST 1
#endif
#endif

namespace vramledger {

class alignas(64) BiasedMutex {
 public:
  BiasedMutex() = default;
  // Tests: `adaptive` false keeps the bias however often it is revoked.
  explicit BiasedMutex(bool adaptive) noexcept : adaptive_(adaptive) {}
  BiasedMutex(const BiasedMutex&) = delete;
  BiasedMutex& operator=(const BiasedMutex&) = delete;

  // ---- any thread (Lockable). From the owner thread, as cheap as a SpinMutex.
  void lock() noexcept {
    if (lock_deferring_barrier()) {
      process_wide_barrier();
      finish_lock();
    }
  }
  void unlock() noexcept {
    if (revoked_by_holder_) [[unlikely]] end_revocation();
    inner_.unlock();
  }

  // lock() in two steps, so that a thread taking many (the ledger: every shard) makes one
  // process-wide barrier for all: lock_deferring_barrier() on each, process_wide_barrier() once
  // if any returned true, then finish_lock() on each that did.
  bool lock_deferring_barrier() noexcept {
    inner_.lock();
    return revoke_if_owned();
  }
  void finish_lock() noexcept;
  static void process_wide_barrier() noexcept;

  // ---- the owner thread only (bias_to_this_thread)
  [[gnu::always_inline]] void lock_as_owner() noexcept {
    if (lock_as_owner_without_inner()) [[likely]] return;
    lock_as_owner_slow();
  }
  [[gnu::always_inline]] void unlock_as_owner() noexcept {
    if (owner_holds_inner_) [[unlikely]] {
      owner_holds_inner_ = false;
      unlock();
      return;
    }
    owner_busy_.store(0, std::memory_order_release);
  }

  // With lock() held: the calling thread becomes the owner (biased, where membarrier is
  // available), or nobody is (unbias: every thread takes `inner_`). The previous owner must not
  // hold the mutex as owner (it has exited, or it is the caller).
  void bias_to_this_thread() noexcept;
  void unbias() noexcept;

  // Whether this process biases mutexes (membarrier registered, VRAMLEDGER_BIASED_LOCKS not 0).
  static bool biasing_available() noexcept;

  // ---- self-biasing use (AutoBiasedMutex)
  bool owned_by_this_thread() const noexcept {
    return owner_.load(std::memory_order_relaxed) == this_thread_token();
  }
  // lock() by a thread that does not own it; the thread that takes it kAutoBiasAfter times in a
  // row while it has no owner becomes its owner (holding it, as through lock_as_owner_slow).
  void lock_counting_runs() noexcept {
    lock();
    if (owner_.load(std::memory_order_relaxed) == 0) [[unlikely]] note_run();
  }
  // try_lock by a thread that does not own it. Never waits for the owner: a biased mutex whose
  // owner is inside is not taken (false), so a thread may try_lock one while holding other
  // locks the owner might be waiting for (a stream's fast path: another stream's heaps lock,
  // taken while holding its own).
  bool try_lock_counting_runs() noexcept;
  // The owner's try_lock: false only while another thread holds it.
  bool try_lock_as_owner() noexcept;
  // try_lock that never revokes a bias: false while another thread holds it and while it is
  // biased to another thread (taking it then costs a process-wide barrier). Its owner takes it
  // as try_lock_as_owner does. Release with unlock_auto().
  bool try_lock_without_revoking() noexcept;
  // AutoBiasedMutex's behaviour on a BiasedMutex (a ledger shard's, ObserverShard::mutex()):
  // the owner's path for its owner, else lock_counting_runs / try_lock_counting_runs.
  void lock_auto() noexcept {
    if (owned_by_this_thread()) [[likely]] return lock_as_owner();
    lock_counting_runs();
  }
  bool try_lock_auto() noexcept {
    if (owned_by_this_thread()) return try_lock_as_owner();
    return try_lock_counting_runs();
  }
  void unlock_auto() noexcept {
    if (owned_by_this_thread()) [[likely]] return unlock_as_owner();
    unlock();
  }
  // lock_auto() in two steps, as lock_deferring_barrier() and finish_lock() (a thread taking
  // many: the allocator's lock takes every stream's). Runs are not counted.
  bool lock_auto_deferring_barrier() noexcept {
    if (owned_by_this_thread()) {
      lock_as_owner();
      return false;
    }
    return lock_deferring_barrier();
  }
  // A hint (stale at once): whether some thread holds it now.
  bool is_locked() const noexcept {
    return owner_busy_.load(std::memory_order_relaxed) != 0 || inner_.is_locked();
  }
  static constexpr std::uint32_t kAutoBiasAfter = 256;

  // A number no other live thread has: the thread pointer (glibc's thread control block), read
  // without a call or a TLS lookup (a dlopen'ed library would pay __tls_get_addr).
  static std::uintptr_t this_thread_token() noexcept {
#if defined(__x86_64__)
    std::uintptr_t self;
    asm("mov %%fs:0, %0" : "=r"(self));
    return self;
#elif defined(__aarch64__)
    std::uintptr_t self;
    asm("mrs %0, tpidr_el0" : "=r"(self));
    return self;
#else
    return this_thread_token_slow();
#endif
  }

  // For tests and benchmarks; read with lock() held.
  bool biased() const noexcept { return state_.load(std::memory_order_relaxed) == kBiased; }
  std::uint32_t revocations() const noexcept { return revocations_; }

  static constexpr std::uint32_t kFastLocksPerRevocation = 1u << 14;
  static constexpr std::uint32_t kRebiasAfter = 1u << 16;

 private:
  static constexpr int kBiased = 0;    // the owner takes it with plain stores
  static constexpr int kRevoking = 1;  // another thread holds `inner_` and took it from the owner
  static constexpr int kUnbiased = 2;  // everybody takes `inner_` (no owner, or revoked too often)

#if defined(VRAMLEDGER_BIASED_SEQ_CST)
  static constexpr std::memory_order kOwnerStoreOrder = std::memory_order_seq_cst;
  static constexpr std::memory_order kOwnerLoadOrder = std::memory_order_seq_cst;
  static void owner_side_barrier() noexcept {}
#else
  static constexpr std::memory_order kOwnerStoreOrder = std::memory_order_relaxed;
  static constexpr std::memory_order kOwnerLoadOrder = std::memory_order_acquire;
  // Only the compiler's: the other side's membarrier orders the CPU.
  static void owner_side_barrier() noexcept { std::atomic_signal_fence(std::memory_order_seq_cst); }
#endif

  // The owner's plain-store path: true when it holds the mutex without inner_. Unbiased, the
  // owner goes straight to inner_ without writing owner_busy_ (a write to a line another thread
  // may be taking turns on).
  [[gnu::always_inline]] bool lock_as_owner_without_inner() noexcept {
    if (state_.load(std::memory_order_relaxed) != kBiased) return false;
    owner_busy_.store(1, kOwnerStoreOrder);
    owner_side_barrier();
    if (state_.load(kOwnerLoadOrder) == kBiased) [[likely]] {
      fast_locks_.store(fast_locks_.load(std::memory_order_relaxed) + 1,
                        std::memory_order_relaxed);
      return true;
    }
    owner_busy_.store(0, std::memory_order_release);
    return false;
  }
  // Holding inner_: whether an owner's bias must be revoked first (a process-wide barrier, then
  // finish_lock); marks the revocation if so.
  bool revoke_if_owned() noexcept {
    if (owner_.load(std::memory_order_relaxed) == 0) [[likely]] return false;  // never biased
    return revoke_deferring_barrier();
  }
  static std::uintptr_t this_thread_token_slow() noexcept;
  bool revoke_deferring_barrier() noexcept;
  void note_run() noexcept;
  void lock_as_owner_slow() noexcept;
  void end_revocation() noexcept;
  void note_revocation() noexcept;

  // One cache line (the class is aligned to 64 bytes): a lock, biased or not, touches only it;
  // spread over two, a registry shard's lock passed between threads cost two line transfers
  // per lock (the plugin's 2-thread case, +20%). 32-bit counters: their differences are taken
  // modulo 2^32, and the intervals compared are far shorter.
  SpinMutex inner_;
  // Written under inner_ only; the owner reads state_ without it.
  std::atomic<int> state_{kUnbiased};
  // Written by the owner alone.
  std::atomic<int> owner_busy_{0};
  std::atomic<std::uint32_t> fast_locks_{0};
  bool owner_holds_inner_ = false;  // the owner's current hold went through inner_
  bool revoked_by_holder_ = false;  // the holder of inner_ revoked the bias
  bool needs_wait_ = false;         // lock_deferring_barrier revoked; finish_lock waits
  bool stay_unbiased_ = false;      // end_revocation leaves it unbiased
  bool adaptive_ = true;
  // this_thread_token() of the owner, 0 if none; read without inner_ by owned_by_this_thread()
  // (only the owner itself can find its own token there).
  std::atomic<std::uintptr_t> owner_{0};
  std::uintptr_t run_thread_ = 0;  // the thread of the latest lock_counting_runs, and its run
  std::uint32_t run_ = 0;
  std::uint32_t fast_locks_at_revocation_ = 0;
  std::uint32_t owner_locks_unbiased_ = 0;  // owner's locks since the last other thread's
  std::uint32_t revocations_ = 0;
};
static_assert(sizeof(BiasedMutex) == 64, "BiasedMutex is one cache line");

// A BiasedMutex that biases itself to the first thread that takes it kAutoBiasAfter times in a
// row, for locks that one thread takes nearly always in a single-threaded program (the
// allocator's, the ledger's). The owner never changes afterwards (a new owner could not know
// that the old one is not entering its fast path); a program whose threads take turns revokes
// it, and it stays unbiased while they do (BiasedMutex's adaptivity). Lockable.
class AutoBiasedMutex {
 public:
  AutoBiasedMutex() = default;
  explicit AutoBiasedMutex(bool adaptive) noexcept : mutex_(adaptive) {}  // tests

  void lock() noexcept { mutex_.lock_auto(); }
  bool try_lock() noexcept { return mutex_.try_lock_auto(); }  // never waits for the owner
  void unlock() noexcept { mutex_.unlock_auto(); }
  bool is_locked() const noexcept { return mutex_.is_locked(); }
  // lock() in two steps (BiasedMutex::lock_auto_deferring_barrier), for a thread taking many.
  bool lock_deferring_barrier() noexcept { return mutex_.lock_auto_deferring_barrier(); }
  void finish_lock() noexcept { mutex_.finish_lock(); }
  BiasedMutex& biased() noexcept { return mutex_; }  // tests

 private:
  BiasedMutex mutex_;
};

// The owner's hold, released at the end of scope (std::lock_guard's, for the owner).
class OwnerLock {
 public:
  explicit OwnerLock(BiasedMutex& mutex) noexcept : mutex_(mutex) { mutex_.lock_as_owner(); }
  ~OwnerLock() { mutex_.unlock_as_owner(); }
  OwnerLock(const OwnerLock&) = delete;
  OwnerLock& operator=(const OwnerLock&) = delete;

 private:
  BiasedMutex& mutex_;
};

}  // namespace vramledger
