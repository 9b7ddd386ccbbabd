// Unit tests for src/common/append_file (the open of RSOCK_LOG_FILE and
// RSOCK_STATS): a regular file is created and appended to; a symbolic link
// (to a file, or dangling), a FIFO (with or without a reader), a directory,
// a file with a second hard link and, in a sticky world-writable directory,
// a file of another user are refused with their reason and left untouched.
// Then the callers: stats_append and log_open, in a forked child with
// stderr captured, warn once with the variable, the path (cut and escaped)
// and the reason, and the program goes on.

#include "common/append_file.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/log.h"
#include "stats/stats.h"

namespace rsock {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void spit(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

class AppendFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rsock-append-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    const std::string cmd = "rm -rf '" + dir_ + "'";
    EXPECT_EQ(system(cmd.c_str()), 0);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Opens, expects a refusal with `err` and `reason`.
  void expect_refused(const std::string& p, int err, const std::string& reason) {
    const char* why = nullptr;
    const int fd = open_append_file(p.c_str(), &why);
    if (fd >= 0) close(fd);
    EXPECT_EQ(fd, -err) << p;
    ASSERT_NE(why, nullptr);
    EXPECT_EQ(std::string(why), reason) << p;
  }

  std::string dir_;
};

TEST_F(AppendFileTest, CreatesThenAppends) {
  const std::string p = path("stats.jsonl");
  for (const char* line : {"one\n", "two\n"}) {
    const char* why = "unset";
    const int fd = open_append_file(p.c_str(), &why);
    ASSERT_GE(fd, 0) << why;
    EXPECT_EQ(write(fd, line, 4), 4);
    EXPECT_EQ(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    EXPECT_EQ(fcntl(fd, F_GETFL) & (O_APPEND | O_NONBLOCK | O_ACCMODE), O_APPEND | O_WRONLY);
    close(fd);
  }
  EXPECT_EQ(slurp(p), "one\ntwo\n");
}

TEST_F(AppendFileTest, RelativePathAndRootDirectory) {
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  ASSERT_EQ(chdir(dir_.c_str()), 0);
  const char* why = nullptr;
  const int fd = open_append_file("rel.log", &why);
  EXPECT_EQ(chdir(cwd), 0);
  ASSERT_GE(fd, 0) << why;
  close(fd);
  EXPECT_EQ(access(path("rel.log").c_str(), F_OK), 0);
  // "/" names a directory, as do "" and a trailing slash.
  expect_refused("/", EINVAL, "is not a regular file");
  expect_refused(dir_ + "/", EINVAL, "is not a regular file");
  expect_refused("", ENOENT, "No such file or directory");
}

TEST_F(AppendFileTest, RefusesSymlinkAndLeavesTargetAlone) {
  const std::string target = path("victim");
  spit(target, "precious\n");
  ASSERT_EQ(symlink(target.c_str(), path("link").c_str()), 0);
  expect_refused(path("link"), ELOOP, "is a symbolic link (not followed)");
  EXPECT_EQ(slurp(target), "precious\n");
}

TEST_F(AppendFileTest, RefusesDanglingSymlinkWithoutCreatingItsTarget) {
  const std::string target = path("would-be-created");
  ASSERT_EQ(symlink(target.c_str(), path("dangling").c_str()), 0);
  expect_refused(path("dangling"), ELOOP, "is a symbolic link (not followed)");
  EXPECT_NE(access(target.c_str(), F_OK), 0) << "O_CREAT went through the link";
}

TEST_F(AppendFileTest, RefusesFifoWithAndWithoutReader) {
  const std::string fifo = path("fifo");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  expect_refused(fifo, EINVAL, "is not a regular file");  // must not block either
  const int reader = open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  expect_refused(fifo, EINVAL, "is not a regular file");
  char c;
  EXPECT_EQ(read(reader, &c, 1), 0) << "nothing was written";
  close(reader);
}

TEST_F(AppendFileTest, RefusesDirectoryAndDevice) {
  ASSERT_EQ(mkdir(path("sub").c_str(), 0700), 0);
  expect_refused(path("sub"), EINVAL, "is not a regular file");
  expect_refused("/dev/null", EINVAL, "is not a regular file");
}

TEST_F(AppendFileTest, RefusesFileWithSecondHardLink) {
  const std::string target = path("victim");
  spit(target, "precious\n");
  ASSERT_EQ(link(target.c_str(), path("hard").c_str()), 0);
  expect_refused(path("hard"), EMLINK, "has more than one hard link");
  EXPECT_EQ(slurp(target), "precious\n");
}

TEST_F(AppendFileTest, MissingDirectory) {
  expect_refused(path("no/such/dir/file"), ENOENT, "No such file or directory");
}

// In a sticky world-writable directory (like /tmp), a name that another
// user owns is refused, unless that user owns the directory too; the same
// file elsewhere is fine. Needs root to make files of another user.
TEST_F(AppendFileTest, StickyDirectoryNameOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  constexpr uid_t kOther = 65534;  // nobody
  const std::string sticky = path("sticky");
  ASSERT_EQ(mkdir(sticky.c_str(), 0700), 0);
  ASSERT_EQ(chmod(sticky.c_str(), 01777), 0);
  const std::string planted = sticky + "/stats.jsonl";
  spit(planted, "theirs\n");
  ASSERT_EQ(chown(planted.c_str(), kOther, kOther), 0);
  expect_refused(planted, EPERM, "belongs to another user in a sticky world-writable directory");
  EXPECT_EQ(slurp(planted), "theirs\n");

  // Not sticky: root may append to another user's file (as before).
  ASSERT_EQ(chmod(sticky.c_str(), 0777), 0);
  const char* why = nullptr;
  int fd = open_append_file(planted.c_str(), &why);
  EXPECT_GE(fd, 0) << why;
  if (fd >= 0) close(fd);

  // Sticky, but the file's owner owns the directory (root's own /tmp files).
  ASSERT_EQ(chmod(sticky.c_str(), 01777), 0);
  ASSERT_EQ(chown(sticky.c_str(), kOther, kOther), 0);
  fd = open_append_file(planted.c_str(), &why);
  EXPECT_GE(fd, 0) << why;
  if (fd >= 0) close(fd);
  // And our own new file in a sticky directory is fine.
  fd = open_append_file((sticky + "/ours").c_str(), &why);
  EXPECT_GE(fd, 0) << why;
  if (fd >= 0) close(fd);
}

// Runs `body` in a forked child whose stderr goes to a file; returns what
// the child wrote there. The child exits with _exit, running no handlers.
template <typename F>
std::string child_stderr(const std::string& err_path, F body) {
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || dup2(fd, 2) < 0) _exit(3);
    body();
    _exit(0);
  }
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  return slurp(err_path);
}

TEST_F(AppendFileTest, StatsWarnOncePerProcessAndLeaveTheTargetAlone) {
  const std::string target = path("victim");
  spit(target, "precious\n");
  const std::string stats = path("stats.jsonl");
  ASSERT_EQ(symlink(target.c_str(), stats.c_str()), 0);
  const std::string err = child_stderr(path("err"), [&] {
    stats_append(stats.c_str(), "{\"pid\": 1}", 10);  // at exec
    stats_append(stats.c_str(), "{\"pid\": 1}", 10);  // at exit
  });
  EXPECT_EQ(slurp(target), "precious\n");
  const std::vector<std::string> lines = lines_of(err);
  ASSERT_EQ(lines.size(), 1u) << err;
  EXPECT_EQ(lines[0], "librsock: RSOCK_STATS: cannot append to \"" + stats +
                          "\": is a symbolic link (not followed); no statistics written");
}

TEST_F(AppendFileTest, StatsWarningCutsAndEscapesThePath) {
  // A long name with a terminal escape in it, in a missing directory.
  const std::string name = "\x1b[2J" + std::string(200, 'n');
  const std::string stats = path("missing/") + name;
  const std::string err = child_stderr(path("err"), [&] { stats_append(stats.c_str(), "{}", 2); });
  const std::vector<std::string> lines = lines_of(err);
  ASSERT_EQ(lines.size(), 1u) << err;
  EXPECT_EQ(lines[0].find('\x1b'), std::string::npos) << lines[0];
  EXPECT_LT(lines[0].size(), 200u) << lines[0];
  EXPECT_NE(lines[0].find("librsock: RSOCK_STATS: cannot append to \"" + dir_), std::string::npos)
      << lines[0];
  EXPECT_NE(lines[0].find("...\": No such file or directory"), std::string::npos) << lines[0];
}

TEST_F(AppendFileTest, LogFileRefusedWarnsAndLogsToStderr) {
  const std::string target = path("victim");
  spit(target, "precious\n");
  const std::string log = path("rsock.log");
  ASSERT_EQ(symlink(target.c_str(), log.c_str()), 0);
  const std::string err = child_stderr(path("err"), [&] {
    log_open(log.c_str());
    g_log_level = kLogWarn;
    LOG_WARN("still talking");
  });
  EXPECT_EQ(slurp(target), "precious\n");
  const std::vector<std::string> lines = lines_of(err);
  ASSERT_EQ(lines.size(), 2u) << err;
  EXPECT_EQ(lines[0], "librsock: RSOCK_LOG_FILE: cannot append to \"" + log +
                          "\": is a symbolic link (not followed); logging to stderr");
  EXPECT_NE(lines[1].find("still talking"), std::string::npos) << lines[1];
}

TEST_F(AppendFileTest, LogFileAcceptedTakesTheLog) {
  const std::string log = path("rsock.log");
  const std::string err = child_stderr(path("err"), [&] {
    log_open(log.c_str());
    g_log_level = kLogWarn;
    LOG_WARN("to the file");
  });
  EXPECT_EQ(err, "");
  EXPECT_NE(slurp(log).find("to the file"), std::string::npos);
}

}  // namespace
}  // namespace rsock
