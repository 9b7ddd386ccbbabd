// Tests of the harness itself (harness.h): the JSON and stats-line parsers
// accept what librsock writes and reject malformed or off-spec lines, the
// RESULT parser, and the process fixture (environment, output capture,
// bounded waits, kill-and-reap). A harness that accepted anything would
// make every other preload test prove nothing.
#include "harness.h"

namespace rsock_test {
namespace {

const char* kLine =
    "{\"pid\": 10578, \"program\": \"echo_srv\", \"connections\": {\"shm\": 1, \"rdma\": 0, "
    "\"tcp\": 2}, \"fallbacks\": {\"peer_not_accelerated\": 3}, \"resets\": "
    "{\"kernel_bytes\": 1}, \"rejected\": {\"unproven\": 4}, \"wakeups\": {\"sent\": 7, "
    "\"spared\": 9}, \"trimmed\": {\"rings\": 2, \"bytes\": 81920}, \"held\": {\"bytes\": 6}, "
    "\"regions\": {\"made\": 3, \"reused\": 11}, "
    "\"before_switch\": "
    "{\"sent\": 12, \"received\": 5}, \"bytes_sent\": 35, "
    "\"bytes_received\": 18446744073709551615}";

TEST(StatsParser, ParsesTheDocumentedLine) {
  std::string error;
  auto s = parse_stats_line(kLine, &error);
  ASSERT_TRUE(s) << error;
  EXPECT_EQ(s->pid, 10578);
  EXPECT_EQ(s->program, "echo_srv");
  EXPECT_EQ(s->conn("shm"), 1u);
  EXPECT_EQ(s->conn("tcp"), 2u);
  EXPECT_EQ(s->conn("rdma"), 0u);
  EXPECT_EQ(s->fallback("peer_not_accelerated"), 3u);
  EXPECT_EQ(s->total_fallbacks(), 3u);
  EXPECT_EQ(s->reset("kernel_bytes"), 1u);
  EXPECT_EQ(s->rejects("unproven"), 4u);
  EXPECT_EQ(s->wakeups_sent, 7u);
  EXPECT_EQ(s->wakeups_spared, 9u);
  EXPECT_EQ(s->trimmed_rings, 2u);
  EXPECT_EQ(s->trimmed_bytes, 81920u);
  EXPECT_EQ(s->held_bytes, 6u);
  EXPECT_EQ(s->regions_made, 3u);
  EXPECT_EQ(s->regions_reused, 11u);
  EXPECT_EQ(s->bytes_sent, 35u);
  EXPECT_EQ(s->bytes_received, UINT64_MAX);
  EXPECT_EQ(s->before_sent, 12u);
  EXPECT_EQ(s->before_received, 5u);
}

TEST(StatsParser, RejectsMalformedLines) {
  const char* bad[] = {
      "",
      "{",
      "{\"pid\": 1}",  // fields missing
      "{\"pid\": -1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {}, \"bytes_sent\": 0, \"bytes_received\": 0}",  // negative
      "{\"pid\": 1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {}, \"bytes_sent\": 0, \"bytes_received\": 0}",  // rdma missing
      "{\"pid\": 1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {\"made_up\": 1}, \"bytes_sent\": 0, \"bytes_received\": 0}",  // reason
      "{\"pid\": 1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {}, \"bytes_sent\": 1.5, \"bytes_received\": 0}",  // not an integer
      "{\"pid\": 1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {}, \"bytes_sent\": 0, \"bytes_received\": 0} trailing",
      "{\"pid\": 1, \"pid\": 2, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, "
      "\"tcp\": 0}, \"fallbacks\": {}, \"bytes_sent\": 0, \"bytes_received\": 0}",  // duplicate
      "{\"pid\": 1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {}, \"resets\": {}, \"bytes_sent\": 0, \"bytes_received\": 0}",  // rejected
      "{\"pid\": 1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {}, \"resets\": {\"made_up\": 1}, \"rejected\": {}, \"bytes_sent\": 0, "
      "\"bytes_received\": 0}",  // reset reason
      "{\"pid\": 1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {}, \"resets\": {}, \"rejected\": {}, \"bytes_sent\": 0, "
      "\"bytes_received\": 0}",  // wakeups
      "{\"pid\": 1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {}, \"resets\": {}, \"rejected\": {}, \"wakeups\": {\"sent\": 1}, "
      "\"bytes_sent\": 0, \"bytes_received\": 0}",  // wakeups.spared
      "{\"pid\": 1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {}, \"resets\": {}, \"rejected\": {}, \"wakeups\": {\"sent\": 1, "
      "\"spared\": 0}, \"bytes_sent\": 0, \"bytes_received\": 0}",  // trimmed
      "{\"pid\": 1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {}, \"resets\": {}, \"rejected\": {}, \"wakeups\": {\"sent\": 1, "
      "\"spared\": 0}, \"trimmed\": {\"rings\": 1}, \"bytes_sent\": 0, "
      "\"bytes_received\": 0}",  // trimmed.bytes
      "{\"pid\": 1, \"program\": \"p\", \"connections\": {\"shm\": 0, \"rdma\": 0, \"tcp\": 0}, "
      "\"fallbacks\": {}, \"resets\": {}, \"rejected\": {}, \"wakeups\": {\"sent\": 1, "
      "\"spared\": 0}, \"trimmed\": {\"rings\": 1, \"bytes\": 4096}, \"bytes_sent\": 0, "
      "\"bytes_received\": 0}",  // held
  };
  for (const char* line : bad) {
    std::string error;
    EXPECT_FALSE(parse_stats_line(line, &error)) << line;
    EXPECT_FALSE(error.empty()) << line;
  }
}

TEST(JsonParser, Values) {
  auto j = parse_json("{\"a\": [1, 2.5, -3, true, false, null], \"b\": \"x\\\"\\n\\u0041\"}");
  ASSERT_TRUE(j);
  const Json* a = j->get("a");
  ASSERT_TRUE(a && a->type == Json::Type::kArray && a->array.size() == 6);
  EXPECT_TRUE(a->array[0].is_uint && a->array[0].uint == 1);
  EXPECT_FALSE(a->array[1].is_uint);
  EXPECT_DOUBLE_EQ(a->array[1].number, 2.5);
  EXPECT_FALSE(a->array[2].is_uint);
  EXPECT_EQ(a->array[3].type, Json::Type::kBool);
  EXPECT_TRUE(a->array[3].boolean);
  EXPECT_EQ(a->array[5].type, Json::Type::kNull);
  EXPECT_EQ(j->get("b")->string, "x\"\nA");
  for (const char* bad : {"{\"a\" 1}", "[1,]", "01", "\"\x01\"", "{\"a\": tru}", "1 2", "\"abc"})
    EXPECT_FALSE(parse_json(bad)) << bad;
}

TEST(ResultParser, TakesTheLastTaggedLine) {
  auto kv = parse_result("noise\nRESULT a=1 b=x\nRESULT a=2 c=y\nother a=9\n");
  EXPECT_EQ(kv.size(), 2u);
  EXPECT_EQ(kv["a"], "2");
  EXPECT_EQ(kv["c"], "y");
  EXPECT_TRUE(parse_result("RESULTS a=1\n").empty());
  EXPECT_EQ(parse_result("TOTALS sent=5\n", "TOTALS")["sent"], "5");
}

TEST(FreePort, BindsAndDiffers) {
  int a = free_port();
  ASSERT_GT(a, 0);
  ASSERT_LT(a, 65536);
  // A port that is in use is not handed out.
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sin = {};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&sin), sizeof sin), 0);
  ASSERT_EQ(listen(s, 1), 0);
  socklen_t len = sizeof sin;
  getsockname(s, reinterpret_cast<sockaddr*>(&sin), &len);
  for (int i = 0; i < 20; ++i) EXPECT_NE(free_port(), ntohs(sin.sin_port));
  close(s);
}

// The fixture runs a real program: a server that never gets a client is
// killed and reaped in TearDown; its environment has no stray LD_PRELOAD or
// RSOCK_* variable of ours.
class FixtureTest : public PreloadTest {};

TEST_F(FixtureTest, SpawnCaptureWaitAndKill) {
  setenv("RSOCK_PEERS", "127.0.0.1:1", 1);  // must not leak into children
  const int port = free_port();
  ASSERT_GT(port, 0);
  bool ready = false;
  Proc& p = start_server("idle", "rs_stream", {"--role", "server", "--port", std::to_string(port)},
                         {}, &ready);
  unsetenv("RSOCK_PEERS");
  ASSERT_TRUE(ready) << "see its output below";
  EXPECT_FALSE(wait_exit(p, 100)) << "a server without a client must still be running";
  std::string environ_text = read_file("/proc/" + std::to_string(p.pid) + "/environ");
  EXPECT_EQ(environ_text.find("RSOCK_PEERS"), std::string::npos);
  EXPECT_EQ(environ_text.find("LD_PRELOAD"), std::string::npos);
  kill_proc(p);
  EXPECT_TRUE(p.reaped);
  EXPECT_TRUE(WIFSIGNALED(p.status) && WTERMSIG(p.status) == SIGKILL);
  EXPECT_EQ(kill(p.pid, 0), -1) << "reaped: the pid is gone";

  Proc& bad = spawn("usage", "rs_stream", {"--role", "nobody"}, {});
  ASSERT_TRUE(wait_exit(bad, kExitTimeoutMs));
  EXPECT_TRUE(WIFEXITED(bad.status) && WEXITSTATUS(bad.status) == 2);
  EXPECT_NE(bad.err().find("usage"), std::string::npos) << bad.err();
  EXPECT_FALSE(bad.exited_ok());
}

// The objects of a preloaded program in lookup order: the sanitizer
// runtime first where it must be (ASan), then librsock, and librsock ahead
// of libc (and of TSan's runtime), so that the program's socket calls reach
// librsock. In a plain build librsock simply comes first.
TEST_F(FixtureTest, PreloadedLibraryPrecedesLibc) {
  Proc& p = spawn("linkmap", "rs_probe", {"linkmap"}, preloaded());
  ASSERT_TRUE(wait_exit(p, kExitTimeoutMs));
  ASSERT_TRUE(p.exited_ok()) << p.describe();
  std::vector<std::string> objs;
  // Objects with a path: the vDSO ("linux-vdso.so.1") is not looked up.
  for (const std::string& line : split_lines(p.out()))
    if (line.rfind("OBJ /", 0) == 0) objs.push_back(line.substr(4));
  auto index_of = [&](const std::string& part) {
    for (size_t i = 0; i < objs.size(); ++i)
      if (objs[i].find(part) != std::string::npos) return static_cast<int>(i);
    return -1;
  };
  const int rsock = index_of("librsock.so");
  const int libc = index_of("/libc.so");
  ASSERT_GE(rsock, 0) << p.out();
  ASSERT_GE(libc, 0) << p.out();
  EXPECT_LT(rsock, libc) << p.out();
  const int asan = index_of("/libasan.so");
  const int tsan = index_of("/libtsan.so");
  EXPECT_EQ(asan >= 0 ? asan : rsock, 0) << p.out();
  if (asan >= 0) {
    EXPECT_EQ(rsock, asan + 1) << p.out();
  }
  if (tsan >= 0) {
    EXPECT_LT(rsock, tsan) << p.out();
  }
}

// Under a sanitizer, a report in a spawned process reaches the test: the
// process exits with the sanitizers' status 66 and leaves a report file that
// TearDown would turn into a failure (removed here, where it is expected).
TEST_F(FixtureTest, SanitizerReportInAChildIsNoticed) {
  if (sanitizers().option_vars.empty()) GTEST_SKIP() << "not a sanitizer build";
  Proc& p = spawn("bug", "rs_probe", {"bug"}, preloaded());
  ASSERT_TRUE(wait_exit(p, kExitTimeoutMs));
  EXPECT_TRUE(WIFEXITED(p.status) && WEXITSTATUS(p.status) == 66) << p.describe();
  const std::vector<std::string> reports = sanitizer_reports();
  ASSERT_FALSE(reports.empty()) << p.describe();
  for (const std::string& path : reports) {
    const std::string text = read_file(path);
    EXPECT_TRUE(text.find("ThreadSanitizer: data race") != std::string::npos ||
                text.find("runtime error: signed integer overflow") != std::string::npos ||
                text.find("AddressSanitizer: heap-buffer-overflow") != std::string::npos)
        << text;
    unlink(path.c_str());
  }
}

}  // namespace
}  // namespace rsock_test
