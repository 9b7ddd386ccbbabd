// Blocking socket calls and signals (signal(7)): build/progs/rs_signals runs
// its cases once on plain TCP and once with librsock preloaded (both
// connections under test named by RSOCK_PEERS, so carried over shared
// memory), and the two transcripts must be equal: restart after an
// SA_RESTART handler, EINTR without one or with a socket timeout, nothing
// for ignored signals and stop/continue, the partial count of a call that
// moved bytes, a thread asleep behind another on the same socket, poll and
// epoll_wait never restarted, and a socket still connecting (under librsock:
// still pairing). The stats of both processes must show every connection
// under test on shared memory.
#include "harness.h"
#include "transcript.h"

namespace rsock_test {
namespace {

class SignalsTest : public PreloadTest {
 protected:
  // Runs rs_signals; returns its stdout ("" after a failure).
  std::string run(const std::string& label, const Env& env, int port, int port2, Proc** out) {
    Proc& p = spawn(label, "rs_signals",
                    {"--port", std::to_string(port), "--port2", std::to_string(port2)}, env);
    *out = &p;
    EXPECT_TRUE(wait_exit(p, 120000)) << label << " hung";
    EXPECT_TRUE(p.exited_ok()) << label << ": see its output below";
    EXPECT_EQ(p.err(), "") << label;
    const std::string o = p.out();
    EXPECT_NE(o.find("\nDONE\n"), std::string::npos) << label << ":\n" << o;
    EXPECT_NE(o.find("PEER exit=0"), std::string::npos) << label << ":\n" << o;
    return o;
  }
  // Runs the cases on kernel TCP, then under librsock with `extra` in its
  // environment (both connections under test named by RSOCK_PEERS), and
  // compares the transcripts. *rs: the librsock prober.
  void same_as_kernel(const Env& extra, Proc** rs) {
    const int port = free_port();
    const int port2 = free_port_besides(port);
    ASSERT_GT(port, 0);
    ASSERT_GT(port2, 0);
    ASSERT_NE(port, port2);
    Proc* tcp = nullptr;
    const std::string kernel = run("tcp", {}, port, port2, &tcp);
    ASSERT_FALSE(HasFailure());
    Env env = extra;
    env["RSOCK_PEERS"] =
        "127.0.0.1:" + std::to_string(port) + ",127.0.0.1:" + std::to_string(port2);
    const std::string shim = run("librsock", preloaded(env), port, port2, rs);
    ASSERT_FALSE(HasFailure());
    const auto a = transcript(kernel, "CASE ");
    const auto b = transcript(shim, "CASE ");
    EXPECT_GE(a.size(), 20u) << kernel;
    expect_same_transcript(a, b);
  }
};

TEST_F(SignalsTest, SameAsKernel) {
  Proc* rs = nullptr;
  ASSERT_NO_FATAL_FAILURE(same_as_kernel({{"RSOCK_CONNECT_TIMEOUT_MS", "10000"}}, &rs));
  // The prober and its forked peer: A and both B connections on shm.
  const auto lines = stats();
  ASSERT_EQ(lines.size(), 2u) << "one stats line per process";
  for (const Stats& s : lines) {
    const std::string who = s.pid == rs->pid ? "prober" : "peer";
    expect_paths(s, 3, 0, who);
    expect_fallbacks(s, {}, who);
    EXPECT_TRUE(s.resets.empty()) << who;
  }
}

// RSOCK_TCP_FIRST=1 with the pairing a minute away: every case runs on a
// connection still on TCP, whose O_NONBLOCK and timeouts are read at their
// first use. The transcript must still be the kernel's.
TEST_F(SignalsTest, SameAsKernelStartingOnTcp) {
  Proc* rs = nullptr;
  ASSERT_NO_FATAL_FAILURE(
      same_as_kernel({{"RSOCK_TCP_FIRST", "1"}, {"RSOCK_PAIR_DELAY_MS", "60000"}}, &rs));
  // Nothing paired: every connection under test ended on TCP, before its
  // pairing began, in both processes.
  const auto lines = stats();
  ASSERT_EQ(lines.size(), 2u) << "one stats line per process";
  for (const Stats& s : lines) {
    const std::string who = s.pid == rs->pid ? "prober" : "peer";
    expect_paths(s, 0, 3, who);
    expect_fallbacks(s, {{"closed_before_pairing", 3}}, who);
  }
}

// The signalfds librsock keeps for blocking sleeps: one per thread that
// slept, closed when the thread exits; a fork's child keeps only the
// forking thread's. (The transcript above checks that a kept one closed by
// the application is not used again.)
TEST_F(SignalsTest, KeptSignalFds) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const Env env = preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}});
  bool ready = false;
  Proc& server = start_server(
      "server", "rs_echo",
      {"--role", "server", "--port", std::to_string(port), "--connections", "2"}, env, &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& p = spawn("sigfd", "rs_sigfd", {"--port", std::to_string(port)}, env);
  ASSERT_TRUE(wait_exit(p, 120000)) << "rs_sigfd hung";
  ASSERT_TRUE(wait_exit(server, 60000)) << "server hung";
  EXPECT_TRUE(p.exited_ok()) << p.describe();
  EXPECT_TRUE(server.exited_ok()) << server.describe();
  const std::string o = p.out();
  for (const char* want : {"EXITED 0\n", "MAIN 1\n", "BOTH 2\n", "CHILD 1\n", "AFTER 1\n",
                           "MASKED 1\n", "KEPT 1\n", "DONE\n"})
    EXPECT_NE(o.find(want), std::string::npos) << "no line " << want << " in:\n" << o;
  // Both connections on shm in both processes (the child ends in _exit,
  // without a stats line).
  int lines = 0;
  for (const Stats& s : stats()) {
    if (s.pid != p.pid && s.pid != server.pid) continue;
    ++lines;
    expect_paths(s, 2, 0, s.pid == p.pid ? "client" : "server");
  }
  EXPECT_EQ(lines, 2) << "a stats line from the client and one from the server";
}

}  // namespace
}  // namespace rsock_test
