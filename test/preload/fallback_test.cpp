// Mixed deployments and configuration (DESIGN.md invariants 4 and 5): every
// combination of {client, server} x {preloaded, plain} x {rule matches, rule
// names another port} exchanges data correctly in both directions, and the
// stats of each preloaded process record the path it really took (shm only
// when both ends run librsock and the rule matches) and, where a rule
// matched but the stream fell back, the reason. Also: asymmetric rules,
// RSOCK_DISABLE=1 as a pure passthrough, an invalid RSOCK_RING_SIZE (one
// stderr line, plain TCP), and an IPv6 rule and connection on ::1.
#include "harness.h"

namespace rsock_test {
namespace {

constexpr uint64_t kBytes = 3u << 20;  // each way: more than a ring of any default size

class FallbackTest : public PreloadTest {
 protected:
  struct Side {
    bool preloaded = false;
    Env env;  // RSOCK_* settings (LD_PRELOAD and RSOCK_STATS are added for preloaded sides)
  };

  // Runs a checked duplex exchange of kBytes each way between a server and
  // a client, on addr:port.
  void exchange(const Side& server_side, const Side& client_side, int port,
                const std::string& addr = "127.0.0.1",
                const std::vector<std::string>& client_extra = {},
                const std::vector<std::string>& server_extra = {}, uint64_t bytes = kBytes) {
    const std::string n = std::to_string(bytes);
    auto args = [&](const char* role, const char* tx, const char* rx) {
      return std::vector<std::string>{
          "--role",    role, "--addr",     addr,    "--port",    std::to_string(port),
          "--send",    n,    "--expect",   n,       "--tx-seed", tx,
          "--rx-seed", rx,   "--read-api", "mixed", "--order",   "duplex"};
    };
    auto env_of = [&](const Side& side) {
      if (side.preloaded) return preloaded(side.env);
      Env e = side.env;  // a plain process gets the same settings, which nothing reads
      e["RSOCK_STATS"] = stats_path();
      return e;
    };
    bool ready = false;
    std::vector<std::string> server_args = args("server", "7", "8");
    server_args.insert(server_args.end(), server_extra.begin(), server_extra.end());
    server_ = &start_server("server", "rs_stream", server_args, env_of(server_side), &ready);
    ASSERT_TRUE(ready) << "server: see its output below";
    std::vector<std::string> client_args = args("client", "8", "7");
    client_args.insert(client_args.end(), client_extra.begin(), client_extra.end());
    client_ = &spawn("client", "rs_stream", client_args, env_of(client_side));
    ASSERT_TRUE(wait_exit(*client_, kExitTimeoutMs)) << "client hung";
    ASSERT_TRUE(wait_exit(*server_, kExitTimeoutMs)) << "server hung";
    ASSERT_TRUE(client_->exited_ok()) << "client: see its output below";
    ASSERT_TRUE(server_->exited_ok()) << "server: see its output below";
    auto c = parse_result(client_->out());
    auto s = parse_result(server_->out());
    EXPECT_EQ(to_u64(c["sent"]), bytes);
    EXPECT_EQ(to_u64(c["received"]), bytes);
    EXPECT_EQ(to_u64(s["sent"]), bytes);
    EXPECT_EQ(to_u64(s["received"]), bytes);
    EXPECT_EQ(c["tx_hash"], s["rx_hash"]);
    EXPECT_EQ(s["tx_hash"], c["rx_hash"]);
  }

  // p's stats: the path taken, the fallbacks recorded, and bytes counted
  // only for an accelerated stream.
  void expect_stats(const Proc& p, bool shm, const std::map<std::string, uint64_t>& fallbacks) {
    auto st = stats_of(p);
    ASSERT_TRUE(st);
    expect_paths(*st, shm ? 1 : 0, shm ? 0 : 1, p.name);
    expect_fallbacks(*st, fallbacks, p.name);
    EXPECT_EQ(st->total_sent(), shm ? kBytes : 0) << p.name;
    EXPECT_EQ(st->total_received(), shm ? kBytes : 0) << p.name;
  }

  Proc* server_ = nullptr;
  Proc* client_ = nullptr;
};

struct MatrixCase {
  bool client_preloaded;
  bool server_preloaded;
  bool rule_matches;
};

class FallbackMatrix : public FallbackTest, public ::testing::WithParamInterface<MatrixCase> {};

TEST_P(FallbackMatrix, ExchangesDataAndRecordsPath) {
  const MatrixCase m = GetParam();
  const int port = free_port();
  const int other = free_port_besides(port);  // the same number would match the rule
  ASSERT_GT(port, 0);
  ASSERT_GT(other, 0);
  // "Not configured": a rule exists but names another port.
  const Env rules = {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(m.rule_matches ? port : other)}};
  exchange({m.server_preloaded, rules}, {m.client_preloaded, rules}, port);
  if (HasFatalFailure()) return;

  const bool shm = m.client_preloaded && m.server_preloaded && m.rule_matches;
  const size_t preloaded = (m.client_preloaded ? 1 : 0) + (m.server_preloaded ? 1 : 0);
  EXPECT_EQ(stats().size(), preloaded) << "one stats line per preloaded process, none otherwise";
  // A rule matched but the peer has no librsock: that side records why.
  const std::map<std::string, uint64_t> none, not_accel = {{"peer_not_accelerated", 1}};
  if (m.client_preloaded)
    expect_stats(*client_, shm, m.rule_matches && !m.server_preloaded ? not_accel : none);
  if (m.server_preloaded)
    expect_stats(*server_, shm, m.rule_matches && !m.client_preloaded ? not_accel : none);
}

INSTANTIATE_TEST_SUITE_P(
    AllEight, FallbackMatrix,
    ::testing::Values(MatrixCase{true, true, true}, MatrixCase{true, true, false},
                      MatrixCase{true, false, true}, MatrixCase{true, false, false},
                      MatrixCase{false, true, true}, MatrixCase{false, true, false},
                      MatrixCase{false, false, true}, MatrixCase{false, false, false}),
    [](const auto& info) {
      const MatrixCase& m = info.param;
      return std::string(m.client_preloaded ? "RsockClient" : "PlainClient") +
             (m.server_preloaded ? "RsockServer" : "PlainServer") +
             (m.rule_matches ? "RuleMatches" : "OtherRule");
    });

// A nonblocking connect that fell back (the server has no librsock) is a
// plain socket; connect() asked again once it is done (APR's way, rs_sem
// nb_reconnect) is the kernel's answer, not a second connection: librsock
// counted it again, with a second fallback, and would have begun a pairing
// on the connected socket.
TEST_F(FallbackTest, AConnectAskedAgainAfterAFallbackCountsOnce) {
  const int port = free_port();
  const int port2 = free_port_besides(port);
  ASSERT_GT(port, 0);
  ASSERT_GT(port2, 0);
  const RoleArgs args = two_port_args(port, port2, {"--case", "nb_reconnect"});
  bool ready = false;
  Proc& server = start_server("server", "rs_sem", args.server, {}, &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client = spawn("client", "rs_sem", args.client,
                       preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}}));
  ASSERT_TRUE(wait_exit(client, kExitTimeoutMs)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  ASSERT_TRUE(client.exited_ok()) << client.describe();
  ASSERT_TRUE(server.exited_ok()) << server.describe();
  EXPECT_NE(client.out().find("OK nb_reconnect"), std::string::npos) << client.out();
  auto cs = stats_of(client);
  ASSERT_TRUE(cs);
  // The connection under test and the control connection, once each.
  expect_paths(*cs, 0, 2, "client");
  expect_fallbacks(*cs, {{"peer_not_accelerated", 1}}, "client");
}

// Only the client has a rule; the server runs librsock without one, so it
// does not advertise: the client falls back, the server just counts TCP.
TEST_F(FallbackTest, RuleOnClientOnly) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  exchange({true, {}}, {true, {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}}}, port);
  if (HasFatalFailure()) return;
  expect_stats(*client_, false, {{"peer_not_accelerated", 1}});
  expect_stats(*server_, false, {});
}

// Ends of different pairing modes (RSOCK_TCP_FIRST=0 on one, the default
// on the other): the stream is intact both ways, and each end says which
// path it took. An eager client has its rendezvous ready when the server's
// delayed pairing looks for it, so the two pair (the server's end switches
// from TCP as between two default ends). An eager server looks at accept()
// and finds no rendezvous (peer_not_accelerated); the client, whose calls
// go on over TCP meanwhile, learns it from the server's FIN, or at its
// deadline (pair_timeout, and the server goes into its negative cache), or
// its connection ended before its pairing began.
class ModesDiffer : public FallbackTest, public ::testing::WithParamInterface<bool> {};

TEST_P(ModesDiffer, TheStreamIsIntact) {
  const bool eager_server = GetParam();
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string rule = "127.0.0.1:" + std::to_string(port);
  Env eager = {{"RSOCK_PEERS", rule}, {"RSOCK_TCP_FIRST", "0"}};
  Env tcp_first = {{"RSOCK_PEERS", rule}, {"RSOCK_TCP_FIRST", "1"}};
  exchange({true, eager_server ? eager : tcp_first}, {true, eager_server ? tcp_first : eager},
           port);
  if (HasFatalFailure()) return;
  if (!eager_server) {
    expect_stats(*client_, true, {});
    expect_stats(*server_, true, {});
    return;
  }
  expect_stats(*server_, false, {{"peer_not_accelerated", 1}});
  auto cs = stats_of(*client_);
  ASSERT_TRUE(cs);
  expect_paths(*cs, 0, 1, "client");
  EXPECT_EQ(cs->total_fallbacks(), 1u);
  EXPECT_EQ(cs->fallback("peer_not_accelerated") + cs->fallback("pair_timeout") +
                cs->fallback("closed_before_pairing"),
            1u)
      << "client";
}

INSTANTIATE_TEST_SUITE_P(Fallback, ModesDiffer, ::testing::Bool(), [](const auto& info) {
  return std::string(info.param ? "EagerServer" : "EagerClient");
});

// Only the server has a rule; the client runs librsock without one and
// connects plainly: the server finds no rendezvous and records why.
TEST_F(FallbackTest, RuleOnServerOnly) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  exchange({true, {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}}}, {true, {}}, port);
  if (HasFatalFailure()) return;
  expect_stats(*client_, false, {});
  expect_stats(*server_, false, {{"peer_not_accelerated", 1}});
}

// A rule file forcing RDMA on a host without an RDMA device: both ends
// stay on TCP at once and say why (issue 3: "no device gives plain TCP with
// a reason in the stats").
TEST_F(FallbackTest, ForcedRdmaWithoutDeviceFallsBack) {
  DIR* ib = opendir("/sys/class/infiniband");
  bool has_device = false;
  if (ib) {
    while (dirent* e = readdir(ib)) has_device |= e->d_name[0] != '.';
    closedir(ib);
  }
  if (has_device) GTEST_SKIP() << "this host has an RDMA device";
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string conf = dir() + "/rdma.conf";
  {
    FILE* f = fopen(conf.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fprintf(f, "# every stream to this port must use RDMA\nrule rdma any 127.0.0.1:%d\n", port);
    fclose(f);
  }
  const Env env = {{"RSOCK_CONF", conf}};
  exchange({true, env}, {true, env}, port);
  if (HasFatalFailure()) return;
  expect_stats(*client_, false, {{"no_rdma_device", 1}});
  expect_stats(*server_, false, {{"no_rdma_device", 1}});
}

// RSOCK_DISABLE=1 turns the shim into a no-op: data flows, nothing is
// written to the stats file, nothing to stderr.
TEST_F(FallbackTest, DisableIsPurePassthrough) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const Env env = {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}, {"RSOCK_DISABLE", "1"}};
  exchange({true, env}, {true, env}, port);
  if (HasFatalFailure()) return;
  EXPECT_FALSE(file_exists(stats_path()) && !read_file(stats_path()).empty())
      << "stats written while disabled: " << read_file(stats_path());
  EXPECT_EQ(client_->err(), "");
  EXPECT_EQ(server_->err(), "");
}

// An invalid RSOCK_RING_SIZE: exactly one stderr line naming the variable,
// and the program runs on plain TCP.
class BadRingSize : public FallbackTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(BadRingSize, OneStderrLineAndPlainTcp) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const Env env = {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)},
                   {"RSOCK_RING_SIZE", GetParam()}};
  exchange({true, env}, {true, env}, port);
  if (HasFatalFailure()) return;
  for (Proc* p : {client_, server_}) {
    auto lines = split_lines(p->err());
    ASSERT_EQ(lines.size(), 1u) << p->name << " stderr:\n" << p->err();
    EXPECT_NE(lines[0].find("RSOCK_RING_SIZE"), std::string::npos) << lines[0];
    EXPECT_NE(lines[0].find(GetParam()), std::string::npos) << "the line quotes the bad value";
    expect_stats(*p, false, {});
  }
}

INSTANTIATE_TEST_SUITE_P(Values, BadRingSize, ::testing::Values("3K", "banana"),
                         [](const auto& info) { return std::string(info.param); });

// An IPv6 rule and an IPv6 connection on ::1 are accelerated.
TEST_F(FallbackTest, Ipv6LoopbackAccelerated) {
  const int port = free_port("::1");
  if (port <= 0) GTEST_SKIP() << "no IPv6 loopback on this machine";
  const Env env = {{"RSOCK_PEERS", "[::1]:" + std::to_string(port)}};
  exchange({true, env}, {true, env}, port, "::1");
  if (HasFatalFailure()) return;
  expect_stats(*client_, true, {});
  expect_stats(*server_, true, {});
}

// An MPTCP client (socket(..., IPPROTO_MPTCP), as mptcpize makes of every
// TCP socket) to a candidate peer: its stream is a byte stream like TCP's,
// and is carried as one (connect() asks TCP_INFO only, which MPTCP answers).
// The server's listener is plain TCP, so the kernel connection falls back
// to TCP under MPTCP too.
TEST_F(FallbackTest, MptcpClientIsCarriedAsTcp) {
  constexpr int kMptcp = 262;  // IPPROTO_MPTCP, not in every libc's headers
  const int probe = socket(AF_INET, SOCK_STREAM, kMptcp);
  if (probe < 0) GTEST_SKIP() << "no MPTCP in this kernel: " << strerror(errno);
  close(probe);
  const int port = free_port();
  ASSERT_GT(port, 0);
  const Env env = {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}};
  exchange({true, env}, {true, env}, port, "127.0.0.1", {"--protocol", std::to_string(kMptcp)});
  if (HasFatalFailure()) return;
  expect_stats(*client_, true, {});
  expect_stats(*server_, true, {});
}

// The default mode: a client that has filled its socket by its pairing's
// first look (200 ms after connect(); 32 MiB, more than the kernel buffers
// of both ends hold, and its server reads only 1.5 s later) still pairs.
// The pairing took POLLOUT for the end of the TCP handshake, which a full
// socket never gave before the connect timeout (1 s): pair_timeout, and
// TCP for good.
TEST_F(FallbackTest, DefaultModeClientThatFillsItsSocketStillPairs) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const Env env = {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)},
                   {"RSOCK_TCP_FIRST", "1"},
                   {"RSOCK_PAIR_DELAY_MS", "200"}};
  exchange({true, env}, {true, env}, port, "127.0.0.1", {}, {"--read-after-ms", "1500"}, 32u << 20);
  if (HasFatalFailure()) return;
  for (const Proc* p : {client_, server_}) {
    auto st = stats_of(*p);
    ASSERT_TRUE(st);
    expect_paths(*st, 1, 0, p->name);
    expect_fallbacks(*st, {}, p->name);
  }
}

// An IPv4 rule does not match an IPv6 connection to the same port.
TEST_F(FallbackTest, Ipv4RuleDoesNotMatchIpv6) {
  const int port = free_port("::1");
  if (port <= 0) GTEST_SKIP() << "no IPv6 loopback on this machine";
  const Env env = {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}};
  exchange({true, env}, {true, env}, port, "::1");
  if (HasFatalFailure()) return;
  expect_stats(*client_, false, {});
  expect_stats(*server_, false, {});
}

}  // namespace
}  // namespace rsock_test
