#include "accounting/stat.hpp"

#include <gtest/gtest.h>

namespace vramledger {
namespace {

TEST(Stat, IncreaseAndDecreaseTrackCurrentPeakAndTotals) {
  Stat stat;
  stat.increase(10);
  stat.increase(5);
  stat.decrease(12);
  stat.increase(4);
  EXPECT_EQ(stat.current, 7);
  EXPECT_EQ(stat.peak, 15);
  EXPECT_EQ(stat.allocated, 19);
  EXPECT_EQ(stat.freed, 12);
}

TEST(Stat, ResetPeakStartsFromCurrent) {
  Stat stat;
  stat.increase(100);
  stat.decrease(60);
  stat.reset_peak();
  EXPECT_EQ(stat.peak, 40);
  stat.increase(10);
  EXPECT_EQ(stat.peak, 50);
}

TEST(Stat, ResetAccumulatedKeepsCurrentAndPeak) {
  Stat stat;
  stat.increase(100);
  stat.decrease(30);
  stat.reset_accumulated();
  EXPECT_EQ(stat.current, 70);
  EXPECT_EQ(stat.peak, 100);
  EXPECT_EQ(stat.allocated, 0);
  EXPECT_EQ(stat.freed, 0);
}

TEST(Stat, DecreaseNeverClamps) {
  Stat stat;
  stat.increase(1);
  stat.decrease(3);
  EXPECT_EQ(stat.current, -2);
}

}  // namespace
}  // namespace vramledger
