// Pitfalls of a preloaded library's start-up (STYLE.md): another library's
// constructor that uses sockets before, or after, librsock's own constructor
// has run. Its calls must reach libc correctly (lazy resolution, first-use
// init from inside a wrapper), and librsock must still account for them.
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

}  // namespace
}  // namespace rsock_test
