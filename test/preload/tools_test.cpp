// rsock-run (src/tools/rsock-run.sh, built beside the library): a server and
// a client started through it with --peers and --stats pair over shared
// memory, as with LD_PRELOAD set by hand; it exits with the program's
// status, keeps what LD_PRELOAD held, and answers bad input with a clear
// error and status 2 (127: no such program) without running anything.
// Also the check a plain `make` makes for its packages.
#include <sys/stat.h>

#include <fstream>

#include "harness.h"

namespace rsock_test {
namespace {

class RsockRunTest : public PreloadTest {
 protected:
  std::string run_path() const { return lib().substr(0, lib().rfind('/')) + "/rsock-run"; }
  // No LD_PRELOAD of ours: rsock-run sets it. Under ASan its runtime comes
  // first, as rsock-run keeps what LD_PRELOAD held.
  Env base_env() const {
    Env e;
    if (!sanitizers().preload_first.empty()) e["LD_PRELOAD"] = sanitizers().preload_first;
    return e;
  }
  // A server and a client, both started through the rsock-run at `run`,
  // pair over shared memory.
  void run_pair(const std::string& run);
  // Runs rsock-run with args to its end; its exit status, or -1.
  int run(const std::string& label, const std::vector<std::string>& args, Proc** out,
          const Env& env = {}) {
    return run_at(run_path(), label, args, out, env);
  }
  // Under ASan, rsock-run itself (bash) runs with the runtime preloaded,
  // and bash does not free everything before it exits (which it does here
  // on bad input): LeakSanitizer would report bash's leaks, not ours.
  int run_at(const std::string& path, const std::string& label,
             const std::vector<std::string>& args, Proc** out, const Env& env = {}) {
    Env e = base_env();
    if (!sanitizers().preload_first.empty()) e["ASAN_OPTIONS"] = "detect_leaks=0";
    for (const auto& [k, v] : env) e[k] = v;
    Proc& p = spawn(label, path, args, e);
    *out = &p;
    if (!wait_exit(p, kExitTimeoutMs) || !p.reaped || !WIFEXITED(p.status)) return -1;
    return WEXITSTATUS(p.status);
  }
};

TEST_F(RsockRunTest, RunsBothEndsAccelerated) { run_pair(run_path()); }

// What make install PREFIX=/usr puts in DESTDIR.
const char* const kInstalled[] = {"/usr/lib/librsock.so",
                                  "/usr/bin/rsock-run",
                                  "/usr/bin/rsockstat",
                                  "/usr/share/man/man1/rsockstat.1",
                                  "/usr/include/rsock.h",
                                  "/usr/share/man/man1/rsock-run.1",
                                  "/usr/share/man/man7/librsock.7",
                                  "/usr/share/doc/librsock/rsock.conf",
                                  "/usr/lib/pkgconfig/librsock.pc"};

// make install into a temporary DESTDIR puts every file in its place; the
// installed rsock-run finds the installed library (../lib) and runs a pair
// that pairs; make uninstall leaves no file behind.
TEST_F(RsockRunTest, InstallsIntoADestdirAndRunsFromThere) {
  const std::string build = lib().substr(0, lib().rfind('/'));
  const std::string root = build.substr(0, build.rfind('/'));
  const std::string dest = dir() + "/dest";
  const std::vector<std::string> vars = {"-C", root, "BUILD=" + build.substr(root.size() + 1),
                                         "DESTDIR=" + dest, "PREFIX=/usr"};
  auto make = [&](const std::string& target) {
    std::vector<std::string> args = vars;
    args.push_back(target);
    Proc& p = spawn("make-" + target, "/usr/bin/make", args, {});
    EXPECT_TRUE(wait_exit(p, 60000)) << "make " << target;
    EXPECT_TRUE(p.exited_ok()) << p.describe();
  };
  make("install");
  if (HasFailure()) return;
  for (const char* f : kInstalled)
    EXPECT_EQ(access((dest + f).c_str(), R_OK), 0) << f << " not installed";
  EXPECT_NE(
      read_file(dest + "/usr/lib/pkgconfig/librsock.pc").find("preload=${libdir}/librsock.so"),
      std::string::npos);
  EXPECT_EQ(read_file(dest + "/usr/share/man/man7/librsock.7").find("@VERSION@"),
            std::string::npos);
  Proc* p = nullptr;
  ASSERT_EQ(run_at(dest + "/usr/bin/rsock-run", "installed",
                   {"/bin/sh", "-c", "echo \"[$LD_PRELOAD]\""}, &p),
            0)
      << p->describe();
  EXPECT_NE(p->out().find(dest + "/usr/lib/librsock.so]"), std::string::npos) << p->out();
  run_pair(dest + "/usr/bin/rsock-run");
  make("uninstall");
  std::string left;
  for (const char* f : kInstalled)
    if (access((dest + f).c_str(), F_OK) == 0) left += std::string(f) + " ";
  EXPECT_EQ(left, "") << "left after make uninstall";
}

void RsockRunTest::run_pair(const std::string& run) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string p = std::to_string(port);
  const std::string rs_stream = progs() + "/rs_stream";
  auto args = [&](const std::string& role, const std::string& seed_tx, const std::string& seed_rx) {
    return std::vector<std::string>{
        "--peers",   "127.0.0.1:" + p, "--stats",  stats_path(), "--",
        rs_stream,   "--role",         role,       "--port",     p,
        "--send",    "100000",         "--expect", "100000",     "--expect-eof",
        "--shut-wr", "--tx-seed",      seed_tx,    "--rx-seed",  seed_rx};
  };
  // Eager pairing (the environment goes through): a connection of the
  // default mode this short ends before its pairing begins.
  Env env = base_env();
  env["RSOCK_TCP_FIRST"] = "0";
  bool ready = false;
  Proc& server = start_server("server", run, args("server", "1", "2"), env, &ready);
  ASSERT_TRUE(ready) << "server: see its output below";
  Proc& client = spawn("client", run, args("client", "2", "1"), env);
  ASSERT_TRUE(wait_exit(client, 30000)) << "client hung";
  ASSERT_TRUE(wait_exit(server, kExitTimeoutMs)) << "server hung";
  ASSERT_TRUE(client.exited_ok()) << "client: see its output below";
  ASSERT_TRUE(server.exited_ok()) << "server: see its output below";
  EXPECT_EQ(to_u64(parse_result(client.out())["received"]), 100000u);
  EXPECT_EQ(to_u64(parse_result(server.out())["received"]), 100000u);
  // The program runs in rsock-run's process (exec): its stats line has
  // rsock-run's pid, and the connection went over shared memory.
  auto cs = stats_of(client);
  auto ss = stats_of(server);
  ASSERT_TRUE(cs && ss);
  EXPECT_EQ(cs->program, "rs_stream");
  expect_paths(*cs, 1, 0, "client");
  expect_paths(*ss, 1, 0, "server");
}

TEST_F(RsockRunTest, ExitsWithTheProgramsStatusAndKeepsThePreload) {
  Proc* p = nullptr;
  EXPECT_EQ(run("status", {"--", "/bin/sh", "-c", "exit 7"}, &p), 7) << p->describe();
  // What LD_PRELOAD held stays, first; ours comes after it, once.
  const std::string other = progs() + "/libearly_ctor.so";
  const Env kept = {
      {"LD_PRELOAD",
       (sanitizers().preload_first.empty() ? "" : sanitizers().preload_first + " ") + other}};
  ASSERT_EQ(run("kept", {"/bin/sh", "-c", "echo \"[$LD_PRELOAD]\""}, &p, kept), 0) << p->describe();
  const std::string out = p->out();
  const size_t at_other = out.find(other), at_ours = out.find(lib());
  ASSERT_NE(at_other, std::string::npos) << out;
  ASSERT_NE(at_ours, std::string::npos) << out;
  EXPECT_LT(at_other, at_ours) << out;
  EXPECT_EQ(out.find(lib(), at_ours + 1), std::string::npos) << "ours twice: " << out;
  ASSERT_EQ(run("again", {"/bin/sh", "-c", "echo \"[$LD_PRELOAD]\""}, &p, {{"LD_PRELOAD", lib()}}),
            0)
      << p->describe();
  EXPECT_EQ(p->out().find(lib(), p->out().find(lib()) + 1), std::string::npos)
      << "ours twice: " << p->out();
}

TEST_F(RsockRunTest, BadInputIsAClearError) {
  struct Case {
    std::vector<std::string> args;
    int status;
    std::string says;
  };
  const std::string marker = dir() + "/ran";
  const std::vector<std::string> touch = {"/usr/bin/touch", marker};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), touch.begin(), touch.end());
    return a;
  };
  const std::vector<Case> cases = {
      {with({"--log-level", "loud", "--"}), 2, "--log-level loud: expected error, warn"},
      {with({"--conf", dir() + "/missing.conf"}), 2, "missing.conf: not a readable file"},
      {with({"--bogus"}), 2, "unknown option --bogus"},
      {{"--peers"}, 2, "--peers needs a value"},
      {{}, 2, "no program to run"},
      {{"--", dir() + "/no-such-program"}, 127, "no-such-program: command not found"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    Proc* p = nullptr;
    EXPECT_EQ(run("bad" + std::to_string(i), cases[i].args, &p), cases[i].status) << p->describe();
    EXPECT_NE(p->err().find(cases[i].says), std::string::npos) << p->err();
  }
  EXPECT_NE(access(marker.c_str(), F_OK), 0) << "a program ran despite the bad input";
  Proc* p = nullptr;
  ASSERT_EQ(run("version", {"--version"}, &p), 0);
  EXPECT_EQ(p->out().rfind("rsock-run (librsock) ", 0), 0u) << p->out();
}

// A plain `make` on a machine without the build packages (.ci/deps.sh
// build, before the first object) names the missing ones and the command
// that installs them, and fails, installing nothing. A dpkg-query of the
// test's own says which are installed.
TEST_F(RsockRunTest, PlainMakeNamesTheMissingPackages) {
  const std::string root = lib().substr(0, lib().rfind('/', lib().rfind('/') - 1));
  const std::string script = root + "/.ci/deps.sh";
  ASSERT_EQ(access(script.c_str(), R_OK), 0) << script;
  const std::string bin = dir() + "/bin";
  ASSERT_EQ(mkdir(bin.c_str(), 0755), 0);
  {
    std::ofstream f(bin + "/dpkg-query");
    f << "#!/bin/sh\n"
         "for a; do pkg=$a; done\n"
         "case $pkg in libibverbs-dev|librdmacm-dev) exit 1 ;; esac\n"
         "printf 'ii '\n";
  }
  ASSERT_EQ(chmod((bin + "/dpkg-query").c_str(), 0755), 0);
  const std::string path = bin + ":/usr/bin:/bin";
  Proc& p = spawn("deps", "/bin/bash", {script, "build"}, {{"PATH", path}});
  ASSERT_TRUE(wait_exit(p, kExitTimeoutMs));
  ASSERT_TRUE(p.reaped && WIFEXITED(p.status)) << p.describe();
  EXPECT_EQ(WEXITSTATUS(p.status), 1) << p.describe();
  EXPECT_NE(p.err().find("missing Debian packages: libibverbs-dev librdmacm-dev"),
            std::string::npos)
      << p.err();
  EXPECT_NE(p.err().find("apt-get install -y --no-install-recommends libibverbs-dev "
                         "librdmacm-dev"),
            std::string::npos)
      << p.err();
  // With everything there it says nothing.
  {
    std::ofstream f(bin + "/dpkg-query");
    f << "#!/bin/sh\nprintf 'ii '\n";
  }
  Proc& ok = spawn("deps-ok", "/bin/bash", {script, "build"}, {{"PATH", path}});
  ASSERT_TRUE(wait_exit(ok, kExitTimeoutMs));
  EXPECT_TRUE(ok.exited_ok()) << ok.describe();
  EXPECT_EQ(ok.err(), "");
}

}  // namespace
}  // namespace rsock_test
