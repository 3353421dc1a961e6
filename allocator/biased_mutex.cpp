// The other threads' side of BiasedMutex (biased_mutex.hpp): revoking the owner's bias, the
// process-wide barrier that stands in for the owner's, and when to stop and start biasing.
#include "allocator/biased_mutex.hpp"

#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <thread>

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace vramledger {
namespace {

#if defined(__linux__) && !defined(VRAMLEDGER_BIASED_SEQ_CST)
long membarrier(int command) { return syscall(__NR_membarrier, command, 0u, 0); }
#endif

bool register_process_wide_barrier() {
  const char* setting = std::getenv("VRAMLEDGER_BIASED_LOCKS");
  if (setting != nullptr && std::strcmp(setting, "0") == 0) return false;
#if defined(VRAMLEDGER_BIASED_SEQ_CST)
  return true;  // both sides sequentially consistent: no barrier needed
#elif defined(__linux__)
  const long commands = membarrier(MEMBARRIER_CMD_QUERY);
  if (commands < 0 || (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  // Registration is per process and survives fork (measured, Linux 6.18); exec starts afresh.
  return membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0;
#else
  return false;
#endif
}

}  // namespace

bool BiasedMutex::biasing_available() noexcept {
  static const bool available = register_process_wide_barrier();
  return available;
}

std::uintptr_t BiasedMutex::this_thread_token_slow() noexcept {
  thread_local char token;
  return reinterpret_cast<std::uintptr_t>(&token);
}

void BiasedMutex::process_wide_barrier() noexcept {
#if defined(VRAMLEDGER_BIASED_SEQ_CST)
  // Nothing: both sides' operations are sequentially consistent (and TSan refuses fences).
#elif defined(__linux__)
  // Only reached once biasing_available() registered the command, which cannot be undone.
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) != 0) {
    std::fprintf(stderr, "vramledger: membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) failed after "
                         "registration: %s; cannot take a biased lock safely\n",
                 std::strerror(errno));
    std::abort();
  }
#endif
}

// Holding inner_, of a mutex with an owner.
bool BiasedMutex::revoke_deferring_barrier() noexcept {
  // The owner is not inside: it is here.
  if (owner_.load(std::memory_order_relaxed) == this_thread_token()) return false;
  if (state_.load(std::memory_order_relaxed) != kBiased) {
    // Another thread wanted it: the owner does not rebias yet.
    if (owner_locks_unbiased_ != 0) owner_locks_unbiased_ = 0;
    return false;
  }
  // Sequentially consistent: ordered before the barrier and the load of owner_busy_ after it.
  state_.store(kRevoking, std::memory_order_seq_cst);
  revoked_by_holder_ = true;
  needs_wait_ = true;
  return true;
}

void BiasedMutex::finish_lock() noexcept {
  if (!needs_wait_) return;
  needs_wait_ = false;
  // The owner either saw kRevoking (it waits for inner_) or is inside: wait until it leaves.
  for (int spins = 0; owner_busy_.load(std::memory_order_seq_cst) != 0; ++spins) {
    if (spins < 1024) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();  // the owner was preempted inside
    }
  }
  note_revocation();
}

// Holding inner_: one more revocation; whether it leaves the mutex unbiased (revoked again
// within kFastLocksPerRevocation owner locks).
void BiasedMutex::note_revocation() noexcept {
  ++revocations_;
  const std::uint32_t fast_locks = fast_locks_.load(std::memory_order_relaxed);
  stay_unbiased_ = adaptive_ && fast_locks - fast_locks_at_revocation_ < kFastLocksPerRevocation;
  fast_locks_at_revocation_ = fast_locks;
  if (stay_unbiased_) owner_locks_unbiased_ = 0;
}

void BiasedMutex::end_revocation() noexcept {
  revoked_by_holder_ = false;
  if (stay_unbiased_) owner_locks_unbiased_ = 0;
  // Release: the owner's next acquire load of state_ sees what was written under the lock.
  state_.store(stay_unbiased_ ? kUnbiased : kBiased, std::memory_order_release);
}

void BiasedMutex::lock_as_owner_slow() noexcept {
  inner_.lock();
  owner_holds_inner_ = true;
  // Unbiased for now (or a revocation just ended): biased again after enough locks of the
  // owner's alone. Holding inner_, so no other thread is inside.
  if (state_.load(std::memory_order_relaxed) == kUnbiased &&
      owner_.load(std::memory_order_relaxed) != 0 &&
      ++owner_locks_unbiased_ >= kRebiasAfter) {
    owner_locks_unbiased_ = 0;
    fast_locks_at_revocation_ = fast_locks_.load(std::memory_order_relaxed);
    state_.store(kBiased, std::memory_order_relaxed);
  }
}

void BiasedMutex::bias_to_this_thread() noexcept {
  if (!biasing_available()) return unbias();
  owner_.store(this_thread_token(), std::memory_order_relaxed);
  revoked_by_holder_ = false;
  owner_busy_.store(0, std::memory_order_relaxed);
  owner_holds_inner_ = false;
  owner_locks_unbiased_ = 0;
  fast_locks_at_revocation_ = fast_locks_.load(std::memory_order_relaxed);
  state_.store(kBiased, std::memory_order_release);
}

// Under inner_ (taken by lock_counting_runs), no owner yet.
void BiasedMutex::note_run() noexcept {
  const std::uintptr_t self = this_thread_token();
  if (run_thread_ != self) {
    run_thread_ = self;
    run_ = 0;
  }
  if (++run_ < kAutoBiasAfter || !biasing_available()) return;
  // This thread owns it from now on, and holds it as an owner whose lock went through inner_.
  bias_to_this_thread();
  owner_holds_inner_ = true;
}

bool BiasedMutex::try_lock_counting_runs() noexcept {
  if (!inner_.try_lock()) return false;
  if (revoke_if_owned()) {
    process_wide_barrier();
    if (owner_busy_.load(std::memory_order_seq_cst) != 0) {
      // The owner is inside (or was announcing itself when it saw the revocation, on its way to
      // inner_): give up rather than wait. Waiting could deadlock: the owner may be waiting for
      // a lock the caller holds. Biased again whatever the adaptivity says: an owner inside on
      // its plain-store path must find no other thread taking inner_ without a revocation
      // (with kUnbiased here the next locker would not wait for it: the 16-thread stream test
      // caught that). It counts as a revocation, so the next one may unbias.
      needs_wait_ = false;
      revoked_by_holder_ = false;
      note_revocation();
      state_.store(kBiased, std::memory_order_release);
      inner_.unlock();
      return false;
    }
    finish_lock();  // the owner is not inside: at most a moment's wait for one announcing itself
  }
  if (owner_.load(std::memory_order_relaxed) == 0) note_run();
  return true;
}

bool BiasedMutex::try_lock_as_owner() noexcept {
  if (lock_as_owner_without_inner()) return true;
  if (!inner_.try_lock()) return false;
  owner_holds_inner_ = true;
  return true;
}

bool BiasedMutex::try_lock_without_revoking() noexcept {
  if (owned_by_this_thread()) return try_lock_as_owner();
  if (!inner_.try_lock()) return false;
  // Holding inner_: a revocation cannot be under way (it holds inner_ throughout), and an
  // unbiased owner takes inner_ too, so only a biased one could be inside.
  if (owner_.load(std::memory_order_relaxed) != 0) {
    if (state_.load(std::memory_order_relaxed) == kBiased) {
      inner_.unlock();
      return false;
    }
    owner_locks_unbiased_ = 0;  // another thread wanted it: the owner does not rebias yet
  }
  return true;
}

void BiasedMutex::unbias() noexcept {
  owner_.store(0, std::memory_order_relaxed);
  revoked_by_holder_ = false;
  owner_locks_unbiased_ = 0;
  state_.store(kUnbiased, std::memory_order_release);
}

}  // namespace vramledger
