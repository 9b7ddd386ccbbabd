// The end of a connection as the kernel reports it: build/progs/rs_close
// runs 26 scenarios (the peer closes after reading everything or with our
// bytes unread, exits, is SIGKILLed, shuts down its sending side, closes
// with SO_LINGER 0; we shut down one or both directions; calls blocked when
// the peer goes) and prints, probe by probe, what read/recv, write/send
// (with and without MSG_NOSIGNAL, SIGPIPE counted), getsockopt(SO_ERROR),
// shutdown, poll (with and without POLLRDHUP) and epoll (level- and
// edge-triggered, with and without EPOLLRDHUP) say. It runs once on plain
// TCP and once with librsock preloaded (every connection on shared memory),
// and the two transcripts must be equal.
#include "harness.h"
#include "transcript.h"

namespace rsock_test {
namespace {

class CloseTest : public PreloadTest {};

TEST_F(CloseTest, SameAsKernel) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::vector<std::string> args = {"--port", std::to_string(port)};

  Proc& tcp = spawn("tcp", "rs_close", args, {});
  ASSERT_TRUE(wait_exit(tcp, 180000)) << "tcp run hung";
  ASSERT_TRUE(tcp.exited_ok()) << "tcp run: see its output below";
  EXPECT_EQ(tcp.err(), "");

  Proc& rs = spawn("librsock", "rs_close", args,
                   preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}}));
  ASSERT_TRUE(wait_exit(rs, 180000)) << "librsock run hung";
  ASSERT_TRUE(rs.exited_ok()) << "librsock run: see its output below";
  EXPECT_EQ(rs.err(), "") << "librsock logged something (a reset it should not have made?)";

  const std::string kernel = tcp.out();
  const std::string shim = rs.out();
  ASSERT_NE(kernel.find("\nDONE\n"), std::string::npos) << kernel;
  ASSERT_NE(shim.find("\nDONE\n"), std::string::npos) << shim;
  const auto a = transcript(kernel, "");
  const auto b = transcript(shim, "");
  EXPECT_GE(a.size(), 150u) << "too few probes ran";
  expect_same_transcript(a, b);

  // The prober accepted every scenario's connection on shm; every peer
  // that exited (the killed ones write no line) made its one on shm too.
  auto prober = stats_of(rs);
  ASSERT_TRUE(prober);
  const uint64_t scenarios = to_u64(parse_result(shim, "SCENARIOS")["n"]);
  EXPECT_EQ(prober->conn("shm"), scenarios);
  expect_paths(*prober, scenarios, 0, "prober");
  expect_fallbacks(*prober, {}, "prober");
  EXPECT_TRUE(prober->resets.empty()) << "prober: no reset is librsock's own here";
  int peers = 0;
  for (const Stats& s : stats()) {
    if (s.pid == rs.pid) continue;
    ++peers;
    expect_paths(s, 1, 0, "peer " + std::to_string(s.pid));
    expect_fallbacks(s, {}, "peer " + std::to_string(s.pid));
    EXPECT_TRUE(s.resets.empty()) << "peer " << s.pid;
  }
  EXPECT_GE(peers, 10) << "too few peers reported";
}

}  // namespace
}  // namespace rsock_test
