// A process that exits with an accelerated connection still open, as a
// fork-per-connection child that never closes its socket, or an inetd
// service that returns from main with the connection on stdin/stdout
// (build/apps/forksrv, modes child-exit and inetd). The peer must read the
// whole echo and then EOF, as on TCP. The exiting process had read its
// peer's data and FIN without sleeping, so the doorbell the FIN rang was
// still unread in its kernel socket; the kernel answered the exit with a
// reset, which the peer took for a transport failure (ECONNRESET) because
// no one had said the end was closed.
#include "harness.h"

namespace rsock_test {
namespace {

class ExitWithoutCloseTest : public PreloadTest,
                             public ::testing::WithParamInterface<const char*> {};

TEST_P(ExitWithoutCloseTest, PeerReadsEof) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string mode = GetParam(), n = "40", bytes = "4096";
  const std::string forksrv = "../apps/forksrv";  // build/apps, built by `make all`
  Env env = preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}});
  bool ready = false;
  Proc& server = start_server("server", forksrv,
                              {"server", "--port", std::to_string(port), "--count", n, "--mode",
                               mode, "--exec", "build/apps/forksrv"},
                              env, &ready);
  ASSERT_TRUE(ready) << "server: see its output below";
  Proc& client = spawn(
      "client", forksrv,
      {"client", "--port", std::to_string(port), "--count", n, "--threads", "2", "--bytes", bytes},
      env);
  ASSERT_TRUE(wait_exit(client, 120000)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  EXPECT_TRUE(client.exited_ok()) << "client: see its output below";
  EXPECT_TRUE(server.exited_ok()) << "server: see its output below";
  EXPECT_EQ(parse_result(client.out())["ok"], n) << client.err();
  EXPECT_EQ(client.err(), "");
  // The client's connections all went over shared memory.
  auto cs = stats_of(client);
  ASSERT_TRUE(cs);
  expect_paths(*cs, 40, 0, "client");
  expect_fallbacks(*cs, {}, "client");
  EXPECT_EQ(cs->resets.size(), 0u);
}

INSTANTIATE_TEST_SUITE_P(Modes, ExitWithoutCloseTest, ::testing::Values("child-exit", "inetd"),
                         [](const auto& info) {
                           return std::string(info.param) == "child-exit"
                                      ? std::string("ForkedChild")
                                      : std::string("InetdService");
                         });

}  // namespace
}  // namespace rsock_test
