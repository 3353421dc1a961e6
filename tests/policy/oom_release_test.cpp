// Out of memory that helps (issue 16), at the policy: at the cap and at the simulated device's
// limit an allocation that cannot be served frees the cache, retries, and raises; afterwards the
// allocator holds only its live blocks' memory (nothing the failed attempt gathered), the ledger
// agrees with the census and the device, the message names the request, the cause and the
// ledger's account, and later requests succeed.
#include <gtest/gtest.h>

#include <string>

#include "accounting/consistency.hpp"
#include "accounting/ledger.hpp"
#include "allocator/caching_allocator.hpp"
#include "allocator/simulated/simulated_device.hpp"

namespace vramledger {
namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;
constexpr std::size_t kGiB = std::size_t{1} << 30;

class OomRelease : public testing::TestWithParam<bool> {  // param: paged heap (VMM)
 protected:
  OomRelease() : device_(options()), allocator_(device_, &ledger_) {}
  SimulatedDeviceOptions options() const {
    SimulatedDeviceOptions o;
    o.capacity_bytes = 2 * kGiB;
    o.supports_virtual_memory = GetParam();
    return o;
  }
  std::int64_t reserved() const {
    const BlockCensus census = allocator_.census();
    return census.pools[0].reserved_bytes + census.pools[1].reserved_bytes;
  }
  // Raises OutOfMemoryError for `bytes`; returns its message.
  std::string out_of_memory(std::size_t bytes) {
    try {
      allocator_.deallocate(allocator_.allocate(bytes, 0));
    } catch (const OutOfMemoryError& error) {
      return error.what();
    }
    return "no out-of-memory error";
  }
  void expect_only_live_memory_held(std::int64_t live_reserved) {
    const BlockCensus census = allocator_.census();
    EXPECT_TRUE(check_consistency(ledger_, census).ok())
        << check_consistency(ledger_, census).to_string();
    EXPECT_EQ(census.free_physical_pages, 0) << "pages the failed attempt gathered are held";
    EXPECT_EQ(reserved(), live_reserved) << "the cache went back before the error";
    EXPECT_EQ(static_cast<std::int64_t>(device_.physical_bytes_in_use()), reserved());
  }

  SimulatedDevice device_;
  Ledger ledger_;
  CachingAllocator allocator_;
};

TEST_P(OomRelease, AtTheCapTheCacheAndTheGatheredPagesGoBack) {
  const DevicePtr kept = allocator_.allocate(20 * kMiB, 0);
  const std::int64_t live_reserved = reserved();
  allocator_.deallocate(allocator_.allocate(64 * kMiB, 0));  // cached
  ASSERT_GE(reserved(), live_reserved + static_cast<std::int64_t>(64 * kMiB));
  allocator_.set_cap(static_cast<std::size_t>(reserved()) + 32 * kMiB);
  const std::int64_t retries = ledger_.counters().num_alloc_retries;
  const std::string what = out_of_memory(100 * kMiB);  // above the cap, below cap + cache
  EXPECT_EQ(what.rfind("out of memory: tried to allocate 100.00 MiB (104857600 bytes) on device 0",
                       0), 0u) << what;
  EXPECT_NE(what.find("under a cap of"), std::string::npos) << what;
  EXPECT_NE(what.find("Cause: "), std::string::npos) << what;
  EXPECT_NE(what.find("fragmentation"), std::string::npos) << "the ledger's account: " << what;
  EXPECT_EQ(ledger_.counters().num_alloc_retries, retries + 1);
  EXPECT_EQ(ledger_.counters().num_ooms, 1);
  expect_only_live_memory_held(live_reserved);
  // The process continues: within the cap, and the same request once the cap is lifted.
  allocator_.deallocate(allocator_.allocate(8 * kMiB, 0));
  allocator_.set_cap(0);
  allocator_.deallocate(allocator_.allocate(100 * kMiB, 0));
  allocator_.deallocate(kept);
  allocator_.empty_cache();
  EXPECT_EQ(reserved(), 0);
}

TEST_P(OomRelease, AtTheDeviceLimitTheCacheAndTheGatheredPagesGoBack) {
  const DevicePtr filler = allocator_.allocate(1536 * kMiB, 0);  // 1.5 of the 2 GiB
  const std::int64_t live_reserved = reserved();
  allocator_.deallocate(allocator_.allocate(256 * kMiB, 0));  // cached
  const std::string what = out_of_memory(600 * kMiB);  // the device could hold it, not now
  EXPECT_NE(what.find("tried to allocate 600.00 MiB"), std::string::npos) << what;
  EXPECT_NE(what.find("the device has "), std::string::npos) << what;
  EXPECT_EQ(ledger_.counters().num_alloc_retries, 1);
  expect_only_live_memory_held(live_reserved);
  allocator_.deallocate(allocator_.allocate(400 * kMiB, 0));  // fits: the process continues
  allocator_.deallocate(filler);
  allocator_.deallocate(allocator_.allocate(600 * kMiB, 0));
}

INSTANTIATE_TEST_SUITE_P(Heaps, OomRelease, testing::Bool(),
                         [](const testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "Paged" : "Segment");
                         });

}  // namespace
}  // namespace vramledger
