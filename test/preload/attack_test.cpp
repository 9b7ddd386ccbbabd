// Attacks on same-host pairing by another local user (docs/security.md).
// Victims run as root with librsock preloaded (build/progs/rs_echo); the
// attacker (build/progs/rs_attack, not preloaded) runs as `nobody`, or as
// root where the case is about a process of the victim's own user. Each
// case checks three things: the victims' bytes arrive intact, the stats of
// both victims say what happened (accelerated, or on TCP with an honest
// reason, and the intruders counted as rejected), and the attacker
// received nothing it could use (no byte, no descriptor that allows I/O or
// a mapping). The cases need root (to run the attacker as another user);
// without it they are skipped, loudly. The attacks on the rendezvous run in
// both pairing modes (AttackModes): eager, and the default one with its
// pairing begun at once (RSOCK_PAIR_DELAY_MS=0), so that it begins before
// the victims' exchange, whose last call, a shutdown, would otherwise keep
// the connection on TCP before any rendezvous existed.
#include <sys/stat.h>

#include "harness.h"

namespace rsock_test {
namespace {

constexpr int kNobody = 65534;
// The v4-mapped form of 127.0.0.1 that pairing names use (docs/protocol.md).
constexpr const char* kLoopbackHex = "00000000000000000000ffff7f000001";

std::string client_name(int server_port, int client_port) {
  return "rsock/C/" + std::string(kLoopbackHex) + "/" + std::to_string(server_port) + "/" +
         std::to_string(client_port);
}

class AttackTest : public PreloadTest {
 protected:
  void SetUp() override {
    PreloadTest::SetUp();
    if (geteuid() != 0) GTEST_SKIP() << "needs root: the attacker runs as another user";
    // A directory the attacker's user can reach: the attacker binary and the
    // stop file live there (the test's scratch directory is private).
    char tmpl[] = "/tmp/rsock-attack-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    pub_ = tmpl;
    ASSERT_EQ(chmod(pub_.c_str(), 0755), 0);
    attacker_ = pub_ + "/rs_attack";
    const std::string bin = read_file(progs() + "/rs_attack");
    ASSERT_FALSE(bin.empty());
    {
      std::ofstream out(attacker_, std::ios::binary);
      out << bin;
    }
    ASSERT_EQ(chmod(attacker_.c_str(), 0755), 0);
    stop_ = pub_ + "/stop";
    gate_ = dir() + "/gate";
    port_ = free_port();
    ASSERT_GT(port_, 0);
  }
  void TearDown() override {
    if (!pub_.empty()) {
      touch(stop_);
      remove_tree(pub_);
    }
    PreloadTest::TearDown();
  }

  static void touch(const std::string& path) {
    std::ofstream out(path);
    out << "1\n";
  }

  Env victim(Env extra = {}) {
    extra["RSOCK_PEERS"] = "127.0.0.1:" + std::to_string(port_);
    if (default_mode_) {
      extra["RSOCK_TCP_FIRST"] = "1";
      extra["RSOCK_PAIR_DELAY_MS"] = "0";
    }
    return preloaded(extra);
  }

  // A victim client's arguments. In the default mode the client holds its
  // connection open and idle for a while after connect(): its pairing and
  // the server's begin at once and are decided meanwhile (a rejection, a
  // timeout), where a short exchange would otherwise end on TCP first under
  // a slow build (closed_before_pairing) and the attack would meet nobody.
  std::vector<std::string> client_args(std::vector<std::string> args) const {
    if (default_mode_) {
      args.push_back("--hold-ms");
      args.push_back(std::to_string(kHoldMs));
    }
    return args;
  }
  static constexpr int kHoldMs = 2000;  // RSOCK_CONNECT_TIMEOUT_MS below is 300

  // Stops the attacker and returns its RESULT line.
  std::map<std::string, std::string> stop_attacker(Proc& a) {
    touch(stop_);
    EXPECT_TRUE(wait_exit(a, kExitTimeoutMs)) << "attacker did not stop";
    auto r = parse_result(a.out());
    EXPECT_FALSE(r.empty()) << a.describe();
    return r;
  }

  // Nothing the attacker received can be used.
  static void expect_nothing_usable(const std::map<std::string, std::string>& r) {
    EXPECT_EQ(r.at("fd_io_ok"), "0") << "a descriptor we sent allows I/O";
    EXPECT_EQ(r.at("fd_mappable"), "0") << "a descriptor we sent allows a mapping";
  }

  std::string pub_, attacker_, stop_, gate_;
  int port_ = 0;
  bool default_mode_ = false;  // RSOCK_TCP_FIRST=1 (pairing at once), else eager
};

// GetParam(): the victims run in the default mode, else with eager pairing.
class AttackModes : public AttackTest, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    default_mode_ = GetParam();
    AttackTest::SetUp();
  }
};

// Another user connects to every client rendezvous it sees, floods it with
// silent connections and sends forged hellos whose proof names a TCP socket
// of its own, while the real server is late (it accepts only once the
// attack is under way). The client answers nobody but the real server:
// the connection is accelerated, the intruders are counted, and they
// received nothing.
TEST_P(AttackModes, ForeignUserCannotHijackTheClientRendezvous) {
  bool ready = false;
  Proc& server = start_server("server", "rs_echo",
                              {"--role", "server", "--port", std::to_string(port_), "--gate", gate_},
                              victim(), &ready);
  ASSERT_TRUE(ready) << server.describe();
  // (Only this server's clients: other tests may be pairing meanwhile.)
  const std::string prefix = "rsock/C/" + std::string(kLoopbackHex) + "/" + std::to_string(port_) + "/";
  Proc& attacker = spawn("attacker", attacker_,
                         {"hijack", "--prefix", prefix, "--stop", stop_, "--silent", "20"}, {},
                         kNobody);
  // (In the default mode the client holds its connection idle first: a
  // writer that sent its 1 MB and shut its side down before the pairing's
  // first look made the connection plain TCP, with no rendezvous to attack,
  // 1 run in 10 under load.)
  Proc& client = spawn(
      "client", "rs_echo",
      client_args({"--role", "client", "--port", std::to_string(port_), "--bytes", "1000000"}),
      victim({{"RSOCK_CONNECT_TIMEOUT_MS", "20000"}}));
  ASSERT_TRUE(wait_line(attacker, "ATTACKED", kReadyTimeoutMs)) << attacker.describe();
  touch(gate_);  // now the server accepts and pairs
  ASSERT_TRUE(wait_exit(client, kExitTimeoutMs)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  EXPECT_TRUE(client.exited_ok()) << client.describe();
  EXPECT_TRUE(server.exited_ok()) << server.describe();
  auto r = stop_attacker(attacker);
  EXPECT_EQ(r["received_bytes"], "0");
  EXPECT_EQ(r["received_fds"], "0");
  EXPECT_GE(to_u64(r["forged"]), 1u) << "the attack did not happen";

  auto cs = stats_of(client);
  auto ss = stats_of(server);
  ASSERT_TRUE(cs && ss);
  expect_paths(*cs, 1, 0, "client");
  expect_paths(*ss, 1, 0, "server");
  expect_fallbacks(*cs, {}, "client");
  expect_fallbacks(*ss, {}, "server");
  EXPECT_GE(cs->rejects("unproven"), 1u) << "the forged hellos were not counted";
  EXPECT_LE(cs->rejects("unproven"), to_u64(r["connects"]));
  EXPECT_EQ(cs->total_sent(), 1000000u);
  EXPECT_EQ(cs->total_received(), 1000000u);
}

// Another user binds the name a client's pairing needs before the client
// does. The client stays on TCP (rendezvous_taken); the server, finding the
// name held by another user than the one who owns the client's socket,
// sends nothing and stays on TCP (peer_unproven, one rejection). The
// squatter receives nothing.
TEST_P(AttackModes, ForeignUserSquattingTheClientNameGetsNothing) {
  const int cport = free_port();
  ASSERT_GT(cport, 0);
  Proc& attacker = spawn("attacker", attacker_,
                         {"squat", "--name", client_name(port_, cport), "--stop", stop_}, {},
                         kNobody);
  ASSERT_TRUE(wait_line(attacker, "READY", kReadyTimeoutMs)) << attacker.describe();
  bool ready = false;
  Proc& server =
      start_server("server", "rs_echo", {"--role", "server", "--port", std::to_string(port_)},
                   victim({{"RSOCK_LOG_LEVEL", "info"}}), &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client = spawn("client", "rs_echo",
                       client_args({"--role", "client", "--port", std::to_string(port_),
                                    "--bind-port", std::to_string(cport), "--bytes", "300000"}),
                       victim());
  ASSERT_TRUE(wait_exit(client, kExitTimeoutMs)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  EXPECT_TRUE(client.exited_ok()) << client.describe();
  EXPECT_TRUE(server.exited_ok()) << server.describe();
  auto r = stop_attacker(attacker);
  EXPECT_EQ(r["received_bytes"], "0");
  EXPECT_EQ(r["received_fds"], "0");

  auto cs = stats_of(client);
  auto ss = stats_of(server);
  ASSERT_TRUE(cs && ss);
  expect_paths(*cs, 0, 1, "client");
  expect_paths(*ss, 0, 1, "server");
  expect_fallbacks(*cs, {{"rendezvous_taken", 1}}, "client");
  expect_fallbacks(*ss, {{"peer_unproven", 1}}, "server");
  EXPECT_EQ(ss->rejects("unproven"), 1u);
  // The log names both by the codes the stats use.
  const std::string log = server.err();
  EXPECT_NE(log.find("(rejected: unproven)"), std::string::npos) << log;
  EXPECT_NE(log.find("plain TCP (peer_unproven)"), std::string::npos) << log;
}

// A process of the client's own user squats the name of a plain client's
// connection and stalls the server's pairing (it never answers). accept()
// must not wait for it: a second, accelerated client is accepted, paired
// and served while the stall goes on. The squatter receives the server's
// hello and its proof, a descriptor that allows no I/O and no mapping.
TEST_F(AttackTest, StalledPairingDoesNotHoldUpAccept) {
  const int cport = free_port();
  ASSERT_GT(cport, 0);
  Proc& attacker =
      spawn("attacker", attacker_, {"squat", "--name", client_name(port_, cport), "--stop", stop_},
            {}, /*as_user=*/0);
  ASSERT_TRUE(wait_line(attacker, "READY", kReadyTimeoutMs)) << attacker.describe();
  bool ready = false;
  Proc& server = start_server(
      "server", "rs_echo", {"--role", "server", "--port", std::to_string(port_), "--connections", "2"},
      victim({{"RSOCK_CONNECT_TIMEOUT_MS", "60000"}}), &ready);
  ASSERT_TRUE(ready) << server.describe();
  // A plain client (no librsock) from the squatted port: its pairing stalls.
  Proc& plain = spawn("plain-client", "rs_echo",
                      {"--role", "client", "--port", std::to_string(port_), "--bind-port",
                       std::to_string(cport), "--bytes", "100000"},
                      {});
  ASSERT_TRUE(wait_line(server, "ACCEPTED 1", kReadyTimeoutMs)) << server.describe();
  Proc& fast = spawn("client", "rs_echo",
                     {"--role", "client", "--port", std::to_string(port_), "--bytes", "100000",
                      "--seed", "9"},
                     victim());
  // The second client finishes while the first pairing is still stalled
  // (the squatter runs until we stop it; the pairing's timeout is 60 s).
  ASSERT_TRUE(wait_exit(fast, kExitTimeoutMs)) << "accept() was held up by the stalled pairing";
  EXPECT_TRUE(fast.exited_ok()) << fast.describe();
  EXPECT_FALSE(attacker.reaped);
  auto r = stop_attacker(attacker);  // the stall ends: the first stream goes on, on TCP
  ASSERT_TRUE(wait_exit(plain, kExitTimeoutMs)) << "plain client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  EXPECT_TRUE(plain.exited_ok()) << plain.describe();
  EXPECT_TRUE(server.exited_ok()) << server.describe();
  EXPECT_EQ(r["received_fds"], "1") << "the squatter should get the server's proof, no more";
  EXPECT_EQ(r["fd_sockets"], "1");
  expect_nothing_usable(r);

  auto fs = stats_of(fast);
  auto ss = stats_of(server);
  ASSERT_TRUE(fs && ss);
  expect_paths(*fs, 1, 0, "client");
  expect_paths(*ss, 1, 1, "server");
  // The stall ends when the squatter leaves the handshake, which the server
  // cannot tell from a client that ran out of time and left (pair_timeout,
  // docs/protocol.md section 2, reasons).
  expect_fallbacks(*ss, {{"pair_timeout", 1}}, "server");
}

// Another user binds a server's advertisement name where a plain server
// listens. A librsock client believes it, waits for a pairing that never
// comes (its timeout, once: then the negative cache) and goes on over TCP.
// Nothing reaches the squatter.
TEST_P(AttackModes, ForeignUserFakingAServerCostsOneTimeout) {
  Proc& attacker = spawn("attacker", attacker_,
                         {"squat", "--dgram", "--name",
                          "rsock/L/" + std::string(kLoopbackHex) + "/" + std::to_string(port_),
                          "--stop", stop_},
                         {}, kNobody);
  ASSERT_TRUE(wait_line(attacker, "READY", kReadyTimeoutMs)) << attacker.describe();
  bool ready = false;
  Proc& server = start_server("server", "rs_echo",
                              {"--role", "server", "--port", std::to_string(port_)}, {}, &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client =
      spawn("client", "rs_echo",
            client_args({"--role", "client", "--port", std::to_string(port_), "--bytes", "100000"}),
            victim({{"RSOCK_CONNECT_TIMEOUT_MS", "300"}}));
  ASSERT_TRUE(wait_exit(client, kExitTimeoutMs)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  EXPECT_TRUE(client.exited_ok()) << client.describe();
  auto r = stop_attacker(attacker);
  EXPECT_EQ(r["received_bytes"], "0");
  EXPECT_EQ(r["received_fds"], "0");
  auto cs = stats_of(client);
  ASSERT_TRUE(cs);
  expect_paths(*cs, 0, 1, "client");
  expect_fallbacks(*cs, {{"pair_timeout", 1}}, "client");
}

INSTANTIATE_TEST_SUITE_P(Attack, AttackModes, ::testing::Bool(), [](const auto& info) {
  return std::string(info.param ? "DefaultMode" : "Eager");
});

}  // namespace
}  // namespace rsock_test
