// librsock's own descriptors above the application's (common/own_fd.h):
// the floor follows RLIMIT_NOFILE, lift_fd and dup_high land at or above it,
// and with no room above it they keep working at the lowest free number.
#include "common/own_fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <vector>

namespace rsock {
namespace {

// Sets the soft RLIMIT_NOFILE for one test and restores it after.
class SoftLimit {
 public:
  explicit SoftLimit(rlim_t soft) {
    getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit rl = saved_;
    rl.rlim_cur = soft;
    ok_ = setrlimit(RLIMIT_NOFILE, &rl) == 0;
  }
  ~SoftLimit() { setrlimit(RLIMIT_NOFILE, &saved_); }
  bool ok() const { return ok_; }

 private:
  rlimit saved_;
  bool ok_ = false;
};

TEST(OwnFd, FloorFollowsTheLimit) {
  {
    SoftLimit l(4096);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(own_fd_floor(), 1024);
  }
  {
    SoftLimit l(1024);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(own_fd_floor(), 512);
  }
  {
    SoftLimit l(40);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(own_fd_floor(), 0);
  }
}

TEST(OwnFd, LiftMovesAboveTheFloorAndClosesTheLowNumber) {
  SoftLimit l(1024);
  ASSERT_TRUE(l.ok());
  const int low = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(low, 0);
  ASSERT_LT(low, 512);
  const int high = lift_fd(low);
  EXPECT_GE(high, 512);
  EXPECT_EQ(fcntl(low, F_GETFD), -1) << "the low number is free again";
  EXPECT_EQ(fcntl(high, F_GETFD), FD_CLOEXEC);
  EXPECT_EQ(lift_fd(high), high) << "already above: stays";
  EXPECT_EQ(lift_fd(-5), -5);
  close(high);
}

TEST(OwnFd, DupHighHonoursCloexecAndFallsBackBelow) {
  SoftLimit l(1024);
  ASSERT_TRUE(l.ok());
  const int fd = open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  const int a = dup_high(fd);
  const int b = dup_high(fd, false);
  EXPECT_GE(a, 512);
  EXPECT_GE(b, 512);
  EXPECT_EQ(fcntl(a, F_GETFD), FD_CLOEXEC);
  EXPECT_EQ(fcntl(b, F_GETFD), 0);
  close(a);
  close(b);
  {
    // A limit just above the numbers in use: the floor (half) has no room
    // left once every number from it up is taken.
    SoftLimit tight(64);
    ASSERT_TRUE(tight.ok());
    std::vector<int> held;
    for (int d; (d = fcntl(fd, F_DUPFD, own_fd_floor())) >= 0;) held.push_back(d);
    const int c = dup_high(fd);
    EXPECT_GE(c, 0) << "falls back to the lowest free number";
    EXPECT_LT(c, own_fd_floor());
    if (c >= 0) close(c);
    for (int d : held) close(d);
  }
  close(fd);
}

}  // namespace
}  // namespace rsock
