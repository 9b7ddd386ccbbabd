// rs_move: servers of the process models that move a connection to another
// process, for the soft-RoCE tier (test/rdma/run.sh: cases fork-*, inetd,
// both-write). Plain POSIX calls only: it behaves the same with or without
// librsock preloaded. Clients are rs_stream (echo, checked by equal seeds)
// and, for both-write, rs_move --role records.
//
//   rs_move --role fork --addr A --port P --count N --close before|after|never
//           --child-exit close|exit|_exit [--parent-exit]
//       fork per connection: accepts N connections one after the other; for
//       each it forks a child that echoes it until EOF, and closes its own
//       copy at once: before the child's first call (before), or once the
//       child's first read returned (after; the child says so on a pipe);
//       or keeps it (never: with --parent-exit, its exit lets it go).
//       The child then ends with close() and exit(0) (close), or without
//       closing the connection: exit(0) (exit) or _exit(0) (_exit).
//       Prints "READY", per connection "CONN i child=PID" and, from the
//       child, "CONN i echoed=BYTES end=eof|<errno text>". Exit 0 when every
//       child exited 0 (its connection ended with EOF after all its bytes).
//       --parent-exit: the parent exits (0) right after its last close,
//       leaving the children to serve on their own.
//   rs_move --role inetd --addr A --port P --count N
//       inetd: per connection, fork; the child puts the connection on stdin
//       and stdout, closes every other descriptor (closefrom) and execs itself as
//       "rs_move_echo" (--role echo-stdio); the parent closes its copy at
//       once.
//   rs_move --role echo-stdio
//       echoes read(0) to write(1) until EOF; prints "ECHO BYTES" to stderr,
//       exit 0 iff it ended with EOF.
//   rs_move --role both-write --addr A --port P
//       accepts one connection and forks; parent and child both write
//       64-byte records on it (parent tag P, child tag C, sequence numbers
//       from 0, checksummed). The parent writes until a write fails (or
//       kMaxParent records); the child starts once the parent has written
//       kHead records, writes kChild, shuts down writing and exits (with
//       --hold: only once the parent's writes have ended). Prints
//       "PARENT wrote=N end=done|<errno name>" and "CHILD wrote=M end=...".
//   rs_move --role handback --addr A --port P --child-exit close|exit
//       one process after the other: accepts one connection, writes kHead
//       records (tag P), forks; the child writes kChild records (tag C) and
//       ends with close() and exit(0) (close) or exit(0) alone (exit); the
//       parent waits for it, then writes kHead more records (P, sequence
//       going on) and closes. Prints "PARENT wrote=N end=..." and "CHILD
//       wrote=M end=...". Exit 0 iff every write of both succeeded.
//   rs_move --role records --addr A --port P
//       connects, reads records to EOF and checks each: "RECORDS P=N C=M
//       bad=K" (bad: a torn or corrupt record, or a sequence that is not
//       0, 1, 2... for either tag). Exit 0 iff bad=0.
// Every wait is bounded (kWaitMs); SIGPIPE is ignored.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

constexpr int kWaitMs = 60000;
constexpr size_t kRecord = 64;
constexpr uint32_t kHead = 200;    // parent records before the child starts
constexpr uint32_t kChild = 2000;  // child records
constexpr uint32_t kMaxParent = 200000;

std::string g_self;

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
  (void)!::write(1, buf, static_cast<size_t>(n));
}

const char* errno_name(int e) {
  switch (e) {
    case ECONNRESET:
      return "ECONNRESET";
    case EPIPE:
      return "EPIPE";
    case ETIMEDOUT:
      return "ETIMEDOUT";
    default:
      return strerror(e);
  }
}

int listen_on(const std::string& addr, int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
  if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(s, 16) != 0) {
    fprintf(stderr, "rs_move: bind/listen %s:%d: %s\n", addr.c_str(), port, strerror(errno));
    exit(1);
  }
  return s;
}

int accept_one(int ls) {
  pollfd p{ls, POLLIN, 0};
  if (poll(&p, 1, 4 * kWaitMs) != 1) return -1;
  int c;
  do c = accept(ls, nullptr, nullptr);
  while (c < 0 && errno == EINTR);
  return c;
}

bool write_all(int fd, const uint8_t* p, size_t n, int* err) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *err = w < 0 ? errno : EPIPE;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Echoes in -> out until EOF; "eof" or the errno text.
std::string echo(int in, int out, unsigned long long* echoed, int signal_fd) {
  std::vector<uint8_t> buf(64 << 10);
  for (;;) {
    ssize_t r = ::read(in, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (signal_fd >= 0) {  // our first call returned: the connection is ours
      (void)!::write(signal_fd, "t", 1);
      close(signal_fd);
      signal_fd = -1;
    }
    if (r < 0) return strerror(errno);
    if (r == 0) return "eof";
    int err = 0;
    if (!write_all(out, buf.data(), static_cast<size_t>(r), &err)) return strerror(err);
    *echoed += static_cast<unsigned long long>(r);
  }
}

bool wait_pid(pid_t pid) {
  int st = 0;
  for (int i = 0; i < 4 * kWaitMs / 10; ++i) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) && WEXITSTATUS(st) == 0;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &st, 0);
  return false;
}

int run_fork(const std::string& addr, int port, int count, const std::string& close_when,
             const std::string& child_exit, bool parent_exit) {
  int ls = listen_on(addr, port);
  say("READY");
  std::vector<pid_t> kids;
  for (int i = 1; i <= count; ++i) {
    int c = accept_one(ls);
    if (c < 0) {
      fprintf(stderr, "rs_move: accept: %s\n", strerror(errno));
      return 1;
    }
    int took[2] = {-1, -1};
    if (close_when == "after" && pipe(took) != 0) return 1;
    pid_t pid = fork();
    if (pid == 0) {
      close(ls);
      if (took[0] >= 0) close(took[0]);
      unsigned long long echoed = 0;
      const std::string end = echo(c, c, &echoed, took[1]);
      say("CONN %d echoed=%llu end=%s", i, echoed, end.c_str());
      const int rc = end == "eof" ? 0 : 1;
      if (child_exit == "close") {
        close(c);
        exit(rc);
      }
      if (child_exit == "exit") exit(rc);  // without closing it
      _exit(rc);                           // neither closing nor exit handlers
    }
    say("CONN %d child=%d", i, static_cast<int>(pid));
    if (took[1] >= 0) {
      close(took[1]);
      char b;
      pollfd p{took[0], POLLIN, 0};
      if (poll(&p, 1, kWaitMs) != 1 || ::read(took[0], &b, 1) != 1)
        fprintf(stderr, "rs_move: the child never made its first call\n");
      close(took[0]);
    }
    if (close_when != "never") close(c);  // our copy goes at once
    kids.push_back(pid);
  }
  if (parent_exit) {
    say("PARENT exits");
    exit(0);  // (--close never: with the connections still open)
  }
  bool ok = true;
  for (pid_t k : kids) ok &= wait_pid(k);
  close(ls);
  return ok ? 0 : 1;
}

int run_inetd(const std::string& addr, int port, int count) {
  int ls = listen_on(addr, port);
  say("READY");
  std::vector<pid_t> kids;
  for (int i = 1; i <= count; ++i) {
    int c = accept_one(ls);
    if (c < 0) return 1;
    pid_t pid = fork();
    if (pid == 0) {
      dup2(c, 0);
      dup2(c, 1);
      closefrom(3);
      char* const argv[] = {const_cast<char*>("rs_move_echo"), const_cast<char*>("--role"),
                            const_cast<char*>("echo-stdio"), nullptr};
      execv(g_self.c_str(), argv);
      _exit(127);
    }
    say("CONN %d child=%d", i, static_cast<int>(pid));
    close(c);
    kids.push_back(pid);
  }
  bool ok = true;
  for (pid_t k : kids) ok &= wait_pid(k);
  say("INETD %s", ok ? "ok" : "failed");
  close(ls);
  return ok ? 0 : 1;
}

int run_echo_stdio() {
  unsigned long long echoed = 0;
  const std::string end = echo(0, 1, &echoed, -1);
  fprintf(stderr, "ECHO %llu end=%s\n", echoed, end.c_str());
  return end == "eof" ? 0 : 1;
}

// ---- records ------------------------------------------------------------------

uint32_t sum32(const uint8_t* p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

void make_record(uint8_t* r, char tag, uint32_t seq) {
  memset(r, 0, kRecord);
  r[0] = static_cast<uint8_t>(tag);
  memcpy(r + 4, &seq, 4);
  for (size_t i = 8; i < kRecord - 4; ++i) r[i] = static_cast<uint8_t>(seq * 31 + i + tag);
  const uint32_t s = sum32(r, kRecord - 4);
  memcpy(r + kRecord - 4, &s, 4);
}

int run_both_write(const std::string& addr, int port, bool hold) {
  int ls = listen_on(addr, port);
  say("READY");
  int c = accept_one(ls);
  if (c < 0) return 1;
  int go[2], done[2];
  if (pipe(go) != 0 || pipe(done) != 0) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    close(go[1]);
    close(done[1]);
    char b;
    pollfd p{go[0], POLLIN, 0};
    if (poll(&p, 1, kWaitMs) != 1 || ::read(go[0], &b, 1) != 1) _exit(3);
    uint8_t r[kRecord];
    uint32_t n = 0;
    int err = 0;
    for (; n < kChild; ++n) {
      make_record(r, 'C', n);
      if (!write_all(c, r, kRecord, &err)) break;
    }
    say("CHILD wrote=%u end=%s", n, n == kChild ? "done" : errno_name(err));
    if (hold) {
      pollfd q{done[0], POLLIN, 0};
      (void)poll(&q, 1, kWaitMs);
    }
    shutdown(c, SHUT_WR);
    close(c);
    exit(n == kChild ? 0 : 1);
  }
  close(go[0]);
  close(done[0]);
  uint8_t r[kRecord];
  uint32_t n = 0;
  int err = 0;
  for (; n < kMaxParent; ++n) {
    if (n == kHead) (void)!::write(go[1], "g", 1);
    make_record(r, 'P', n);
    if (!write_all(c, r, kRecord, &err)) break;
    if (n > kHead) usleep(200);  // both write for a while
  }
  say("PARENT wrote=%u end=%s", n, n == kMaxParent ? "done" : errno_name(err));
  close(go[1]);
  close(done[1]);
  close(c);
  const bool child_ok = wait_pid(pid);
  close(ls);
  return child_ok ? 0 : 1;
}

int run_handback(const std::string& addr, int port, const std::string& child_exit) {
  int ls = listen_on(addr, port);
  say("READY");
  int c = accept_one(ls);
  if (c < 0) return 1;
  uint8_t r[kRecord];
  uint32_t n = 0;
  int err = 0;
  bool ok = true;
  for (; n < kHead && ok; ++n) {
    make_record(r, 'P', n);
    ok = write_all(c, r, kRecord, &err);
  }
  if (!ok) {
    say("PARENT wrote=%u end=%s", n - 1, errno_name(err));
    return 1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    uint32_t m = 0;
    for (; m < kChild; ++m) {
      make_record(r, 'C', m);
      if (!write_all(c, r, kRecord, &err)) break;
    }
    say("CHILD wrote=%u end=%s", m, m == kChild ? "done" : errno_name(err));
    if (child_exit == "close") close(c);
    exit(m == kChild ? 0 : 1);
  }
  const bool child_ok = wait_pid(pid);
  for (; n < 2 * kHead && ok; ++n) {
    make_record(r, 'P', n);
    ok = write_all(c, r, kRecord, &err);
  }
  if (!ok) --n;
  say("PARENT wrote=%u end=%s", n, ok ? "done" : errno_name(err));
  close(c);
  close(ls);
  return child_ok && ok ? 0 : 1;
}

int run_records(const std::string& addr, int port) {
  int s = -1;
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
  for (int i = 0; i < 50; ++i) {
    s = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) break;
    close(s);
    s = -1;
    usleep(200000);
  }
  if (s < 0) return 1;
  uint32_t next_p = 0, next_c = 0, bad = 0;
  uint8_t r[kRecord];
  size_t have = 0;
  for (;;) {
    pollfd p{s, POLLIN, 0};
    if (poll(&p, 1, kWaitMs) != 1) {
      fprintf(stderr, "rs_move: records: no data for %d ms\n", kWaitMs);
      ++bad;
      break;
    }
    ssize_t n = ::read(s, r + have, kRecord - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      fprintf(stderr, "rs_move: records: read: %s\n", strerror(errno));
      ++bad;
      break;
    }
    if (n == 0) {
      if (have) ++bad;  // a torn record at the end
      break;
    }
    have += static_cast<size_t>(n);
    if (have < kRecord) continue;
    have = 0;
    uint32_t seq, sum;
    memcpy(&seq, r + 4, 4);
    memcpy(&sum, r + kRecord - 4, 4);
    uint8_t want[kRecord];
    make_record(want, static_cast<char>(r[0]), seq);
    if ((r[0] != 'P' && r[0] != 'C') || sum != sum32(r, kRecord - 4) ||
        memcmp(r, want, kRecord) != 0) {
      ++bad;
      continue;
    }
    uint32_t& next = r[0] == 'P' ? next_p : next_c;
    if (seq != next) ++bad;
    next = seq + 1;
  }
  say("RECORDS P=%u C=%u bad=%u", next_p, next_c, bad);
  close(s);
  return bad == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  g_self = "/proc/self/exe";
  char path[4096];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n > 0) g_self.assign(path, static_cast<size_t>(n));
  std::string role, addr = "127.0.0.1", close_when = "before", child_exit = "close";
  int port = 0, count = 1;
  bool parent_exit = false, hold = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--role")
      role = next();
    else if (a == "--addr")
      addr = next();
    else if (a == "--port")
      port = atoi(next().c_str());
    else if (a == "--count")
      count = atoi(next().c_str());
    else if (a == "--close")
      close_when = next();
    else if (a == "--child-exit")
      child_exit = next();
    else if (a == "--parent-exit")
      parent_exit = true;
    else if (a == "--hold")
      hold = true;
    else {
      fprintf(stderr, "rs_move: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  if (role == "fork") return run_fork(addr, port, count, close_when, child_exit, parent_exit);
  if (role == "inetd") return run_inetd(addr, port, count);
  if (role == "echo-stdio") return run_echo_stdio();
  if (role == "both-write") return run_both_write(addr, port, hold);
  if (role == "handback") return run_handback(addr, port, child_exit);
  if (role == "records") return run_records(addr, port);
  fprintf(stderr, "usage: see the header of test/progs/rs_move.cpp\n");
  return 2;
}
