// RSOCK_TCP_FIRST=1 (experimental, docs/design.md "Connection setup"): a
// candidate connection runs on kernel TCP from connect()/accept() on and
// pairs in the background, the server's side a little after accept(). A
// connection that ends first is never paired (and counted so), and one
// that lives on switches to the ring with every byte in order.
#include <sys/stat.h>

#include <functional>

#include "harness.h"

namespace rsock_test {
namespace {

class TcpFirstTest : public PreloadTest {
 protected:
  struct Run {
    Stats client, server;
  };
  // The environment of a tcp-first run whose pairing waits `delay_ms`.
  static Env tcp_first_env(int port, const std::string& delay_ms) {
    return {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)},
            {"RSOCK_TCP_FIRST", "1"},
            {"RSOCK_PAIR_DELAY_MS", delay_ms}};
  }
  // The descriptors rs_idle's client and server hold with n connections open
  // and used (1,000 bytes echoed on each), run with `env`.
  void count_descriptors(const Env& env, int port, int n, int* client_fds, int* server_fds) {
    bool ready = false;
    Proc& server = start_server(
        "server", "rs_idle",
        {"--role", "server", "--port", std::to_string(port), "--connections", std::to_string(n)},
        env, &ready);
    ASSERT_TRUE(ready) << server.describe();
    Proc& client = spawn("client", "rs_idle",
                         {"--role", "client", "--port", std::to_string(port), "--connections",
                          std::to_string(n), "--bytes", "1000", "--idle-ms", "0"},
                         env);
    ASSERT_TRUE(wait_exit(client, 60000)) << "client hung";
    ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
    ASSERT_TRUE(client.exited_ok()) << client.describe();
    ASSERT_TRUE(server.exited_ok()) << server.describe();
    auto c = parse_result(client.out(), "RESULT");
    auto s = parse_result(server.out(), "RESULT");
    EXPECT_EQ(c["bytes"], std::to_string(2 * 1000 * n));
    ASSERT_FALSE(c["fds"].empty() || s["fds"].empty()) << client.out() << server.out();
    *client_fds = std::stoi(c["fds"]);
    *server_fds = std::stoi(s["fds"]);
  }
  // n connections on kernel TCP, then under librsock with env_for(port):
  // each process holds at most `per_connection` descriptors more per
  // connection than on TCP, and 4 more besides (the pairing driver's
  // eventfd, a thread's waker and the like, which do not grow with the
  // connections).
  void expect_descriptors(int n, const std::function<Env(int)>& env_for, int per_connection) {
    int tcp_c = 0, tcp_s = 0, rs_c = 0, rs_s = 0;
    const int port = free_port(), port2 = free_port();
    ASSERT_GT(port, 0);
    ASSERT_GT(port2, 0);
    count_descriptors(Env{}, port, n, &tcp_c, &tcp_s);
    count_descriptors(env_for(port2), port2, n, &rs_c, &rs_s);
    ASSERT_GE(tcp_c, n);
    ASSERT_GE(tcp_s, n);
    const int extra = per_connection * n + 4;
    EXPECT_LE(rs_c, tcp_c + extra) << "client: " << rs_c << " fds against " << tcp_c << " on TCP";
    EXPECT_LE(rs_s, tcp_s + extra) << "server: " << rs_s << " fds against " << tcp_s << " on TCP";
  }
  // rs_stream's arguments for 100 checked bytes each way, both at once.
  static std::vector<std::string> hundred_each_way(const std::string& role, int port) {
    const bool server = role == "server";
    return {"--role",    role,
            "--port",    std::to_string(port),
            "--send",    "100",
            "--expect",  "100",
            "--order",   "duplex",
            "--tx-seed", server ? "11" : "22",
            "--rx-seed", server ? "22" : "11"};
  }
  // rs_sem's case `name` on a connection whose pairing is a minute away
  // (it runs on TCP throughout); the client prints every line of `want`.
  void sem_case_before_pairing(const std::string& name, std::vector<std::string> want) {
    const int port = free_port();
    const int port2 = free_port_besides(port);
    ASSERT_GT(port, 0);
    ASSERT_GT(port2, 0);
    ASSERT_NE(port, port2);
    const Env env = tcp_first_env(port, "60000");
    const RoleArgs args = two_port_args(port, port2, {"--case", name});
    bool ready = false;
    Proc& server = start_server("server", "rs_sem", args.server, preloaded(env), &ready);
    ASSERT_TRUE(ready) << server.describe();
    Proc& client = spawn("client", "rs_sem", args.client, preloaded(env));
    ASSERT_TRUE(wait_exit(client, 60000)) << "client hung (a call waited?)";
    ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
    ASSERT_TRUE(client.exited_ok()) << client.describe();
    ASSERT_TRUE(server.exited_ok()) << server.describe();
    const std::string out = client.out();
    want.push_back("\nDONE\n");
    for (const std::string& w : want)
      EXPECT_NE(out.find(w), std::string::npos) << "no " << w << " in:\n" << out;
    auto cs = stats_of(client);
    ASSERT_TRUE(cs);
    // The connection under test never paired; the control connection is
    // plain TCP (its port is named by no rule).
    expect_paths(*cs, 0, 2, "client");
    expect_fallbacks(*cs, {{"closed_before_pairing", 1}}, "client");
  }
  // rs_stale against a server without librsock that answers each of
  // `runs` connections with a byte `send_after_ms` after its accept: `runs`
  // client processes with client_args (besides role and port), preloaded
  // with `env`, one connection each (a failed pairing puts the server in
  // the negative cache of the process). Each must exit 0; their RESULT
  // lines, in order.
  void stale_clients(int port, int runs, const std::string& send_after_ms, const Env& env,
                     const std::vector<std::string>& client_args,
                     std::vector<std::map<std::string, std::string>>* results) {
    bool ready = false;
    Proc& server =
        start_server("server", "rs_stale",
                     {"--role", "server", "--port", std::to_string(port), "--connections",
                      std::to_string(runs), "--send-after-ms", send_after_ms},
                     Env{}, &ready);
    ASSERT_TRUE(ready) << server.describe();
    std::vector<std::string> args = {"--role",        "client", "--port", std::to_string(port),
                                     "--connections", "1"};
    args.insert(args.end(), client_args.begin(), client_args.end());
    for (int i = 0; i < runs; ++i) {
      Proc& client = spawn("client", "rs_stale", args, env);
      ASSERT_TRUE(wait_exit(client, 30000)) << "client hung";
      ASSERT_TRUE(client.exited_ok()) << client.describe();
      results->push_back(parse_result(client.out(), "RESULT"));
    }
    ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
    ASSERT_TRUE(server.exited_ok()) << server.describe();
  }
  // Three rs_stale clients (client_args), each with one connection to a
  // server without librsock that writes a byte 30 ms after its accept, the
  // hand-over paused 100 ms twice: none sees its closed fd reported. Each
  // pairing ran and ended on plain TCP before the close (the path under
  // test). Under a sanitizer the pairing may take longer than the close's
  // 20 ms: the close then comes first and ends it (closed_before_pairing),
  // which must leave nothing behind either.
  void expect_closed_fds_clean(const std::vector<std::string>& client_args) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    const int runs = 3;
    Env env = preloaded(tcp_first_env(port, "0"));
    env["RSOCK_TEST_HANDOVER_PAUSE_US"] = "100000";
    std::vector<std::map<std::string, std::string>> results;
    stale_clients(port, runs, "30", env, client_args, &results);
    if (HasFatalFailure()) return;
    for (auto& r : results) EXPECT_EQ(r["clean"], "1");
    const std::vector<Stats> all = stats();
    ASSERT_EQ(all.size(), static_cast<size_t>(runs));
    for (const Stats& st : all) {
      EXPECT_EQ(st.conn("tcp"), 1u);
      if (sanitizers().slowdown > 1)
        EXPECT_EQ(st.fallback("peer_not_accelerated") + st.fallback("closed_before_pairing"), 1u);
      else
        EXPECT_EQ(st.fallback("peer_not_accelerated"), 1u);
    }
  }
  // rs_stream both ways at once, `bytes` each way, in random writes and
  // mixed reads; every byte checked by the reader and hashed.
  void exchange(uint64_t bytes, const std::string& delay_ms, Run* out) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    const Env env = tcp_first_env(port, delay_ms);
    const std::string n = std::to_string(bytes);
    auto args = [&](const char* role, const char* tx, const char* rx) {
      return std::vector<std::string>{
          "--role",      role,     "--port",      std::to_string(port),
          "--send",      n,        "--expect",    n,
          "--tx-seed",   tx,       "--rx-seed",   rx,
          "--max-write", "262144", "--write-api", "mixed",
          "--read-api",  "mixed",  "--max-read",  "100000",
          "--order",     "duplex"};
    };
    bool ready = false;
    Proc& server =
        start_server("server", "rs_stream", args("server", "11", "22"), preloaded(env), &ready);
    ASSERT_TRUE(ready) << "server: see its output below";
    Proc& client = spawn("client", "rs_stream", args("client", "22", "11"), preloaded(env));
    ASSERT_TRUE(wait_exit(client, 120000)) << "client did not finish in time";
    ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server did not finish in time";
    ASSERT_TRUE(client.exited_ok()) << "client: see its output below";
    ASSERT_TRUE(server.exited_ok()) << "server: see its output below";
    auto c = parse_result(client.out());
    auto s = parse_result(server.out());
    ASSERT_FALSE(c.empty() || s.empty()) << "no RESULT line";
    EXPECT_EQ(to_u64(c["received"]), bytes);
    EXPECT_EQ(to_u64(s["received"]), bytes);
    EXPECT_EQ(c["tx_hash"], s["rx_hash"]);
    EXPECT_EQ(s["tx_hash"], c["rx_hash"]);
    auto cs = stats_of(client);
    auto ss = stats_of(server);
    ASSERT_TRUE(cs && ss);
    out->client = *cs;
    out->server = *ss;
  }
};

// 100 bytes each way, and the server's side would start pairing only after
// 30 s: both ends finish on TCP, and neither ever pairs.
TEST_F(TcpFirstTest, AShortConnectionIsNeverPaired) {
  Run r;
  ASSERT_NO_FATAL_FAILURE(exchange(100, "30000", &r));
  expect_paths(r.client, 0, 1, "client");
  expect_paths(r.server, 0, 1, "server");
  expect_fallbacks(r.client, {{"closed_before_pairing", 1}}, "client");
  expect_fallbacks(r.server, {{"closed_before_pairing", 1}}, "server");
}

// Each side in turn reads until the other's close, while the closer stays
// alive: the close of an fd whose pairing has not begun ends its
// connection at once (its FIN does not wait for the pairing's delay of
// 60 s, nor for any thread of librsock's), on either side.
TEST_F(TcpFirstTest, ACloseBeforeThePairingEndsTheConnectionAtOnce) {
  for (const std::string reader : {"server", "client"}) {
    SCOPED_TRACE("reading until EOF: " + reader);
    const int port = free_port();
    ASSERT_GT(port, 0);
    const Env env = tcp_first_env(port, "60000");
    auto args = [&](const std::string& role) {
      std::vector<std::string> a = hundred_each_way(role, port);
      if (role == reader) {
        a.push_back("--expect-eof");
      } else {
        a.insert(a.end(), {"--stay-ms", "60000"});
      }
      return a;
    };
    bool ready = false;
    Proc& server =
        start_server("server-" + reader, "rs_stream", args("server"), preloaded(env), &ready);
    ASSERT_TRUE(ready) << "server: see its output below";
    Proc& client = spawn("client-" + reader, "rs_stream", args("client"), preloaded(env));
    Proc& r = reader == "server" ? server : client;
    Proc& closer = reader == "server" ? client : server;
    ASSERT_TRUE(wait_exit(r, 20000)) << "the reader did not see its peer's close";
    ASSERT_TRUE(r.exited_ok()) << "reader: see its output below";
    auto res = parse_result(r.out());
    EXPECT_EQ(to_u64(res["received"]), 100u);
    EXPECT_EQ(res["rx_end"], "eof");
    auto st = stats_of(r);
    ASSERT_TRUE(st);
    expect_paths(*st, 0, 1, reader.c_str());
    expect_fallbacks(*st, {{"closed_before_pairing", 1}}, reader.c_str());
    kill_proc(closer);
  }
}

// The server writes 1 MiB on TCP before the pairing (300 ms after
// accept()), then switches and closes while most of it still waits in its
// socket's send queue, the client reading nothing yet. The client then
// shuts down its sending side, which puts a doorbell on the socket (its
// switch, its FIN), and only then reads. Were the server's socket closed
// with the application's close (or its exit), that byte would meet a
// socket with no holder, and Linux would answer with a reset that throws
// the queued bytes away (the client read EOF after 128 KiB of the 1 MiB).
// It lingers until the client read them all: every byte arrives, then EOF,
// whether the server's process stays, exits right after its close, exits
// without closing, or execs another program right after its close (the
// exec waits as an exit does; before 2026-12-07 it closed the lingering
// socket, close-on-exec, and the client read EOF early).
TEST_F(TcpFirstTest, AClosedEndKeepsItsSocketUntilThePeerReadItsPrefix) {
  const uint64_t bytes = 1u << 20;
  for (const std::string how : {"exits", "stays", "exits-open", "execs"}) {
    SCOPED_TRACE("the server " + how);
    const bool server_exits = how != "stays";
    const int port = free_port();
    ASSERT_GT(port, 0);
    const Env env = tcp_first_env(port, "300");
    const std::string n = std::to_string(bytes);
    bool ready = false;
    std::vector<std::string> server_args = {"--role",      "server",
                                            "--port",      std::to_string(port),
                                            "--send",      n,
                                            "--expect",    "0",
                                            "--order",     "send-first",
                                            "--tx-seed",   "31",
                                            "--linger-ms", "800",
                                            "--stay-ms",   server_exits ? "0" : "5000"};
    if (how == "exits-open") server_args.push_back("--no-close");
    if (how == "execs") {
      server_args.push_back("--exec-after");
      server_args.push_back("/bin/true");
    }
    Proc& server = start_server("server-" + how, "rs_stream", server_args, preloaded(env), &ready);
    ASSERT_TRUE(ready) << "server: see its output below";
    Proc& client = spawn(
        "client-" + how, "rs_stream",
        {"--role", "client", "--port", std::to_string(port), "--send", "0", "--shut-wr", "--expect",
         n, "--expect-eof", "--order", "send-first", "--rx-seed", "31", "--pause-ms", "1500"},
        preloaded(env));
    ASSERT_TRUE(wait_exit(client, 60000)) << "client did not finish in time";
    ASSERT_TRUE(client.exited_ok()) << "client: see its output below";
    auto c = parse_result(client.out());
    EXPECT_EQ(to_u64(c["received"]), bytes);
    EXPECT_EQ(c["rx_end"], "eof");
    ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server did not finish in time";
    ASSERT_TRUE(server.exited_ok()) << "server: see its output below";
    // The pid has two stats lines: the image that exec'd and its successor.
    if (how == "execs") continue;
    auto ss = stats_of(server);
    auto cs = stats_of(client);
    ASSERT_TRUE(ss && cs);
    expect_paths(*ss, 1, 0, "server");
    expect_paths(*cs, 1, 0, "client");
    // The case at hand: far more on TCP than the client's socket buffer
    // held when the reset came (the ring carried the rest, if any).
    EXPECT_GE(ss->before_sent, bytes / 2);
    EXPECT_EQ(cs->before_received, ss->before_sent);
  }
}

// A process that exits with a connection still on TCP, its pairing not yet
// begun (60 s away), counts it as one that ended before its pairing, as
// its close would have: every connection is in the stats line once.
TEST_F(TcpFirstTest, AConnectionStillPairingAtExitIsCounted) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const Env env = tcp_first_env(port, "60000");
  auto args = [&](const std::string& role) {
    const bool server = role == "server";
    std::vector<std::string> a = hundred_each_way(role, port);
    if (server) a.push_back("--expect-eof");
    if (!server) a.push_back("--no-close");
    return a;
  };
  bool ready = false;
  Proc& server = start_server("server", "rs_stream", args("server"), preloaded(env), &ready);
  ASSERT_TRUE(ready) << "server: see its output below";
  Proc& client = spawn("client", "rs_stream", args("client"), preloaded(env));
  ASSERT_TRUE(wait_exit(client, 20000)) << "client did not finish in time";
  ASSERT_TRUE(client.exited_ok()) << "client: see its output below";
  ASSERT_TRUE(wait_exit(server, 20000)) << "the server did not see the client's end";
  ASSERT_TRUE(server.exited_ok()) << "server: see its output below";
  auto cs = stats_of(client);
  auto ss = stats_of(server);
  ASSERT_TRUE(cs && ss);
  expect_paths(*cs, 0, 1, "client");
  expect_fallbacks(*cs, {{"closed_before_pairing", 1}}, "client");
  expect_paths(*ss, 0, 1, "server");
  expect_fallbacks(*ss, {{"closed_before_pairing", 1}}, "server");
}

// POSIX AIO reaches the socket through glibc's internal write, which no
// wrapper sees: on a connection still on TCP before its pairing, its bytes
// would be missing from the count the switch announces, and the server,
// having read past that count, would reset. It is refused (EOPNOTSUPP) as
// on an accelerated connection, and the rest of the stream arrives intact.
// The pairing is due 100 ms after connect() and accept(); the client
// shuts down only 2 s after its writes, so that it pairs first (a shutdown
// before the pairing began would keep the connection on TCP for good).
TEST_F(TcpFirstTest, PosixAioOnAConnectionStillOnTcpIsRefused) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const Env env = tcp_first_env(port, "100");
  const std::string scratch = dir() + "/aio";
  ASSERT_EQ(mkdir(scratch.c_str(), 0755), 0);
  bool ready = false;
  Proc& server =
      start_server("server", "rs_xfer",
                   {"--role", "server", "--port", std::to_string(port), "--case", "aio_fclose"},
                   preloaded(env), &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client = spawn("client", "rs_xfer",
                       {"--role", "client", "--port", std::to_string(port), "--case", "aio_fclose",
                        "--dir", scratch, "--pause-ms", "2000"},
                       preloaded(env));
  ASSERT_TRUE(wait_exit(client, 60000)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  ASSERT_TRUE(client.exited_ok()) << client.describe();
  ASSERT_TRUE(server.exited_ok()) << server.describe();
  EXPECT_NE(client.out().find("NOTE aio refused"), std::string::npos) << client.out();
  auto total = [](const std::string& out, const std::string& who) {
    const size_t at = out.find(who + " total=");
    if (at == std::string::npos) return std::string("none");
    const size_t from = at + who.size() + 1;
    return out.substr(from, out.find('\n', from) - from);  // "total=N fnv=H"
  };
  const std::string sent = total(client.out(), "CLIENT");
  EXPECT_NE(sent, "none") << client.out();
  EXPECT_EQ(total(server.out(), "SERVER"), sent) << "the server read other bytes than were sent";
  auto cs = stats_of(client);
  ASSERT_TRUE(cs);
  expect_paths(*cs, 1, 0, "client");
}

// 64 MiB each way, pairing 5 ms after accept(): the first bytes go on TCP,
// the rest on the ring, intact and in order (the readers check every
// byte), and the stats account for both parts.
TEST_F(TcpFirstTest, AStreamThatStartsOnTcpSwitchesIntact) {
  Run r;
  const uint64_t bytes = 64ull << 20;
  ASSERT_NO_FATAL_FAILURE(exchange(bytes, "5", &r));
  expect_paths(r.client, 1, 0, "client");
  expect_paths(r.server, 1, 0, "server");
  expect_fallbacks(r.client, {}, "client");
  expect_fallbacks(r.server, {}, "server");
  EXPECT_EQ(r.client.total_sent(), bytes);
  EXPECT_EQ(r.client.total_received(), bytes);
  EXPECT_EQ(r.server.total_sent(), bytes);
  EXPECT_EQ(r.server.total_received(), bytes);
  // The ring carried part of it: the connection did switch.
  EXPECT_GT(r.client.bytes_sent, 0u);
  EXPECT_GT(r.server.bytes_sent, 0u);
}

// A connection on TCP until its pairing (here a minute away: the whole test)
// costs one descriptor, as on kernel TCP: its stream uses the application's
// own fd for the socket, and takes a dup only when the number could come to
// name another file while it still needs the socket (a dup of the fd, a
// dup2 onto it: SemanticsOnTcpTest dup). Until 2026-12-06 it held a dup
// from the start: two per connection. 40 connections, 1,000 bytes echoed
// on each; both programs count their descriptors with all of them open,
// on kernel TCP and under librsock, in the same test.
TEST_F(TcpFirstTest, AConnectionOnTcpCostsOneDescriptor) {
  const int n = 40;
  expect_descriptors(
      n, [&](int port) { return preloaded(tcp_first_env(port, "60000")); }, 0);
  // They were librsock's connections, on TCP for the whole test.
  const std::vector<Stats> all = stats();
  ASSERT_EQ(all.size(), 2u);
  for (const Stats& st : all) {
    EXPECT_EQ(st.conn("tcp"), static_cast<uint64_t>(n));
    EXPECT_EQ(st.conn("shm"), 0u);
  }
}

// A paired shm connection holds one descriptor, as on TCP: its socket,
// under the application's fd alone (transport/socket_number.h: the
// pairing's private dup goes at the hand-over). Its region lies in the
// file that holds every region of the two processes (transport/shm/
// arena.h): one descriptor per process for all 40. Before 2026-12-06
// each connection held a dup of the socket and a memfd of its own too
// (three descriptors each), then the memfd (two). As above, with
// RSOCK_TCP_FIRST=0 (each connection pairs before its first byte, so that
// no pairing is in flight when the descriptors are counted, after each
// carried its echo over the ring).
TEST_F(TcpFirstTest, APairedConnectionHoldsOneDescriptor) {
  const int n = 40;
  expect_descriptors(
      n,
      [&](int port) {
        return preloaded(
            {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}, {"RSOCK_TCP_FIRST", "0"}});
      },
      0);
  const std::vector<Stats> all = stats();
  ASSERT_EQ(all.size(), 2u);
  for (const Stats& st : all) {
    EXPECT_EQ(st.conn("shm"), static_cast<uint64_t>(n));
    EXPECT_GT(st.bytes_sent, 0u);
  }
}

// RSOCK_REGION_FILE=connection (docs/security.md: for a program that hands
// accelerated sockets to programs it trusts less) puts each connection's
// region in a file of its own again: one descriptor more per connection,
// on both sides (the client proves itself without a token, the server
// places for nobody).
TEST_F(TcpFirstTest, ARegionFileOfItsOwnOnRequest) {
  const int n = 20;
  int tcp_c = 0, tcp_s = 0, rs_c = 0, rs_s = 0;
  const int port = free_port(), port2 = free_port();
  ASSERT_GT(port, 0);
  ASSERT_GT(port2, 0);
  count_descriptors(Env{}, port, n, &tcp_c, &tcp_s);
  count_descriptors(preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port2)},
                               {"RSOCK_TCP_FIRST", "0"},
                               {"RSOCK_REGION_FILE", "connection"}}),
                    port2, n, &rs_c, &rs_s);
  EXPECT_GE(rs_c, tcp_c + n) << "client: " << rs_c << " fds against " << tcp_c << " on TCP";
  EXPECT_GE(rs_s, tcp_s + n) << "server: " << rs_s << " fds against " << tcp_s << " on TCP";
  EXPECT_LE(rs_c, tcp_c + n + 4) << "client: " << rs_c << " fds against " << tcp_c << " on TCP";
  EXPECT_LE(rs_s, tcp_s + n + 4) << "server: " << rs_s << " fds against " << tcp_s << " on TCP";
}

// A closed fd leaves nothing in an epoll set, as on kernel TCP, where a
// registration goes with the socket's file. A pairing that ends on plain
// TCP (here the server has no librsock: peer_not_accelerated, a
// millisecond after the connect) hands the set's registration of the fd to
// the kernel under the fd's number, while its own dup of the socket lives
// on until the pairing's thread is done (held 100 ms here by the test knob
// RSOCK_TEST_HANDOVER_PAUSE_US). The client closes the fd 20 ms after its
// connect, inside that window and without EPOLL_CTL_DEL, as programs do;
// the server then writes a byte on its end, and the set, watched for 50
// ms, must report nothing (rs_stale). Before 2026-12-06 it reported the
// closed fd readable in 9 runs of 10. Three client processes, one
// connection each (the first failure puts the server in the negative
// cache of the process).
TEST_F(TcpFirstTest, AClosedFdLeavesNoRegistrationBehind) {
  expect_closed_fds_clean({"--close-after-ms", "20", "--watch-ms", "50"});
}

// The same for a registration the application makes after the pairing
// ended on plain TCP, straight in the kernel's set: it too must go with
// the close. Here the client adds the fd 20 ms after its connect, while
// the hand-over pauses (RSOCK_TEST_HANDOVER_PAUSE_US, 100 ms twice); the
// ADD waits for the fd's conversion and then goes to the kernel, and the
// close 20 ms later comes before the pairing's end. Until 2026-12-07 the
// pairing kept its dup of the socket until its job ended, and with it the
// registration: the set reported the closed fd (the server's byte, sent
// 30 ms after the accept) in every run here, and one run in 30 of the
// test above under UBSan, where the ADD came late by chance.
TEST_F(TcpFirstTest, ARegistrationMadeAfterTheHandOverGoesWithTheClose) {
  expect_closed_fds_clean({"--add-after-ms", "20", "--close-after-ms", "20", "--watch-ms", "50"});
}

// A pairing that ends on plain TCP (the server has no librsock:
// peer_not_accelerated) hands the set's member to the kernel under the
// application's registration. An epoll_wait that looked at its members
// (one ready: the server's byte, unread, level-triggered) and then at the
// kernel must not report the fd from both when the hand-over comes between
// the two looks: the pairing starts 30 ms after the connect, and each wait
// pauses 50 ms between them (the test knob RSOCK_TEST_EPOLL_PAUSE_US), so
// the hand-over falls inside a pause. Each answer must name the fd once
// (rs_stale --once). Before 2026-12-06 the first answer after the
// hand-over named it twice (connrate's epoll client closed the fd at the
// first and read a closed fd at the second; found under perf trace). Three
// client processes, one connection each (the negative cache).
TEST_F(TcpFirstTest, AHandOverToTheKernelIsNoSecondReport) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const int runs = 3;
  Env env = preloaded(tcp_first_env(port, "30"));
  env["RSOCK_TEST_EPOLL_PAUSE_US"] = "50000";
  std::vector<std::map<std::string, std::string>> results;
  stale_clients(port, runs, "0", env, {"--once", "1", "--watch-ms", "300"}, &results);
  if (HasFatalFailure()) return;
  for (auto& r : results) {
    EXPECT_EQ(r["once"], "1");
    EXPECT_GT(to_u64(r["answers"]), 1u) << "the fd was never reported";
  }
  // Each pairing ended on plain TCP while the client watched (the path
  // under test).
  const std::vector<Stats> all = stats();
  ASSERT_EQ(all.size(), static_cast<size_t>(runs));
  for (const Stats& st : all) {
    EXPECT_EQ(st.conn("tcp"), 1u);
    EXPECT_EQ(st.fallback("peer_not_accelerated"), 1u);
  }
}

// A close that ends what librsock takes for the socket's last holder skips
// the EPOLL_CTL_DEL (kernel TCP's close costs none either); a holder it
// does not see (a process started through system(), which keeps the fd)
// keeps that registration in the set, as on kernel TCP. Its reports must
// not reach the set's next member of the same number: the generation in
// their tag tells them apart (rs_stale --held). Without it, the byte that
// came on the closed connection was reported for the new one.
TEST_F(TcpFirstTest, ARegistrationHeldElsewhereNamesNoLaterFd) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  bool ready = false;
  Proc& server = start_server(
      "server", "rs_stale",
      {"--role", "server", "--port", std::to_string(port), "--held", "1", "--send-after-ms", "50"},
      Env{}, &ready);
  ASSERT_TRUE(ready) << server.describe();
  // Both connections stay on TCP (the pairing is a minute away): A's
  // stream uses the application's own number, whose close skips the DEL.
  Proc& client = spawn(
      "client", "rs_stale",
      {"--role", "client", "--port", std::to_string(port), "--held", "1", "--watch-ms", "400"},
      preloaded(tcp_first_env(port, "60000")));
  ASSERT_TRUE(wait_exit(client, 30000)) << "client hung";
  ASSERT_TRUE(client.exited_ok()) << client.describe();
  EXPECT_EQ(parse_result(client.out(), "RESULT")["clean"], "1");
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  ASSERT_TRUE(server.exited_ok()) << server.describe();
  // The program's own line (sh and sleep write theirs: no connections).
  uint64_t tcp = 0, early = 0;
  for (const Stats& st : stats()) {
    tcp += st.conn("tcp");
    early += st.fallback("closed_before_pairing");
  }
  EXPECT_EQ(tcp, 2u);
  EXPECT_EQ(early, 2u);
}

// 30 connections, each watched by the client with epoll_wait (EPOLLIN,
// level-triggered) and poll, timeout 0, for 30 ms from its connect on
// (rs_idle --watch-ms), while its pairing (no delay) switches it to the
// ring; the server writes nothing before the client does. The switch is no
// event: a look that met the old stream just as it was sealed for its
// successor took the sealed stream's "call again" for data, and one that
// met the peer's announcing doorbell on the socket after the peer's count
// took the doorbell for data (one of them made rs_sem epoll_lt's idle set
// report its connection in one CI run). Then 1,000 bytes echoed on each,
// checked, over shm.
TEST_F(TcpFirstTest, AConnectionsSwitchIsNoReadinessEvent) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const int n = 30;
  const Env env = preloaded(tcp_first_env(port, "0"));
  bool ready = false;
  Proc& server = start_server(
      "server", "rs_idle",
      {"--role", "server", "--port", std::to_string(port), "--connections", std::to_string(n)}, env,
      &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client = spawn("client", "rs_idle",
                       {"--role", "client", "--port", std::to_string(port), "--connections",
                        std::to_string(n), "--bytes", "1000", "--idle-ms", "0", "--watch-ms", "30"},
                       env);
  ASSERT_TRUE(wait_exit(client, 60000)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  ASSERT_TRUE(client.exited_ok()) << client.describe();
  ASSERT_TRUE(server.exited_ok()) << server.describe();
  auto r = parse_result(client.out(), "RESULT");
  EXPECT_EQ(r["bytes"], std::to_string(2 * 1000 * n));
  EXPECT_GT(to_u64(r["watches"]), static_cast<uint64_t>(n)) << "nothing was watched";
  auto cs = stats_of(client);
  auto ss = stats_of(server);
  ASSERT_TRUE(cs && ss);
  // Every connection switched (before the bursts, which the ring carried).
  expect_paths(*cs, n, 0, "client");
  expect_paths(*ss, n, 0, "server");
  EXPECT_EQ(cs->total_sent(), 2000u * n);
  EXPECT_GT(cs->bytes_sent, 0u);
}

// A socket made nonblocking before its connect, still on TCP (its pairing
// a minute away), whose O_NONBLOCK librsock reads only when a call would
// wait: a send with no reader fills the socket with partial counts, then
// EAGAIN, never a wait; a recv with nothing to read is EAGAIN; every byte
// arrives once the server reads (rs_sem nb_fill).
TEST_F(TcpFirstTest, ASocketNonblockingBeforeItsConnectNeverWaits) {
  sem_case_before_pairing("nb_fill", {"OK nb_fill_eagain", "OK nb_fill_arrived"});
}

// 500 connections from an event loop, 10 at a time, each answered by the
// server with a byte and closed at once, while the client waits for that
// byte and EOF; pairing at once (no delay). The server's application thus
// closes its fd while both sides pair. Two faults showed: a pairing that
// made its channel just after the close was dropped, its bytes on TCP
// uncounted, and the client, which had committed, read the answer as bytes
// past a count of 0 (a reset: "no answer and EOF", in most runs); and a
// server side that left mid-way looked like a pairing that timed out
// (pair_timeout), which put the server in the client's negative cache, so
// the connections after it stayed on TCP without trying (negative_cache:
// one run in two). Now such a connection is made and closed as the
// application's close would have closed it, and the server's FIN goes
// before its side of the pairing does, so the side that finds its peer
// gone finds the connection ended: every connection arrives whole, paired
// or counted as ended before its pairing, once, on both ends.
TEST_F(TcpFirstTest, AServerThatClosesWhileItsPeerPairsIsNoTimeout) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string n = "500";
  const Env env = preloaded(tcp_first_env(port, "0"));
  bool ready = false;
  Proc& server = start_server(
      "server", "rs_storm",
      {"--role", "server", "--port", std::to_string(port), "--connections", n, "--answer", "1"},
      env, &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client = spawn("client", "rs_storm",
                       {"--role", "client", "--port", std::to_string(port), "--connections", n,
                        "--burst", "10", "--answer", "1"},
                       env);
  ASSERT_TRUE(wait_exit(client, 120000)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  ASSERT_TRUE(client.exited_ok()) << client.describe();
  ASSERT_TRUE(server.exited_ok()) << server.describe();
  EXPECT_EQ(parse_result(client.out(), "RESULT")["connected"], n);
  auto cs = stats_of(client);
  auto ss = stats_of(server);
  ASSERT_TRUE(cs && ss);
  for (const Stats* s : {&*cs, &*ss}) {
    const std::string who = s == &*cs ? "client" : "server";
    EXPECT_EQ(s->conn("shm") + s->conn("tcp"), 500u) << who;
    // Each one on TCP ended before its pairing: no other reason.
    EXPECT_EQ(s->fallback("closed_before_pairing"), s->conn("tcp")) << who;
    EXPECT_EQ(s->fallback("pair_timeout"), 0u) << who;
    EXPECT_EQ(s->fallback("negative_cache"), 0u) << who;
  }
}

// The same server, and a client that drives one connection at a time from
// an epoll set as ab does (apr's pollset): the socket added for writing,
// deleted, its byte written, added for reading, deleted after the answer
// and EOF. A pairing that ended while the client read (the server's FIN
// was in: the connection stays on TCP) published its outcome before it
// had handed the set's registration to the kernel: the client's read then
// made the fd plain, and its DEL reached the kernel first (ENOENT), or,
// after a DEL that had parked the member, the conversion registered the
// deleted fd and the next ADD failed (EEXIST). ab aborts on either
// ("apr_pollset_remove(): Could not remove socket from pollset"): 6 runs
// of 6 failed before the fix.
TEST_F(TcpFirstTest, AnEventLoopThatDeletesItsSocketsAsAbDoesNeverFailsAnEpollCtl) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string n = "500";
  const Env env = preloaded(tcp_first_env(port, "0"));
  bool ready = false;
  Proc& server = start_server(
      "server", "rs_storm",
      {"--role", "server", "--port", std::to_string(port), "--connections", n, "--answer", "1"},
      env, &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client = spawn("client", "rs_storm",
                       {"--role", "client", "--port", std::to_string(port), "--connections", n,
                        "--answer", "1", "--epoll", "1"},
                       env);
  ASSERT_TRUE(wait_exit(client, 120000)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  ASSERT_TRUE(client.exited_ok()) << client.describe();
  ASSERT_TRUE(server.exited_ok()) << server.describe();
  EXPECT_EQ(parse_result(client.out(), "RESULT")["connected"], n);
  auto cs = stats_of(client);
  ASSERT_TRUE(cs);
  EXPECT_EQ(cs->conn("shm") + cs->conn("tcp"), 500u);
  EXPECT_EQ(cs->fallback("closed_before_pairing"), cs->conn("tcp"));
}

// connect() asked again once a nonblocking connect is done (APR's way, and
// so ab's) answers as the kernel's socket does, 0 or EISCONN, on a
// connection still on TCP (its pairing a minute away): librsock said
// EALREADY, and ab aborted after ten such connections (rs_sem
// nb_reconnect).
TEST_F(TcpFirstTest, AConnectAskedAgainFindsTheConnectionMade) {
  sem_case_before_pairing("nb_reconnect", {"OK nb_reconnect", "OK nb_data_both_ways"});
}

// SO_RCVTIMEO set before connect(), read by librsock at the first wait of
// a connection still on TCP: a recv with nothing to read gives EAGAIN after
// it (rs_sem timeo; an unknown timeout read as none hangs).
TEST_F(TcpFirstTest, ATimeoutSetBeforeItsConnectHolds) {
  sem_case_before_pairing("timeo", {"OK rcvtimeo_preset", "OK rcvtimeo_set"});
}

// The client's 1,000 bytes, written on TCP before the switch, wait unread
// on the server's socket while the server writes 16 MiB and the client
// reads only after 1.5 s: the server waits for ring space with a socket that
// stays readable (the peer's credit doorbells queue behind those bytes). It
// must sleep, not spin on the socket: its CPU time over the whole run stays
// below half the time it waited (a spin took all of it), and every byte
// arrives both ways. Under a sanitizer the wait is as many times longer as
// its code is slower (the 16 MiB cost a TSan server 786 ms of CPU in one
// CI run, past the fixed 750 ms bound of 2026-12-04).
TEST_F(TcpFirstTest, ASenderWaitingForSpaceBehindUnreadBytesSleeps) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const Env env = tcp_first_env(port, "0");
  const std::string big = std::to_string(16u << 20);
  const uint64_t wait_ms = 1500u * static_cast<uint64_t>(sanitizers().slowdown);
  bool ready = false;
  Proc& server =
      start_server("server", "rs_stream",
                   {"--role", "server", "--port", std::to_string(port), "--send", big, "--expect",
                    "1000", "--order", "send-first", "--tx-seed", "11", "--rx-seed", "22"},
                   preloaded(env), &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client = spawn("client", "rs_stream",
                       {"--role", "client", "--port", std::to_string(port), "--send", "1000",
                        "--expect", big, "--order", "send-first", "--read-after-ms",
                        std::to_string(wait_ms), "--tx-seed", "22", "--rx-seed", "11"},
                       preloaded(env));
  ASSERT_TRUE(wait_exit(client, 60000)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  ASSERT_TRUE(client.exited_ok()) << client.describe();
  ASSERT_TRUE(server.exited_ok()) << server.describe();
  auto c = parse_result(client.out());
  auto s = parse_result(server.out());
  ASSERT_FALSE(c.empty() || s.empty()) << "no RESULT line";
  EXPECT_EQ(to_u64(c["received"]), 16u << 20);
  EXPECT_EQ(to_u64(s["received"]), 1000u);
  EXPECT_EQ(c["rx_hash"], s["tx_hash"]);
  EXPECT_EQ(s["rx_hash"], c["tx_hash"]);
  EXPECT_LT(to_u64(s["cpu_ms"]), wait_ms / 2) << "the server spun while it waited for space";
  // The wait was on the ring: the connection paired.
  auto ss = stats_of(server);
  ASSERT_TRUE(ss);
  expect_paths(*ss, 1, 0, "server");
}

}  // namespace
}  // namespace rsock_test
