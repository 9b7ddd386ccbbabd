// POSIX socket semantics on accelerated fds: each case runs BUILD/progs/rs_sem
// as a server and a client, both preloaded, with the connection under test
// named by RSOCK_PEERS (64 KiB rings) and a second, plain TCP control
// connection. The client checks the semantics itself (see rs_sem.cpp for each
// check: O_NONBLOCK/MSG_DONTWAIT/FIONBIO, a full ring and SO_SNDTIMEO,
// MSG_PEEK/MSG_WAITALL/FIONREAD, SO_RCVTIMEO, EPIPE/SIGPIPE/MSG_NOSIGNAL,
// sendto/recvfrom/SO_ERROR, dup/dup2/dup3, poll/select/epoll over mixed fds,
// idle CPU, two threads asleep on one fd in a mix of recv/send, poll and
// epoll_wait). Here every case must pass and the stats must show that the
// connection under test really was on shared memory (and the control one on
// TCP), with byte counters equal to what the programs say they moved.
#include "harness.h"

namespace rsock_test {
namespace {

class SemanticsTest : public PreloadTest, public ::testing::WithParamInterface<const char*> {
 protected:
  // tcp_first: RSOCK_TCP_FIRST=1, pairing at once in the background, so
  // that the connection's switch from TCP to the ring falls inside the case;
  // never_pairs: with the pairing a minute away, so that the whole case
  // runs on the kernel socket.
  // extra: more of the programs' environment.
  void run_case(bool tcp_first, bool never_pairs = false, const Env& extra = {});
};

TEST_P(SemanticsTest, OnSharedMemory) { run_case(false); }

void SemanticsTest::run_case(bool tcp_first, bool never_pairs, const Env& extra) {
  const int port = free_port();
  const int port2 = free_port_besides(port);
  ASSERT_GT(port, 0);
  ASSERT_GT(port2, 0);
  ASSERT_NE(port, port2);
  // nb_fallback: the server accepts after the client's pairing gave up.
  const bool fallback = std::string(GetParam()) == "nb_fallback";
  Env env =
      preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}, {"RSOCK_RING_SIZE", "64K"}});
  if (fallback) env["RSOCK_CONNECT_TIMEOUT_MS"] = "300";
  if (tcp_first) {
    env["RSOCK_TCP_FIRST"] = "1";
    env["RSOCK_PAIR_DELAY_MS"] = never_pairs ? "60000" : "0";
  }
  // Under a sanitizer the nb_* cases' accept delay grows (RS_TEST_SLOWDOWN,
  // rs_sem.cpp): the pairing timeout grows with it, so that the server's
  // late accept still comes well within it.
  const int slowdown = sanitizers().slowdown;
  if (!fallback && slowdown > 1)
    env["RSOCK_CONNECT_TIMEOUT_MS"] = std::to_string(1000 * slowdown);
  for (const auto& [k, v] : extra) env[k] = v;
  const RoleArgs args = two_port_args(port, port2, {"--case", GetParam()});

  bool ready = false;
  Proc& server = start_server("server", "rs_sem", args.server, env, &ready);
  ASSERT_TRUE(ready) << "server: see its output below";
  Proc& client = spawn("client", "rs_sem", args.client, env);
  ASSERT_TRUE(wait_exit(client, 60000)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  ASSERT_TRUE(client.exited_ok()) << "client: see its output below";
  ASSERT_TRUE(server.exited_ok()) << "server: see its output below";

  const std::string out = client.out();
  EXPECT_NE(out.find("\nDONE\n"), std::string::npos) << out;
  EXPECT_NE(out.find("OK "), std::string::npos) << "no check ran: " << out;
  EXPECT_EQ(client.err(), "");
  EXPECT_EQ(server.err(), "");

  auto ct = parse_result(out, "TOTALS");
  auto st = parse_result(server.out(), "TOTALS");
  ASSERT_FALSE(ct.empty() || st.empty()) << "no TOTALS line";
  EXPECT_EQ(to_u64(ct["sent"]) - to_u64(ct["lost"]), to_u64(st["received"]));
  EXPECT_EQ(ct["received"], st["sent"]);

  auto cs = stats_of(client);
  auto ss = stats_of(server);
  ASSERT_TRUE(cs && ss);
  if (never_pairs) {
    // Over before either side's pairing was due: TCP throughout.
    expect_paths(*cs, 0, 2, "client");
    expect_paths(*ss, 0, 2, "server");
    expect_fallbacks(*cs, {{"closed_before_pairing", 1}}, "client");
    expect_fallbacks(*ss, {{"closed_before_pairing", 1}}, "server");
  } else if (fallback) {
    // Both on TCP: the client's pairing timed out; the server found no
    // client waiting to pair.
    expect_paths(*cs, 0, 2, "client");
    expect_paths(*ss, 0, 2, "server");
    expect_fallbacks(*cs, {{"pair_timeout", 1}}, "client");
    expect_fallbacks(*ss, {{"peer_not_accelerated", 1}}, "server");
  } else if (std::string(GetParam()) == "nb_close") {
    // The client closed A while pairing: it counts no connection for it.
    // The server either paired before the client's pairing saw the close
    // (then the stream ended), or found no client waiting.
    expect_paths(*cs, 0, 1, "client");
    expect_fallbacks(*cs, {}, "client");
    if (ss->conn("shm") == 1) {
      expect_paths(*ss, 1, 1, "server");
      expect_fallbacks(*ss, {}, "server");
    } else {
      expect_paths(*ss, 0, 2, "server");
      expect_fallbacks(*ss, {{"peer_not_accelerated", 1}}, "server");
    }
  } else {
    // The connection under test on shm; the control connection on TCP.
    expect_paths(*cs, 1, 1, "client");
    expect_paths(*ss, 1, 1, "server");
    expect_fallbacks(*cs, {}, "client");
    expect_fallbacks(*ss, {}, "server");
    EXPECT_EQ(cs->total_sent(), to_u64(ct["sent"]));
    EXPECT_EQ(cs->total_received(), to_u64(ct["received"]));
    EXPECT_EQ(ss->total_sent(), to_u64(st["sent"]));
    EXPECT_EQ(ss->total_received(), to_u64(st["received"]));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SemanticsTest,
    ::testing::Values("nonblock", "sendfull", "peek", "timeo", "epipe", "addr", "dup", "poll",
                      "select", "epoll_lt", "epoll_et", "epoll_oneshot", "idle", "mt_poll",
                      "mt_epoll", "mt_recv_send", "mt_poll_send", "mt_epoll_send", "mt_poll_poll",
                      "mt_epoll_epoll", "mt_poll_epoll", "mt_epoll_poll", "mt_send_then_recv",
                      "mt_close_recv", "nb_poll", "nb_select", "nb_epoll", "nb_block", "nb_dup",
                      "nb_fallback", "nb_close", "nb_accept", "nb_epoll_mod", "shut_recv",
                      "shut_epoll", "shut_poll", "shut_send", "epoll_add_asleep", "epoll_add_ready",
                      "epoll_mod_ready", "epoll_dormant", "epoll_dup", "nb_fill", "nb_reconnect",
                      "connect_kinds"),
    [](const auto& info) { return std::string(info.param); });

// The cases that hold when the connection starts on TCP and switches while
// they run (RSOCK_TCP_FIRST=1, experimental). Among them the wakeups of
// threads asleep on the connection at its switch (mt_*, shut_*: they slept
// on the stream used meanwhile and were not woken for bytes that came
// through its successor) and edge-triggered epoll across the switch
// (epoll_et: the switch itself was reported as an edge), and FIONREAD
// while the prefix is read and the ring holds more (epoll_oneshot counted
// only the socket's part), and an epoll set holding the connection under
// two numbers (epoll_dup: only one member was converted). The others expect
// what the mode changes (a connection that pairs at connect, a ring's worth
// of room, stats of a connection that never paired).
class SemanticsTcpFirstTest : public SemanticsTest {};

TEST_P(SemanticsTcpFirstTest, StartingOnTcp) { run_case(true); }

// A connection under two numbers whose hand-over (RSOCK_TCP_FIRST) meets
// the program's use and close of one of them (rs_sem dup_handover): each
// hand-over pauses twice for 100 ms, and the client makes its call at 130,
// 160 and 190 ms after its connect in three runs, so that at least one
// call falls into the window where its fd changes hands before the other
// does, whatever the pairing took up to 90 ms. Before 2026-12-07 the close
// of the first number ended the connection there (FdTable counted the fds
// of the outcome alone, one, while the other still held the pairing's
// state); the dup case failed in about 1 run of 25 the same way.
class SemanticsHandOverTest : public SemanticsTest {};

TEST_P(SemanticsHandOverTest, AcrossTheHandOver) {
  for (const char* at : {"130", "160", "190"}) {
    SCOPED_TRACE(std::string("RS_USE_AT_MS=") + at);
    run_case(true, false, {{"RSOCK_TEST_HANDOVER_PAUSE_US", "100000"}, {"RS_USE_AT_MS", at}});
    if (HasFatalFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, SemanticsHandOverTest, ::testing::Values("dup_handover"),
                         [](const auto& info) { return std::string(info.param); });

// The readiness cases on a connection that stays on TCP for the whole case
// (RSOCK_TCP_FIRST=1, its pairing a minute away): poll, select and epoll
// report the kernel socket's readiness as kernel TCP does, the kernel's own
// reports included (an epoll wait takes them for a look at the socket), and
// a shutdown() of either side wakes a thread asleep on it (shut_recv and
// shut_poll shut the receiving side alone, which waited for the pairing's
// outcome, a minute here, before 2026-12-06), and a connection whose fd
// is dup'd goes on under its other numbers once the first is closed (dup:
// the stream, which uses the application's fd for its socket, takes its
// own dup at the first dup of it).
class SemanticsOnTcpTest : public SemanticsTest {};

TEST_P(SemanticsOnTcpTest, NeverPaired) { run_case(true, true); }

INSTANTIATE_TEST_SUITE_P(Cases, SemanticsOnTcpTest,
                         ::testing::Values("poll", "select", "epoll_lt", "epoll_et",
                                           "epoll_oneshot", "mt_poll", "mt_epoll", "mt_epoll_send",
                                           "mt_epoll_epoll", "shut_recv", "shut_epoll", "shut_poll",
                                           "epoll_add_asleep", "epoll_add_ready", "epoll_mod_ready",
                                           "epoll_dormant", "epoll_dup", "dup"),
                         [](const auto& info) { return std::string(info.param); });

INSTANTIATE_TEST_SUITE_P(Cases, SemanticsTcpFirstTest,
                         ::testing::Values("nonblock", "peek", "timeo", "addr", "dup", "poll",
                                           "select", "epoll_lt", "epoll_et", "epoll_oneshot",
                                           "mt_poll", "mt_epoll", "mt_recv_send", "mt_poll_send",
                                           "mt_epoll_send", "mt_poll_poll", "mt_epoll_epoll",
                                           "mt_poll_epoll", "mt_epoll_poll", "mt_send_then_recv",
                                           "mt_close_recv", "shut_recv", "shut_epoll", "shut_poll",
                                           "shut_send", "epoll_add_asleep", "epoll_add_ready",
                                           "epoll_mod_ready", "epoll_dormant", "epoll_dup"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace rsock_test
