// Sleep and wake by tag (issue 17, docs/sleep.md) on the simulated device, which keeps the bytes:
// physical memory of the sleeping tags goes back to the device, pointers stay, offloaded
// contents come back bitwise, discarded ones do not; pages shared with awake neighbours stay
// mapped and their bytes intact; every misuse is refused with nothing lost; a wake that finds
// the device full fails cleanly and works later; the ledger agrees with the census throughout.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "accounting/memory_breakdown.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/forwarding_backend.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;
constexpr TagId kWeights = 1;
constexpr TagId kKv = 2;
constexpr TagId kOther = 3;

class Sleep : public testing::Test {
 protected:
  Sleep() : device_(options()), allocator_(device_, &ledger_) {}
  static SimulatedDeviceOptions options() {
    SimulatedDeviceOptions o;
    o.capacity_bytes = 1 * kGiB;
    o.supports_virtual_memory = true;
    return o;
  }
  void expect_consistent(const char* where) {
    const BlockCensus census = allocator_.census();
    const ConsistencyReport report = check_consistency(ledger_, census);
    EXPECT_TRUE(report.ok()) << where << ": " << report.to_string();
    const MemoryBreakdown lines = compute_breakdown(ledger_.counters().aggregate());
    EXPECT_TRUE(lines.all_lines_non_negative()) << where;
    EXPECT_EQ(lines.sum(), lines.reserved) << where;
    EXPECT_EQ(static_cast<std::int64_t>(device_.physical_bytes_in_use()),
              census.pools[0].reserved_bytes + census.pools[1].reserved_bytes)
        << where << ": the device holds what the census says";
  }
  // Fills [ptr, ptr + bytes) with a pattern depending on `seed`.
  void fill(DevicePtr ptr, std::size_t bytes, std::uint8_t seed) {
    std::vector<std::uint8_t> data(bytes);
    for (std::size_t i = 0; i < bytes; ++i) data[i] = static_cast<std::uint8_t>(seed + i * 7);
    ASSERT_TRUE(device_.write_bytes(ptr, data.data(), bytes).is_ok());
  }
  bool holds(DevicePtr ptr, std::size_t bytes, std::uint8_t seed) {
    std::vector<std::uint8_t> data(bytes);
    if (!device_.read_bytes(ptr, data.data(), bytes).is_ok()) return false;
    for (std::size_t i = 0; i < bytes; ++i) {
      if (data[i] != static_cast<std::uint8_t>(seed + i * 7)) return false;
    }
    return true;
  }
  DevicePtr allocate(std::size_t bytes, TagId tag, StreamHandle stream = 0) {
    return allocator_.allocate(bytes, stream, tag);
  }
  std::int64_t sleeping_bytes() const { return ledger_.counters().aggregate().sleeping_bytes.current; }
  std::int64_t allocated_bytes() const {
    return ledger_.counters().aggregate().allocated_bytes.current;
  }
  static std::string message_of(const std::function<void()>& call, ErrorCode* code = nullptr) {
    try {
      call();
    } catch (const Error& error) {
      if (code != nullptr) *code = error.code();
      return error.what();
    }
    return "no error";
  }

  SimulatedDevice device_;
  Ledger ledger_;
  CachingAllocator allocator_;
};

TEST_F(Sleep, OffloadedWeightsComeBackBitwiseAndTheKvCacheGivesItsMemoryBack) {
  std::vector<DevicePtr> weights;
  auto weight_bytes = [](int i) { return (2 + i) * kMiB + 4096 * i; };  // pages shared
  for (int i = 0; i < 6; ++i) {
    weights.push_back(allocate(weight_bytes(i), kWeights));
    fill(weights.back(), weight_bytes(i), static_cast<std::uint8_t>(i));
  }
  const DevicePtr kv = allocate(64 * kMiB, kKv);
  fill(kv, 64 * kMiB, 99);
  expect_consistent("before");
  const std::size_t held = device_.physical_bytes_in_use();
  const std::int64_t allocated = allocated_bytes();

  const std::vector<TagId> tags = {kWeights, kKv};
  const std::vector<TagId> offload = {kWeights};
  const SleepResult slept = allocator_.sleep(tags, offload);
  EXPECT_EQ(slept.blocks, 7u);
  // The KV cache's last page is shared with the span's free rest: it stays.
  EXPECT_LE(slept.resident_bytes, 2 * kMiB);
  EXPECT_LE(device_.physical_bytes_in_use(), 2 * kMiB) << "the rest went back to the device";
  EXPECT_EQ(slept.released_bytes + device_.physical_bytes_in_use(), held);
  EXPECT_EQ(sleeping_bytes(), allocated);
  EXPECT_EQ(allocated_bytes(), 0);
  EXPECT_EQ(ledger_.counters().aggregate().sleeping_resident_bytes.current,
            static_cast<std::int64_t>(slept.resident_bytes));
  EXPECT_FALSE(device_.is_range_accessible(weights[0], 1)) << "unmapped while asleep";
  EXPECT_FALSE(device_.is_range_accessible(kv + 8 * kMiB, 1));
  expect_consistent("asleep");
  EXPECT_EQ(allocator_.sleeping_tags(), tags);
  const std::string text = ledger_.describe();
  EXPECT_NE(text.find("asleep"), std::string::npos) << text;

  const SleepResult woken = allocator_.wake();
  EXPECT_EQ(woken.blocks, 7u);
  EXPECT_EQ(woken.offloaded_bytes, slept.offloaded_bytes);
  EXPECT_EQ(allocated_bytes(), allocated);
  EXPECT_EQ(sleeping_bytes(), 0);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(allocator_.describe(weights[i]).base, weights[i]) << "the pointer is the same";
    EXPECT_TRUE(holds(weights[i], weight_bytes(i), static_cast<std::uint8_t>(i)))
        << "weight " << i << " restored bitwise";
  }
  EXPECT_TRUE(device_.is_range_accessible(kv, 64 * kMiB));
  EXPECT_FALSE(holds(kv + 8 * kMiB, 4096, 99 + 8 * 7 * kMiB % 256))
      << "the KV cache was discarded, not restored";
  expect_consistent("awake");

  // A second round reuses the host buffer and works the same.
  allocator_.sleep(tags, offload);
  expect_consistent("asleep again");
  allocator_.wake(tags);
  EXPECT_TRUE(holds(weights[5], weight_bytes(5), 5));
  for (DevicePtr ptr : weights) allocator_.deallocate(ptr);
  allocator_.deallocate(kv);
  expect_consistent("freed");
  allocator_.release_sleep_host_memory();
}

TEST_F(Sleep, TagsWokenApartShareAPageExactly) {
  // a (kKv) and b (kWeights) share a page; both sleep; waking b maps that page, a's bytes on it
  // become resident; sleeping b again releases it.
  const DevicePtr a = allocate(3 * kMiB + 512, kKv);
  const DevicePtr b = allocate(3 * kMiB + 512, kWeights);
  fill(b, 3 * kMiB + 512, 8);
  const std::vector<TagId> both = {kKv, kWeights};
  const std::vector<TagId> weights = {kWeights};
  const std::vector<TagId> kv = {kKv};
  allocator_.sleep(both, weights);
  expect_consistent("both asleep");
  allocator_.wake(weights);
  EXPECT_GT(ledger_.counters().aggregate().sleeping_resident_bytes.current, 0);
  EXPECT_TRUE(holds(b, 3 * kMiB + 512, 8));
  expect_consistent("one awake");
  allocator_.sleep(weights, weights);
  expect_consistent("both asleep again");
  allocator_.wake(kv);
  expect_consistent("the other awake");
  allocator_.wake(weights);
  EXPECT_TRUE(holds(b, 3 * kMiB + 512, 8));
  allocator_.deallocate(a);
  allocator_.deallocate(b);
  expect_consistent("end");
}

TEST_F(Sleep, PagesSharedWithAwakeNeighboursStayMappedAndIntact) {
  // Small blocks packed on shared pages: a, b (asleep), c (awake) in one span.
  const DevicePtr a = allocate(3 * kMiB + 512, kKv);
  const DevicePtr b = allocate(5 * kMiB + 1024, kWeights);
  const DevicePtr c = allocate(3 * kMiB + 512, kOther);
  fill(a, 3 * kMiB + 512, 1);
  fill(b, 5 * kMiB + 1024, 2);
  fill(c, 3 * kMiB + 512, 3);
  const std::vector<TagId> tags = {kKv, kWeights};
  const std::vector<TagId> offload = {kWeights};
  const SleepResult slept = allocator_.sleep(tags, offload);
  EXPECT_GT(slept.resident_bytes, 0u) << "the page b shares with c stays";
  EXPECT_GT(slept.released_bytes, 0u);
  EXPECT_TRUE(holds(c, 3 * kMiB + 512, 3)) << "the awake neighbour is untouched";
  EXPECT_EQ(ledger_.counters().aggregate().sleeping_resident_bytes.current,
            static_cast<std::int64_t>(slept.resident_bytes));
  expect_consistent("asleep with shared pages");

  // The awake neighbour is freed and its space reused while the others sleep.
  allocator_.deallocate(c);
  expect_consistent("neighbour freed");
  const DevicePtr d = allocate(2 * kMiB, kOther);
  fill(d, 2 * kMiB, 4);
  expect_consistent("space reused");

  const std::vector<TagId> weights = {kWeights};
  allocator_.wake(weights);  // one tag of two
  EXPECT_TRUE(holds(b, 5 * kMiB + 1024, 2));
  EXPECT_TRUE(holds(d, 2 * kMiB, 4));
  expect_consistent("one tag awake");
  const std::vector<TagId> kv = {kKv};
  allocator_.wake(kv);
  EXPECT_TRUE(holds(b, 5 * kMiB + 1024, 2));
  EXPECT_TRUE(holds(d, 2 * kMiB, 4));
  expect_consistent("all awake");
  for (DevicePtr ptr : {a, b, d}) allocator_.deallocate(ptr);
  allocator_.empty_cache();
  expect_consistent("empty");
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u);
}

TEST_F(Sleep, MisuseIsRefusedAndChangesNothing) {
  const DevicePtr w = allocate(8 * kMiB, kWeights);
  fill(w, 8 * kMiB, 5);
  const std::vector<TagId> weights = {kWeights};
  const std::vector<TagId> none;
  const std::vector<TagId> untagged = {kUntagged};
  const std::vector<TagId> other = {kOther};
  ErrorCode code = ErrorCode::kOk;
  EXPECT_NE(message_of([&] { allocator_.sleep(none); }, &code).find("no tag"), std::string::npos);
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_NE(message_of([&] { allocator_.sleep(untagged); }).find("untagged"), std::string::npos);
  EXPECT_NE(message_of([&] { allocator_.sleep(weights, other); }).find("not among"),
            std::string::npos);
  EXPECT_NE(message_of([&] { allocator_.wake(weights); }).find("not asleep"), std::string::npos);

  // During a graph capture: refused, nothing changes.
  device_.set_capture_underway(true);
  EXPECT_NE(message_of([&] { allocator_.sleep(weights, weights); }).find("capture"),
            std::string::npos);
  device_.set_capture_underway(false);
  EXPECT_TRUE(allocator_.sleeping_tags().empty());
  expect_consistent("refusals");

  allocator_.sleep(weights, weights);
  EXPECT_NE(message_of([&] { allocator_.sleep(weights); }).find("already asleep"),
            std::string::npos);
  EXPECT_NE(message_of([&] { allocator_.deallocate(w); }, &code).find("asleep"),
            std::string::npos);
  EXPECT_EQ(code, ErrorCode::kInvalidArgument);
  EXPECT_NE(message_of([&] { allocator_.record_stream(w, device_.create_stream()); })
                .find("asleep"),
            std::string::npos);
  EXPECT_NE(message_of([&] { allocate(kMiB, kWeights); }).find("asleep"), std::string::npos);
  EXPECT_NE(message_of([&] { allocator_.allocate_at(w, kMiB, 0, kWeights); }).find("asleep"),
            std::string::npos);
  EXPECT_NE(message_of([&] { allocator_.allocate_at(w, kMiB, 0, kOther); }).find("asleep"),
            std::string::npos)
      << "its bytes are not free for another tag either";
  EXPECT_EQ(allocator_.describe(w).tag, kWeights) << "a sleeping block is still described";
  device_.set_capture_underway(true);
  EXPECT_NE(message_of([&] { allocator_.wake(weights); }).find("capture"), std::string::npos);
  device_.set_capture_underway(false);
  expect_consistent("asleep after refusals");

  allocator_.wake(weights);
  EXPECT_NE(message_of([&] { allocator_.wake(weights); }).find("not asleep"), std::string::npos)
      << "waking twice";
  EXPECT_TRUE(holds(w, 8 * kMiB, 5));
  allocator_.deallocate(w);
  expect_consistent("end");
}

TEST_F(Sleep, ACrossStreamFreeOfTheTagCompletesBeforeTheSleep) {
  // sleep() waits for the device first, so a block of the tag freed on the main stream while a
  // side stream used it is free by then, not put to sleep.
  const StreamHandle side = device_.create_stream();
  const DevicePtr w = allocate(4 * kMiB, kWeights);
  const DevicePtr kept = allocate(4 * kMiB, kWeights);
  allocator_.record_stream(w, side);
  ASSERT_TRUE(device_.pause_stream(side).is_ok());
  allocator_.deallocate(w);  // pending: the side stream is paused
  const std::vector<TagId> weights = {kWeights};
  const SleepResult slept = allocator_.sleep(weights);
  EXPECT_EQ(slept.blocks, 1u);
  expect_consistent("asleep");
  ASSERT_TRUE(device_.resume_stream(side).is_ok());
  allocator_.wake(weights);
  allocator_.deallocate(kept);
  expect_consistent("end");
}

TEST_F(Sleep, AWakeOnAFullDeviceFailsCleanlyAndWorksLater) {
  const DevicePtr w = allocate(300 * kMiB, kWeights);
  fill(w, kMiB, 7);
  fill(w + 299 * kMiB, kMiB, 7);
  const std::vector<TagId> weights = {kWeights};
  allocator_.sleep(weights, weights);
  // Someone else takes the memory meanwhile.
  std::vector<DevicePtr> squatters;
  for (int i = 0; i < 4; ++i) squatters.push_back(allocate(200 * kMiB, kOther));
  const std::size_t before = device_.physical_bytes_in_use();
  std::string message;
  try {
    allocator_.wake(weights);
  } catch (const OutOfMemoryError& error) {
    message = error.what();
  }
  EXPECT_NE(message.find("Nothing is lost"), std::string::npos) << message;
  EXPECT_EQ(allocator_.sleeping_tags(), weights) << "still asleep";
  EXPECT_EQ(device_.physical_bytes_in_use(), before) << "what the attempt mapped went back";
  expect_consistent("after the failed wake");

  allocator_.deallocate(squatters.back());
  squatters.pop_back();
  allocator_.wake(weights);
  EXPECT_TRUE(holds(w, kMiB, 7) && holds(w + 299 * kMiB, kMiB, 7)) << "restored after the retry";
  expect_consistent("after the retry");
  for (DevicePtr ptr : squatters) allocator_.deallocate(ptr);
  allocator_.deallocate(w);
}

TEST_F(Sleep, InjectedFaultsLoseNothing) {
  const DevicePtr w = allocate(12 * kMiB, kWeights);
  fill(w, 12 * kMiB, 11);
  const std::vector<TagId> weights = {kWeights};
  // The offload copy fails: nothing changed.
  device_.inject_failure_at(SimOp::kCopyToHost, 1);
  EXPECT_NE(message_of([&] { allocator_.sleep(weights, weights); }).find("injected"),
            std::string::npos);
  EXPECT_TRUE(allocator_.sleeping_tags().empty());
  EXPECT_TRUE(holds(w, 12 * kMiB, 11));
  expect_consistent("failed offload");
  // An unmap fails: asleep anyway, the books say what is still held; the wake maps nothing.
  device_.inject_failure_at(SimOp::kUnmapPages, 1);
  EXPECT_NE(message_of([&] { allocator_.sleep(weights, weights); }).find("nothing is lost"),
            std::string::npos);
  EXPECT_EQ(allocator_.sleeping_tags(), weights);
  expect_consistent("failed unmap");
  allocator_.wake(weights);
  EXPECT_TRUE(holds(w, 12 * kMiB, 11));
  // Mapping on wake fails, then the restoring copy: still asleep, then a clean wake.
  allocator_.sleep(weights, weights);
  device_.inject_failure_at(SimOp::kMapPages, 1);
  EXPECT_NE(message_of([&] { allocator_.wake(weights); }).find("Nothing is lost"),
            std::string::npos);
  EXPECT_EQ(allocator_.sleeping_tags(), weights);
  expect_consistent("failed map");
  device_.inject_failure_at(SimOp::kCopyToDevice, 1);
  EXPECT_NE(message_of([&] { allocator_.wake(weights); }).find("Nothing is lost"),
            std::string::npos);
  EXPECT_EQ(allocator_.sleeping_tags(), weights);
  expect_consistent("failed restore");
  allocator_.wake(weights);
  EXPECT_TRUE(holds(w, 12 * kMiB, 11));
  allocator_.deallocate(w);
  expect_consistent("end");
}

// Random allocations under four tags on two streams, frees, and sleeps and wakes of random tag
// sets (some offloaded): after every step the ledger agrees with the census and the device, and
// every awake block holds what was written to it — neighbours of sleeping blocks on shared pages
// included — offloaded blocks come back bitwise after their wake.
TEST_F(Sleep, RandomSleepsAndWakesKeepEveryAwakeByteAndTheBooks) {
  std::mt19937_64 random(17);
  const StreamHandle streams[2] = {0, device_.create_stream()};
  struct Live {
    std::size_t bytes;
    TagId tag;
    std::uint8_t seed;
  };
  std::map<DevicePtr, Live> live;
  std::map<TagId, bool> asleep;       // tag -> offloaded
  auto check_bytes = [&](DevicePtr ptr, const Live& block) {
    // Both ends and a middle sample: a shared page lies at an end.
    const std::size_t n = std::min<std::size_t>(block.bytes, 8192);
    std::vector<std::uint8_t> data(n);
    for (std::size_t at : {std::size_t{0}, block.bytes - n, (block.bytes - n) / 2}) {
      ASSERT_TRUE(device_.read_bytes(ptr + at, data.data(), n).is_ok());
      for (std::size_t i = 0; i < n; i += 61) {
        ASSERT_EQ(data[i], static_cast<std::uint8_t>(block.seed + (at + i) * 7))
            << "block at " << ptr << " (tag " << block.tag << ") byte " << at + i;
      }
    }
  };
  auto wake = [&](const std::vector<TagId>& tags) {
    allocator_.wake(tags);
    for (TagId t : tags) {
      const bool offloaded = asleep[t];
      asleep.erase(t);
      for (auto& [ptr, block] : live) {
        if (block.tag != t || offloaded) continue;
        block.seed = static_cast<std::uint8_t>(random());  // discarded: written anew
        fill(ptr, block.bytes, block.seed);
      }
    }
  };
  const int steps = 400;
  std::size_t slept_blocks = 0;
  std::size_t released = 0;
  std::size_t resident = 0;
  for (int step = 0; step < steps; ++step) {
    const int op = static_cast<int>(random() % 10);
    const TagId tag = static_cast<TagId>(1 + random() % 4);
    if (op < 5) {  // allocate, odd sizes so that blocks share pages
      const std::size_t bytes = 1 + random() % (random() % 4 == 0 ? 6 * kMiB : 96 * 1024);
      if (asleep.contains(tag)) {
        EXPECT_NE(message_of([&] { allocate(bytes, tag, streams[random() % 2]); }).find("asleep"),
                  std::string::npos);
        continue;
      }
      const DevicePtr ptr = allocate(bytes, tag, streams[random() % 2]);
      const auto seed = static_cast<std::uint8_t>(random());
      fill(ptr, bytes, seed);
      live[ptr] = Live{bytes, tag, seed};
    } else if (op < 7 && !live.empty()) {  // free an awake block
      auto it = live.begin();
      std::advance(it, static_cast<std::ptrdiff_t>(random() % live.size()));
      if (asleep.contains(it->second.tag)) continue;
      allocator_.deallocate(it->first);
      live.erase(it);
    } else if (op < 9) {  // sleep some awake tags, offloading some
      std::vector<TagId> tags;
      std::vector<TagId> offload;
      for (TagId t = 1; t <= 4; ++t) {
        if (asleep.contains(t) || random() % 2 == 0) continue;
        tags.push_back(t);
        if (random() % 2 == 0) offload.push_back(t);
      }
      if (tags.empty()) continue;
      const SleepResult slept = allocator_.sleep(tags, offload);
      slept_blocks += slept.blocks;
      released += slept.released_bytes;
      resident += slept.resident_bytes;
      for (TagId t : tags) {
        asleep[t] = std::find(offload.begin(), offload.end(), t) != offload.end();
      }
    } else if (!asleep.empty()) {  // wake some sleeping tags
      std::vector<TagId> tags;
      for (const auto& [t, offloaded] : asleep) {
        if (random() % 2 == 0) tags.push_back(t);
      }
      if (tags.empty()) tags.push_back(asleep.begin()->first);
      wake(tags);
    }
    for (const auto& [ptr, block] : live) {
      if (!asleep.contains(block.tag)) check_bytes(ptr, block);
      if (HasFatalFailure()) return;
    }
    expect_consistent(("step " + std::to_string(step)).c_str());
    if (HasFailure()) return;
  }
  std::vector<TagId> rest;
  for (const auto& [t, offloaded] : asleep) rest.push_back(t);
  if (!rest.empty()) wake(rest);
  for (const auto& [ptr, block] : live) {
    check_bytes(ptr, block);
    allocator_.deallocate(ptr);
  }
  allocator_.empty_cache();
  expect_consistent("end");
  EXPECT_EQ(device_.physical_bytes_in_use(), 0u);
  // The run did what it is meant to test: blocks slept, pages went, shared pages stayed.
  EXPECT_GT(slept_blocks, 100u);
  EXPECT_GT(released, 0u);
  EXPECT_GT(resident, 0u);
  std::printf("slept %zu blocks, released %zu bytes, kept %zu resident\n", slept_blocks, released,
              resident);
}

TEST(SleepTeardown, AnAllocatorDestroyedWhileATagSleepsFreesItsHostCopy) {
  // Under AddressSanitizer a leaked host copy fails this test.
  SimulatedDevice device;
  {
    CachingAllocator allocator(device, nullptr);
    const DevicePtr w = allocator.allocate(3 * kMiB, 0, kWeights);
    ASSERT_NE(w, 0u);
    const std::vector<TagId> weights = {kWeights};
    EXPECT_EQ(allocator.sleep(weights, weights).offloaded_bytes, 3 * kMiB);
  }  // the sleeping block is leaked with its range, as live blocks are; its host copy is not
}

TEST(SleepFrontCache, AFreeOfASleepingBlockIsRefusedWithFrontCachesOn) {
  // Tagged blocks never enter a front cache; the front's free path hands a sleeping block to the
  // heap's refusal, and untagged traffic through the caches meanwhile keeps the books.
  SimulatedDevice device;
  Ledger ledger;
  AllocatorOptions options;
  options.front_cache_bytes = 64 * kMiB;
  CachingAllocator allocator(device, &ledger, options);
  const DevicePtr w = allocator.allocate(3 * kMiB, 0, kWeights);
  const std::vector<TagId> weights = {kWeights};
  allocator.sleep(weights, weights);
  for (int i = 0; i < 100; ++i) allocator.deallocate(allocator.allocate(4096, 0));
  try {
    allocator.deallocate(w);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_TRUE(check_consistency(ledger, allocator.census()).ok());
  allocator.wake(weights);
  allocator.deallocate(w);
  EXPECT_TRUE(check_consistency(ledger, allocator.census()).ok());
}

// Counts host allocations: prepare_offload pins, the sleep after it does not.
class CountingHost final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  Status allocate_host(std::size_t bytes, void** out) override {
    ++allocations;
    return ForwardingBackend::allocate_host(bytes, out);
  }
  int allocations = 0;
};

TEST(SleepPrepare, HostMemoryPinnedAtStartUpServesTheFirstSleep) {
  SimulatedDevice device;
  CountingHost host(device);
  Ledger ledger;
  CachingAllocator allocator(host, &ledger);
  const DevicePtr w = allocator.allocate(3 * kMiB, 0, kWeights);
  const DevicePtr kv = allocator.allocate(5 * kMiB, 0, kKv);
  std::vector<std::uint8_t> pattern(3 * kMiB);
  for (std::size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<std::uint8_t>(i * 13);
  ASSERT_TRUE(device.write_bytes(w, pattern.data(), pattern.size()).is_ok());

  const std::vector<TagId> weights = {kWeights};
  const std::vector<TagId> both = {kWeights, kKv};
  EXPECT_EQ(allocator.prepare_offload(weights), 3 * kMiB);
  EXPECT_EQ(host.allocations, 1);
  EXPECT_EQ(allocator.prepare_offload(weights), 3 * kMiB) << "a kept buffer that fits counts";
  EXPECT_EQ(host.allocations, 1) << "and is not pinned twice";
  EXPECT_EQ(allocator.kept_sleep_host_bytes(), 3 * kMiB);

  EXPECT_EQ(allocator.sleep(both, weights).offloaded_bytes, 3 * kMiB);
  EXPECT_EQ(host.allocations, 1) << "the first sleep used the prepared buffer";
  EXPECT_EQ(allocator.kept_sleep_host_bytes(), 0u) << "it holds the weights now";
  EXPECT_EQ(allocator.prepare_offload(weights), 0u) << "a sleeping tag already has its copy";
  EXPECT_EQ(host.allocations, 1);
  allocator.wake();
  std::vector<std::uint8_t> back(pattern.size());
  ASSERT_TRUE(device.read_bytes(w, back.data(), back.size()).is_ok());
  EXPECT_EQ(back, pattern);
  EXPECT_EQ(allocator.kept_sleep_host_bytes(), 3 * kMiB) << "kept for the next sleep";
  EXPECT_TRUE(check_consistency(ledger, allocator.census()).ok());

  const std::vector<TagId> untagged = {kUntagged};
  try {
    allocator.prepare_offload(untagged);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
  }
  allocator.deallocate(w);
  allocator.deallocate(kv);
}

TEST(SleepSegmentHeap, IsNotSupportedWithoutVirtualMemory) {
  SimulatedDeviceOptions o;
  o.supports_virtual_memory = false;
  SimulatedDevice device(o);
  CachingAllocator allocator(device, nullptr);
  const DevicePtr w = allocator.allocate(kMiB, 0, kWeights);
  const std::vector<TagId> weights = {kWeights};
  try {
    allocator.sleep(weights);
    ADD_FAILURE() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kNotSupported);
  }
  allocator.deallocate(w);
}

}  // namespace
}  // namespace vramledger
