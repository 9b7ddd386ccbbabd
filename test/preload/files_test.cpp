// The files librsock writes and reads, under LD_PRELOAD in real processes:
// a symbolic link planted at the RSOCK_STATS path (or at RSOCK_LOG_FILE)
// is not followed, so the file it points to stays as it was, and each
// process prints one warning line naming the variable, the path and the
// reason, then runs on; a FIFO at RSOCK_STATS or RSOCK_CONF neither blocks
// the program nor is written to.
#include <sys/stat.h>

#include "harness.h"

namespace rsock_test {
namespace {

class FilesTest : public PreloadTest {
 protected:
  // The lines of `text` that librsock printed.
  static std::vector<std::string> librsock_lines(const std::string& text) {
    std::vector<std::string> out;
    for (const std::string& line : split_lines(text))
      if (line.find("librsock") != std::string::npos) out.push_back(line);
    return out;
  }

  std::string plant_victim() {
    const std::string victim = dir() + "/victim";
    std::ofstream(victim) << "precious\n";
    return victim;
  }

  // A client and a server exchanging a few bytes over librsock (shm), both
  // with `env`; both must exit cleanly.
  void run_pair(const Env& env_extra, Proc** server_out, Proc** client_out) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    Env env = env_extra;
    env["RSOCK_PEERS"] = "127.0.0.1:" + std::to_string(port);
    env["RSOCK_CONNECT_TIMEOUT_MS"] = "20000";  // a bound, not an expectation
    auto args = [&](const char* role, const char* tx, const char* rx) {
      return std::vector<std::string>{"--role",    role,   "--port",    std::to_string(port),
                                      "--send",    "4096", "--expect",  "4096",
                                      "--tx-seed", tx,     "--rx-seed", rx};
    };
    bool ready = false;
    Proc& server =
        start_server("server", "rs_stream", args("server", "1", "2"), preloaded(env), &ready);
    ASSERT_TRUE(ready) << "server: see its output below";
    Proc& client = spawn("client", "rs_stream", args("client", "2", "1"), preloaded(env));
    ASSERT_TRUE(wait_exit(client, kExitTimeoutMs)) << "client did not finish in time";
    ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server did not finish in time";
    EXPECT_TRUE(client.exited_ok()) << "client: see its output below";
    EXPECT_TRUE(server.exited_ok()) << "server: see its output below";
    *server_out = &server;
    *client_out = &client;
  }
};

TEST_F(FilesTest, StatsSymlinkIsNotFollowed) {
  const std::string victim = plant_victim();
  const std::string stats = dir() + "/planted-stats.jsonl";
  ASSERT_EQ(symlink(victim.c_str(), stats.c_str()), 0);
  Proc* server = nullptr;
  Proc* client = nullptr;
  run_pair({{"RSOCK_STATS", stats}}, &server, &client);
  ASSERT_TRUE(server && client);
  EXPECT_EQ(read_file(victim), "precious\n") << "the stats went through the link";
  struct stat st;
  ASSERT_EQ(lstat(stats.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link was replaced";
  const std::string want = "librsock: RSOCK_STATS: cannot append to \"" + stats +
                           "\": is a symbolic link (not followed); no statistics written";
  for (Proc* p : {server, client}) {
    const std::vector<std::string> lines = librsock_lines(p->err());
    ASSERT_EQ(lines.size(), 1u) << p->name << ":\n" << p->err();
    EXPECT_EQ(lines[0], want) << p->name;
  }
}

TEST_F(FilesTest, LogFileSymlinkIsNotFollowed) {
  const std::string victim = plant_victim();
  const std::string log = dir() + "/planted.log";
  ASSERT_EQ(symlink(victim.c_str(), log.c_str()), 0);
  Proc* server = nullptr;
  Proc* client = nullptr;
  // Info level: the log has something to say (the "active" line at least).
  run_pair({{"RSOCK_LOG_FILE", log}, {"RSOCK_LOG_LEVEL", "info"}}, &server, &client);
  ASSERT_TRUE(server && client);
  EXPECT_EQ(read_file(victim), "precious\n") << "the log went through the link";
  for (Proc* p : {server, client}) {
    const std::string err = p->err();
    EXPECT_NE(err.find("librsock: RSOCK_LOG_FILE: cannot append to \"" + log +
                       "\": is a symbolic link (not followed); logging to stderr\n"),
              std::string::npos)
        << p->name << ":\n"
        << err;
    EXPECT_NE(err.find("active:"), std::string::npos) << p->name << ": the log went to stderr";
  }
  // The stats, in the harness's own file, still show the shm connections.
  for (Proc* p : {server, client}) {
    auto s = stats_of(*p);
    ASSERT_TRUE(s.has_value());
    expect_paths(*s, 1, 0, p->name);
  }
}

// A FIFO at the stats path (written at exit) with a reader waiting: the
// program neither blocks nor writes to it, and says why once.
TEST_F(FilesTest, StatsFifoIsNotWritten) {
  const std::string fifo = dir() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // A reader, so that an open for writing would succeed and a write land.
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  Env env = preloaded({{"RSOCK_STATS", fifo}, {"RSOCK_PEERS", "127.0.0.1:1"}});
  // rs_sem without arguments prints its usage and exits 2: what matters is
  // the constructor and the exit.
  Proc& p = spawn("stats-fifo", "rs_sem", {}, env);
  ASSERT_TRUE(wait_exit(p, kExitTimeoutMs)) << "blocked on the FIFO";
  char buf[64];
  EXPECT_LE(read(reader, buf, sizeof buf), 0) << "bytes were written to the FIFO";
  close(reader);
  const std::vector<std::string> lines = librsock_lines(p.err());
  ASSERT_EQ(lines.size(), 1u) << p.err();
  EXPECT_EQ(lines[0], "librsock: RSOCK_STATS: cannot append to \"" + fifo +
                          "\": is not a regular file; no statistics written");
}

// A FIFO at RSOCK_CONF with no writer: opening it to read would wait for
// one forever, in librsock's constructor, before main().
TEST_F(FilesTest, ConfFifoDoesNotBlock) {
  const std::string fifo = dir() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  Proc& p = spawn("conf-fifo", "rs_sem", {}, preloaded({{"RSOCK_CONF", fifo}}));
  ASSERT_TRUE(wait_exit(p, kExitTimeoutMs)) << "blocked on the FIFO in the constructor";
  const std::vector<std::string> lines = librsock_lines(p.err());
  ASSERT_EQ(lines.size(), 1u) << p.err();
  EXPECT_EQ(lines[0], "librsock: RSOCK_CONF: cannot read \"" + fifo +
                          "\": not a regular file; running on plain TCP");
}

}  // namespace
}  // namespace rsock_test
