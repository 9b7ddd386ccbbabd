// Calls that move socket bytes without read/write/send/recv, and exec.
//
// XferTest runs build/progs/rs_xfer (sendfile, splice both ways,
// sendmmsg/recvmmsg, preadv2/pwritev2, dprintf, POSIX AIO, fclose and
// epoll_pwait2)
// twice: on plain TCP and with
// librsock preloaded into both ends. The client's PROBE lines (return
// values, errnos, offsets, file positions) must be the same in both runs,
// the bytes the server counted must be the bytes the client sent, and the
// preloaded run must have been carried by shared memory on both ends.
//
// ExecTest runs build/progs/rs_exec: an accelerated connection with bytes in
// flight both ways is inherited through each exec form and posix_spawn; the
// new image reads what the old one left unread, both streams are checked
// byte by byte, and the new image's stats line counts the connection on
// shm. ExecLostTest forges the hand-off (a memfd that is no region; another
// connection's region; an RDMA entry): the connection must fail loudly in
// the new image, never map the wrong region. InetdTest: fork,
// stdin/stdout, closefrom(3), exec of an echo server using
// read(0)/write(1).
#include "harness.h"

namespace rsock_test {
namespace {

std::vector<std::string> lines_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  for (const std::string& l : split_lines(text))
    if (l.rfind(prefix, 0) == 0) out.push_back(l);
  return out;
}

// The stats lines of one program name (several images may share a pid).
std::vector<Stats> stats_named(const std::vector<Stats>& all, const std::string& program) {
  std::vector<Stats> out;
  for (const Stats& s : all)
    if (s.program == program) out.push_back(s);
  return out;
}

// ---- sendfile, splice, mmsg, preadv2 -------------------------------------------

class XferTest : public PreloadTest, public ::testing::WithParamInterface<const char*> {
 protected:
  struct Run {
    std::string client_out, server_out;
  };
  static constexpr int kNeverMs = 60000;  // RSOCK_PAIR_DELAY_MS's largest
  // Runs the case on plain TCP and preloaded, and compares what the client
  // saw.
  void compare();

  // RSOCK_TCP_FIRST=1 with this RSOCK_PAIR_DELAY_MS for the preloaded run
  // (-1: the default mode).
  int tcp_first_delay_ms_ = -1;

  // One run of the case; `preload` adds librsock with a rule for the port.
  void run(bool preload, Run* out) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    const std::string label = preload ? "rsock" : "plain";
    Env env;
    if (preload) env = preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}});
    if (preload && tcp_first_delay_ms_ >= 0) {
      env["RSOCK_TCP_FIRST"] = "1";
      env["RSOCK_PAIR_DELAY_MS"] = std::to_string(tcp_first_delay_ms_);
    }
    const std::string scratch = dir() + "/" + label;
    ASSERT_EQ(mkdir(scratch.c_str(), 0755), 0);
    bool ready = false;
    Proc& server = start_server(
        label + "-server", "rs_xfer",
        {"--role", "server", "--port", std::to_string(port), "--case", GetParam()}, env, &ready);
    ASSERT_TRUE(ready) << server.describe();
    Proc& client = spawn(label + "-client", "rs_xfer",
                         {"--role", "client", "--port", std::to_string(port), "--case", GetParam(),
                          "--dir", scratch},
                         env);
    // Half the longest pair delay below: a call that waited for a pairing
    // that far off would not be done by then.
    ASSERT_TRUE(wait_exit(client, 30000)) << "client hung: " << client.describe();
    ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung: " << server.describe();
    ASSERT_TRUE(client.exited_ok()) << client.describe();
    ASSERT_TRUE(server.exited_ok()) << server.describe();
    // Only the refused POSIX AIO logs a line.
    if (!(preload && std::string(GetParam()) == "aio_fclose")) {
      EXPECT_EQ(client.err(), "");
    }
    EXPECT_EQ(server.err(), "");
    out->client_out = client.out();
    out->server_out = server.out();
    EXPECT_EQ(lines_with(out->client_out, "DONE").size(), 1u) << out->client_out;
    if (std::string(GetParam()) != "sendfile_epipe") {
      // What the server read is what the client says it sent (or, for
      // splice_out, what the client got is what the server sent).
      auto c = parse_result(out->client_out, "CLIENT");
      auto s = parse_result(out->server_out, "SERVER");
      EXPECT_FALSE(c["total"].empty()) << out->client_out;
      EXPECT_EQ(c["total"], s["total"]) << label;
      EXPECT_EQ(c["fnv"], s["fnv"]) << label;
    }
    if (preload && tcp_first_delay_ms_ >= 0) {
      auto cs = stats_of(client);
      auto ss = stats_of(server);
      ASSERT_TRUE(cs && ss);
      if (tcp_first_delay_ms_ >= kNeverMs) {
        // Over before either side's pairing was due: TCP throughout.
        expect_paths(*cs, 0, 1, "client");
        expect_paths(*ss, 0, 1, "server");
        expect_fallbacks(*cs, {{"closed_before_pairing", 1}}, "client");
        expect_fallbacks(*ss, {{"closed_before_pairing", 1}}, "server");
      } else {
        // One connection each, on whichever path its pairing gave.
        EXPECT_EQ(cs->conn("shm") + cs->conn("tcp"), 1u);
        EXPECT_EQ(ss->conn("shm") + ss->conn("tcp"), 1u);
      }
    } else if (preload) {
      auto cs = stats_of(client);
      auto ss = stats_of(server);
      ASSERT_TRUE(cs && ss);
      expect_paths(*cs, 1, 0, "client");
      expect_paths(*ss, 1, 0, "server");
      expect_fallbacks(*cs, {}, "client");
      expect_fallbacks(*ss, {}, "server");
      auto c = parse_result(out->client_out, "CLIENT");
      if (std::string(GetParam()) == "splice_out") {
        EXPECT_EQ(cs->total_received(), to_u64(c["total"]));
      } else if (std::string(GetParam()) != "sendfile_epipe") {
        EXPECT_EQ(cs->total_sent(), to_u64(c["total"]));
      }
    }
  }
};

TEST_P(XferTest, SameAsKernelTcp) { compare(); }

void XferTest::compare() {
  Run plain, accel;
  ASSERT_NO_FATAL_FAILURE(run(false, &plain));
  ASSERT_NO_FATAL_FAILURE(run(true, &accel));
  const auto want = lines_with(plain.client_out, "PROBE");
  const auto got = lines_with(accel.client_out, "PROBE");
  if (std::string(GetParam()) != "sendfile_nonblock" &&
      std::string(GetParam()) != "sendfile_epipe") {
    EXPECT_FALSE(want.empty()) << "no probe ran";
  }
  EXPECT_EQ(got, want) << "librsock differs from kernel TCP";
  if (std::string(GetParam()) == "aio_fclose") {
    // POSIX AIO completes on plain TCP and is refused on an accelerated fd.
    EXPECT_EQ(lines_with(plain.client_out, "NOTE aio done").size(), 1u) << plain.client_out;
    EXPECT_EQ(lines_with(accel.client_out, "NOTE aio refused").size(), 1u) << accel.client_out;
  }
  // The invariant checks (counts differ with buffer sizes) all ran.
  EXPECT_EQ(lines_with(accel.client_out, "OK").size(), lines_with(plain.client_out, "OK").size());
}

INSTANTIATE_TEST_SUITE_P(Cases, XferTest,
                         ::testing::Values("sendfile", "sendfile_errors", "sendfile_nonblock",
                                           "sendfile_epipe", "splice_in", "splice_out", "mmsg",
                                           "rwv2", "aio_fclose", "pwait2"),
                         [](const auto& info) { return std::string(info.param); });

// RSOCK_TCP_FIRST=1: sendfile and splice on a connection still on TCP go on
// the socket at once (they waited for the pairing's outcome), and a
// shutdown for writing before the pairing began ends it as on kernel TCP
// (it waited too). With the pairing a minute away, every case ends long
// before it (30 s bound: a call that waited would still be waiting). With
// no delay, the pairing falls inside the transfers, which go on with the
// paired connection from where they were. Both as kernel TCP, byte for byte.
class XferTcpFirstTest : public XferTest {};

TEST_P(XferTcpFirstTest, NeverPairedSameAsKernelTcp) {
  tcp_first_delay_ms_ = kNeverMs;
  compare();
}

TEST_P(XferTcpFirstTest, PairedMidwaySameAsKernelTcp) {
  tcp_first_delay_ms_ = 0;
  compare();
}

INSTANTIATE_TEST_SUITE_P(Cases, XferTcpFirstTest,
                         ::testing::Values("sendfile", "sendfile_errors_nonblock",
                                           "sendfile_nonblock", "splice_in", "splice_out"),
                         [](const auto& info) { return std::string(info.param); });

// ---- exec ------------------------------------------------------------------------

class ExecTest : public PreloadTest, public ::testing::WithParamInterface<const char*> {
 protected:
  // Runs server and client; returns false (with failures) when they did
  // not both exit cleanly.
  bool run_pair(const Env& env, int port, int port2, Proc** client, Proc** server) {
    bool ready = false;
    const RoleArgs args = two_port_args(port, port2, {"--case", GetParam()}, true);
    *server = &start_server("server", "rs_exec", args.server, env, &ready);
    EXPECT_TRUE(ready) << (*server)->describe();
    if (!ready) return false;
    *client = &spawn("client", "rs_exec", args.client, env);
    EXPECT_TRUE(wait_exit(**client, 60000)) << "client hung";
    EXPECT_TRUE(wait_exit(**server, kExitTimeoutMs)) << "server hung";
    EXPECT_TRUE((*client)->exited_ok());
    EXPECT_TRUE((*server)->exited_ok());
    return (*client)->exited_ok() && (*server)->exited_ok();
  }
};

TEST_P(ExecTest, InheritedConnectionKeepsWorking) {
  const int port = free_port();
  const int port2 = free_port_besides(port);
  ASSERT_GT(port, 0);
  ASSERT_NE(port, port2);
  Proc *client = nullptr, *server = nullptr;
  // The program itself on plain TCP first: its checks hold on the kernel.
  ASSERT_TRUE(run_pair({}, port, port2, &client, &server));
  EXPECT_EQ(lines_with(client->out(), "STAGE2 ok").size(), 1u) << client->out();

  const int p1 = free_port();
  const int p2 = free_port_besides(p1);
  ASSERT_TRUE(run_pair(preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(p1)}}), p1, p2,
                       &client, &server));
  EXPECT_EQ(lines_with(client->out(), "STAGE2 ok").size(), 1u) << client->out();
  EXPECT_EQ(lines_with(server->out(), "SERVER ok").size(), 1u) << server->out();
  EXPECT_EQ(client->err(), "");
  EXPECT_EQ(server->err(), "");

  const auto all = stats();
  // The new image: the inherited connection on shm (plus the control
  // connection on TCP), nothing fell back or was reset, and it moved the
  // bytes the old image left: the rest of S1 and all of S2 in, C2 out.
  const auto stage2 = stats_named(all, "rs_exec2");
  ASSERT_EQ(stage2.size(), 1u) << read_file(stats_path());
  expect_paths(stage2[0], 1, 1, "new image");
  expect_fallbacks(stage2[0], {}, "new image");
  EXPECT_TRUE(stage2[0].resets.empty()) << "new image: resets";
  EXPECT_EQ(stage2[0].total_received(), 199000u + 300000u);
  EXPECT_EQ(stage2[0].total_sent(), 100000u);
  // The old image (or, for posix_spawn, the parent): the connection on shm,
  // the first 1000 bytes of S1 in and C1 out.
  const auto stage1 = stats_named(all, "rs_exec");
  std::optional<Stats> old, srv;
  for (const Stats& s : stage1) {
    if (s.pid == client->pid) old = s;
    if (s.pid == server->pid) srv = s;
  }
  ASSERT_TRUE(old && srv) << read_file(stats_path());
  expect_paths(*old, 1, 0, "old image");
  EXPECT_EQ(old->total_received(), 1000u);
  EXPECT_EQ(old->total_sent(), 150000u);
  expect_paths(*srv, 1, 1, "server");
  expect_fallbacks(*srv, {}, "server");
  EXPECT_EQ(srv->total_sent(), 200000u + 300000u);
  EXPECT_EQ(srv->total_received(), 250000u);
}

INSTANTIATE_TEST_SUITE_P(Forms, ExecTest,
                         ::testing::Values("execve", "execl", "execle", "execlp", "execvp",
                                           "fexecve", "execveat", "spawn"),
                         [](const auto& info) { return std::string(info.param); });

// A forged or unusable hand-off: the new image never maps a region that is
// not this connection's, and every call on the fd fails loudly.
class ExecLostTest : public ExecTest {};

TEST_P(ExecLostTest, FailsLoudly) {
  const int port = free_port();
  const int port2 = free_port_besides(port);
  ASSERT_NE(port, port2);
  // forge_other needs a second accelerated connection, whose region it
  // offers for the first.
  const std::string peers =
      "127.0.0.1:" + std::to_string(port) + ",127.0.0.1:" + std::to_string(port2);
  Proc *client = nullptr, *server = nullptr;
  ASSERT_TRUE(run_pair(preloaded({{"RSOCK_PEERS", peers}}), port, port2, &client, &server));
  EXPECT_EQ(lines_with(client->out(), "STAGE2 lost").size(), 1u) << client->out();
  // One log line says why.
  const auto warn = split_lines(client->err());
  ASSERT_EQ(warn.size(), 1u) << client->err();
  EXPECT_NE(warn[0].find("cannot be used in this program"), std::string::npos) << warn[0];
  EXPECT_NE(warn[0].find("(reset: lost_at_exec)"), std::string::npos) << warn[0];
  const std::string why = std::string(GetParam()) == "forge_rdma"
                              ? "an RDMA queue pair cannot cross exec"
                              : "its shared region failed validation";
  EXPECT_NE(warn[0].find(why), std::string::npos) << warn[0];
  const auto stage2 = stats_named(stats(), "rs_exec2");
  ASSERT_EQ(stage2.size(), 1u) << read_file(stats_path());
  EXPECT_EQ(stage2[0].reset("lost_at_exec"), 1u);
  EXPECT_EQ(stage2[0].conn("shm"), 0u) << "a forged hand-off was taken over";
  EXPECT_EQ(stage2[0].bytes_sent + stage2[0].bytes_received, 0u);
}

INSTANTIATE_TEST_SUITE_P(Forged, ExecLostTest,
                         ::testing::Values("forge_unsealed", "forge_other", "forge_rdma"),
                         [](const auto& info) { return std::string(info.param); });

// Bytes librsock held for a program (Stream::relieve: it waited in poll for
// room while its own receive ring was full) live in that image's memory
// only: the connection cannot cross exec with them, and the new image finds
// it lost, loudly, rather than missing those bytes.
class ExecHeldTest : public ExecTest {};

TEST_P(ExecHeldTest, HeldBytesMakeTheInheritedConnectionLost) {
  const int port = free_port();
  const int port2 = free_port_besides(port);
  ASSERT_NE(port, port2);
  Proc *client = nullptr, *server = nullptr;
  ASSERT_TRUE(run_pair(
      preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}, {"RSOCK_RING_SIZE", "64K"}}),
      port, port2, &client, &server));
  EXPECT_EQ(lines_with(client->out(), "STAGE2 lost").size(), 1u) << client->out();
  const auto warn = split_lines(client->err());
  ASSERT_EQ(warn.size(), 1u) << client->err();
  EXPECT_NE(warn[0].find("held bytes of it that the program had not read"), std::string::npos)
      << warn[0];
  const auto all = stats();
  const auto stage1 = stats_named(all, "rs_exec");
  const auto stage2 = stats_named(all, "rs_exec2");
  ASSERT_EQ(stage2.size(), 1u) << read_file(stats_path());
  EXPECT_EQ(stage2[0].reset("lost_at_exec"), 1u);
  EXPECT_EQ(stage2[0].bytes_sent + stage2[0].bytes_received, 0u);
  uint64_t held = 0;
  for (const Stats& st : stage1) held += st.held_bytes;
  EXPECT_GT(held, 0u) << "stage 1 held nothing: " << read_file(stats_path());
}

INSTANTIATE_TEST_SUITE_P(Held, ExecHeldTest, ::testing::Values("held"),
                         [](const auto& info) { return std::string(info.param); });

// inetd: fork per connection, the child serves the socket on stdin/stdout.
class InetdTest : public PreloadTest {};

TEST_F(InetdTest, ExecdServiceEchoesOverSharedMemory) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  Env env = preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}});
  bool ready = false;
  Proc& server = start_server("inetd", "rs_exec",
                              {"--role", "inetd", "--port", std::to_string(port)}, env, &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client =
      spawn("client", "rs_exec",
            {"--role", "client", "--port", std::to_string(port), "--case", "inetd"}, env);
  ASSERT_TRUE(wait_exit(client, 60000)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  ASSERT_TRUE(client.exited_ok());
  ASSERT_TRUE(server.exited_ok());
  EXPECT_EQ(lines_with(client.out(), "CLIENT ok").size(), 1u);
  EXPECT_NE(server.err().find("ECHO 3145728"), std::string::npos) << server.err();
  const auto all = stats();
  const auto echo = stats_named(all, "rs_exec_echo");
  ASSERT_EQ(echo.size(), 1u) << read_file(stats_path());
  expect_paths(echo[0], 1, 0, "echo");
  expect_fallbacks(echo[0], {}, "echo");
  EXPECT_EQ(echo[0].total_received(), 3145728u);
  EXPECT_EQ(echo[0].total_sent(), 3145728u);
  auto cs = stats_of(client);
  ASSERT_TRUE(cs);
  expect_paths(*cs, 1, 0, "client");
  EXPECT_EQ(cs->total_sent(), 3145728u);
  EXPECT_EQ(cs->total_received(), 3145728u);
}

// A fork's child that execs must not take its parent's sleepers with it:
// the exec hand-off tells the new image how many sleepers its old image had
// armed, and a fork's child had none (the counts it inherited are its
// parent's threads'). Before the fix the new image took back the parent's
// reader's arm, and the server's answer rang no doorbell.
class ForkExecTest : public PreloadTest {};

TEST_F(ForkExecTest, TheParentsSleeperStillWakes) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  Env env = preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}});
  bool ready = false;
  Proc& server = start_server("server", "rs_forkexec",
                              {"--role", "server", "--port", std::to_string(port)}, env, &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client =
      spawn("client", "rs_forkexec", {"--role", "client", "--port", std::to_string(port)}, env);
  ASSERT_TRUE(wait_exit(client, 60000)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  EXPECT_EQ(lines_with(client.out(), "CLIENT ok").size(), 1u) << client.out() << client.err();
  EXPECT_TRUE(client.exited_ok()) << client.describe();
  EXPECT_TRUE(server.exited_ok()) << server.describe();
  auto cs = stats_of(client);
  ASSERT_TRUE(cs);
  expect_paths(*cs, 1, 0, "client");
  // The child ran librsock, so the hand-off was taken.
  EXPECT_EQ(stats_named(stats(), "rs_forkexec_child").size(), 1u) << read_file(stats_path());
}

}  // namespace
}  // namespace rsock_test
