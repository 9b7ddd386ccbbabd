// Unit tests for src/socket/wake_hub.h: a kick reaches every other joined
// sleeper and nobody else, the shared fd stays readable until those it was
// for have left, a level sleeper that joins meanwhile gets a fd of its own,
// blocking calls share one doorbell owner and sleep on the word otherwise;
// and, with threads of every kind sleeping on one destructively drained
// doorbell (a socketpair, as the shm transport's), no wakeup is lost.
#include "socket/wake_hub.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "socket/interruptible.h"

namespace rsock {
namespace {

bool readable(int fd) {
  pollfd p = {fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

TEST(WakeHub, ALoneSleeperMakesNoNoise) {
  WakeHub hub;
  WakeHub::PrivateFd own;
  const WakeHub::Ticket t = hub.join(&own);
  ASSERT_EQ(t.kind, WakeHub::Ticket::kLevel);
  ASSERT_GE(t.fd, 0);
  hub.kick(true);  // its own drain: nobody else to wake
  EXPECT_FALSE(readable(t.fd));
  EXPECT_EQ(hub.sleepers(), 1u);
  hub.leave(t);
  EXPECT_EQ(hub.sleepers(), 0u);
}

TEST(WakeHub, AKickReachesTheOthersAndClearsWhenTheyLeft) {
  WakeHub hub;
  WakeHub::PrivateFd own_a, own_b;
  const WakeHub::Ticket a = hub.join(&own_a);
  const WakeHub::Ticket b = hub.join(&own_b);
  ASSERT_EQ(a.fd, b.fd);  // both on the shared fd
  hub.kick(true);         // a drained a doorbell
  EXPECT_TRUE(readable(b.fd));
  hub.leave(a);
  EXPECT_TRUE(readable(b.fd)) << "cleared before b saw it";
  hub.leave(b);
  EXPECT_FALSE(readable(b.fd)) << "not cleared once everybody left";
}

TEST(WakeHub, AKickFromOutsideReachesTheLoneSleeper) {
  WakeHub hub;
  WakeHub::PrivateFd own;
  const WakeHub::Ticket t = hub.join(&own);
  hub.kick(false);  // a thread that is not asleep (epoll_wait spinning) drained
  EXPECT_TRUE(readable(t.fd));
  hub.leave(t);
  EXPECT_FALSE(readable(t.fd));
}

TEST(WakeHub, ALevelSleeperJoiningWhileReadableGetsItsOwnFd) {
  WakeHub hub;
  WakeHub::PrivateFd own_a, own_b, own_c;
  const WakeHub::Ticket a = hub.join(&own_a);
  const WakeHub::Ticket b = hub.join(&own_b);
  hub.kick(true);
  ASSERT_TRUE(readable(a.fd));
  // It would wake at once on the shared fd, and spin until a and b left.
  const WakeHub::Ticket c = hub.join(&own_c);
  ASSERT_EQ(c.kind, WakeHub::Ticket::kPrivate);
  ASSERT_GE(c.fd, 0);
  EXPECT_NE(c.fd, a.fd);
  EXPECT_FALSE(readable(c.fd));
  hub.kick(true);  // b drained: a and c must look again
  EXPECT_TRUE(readable(c.fd));
  hub.leave(a);
  hub.leave(b);
  EXPECT_FALSE(readable(a.fd));
  hub.leave(c);
  EXPECT_EQ(hub.sleepers(), 0u);
  // The next sleep is on the shared fd again.
  WakeHub::PrivateFd own_d;
  const WakeHub::Ticket d = hub.join(&own_d);
  EXPECT_EQ(d.kind, WakeHub::Ticket::kLevel);
  hub.leave(d);
}

TEST(WakeHub, EdgeSleepersKeepTheSharedFdReadableUntilTheyLeave) {
  WakeHub hub;
  uint64_t id = 0;
  const int fd = hub.shared_fd(&id);
  ASSERT_GE(fd, 0);
  ASSERT_NE(id, 0u);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  epoll_event ev = {};
  ev.events = EPOLLIN | EPOLLET;
  ASSERT_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev), 0);
  const WakeHub::Ticket e = hub.join_edge();
  EXPECT_EQ(e.fd, fd);
  WakeHub::PrivateFd own;
  const WakeHub::Ticket l = hub.join(&own);
  hub.kick(true);  // l drained
  hub.leave(l);    // epoll drops an edge whose fd is no longer readable
  EXPECT_EQ(epoll_wait(ep, &ev, 1, 0), 1) << "the edge sleeper lost its kick";
  hub.leave(e);
  EXPECT_FALSE(readable(fd));
  // An edge sleeper that joins while the fd is readable still gets each
  // kick as an event.
  WakeHub::PrivateFd own2;
  const WakeHub::Ticket a = hub.join(&own2);
  const WakeHub::Ticket b = hub.join_edge();
  hub.kick(true);
  const WakeHub::Ticket e2 = hub.join_edge();
  EXPECT_EQ(e2.kind, WakeHub::Ticket::kEdge);
  while (epoll_wait(ep, &ev, 1, 0) == 1) {
  }
  hub.kick(true);
  EXPECT_EQ(epoll_wait(ep, &ev, 1, 0), 1);
  hub.leave(a);
  hub.leave(b);
  hub.leave(e2);
  EXPECT_FALSE(readable(fd));
  close(ep);
}

TEST(WakeHub, BlockingCallsShareOneDoorbellOwner) {
  WakeHub hub;
  WakeHub::PrivateFd own1, own2;
  const WakeHub::Ticket t1 = hub.join_blocking(&own1);
  EXPECT_TRUE(t1.owner);
  EXPECT_GE(t1.fd, 0);
  const WakeHub::Ticket t2 = hub.join_blocking(&own2);
  EXPECT_FALSE(t2.owner);
  EXPECT_EQ(t2.kind, WakeHub::Ticket::kWord);
  // A kick ends the word's sleep...
  std::atomic<int> woke{0};
  std::thread sleeper([&] {
    EXPECT_EQ(sleep_on_word(hub.word(), t2.word, -1, OnSignal::kRestartable), 0);
    woke = 1;
  });
  hub.kick(true);
  sleeper.join();
  EXPECT_EQ(woke.load(), 1);
  hub.leave(t2);
  // ... and so does the owner's leaving: a word sleeper takes its place.
  const WakeHub::Ticket t3 = hub.join_blocking(&own2);
  ASSERT_EQ(t3.kind, WakeHub::Ticket::kWord);
  hub.leave(t1);
  EXPECT_NE(hub.word()->load(), t3.word);
  hub.leave(t3);
  const WakeHub::Ticket t4 = hub.join_blocking(&own2);
  EXPECT_TRUE(t4.owner);
  hub.leave(t4);
}

TEST(WakeHub, AForkChildStartsOver) {
  WakeHub hub;
  uint64_t id1 = 0;
  ASSERT_GE(hub.shared_fd(&id1), 0);
  WakeHub::PrivateFd own;
  const WakeHub::Ticket old = hub.join_blocking(&own);
  hub.after_fork_child();  // as in a child: the parent's sleepers are gone
  EXPECT_EQ(hub.sleepers(), 0u);
  uint64_t id2 = 0;
  ASSERT_GE(hub.shared_fd(&id2), 0);
  EXPECT_NE(id1, id2);
  hub.leave(old);  // a ticket from before the fork changes nothing
  EXPECT_EQ(hub.sleepers(), 0u);
  WakeHub::PrivateFd own2;
  const WakeHub::Ticket t = hub.join_blocking(&own2);
  EXPECT_TRUE(t.owner);
  hub.leave(t);
}

// ---- no lost wakeup, with threads of every kind ----------------------------

// A connection in miniature: each sleeper waits for its own value to reach
// a round; the "peer" bumps one value at a time and rings the doorbell (one
// byte on a socketpair) when anyone is armed. Every sleeper that wakes
// drains the doorbell, whoever the byte was for; without the kicks, the
// sleeper it was for sleeps on.
struct MiniConnection {
  int doorbell[2] = {-1, -1};  // [0]: the sleepers' end
  std::atomic<int> armed{0};
  WakeHub hub;
};

enum class Kind { kLevel, kBlocking, kEdge };

// Drains the doorbell; true when it took anything.
bool drain(int fd) {
  char buf[64];
  bool took = false;
  while (::recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0) took = true;
  return took;
}

void sleeper(MiniConnection& c, Kind kind, const std::atomic<uint64_t>& value, uint64_t rounds,
             std::atomic<uint64_t>& seen) {
  int ep = -1;
  if (kind == Kind::kEdge) {
    ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.u32 = 0;
    epoll_ctl(ep, EPOLL_CTL_ADD, c.doorbell[0], &ev);
    uint64_t id;
    ev.events = EPOLLIN | EPOLLET;
    ev.data.u32 = 1;
    epoll_ctl(ep, EPOLL_CTL_ADD, c.hub.shared_fd(&id), &ev);
  }
  for (uint64_t r = 1; r <= rounds; ++r) {
    for (;;) {
      WakeHub::PrivateFd own;
      const WakeHub::Ticket t = kind == Kind::kEdge       ? c.hub.join_edge()
                                : kind == Kind::kBlocking ? c.hub.join_blocking(&own)
                                                          : c.hub.join(&own);
      c.armed.fetch_add(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      const bool ready = value.load(std::memory_order_seq_cst) >= r;
      if (!ready) {
        if (t.kind == WakeHub::Ticket::kWord) {
          sleep_on_word(c.hub.word(), t.word, -1, OnSignal::kRestartable);
        } else if (kind == Kind::kEdge) {
          epoll_event ev[2];
          epoll_wait(ep, ev, 2, -1);
          if (drain(c.doorbell[0])) c.hub.kick(true);
        } else {
          pollfd p[2] = {{c.doorbell[0], POLLIN, 0}, {t.fd, POLLIN, 0}};
          ::poll(p, 2, -1);
          if (drain(c.doorbell[0])) c.hub.kick(true);
        }
      }
      c.armed.fetch_sub(1, std::memory_order_seq_cst);
      c.hub.leave(t);
      if (ready) break;
    }
    seen.store(r, std::memory_order_seq_cst);
  }
  if (ep >= 0) close(ep);
}

TEST(WakeHub, NoWakeupIsLostWhateverTheMixOfSleepers) {
  MiniConnection c;
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, c.doorbell), 0);
  const Kind kinds[] = {Kind::kLevel,    Kind::kLevel, Kind::kBlocking,
                        Kind::kBlocking, Kind::kEdge,  Kind::kEdge};
  constexpr size_t kSleepers = sizeof kinds / sizeof kinds[0];
  constexpr uint64_t kRounds = 300;
  std::atomic<uint64_t> value[kSleepers];
  std::atomic<uint64_t> seen[kSleepers];
  for (size_t i = 0; i < kSleepers; ++i) value[i] = seen[i] = 0;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < kSleepers; ++i)
    threads.emplace_back([&, i] { sleeper(c, kinds[i], value[i], kRounds, seen[i]); });
  std::mt19937 rng(7);
  std::string lost;
  for (uint64_t r = 1; r <= kRounds && lost.empty(); ++r) {
    std::vector<size_t> order(kSleepers);
    for (size_t i = 0; i < kSleepers; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      // One value at a time, one doorbell each: the others wake for it too.
      value[i].store(r, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (c.armed.load(std::memory_order_seq_cst) > 0) (void)!::send(c.doorbell[1], "x", 1, 0);
      // Until it saw its value: a hang detector, not a timing (a lost
      // wakeup sleeps for ever).
      timespec start;
      clock_gettime(CLOCK_MONOTONIC, &start);
      while (seen[i].load() < r) {
        timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - start.tv_sec > 20) {
          lost = "sleeper " + std::to_string(i) + " round " + std::to_string(r);
          break;
        }
        std::this_thread::yield();
      }
      if (!lost.empty()) break;
    }
  }
  if (!lost.empty()) {
    // Let every sleeper finish so that the threads can be joined.
    for (size_t i = 0; i < kSleepers; ++i) value[i].store(kRounds);
    for (int k = 0; k < 64; ++k) (void)!::send(c.doorbell[1], "x", 1, MSG_DONTWAIT);
    c.hub.kick(false);
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(lost.empty()) << "lost wakeup: " << lost;
  close(c.doorbell[0]);
  close(c.doorbell[1]);
}

}  // namespace
}  // namespace rsock
