// Bytes that reach an accelerated connection's kernel socket behind
// librsock's wrappers (build/progs/rs_raw: a raw syscall(SYS_sendto),
// syscall(SYS_write), or glibc stdio on the fd) cannot be put back in order,
// so both ends must see the connection reset (ECONNRESET), with one log line
// each and resets.kernel_bytes in both stats lines: never the bytes dropped
// in silence, never a hang. A run that writes only through send() shows no
// reset; on plain TCP every mode delivers every byte.
#include "harness.h"

namespace rsock_test {
namespace {

class KernelBytesTest : public PreloadTest, public ::testing::WithParamInterface<const char*> {
 protected:
  Proc& run(const std::string& label, const std::string& mode, const Env& env) {
    const int port = free_port();
    EXPECT_GT(port, 0);
    Env e = env;
    if (e.count("LD_PRELOAD")) e["RSOCK_PEERS"] = "127.0.0.1:" + std::to_string(port);
    Proc& p = spawn(label, "rs_raw", {"--port", std::to_string(port), "--mode", mode}, e);
    EXPECT_TRUE(wait_exit(p, 60000)) << label << " hung";
    EXPECT_TRUE(p.exited_ok()) << label << ": see its output below";
    EXPECT_NE(p.out().find("\nDONE\n"), std::string::npos) << p.out();
    return p;
  }
};

TEST_P(KernelBytesTest, BothEndsResetLoudly) {
  const std::string mode = GetParam();
  Proc& tcp = run("tcp", mode, {});
  EXPECT_NE(tcp.out().find("READ helloRAWbye END complete"), std::string::npos) << tcp.out();
  EXPECT_NE(tcp.out().find("WRITER bye=3 after=4"), std::string::npos) << tcp.out();

  Proc& rs = run("librsock", mode, preloaded());
  const std::string out = rs.out();
  std::string line;
  for (const std::string& l : split_lines(out))
    if (l.rfind("READ ", 0) == 0) line = l;
  // The reader: "hello" (sent before), perhaps bytes sent after the raw
  // ones (published before the reset was noticed), never the raw bytes,
  // and the stream ends with ECONNRESET, not EOF.
  EXPECT_EQ(line.rfind("READ hello", 0), 0u) << out;
  EXPECT_EQ(line.find("RAW"), std::string::npos) << out;
  EXPECT_NE(line.find(" END ECONNRESET"), std::string::npos) << out;
  // The writer is told: one of its sends after the raw write fails so.
  std::string writer;
  for (const std::string& l : split_lines(out))
    if (l.rfind("WRITER ", 0) == 0) writer = l;
  EXPECT_TRUE(writer == "WRITER bye=3 after=ECONNRESET" ||
              writer == "WRITER bye=ECONNRESET after=EPIPE")
      << out;
  // One log line per end, which ends with the code the stats use.
  const std::string err = rs.err();
  int here = 0, peer = 0;
  const std::string code = " (reset: kernel_bytes)";
  auto ends_with_code = [&](const std::string& l) {
    return l.size() > code.size() && l.compare(l.size() - code.size(), code.size(), code) == 0;
  };
  for (const std::string& l : split_lines(err)) {
    if (l.find("connection reset: bytes reached its kernel TCP socket") != std::string::npos &&
        ends_with_code(l))
      ++here;
    if (l.find("connection reset by the peer: bytes written to this socket bypassed") !=
            std::string::npos &&
        ends_with_code(l))
      ++peer;
  }
  EXPECT_EQ(here, 1) << err;
  EXPECT_EQ(peer, 1) << err;
  // Both processes: the connection on shm, reset once for kernel_bytes.
  const auto lines = stats();
  ASSERT_EQ(lines.size(), 2u);
  for (const Stats& s : lines) {
    const std::string who = s.pid == rs.pid ? "reader" : "writer";
    expect_paths(s, 1, 0, who);
    EXPECT_EQ(s.reset("kernel_bytes"), 1u) << who;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, KernelBytesTest, ::testing::Values("sendto", "write", "stdio"),
                         [](const auto& info) { return std::string(info.param); });

class KernelBytesClean : public PreloadTest {};

TEST_F(KernelBytesClean, NoResetWithoutRawWrites) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  Proc& rs = spawn("librsock", "rs_raw", {"--port", std::to_string(port), "--mode", "none"},
                   preloaded({{"RSOCK_PEERS", "127.0.0.1:" + std::to_string(port)}}));
  ASSERT_TRUE(wait_exit(rs, 60000)) << "hung";
  ASSERT_TRUE(rs.exited_ok());
  EXPECT_NE(rs.out().find("READ helloRAWbye END complete"), std::string::npos) << rs.out();
  EXPECT_NE(rs.out().find("WRITER bye=3 after=4"), std::string::npos) << rs.out();
  EXPECT_EQ(rs.err(), "");
  const auto lines = stats();
  ASSERT_EQ(lines.size(), 2u);
  for (const Stats& s : lines) {
    expect_paths(s, 1, 0, "pid " + std::to_string(s.pid));
    EXPECT_TRUE(s.resets.empty()) << "pid " << s.pid;
  }
}

}  // namespace
}  // namespace rsock_test
