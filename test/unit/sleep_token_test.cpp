// Sleep tokens (common/sleep_token.h): no token repeats within a thread,
// across threads, in a signal handler that interrupts the step, or after
// a fork's reseed. A repeated token can cost a sleeper its wakeup.
#include "common/sleep_token.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/time.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

namespace rsock {
namespace {

TEST(SleepToken, ThreadsNeverShareOne) {
  std::vector<uint64_t> a, b;
  auto take = [](std::vector<uint64_t>* out) {
    for (int i = 0; i < 10000; ++i) out->push_back(new_sleep_token());
  };
  std::thread ta(take, &a), tb(take, &b);
  ta.join();
  tb.join();
  std::set<uint64_t> all(a.begin(), a.end());
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all.size(), a.size() + b.size());
}

TEST(SleepToken, AForkChildStartsAnewSequence) {
  const uint64_t before = new_sleep_token();
  sleep_tokens_after_fork_child();  // what a fork's child runs
  const uint64_t after = new_sleep_token();
  EXPECT_NE(after, before + 1);  // a new random start (equal by chance: 2^-64)
  EXPECT_NE(after, before);
}

std::atomic<int> g_in_handler{0};
uint64_t g_handler_tokens[4096];

void take_in_handler(int) {
  const int i = g_in_handler.fetch_add(1, std::memory_order_relaxed);
  if (i < 4096) g_handler_tokens[i] = new_sleep_token();
}

// A handler that takes a token while the interrupted code is taking one
// (a blocking call in a handler, inside another's sleep) gets its own.
TEST(SleepToken, AHandlerThatInterruptsTheStepGetsItsOwn) {
  struct sigaction sa = {}, old = {};
  sa.sa_handler = take_in_handler;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGALRM, &sa, &old), 0);
  itimerval every = {{0, 50}, {0, 50}};  // as often as the timer allows
  ASSERT_EQ(setitimer(ITIMER_REAL, &every, nullptr), 0);
  std::vector<uint64_t> mine;
  mine.reserve(2000000);
  while (g_in_handler.load(std::memory_order_relaxed) < 2000 && mine.size() < 2000000)
    mine.push_back(new_sleep_token());
  itimerval off = {};
  setitimer(ITIMER_REAL, &off, nullptr);
  sigaction(SIGALRM, &old, nullptr);
  const int n = std::min(g_in_handler.load(), 4096);
  ASSERT_GT(n, 0) << "no handler ran";
  std::set<uint64_t> all(mine.begin(), mine.end());
  EXPECT_EQ(all.size(), mine.size());
  for (int i = 0; i < n; ++i) EXPECT_TRUE(all.insert(g_handler_tokens[i]).second) << i;
}

}  // namespace
}  // namespace rsock
