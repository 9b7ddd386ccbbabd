// Unit tests for src/fdtable: set/get/clear, dup-style sharing (two fds, one
// state: on_last_close only at the last clear), replacing a slot (dup2 over
// an fd), references that outlive a clear, fds outside [0, kMaxFd), chunk
// boundaries, for_each, FdRef moves, replace (a pairing's hand-over), slot
// locks across fork, and a multi-threaded get/clear/set stress in which every state counts its
// lifecycle events and poisons itself on destruction, so that a use after
// free or a double close is detected (definitively when built with
// -fsanitize=address).

#include "fdtable/fdtable.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace rsock {
namespace {

constexpr uint64_t kAlive = 0xa11ce0000a11ce00ull;
constexpr uint64_t kDead = 0xdeaddeaddeaddeadull;

struct Counters {
  std::atomic<int> created{0};
  std::atomic<int> destroyed{0};
  std::atomic<int> last_closes{0};
  std::atomic<int> bad_destroy{0};   // destroyed without exactly one last close
  std::atomic<int> double_close{0};  // on_last_close twice on one state
};

class TestState : public FdState {
 public:
  explicit TestState(Counters* c) : FdState(Kind::kConnection), c_(c) { c_->created++; }
  ~TestState() override {
    if (closes_.load() != 1) c_->bad_destroy++;
    magic_.store(kDead);
    c_->destroyed++;
  }
  void on_last_close() override {
    if (closes_.fetch_add(1) != 0) c_->double_close++;
    c_->last_closes++;
  }
  bool alive() const { return magic_.load() == kAlive; }
  int closes() const { return closes_.load(); }
  std::atomic<uint64_t> uses{0};

 private:
  Counters* c_;
  std::atomic<uint64_t> magic_{kAlive};
  std::atomic<int> closes_{0};
};

// The table never frees its chunks (it lives for the process); a test table
// leaks a few pages, which is fine.
std::unique_ptr<FdTable> new_table() { return std::make_unique<FdTable>(); }

TEST(FdTable, EmptyTableHasNothing) {
  auto t = new_table();
  EXPECT_FALSE(t->has(5));
  EXPECT_FALSE(t->get(5));
  EXPECT_FALSE(t->clear(5));
  EXPECT_FALSE(t->has(-1));
  EXPECT_FALSE(t->get(-1));
  EXPECT_FALSE(t->clear(-1));
  int visited = 0;
  t->for_each([&](int, FdState*) { ++visited; });
  EXPECT_EQ(visited, 0);
}

TEST(FdTable, SetGetClear) {
  auto t = new_table();
  Counters c;
  auto* s = new TestState(&c);
  ASSERT_TRUE(t->set(5, s));
  s->unref();  // the table holds it now
  EXPECT_TRUE(t->has(5));
  EXPECT_FALSE(t->has(4));
  EXPECT_FALSE(t->has(6));
  {
    FdRef r = t->get(5);
    ASSERT_TRUE(r);
    EXPECT_EQ(r.get(), s);
    EXPECT_EQ(r.as<TestState>(), s);
    EXPECT_EQ(r.get()->kind(), FdState::Kind::kConnection);
  }
  EXPECT_EQ(c.destroyed.load(), 0);  // a released reference is not the last one
  EXPECT_TRUE(t->clear(5));
  EXPECT_EQ(c.last_closes.load(), 1);
  EXPECT_EQ(c.destroyed.load(), 1);
  EXPECT_FALSE(t->has(5));
  EXPECT_FALSE(t->get(5));
  EXPECT_FALSE(t->clear(5));  // a second clear finds nothing
  EXPECT_EQ(c.last_closes.load(), 1);
  EXPECT_EQ(c.bad_destroy.load(), 0);
}

TEST(FdTable, ReferenceOutlivesClear) {
  auto t = new_table();
  Counters c;
  auto* s = new TestState(&c);
  ASSERT_TRUE(t->set(3, s));
  s->unref();
  FdRef r = t->get(3);
  ASSERT_TRUE(r);
  EXPECT_TRUE(t->clear(3));
  EXPECT_EQ(c.last_closes.load(), 1);  // torn down as a connection...
  EXPECT_EQ(c.destroyed.load(), 0);    // ...but alive while an I/O call uses it
  EXPECT_TRUE(r.as<TestState>()->alive());
  r.reset();
  EXPECT_EQ(c.destroyed.load(), 1);
  EXPECT_FALSE(r);
}

TEST(FdTable, DupSharesOneStateUntilTheLastClose) {
  auto t = new_table();
  Counters c;
  auto* s = new TestState(&c);
  ASSERT_TRUE(t->set(5, s));
  ASSERT_TRUE(t->set(9, s));  // dup(5) == 9
  s->unref();
  EXPECT_EQ(t->get(5).get(), s);
  EXPECT_EQ(t->get(9).get(), s);
  EXPECT_FALSE(t->clear(5));  // not the last fd
  EXPECT_EQ(c.last_closes.load(), 0);
  EXPECT_EQ(c.destroyed.load(), 0);
  EXPECT_FALSE(t->has(5));
  EXPECT_EQ(t->get(9).get(), s);
  EXPECT_TRUE(t->clear(9));
  EXPECT_EQ(c.last_closes.load(), 1);
  EXPECT_EQ(c.destroyed.load(), 1);
  EXPECT_EQ(c.bad_destroy.load(), 0);
}

TEST(FdTable, ReplacingASlotClosesTheOldStateIfItWasItsLastFd) {
  auto t = new_table();
  Counters c;
  auto* a = new TestState(&c);
  auto* b = new TestState(&c);
  ASSERT_TRUE(t->set(5, a));
  a->unref();
  ASSERT_TRUE(t->set(5, b));  // dup2(other, 5)
  b->unref();
  EXPECT_EQ(c.last_closes.load(), 1);
  EXPECT_EQ(c.destroyed.load(), 1);  // a is gone
  EXPECT_EQ(t->get(5).get(), b);
  EXPECT_TRUE(t->clear(5));
  EXPECT_EQ(c.destroyed.load(), 2);
  EXPECT_EQ(c.bad_destroy.load(), 0);
}

TEST(FdTable, ReplacingOneOfTwoFdsKeepsTheState) {
  auto t = new_table();
  Counters c;
  auto* a = new TestState(&c);
  auto* b = new TestState(&c);
  ASSERT_TRUE(t->set(5, a));
  ASSERT_TRUE(t->set(6, a));
  a->unref();
  ASSERT_TRUE(t->set(5, b));
  b->unref();
  EXPECT_EQ(a->closes(), 0);  // still open through fd 6
  EXPECT_EQ(t->get(6).get(), a);
  EXPECT_EQ(t->get(5).get(), b);
  EXPECT_TRUE(t->clear(6));
  EXPECT_EQ(c.destroyed.load(), 1);
  EXPECT_TRUE(t->clear(5));
  EXPECT_EQ(c.destroyed.load(), 2);
  EXPECT_EQ(c.last_closes.load(), 2);
  EXPECT_EQ(c.bad_destroy.load(), 0);
}

TEST(FdTable, SettingTheSameStateAgainIsNotAClose) {
  auto t = new_table();
  Counters c;
  auto* s = new TestState(&c);
  ASSERT_TRUE(t->set(5, s));
  ASSERT_TRUE(t->set(5, s));  // dup2(5, 5)-like
  s->unref();
  EXPECT_EQ(c.last_closes.load(), 0);
  EXPECT_EQ(c.destroyed.load(), 0);
  EXPECT_TRUE(t->clear(5));
  EXPECT_EQ(c.last_closes.load(), 1);
  EXPECT_EQ(c.destroyed.load(), 1);
}

TEST(FdTable, FdsOutsideTheTableAreIgnored) {
  auto t = new_table();
  Counters c;
  auto* s = new TestState(&c);
  EXPECT_FALSE(t->set(FdTable::kMaxFd, s));
  EXPECT_FALSE(t->set(FdTable::kMaxFd + 12345, s));
  EXPECT_FALSE(t->set(-1, s));
  EXPECT_FALSE(t->has(FdTable::kMaxFd));
  EXPECT_FALSE(t->get(FdTable::kMaxFd));
  EXPECT_FALSE(t->clear(FdTable::kMaxFd));
  // The last tracked fd works.
  ASSERT_TRUE(t->set(FdTable::kMaxFd - 1, s));
  EXPECT_EQ(t->get(FdTable::kMaxFd - 1).get(), s);
  EXPECT_TRUE(t->clear(FdTable::kMaxFd - 1));
  EXPECT_EQ(c.destroyed.load(), 0);
  // The failed sets took no reference: one unref, from the creator, frees it.
  s->unref();
  EXPECT_EQ(c.destroyed.load(), 1);
}

TEST(FdTable, ChunkBoundariesAreIndependentSlots) {
  auto t = new_table();
  Counters c;
  const int k = FdTable::kChunkSlots;
  std::vector<int> fds = {0, k - 1, k, k + 1, 2 * k - 1, 7 * k};
  std::map<int, TestState*> states;
  for (int fd : fds) {
    states[fd] = new TestState(&c);
    ASSERT_TRUE(t->set(fd, states[fd]));
    states[fd]->unref();
  }
  for (int fd : fds) EXPECT_EQ(t->get(fd).get(), states[fd]) << fd;
  EXPECT_FALSE(t->has(k + 2));
  EXPECT_FALSE(t->has(3 * k));  // a chunk never created
  std::map<int, FdState*> seen;
  t->for_each([&](int fd, FdState* st) { seen[fd] = st; });
  ASSERT_EQ(seen.size(), fds.size());
  for (int fd : fds) EXPECT_EQ(seen[fd], states[fd]) << fd;
  for (int fd : fds) EXPECT_TRUE(t->clear(fd));
  EXPECT_EQ(c.destroyed.load(), static_cast<int>(fds.size()));
}

TEST(FdTable, GlobalTableIsOneInstance) { EXPECT_EQ(&fd_table(), &fd_table()); }

TEST(FdRef, MovesTransferTheReference) {
  Counters c;
  auto* a = new TestState(&c);
  auto* b = new TestState(&c);
  a->on_last_close();  // these never sit in a table; keep the destructor check quiet
  b->on_last_close();
  FdRef ra(a);  // adopts the creator's reference
  FdRef moved(std::move(ra));
  EXPECT_FALSE(ra);
  EXPECT_EQ(moved.get(), a);
  EXPECT_EQ(c.destroyed.load(), 0);
  FdRef rb(b);
  moved = std::move(rb);  // releases a
  EXPECT_EQ(c.destroyed.load(), 1);
  EXPECT_EQ(moved.get(), b);
  EXPECT_FALSE(rb);
  moved = std::move(moved);  // self-move keeps it
  EXPECT_EQ(moved.get(), b);
  moved.reset();
  EXPECT_EQ(c.destroyed.load(), 2);
  EXPECT_EQ(c.bad_destroy.load(), 0);
}

// replace() is the hand-over of a finished background pairing: only from the
// expected state, and not a close of it.
TEST(FdTable, ReplaceHandsOverOnlyFromTheExpectedState) {
  auto t = new_table();
  Counters c;
  auto* pending = new TestState(&c);
  auto* conn = new TestState(&c);
  auto* other = new TestState(&c);
  ASSERT_TRUE(t->set(7, pending));
  ASSERT_TRUE(t->set(8, pending));  // a dup
  EXPECT_FALSE(t->replace(7, other, conn)) << "fd 7 does not hold `other`";
  EXPECT_FALSE(t->replace(9, pending, conn)) << "fd 9 holds nothing";
  EXPECT_EQ(t->get(7).get(), pending);

  EXPECT_TRUE(t->replace(7, pending, conn));
  EXPECT_EQ(t->get(7).get(), conn);
  EXPECT_EQ(pending->closes(), 0) << "a hand-over is not a close";
  EXPECT_TRUE(t->replace(8, pending, conn));
  EXPECT_EQ(pending->closes(), 0);
  EXPECT_EQ(c.destroyed.load(), 0) << "our references keep all three";

  // The new state counts both fds: only the second clear closes it.
  EXPECT_FALSE(t->clear(7));
  EXPECT_EQ(conn->closes(), 0);
  EXPECT_TRUE(t->clear(8));
  EXPECT_EQ(conn->closes(), 1);

  // To nothing: the fd becomes plain.
  ASSERT_TRUE(t->set(10, other));
  EXPECT_TRUE(t->replace(10, other, nullptr));
  EXPECT_FALSE(t->has(10));
  EXPECT_EQ(other->closes(), 0);

  // The hand-over skipped on_last_close; close them here as their owners
  // would, so that each is destroyed after exactly one close.
  pending->on_last_close();
  other->on_last_close();
  pending->unref();
  other->unref();
  conn->unref();
  EXPECT_EQ(c.destroyed.load(), 3);
  EXPECT_EQ(c.bad_destroy.load(), 0);
  EXPECT_EQ(c.double_close.load(), 0);
}

// A thread that keeps taking fd's reference (get), and so its slot's lock
// for a moment at a time, until stop(), which returns how many it took.
class Getter {
 public:
  Getter(FdTable& t, int fd)
      : thread_([this, &t, fd] {
          while (!done_.load(std::memory_order_relaxed)) {
            FdRef r = t.get(fd);
            gets_.fetch_add(1, std::memory_order_relaxed);
          }
        }) {
    // On a loaded machine it may start late: let it in first (bounded).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (gets_.load() == 0 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  }
  ~Getter() { stop(); }
  uint64_t stop() {
    done_.store(true);
    if (thread_.joinable()) thread_.join();
    return gets_.load();
  }

 private:
  std::atomic<bool> done_{false};
  std::atomic<uint64_t> gets_{0};
  std::thread thread_;
};

// A slot that another thread holds for a moment (a get() taking its
// reference) still holds its state: a replace() meeting that moment must
// wait for it, not fail. Before 2026-12-07 it compared the slot with its
// lock bit and failed; a pairing's hand-over then left the fd on its
// PendingState while the application read from it.
TEST(FdTable, ReplaceWaitsForAMomentaryHolder) {
  auto t = new_table();
  Counters c;
  constexpr int kFd = 300, kRounds = 200000;
  Getter getter(*t, kFd);
  int failed = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto* from = new TestState(&c);
    auto* to = new TestState(&c);
    ASSERT_TRUE(t->set(kFd, from));
    if (!t->replace(kFd, from, to)) ++failed;
    t->clear(kFd);  // to's last close, or from's if the replace failed
    if (from->closes() == 0) from->on_last_close();
    if (to->closes() == 0) to->on_last_close();
    from->unref();
    to->unref();
  }
  EXPECT_EQ(failed, 0) << "of " << kRounds << " hand-overs";
  EXPECT_GT(getter.stop(), 0u);
}

// replace_all hands every listed fd that holds the expected state over at
// once: a thread that closes one of them as soon as it has changed hands
// (an application that uses and closes one number of a connection while
// the pairing hands its numbers over) must never find itself closing the
// new state's last fd while another still holds the old one. The closer
// clears fd A the moment it holds `conn`; B is listed first or last, and a
// third thread keeps taking B's slot lock (get), which makes a hand-over
// of B wait. With the fds handed over one at a time, that clear was conn's
// last close in a good part of the rounds where A went first.
TEST(FdTable, ReplaceAllHandsOverTogether) {
  auto t = new_table();
  Counters c;
  constexpr int kFdA = 200, kFdB = 1200, kRounds = 4000;
  Getter getter(*t, kFdB);
  int early = 0;
  for (int round = 0; round < kRounds; ++round) {
    auto* pending = new TestState(&c);
    auto* conn = new TestState(&c);
    ASSERT_TRUE(t->set(kFdA, pending));
    ASSERT_TRUE(t->set(kFdB, pending));
    std::atomic<bool> go{false};
    std::thread closer([&] {
      while (!go.load()) {
      }
      while (t->peek(kFdA) != conn) {
      }
      t->clear(kFdA);
    });
    go.store(true);
    const std::vector<int> fds =
        round % 2 ? std::vector<int>{kFdA, kFdB} : std::vector<int>{kFdB, kFdA};
    EXPECT_EQ(t->replace_all(fds, pending, conn), 2);
    closer.join();
    if (conn->closes() != 0) ++early;
    EXPECT_EQ(t->peek(kFdB), conn);
    EXPECT_EQ(pending->closes(), 0) << "a hand-over is not a close";
    EXPECT_EQ(pending->fds(), 0);
    EXPECT_TRUE(t->clear(kFdB)) << "B is conn's last fd";
    pending->on_last_close();  // its owner's close (none sits in the table)
    pending->unref();
    conn->unref();
  }
  EXPECT_GT(getter.stop(), 0u);
  EXPECT_EQ(early, 0) << "closing A ended conn while B still held the old state";
  // Only the listed fds that hold the expected state change hands.
  auto* pending = new TestState(&c);
  auto* other = new TestState(&c);
  ASSERT_TRUE(t->set(5, pending));
  ASSERT_TRUE(t->set(6, other));
  EXPECT_EQ(t->replace_all({5, 6, 9}, pending, nullptr), 1);
  EXPECT_FALSE(t->has(5));
  EXPECT_EQ(t->peek(6), other);
  EXPECT_TRUE(t->clear(6));
  pending->on_last_close();
  pending->unref();
  other->unref();
  EXPECT_EQ(c.destroyed.load(), 2 * kRounds + 2);
  EXPECT_EQ(c.bad_destroy.load(), 0);
  EXPECT_EQ(c.double_close.load(), 0);
}

// Readers take references and use the state while a writer attaches states
// to two fds (as dup does), replaces and clears them. Every state must be
// alive whenever a reader holds it, closed exactly once, and freed exactly
// once.
TEST(FdTable, ConcurrentGetVersusClearAndReplace) {
  auto t = new_table();
  Counters c;
  constexpr int kFdA = 100, kFdB = 1100;  // in two chunks
  constexpr int kRounds = 60000;
  constexpr int kReaders = 3;
  std::atomic<bool> done{false};
  std::atomic<uint64_t> dead_seen{0}, hits{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.emplace_back([&, i] {
      std::mt19937 rng(i);
      while (!done.load(std::memory_order_relaxed)) {
        FdRef r = t->get(rng() % 2 ? kFdA : kFdB);
        if (!r) continue;
        auto* s = r.as<TestState>();
        if (!s->alive()) dead_seen++;
        s->uses.fetch_add(1, std::memory_order_relaxed);
        if (!s->alive()) dead_seen++;
        hits++;
      }
    });
  }
  std::mt19937 rng(99);
  for (int round = 0; round < kRounds; ++round) {
    auto* s = new TestState(&c);
    t->set(kFdA, s);  // replaces (and may close) the previous round's state
    t->set(kFdB, s);
    s->unref();
    if (round == 0) {
      // On a loaded machine the readers may start late: let them in first
      // (bounded), so that the rounds below race with them.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (hits.load() == 0 && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
    }
    switch (rng() % 3) {
      case 0:  // close both fds, in either order
        if (rng() % 2) {
          t->clear(kFdA);
          t->clear(kFdB);
        } else {
          t->clear(kFdB);
          t->clear(kFdA);
        }
        break;
      case 1:  // close one; the next round replaces the other
        t->clear(rng() % 2 ? kFdA : kFdB);
        break;
      default:  // leave both to be replaced
        break;
    }
  }
  t->clear(kFdA);
  t->clear(kFdB);
  done.store(true);
  for (auto& th : readers) th.join();
  EXPECT_EQ(dead_seen.load(), 0u) << "a reader used a destroyed state";
  EXPECT_EQ(c.created.load(), kRounds);
  EXPECT_EQ(c.destroyed.load(), kRounds);
  EXPECT_EQ(c.last_closes.load(), kRounds);
  EXPECT_EQ(c.double_close.load(), 0);
  EXPECT_EQ(c.bad_destroy.load(), 0);
  EXPECT_GT(hits.load(), 0u);  // the readers did race with the writer
  RecordProperty("reader_hits", std::to_string(hits.load()));
}

// A fork copies the slot locks that other threads hold at that moment, and
// those threads do not exist in the child: after_fork_child() must release
// them, or the child's first look at such an fd spins forever. Readers keep
// the lock of one slot busy while the test forks; every child must get the
// state at once.
TEST(FdTable, ForkChildDoesNotInheritHeldSlotLocks) {
  auto t = new_table();
  Counters c;
  constexpr int kFd = 7;
  constexpr int kForks = 100;
  auto* s = new TestState(&c);
  t->set(kFd, s);
  s->unref();
  std::atomic<bool> done{false};
  std::atomic<uint64_t> gets{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 2; ++i)
    readers.emplace_back([&] {
      while (!done.load(std::memory_order_relaxed)) {
        FdRef r = t->get(kFd);
        gets.fetch_add(1, std::memory_order_relaxed);
      }
    });
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (gets.load() == 0 && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  int hung = 0, failed = 0;
  for (int i = 0; i < kForks && hung == 0; ++i) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0) << strerror(errno);
    if (pid == 0) {
      t->after_fork_child();
      FdRef r = t->get(kFd);
      _exit(r && r.get() == s ? 0 : 1);
    }
    // Bounded: a child stuck on a stale lock never exits by itself.
    int st = 0;
    pid_t got = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((got = waitpid(pid, &st, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (got == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      ++hung;
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      ++failed;
    }
  }
  done.store(true);
  for (auto& th : readers) th.join();
  EXPECT_EQ(hung, 0) << "a child spun on a slot lock held by a thread of its parent";
  EXPECT_EQ(failed, 0) << "a child did not find the state";
  t->clear(kFd);
}

// FreshTcp: a bit per fd, set only by mark() and taken once; clear_range
// and clear_all leave no bit in their span and touch none outside it.
TEST(FreshTcp, AMarkIsTakenOnceAndClearsGoByRange) {
  auto t = std::make_unique<FreshTcp>();
  EXPECT_FALSE(t->take(5)) << "an fd nobody marked";
  t->mark(5);
  t->mark(64);
  t->mark(FdTable::kMaxFd - 1);
  t->mark(FdTable::kMaxFd);  // beyond the table: never marked
  t->mark(-1);
  EXPECT_TRUE(t->take(5));
  EXPECT_FALSE(t->take(5)) << "taken twice";
  EXPECT_FALSE(t->take(FdTable::kMaxFd));
  EXPECT_FALSE(t->take(-1));
  t->mark(7);
  t->clear(7);
  EXPECT_FALSE(t->take(7));
  for (int fd : {3, 10, 63, 65, 200}) t->mark(fd);
  t->clear_range(10, 64);  // 10, 63, 64
  EXPECT_TRUE(t->take(3));
  EXPECT_FALSE(t->take(10));
  EXPECT_FALSE(t->take(63));
  EXPECT_FALSE(t->take(64));
  EXPECT_TRUE(t->take(65));
  t->clear_range(100, ~0u);  // closefrom(100)
  EXPECT_FALSE(t->take(200));
  EXPECT_FALSE(t->take(FdTable::kMaxFd - 1));
  for (int fd : {0, 1000, 70000}) t->mark(fd);
  t->clear_all();
  for (int fd : {0, 1000, 70000}) EXPECT_FALSE(t->take(fd)) << fd;
}

}  // namespace
}  // namespace rsock
