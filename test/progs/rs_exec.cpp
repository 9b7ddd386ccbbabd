// rs_exec: an accelerated connection inherited through exec, driven by
// test/preload/intercept_test.cpp.
//
// Client cases (--case): the client connects A (127.0.0.1:PORT, the
// connection under test) and, while bytes are in flight in both directions
// (the server has written S1 bytes, of which the client read only the
// first kRead1; the client wrote C1 bytes that the server will read only
// after the exec), replaces or spawns itself as stage 2:
//   execve, execl, execle, execlp, execvp, fexecve, execveat
//                           this process execs (argv[0] "rs_exec2")
//   spawn                   posix_spawn a child, close A here, wait for it
// Stage 2 reads the rest of S1 and checks it (execve: the fd was made
// O_NONBLOCK before the exec, execl: it got SO_RCVTIMEO, and stage 2 checks
// that they still apply), tells the server on the plain
// control connection T (127.0.0.1:PORT2) that it runs, writes C2, shuts down
// writing, reads S2 to EOF and checks it; it prints "STAGE2 ok".
// The server checks C1 + C2 and prints "SERVER ok".
//   forge_unsealed, forge_other, forge_rdma   stage 1 execs with the raw
//                   syscall and a forged RSOCK_EXEC_HANDOFF naming A: a memfd
//                   that is not a region, the region of another accelerated
//                   connection B, or A described as an RDMA connection.
//                   Stage 2 expects every call on A to fail (ECONNRESET) and
//                   prints "STAGE2 lost".
//   held            the server writes kHeld bytes and reads nothing; the
//                   client, O_NONBLOCK, writes until EAGAIN and waits in
//                   poll for POLLOUT alone, again, until it holds bytes of
//                   the server's that it has not read (FIONREAD past the
//                   64 KiB ring the test configures: librsock took them out
//                   of its full ring), then execl's stage 2, which expects
//                   the connection lost ("STAGE2 lost"): the held bytes were
//                   in stage 1's memory only.
//   inetd           the server forks per connection; the child puts A on
//                   stdin and stdout, closefrom(3), and execs "rs_exec_echo"
//                   (--role echo), which answers every byte read with
//                   byte ^ 0x5a using read(0)/write(1). The client checks the
//                   echo of 3 MiB.
//
// Usage: rs_exec --role server --port P --port2 P2 --case NAME
//        rs_exec --role client --port P --port2 P2 --case NAME
//        rs_exec --role inetd --port P       (server of the inetd case)
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

#include "progs.h"

namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint8_t stream_byte(uint64_t seed, uint64_t pos) {
  uint64_t w = mix64(seed * 0xD1B54A32D192ED03ull + ((pos >> 3) + 1) * 0x9E3779B97F4A7C15ull);
  return static_cast<uint8_t>(w >> (8 * (pos & 7)));
}

constexpr uint64_t kS1 = 200000, kS2 = 300000, kC1 = 150000, kC2 = 100000, kRead1 = 1000;
constexpr uint64_t kHeld = 1 << 20;  // held: what the server writes
constexpr int kHeldRing = 64 << 10;  // held: RSOCK_RING_SIZE the test sets
constexpr uint64_t kSeedS = 21, kSeedC = 22, kSeedS2 = 23, kSeedEcho = 31;
constexpr uint64_t kEchoBytes = 3 * 1024 * 1024;

std::string g_role = "?", g_case = "?";

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > static_cast<int>(sizeof buf) - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  ssize_t r = ::write(g_role == "echo" ? 2 : 1, buf, static_cast<size_t>(n));
  (void)r;
}

[[noreturn]] void die(int line, const char* what, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
[[noreturn]] void die(int line, const char* what, const char* fmt, ...) {
  const int saved = errno;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  dprintf(2, "FAIL rs_exec[%s/%s] line %d: %s: %s (errno %d %s)\n", g_role.c_str(), g_case.c_str(),
          line, what, msg, saved, strerror(saved));
  _exit(1);
}

#define CHECK(cond, ...)                            \
  do {                                              \
    if (!(cond)) die(__LINE__, #cond, __VA_ARGS__); \
  } while (0)

int listen_on(int port) {
  int s = listen_loopback(port, 8, SOCK_CLOEXEC);
  CHECK(s >= 0, "listen on %d", port);
  return s;
}

int connect_to(int port, bool cloexec) {
  int s = socket(AF_INET, SOCK_STREAM | (cloexec ? SOCK_CLOEXEC : 0), 0);
  CHECK(s >= 0, "socket");
  sockaddr_in a = loopback(port);
  CHECK(connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0, "connect %d", port);
  return s;
}

// Writes n bytes of stream seed from position `from`. reset_ok: a reset of
// the connection (ECONNRESET, EPIPE) ends the stream early without failing.
void send_stream(int fd, uint64_t seed, uint64_t from, uint64_t n, bool reset_ok = false) {
  uint8_t buf[16384];
  while (n > 0) {
    size_t k = std::min<uint64_t>(sizeof buf, n);
    for (size_t i = 0; i < k; ++i) buf[i] = stream_byte(seed, from + i);
    size_t done = 0;
    while (done < k) {
      ssize_t w = write(fd, buf + done, k - done);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && reset_ok && (errno == ECONNRESET || errno == EPIPE)) return;
      CHECK(w > 0, "write");
      done += static_cast<size_t>(w);
    }
    from += k;
    n -= k;
  }
}

// Reads exactly n bytes of stream seed from position `from` and checks them.
void expect_stream(int fd, uint64_t seed, uint64_t from, uint64_t n, const char* what) {
  uint8_t buf[16384];
  uint64_t pos = from;
  while (pos < from + n) {
    size_t k = std::min<uint64_t>(sizeof buf, from + n - pos);
    ssize_t r = read(fd, buf, k);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) {  // a nonblocking fd: wait for the rest
      pollfd p = {fd, POLLIN, 0};
      CHECK(poll(&p, 1, 20000) == 1, "%s: POLLIN", what);
      continue;
    }
    CHECK(r > 0, "%s: read at %llu of [%llu, %llu)", what, (unsigned long long)pos,
          (unsigned long long)from, (unsigned long long)(from + n));
    for (ssize_t i = 0; i < r; ++i)
      CHECK(buf[i] == stream_byte(seed, pos + i), "%s: byte %llu differs", what,
            (unsigned long long)(pos + i));
    pos += static_cast<uint64_t>(r);
  }
}

void expect_eof(int fd, const char* what) {
  char c;
  ssize_t r;
  do {
    r = read(fd, &c, 1);
  } while (r < 0 && errno == EINTR);
  CHECK(r == 0, "%s: EOF expected (got %zd)", what, r);
}

// ---- server -------------------------------------------------------------------

int run_server(int port, int port2) {
  int l = listen_on(port), lt = listen_on(port2);
  say("READY");
  int a = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
  CHECK(a >= 0, "accept A");
  const bool forged = g_case.rfind("forge", 0) == 0 || g_case == "held";
  // A forged hand-off makes stage 2 reset the connection as soon as it
  // runs, which can be before this process has written all of S1 (its
  // first write alone carries the 1000 bytes stage 1 reads).
  send_stream(a, kSeedS, 0, g_case == "held" ? kHeld : kS1, forged);
  if (forged) {
    int b = g_case == "forge_other" ? accept4(lt, nullptr, nullptr, SOCK_CLOEXEC) : -1;
    (void)b;
    // Stage 2 cannot use A: it closes, and so does the connection.
    char buf[4096];
    while (read(a, buf, sizeof buf) > 0) {
    }
    say("SERVER done");
    return 0;
  }
  // C1 stays unread until stage 2 says it runs.
  int t = accept4(lt, nullptr, nullptr, SOCK_CLOEXEC);
  CHECK(t >= 0, "accept T");
  char go[8] = {};
  CHECK(read(t, go, 3) == 3 && memcmp(go, "go\n", 3) == 0, "go line");
  expect_stream(a, kSeedC, 0, kC1 + kC2, "C1+C2");
  expect_eof(a, "client shut down writing");
  send_stream(a, kSeedS2, 0, kS2);
  close(a);
  say("SERVER ok");
  return 0;
}

// ---- stage 2 ------------------------------------------------------------------

int run_stage2(int fd, int port2) {
  g_role = "stage2";
  struct stat st;
  CHECK(fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode), "fd %d is the inherited socket", fd);
  if (g_case.rfind("forge", 0) == 0 || g_case == "held") {
    char buf[16];
    ssize_t r = read(fd, buf, sizeof buf);
    CHECK(r < 0 && errno == ECONNRESET, "read on a lost connection fails (r=%zd)", r);
    r = write(fd, "x", 1);
    CHECK(r < 0 && (errno == ECONNRESET || errno == EPIPE), "write fails (r=%zd)", r);
    r = send(fd, "x", 1, MSG_NOSIGNAL);
    CHECK(r < 0 && (errno == ECONNRESET || errno == EPIPE), "send fails (r=%zd)", r);
    pollfd p = {fd, POLLIN | POLLOUT, 0};
    CHECK(poll(&p, 1, 5000) == 1 && (p.revents & (POLLERR | POLLHUP)), "poll reports the error");
    say("STAGE2 lost");
    return 0;
  }
  expect_stream(fd, kSeedS, kRead1, kS1 - kRead1, "rest of S1");
  // The fd's flags and timeouts survive exec, and so must their effect:
  // nothing more comes before "go", so a read must not wait (execve:
  // O_NONBLOCK) or must give up after SO_RCVTIMEO (execl).
  if (g_case == "execve") {
    char c;
    CHECK(read(fd, &c, 1) < 0 && errno == EAGAIN, "O_NONBLOCK still applies");
    CHECK(fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0, "blocking again");
  } else if (g_case == "execl") {
    char c;
    CHECK(read(fd, &c, 1) < 0 && errno == EAGAIN, "SO_RCVTIMEO still applies");
    timeval none = {0, 0};
    CHECK(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none) == 0, "no timeout");
  }
  int t = connect_to(port2, true);
  CHECK(write(t, "go\n", 3) == 3, "go");
  send_stream(fd, kSeedC, kC1, kC2);
  CHECK(shutdown(fd, SHUT_WR) == 0, "shutdown");
  expect_stream(fd, kSeedS2, 0, kS2, "S2");
  expect_eof(fd, "server closed");
  close(t);
  close(fd);
  say("STAGE2 ok");
  return 0;
}

// ---- client stage 1 -----------------------------------------------------------

// A forged hand-off for socket fd (see src/lifecycle/exec_handoff.cpp for
// the format) naming the region at `offset` of memfd as its region.
std::string forged_var(int fd, int memfd, uint64_t offset, uint64_t nonce) {
  struct stat s, m;
  CHECK(fstat(fd, &s) == 0 && fstat(memfd, &m) == 0, "fstat");
  char v[512];
  snprintf(v, sizeof v, "RSOCK_EXEC_HANDOFF=2:x:%d;S,%llu,%llu,%d,%llu,%llu,%llu,c,%llx,0,0",
           static_cast<int>(getpid()), (unsigned long long)s.st_dev, (unsigned long long)s.st_ino,
           memfd, (unsigned long long)m.st_dev, (unsigned long long)m.st_ino,
           (unsigned long long)offset, (unsigned long long)nonce);
  return v;
}

// The open descriptors of this process, from /proc/self/fd (librsock's
// own sit at 1024 and above: common/own_fd.h).
std::vector<int> open_fds() {
  std::vector<int> out;
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return out;
  const int self = dirfd(d);
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    const int fd = atoi(e->d_name);
    if (fd > 2 && fd != self) out.push_back(fd);
  }
  closedir(d);
  return out;
}

// A region in one of librsock's region files (src/transport/shm/arena.h:
// one file holds the regions of a pair of processes, each at an offset).
struct RegionAt {
  int fd;
  ino_t ino;
  uint64_t offset;
  uint64_t nonce;
};

// Every region in the region files this process holds: the file's header
// words at each offset, as src/ring/wire.h lays them out (magic at 0,
// nonce at 16, region_bytes at 48); all regions of a test are one size.
std::vector<RegionAt> regions() {
  std::vector<RegionAt> out;
  for (int fd : open_fds()) {
    char link[256] = {}, path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    if (readlink(path, link, sizeof link - 1) <= 0) continue;
    if (strstr(link, "memfd:rsock-ring") == nullptr) continue;
    struct stat st;
    if (fstat(fd, &st) != 0) continue;
    uint64_t step = 0;
    for (uint64_t off = 0; off + 56 <= static_cast<uint64_t>(st.st_size); off += step) {
      uint64_t h[7];
      if (pread(fd, h, sizeof h, static_cast<off_t>(off)) != static_cast<ssize_t>(sizeof h)) break;
      if (step == 0) step = h[6];
      if (step == 0 || step % 4096 != 0) break;
      if (h[0] != 0) out.push_back({fd, st.st_ino, off, h[2]});
    }
  }
  return out;
}

// The region of a connection made after `before` was taken: the one region
// that was not there then.
bool new_region(const std::vector<RegionAt>& before, RegionAt* found) {
  for (const RegionAt& r : regions()) {
    bool old = false;
    for (const RegionAt& b : before)
      old |= b.ino == r.ino && b.offset == r.offset && b.nonce == r.nonce;
    if (!old) {
      *found = r;
      return true;
    }
  }
  return false;
}

// held: fills the server's ring and waits for room in poll (POLLOUT alone)
// until this process holds bytes of the server's (Stream::relieve), then
// execs stage 2 with them unread.
[[noreturn]] void client_held(const char* self, int a, int port2) {
  CHECK(fcntl(a, F_SETFL, fcntl(a, F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK");
  std::vector<uint8_t> junk(16384, 0x5a);
  int queued = 0;
  for (int i = 0; i < 200 && queued <= kHeldRing; ++i) {
    while (write(a, junk.data(), junk.size()) > 0) {
    }
    CHECK(errno == EAGAIN, "write until the ring is full: %s", strerror(errno));
    pollfd p = {a, POLLOUT, 0};
    CHECK(poll(&p, 1, 50) >= 0, "poll");
    CHECK(ioctl(a, FIONREAD, &queued) == 0, "FIONREAD");
  }
  CHECK(queued > kHeldRing, "no bytes held: %d readable, the ring holds %d", queued, kHeldRing);
  const std::string fd_s = std::to_string(a), p2 = std::to_string(port2);
  execl(self, "rs_exec2", "--stage2", fd_s.c_str(), "--port2", p2.c_str(), "--case", "held",
        static_cast<char*>(nullptr));
  die(__LINE__, "exec", "execl returned");
}

int run_client(const char* self, int port, int port2) {
  g_role = "client";
  // A: inherited (no close-on-exec), the connection under test.
  int a = connect_to(port, false);
  if (g_case == "held") client_held(self, a, port2);
  uint8_t head[kRead1];
  size_t got = 0;
  // The first kRead1 bytes of S1; the rest stays in flight.
  while (got < kRead1) {
    ssize_t r = read(a, head + got, kRead1 - got);
    CHECK(r > 0, "read S1 head");
    got += static_cast<size_t>(r);
  }
  for (size_t i = 0; i < kRead1; ++i) CHECK(head[i] == stream_byte(kSeedS, i), "S1 head");
  send_stream(a, kSeedC, 0, kC1);
  if (g_case == "execve") {
    CHECK(fcntl(a, F_SETFL, fcntl(a, F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK");
  } else if (g_case == "execl") {
    timeval tv = {0, 200000};
    CHECK(setsockopt(a, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0, "SO_RCVTIMEO");
  }
  const std::string fd_s = std::to_string(a), p2 = std::to_string(port2);
  const char* c = g_case.c_str();
  if (g_case == "execve") {
    char* argv[] = {const_cast<char*>("rs_exec2"),
                    const_cast<char*>("--stage2"),
                    const_cast<char*>(fd_s.c_str()),
                    const_cast<char*>("--port2"),
                    const_cast<char*>(p2.c_str()),
                    const_cast<char*>("--case"),
                    const_cast<char*>(c),
                    nullptr};
    execve(self, argv, environ);
  } else if (g_case == "execl") {
    execl(self, "rs_exec2", "--stage2", fd_s.c_str(), "--port2", p2.c_str(), "--case", c,
          static_cast<char*>(nullptr));
  } else if (g_case == "execle") {
    execle(self, "rs_exec2", "--stage2", fd_s.c_str(), "--port2", p2.c_str(), "--case", c,
           static_cast<char*>(nullptr), environ);
  } else if (g_case == "execlp") {
    std::string dir = self;
    setenv("PATH", dir.substr(0, dir.rfind('/')).c_str(), 1);
    execlp("rs_exec", "rs_exec2", "--stage2", fd_s.c_str(), "--port2", p2.c_str(), "--case", c,
           static_cast<char*>(nullptr));
  } else if (g_case == "fexecve" || g_case == "execveat") {
    char* argv[] = {const_cast<char*>("rs_exec2"), const_cast<char*>("--stage2"),
                    const_cast<char*>(fd_s.c_str()), const_cast<char*>("--port2"),
                    const_cast<char*>(p2.c_str()), const_cast<char*>("--case"),
                    const_cast<char*>(c), nullptr};
    if (g_case == "fexecve") {
      int prog = open(self, O_RDONLY | O_CLOEXEC);
      CHECK(prog >= 0, "open self");
      fexecve(prog, argv, environ);
    } else {
      execveat(AT_FDCWD, self, argv, environ, 0);
    }
  } else if (g_case == "execvp") {
    // Through PATH: the directory of this program.
    std::string dir = self;
    dir = dir.substr(0, dir.rfind('/'));
    setenv("PATH", dir.c_str(), 1);
    char* argv[] = {const_cast<char*>("rs_exec2"),
                    const_cast<char*>("--stage2"),
                    const_cast<char*>(fd_s.c_str()),
                    const_cast<char*>("--port2"),
                    const_cast<char*>(p2.c_str()),
                    const_cast<char*>("--case"),
                    const_cast<char*>(c),
                    nullptr};
    // PATH lookup of "rs_exec" (argv[0] is only the name it reports).
    execvp("rs_exec", argv);
  } else if (g_case == "spawn") {
    char* argv[] = {const_cast<char*>("rs_exec2"),
                    const_cast<char*>("--stage2"),
                    const_cast<char*>(fd_s.c_str()),
                    const_cast<char*>("--port2"),
                    const_cast<char*>(p2.c_str()),
                    const_cast<char*>("--case"),
                    const_cast<char*>(c),
                    nullptr};
    pid_t pid = -1;
    CHECK(posix_spawn(&pid, self, nullptr, nullptr, argv, environ) == 0, "posix_spawn");
    close(a);  // the child holds the connection now
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "stage 2 failed (status %d)", status);
    say("CLIENT spawned ok");
    return 0;
  } else if (g_case == "forge_rdma") {
    // What the old image writes for an RDMA connection: it cannot cross exec.
    struct stat st;
    CHECK(fstat(a, &st) == 0, "fstat");
    char var[256];
    snprintf(var, sizeof var, "RSOCK_EXEC_HANDOFF=2:x:%d;L,%llu,%llu,rdma",
             static_cast<int>(getpid()), (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino);
    std::vector<char*> env;
    for (char** e = environ; *e; ++e) env.push_back(*e);
    env.push_back(var);
    env.push_back(nullptr);
    char* argv[] = {const_cast<char*>("rs_exec2"),
                    const_cast<char*>("--stage2"),
                    const_cast<char*>(fd_s.c_str()),
                    const_cast<char*>("--port2"),
                    const_cast<char*>(p2.c_str()),
                    const_cast<char*>("--case"),
                    const_cast<char*>(c),
                    nullptr};
    syscall(SYS_execve, self, argv, env.data());
  } else if (g_case == "forge_unsealed" || g_case == "forge_other") {
    int memfd;
    uint64_t nonce = 0x1234abcd, offset = 0;
    if (g_case == "forge_unsealed") {
      memfd = static_cast<int>(syscall(SYS_memfd_create, "rsock-ring", 0));
      CHECK(memfd >= 0 && ftruncate(memfd, 1 << 21) == 0, "memfd");
    } else {
      // Another accelerated connection B (the tests name PORT2 in the rule
      // for this case), and its region: the right magic, seals and nonce,
      // but the 4-tuple of B, not of A.
      const std::vector<RegionAt> before = regions();
      int b = connect_to(port2, false);
      (void)b;
      RegionAt r;
      CHECK(new_region(before, &r), "B's region (is B accelerated?)");
      offset = r.offset;
      nonce = r.nonce;
      memfd = fcntl(r.fd, F_DUPFD, 100);
    }
    std::string var = forged_var(a, memfd, offset, nonce);
    std::vector<char*> env;
    for (char** e = environ; *e; ++e) env.push_back(*e);
    env.push_back(const_cast<char*>(var.c_str()));
    env.push_back(nullptr);
    char* argv[] = {const_cast<char*>("rs_exec2"),
                    const_cast<char*>("--stage2"),
                    const_cast<char*>(fd_s.c_str()),
                    const_cast<char*>("--port2"),
                    const_cast<char*>(p2.c_str()),
                    const_cast<char*>("--case"),
                    const_cast<char*>(c),
                    nullptr};
    // The raw system call: librsock's execve would replace the variable.
    syscall(SYS_execve, self, argv, env.data());
  }
  die(__LINE__, "exec", "%s returned", c);
}

// ---- inetd --------------------------------------------------------------------

int run_inetd(const char* self, int port) {
  int l = listen_on(port);
  say("READY");
  int a = accept(l, nullptr, nullptr);
  CHECK(a >= 0, "accept");
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    CHECK(dup2(a, 0) == 0 && dup2(a, 1) == 1, "dup2 onto stdio");
    closefrom(3);
    execl(self, "rs_exec_echo", "--role", "echo", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(a);
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "echo failed (status %d)", status);
  say("SERVER ok");
  return 0;
}

int run_echo() {
  uint8_t buf[65536];
  uint64_t total = 0;
  for (;;) {
    ssize_t r = read(0, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    CHECK(r >= 0, "read stdin");
    if (r == 0) break;
    for (ssize_t i = 0; i < r; ++i) buf[i] ^= 0x5a;
    ssize_t done = 0;
    while (done < r) {
      ssize_t w = write(1, buf + done, static_cast<size_t>(r - done));
      if (w < 0 && errno == EINTR) continue;
      CHECK(w > 0, "write stdout");
      done += w;
    }
    total += static_cast<uint64_t>(r);
  }
  say("ECHO %llu", (unsigned long long)total);
  return 0;
}

int run_inetd_client(int port) {
  g_role = "client";
  int a = connect_to(port, true);
  std::thread writer([&] {
    send_stream(a, kSeedEcho, 0, kEchoBytes);
    shutdown(a, SHUT_WR);
  });
  uint8_t buf[65536];
  uint64_t pos = 0;
  for (;;) {
    ssize_t r = read(a, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    CHECK(r >= 0, "read echo");
    if (r == 0) break;
    for (ssize_t i = 0; i < r; ++i)
      CHECK(buf[i] == (stream_byte(kSeedEcho, pos + i) ^ 0x5a), "echo byte %llu",
            (unsigned long long)(pos + i));
    pos += static_cast<uint64_t>(r);
  }
  writer.join();
  CHECK(pos == kEchoBytes, "echoed %llu of %llu", (unsigned long long)pos,
        (unsigned long long)kEchoBytes);
  say("CLIENT ok");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0, port2 = 0, stage2_fd = -1;
  std::string role;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--role") role = argv[i + 1];
    if (k == "--port") port = atoi(argv[i + 1]);
    if (k == "--port2") port2 = atoi(argv[i + 1]);
    if (k == "--case") g_case = argv[i + 1];
    if (k == "--stage2") stage2_fd = atoi(argv[i + 1]);
  }
  g_role = role;
  signal(SIGPIPE, SIG_IGN);
  // The program's own path, for exec (argv[0] is a name only).
  char self[4096] = {};
  if (readlink("/proc/self/exe", self, sizeof self - 1) <= 0) return 2;
  if (stage2_fd >= 0) return run_stage2(stage2_fd, port2);
  if (role == "server") return run_server(port, port2);
  if (role == "client" && g_case == "inetd") return run_inetd_client(port);
  if (role == "client") return run_client(self, port, port2);
  if (role == "inetd") return run_inetd(self, port);
  if (role == "echo") return run_echo();
  fprintf(stderr, "usage: see the header of rs_exec.cpp\n");
  return 2;
}
