// Unit tests for src/transport/socket_number: the descriptor through which a
// channel reaches its socket, the application's own number or a private
// dup. A channel made with a dup gives it up for the application's number
// (use_locked) and takes one again when asked (own); a system call of its
// own in progress (Use) holds own() back, so that the application's close
// of the number cannot come between that call's read of the number and the
// call itself.

#include "transport/socket_number.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

namespace rsock {
namespace {

bool same_file(int a, int b) {
  struct stat sa, sb;
  return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_ino == sb.st_ino &&
         sa.st_dev == sb.st_dev;
}

bool open_fd(int fd) { return fcntl(fd, F_GETFD) >= 0; }

// The pairing's dup goes at the hand-over, and the application's number
// serves from then on; own() makes a new dup of the same socket, which the
// object closes when it goes. The application's number is never closed.
TEST(SocketNumber, GivesItsDupUpForTheApplicationsNumberAndTakesOneAgain) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  const int pairing_dup = dup(sv[0]);
  ASSERT_GE(pairing_dup, 0);
  int own_dup = -1;
  {
    SocketNumber n(pairing_dup, true);
    EXPECT_TRUE(n.owned());
    EXPECT_FALSE(n.uses(sv[0]));
    {
      std::lock_guard<std::mutex> lock(n.mutex());
      ASSERT_TRUE(n.use_locked(sv[0]));
      EXPECT_FALSE(n.use_locked(sv[0])) << "the application's number is not ours to give up";
    }
    EXPECT_EQ(n.fd(), sv[0]);
    EXPECT_FALSE(n.owned());
    EXPECT_TRUE(n.uses(sv[0]));
    EXPECT_FALSE(open_fd(pairing_dup)) << "the pairing's dup stayed open";
    ASSERT_EQ(n.own(), 0);
    own_dup = n.fd();
    EXPECT_NE(own_dup, sv[0]);
    EXPECT_TRUE(n.owned());
    EXPECT_TRUE(same_file(own_dup, sv[0]));
    ASSERT_EQ(n.own(), 0);  // again: the same dup
    EXPECT_EQ(n.fd(), own_dup);
  }
  EXPECT_FALSE(open_fd(own_dup)) << "the channel's dup outlived it";
  EXPECT_TRUE(open_fd(sv[0])) << "the application's number was closed";
  // The application's number alone: nothing of it is closed at the end.
  {
    SocketNumber n(sv[0], false);
    n.close();
    EXPECT_EQ(n.fd(), sv[0]);
  }
  EXPECT_TRUE(open_fd(sv[0]));
  close(sv[0]);
  close(sv[1]);
}

// A system call of the channel's own that began on the application's
// number (a Use, held 100 ms here) keeps own() from returning until it is
// over: the application's close of the number, and a new file under it,
// come only after. Without the wait, the Use's call ran on the socket
// pair that took the number (tried: fails every run).
TEST(SocketNumber, OwnWaitsForAUseOfTheOldNumber) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  struct stat original;
  ASSERT_EQ(fstat(sv[0], &original), 0);
  SocketNumber n(sv[0], false);
  std::atomic<bool> in_use{false};
  std::atomic<bool> same{false};
  std::thread user([&] {
    SocketNumber::Use u(n);
    in_use.store(true);
    usleep(100 * 1000);
    struct stat now;
    same.store(fstat(u.fd(), &now) == 0 && now.st_ino == original.st_ino &&
               now.st_dev == original.st_dev);
  });
  while (!in_use.load()) usleep(1000);
  ASSERT_EQ(n.own(), 0);
  EXPECT_NE(n.fd(), sv[0]);
  // The application closes its number, which a new file takes at once.
  const int old = sv[0];
  close(old);
  int other[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, other), 0);
  EXPECT_EQ(other[0], old) << "the number was not taken again (the test proves nothing)";
  user.join();
  EXPECT_TRUE(same.load()) << "a Use's call ran on the file that took the number";
  // A Use after own() reads the dup.
  {
    SocketNumber::Use u(n);
    EXPECT_EQ(u.fd(), n.fd());
    struct stat now;
    ASSERT_EQ(fstat(u.fd(), &now), 0);
    EXPECT_EQ(now.st_ino, original.st_ino) << "the dup names another file";
  }
  close(other[0]);
  close(other[1]);
  close(sv[1]);
}

// A lingering close takes the dup over (release: the object no longer
// closes it); retire puts a placeholder in the dup's place, or names the
// placeholder instead of the application's number.
TEST(SocketNumber, ReleaseAndRetire) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  int kept = -1;
  {
    SocketNumber n(dup(sv[0]), true);
    kept = n.release();
    EXPECT_GE(kept, 0);
    EXPECT_FALSE(n.owned());
    EXPECT_EQ(n.release(), -1);
  }
  EXPECT_TRUE(open_fd(kept)) << "a released dup was closed";
  close(kept);
  int dead[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, dead), 0);
  {
    SocketNumber n(sv[0], false);
    n.retire(dead[0]);
    EXPECT_EQ(n.fd(), dead[0]);
    EXPECT_TRUE(n.retired());
    EXPECT_EQ(n.own(), 0);
    EXPECT_FALSE(n.owned()) << "a retired number took a dup";
  }
  {
    const int d = dup(sv[0]);
    SocketNumber n(d, true);
    n.retire(dead[0]);
    EXPECT_EQ(n.fd(), d);
    EXPECT_TRUE(same_file(d, dead[0])) << "the dup's number does not name the placeholder";
  }
  EXPECT_TRUE(open_fd(sv[0]));
  close(dead[0]);
  close(dead[1]);
  close(sv[0]);
  close(sv[1]);
}

}  // namespace
}  // namespace rsock
