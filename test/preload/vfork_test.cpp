// A vfork() child that calls _exit() without exec (as after a failed exec)
// shares its parent's memory: librsock's _exit wrapper wrote the parent's
// stats line under the child's pid and marked it written, so the parent's
// own line at exit never came. rs_vfork holds both ends of one shm
// connection, vforks such a child and exits: exactly one stats line, the
// parent's, with its 2 connections.
#include "harness.h"

namespace rsock_test {
namespace {

class VforkTest : public PreloadTest {};

TEST_F(VforkTest, ChildExitLeavesTheParentsStats) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  Env env = preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}});
  Proc& p = spawn("vfork", "rs_vfork", {"--port", std::to_string(port)}, env);
  ASSERT_TRUE(wait_exit(p, kExitTimeoutMs)) << "rs_vfork hung";
  ASSERT_TRUE(p.exited_ok()) << "see its output below";
  auto r = parse_result(p.out());
  EXPECT_EQ(r["child_status"], "3");
  EXPECT_EQ(r["pid"], std::to_string(p.pid));
  auto all = stats();
  ASSERT_EQ(all.size(), 1u) << "one stats line expected (the parent's)";
  EXPECT_EQ(all[0].pid, p.pid) << "the line was written by another process";
  expect_paths(all[0], 2, 0, "rs_vfork");
  expect_fallbacks(all[0], {}, "rs_vfork");
}

}  // namespace
}  // namespace rsock_test
