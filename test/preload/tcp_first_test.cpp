// RSOCK_TCP_FIRST=1 (experimental, docs/design.md "Connection setup"): a
// candidate connection runs on kernel TCP from connect()/accept() on and
// pairs in the background, the server's side a little after accept(). A
// connection that ends first is never paired (and counted so), and one
// that lives on switches to the ring with every byte in order.
#include "harness.h"

namespace rsock_test {
namespace {

class TcpFirstTest : public PreloadTest {
 protected:
  struct Run {
    Stats client, server;
  };
  // rs_stream both ways at once, `bytes` each way, in random writes and
  // mixed reads; every byte checked by the reader and hashed.
  void exchange(uint64_t bytes, const std::string& delay_ms, Run* out) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    Env env = {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)},
               {"RSOCK_TCP_FIRST", "1"},
               {"RSOCK_PAIR_DELAY_MS", delay_ms}};
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
    Env env = {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)},
               {"RSOCK_TCP_FIRST", "1"},
               {"RSOCK_PAIR_DELAY_MS", "60000"}};
    auto args = [&](const std::string& role) {
      const bool server = role == "server";
      std::vector<std::string> a = {"--role",    role,
                                    "--port",    std::to_string(port),
                                    "--send",    "100",
                                    "--expect",  "100",
                                    "--order",   "duplex",
                                    "--tx-seed", server ? "11" : "22",
                                    "--rx-seed", server ? "22" : "11"};
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

}  // namespace
}  // namespace rsock_test
