// Two processes that hold one shared-memory connection (a fork's parent and
// child) and both use it: build/progs/rs_move, a client that reads
// checksummed, numbered 64-byte records from the parent (tag P) and the
// child (tag C). The process that uses the end owns it
// (transport/end_owner.h): a parent whose connection its child took over
// fails its calls with ECONNRESET while the child holds it, and uses the
// connection again once the child let go. No record is ever torn, lost or
// written twice, and the stats of every process say what it moved.
#include "harness.h"

namespace rsock_test {
namespace {

class MoveTest : public PreloadTest {
 protected:
  struct Run {
    std::map<std::string, std::string> parent, child, records;
    std::string server_err;
    std::optional<Stats> client_stats;
    std::vector<Stats> server_stats;  // rs_move's lines: the parent's and the child's
  };

  // Runs `rs_move --role ROLE args` against an `rs_move --role records`
  // client, both preloaded.
  void run(const std::string& role, const std::vector<std::string>& args, Run* r) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    Env env = preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}});
    std::vector<std::string> sargs = {"--role", role, "--port", std::to_string(port)};
    sargs.insert(sargs.end(), args.begin(), args.end());
    bool ready = false;
    Proc& server = start_server("server", "rs_move", sargs, env, &ready);
    ASSERT_TRUE(ready) << "server: see its output below";
    Proc& client =
        spawn("client", "rs_move", {"--role", "records", "--port", std::to_string(port)}, env);
    ASSERT_TRUE(wait_exit(client, 120000)) << "client hung";
    ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
    EXPECT_TRUE(client.exited_ok()) << "client: see its output below";
    r->parent = parse_result(server.out(), "PARENT");
    r->child = parse_result(server.out(), "CHILD");
    r->records = parse_result(client.out(), "RECORDS");
    r->server_err = server.err();
    r->client_stats = stats_of(client);
    for (const Stats& s : stats())
      if (s.program == "rs_move" && s.pid != client.pid) r->server_stats.push_back(s);
  }
};

// Parent and child write at once. The child takes the end over at its first
// write; from then on the parent's writes fail (ECONNRESET, counted once as
// resets.taken_over) until the child has let go, and a write after the
// child's shutdown gets EPIPE, as on TCP. Without --hold the child may be
// done before the parent's next write (then EPIPE); with it, the child
// holds the connection until the parent's writes have ended: ECONNRESET.
class BothWriteTest : public MoveTest, public ::testing::WithParamInterface<bool> {};

TEST_P(BothWriteTest, NoRecordTornLostOrTwice) {
  const bool hold = GetParam();
  Run r;
  ASSERT_NO_FATAL_FAILURE(
      run("both-write", hold ? std::vector<std::string>{"--hold"} : std::vector<std::string>{},
          &r));
  ASSERT_FALSE(r.parent.empty() || r.child.empty() || r.records.empty());
  const std::string pend = r.parent["end"];
  const uint64_t pw = to_u64(r.parent["wrote"]), cw = to_u64(r.child["wrote"]);
  EXPECT_EQ(r.records["bad"], "0") << "torn, corrupt or out-of-sequence records";
  EXPECT_EQ(r.child["end"], "done");
  EXPECT_EQ(cw, 2000u);
  // Every write that succeeded arrived, once.
  EXPECT_EQ(to_u64(r.records["P"]), pw);
  EXPECT_EQ(to_u64(r.records["C"]), cw);
  if (hold)
    EXPECT_EQ(pend, "ECONNRESET");
  else
    EXPECT_TRUE(pend == "ECONNRESET" || pend == "EPIPE" || pend == "done") << pend;
  ASSERT_EQ(r.server_stats.size(), 2u) << "one line each for the parent and the child";
  uint64_t taken = 0, sent = 0;
  for (const Stats& s : r.server_stats) {
    EXPECT_EQ(s.conn("shm"), 1u) << s.pid;
    taken += s.reset("taken_over");
    sent += s.bytes_sent;
  }
  EXPECT_EQ(taken, pend == "ECONNRESET" ? 1u : taken) << "the parent's reset, once";
  EXPECT_LE(taken, 1u);
  EXPECT_EQ(sent, (pw + cw) * 64);
  ASSERT_TRUE(r.client_stats);
  expect_paths(*r.client_stats, 1, 0, "client");
  EXPECT_EQ(r.client_stats->resets.size(), 0u);
  EXPECT_EQ(r.client_stats->bytes_received, (pw + cw) * 64);
  if (pend == "ECONNRESET") {
    size_t lines = 0;
    for (const std::string& l : split_lines(r.server_err))
      if (l.find("taken over by another process") != std::string::npos) ++lines;
    EXPECT_EQ(lines, 1u) << "the parent says why, once:\n" << r.server_err;
  }
}

INSTANTIATE_TEST_SUITE_P(Child, BothWriteTest, ::testing::Values(false, true),
                         [](const auto& info) {
                           return info.param ? std::string("HoldsUntilParentFails")
                                             : std::string("ExitsWhenDone");
                         });

// One after the other: the parent writes, its child writes and exits (with
// or without closing), then the parent writes again. The end moves to the
// child and back; nobody gets an error.
class HandBackTest : public MoveTest, public ::testing::WithParamInterface<const char*> {};

TEST_P(HandBackTest, EveryRecordInOrder) {
  Run r;
  ASSERT_NO_FATAL_FAILURE(run("handback", {"--child-exit", GetParam()}, &r));
  EXPECT_EQ(r.parent["end"], "done");
  EXPECT_EQ(r.child["end"], "done");
  EXPECT_EQ(r.records["bad"], "0") << "torn, corrupt or out-of-sequence records";
  EXPECT_EQ(r.records["P"], "400");
  EXPECT_EQ(r.records["C"], "2000");
  ASSERT_EQ(r.server_stats.size(), 2u) << "one line each for the parent and the child";
  uint64_t sent = 0;
  for (const Stats& s : r.server_stats) {
    EXPECT_EQ(s.conn("shm"), 1u) << s.pid;
    EXPECT_EQ(s.resets.size(), 0u) << s.pid;
    sent += s.bytes_sent;
  }
  EXPECT_EQ(sent, 2400u * 64);
  ASSERT_TRUE(r.client_stats);
  expect_paths(*r.client_stats, 1, 0, "client");
  EXPECT_EQ(r.client_stats->resets.size(), 0u);
  EXPECT_EQ(r.client_stats->bytes_received, 2400u * 64);
}

INSTANTIATE_TEST_SUITE_P(ChildExit, HandBackTest, ::testing::Values("close", "exit"),
                         [](const auto& info) {
                           return std::string(info.param) == "close" ? std::string("ChildCloses")
                                                                     : std::string("ChildExits");
                         });

}  // namespace
}  // namespace rsock_test
