// Stream integrity under librsock on both ends: large full-duplex transfers
// in random-sized writes (1 byte .. 256 KiB) with every byte checked by the
// reader (it regenerates the writer's seeded stream) and a 64-bit hash
// cross-checked between writer and reader; random-sized reads through every
// receive API (read, recv, readv, recvmsg, MSG_WAITALL, MSG_PEEK); and a
// minimum-size ring that makes every transfer wrap and stall on credits.
// Each test also requires the stats to show one shm connection per side
// and byte counters equal to what was moved.
#include "harness.h"

namespace rsock_test {
namespace {

struct Transfer {
  uint64_t bytes_each_way;
  std::string read_api;  // plain | mixed
  std::string max_read;  // bytes, largest single read
  std::string ring;      // RSOCK_RING_SIZE ("" = default)
  int timeout_ms;
  std::string order = "duplex";        // rs_stream --order, both ends
  std::string send_wait = "blocking";  // rs_stream --send-wait, both ends
};

class IntegrityTest : public PreloadTest {
 protected:
  void run_duplex(const Transfer& t) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    Env env = {{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}};
    if (!t.ring.empty()) env["RSOCK_RING_SIZE"] = t.ring;
    const std::string n = std::to_string(t.bytes_each_way);
    auto args = [&](const char* role, const char* tx, const char* rx) {
      return std::vector<std::string>{
          "--role",      role,       "--port",      std::to_string(port),
          "--send",      n,          "--expect",    n,
          "--tx-seed",   tx,         "--rx-seed",   rx,
          "--max-write", "262144",   "--write-api", "mixed",
          "--read-api",  t.read_api, "--max-read",  t.max_read,
          "--order",     t.order,    "--send-wait", t.send_wait};
    };
    bool ready = false;
    Proc& server =
        start_server("server", "rs_stream", args("server", "1001", "2002"), preloaded(env), &ready);
    ASSERT_TRUE(ready) << "server: see its output below";
    Proc& client = spawn("client", "rs_stream", args("client", "2002", "1001"), preloaded(env));
    ASSERT_TRUE(wait_exit(client, t.timeout_ms)) << "client did not finish in time";
    ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server did not finish in time";
    ASSERT_TRUE(client.exited_ok()) << "client: see its output below";
    ASSERT_TRUE(server.exited_ok()) << "server: see its output below";

    auto c = parse_result(client.out());
    auto s = parse_result(server.out());
    ASSERT_FALSE(c.empty() || s.empty()) << "no RESULT line";
    EXPECT_EQ(to_u64(c["sent"]), t.bytes_each_way);
    EXPECT_EQ(to_u64(c["received"]), t.bytes_each_way);
    EXPECT_EQ(to_u64(s["sent"]), t.bytes_each_way);
    EXPECT_EQ(to_u64(s["received"]), t.bytes_each_way);
    // The writer's hash of what it wrote equals the reader's hash of what it read.
    EXPECT_EQ(c["tx_hash"], s["rx_hash"]);
    EXPECT_EQ(s["tx_hash"], c["rx_hash"]);
    EXPECT_NE(c["tx_hash"], c["rx_hash"]) << "the two directions must carry different streams";

    auto cs = stats_of(client);
    auto ss = stats_of(server);
    ASSERT_TRUE(cs && ss);
    expect_paths(*cs, 1, 0, "client");
    expect_paths(*ss, 1, 0, "server");
    expect_fallbacks(*cs, {}, "client");
    expect_fallbacks(*ss, {}, "server");
    EXPECT_EQ(cs->total_sent(), t.bytes_each_way);
    EXPECT_EQ(cs->total_received(), t.bytes_each_way);
    EXPECT_EQ(ss->total_sent(), t.bytes_each_way);
    EXPECT_EQ(ss->total_received(), t.bytes_each_way);
    EXPECT_EQ(cs->program, "rs_stream");
    held_ = cs->held_bytes + ss->held_bytes;
  }
  uint64_t held_ = 0;  // bytes both ends held for their program (Stream::relieve)
};

// 512 MiB each way at once = 1 GiB through the rings.
TEST_F(IntegrityTest, FullDuplexOneGiBRandomWrites) {
  run_duplex({512ull << 20, "plain", "262144", "", 120000});
}

// Both ends send all of their bytes before they read any: more than both
// rings hold (2 x 256 KiB), less than kernel TCP buffers on loopback. Each
// end, waiting for room, takes the other's bytes out of its full ring
// (Stream::relieve), as the kernel's receive queue does; without that both
// would wait forever. The writers wait in a blocking send, in poll for
// POLLOUT alone (Python's sendall with a timeout) or in epoll_wait for
// EPOLLOUT alone (an event loop that paused reading while it drains).
class IntegrityBothSendFirst : public IntegrityTest,
                               public ::testing::WithParamInterface<const char*> {};

TEST_P(IntegrityBothSendFirst, BothEndsSendEverythingBeforeReading) {
  Transfer t{2ull << 20, "mixed", "300000", "", 60000};
  t.order = "send-first";
  t.send_wait = GetParam();
  run_duplex(t);
  EXPECT_GT(held_, 0u) << "the ends never held bytes: the case did not need relieving";
}

INSTANTIATE_TEST_SUITE_P(Waits, IntegrityBothSendFirst,
                         ::testing::Values("blocking", "poll", "epoll"),
                         [](const auto& info) { return std::string(info.param); });

// Random-sized reads through read/recv/readv/recvmsg, MSG_WAITALL and
// MSG_PEEK-then-read, while the peer writes random sizes; over ring sizes
// from the smallest (every write wraps, the writer stalls on credits) to
// larger than most writes.
class IntegrityRings : public IntegrityTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(IntegrityRings, FullDuplexRandomReadsAllReceiveApis) {
  run_duplex({64ull << 20, "mixed", "300000", GetParam(), 60000});
}

INSTANTIATE_TEST_SUITE_P(RingSizes, IntegrityRings, ::testing::Values("4K", "64K", "", "16M"),
                         [](const auto& info) {
                           return std::string("Ring") + (*info.param ? info.param : "Default");
                         });

}  // namespace
}  // namespace rsock_test
