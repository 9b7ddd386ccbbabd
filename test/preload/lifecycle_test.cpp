// Pitfalls of a preloaded library's lifecycle (STYLE.md): another library's
// constructor that uses sockets before, or after, librsock's own constructor
// has run. Its calls must reach libc correctly (lazy resolution, first-use
// init from inside a wrapper), and librsock must still account for them.
// And fork() while pairings run in the background.
#include "harness.h"

namespace rsock_test {
namespace {

class LifecycleTest : public PreloadTest, public ::testing::WithParamInterface<bool> {};

TEST_P(LifecycleTest, AnotherConstructorUsesSocketsFirst) {
  const std::string early = progs() + "/libearly_ctor.so";
  ASSERT_TRUE(file_exists(early)) << "run make first";
  Env env = preloaded({{"RSOCK_PEERS", "127.0.0.1:*"}, {"RSOCK_CONNECT_TIMEOUT_MS", "200"}});
  // Both load orders: constructors of independent preloads run in reverse
  // order, so one of them runs the early constructor before librsock's.
  env["LD_PRELOAD"] = GetParam() ? lib() + " " + early : early + " " + lib();
  // rs_sem without arguments prints its usage and exits 2: the point is the
  // constructor that runs before main.
  Proc& p = spawn("early", "rs_sem", {}, env);
  ASSERT_TRUE(wait_exit(p, kExitTimeoutMs)) << "hung in a constructor";
  EXPECT_NE(p.err().find("early_ctor: ok"), std::string::npos) << p.err();
  auto s = stats_of(p);
  ASSERT_TRUE(s.has_value());
  // The constructor connected to itself in one thread: the server side could
  // not pair while the client waited, so both ends fell back, and both
  // connections were counted.
  EXPECT_EQ(s->connections["tcp"], 2u);
  EXPECT_EQ(s->connections["shm"], 0u);
}

INSTANTIATE_TEST_SUITE_P(LoadOrders, LifecycleTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "RsockFirst" : "EarlyFirst"; });

class ForkTest : public PreloadTest {};

// fork() while a nonblocking connect and accept pair in the background (the
// fork waits for them), then pairing again in the child: nothing a thread
// of the parent held at the fork (the in-flight lock, a slot lock of the fd
// table) may stay held in the child. Both processes pair over shm.
TEST_F(ForkTest, ForkWhilePairingInTheBackground) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  Env env = preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}});
  // The child starts pairing threads, and the parent's last pairing threads
  // may not have finished exiting at the fork: ThreadSanitizer would stop
  // such a child (it does not support threads after a multi-threaded fork)
  // rather than check it.
  env["TSAN_OPTIONS"] = "die_after_fork=0";
  Proc& p = spawn("fork", "rs_fork", {"--port", std::to_string(port)}, env);
  ASSERT_TRUE(wait_exit(p, kExitTimeoutMs)) << "hung";
  ASSERT_TRUE(p.exited_ok()) << p.describe();
  const std::string out = p.out();
  for (const char* step : {"OK before", "OK across", "OK after", "OK parent-after"})
    EXPECT_NE(out.find(step), std::string::npos) << step << "\n" << out;
  EXPECT_EQ(p.err(), "");
  const int child = atoi(parse_result(out)["child"].c_str());
  ASSERT_GT(child, 0) << out;
  auto parent_stats = stats_of(p);
  ASSERT_TRUE(parent_stats.has_value());
  expect_paths(*parent_stats, 4, 0, "parent");  // both ends of "before" and "across"
  std::optional<Stats> child_stats;
  for (const Stats& s : stats())
    if (s.pid == child) child_stats = s;
  ASSERT_TRUE(child_stats.has_value()) << read_file(stats_path());
  // Both ends of "after", and of "across", which it took over from the parent
  // (a process counts the connections it moves bytes on).
  expect_paths(*child_stats, 4, 0, "child");
}

}  // namespace
}  // namespace rsock_test
