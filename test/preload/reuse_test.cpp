// Regions kept for the next connection (transport/shm/region_cache.h):
// rs_reuse opens connections one after the other between the same two
// processes, each carrying 300 KiB of its own bytes both ways (more than a
// 256 KiB ring, so every ring wraps), every byte checked on both ends.
// The stats must show that both ends used kept regions, and with
// RSOCK_REGION_CACHE=0 that none did. With --overlap 1 each connection stays
// open on the client until the next one is done: the server closed its end
// long before, so only the client's release may free the region.
#include "harness.h"

namespace rsock_test {
namespace {

class RegionReuseTest : public PreloadTest {
 protected:
  // Runs `n` connections; returns the two stats lines.
  void run(const std::string& n, const std::string& overlap, const std::string& cache,
           std::optional<Stats>* cs, std::optional<Stats>* ss) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    Env env = preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}});
    if (!cache.empty()) env["RSOCK_REGION_CACHE"] = cache;
    bool ready = false;
    Proc& server = start_server(
        "server", "rs_reuse",
        {"--role", "server", "--port", std::to_string(port), "--connections", n}, env, &ready);
    ASSERT_TRUE(ready) << "server: see its output below";
    Proc& client = spawn("client", "rs_reuse",
                         {"--role", "client", "--port", std::to_string(port), "--connections", n,
                          "--bytes", "307200", "--overlap", overlap},
                         env);
    ASSERT_TRUE(wait_exit(client, 120000)) << "client hung";
    ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
    ASSERT_TRUE(client.exited_ok()) << "client: see its output below";
    ASSERT_TRUE(server.exited_ok()) << "server: see its output below";
    EXPECT_EQ(parse_result(client.out(), "RESULT")["ok"], n);
    EXPECT_EQ(parse_result(server.out(), "RESULT")["served"], n);
    *cs = stats_of(client);
    *ss = stats_of(server);
    ASSERT_TRUE(*cs && *ss);
    const uint64_t count = std::stoull(n);
    expect_paths(**cs, count, 0, "client");
    expect_paths(**ss, count, 0, "server");
    expect_fallbacks(**cs, {}, "client");
    expect_fallbacks(**ss, {}, "server");
    EXPECT_EQ((*cs)->regions_made + (*cs)->regions_reused, count);
    EXPECT_EQ((*ss)->regions_made + (*ss)->regions_reused, count);
  }
};

class RegionReuseOrderTest : public RegionReuseTest,
                             public ::testing::WithParamInterface<const char*> {};

TEST_P(RegionReuseOrderTest, EveryConnectionReadsOnlyItsOwnBytes) {
  std::optional<Stats> cs, ss;
  run("40", GetParam(), "", &cs, &ss);
  if (HasFatalFailure()) return;
  // One after the other, a region is free again by the next connection
  // (the client closes before it connects again); overlapping, the one
  // before the last is. Either way most connections use a kept region.
  EXPECT_GE(ss->regions_reused, 30u);
  EXPECT_EQ(cs->regions_reused, ss->regions_reused);
}

INSTANTIATE_TEST_SUITE_P(Order, RegionReuseOrderTest, ::testing::Values("0", "1"),
                         [](const auto& info) {
                           return std::string(info.param[0] == '1' ? "Overlapping"
                                                                   : "OneAfterTheOther");
                         });

TEST_F(RegionReuseTest, NoneIsKeptWhenTheCacheIsOff) {
  std::optional<Stats> cs, ss;
  run("10", "0", "0", &cs, &ss);
  if (HasFatalFailure()) return;
  EXPECT_EQ(ss->regions_reused, 0u);
  EXPECT_EQ(cs->regions_reused, 0u);
  EXPECT_EQ(ss->regions_made, 10u);
}

}  // namespace
}  // namespace rsock_test
