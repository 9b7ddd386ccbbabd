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

  // One preloaded process with `env` that starts, has its statistics and log
  // set up, and exits: rs_sem without arguments prints its usage and exits
  // 2, which is all it takes (the stats are written at exit: it makes no
  // socket, so only with RSOCK_STATS_ALL=1, set here unless env says).
  Proc& run_one(const std::string& label, const Env& env) {
    Env e = env;
    if (!e.count("RSOCK_PEERS")) e["RSOCK_PEERS"] = "127.0.0.1:1";
    if (!e.count("RSOCK_STATS_ALL")) e["RSOCK_STATS_ALL"] = "1";
    Proc& p = spawn(label, "rs_sem", {}, preloaded(e));
    EXPECT_TRUE(wait_exit(p, kExitTimeoutMs)) << label << " did not exit";
    EXPECT_TRUE(p.reaped && WIFEXITED(p.status) && WEXITSTATUS(p.status) == 2)
        << "it ran on: " << p.describe();
    return p;
  }
};

TEST_F(FilesTest, StatsSymlinkIsNotFollowed) {
  const std::string victim = plant_victim();
  const std::string stats = dir() + "/planted-stats.jsonl";
  ASSERT_EQ(symlink(victim.c_str(), stats.c_str()), 0);
  // Two processes, each warning once.
  for (const char* label : {"first", "second"}) {
    Proc& p = run_one(label, {{"RSOCK_STATS", stats}});
    const std::vector<std::string> lines = librsock_lines(p.err());
    ASSERT_EQ(lines.size(), 1u) << label << ":\n" << p.err();
    EXPECT_EQ(lines[0], "librsock: RSOCK_STATS: cannot append to \"" + stats +
                            "\": is a symbolic link (not followed); no statistics written");
  }
  EXPECT_EQ(read_file(victim), "precious\n") << "the stats went through the link";
  struct stat st;
  ASSERT_EQ(lstat(stats.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link was replaced";
}

TEST_F(FilesTest, LogFileSymlinkIsNotFollowed) {
  const std::string victim = plant_victim();
  const std::string log = dir() + "/planted.log";
  ASSERT_EQ(symlink(victim.c_str(), log.c_str()), 0);
  // Info level: the log has something to say (the "active" line).
  Proc& p = run_one("log", {{"RSOCK_LOG_FILE", log}, {"RSOCK_LOG_LEVEL", "info"}});
  EXPECT_EQ(read_file(victim), "precious\n") << "the log went through the link";
  const std::string err = p.err();
  const std::string want = "librsock: RSOCK_LOG_FILE: cannot append to \"" + log +
                           "\": is a symbolic link (not followed); logging to stderr";
  size_t count = 0;
  for (const std::string& line : librsock_lines(err)) count += line == want;
  EXPECT_EQ(count, 1u) << err;
  EXPECT_NE(err.find("info: active:"), std::string::npos) << "the log went to stderr:\n" << err;
  // The stats (the harness's own file) are still written.
  auto s = stats_of(p);
  EXPECT_TRUE(s.has_value());
}

// A FIFO at the stats path (written at exit) with a reader waiting: the
// program neither blocks nor writes to it, and says why once.
TEST_F(FilesTest, StatsFifoIsNotWritten) {
  const std::string fifo = dir() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  // A reader, so that an open for writing would succeed and a write land.
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  Proc& p = run_one("stats-fifo", {{"RSOCK_STATS", fifo}});
  ASSERT_TRUE(p.reaped) << "blocked on the FIFO";
  char buf[64];
  EXPECT_LE(read(reader, buf, sizeof buf), 0) << "bytes were written to the FIFO";
  close(reader);
  const std::vector<std::string> lines = librsock_lines(p.err());
  ASSERT_EQ(lines.size(), 1u) << p.err();
  EXPECT_EQ(lines[0], "librsock: RSOCK_STATS: cannot append to \"" + fifo +
                          "\": is not a regular file; no statistics written");
}

// Only a process that made a TCP socket (or counted anything) writes a
// stats line, unless RSOCK_STATS_ALL=1: a shell, a wrapper or a version
// manager's shims, preloaded as much as the program they start, would
// otherwise fill the file with lines of zeros (about 40 of them per
// python3 under pyenv). rs_sem without arguments makes no socket; rs_stream
// connecting to a port where nothing listens makes one and fails.
TEST_F(FilesTest, OnlyAProcessThatMadeATcpSocketWritesStats) {
  Proc& quiet = run_one("quiet", {{"RSOCK_STATS_ALL", "0"}});
  Proc& asked = run_one("asked", {{"RSOCK_STATS_ALL", "1"}});
  const int port = free_port();
  ASSERT_GT(port, 0);
  Proc& tried = spawn("tried", "rs_stream", {"--role", "client", "--port", std::to_string(port)},
                      preloaded({{"RSOCK_PEERS", "127.0.0.1:1"}}));
  ASSERT_TRUE(wait_exit(tried, kExitTimeoutMs)) << "rs_stream did not exit";
  int quiet_lines = 0;
  for (const Stats& s : stats()) quiet_lines += s.pid == quiet.pid;
  EXPECT_EQ(quiet_lines, 0) << "a process without a socket wrote stats";
  auto a = stats_of(asked);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->program, "rs_sem");
  auto t = stats_of(tried);
  ASSERT_TRUE(t.has_value());
  expect_paths(*t, 0, 0, "tried");  // a socket, no connection
}

// A FIFO at RSOCK_CONF with no writer: opening it to read would wait for
// one forever, in librsock's constructor, before main().
TEST_F(FilesTest, ConfFifoDoesNotBlock) {
  const std::string fifo = dir() + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  Proc& p = run_one("conf-fifo", {{"RSOCK_CONF", fifo}});
  ASSERT_TRUE(p.reaped) << "blocked on the FIFO in the constructor";
  const std::vector<std::string> lines = librsock_lines(p.err());
  ASSERT_EQ(lines.size(), 1u) << p.err();
  EXPECT_EQ(lines[0], "librsock: RSOCK_CONF: cannot read \"" + fifo +
                          "\": not a regular file; running on plain TCP");
}

}  // namespace
}  // namespace rsock_test
