// The end of a connection as the kernel reports it: build/progs/rs_close
// runs 26 scenarios (the peer closes after reading everything or with our
// bytes unread, exits, is SIGKILLed, shuts down its sending side, closes
// with SO_LINGER 0; we shut down one or both directions; calls blocked when
// the peer goes) and prints, probe by probe, what read/recv, write/send
// (with and without MSG_NOSIGNAL, SIGPIPE counted), getsockopt(SO_ERROR),
// shutdown, poll (with and without POLLRDHUP) and epoll (level- and
// edge-triggered, with and without EPOLLRDHUP) say. It runs once on plain
// TCP and once with librsock preloaded (every connection on shared memory,
// or in the default mode on TCP until its pairing), and the two transcripts
// must be equal.
#include "harness.h"
#include "transcript.h"

namespace rsock_test {
namespace {

class CloseTest : public PreloadTest {
 protected:
  // Runs the prober on kernel TCP and preloaded with `mode`, and compares
  // the transcripts. all_shm: every connection must have been accelerated
  // (eager pairing); else each may also have ended on TCP before its
  // pairing (closed_before_pairing).
  void same_as_kernel(const Env& mode, bool all_shm) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    const std::vector<std::string> args = {"--port", std::to_string(port)};

    Proc& tcp = spawn("tcp", "rs_close", args, {});
    ASSERT_TRUE(wait_exit(tcp, 180000)) << "tcp run hung";
    ASSERT_TRUE(tcp.exited_ok()) << "tcp run: see its output below";
    EXPECT_EQ(tcp.err(), "");

    Env env = mode;
    env["RSOCK_PEERS"] = "127.0.0.1:" + std::to_string(port);
    Proc& rs = spawn("librsock", "rs_close", args, preloaded(env));
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

    // The prober accepted every scenario's connection on shm (or on TCP,
    // ended before its pairing); every peer that exited (the killed ones
    // write no line) made its one likewise.
    auto prober = stats_of(rs);
    ASSERT_TRUE(prober);
    const uint64_t scenarios = to_u64(parse_result(shim, "SCENARIOS")["n"]);
    auto expect_each = [&](const Stats& st, uint64_t n, const std::string& who) {
      if (all_shm) {
        expect_paths(st, n, 0, who);
        expect_fallbacks(st, {}, who);
      } else {
        EXPECT_EQ(st.conn("shm") + st.conn("tcp"), n) << who;
        EXPECT_EQ(st.conn("rdma"), 0u) << who;
        expect_fallbacks(st, {{"closed_before_pairing", st.conn("tcp")}}, who);
      }
      EXPECT_TRUE(st.resets.empty()) << who << ": no reset is librsock's own here";
    };
    expect_each(*prober, scenarios, "prober");
    int peers = 0;
    for (const Stats& st : stats()) {
      if (st.pid == rs.pid) continue;
      ++peers;
      expect_each(st, 1, "peer " + std::to_string(st.pid));
    }
    EXPECT_GE(peers, 10) << "too few peers reported";
  }
};

TEST_F(CloseTest, SameAsKernel) { same_as_kernel({}, true); }

// The default mode (RSOCK_TCP_FIRST=1, pairing 5 ms after connect and
// accept): most scenarios end on TCP before their pairing, a few switch in
// the middle, and what the calls say is the kernel's all the same. A
// connection shut down both ways before its pairing began lacked POLLHUP
// until 2026-12-05 (poll right after the shutdown still went to the stream
// it used, which did not know; 3 runs in 3).
// Not under a sanitizer: slowed down, the pairings land inside the
// scenarios, where a write to a peer killed while its pairing ran can
// still succeed where the kernel's fails (killed_read_all_write_first, 1
// run in 8 under ThreadSanitizer): a fault of the mode not fixed yet
// (docs/design.md, "The end of a connection whose pairing lands inside
// it", which lists the three fixed on 2026-12-05).
TEST_F(CloseTest, SameAsKernelStartingOnTcp) {
  if (sanitizers().slowdown > 1)
    GTEST_SKIP() << "a write to a peer killed while pairing differs from the kernel (known)";
  // The prober forks its peers while its pairing thread runs: ThreadSanitizer
  // would stop such a child (no threads after a multi-threaded fork) rather
  // than check it.
  same_as_kernel({{"RSOCK_TCP_FIRST", "1"},
                  {"RSOCK_PAIR_DELAY_MS", "5"},
                  {"TSAN_OPTIONS", "die_after_fork=0"}},
                 false);
}

}  // namespace
}  // namespace rsock_test
