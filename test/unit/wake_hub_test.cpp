// Unit tests for src/socket/wake_hub.h and waker.h: a kick pokes the waker
// of every joined sleeper and of nobody else, one waker serves a context
// however many connections it sleeps on, a hub names a bounded number of
// wakers (the rest sleep blind), a thread's waker is its own across sleeps
// and a nested sleep gets another, a fork's child gets wakers of its own
// under the same numbers, blocking calls share one doorbell owner and sleep
// on the word otherwise; and, with threads of every kind sleeping on one
// destructively drained doorbell (a socketpair, as the shm transport's), no
// wakeup is lost.
#include "socket/wake_hub.h"

#include <errno.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
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
#include "socket/waker.h"

namespace rsock {
namespace {

bool readable(int fd) {
  pollfd p = {fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

bool readable(const Waker* w) { return w && readable(w->fd()); }

TEST(Waker, ClearEndsAPokeAndOnlyCountedPokesCount) {
  SleepWaker sw;
  Waker* w = sw.get();
  ASSERT_NE(w, nullptr);
  EXPECT_FALSE(readable(w));
  const uint64_t before = w->pokes();
  w->poke(false);  // an epoll_ctl's wakeup of a set, not a kick
  EXPECT_TRUE(readable(w));
  EXPECT_EQ(w->pokes(), before);
  w->clear();
  EXPECT_FALSE(readable(w));
  w->poke();
  EXPECT_EQ(w->pokes(), before + 1);
  w->drain();
  EXPECT_FALSE(readable(w));
}

TEST(Waker, AThreadKeepsItsWakerAndANestedSleepGetsAnother) {
  Waker* first = nullptr;
  int fd = -1;
  {
    SleepWaker sw;
    first = sw.get();
    ASSERT_NE(first, nullptr);
    fd = first->fd();
    first->poke();  // left readable by the sleep that ends here
    {
      SleepWaker nested;  // a signal handler's sleep inside this one
      ASSERT_NE(nested.get(), nullptr);
      EXPECT_NE(nested.get(), first);
      EXPECT_TRUE(readable(first)) << "the nested sleep cleared the outer one's waker";
    }
  }
  SleepWaker again;
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(again.get()->fd(), fd);
  EXPECT_FALSE(readable(again.get())) << "a new sleep starts cleared";
  // Another thread has a waker of its own.
  Waker* other = nullptr;
  std::thread([&] {
    SleepWaker sw;
    other = sw.get();
  }).join();
  EXPECT_NE(other, nullptr);
  EXPECT_NE(other, first);
}

TEST(Waker, AForkChildGetsNewWakersUnderTheSameNumbers) {
  SleepWaker sw;
  Waker* w = sw.get();
  ASSERT_NE(w, nullptr);
  const int fd = w->fd();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    wakers_after_fork_child();  // what the atfork handler runs
    // Same number, and a poke here must not reach the parent's eventfd.
    int ok = w->fd() == fd ? 0 : 1;
    w->poke();
    ok |= readable(w) ? 0 : 2;
    _exit(ok);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(readable(w)) << "the child poked the parent's waker";
}

TEST(WakeHub, ALoneSleeperWakesNobody) {
  WakeHub hub;
  SleepWaker sw;
  const WakeHub::Ticket t = hub.join(sw.get());
  ASSERT_EQ(t.kind, WakeHub::Ticket::kWaker);
  ASSERT_EQ(t.waker, sw.get());
  hub.kick(true);  // its own drain: nobody else to wake
  EXPECT_FALSE(readable(sw.get()));
  EXPECT_FALSE(hub.kicked_since(t));
  EXPECT_EQ(hub.sleepers(), 1u);
  hub.leave(t);
  EXPECT_EQ(hub.sleepers(), 0u);
  EXPECT_EQ(hub.wakers(), 0);
}

TEST(WakeHub, AKickPokesEveryJoinedWaker) {
  WakeHub hub;
  SleepWaker a;
  SleepWaker b;  // nested: another waker, as another thread's would be
  const WakeHub::Ticket ta = hub.join(a.get());
  const WakeHub::Ticket tb = hub.join(b.get());
  EXPECT_EQ(hub.wakers(), 2);
  hub.kick(true);  // a drained a doorbell
  EXPECT_TRUE(readable(b.get()));
  EXPECT_TRUE(hub.kicked_since(tb));
  hub.leave(ta);
  hub.leave(tb);
  EXPECT_EQ(hub.wakers(), 0);
  b.get()->clear();
  hub.kick(false);  // nobody joined: nobody poked
  EXPECT_FALSE(readable(b.get()));
}

TEST(WakeHub, AKickFromOutsideReachesTheLoneSleeper) {
  WakeHub hub;
  SleepWaker sw;
  const WakeHub::Ticket t = hub.join(sw.get());
  hub.kick(false);  // a thread that is not asleep (epoll_wait spinning) drained
  EXPECT_TRUE(readable(sw.get()));
  hub.leave(t);
}

TEST(WakeHub, OneWakerServesManyConnectionsAndIsNamedOnce) {
  WakeHub hubs[3];
  SleepWaker sw;
  WakeHub::Ticket t[3];
  for (int i = 0; i < 3; ++i) t[i] = hubs[i].join(sw.get());
  const WakeHub::Ticket again = hubs[1].join(sw.get());  // two fds of one connection
  EXPECT_EQ(hubs[1].wakers(), 1);
  EXPECT_EQ(hubs[1].sleepers(), 2u);
  hubs[2].kick(false);
  EXPECT_TRUE(readable(sw.get()));
  sw.get()->clear();
  hubs[1].leave(again);
  EXPECT_EQ(hubs[1].wakers(), 1) << "still named for the other ticket";
  hubs[1].kick(false);
  EXPECT_TRUE(readable(sw.get()));
  for (int i = 0; i < 3; ++i) hubs[i].leave(t[i]);
  EXPECT_EQ(hubs[1].wakers(), 0);
}

TEST(WakeHub, SleepersBeyondTheNamedWakersAreBlind) {
  WakeHub hub;
  std::vector<Waker*> ws;
  std::vector<WakeHub::Ticket> ts;
  for (int i = 0; i <= WakeHub::kMaxWakers; ++i) {
    ws.push_back(take_set_waker());
    ASSERT_TRUE(ws.back()->open_fd());
    ts.push_back(hub.join(ws.back()));
  }
  for (int i = 0; i < WakeHub::kMaxWakers; ++i) EXPECT_EQ(ts[i].waker, ws[i]);
  EXPECT_EQ(ts.back().waker, nullptr) << "a ninth waker was named";
  EXPECT_EQ(hub.wakers(), WakeHub::kMaxWakers);
  EXPECT_EQ(hub.join(nullptr).waker, nullptr);  // no waker at all: blind
  hub.leave(ts[0]);
  const WakeHub::Ticket late = hub.join(ws.back());
  EXPECT_EQ(late.waker, ws.back()) << "a freed place is taken again";
  hub.leave(late);
  for (size_t i = 1; i < ts.size(); ++i) hub.leave(ts[i]);
  for (Waker* w : ws) give_set_waker(w);
}

TEST(WakeHub, BlockingCallsShareOneDoorbellOwner) {
  WakeHub hub;
  SleepWaker own1;
  SleepWaker own2;
  const WakeHub::Ticket t1 = hub.join_blocking(own1.get());
  EXPECT_TRUE(t1.owner);
  EXPECT_EQ(t1.waker, own1.get());
  const WakeHub::Ticket t2 = hub.join_blocking(own2.get());
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
  const WakeHub::Ticket t3 = hub.join_blocking(own2.get());
  ASSERT_EQ(t3.kind, WakeHub::Ticket::kWord);
  hub.leave(t1);
  EXPECT_NE(hub.word()->load(), t3.word);
  hub.leave(t3);
  const WakeHub::Ticket t4 = hub.join_blocking(own2.get());
  EXPECT_TRUE(t4.owner);
  hub.leave(t4);
}

TEST(WakeHub, AForkChildStartsOver) {
  WakeHub hub;
  SleepWaker sw;
  const WakeHub::Ticket old = hub.join_blocking(sw.get());
  hub.after_fork_child();  // as in a child: the parent's sleepers are gone
  EXPECT_EQ(hub.sleepers(), 0u);
  EXPECT_EQ(hub.wakers(), 0);
  hub.leave(old);  // a ticket from before the fork changes nothing
  EXPECT_EQ(hub.sleepers(), 0u);
  EXPECT_FALSE(hub.kicked_since(old));
  const WakeHub::Ticket t = hub.join_blocking(sw.get());
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

// kPoll: a thread in poll on the doorbell and its waker; kBlocking: a
// blocking call; kEpoll: an epoll set of its own that holds the doorbell and
// the set's waker (level-triggered), as an epoll shadow does.
enum class Kind { kPoll, kBlocking, kEpoll };

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
  Waker* set_waker = nullptr;
  if (kind == Kind::kEpoll) {
    ep = epoll_create1(EPOLL_CLOEXEC);
    set_waker = take_set_waker();
    set_waker->open_fd();
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.u32 = 0;
    epoll_ctl(ep, EPOLL_CTL_ADD, c.doorbell[0], &ev);
    ev.data.u32 = 1;
    epoll_ctl(ep, EPOLL_CTL_ADD, set_waker->fd(), &ev);
  }
  for (uint64_t r = 1; r <= rounds; ++r) {
    for (;;) {
      SleepWaker own;
      const WakeHub::Ticket t = kind == Kind::kEpoll      ? c.hub.join(set_waker)
                                : kind == Kind::kBlocking ? c.hub.join_blocking(own.get())
                                                          : c.hub.join(own.get());
      c.armed.fetch_add(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      const bool ready = value.load(std::memory_order_seq_cst) >= r;
      if (!ready) {
        if (t.kind == WakeHub::Ticket::kWord) {
          sleep_on_word(c.hub.word(), t.word, -1, OnSignal::kRestartable);
        } else if (kind == Kind::kEpoll) {
          epoll_event ev[2];
          const int n = epoll_wait(ep, ev, 2, -1);
          for (int k = 0; k < n; ++k)
            if (ev[k].data.u32 == 1) set_waker->drain();
          if (drain(c.doorbell[0])) c.hub.kick(true);
        } else {
          pollfd p[2] = {{c.doorbell[0], POLLIN, 0}, {t.waker->fd(), POLLIN, 0}};
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
  give_set_waker(set_waker);
}

TEST(WakeHub, NoWakeupIsLostWhateverTheMixOfSleepers) {
  MiniConnection c;
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, c.doorbell), 0);
  const Kind kinds[] = {Kind::kPoll,     Kind::kPoll,  Kind::kBlocking,
                        Kind::kBlocking, Kind::kEpoll, Kind::kEpoll};
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
