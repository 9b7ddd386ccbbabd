// include/rsock.h in a real program (rs_info): preloaded, each descriptor
// is described as librsock sees it (the connection accelerated over shared
// memory with the bytes both ends moved, the listener a candidate, a pipe
// plain, a closed fd EBADF, a too small struct EINVAL), and the counters
// agree with the stats line; a connection still on TCP before its pairing
// is PAIRING with its bytes counted as on TCP; without librsock the
// header's wrappers answer ENOSYS and the program runs on.
#include "harness.h"

namespace rsock_test {
namespace {

class ApiTest : public PreloadTest {
 protected:
  // Runs rs_info (preloaded when env says so) to its end; its FD lines by
  // "who.name", and its VERSION line under "version".
  std::map<std::string, std::map<std::string, std::string>> run_info(const Env& env,
                                                                     Proc** out) {
    const int port = free_port();
    EXPECT_GT(port, 0);
    Env e = env;
    if (e.count("LD_PRELOAD")) e["RSOCK_PEERS"] = "127.0.0.1:" + std::to_string(port);
    Proc& p = spawn("info", "rs_info", {"--port", std::to_string(port), "--bytes", "100000"}, e);
    *out = &p;
    EXPECT_TRUE(wait_exit(p, 30000)) << "rs_info hung";
    EXPECT_TRUE(p.exited_ok()) << p.describe();
    std::map<std::string, std::map<std::string, std::string>> lines;
    for (const std::string& line : split_lines(p.out())) {
      const auto kv = parse_result(line, line.rfind("FD ", 0) == 0 ? "FD" : "VERSION");
      if (line.rfind("VERSION ", 0) == 0) lines["version"] = kv;
      if (line.rfind("FD ", 0) == 0 && kv.count("who"))
        lines[kv.at("who") + "." + kv.at("name")] = kv;
    }
    return lines;
  }
};

TEST_F(ApiTest, DescribesEachDescriptor) {
  Proc* p = nullptr;
  auto lines = run_info(preloaded({{"RSOCK_TCP_FIRST", "0"}}), &p);
  if (HasFailure()) return;
  EXPECT_NE(lines["version"]["v"], "none") << p->out();
  EXPECT_EQ(lines["version"]["api"], "1");
  for (const char* end : {"parent.connected", "child.accepted"}) {
    auto& f = lines[end];
    EXPECT_EQ(f["rc"], "0") << end << "\n" << p->out();
    EXPECT_EQ(f["state"], "3") << end;      // RSOCK_STATE_ACCELERATED
    EXPECT_EQ(f["transport"], "1") << end;  // RSOCK_TRANSPORT_SHM
    EXPECT_EQ(f["sent"], "100000") << end;
    EXPECT_EQ(f["received"], "100000") << end;
    EXPECT_EQ(f["tcp_sent"], "0") << end;
  }
  EXPECT_EQ(lines["child.listener"]["state"], "1");  // RSOCK_STATE_LISTENER
  EXPECT_EQ(lines["parent.pipe"]["rc"], "0");
  EXPECT_EQ(lines["parent.pipe"]["state"], "0");  // RSOCK_STATE_PLAIN
  EXPECT_EQ(lines["parent.closed"]["errno"], "EBADF");
  EXPECT_EQ(lines["parent.small"]["errno"], "EINVAL");
  // The stats of both processes (the parent, and the child it forked)
  // count the connection on shared memory, with the same bytes.
  uint64_t shm = 0, sent = 0;
  for (const Stats& s : stats()) {
    shm += s.conn("shm");
    sent += s.bytes_sent;
  }
  EXPECT_EQ(shm, 2u);
  EXPECT_EQ(sent, 200000u);
}

TEST_F(ApiTest, AConnectionBeforeItsPairingIsOnTcp) {
  Proc* p = nullptr;
  auto lines =
      run_info(preloaded({{"RSOCK_TCP_FIRST", "1"}, {"RSOCK_PAIR_DELAY_MS", "60000"}}), &p);
  if (HasFailure()) return;
  auto& f = lines["parent.connected"];
  EXPECT_EQ(f["rc"], "0") << p->out();
  EXPECT_EQ(f["state"], "2");  // RSOCK_STATE_PAIRING
  EXPECT_EQ(f["transport"], "0");
  EXPECT_EQ(f["tcp_sent"], "100000");
  EXPECT_EQ(f["tcp_received"], "100000");
  EXPECT_EQ(f["sent"], "0");
}

TEST_F(ApiTest, WithoutLibrsockTheWrappersSayEnosys) {
  Proc* p = nullptr;
  auto lines = run_info({}, &p);
  if (HasFailure()) return;
  EXPECT_EQ(lines["version"]["v"], "none");
  EXPECT_EQ(lines["version"]["api"], "0");
  for (const char* fd : {"parent.connected", "parent.pipe", "child.accepted"}) {
    EXPECT_EQ(lines[fd]["rc"], "-1") << fd;
    EXPECT_EQ(lines[fd]["errno"], "ENOSYS") << fd;
  }
}

}  // namespace
}  // namespace rsock_test
