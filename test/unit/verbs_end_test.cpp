// Unit tests for src/transport/verbs/verbs_end.h, the memory that the
// processes holding one end of an RDMA connection share, and its owner
// protocol (no RDMA device needed): an end is made for one TCP connection
// and an exec'd image accepts only that one; a takeover fences the owner (its
// operations fail from then on) and waits for the one in progress, but not
// for an owner that released the end or died (a zombie included); a frame
// lock held by a dead process is taken over; a spawned child that never got
// the socket gives its holder count back.
#include "transport/verbs/verbs_end.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "transport/addr.h"

namespace rsock {
namespace {

struct Pair {
  int listener = -1, client = -1, server = -1;
  Pair() {
    listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(listener, 4) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      return;
    client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return;
    server = accept(listener, nullptr, nullptr);
  }
  ~Pair() {
    for (int fd : {listener, client, server})
      if (fd >= 0) close(fd);
  }
};

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// An end made for p's client socket.
VerbsEnd end_for(const Pair& p) {
  WireAddr local, peer;
  EXPECT_TRUE(fd_addrs(p.client, &local, &peer));
  VerbsEnd e;
  EXPECT_EQ(VerbsEnd::create(8192, local, peer, &e), 0);
  return e;
}

TEST(VerbsEnd, CreatedOwnedByUsWithItsRings) {
  Pair p;
  ASSERT_GE(p.server, 0);
  VerbsEnd e = end_for(p);
  ASSERT_TRUE(e.valid());
  EXPECT_EQ(e.hdr()->own.epoch.load(), 1u);
  EXPECT_EQ(e.hdr()->own.owner_pid.load(), getpid());
  EXPECT_EQ(e.hdr()->holders.load(), 1u);
  EXPECT_EQ(e.ring_bytes(), 8192u);
  ASSERT_NE(e.rx_ring(), nullptr);
  EXPECT_EQ(e.tx_mirror(), e.rx_ring() + 8192);
  e.rx_ring()[0] = 7;  // writable, shared: a second mapping sees it
  e.tx_mirror()[8191] = 9;
  uint8_t* first = e.rx_ring();
  e.unmap_rings();
  ASSERT_EQ(e.map_rings(), 0);
  EXPECT_EQ(e.rx_ring()[0], 7);
  EXPECT_EQ(e.tx_mirror()[8191], 9);
  (void)first;
  // Sealed: its size is final.
  EXPECT_NE(ftruncate(e.memfd(), 4096), 0);
  EXPECT_EQ(fcntl(e.memfd(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

TEST(VerbsEnd, AnExecdImageAcceptsOnlyItsOwnConnectionsEnd) {
  Pair p, other;
  ASSERT_GE(p.server, 0);
  ASSERT_GE(other.server, 0);
  VerbsEnd e = end_for(p);
  const uint64_t nonce = e.hdr()->nonce;
  int dup = fcntl(e.memfd(), F_DUPFD, 0);
  VerbsEnd got;
  EXPECT_EQ(VerbsEnd::validate(dup, other.client, nonce, &got), -EPROTO);  // another connection
  EXPECT_EQ(VerbsEnd::validate(dup, p.server, nonce, &got), -EPROTO);      // its other end
  EXPECT_EQ(VerbsEnd::validate(dup, p.client, nonce + 1, &got), -EPROTO);  // another nonce
  int plain = memfd_create("x", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(plain, 4096 + 2 * 8192), 0);
  EXPECT_EQ(VerbsEnd::validate(plain, p.client, nonce, &got), -EPROTO);  // not sealed
  close(plain);
  ASSERT_EQ(VerbsEnd::validate(dup, p.client, nonce, &got), 0);
  EXPECT_EQ(got.ring_bytes(), 8192u);
  EXPECT_EQ(got.rx_ring(), nullptr);  // the rings are mapped by the taker itself
  EXPECT_EQ(got.hdr()->nonce, nonce);
  EXPECT_EQ(fcntl(dup, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
}

TEST(VerbsEnd, ATakeoverFencesTheOwner) {
  Pair p;
  ASSERT_GE(p.server, 0);
  VerbsEnd e = end_for(p);
  VerbsEndHeader* h = e.hdr();
  ASSERT_TRUE(end_enter(h, 1));
  end_leave(h);
  uint64_t epoch = 0;
  ASSERT_TRUE(end_lock_frames(h, now_ms() + 1000));
  ASSERT_EQ(end_fence(h, now_ms() + 1000, &epoch), 0);
  end_unlock_frames(h);
  EXPECT_EQ(epoch, 2u);
  EXPECT_FALSE(end_enter(h, 1));  // the previous owner's operations fail
  EXPECT_FALSE(end_owns(h, 1));
  EXPECT_EQ(h->own.busy.load(), 0);  // and count nothing
  EXPECT_TRUE(end_enter(h, 2));
  end_leave(h);
}

TEST(VerbsEnd, TheFenceWaitsForTheOperationInProgress) {
  Pair p;
  ASSERT_GE(p.server, 0);
  VerbsEnd e = end_for(p);
  VerbsEndHeader* h = e.hdr();
  // Another process owns it (ourselves would count as our image before
  // exec, which the fence does not wait for): a child that only lives.
  const pid_t owner = fork();
  if (owner == 0) {
    pause();
    _exit(0);
  }
  h->own.owner_pid.store(owner);
  ASSERT_TRUE(end_enter(h, 1));  // its operation (counted here for it)
  std::atomic<bool> left{false};
  std::thread op([&] {
    usleep(100000);
    left = true;
    end_leave(h);
  });
  uint64_t epoch = 0;
  ASSERT_EQ(end_fence(h, now_ms() + 10000, &epoch), 0);
  EXPECT_TRUE(left.load());  // not before the operation left
  op.join();
  // Bounded: an operation that never ends fails the fence at its deadline.
  h->own.owner_pid.store(owner);
  ASSERT_TRUE(end_enter(h, epoch));
  EXPECT_EQ(end_fence(h, now_ms() + 50, &epoch), -ETIMEDOUT);
  end_leave(h);
  kill(owner, SIGKILL);
  waitpid(owner, nullptr, 0);
}

TEST(VerbsEnd, TheFenceDoesNotWaitForAReleasedOrDeadOwner) {
  Pair p;
  ASSERT_GE(p.server, 0);
  VerbsEnd e = end_for(p);
  VerbsEndHeader* h = e.hdr();
  // A dead owner (a zombie: exited, not reaped) that died inside an
  // operation: its count is void.
  const pid_t owner = fork();
  if (owner == 0) {
    h->own.owner_pid.store(getpid());
    end_enter(h, 1);
    _exit(0);
  }
  for (int i = 0; i < 500 && h->own.busy.load() == 0; ++i) usleep(2000);
  ASSERT_EQ(h->own.busy.load(), 1);
  usleep(50000);  // (it has exited: a zombie until we wait for it)
  uint64_t epoch = 0;
  EXPECT_TRUE(pid_gone(owner));
  ASSERT_EQ(end_fence(h, now_ms() + 10000, &epoch), 0);
  EXPECT_EQ(h->own.busy.load(), 0);
  waitpid(owner, nullptr, 0);
  // A released end (its owner closed, exited or exec'd).
  end_release(h, epoch);
  EXPECT_EQ(h->own.owner_pid.load(), 0);
  EXPECT_TRUE(end_owns(h, epoch));  // until someone takes it: an exec that fails goes on
  EXPECT_TRUE(end_reclaim(h, epoch));
  EXPECT_EQ(h->own.owner_pid.load(), getpid());
  end_release(h, epoch);
  ASSERT_EQ(end_fence(h, now_ms() + 10000, &epoch), 0);
  EXPECT_FALSE(end_reclaim(h, epoch - 1));  // taken since: no way back
}

TEST(VerbsEnd, AFrameLockOfADeadProcessIsTakenOver) {
  Pair p;
  ASSERT_GE(p.server, 0);
  VerbsEnd e = end_for(p);
  VerbsEndHeader* h = e.hdr();
  const pid_t holder = fork();
  if (holder == 0) {
    end_lock_frames(h, now_ms() + 1000);
    _exit(0);
  }
  waitpid(holder, nullptr, 0);
  EXPECT_EQ(h->frame_lock.load(), holder);
  ASSERT_TRUE(end_lock_frames(h, now_ms() + 1000));
  EXPECT_EQ(h->frame_lock.load(), getpid());
  end_unlock_frames(h);
  // A live holder keeps it: bounded wait.
  const pid_t live = fork();
  if (live == 0) {
    end_lock_frames(h, now_ms() + 1000);
    pause();
    _exit(0);
  }
  for (int i = 0; i < 500 && h->frame_lock.load() != live; ++i) usleep(2000);
  EXPECT_FALSE(end_lock_frames(h, now_ms() + 50));
  kill(live, SIGKILL);
  waitpid(live, nullptr, 0);
}

TEST(VerbsEnd, ASpawnThatNeverGotTheSocketGivesItsCountBack) {
  Pair p;
  ASSERT_GE(p.server, 0);
  VerbsEnd e = end_for(p);
  e.hdr()->holders.store(2);
  verbs_end_drop_holder(e.memfd(), e.hdr()->nonce + 1);  // not this end
  EXPECT_EQ(e.hdr()->holders.load(), 2u);
  verbs_end_drop_holder(e.memfd(), e.hdr()->nonce);
  EXPECT_EQ(e.hdr()->holders.load(), 1u);
}

}  // namespace
}  // namespace rsock
