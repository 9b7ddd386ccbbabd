// Protocol orderings over accelerated streams (DESIGN.md invariant 3) and
// bounded failure when a peer goes away (invariant 5): server-speaks-first,
// client-speaks-first, both writing before reading, half-close with a reply
// read to EOF, close with unread data (the writer's later writes fail with
// EPIPE), and a peer killed with SIGKILL while the other end reads, writes,
// or is blocked. Every exchange is checked byte by byte and by hash, and the
// stats must show that the stream really was on shared memory.
#include "harness.h"

namespace rsock_test {
namespace {

constexpr int kPeerGoneMs = 15000;  // bound on noticing a dead or closed peer

class OrderingTest : public PreloadTest {
 protected:
  void SetUp() override {
    PreloadTest::SetUp();
    port_ = free_port();
    ASSERT_GT(port_, 0);
    env_ = preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port_)}});
  }

  std::vector<std::string> args(const char* role, std::vector<std::string> extra) const {
    std::vector<std::string> a = {"--role", role, "--port", std::to_string(port_)};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }

  // Runs a server and a client to completion; both must succeed.
  void run_both(const std::vector<std::string>& server_args,
                const std::vector<std::string>& client_args) {
    bool ready = false;
    server_ = &start_server("server", "rs_stream", args("server", server_args), env_, &ready);
    ASSERT_TRUE(ready) << "server: see its output below";
    client_ = &spawn("client", "rs_stream", args("client", client_args), env_);
    ASSERT_TRUE(wait_exit(*client_, kExitTimeoutMs)) << "client hung";
    ASSERT_TRUE(wait_exit(*server_, kExitTimeoutMs)) << "server hung";
    ASSERT_TRUE(client_->exited_ok()) << "client: see its output below";
    ASSERT_TRUE(server_->exited_ok()) << "server: see its output below";
  }

  // Both ends moved exactly these byte counts, with matching hashes, on shm.
  void expect_exchange(uint64_t client_to_server, uint64_t server_to_client) {
    auto c = parse_result(client_->out());
    auto s = parse_result(server_->out());
    EXPECT_EQ(to_u64(c["sent"]), client_to_server);
    EXPECT_EQ(to_u64(s["received"]), client_to_server);
    EXPECT_EQ(to_u64(s["sent"]), server_to_client);
    EXPECT_EQ(to_u64(c["received"]), server_to_client);
    EXPECT_EQ(c["tx_hash"], s["rx_hash"]);
    EXPECT_EQ(s["tx_hash"], c["rx_hash"]);
    expect_shm_bytes(*client_, client_to_server, server_to_client);
    expect_shm_bytes(*server_, server_to_client, client_to_server);
  }

  void expect_shm_bytes(const Proc& p, uint64_t sent, uint64_t received) {
    auto st = stats_of(p);
    ASSERT_TRUE(st);
    expect_paths(*st, 1, 0, p.name);
    expect_fallbacks(*st, {}, p.name);
    EXPECT_EQ(st->total_sent(), sent) << p.name;
    EXPECT_EQ(st->total_received(), received) << p.name;
  }

  int port_ = 0;
  Env env_;
  Proc* server_ = nullptr;
  Proc* client_ = nullptr;
};

class OrderingSizes : public OrderingTest, public ::testing::WithParamInterface<uint64_t> {};

TEST_P(OrderingSizes, ServerSpeaksFirst) {
  const uint64_t n = GetParam(), m = GetParam() / 2 + 3;
  // The server writes first and then expects the client's bytes and EOF.
  run_both({"--order", "send-first", "--send", std::to_string(n), "--expect", std::to_string(m),
            "--expect-eof", "--tx-seed", "11", "--rx-seed", "12"},
           {"--order", "recv-first", "--expect", std::to_string(n), "--send", std::to_string(m),
            "--tx-seed", "12", "--rx-seed", "11"});
  expect_exchange(m, n);
}

TEST_P(OrderingSizes, ClientSpeaksFirst) {
  const uint64_t n = GetParam(), m = GetParam() / 2 + 3;
  run_both({"--order", "recv-first", "--expect", std::to_string(n), "--send", std::to_string(m),
            "--tx-seed", "21", "--rx-seed", "22"},
           {"--order", "send-first", "--send", std::to_string(n), "--expect", std::to_string(m),
            "--expect-eof", "--tx-seed", "22", "--rx-seed", "21"});
  expect_exchange(n, m);
}

// Half-close: the client sends, shuts down its sending side, and still reads
// the server's whole reply up to EOF. The server sees EOF exactly after the
// client's bytes, and only then replies.
TEST_P(OrderingSizes, HalfCloseThenReadReplyToEof) {
  const uint64_t n = GetParam(), m = GetParam() + 5;
  run_both({"--order", "recv-first", "--expect", std::to_string(n), "--expect-eof", "--send",
            std::to_string(m), "--tx-seed", "31", "--rx-seed", "32"},
           {"--order", "send-first", "--send", std::to_string(n), "--shut-wr", "--expect",
            std::to_string(m), "--expect-eof", "--tx-seed", "32", "--rx-seed", "31"});
  expect_exchange(n, m);
}

INSTANTIATE_TEST_SUITE_P(Sizes, OrderingSizes, ::testing::Values(16, 3u << 20),
                         [](const auto& info) { return "Bytes" + std::to_string(info.param); });

// Both ends write before either reads (sizes every buffer can hold).
TEST_F(OrderingTest, BothWriteBeforeReading) {
  run_both({"--order", "send-first", "--send", "32768", "--expect", "30000", "--expect-eof",
            "--tx-seed", "41", "--rx-seed", "42"},
           {"--order", "send-first", "--send", "30000", "--expect", "32768", "--tx-seed", "42",
            "--rx-seed", "41"});
  expect_exchange(30000, 32768);
}

// Both ends write at once while reading (threads), more than a ring's worth.
TEST_F(OrderingTest, BothWriteAtOnce) {
  const std::string n = std::to_string(8u << 20);
  run_both({"--order", "duplex", "--send", n, "--expect", n, "--tx-seed", "51", "--rx-seed", "52"},
           {"--order", "duplex", "--send", n, "--expect", n, "--tx-seed", "52", "--rx-seed", "51"});
  expect_exchange(8u << 20, 8u << 20);
}

// Close with unread data: the server reads `unread_after` bytes and closes
// while the client keeps writing; the client's writes must fail (EPIPE,
// possibly after one ECONNRESET as on Linux TCP) within a bounded time.
class CloseUnread : public OrderingTest, public ::testing::WithParamInterface<uint64_t> {};

TEST_P(CloseUnread, WriterGetsEpipe) {
  const uint64_t read_first = GetParam();
  bool ready = false;
  server_ = &start_server(
      "server", "rs_stream",
      args("server", {"--expect", std::to_string(read_first), "--rx-seed", "61"}), env_, &ready);
  ASSERT_TRUE(ready) << "server: see its output below";
  client_ =
      &spawn("client", "rs_stream", args("client", {"--send", "-1", "--tx-seed", "61"}), env_);
  ASSERT_TRUE(wait_exit(*server_, kExitTimeoutMs)) << "server hung";
  ASSERT_TRUE(server_->exited_ok()) << "server: see its output below";
  ASSERT_TRUE(wait_exit(*client_, kPeerGoneMs)) << "the writer hung after its peer closed";
  ASSERT_TRUE(client_->exited_ok()) << "client: see its output below";
  auto c = parse_result(client_->out());
  EXPECT_TRUE(c["tx_end"] == "EPIPE" || c["tx_end"] == "ECONNRESET") << c["tx_end"];
  EXPECT_NE(c["tx_errors"].find("EPIPE"), std::string::npos)
      << "later writes must fail with EPIPE: " << c["tx_errors"];
  EXPECT_GE(to_u64(c["sent"]), read_first);
  auto s = parse_result(server_->out());
  EXPECT_EQ(to_u64(s["received"]), read_first);
  expect_shm_bytes(*server_, 0, read_first);
  auto cs = stats_of(*client_);
  ASSERT_TRUE(cs);
  expect_paths(*cs, 1, 0, "client");
  EXPECT_EQ(cs->total_sent(), to_u64(c["sent"]));
}

INSTANTIATE_TEST_SUITE_P(Unread, CloseUnread, ::testing::Values(0, 100000),
                         [](const auto& info) { return "ReadFirst" + std::to_string(info.param); });

// Peer killed mid-stream while the client reads: EOF or ECONNRESET, in
// bounded time, after a correct prefix of the stream.
TEST_F(OrderingTest, PeerKilledWhileClientReads) {
  bool ready = false;
  server_ = &start_server("server", "rs_stream",
                          args("server", {"--send", "-1", "--tx-seed", "71"}), env_, &ready);
  ASSERT_TRUE(ready) << "server: see its output below";
  client_ = &spawn("client", "rs_stream",
                   args("client", {"--expect", "-1", "--rx-seed", "71", "--read-api", "mixed",
                                   "--progress", std::to_string(4u << 20)}),
                   env_);
  ASSERT_TRUE(wait_line(*client_, "PROGRESS rx", kExitTimeoutMs)) << "client: see its output below";
  kill_proc(*server_);
  ASSERT_TRUE(wait_exit(*client_, kPeerGoneMs)) << "reader hung after its peer was killed";
  ASSERT_TRUE(client_->exited_ok()) << "client: see its output below";  // every byte read was right
  auto c = parse_result(client_->out());
  EXPECT_TRUE(c["rx_end"] == "eof" || c["rx_end"] == "ECONNRESET") << c["rx_end"];
  EXPECT_GE(to_u64(c["received"]), 4u << 20);
  auto cs = stats_of(*client_);
  ASSERT_TRUE(cs);
  expect_paths(*cs, 1, 0, "client");
  EXPECT_EQ(cs->total_received(), to_u64(c["received"]));
}

// Peer killed while the client streams to it: the client's writes fail
// (EPIPE or ECONNRESET) in bounded time.
TEST_F(OrderingTest, PeerKilledWhileClientWrites) {
  bool ready = false;
  server_ = &start_server("server", "rs_stream",
                          args("server", {"--expect", "-1", "--rx-seed", "81"}), env_, &ready);
  ASSERT_TRUE(ready) << "server: see its output below";
  client_ = &spawn(
      "client", "rs_stream",
      args("client", {"--send", "-1", "--tx-seed", "81", "--progress", std::to_string(4u << 20)}),
      env_);
  ASSERT_TRUE(wait_line(*client_, "PROGRESS tx", kExitTimeoutMs)) << "client: see its output below";
  kill_proc(*server_);
  ASSERT_TRUE(wait_exit(*client_, kPeerGoneMs)) << "writer hung after its peer was killed";
  ASSERT_TRUE(client_->exited_ok()) << "client: see its output below";
  auto c = parse_result(client_->out());
  EXPECT_TRUE(c["tx_end"] == "EPIPE" || c["tx_end"] == "ECONNRESET") << c["tx_end"];
  auto cs = stats_of(*client_);
  ASSERT_TRUE(cs);
  expect_paths(*cs, 1, 0, "client");
  EXPECT_EQ(cs->total_sent(), to_u64(c["sent"]));
}

// Peer killed while the client is blocked: in send on a full ring (the
// server never reads), and in recv with nothing coming.
TEST_F(OrderingTest, PeerKilledWhileClientBlockedInSend) {
  bool ready = false;
  server_ =
      &start_server("server", "rs_stream", args("server", {"--linger-ms", "60000"}), env_, &ready);
  ASSERT_TRUE(ready) << "server: see its output below";
  client_ =
      &spawn("client", "rs_stream",
             args("client", {"--send", "-1", "--tx-seed", "91", "--progress", "65536"}), env_);
  ASSERT_TRUE(wait_line(*client_, "PROGRESS tx", kExitTimeoutMs)) << "client: see its output below";
  sleep_ms(300);  // let it fill the ring and block (it must end either way)
  kill_proc(*server_);
  ASSERT_TRUE(wait_exit(*client_, kPeerGoneMs)) << "blocked writer hung after its peer was killed";
  ASSERT_TRUE(client_->exited_ok()) << "client: see its output below";
  auto c = parse_result(client_->out());
  EXPECT_TRUE(c["tx_end"] == "EPIPE" || c["tx_end"] == "ECONNRESET") << c["tx_end"];
  auto cs = stats_of(*client_);
  ASSERT_TRUE(cs);
  expect_paths(*cs, 1, 0, "client");
}

TEST_F(OrderingTest, PeerKilledWhileClientBlockedInRecv) {
  bool ready = false;
  server_ =
      &start_server("server", "rs_stream", args("server", {"--linger-ms", "60000"}), env_, &ready);
  ASSERT_TRUE(ready) << "server: see its output below";
  client_ =
      &spawn("client", "rs_stream", args("client", {"--expect", "-1", "--rx-seed", "92"}), env_);
  ASSERT_TRUE(wait_line(*client_, "CONNECTED", kExitTimeoutMs)) << "client: see its output below";
  sleep_ms(300);  // let it block in recv (it must end either way)
  kill_proc(*server_);
  ASSERT_TRUE(wait_exit(*client_, kPeerGoneMs)) << "blocked reader hung after its peer was killed";
  ASSERT_TRUE(client_->exited_ok()) << "client: see its output below";
  auto c = parse_result(client_->out());
  EXPECT_TRUE(c["rx_end"] == "eof" || c["rx_end"] == "ECONNRESET") << c["rx_end"];
  EXPECT_EQ(to_u64(c["received"]), 0u);
  auto cs = stats_of(*client_);
  ASSERT_TRUE(cs);
  expect_paths(*cs, 1, 0, "client");
}

}  // namespace
}  // namespace rsock_test
