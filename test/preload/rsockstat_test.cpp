// rsockstat (src/tools/rsockstat.cpp) against real preloaded processes: it
// shows each end of a live connection with its addresses, transport, state
// and the bytes each way that the programs moved; a process's fallbacks by
// reason code; a fork's child as a process of its own, beside its parent;
// nothing of a process that has exited, was killed, or has RSOCK_PUBLISH=0;
// nothing of root's processes to another user. The files live in a
// directory of the test's own (RSOCK_PUBLISH_DIR), not in /dev/shm.
#include <sys/stat.h>

#include <fstream>
#include <functional>

#include "harness.h"

namespace rsock_test {
namespace {

constexpr int kNobody = 65534;

class RsockstatTest : public PreloadTest {
 protected:
  void SetUp() override {
    PreloadTest::SetUp();
    // Reachable by another user (the rsockstat binary is copied here for
    // one), as /dev/shm is; librsock makes the private rsock-<uid> inside.
    char tmpl[] = "/tmp/rsock-pub-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    pub_ = tmpl;
    ASSERT_EQ(chmod(pub_.c_str(), 0755), 0);
    tool_ = lib().substr(0, lib().rfind('/')) + "/rsockstat";
    ASSERT_EQ(access(tool_.c_str(), X_OK), 0) << tool_ << ": run `make all` first";
  }
  void TearDown() override {
    PreloadTest::TearDown();
    if (!pub_.empty()) remove_tree(pub_);
  }

  Env env(Env extra = {}) const {
    extra["RSOCK_PUBLISH_DIR"] = pub_;
    return preloaded(extra);
  }
  std::string file_of(int pid) const {
    return pub_ + "/rsock-" + std::to_string(geteuid()) + "/" + std::to_string(pid);
  }

  struct Run {
    int status = -1;
    std::string out, err;
  };
  // Runs rsockstat with args (and --dir of the test) to its end.
  Run tool(std::vector<std::string> args, int as_user = -1, const std::string& path = "") {
    args.insert(args.begin(), {"--dir", pub_});
    Proc& p = spawn("rsockstat", path.empty() ? tool_ : path, args, {}, as_user);
    Run r;
    if (wait_exit(p, kExitTimeoutMs) && p.reaped && WIFEXITED(p.status))
      r.status = WEXITSTATUS(p.status);
    r.out = p.out();
    r.err = p.err();
    return r;
  }
  // rsockstat -j -p pid, parsed: the process's object, or nullopt.
  std::optional<Json> process(int pid, std::string* text = nullptr) {
    const Run r = tool({"-j", "-p", std::to_string(pid)});
    if (text) *text = r.out + r.err;
    auto j = parse_json(r.out);
    if (!j) {
      ADD_FAILURE() << "rsockstat -j printed no JSON: " << r.out << r.err;
      return std::nullopt;
    }
    const Json* procs = j->get("processes");
    if (!procs || procs->type != Json::Type::kArray) {
      ADD_FAILURE() << "no processes array: " << r.out;
      return std::nullopt;
    }
    for (const Json& p : procs->array)
      if (p.get("pid") && p.get("pid")->uint == static_cast<uint64_t>(pid)) return p;
    return std::nullopt;
  }
  // Asks until `done` holds for pid's object (bounded); the last answer.
  std::optional<Json> wait_for(int pid, const std::function<bool(const Json&)>& done,
                               std::string* last) {
    const int64_t end = now_ms() + 20000 * sanitizers().slowdown;
    for (;;) {
      std::optional<Json> p = process(pid, last);
      if (HasFailure() || (p && done(*p))) return p;
      if (now_ms() >= end) return std::nullopt;
      sleep_ms(50);
    }
  }

  // A preloaded server (rs_idle) for one connection that will not come: a
  // process with a TCP socket, which publishes. nullptr (with a failure) if
  // it does not start.
  Proc* idle_server(Env extra = {}) {
    const int port = free_port();
    EXPECT_GT(port, 0);
    extra["RSOCK_PEERS"] = "127.0.0.1:" + std::to_string(port);
    bool ready = false;
    Proc& p = start_server("server", "rs_idle",
                           {"--role", "server", "--port", std::to_string(port), "--connections", "1"},
                           env(extra), &ready);
    EXPECT_TRUE(ready) << p.describe();
    return ready ? &p : nullptr;
  }

  std::string pub_;
  std::string tool_;
};

uint64_t num(const Json& o, const std::string& key) {
  const Json* v = o.get(key);
  return v && v->is_uint ? v->uint : UINT64_MAX;
}
std::string str(const Json& o, const std::string& key) {
  const Json* v = o.get(key);
  return v && v->type == Json::Type::kString ? v->string : "";
}
const std::vector<Json>& open_of(const Json& p) {
  static const std::vector<Json> none;
  const Json* v = p.get("open");
  return v && v->type == Json::Type::kArray ? v->array : none;
}
uint64_t count_in(const Json& p, const std::string& kind, const std::string& code) {
  const Json* k = p.get(kind);
  return k ? num(*k, code) : UINT64_MAX;
}

// Both ends of two live connections, each in its own process: addresses
// that mirror each other, shm, accelerated, and the bytes the programs moved
// (100,000 each way on each, all through the rings: eager pairing).
TEST_F(RsockstatTest, ShowsEachEndOfALiveConnection) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string ps = std::to_string(port);
  const Env e = env({{"RSOCK_PEERS", "127.0.0.1:" + ps}});
  bool ready = false;
  Proc& server = start_server("server", "rs_idle",
                              {"--role", "server", "--port", ps, "--connections", "2"}, e, &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client = spawn("client", "rs_idle",
                       {"--role", "client", "--port", ps, "--connections", "2", "--bytes", "100000",
                        "--idle-ms", "3000"},
                       e);
  // Once the first burst is back, the client idles 3 s: the counts stand.
  auto burst_done = [](const Json& p) {
    if (open_of(p).size() != 2) return false;
    for (const Json& c : open_of(p))
      if (num(c, "bytes_sent") != 100000 || num(c, "bytes_received") != 100000) return false;
    return true;
  };
  std::string last;
  const std::optional<Json> cp = wait_for(client.pid, burst_done, &last);
  ASSERT_TRUE(cp) << "the client's connections never showed 100000 bytes each way:\n" << last;
  const std::optional<Json> sp = wait_for(server.pid, burst_done, &last);
  ASSERT_TRUE(sp) << "the server's connections never showed 100000 bytes each way:\n" << last;
  std::set<std::string> client_locals, server_remotes;
  for (const auto& [p, who] : {std::pair{&*cp, "client"}, std::pair{&*sp, "server"}}) {
    EXPECT_EQ(str(*p, "program"), "rs_idle") << who;
    EXPECT_EQ(num(*p->get("connections"), "shm"), 2u) << who;
    for (const Json& c : open_of(*p)) {
      EXPECT_EQ(str(c, "transport"), "shm") << who;
      EXPECT_EQ(str(c, "state"), "accelerated") << who;
      EXPECT_EQ(num(c, "tcp_bytes_sent"), 0u) << who;
      // The application's numbers, below librsock's own.
      EXPECT_LT(num(c, "fd"), 1024u) << who;
    }
  }
  for (const Json& c : open_of(*cp)) {
    EXPECT_EQ(str(c, "remote"), "127.0.0.1:" + ps);
    client_locals.insert(str(c, "local"));
  }
  for (const Json& c : open_of(*sp)) {
    EXPECT_EQ(str(c, "local"), "127.0.0.1:" + ps);
    server_remotes.insert(str(c, "remote"));
  }
  EXPECT_EQ(client_locals, server_remotes);
  EXPECT_EQ(client_locals.size(), 2u);
  // The table names both processes' connections.
  const Run table = tool({});
  EXPECT_EQ(table.status, 0) << table.err;
  int rows = 0;
  for (const std::string& line : split_lines(table.out))
    if (line.find(" accelerated ") != std::string::npos &&
        (line.rfind(std::to_string(client.pid) + " ", 0) == 0 ||
         line.rfind(std::to_string(server.pid) + " ", 0) == 0))
      ++rows;
  EXPECT_EQ(rows, 4) << table.out;
  ASSERT_TRUE(wait_exit(client, 30000)) << client.describe();
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << server.describe();
  EXPECT_TRUE(client.exited_ok()) << client.describe();
  EXPECT_TRUE(server.exited_ok()) << server.describe();
  // An exit takes its file along.
  EXPECT_FALSE(file_exists(file_of(client.pid)));
  EXPECT_FALSE(file_exists(file_of(server.pid)));
  EXPECT_EQ(tool({"-p", std::to_string(client.pid)}).status, 1);
}

// A client whose server runs without librsock: no open connection is
// listed (it is plain TCP), and its fallback shows by its reason code.
TEST_F(RsockstatTest, ShowsFallbacksByReasonCode) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string ps = std::to_string(port);
  bool ready = false;
  Proc& server = start_server("plain-server", "rs_idle",
                              {"--role", "server", "--port", ps, "--connections", "1"}, {}, &ready);
  ASSERT_TRUE(ready) << server.describe();
  Proc& client = spawn("client", "rs_idle",
                       {"--role", "client", "--port", ps, "--connections", "1", "--bytes", "1000",
                        "--idle-ms", "3000"},
                       env({{"RSOCK_PEERS", "127.0.0.1:" + ps}}));
  std::string last;
  const std::optional<Json> cp = wait_for(
      client.pid, [](const Json& p) { return num(*p.get("connections"), "tcp") == 1; }, &last);
  ASSERT_TRUE(cp) << "no tcp connection shown:\n" << last;
  EXPECT_EQ(count_in(*cp, "fallbacks", "peer_not_accelerated"), 1u) << last;
  EXPECT_EQ(open_of(*cp).size(), 0u) << last;
  EXPECT_EQ(num(*cp->get("connections"), "shm"), 0u);
  const Run table = tool({"-p", std::to_string(client.pid)});
  EXPECT_EQ(table.status, 0);
  EXPECT_NE(table.out.find("peer_not_accelerated 1"), std::string::npos) << table.out;
  ASSERT_TRUE(wait_exit(client, 30000)) << client.describe();
  EXPECT_TRUE(client.exited_ok()) << client.describe();
}

// A fork's child is a process of its own: the connections it inherited and
// the one it made, its own counts; its parent keeps its file, and shows only
// what it still holds.
TEST_F(RsockstatTest, AForkedChildShowsItsOwn) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string ps = std::to_string(port);
  const std::string go = dir() + "/go";
  // (The child starts pairing threads after a fork made while the parent's
  // may still be exiting: ThreadSanitizer would stop it, as LifecycleTest
  // says.)
  Proc& parent =
      spawn("rs_fork", "rs_fork", {"--port", ps, "--hold", go},
            env({{"RSOCK_PEERS", "127.0.0.1:" + ps}, {"TSAN_OPTIONS", "die_after_fork=0"}}));
  ASSERT_TRUE(wait_line(parent, "HOLDING", kReadyTimeoutMs)) << parent.describe();
  ASSERT_TRUE(wait_line(parent, "CLOSED", kReadyTimeoutMs)) << parent.describe();
  int child = 0;
  for (const std::string& line : split_lines(parent.out()))
    if (line.rfind("HOLDING ", 0) == 0) child = atoi(line.c_str() + 8);
  ASSERT_GT(child, 0);
  std::string ptext, ctext;
  std::optional<Json> pp = process(parent.pid, &ptext);
  std::optional<Json> cp = process(child, &ctext);
  { std::ofstream(go.c_str()) << "go"; }
  ASSERT_TRUE(pp) << ptext;
  ASSERT_TRUE(cp) << ctext;
  // Parent: pair 1 still held (pair 2 closed). Child: pairs 1, 2
  // (inherited) and 3 held.
  EXPECT_EQ(open_of(*pp).size(), 2u) << ptext;
  EXPECT_EQ(open_of(*cp).size(), 6u) << ctext;
  for (const Json& c : open_of(*cp)) EXPECT_EQ(str(c, "state"), "accelerated") << ctext;
  EXPECT_TRUE(file_exists(file_of(parent.pid)));
  EXPECT_TRUE(file_exists(file_of(child)));
  ASSERT_TRUE(wait_exit(parent, 30000)) << parent.describe();
  EXPECT_TRUE(parent.exited_ok()) << parent.describe();
  EXPECT_FALSE(file_exists(file_of(child)));
  EXPECT_FALSE(file_exists(file_of(parent.pid)));
  // Each counted what it made itself, as its stats line says (a pairing
  // in flight at the fork ends in both).
  for (const auto& [who, pid, p] :
       {std::tuple{"parent", parent.pid, &*pp}, std::tuple{"child", child, &*cp}}) {
    uint64_t lines = 0, shm = 0;
    for (const Stats& s : stats())
      if (s.pid == pid) {
        ++lines;
        shm = s.conn("shm");
      }
    EXPECT_EQ(lines, 1u) << who;
    EXPECT_EQ(num(*p->get("connections"), "shm"), shm) << who;
    EXPECT_GE(shm, 2u) << who;
  }
}

// A process killed without a word leaves its file; rsockstat does not show
// it, and removes the file.
TEST_F(RsockstatTest, AKilledProcessIsNotShownAndItsFileGoes) {
  Proc* sp = idle_server();
  ASSERT_TRUE(sp);
  Proc& server = *sp;
  const int pid = server.pid;
  ASSERT_TRUE(file_exists(file_of(pid))) << "a process with a TCP socket publishes";
  ASSERT_TRUE(process(pid)) << "the live server is shown";
  kill_proc(server);
  ASSERT_TRUE(file_exists(file_of(pid)));
  EXPECT_EQ(tool({"-p", std::to_string(pid)}).status, 1);
  EXPECT_FALSE(file_exists(file_of(pid)));
}

// RSOCK_PUBLISH=0: no file at all.
TEST_F(RsockstatTest, PublishOffShowsNothing) {
  Proc* sp = idle_server({{"RSOCK_PUBLISH", "0"}});
  ASSERT_TRUE(sp);
  Proc& server = *sp;
  EXPECT_FALSE(file_exists(file_of(server.pid)));
  EXPECT_EQ(tool({"-p", std::to_string(server.pid)}).status, 1);
}

// Another user sees none of root's processes, even by pid, and cannot read
// the files; root sees them.
TEST_F(RsockstatTest, AnotherUserSeesNothingOfOurs) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root: rsockstat runs as another user";
  Proc* sp = idle_server();
  ASSERT_TRUE(sp);
  Proc& server = *sp;
  struct stat st;
  ASSERT_EQ(stat(file_of(server.pid).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat((pub_ + "/rsock-0").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  const std::string copy = pub_ + "/rsockstat";
  {
    std::ofstream out(copy, std::ios::binary);
    out << read_file(tool_);
  }
  ASSERT_EQ(chmod(copy.c_str(), 0755), 0);
  const Run other = tool({"-j"}, kNobody, copy);
  EXPECT_EQ(other.status, 0) << other.err;
  EXPECT_EQ(other.out, "{\"processes\": []}\n");
  EXPECT_EQ(tool({"-p", std::to_string(server.pid)}, kNobody, copy).status, 1);
  EXPECT_TRUE(process(server.pid)) << "root sees it";
}

// A directory that others may enter (or another user made first) is not
// used: one warning, no file.
TEST_F(RsockstatTest, ADirectoryOthersMayEnterIsNotUsed) {
  const std::string mine = pub_ + "/rsock-" + std::to_string(geteuid());
  ASSERT_EQ(mkdir(mine.c_str(), 0700), 0);
  ASSERT_EQ(chmod(mine.c_str(), 0755), 0);
  Proc* sp = idle_server();
  ASSERT_TRUE(sp);
  Proc& server = *sp;
  EXPECT_FALSE(file_exists(file_of(server.pid)));
  EXPECT_NE(server.err().find("not private to this user"), std::string::npos) << server.err();
}

TEST_F(RsockstatTest, BadInputIsAClearError) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"-p", "abc"}, {"-p", "0"}, {"--bogus"}, {"-c", "3"}, {"-i", "0"}, {"extra"}}) {
    const Run r = tool(args);
    EXPECT_EQ(r.status, 2) << args[0];
    EXPECT_NE(r.err.find("rsockstat"), std::string::npos) << args[0] << ": " << r.err;
    EXPECT_EQ(r.out, "") << args[0];
  }
  const Run v = tool({"--version"});
  EXPECT_EQ(v.status, 0);
  EXPECT_EQ(v.out.rfind("rsockstat ", 0), 0u) << v.out;
  const Run h = tool({"--help"});
  EXPECT_EQ(h.status, 0);
  for (const char* opt : {"--json", "--pid", "--interval", "--count", "--dir", "--version"})
    EXPECT_NE(h.out.find(opt), std::string::npos) << opt;
}

}  // namespace
}  // namespace rsock_test
