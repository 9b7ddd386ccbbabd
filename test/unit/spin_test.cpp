// Unit tests for src/common/spin.h: the spin budget shrinks after a run of
// misses, probes at full length now and then, and is restored by a catch.
#include "common/spin.h"

#include <gtest/gtest.h>

namespace rsock {
namespace {

constexpr int64_t kFull = 80000;

TEST(SpinGovernor, FullUntilFourMissesInARow) {
  SpinGovernor g;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(g.budget(kFull), kFull) << "after " << i << " misses";
    g.missed();
  }
  EXPECT_EQ(g.budget(kFull), kFull);
  g.missed();  // the fourth
  EXPECT_EQ(g.budget(kFull), kFull / 8);
}

TEST(SpinGovernor, ACatchRestoresTheFullSpin) {
  SpinGovernor g;
  for (int i = 0; i < 6; ++i) g.missed();
  ASSERT_EQ(g.budget(kFull), kFull / 8);
  g.caught();
  EXPECT_EQ(g.budget(kFull), kFull);
  g.missed();  // one miss after a catch: still full
  EXPECT_EQ(g.budget(kFull), kFull);
}

TEST(SpinGovernor, ProbesAtFullLengthEverySixteenthWaitAndNeverSticks) {
  SpinGovernor g;
  int full = 0, short_ = 0;
  for (int i = 0; i < 1000; ++i) {  // far past the counter's 8 bits
    g.missed();
    (g.budget(kFull) == kFull ? full : short_)++;
  }
  // After the first three, one wait in 16 probes at full length.
  EXPECT_GT(short_, 900);
  EXPECT_GE(full, 1000 / 16 - 2);
  EXPECT_LE(full, 1000 / 16 + 6);
}

}  // namespace
}  // namespace rsock
