// BiasedMutex (allocator/biased_mutex.hpp): the owner's plain-store path and other threads'
// revocations exclude each other; revoked too often, the mutex stops being biased, and the
// owner biases it again once alone. Suite 'concurrent': under ThreadSanitizer both sides use
// sequentially consistent operations instead of membarrier, which TSan checks; the release build
// checks the membarrier protocol itself (a broken one shows as a torn pair or a lost count).
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "allocator/biased_mutex.hpp"

namespace vramledger {
namespace {

// Two plain counters changed one after the other under the mutex: whoever holds it must see
// them equal, and no increment may be lost.
struct Guarded {
  explicit Guarded(bool adaptive = true) : mutex(adaptive) {}
  // With `mutex` held: counts a torn pair (another holder was between its two increments), then
  // increments both.
  void update_held() {
    if (first != second) torn.fetch_add(1);
    ++first;
    ++second;
  }
  BiasedMutex mutex;
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  std::atomic<std::uint64_t> torn{0};
};

void bias_to_this_thread(BiasedMutex& mutex) {
  std::lock_guard lock(mutex);
  mutex.bias_to_this_thread();
}

// Every lock of another thread revokes the bias (not adaptive): thousands of revocations while
// the owner locks as fast as it can.
TEST(BiasedMutexTest, OwnerAndOtherThreadsExcludeEachOther) {
  Guarded guarded(/*adaptive=*/false);
  constexpr std::uint64_t kOwnerLocks = 400'000;
  constexpr int kOthers = 3;
  constexpr std::uint64_t kOtherLocks = 2'000;
  std::atomic<bool> biased_ready{false};
  std::thread owner([&] {
    bias_to_this_thread(guarded.mutex);
    biased_ready.store(true);
    for (std::uint64_t i = 0; i < kOwnerLocks; ++i) {
      OwnerLock lock(guarded.mutex);
      guarded.update_held();
    }
  });
  while (!biased_ready.load()) std::this_thread::yield();
  std::vector<std::thread> others;
  for (int t = 0; t < kOthers; ++t) {
    others.emplace_back([&] {
      for (std::uint64_t i = 0; i < kOtherLocks; ++i) {
        std::lock_guard lock(guarded.mutex);
        guarded.update_held();
      }
    });
  }
  owner.join();
  for (std::thread& other : others) other.join();
  std::lock_guard lock(guarded.mutex);
  EXPECT_EQ(guarded.torn.load(), 0u);
  EXPECT_EQ(guarded.first, kOwnerLocks + kOthers * kOtherLocks);
  EXPECT_EQ(guarded.second, guarded.first);
  if (BiasedMutex::biasing_available()) {
    // Each lock of the others took it from the owner, and so did this one.
    EXPECT_EQ(guarded.mutex.revocations(), kOthers * kOtherLocks + 1);
  }
}

TEST(BiasedMutexTest, TheOwnersOwnLockRevokesNothing) {
  if (!BiasedMutex::biasing_available()) GTEST_SKIP() << "membarrier unavailable: nothing biased";
  BiasedMutex mutex;
  bias_to_this_thread(mutex);
  for (int i = 0; i < 100; ++i) {
    { OwnerLock lock(mutex); }
    std::lock_guard lock(mutex);  // e.g. the ledger's slow path on the owner's thread
  }
  std::lock_guard lock(mutex);
  EXPECT_TRUE(mutex.biased());
  EXPECT_EQ(mutex.revocations(), 0u);
}

// Revoked within fewer owner locks than kFastLocksPerRevocation, the bias goes; after
// kRebiasAfter locks of the owner alone it comes back, and the next revocation pays once.
TEST(BiasedMutexTest, FrequentRevocationsUnbiasAndQuietRebiases) {
  if (!BiasedMutex::biasing_available()) GTEST_SKIP() << "membarrier unavailable: nothing biased";
  BiasedMutex mutex;
  std::atomic<int> phase{0};
  std::thread owner([&] {
    bias_to_this_thread(mutex);
    phase.store(1);
    while (phase.load() != 2) std::this_thread::yield();
    for (std::uint64_t i = 0; i <= BiasedMutex::kRebiasAfter; ++i) OwnerLock lock(mutex);
    phase.store(3);
  });
  while (phase.load() != 1) std::this_thread::yield();
  {
    std::lock_guard lock(mutex);  // revokes: the owner has made no locks since it was biased
    EXPECT_EQ(mutex.revocations(), 1u);
  }
  {
    std::lock_guard lock(mutex);
    EXPECT_FALSE(mutex.biased());
  }
  { std::lock_guard lock(mutex); }  // unbiased: no revocation
  EXPECT_EQ(mutex.revocations(), 1u);
  phase.store(2);
  while (phase.load() != 3) std::this_thread::yield();
  {
    std::lock_guard lock(mutex);  // the owner rebiased it: this revokes again
    EXPECT_EQ(mutex.revocations(), 2u);
  }
  owner.join();
}

TEST(BiasedMutexTest, AnUnbiasedMutexIsAPlainOne) {
  Guarded guarded;  // never biased (as without membarrier): every path takes the inner lock
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20'000; ++i) {
        if (t == 0) {  // as the front cache's thread does when biasing is unavailable
          OwnerLock lock(guarded.mutex);
          ++guarded.first;
          ++guarded.second;
        } else {
          std::lock_guard lock(guarded.mutex);
          ++guarded.first;
          ++guarded.second;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(guarded.first, 80'000u);
  EXPECT_EQ(guarded.second, 80'000u);
}

// AutoBiasedMutex: the thread that takes it kAutoBiasAfter times in a row owns it; another
// thread's lock then revokes, and exclusion holds throughout (not adaptive: every lock of the
// others revokes).
TEST(BiasedMutexTest, AutoBiasedMutexBiasesToTheThreadThatTakesItMost) {
  if (!BiasedMutex::biasing_available()) GTEST_SKIP() << "membarrier unavailable: nothing biased";
  AutoBiasedMutex mutex(/*adaptive=*/false);
  std::uint64_t first = 0, second = 0;
  std::atomic<int> torn{0};
  std::atomic<bool> owned{false}, other_done{false};
  std::uint64_t owner_locks = 0;
  constexpr std::uint64_t kOtherLocks = 3'000;
  std::thread owner([&] {  // locks until the other thread is done
    while (!other_done.load(std::memory_order_relaxed)) {
      std::lock_guard lock(mutex);
      if (first != second) torn.fetch_add(1);
      ++first;
      ++second;
      if (++owner_locks == BiasedMutex::kAutoBiasAfter + 1) {
        owned.store(mutex.biased().owned_by_this_thread());
      }
    }
  });
  std::thread other([&] {
    while (!owned.load()) std::this_thread::yield();
    for (std::uint64_t i = 0; i < kOtherLocks; ++i) {
      std::lock_guard lock(mutex);
      if (first != second) torn.fetch_add(1);
      ++first;
      ++second;
      EXPECT_FALSE(mutex.biased().owned_by_this_thread());
    }
    other_done.store(true);
  });
  owner.join();
  other.join();
  std::lock_guard lock(mutex);
  EXPECT_EQ(torn.load(), 0);
  EXPECT_EQ(first, owner_locks + kOtherLocks);
  EXPECT_EQ(second, first);
  EXPECT_EQ(mutex.biased().revocations(), kOtherLocks + 1);  // the others' and this one
}

TEST(BiasedMutexTest, AutoBiasedTryLockFailsWhileAnotherThreadHoldsIt) {
  AutoBiasedMutex mutex;
  for (std::uint32_t i = 0; i <= BiasedMutex::kAutoBiasAfter; ++i) std::lock_guard lock(mutex);
  EXPECT_EQ(mutex.biased().owned_by_this_thread(), BiasedMutex::biasing_available());
  std::atomic<int> phase{0};
  std::thread other([&] {
    mutex.lock();  // revokes the bias if any
    phase.store(1);
    while (phase.load() != 2) std::this_thread::yield();
    mutex.unlock();
  });
  while (phase.load() != 1) std::this_thread::yield();
  EXPECT_TRUE(mutex.is_locked());
  EXPECT_FALSE(mutex.try_lock());
  phase.store(2);
  other.join();
  EXPECT_TRUE(mutex.try_lock());
  mutex.unlock();
}

// A try_lock never waits for a biased mutex's owner: two threads, each inside the mutex biased
// to it, each try_lock the other's (a stream's fast path does this with another stream's lock
// while holding its own). Waiting for the owner to leave, as lock() does, would deadlock here;
// both must come back, false, and the owners' next locks must still work.
TEST(BiasedMutexTest, TryLockGivesUpWhileTheOwnerIsInside) {
  if (!BiasedMutex::biasing_available()) GTEST_SKIP() << "membarrier unavailable: nothing biased";
  BiasedMutex first(/*adaptive=*/false);
  BiasedMutex second(/*adaptive=*/false);
  std::atomic<int> inside{0};
  std::atomic<int> tried{0};
  std::atomic<bool> got_other[2] = {false, false};
  auto owner = [&](int me, BiasedMutex& own, BiasedMutex& other) {
    bias_to_this_thread(own);
    own.lock_as_owner();
    inside.fetch_add(1);
    while (inside.load() != 2) std::this_thread::yield();
    // other_owner is inside `other` now, as this thread is inside `own`.
    if (other.try_lock_counting_runs()) {
      got_other[me] = true;
      other.unlock();
    }
    tried.fetch_add(1);
    while (tried.load() != 2) std::this_thread::yield();
    own.unlock_as_owner();
    for (int i = 0; i < 1000; ++i) OwnerLock lock(own);  // biased again, and usable
  };
  std::thread a(owner, 0, std::ref(first), std::ref(second));
  std::thread b(owner, 1, std::ref(second), std::ref(first));
  a.join();
  b.join();
  EXPECT_FALSE(got_other[0].load());
  EXPECT_FALSE(got_other[1].load());
  std::lock_guard lock_first(first);  // another thread's lock: revokes, then takes it
  EXPECT_FALSE(first.biased());
}

// After a try_lock gave up on an owner inside, the mutex is still biased, whatever the
// adaptivity would say (revoked within a few owner locks of its biasing): another thread's
// lock() must revoke and wait for the owner, not walk in beside it as into an unbiased mutex.
TEST(BiasedMutexTest, AFailedTryLockLeavesTheOwnerProtected) {
  if (!BiasedMutex::biasing_available()) GTEST_SKIP() << "membarrier unavailable: nothing biased";
  BiasedMutex mutex;  // adaptive
  bias_to_this_thread(mutex);
  mutex.lock_as_owner();
  bool tried = true;
  std::thread([&] { tried = mutex.try_lock_counting_runs(); }).join();
  EXPECT_FALSE(tried);
  std::atomic<bool> taken{false};
  std::thread other([&] {
    std::lock_guard lock(mutex);
    taken.store(true);
  });
  for (int i = 0; i < 200; ++i) {
    EXPECT_FALSE(taken.load()) << "another thread took the mutex while its owner held it";
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  mutex.unlock_as_owner();
  other.join();
  EXPECT_TRUE(taken.load());
}

// Exclusion holds with try_lock among the other threads: some take it with lock(), some with
// try_lock (which gives up while the owner is inside), none loses an increment or sees a torn
// pair.
TEST(BiasedMutexTest, OwnerLockAndOthersTryLockExcludeEachOther) {
  if (!BiasedMutex::biasing_available()) GTEST_SKIP() << "membarrier unavailable: nothing biased";
  Guarded guarded(/*adaptive=*/false);
  constexpr std::uint64_t kOwnerLocks = 200'000;
  constexpr std::uint64_t kOtherLocks = 2'000;
  std::atomic<bool> biased{false};
  std::atomic<std::uint64_t> other_increments{0};
  std::thread owner([&] {
    bias_to_this_thread(guarded.mutex);
    biased.store(true);
    for (std::uint64_t i = 0; i < kOwnerLocks; ++i) {
      OwnerLock lock(guarded.mutex);
      guarded.update_held();
    }
  });
  while (!biased.load()) std::this_thread::yield();
  std::thread other([&] {
    for (std::uint64_t i = 0; i < kOtherLocks; ++i) {
      if (i % 2 == 0) {
        guarded.mutex.lock();
      } else if (!guarded.mutex.try_lock_counting_runs()) {
        continue;
      }
      guarded.update_held();
      other_increments.fetch_add(1);
      guarded.mutex.unlock();
    }
  });
  owner.join();
  other.join();
  EXPECT_EQ(guarded.torn.load(), 0u);
  EXPECT_EQ(guarded.first, kOwnerLocks + other_increments.load());
  EXPECT_EQ(guarded.second, guarded.first);
  EXPECT_GE(other_increments.load(), kOtherLocks / 2);
}

// A child forked from a process whose lock is biased to another (now gone) thread takes it:
// membarrier's registration carries over fork (Linux), so the revocation works there, and the
// owner, absent from the child, is not inside. The child exits 0 only when the lock was taken.
TEST(BiasedMutexTest, AForkedChildTakesALockBiasedToAThreadOfItsParent) {
  if (!BiasedMutex::biasing_available()) GTEST_SKIP() << "membarrier unavailable: nothing biased";
  AutoBiasedMutex mutex;
  std::thread owner([&] {
    for (std::uint32_t i = 0; i <= BiasedMutex::kAutoBiasAfter; ++i) std::lock_guard lock(mutex);
  });
  owner.join();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    mutex.lock();
    const bool revoked = mutex.biased().revocations() == 1;
    mutex.unlock();
    _exit(revoked ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace vramledger
