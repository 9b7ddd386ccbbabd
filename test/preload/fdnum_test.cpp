// What a program sees of its own descriptors and listen backlog under
// librsock (rs_fdnum), both ends preloaded, every connection on shared
// memory:
// - librsock's descriptors (doorbell dup, ring memfd, a pairing's sockets
//   and eventfds) sit above the program's (common/own_fd.h): a client that
//   opens 20 connections and then a file gets the numbers kernel TCP would
//   give when it connects blocking (pairing runs on its own thread); when
//   it connects nonblocking, pairing threads make descriptors beside it,
//   which the kernel puts at the lowest free number for the microseconds
//   before librsock moves them up, so two of the program's numbers may
//   swap, but none grows (wrk sizes its event loop for 10 + 3 x
//   connections descriptors and fails the connects past it);
// - a burst of connects beyond a listen(1) backlog is accelerated: a
//   candidate listener's accept queue holds kMinListenBacklog, because a
//   client whose handshake a full queue dropped would wait for the SYN-ACK
//   retransmission (1 s, the pairing bound) where kernel TCP completes it
//   with the first data segment.
#include "harness.h"

namespace rsock_test {
namespace {

class FdNumberTest : public PreloadTest {
 protected:
  // A server of `count` connections and a client in `mode`; both exit 0 and
  // count `count` shm connections, without a fallback.
  void run(const std::string& mode, int count, int backlog, int delay_ms) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    const std::string n = std::to_string(count);
    Env env = preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}});
    bool ready = false;
    Proc& server = start_server("server", "rs_fdnum",
                                {"server", std::to_string(port), n, std::to_string(backlog),
                                 std::to_string(delay_ms)},
                                env, &ready);
    ASSERT_TRUE(ready) << "server: see its output below";
    Proc& client = spawn("client", "rs_fdnum", {mode, std::to_string(port), n}, env);
    ASSERT_TRUE(wait_exit(client, kExitTimeoutMs)) << "client hung";
    ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
    auto r = parse_result(client.out(), "RESULT");
    EXPECT_EQ(r["ok"], n);
    if (mode == "seq") {
      EXPECT_EQ(r["dense"], "1") << "see the client's output below";
    }
    if (mode != "burst") {
      // 3, 4, ... as on kernel TCP; a pairing thread's transient descriptor
      // may shift a few of the nonblocking ones up by one (not by 2 per
      // connection, as librsock's own descriptors would).
      const int slack = mode == "seq" ? 0 : 2;
      EXPECT_LE(std::stoi(r["highest"]), std::stoi(r["first"]) + count + slack)
          << "see the client's output below";
    }
    EXPECT_TRUE(client.exited_ok()) << "client: see its output below";
    EXPECT_TRUE(server.exited_ok()) << "server: see its output below";
    EXPECT_EQ(parse_result(server.out(), "RESULT")["served"], n);
    auto cs = stats_of(client);
    auto ss = stats_of(server);
    ASSERT_TRUE(cs && ss);
    expect_paths(*cs, count, 0, "client");
    expect_paths(*ss, count, 0, "server");
    expect_fallbacks(*cs, {}, "client");
    expect_fallbacks(*ss, {}, "server");
  }
};

TEST_F(FdNumberTest, BlockingConnectsGetTheKernelsNumbers) { run("seq", 20, 128, 0); }

TEST_F(FdNumberTest, NonblockingConnectsGetTheKernelsNumbers) { run("nonblock", 20, 128, 0); }

TEST_F(FdNumberTest, BurstBeyondASmallBacklogIsAccelerated) { run("burst", 8, 1, 300); }

}  // namespace
}  // namespace rsock_test
