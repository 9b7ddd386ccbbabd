// rs_close: how the end of a TCP connection looks to a program, as a
// transcript. Driven by test/preload/close_test.cpp, which runs it once on
// plain TCP and once under librsock and compares the transcripts line by
// line (DESIGN.md invariant 10). Plain POSIX calls only.
//
// The process (the prober, "we") listens on --port. For each scenario it
// forks a peer, which connects; the prober accepts (U, the socket probed)
// and commands the peer over a pipe:
//   send N     write N bytes               read N     read exactly N bytes
//   readeof    read until EOF              shutwr     shutdown(SHUT_WR)
//   linger0    SO_LINGER {1, 0}            close      close(2) the socket
//   recvwait   block in recv (to be killed) exit      exit(0), the socket open
// Steps of a scenario, run in order:
//   send N        we write N bytes (blocking; must all go)
//   peer CMD      a command to the peer, waited for (see above)
//   exit, kill    the peer exits (exit(0)) or is SIGKILLed; we reap it, then
//                 wait 50 ms: its kernel sends FIN or RST meanwhile
//   pause         50 ms, for an RST our last write drew
//   shutrd/shutwr our shutdown(2); its result is printed
//   fill          we write (nonblocking) until the socket takes no more
//   bg-recv, bg-send  a blocking recv / 1-byte send in a thread, which is
//                 asleep in the kernel before the next step (bg-send fills
//                 again until it is); join prints its result
// and probes, each printing one line "<scenario> <step> <probe>: <result>":
//   poll, poll-   poll(2) revents for IN|OUT|PRI|RDHUP (poll-: without RDHUP)
//   epoll, epoll- level-triggered epoll_wait (with/without EPOLLRDHUP)
//   et            an edge-triggered set registered at the start (RDHUP too)
//   read          recv(MSG_DONTWAIT) of up to 64 bytes: count or errno
//   write         send(MSG_NOSIGNAL | MSG_DONTWAIT) of 10 bytes
//   write!        write(2) of 10 bytes (SIGPIPE counted, not fatal)
//   soerr         getsockopt(SO_ERROR)
//   peername      getpeername(2): ok or its errno
// Deterministic: the peer has acted (or exited and been reaped) before a
// probe runs, and every probe that follows a reset waits for it to arrive.
//
// Usage: rs_close --port P [--only NAME]
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
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "progs.h"

namespace {

[[noreturn]] void die(int line, const char* what) {
  fprintf(stderr, "FAIL rs_close line %d: %s (errno %d %s)\n", line, what, errno, strerror(errno));
  fflush(stderr);
  _exit(1);
}
#define CHECK(cond)                    \
  do {                                 \
    if (!(cond)) die(__LINE__, #cond); \
  } while (0)

void say(const std::string& s) {
  std::string l = s + "\n";
  (void)!::write(1, l.data(), l.size());
}

void sleep_ms(int ms) {
  timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

std::string errname(int e) {
  switch (e) {
    case EAGAIN:
      return "EAGAIN";
    case EPIPE:
      return "EPIPE";
    case ECONNRESET:
      return "ECONNRESET";
    case ENOTCONN:
      return "ENOTCONN";
    case EINTR:
      return "EINTR";
    case 0:
      return "0";
    default:
      return "errno" + std::to_string(e);
  }
}

std::string result(long r, int err) { return r >= 0 ? std::to_string(r) : errname(err); }

std::string poll_bits(int m) {
  static const struct {
    int bit;
    const char* name;
  } kBits[] = {{POLLIN, "IN"},   {POLLPRI, "PRI"},     {POLLOUT, "OUT"},  {POLLERR, "ERR"},
               {POLLHUP, "HUP"}, {POLLRDHUP, "RDHUP"}, {POLLNVAL, "NVAL"}};
  std::string s;
  for (auto& b : kBits)
    if (m & b.bit) s += (s.empty() ? "" : "|") + std::string(b.name);
  return s.empty() ? "none" : s;
}

std::string epoll_bits(uint32_t m) {
  static const struct {
    uint32_t bit;
    const char* name;
  } kBits[] = {{EPOLLIN, "IN"},   {EPOLLPRI, "PRI"}, {EPOLLOUT, "OUT"},
               {EPOLLERR, "ERR"}, {EPOLLHUP, "HUP"}, {EPOLLRDHUP, "RDHUP"}};
  std::string s;
  for (auto& b : kBits)
    if (m & b.bit) s += (s.empty() ? "" : "|") + std::string(b.name);
  return s.empty() ? "none" : s;
}

// ---- pipes ----------------------------------------------------------------------------

void put_line(int fd, const std::string& s) {
  std::string l = s + "\n";
  CHECK(write(fd, l.data(), l.size()) == static_cast<ssize_t>(l.size()));
}

std::string get_line(int fd, int timeout_ms = 20000) {
  std::string line;
  const int64_t end = now_ms() + timeout_ms;
  for (;;) {
    pollfd p = {fd, POLLIN, 0};
    int left = static_cast<int>(end - now_ms());
    CHECK(left > 0);
    int n = poll(&p, 1, left);
    if (n < 0 && errno == EINTR) continue;
    CHECK(n == 1);
    char c;
    ssize_t r = read(fd, &c, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return "<eof>";
    CHECK(r == 1);
    if (c == '\n') return line;
    line.push_back(c);
  }
}

// ---- the peer -----------------------------------------------------------------------

[[noreturn]] void run_peer(int port, int cmd_fd, int reply_fd) {
  signal(SIGPIPE, SIG_IGN);
  int a = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(a >= 0);
  sockaddr_in sa = loopback(port);
  CHECK(connect(a, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  put_line(reply_fd, "ready");
  static char buf[1 << 16];
  for (;;) {
    std::string line = get_line(cmd_fd, 60000);
    char word[32] = {};
    long x = 0;
    sscanf(line.c_str(), "%31s %ld", word, &x);
    const std::string w = word;
    if (w == "<eof>") _exit(3);
    if (w == "send") {
      memset(buf, 'p', static_cast<size_t>(x));
      CHECK(send(a, buf, static_cast<size_t>(x), 0) == x);
      put_line(reply_fd, "ok");
    } else if (w == "read") {
      long got = 0;
      while (got < x) {
        ssize_t r = recv(a, buf, static_cast<size_t>(x - got), 0);
        CHECK(r > 0);
        got += r;
      }
      put_line(reply_fd, "ok");
    } else if (w == "readeof") {
      long got = 0;
      for (;;) {
        ssize_t r = recv(a, buf, sizeof buf, 0);
        if (r <= 0) break;
        got += r;
      }
      put_line(reply_fd, "eof " + std::to_string(got));
    } else if (w == "shutwr") {
      CHECK(shutdown(a, SHUT_WR) == 0);
      put_line(reply_fd, "ok");
    } else if (w == "linger0") {
      linger l = {1, 0};
      CHECK(setsockopt(a, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0);
      put_line(reply_fd, "ok");
    } else if (w == "close") {
      CHECK(close(a) == 0);
      put_line(reply_fd, "ok");
    } else if (w == "recvwait") {
      put_line(reply_fd, "ok");
      (void)!recv(a, buf, sizeof buf, 0);  // killed in here
      _exit(4);
    } else if (w == "exit") {
      exit(0);  // exit(), not _exit(): librsock writes the stats line
    } else {
      die(__LINE__, "unknown command");
    }
  }
}

// ---- the prober -----------------------------------------------------------------------

std::atomic<int> g_sigpipes{0};
void on_sigpipe(int) { g_sigpipes.fetch_add(1); }

char task_state(pid_t pid, pid_t tid) {
  char path[96];
  snprintf(path, sizeof path, "/proc/%d/task/%d/stat", pid, tid);
  FILE* f = fopen(path, "r");
  if (!f) return '?';
  char buf[512] = {};
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : '?';
}

// Waits until the thread has been asleep ('S') at five looks 10 ms apart.
// Returns false when it is gone (its call returned without sleeping).
bool try_wait_asleep(pid_t pid, pid_t tid, const std::atomic<bool>* done = nullptr) {
  const int64_t end = now_ms() + 20000;
  int streak = 0;
  while (now_ms() < end) {
    if (done && done->load()) return false;
    const char st = task_state(pid, tid);
    if (st == '?') return false;
    streak = st == 'S' ? streak + 1 : 0;
    if (streak >= 5) return true;
    sleep_ms(10);
  }
  die(__LINE__, "the thread never slept");
}

void wait_asleep(pid_t pid, pid_t tid) {
  if (!try_wait_asleep(pid, tid)) die(__LINE__, "the thread never slept");
}

struct Scenario {
  const char* name;
  std::vector<std::string> steps;
};

class Run {
 public:
  Run(int listener, int port, const Scenario& sc) : l_(listener), port_(port), sc_(sc) {}

  void go() {
    int to_peer[2], from_peer[2];
    CHECK(pipe2(to_peer, O_CLOEXEC) == 0 && pipe2(from_peer, O_CLOEXEC) == 0);
    child_ = fork();
    CHECK(child_ >= 0);
    if (child_ == 0) {
      close(l_);
      close(to_peer[1]);
      close(from_peer[0]);
      run_peer(port_, to_peer[0], from_peer[1]);
    }
    close(to_peer[0]);
    close(from_peer[1]);
    cmd_ = to_peer[1];
    reply_ = from_peer[0];
    u_ = accept(l_, nullptr, nullptr);
    CHECK(u_ >= 0);
    CHECK(get_line(reply_) == "ready");
    et_ = epoll_create1(EPOLL_CLOEXEC);
    CHECK(et_ >= 0);
    epoll_event ev = {};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    CHECK(epoll_ctl(et_, EPOLL_CTL_ADD, u_, &ev) == 0);
    for (size_t i = 0; i < sc_.steps.size(); ++i) step(i, sc_.steps[i]);
    if (!reaped_) {
      kill(child_, SIGKILL);
      reap();
    }
    if (bg_.joinable()) bg_.join();
    close(et_);
    close(u_);
    close(cmd_);
    close(reply_);
  }

 private:
  void out(size_t i, const std::string& probe, const std::string& res) {
    say(std::string(sc_.name) + " " + std::to_string(i) + " " + probe + ": " + res);
  }

  std::string peer(const std::string& c) {
    put_line(cmd_, c);
    return get_line(reply_);
  }

  void reap() {
    int st = 0;
    CHECK(waitpid(child_, &st, 0) == child_);
    reaped_ = true;
  }

  // Big writes, then single bytes, until the socket has taken nothing for
  // three looks 20 ms apart.
  void fill() {
    static char buf[1 << 16];
    for (size_t chunk : {sizeof buf, size_t{1}}) {
      for (int quiet = 0; quiet < 3;) {
        ssize_t r = send(u_, buf, chunk, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r > 0) {
          quiet = 0;
          continue;
        }
        CHECK(r < 0 && errno == EAGAIN);
        ++quiet;
        sleep_ms(20);
      }
    }
  }

  void step(size_t i, const std::string& s) {
    if (s.rfind("send ", 0) == 0) {
      const size_t n = strtoul(s.c_str() + 5, nullptr, 10);
      std::string data(n, 'u');
      CHECK(send(u_, data.data(), n, MSG_NOSIGNAL) == static_cast<ssize_t>(n));
    } else if (s.rfind("peer ", 0) == 0) {
      const std::string r = peer(s.substr(5));
      if (s == "peer readeof")
        out(i, "peer readeof", r);
      else
        CHECK(r == "ok");
    } else if (s == "exit") {
      put_line(cmd_, "exit");
      reap();
      sleep_ms(50);
    } else if (s == "kill") {
      CHECK(kill(child_, SIGKILL) == 0);
      reap();
      sleep_ms(50);
    } else if (s == "peer-asleep") {
      wait_asleep(child_, child_);
    } else if (s == "pause") {
      sleep_ms(50);
    } else if (s == "shutrd" || s == "shutwr") {
      int r = shutdown(u_, s == "shutrd" ? SHUT_RD : SHUT_WR);
      out(i, s, result(r, errno));
    } else if (s == "fill") {
      fill();
    } else if (s == "bg-send") {
      // The kernel may take a byte more after all (its buffers grow): fill
      // again until the send sleeps.
      for (int attempt = 0;; ++attempt) {
        CHECK(attempt < 50);
        bg_tid_ = 0;
        bg_done_ = false;
        bg_ = std::thread([this] {
          bg_tid_ = static_cast<pid_t>(syscall(SYS_gettid));
          char b = 0;
          ssize_t r = send(u_, &b, 1, MSG_NOSIGNAL);
          bg_result_ = result(r, errno);
          bg_done_ = true;
        });
        while (bg_tid_.load() == 0) sleep_ms(1);
        if (try_wait_asleep(getpid(), bg_tid_.load(), &bg_done_)) break;
        bg_.join();
        fill();
      }
    } else if (s == "bg-recv") {
      bg_tid_ = 0;
      bg_ = std::thread([this] {
        bg_tid_ = static_cast<pid_t>(syscall(SYS_gettid));
        char buf[64] = {};
        ssize_t r = recv(u_, buf, sizeof buf, 0);
        bg_result_ = result(r, errno);
      });
      while (bg_tid_.load() == 0) sleep_ms(1);
      wait_asleep(getpid(), bg_tid_.load());
    } else if (s == "join") {
      bg_.join();
      out(i, "join", bg_result_);
    } else if (s == "poll" || s == "poll-") {
      pollfd p = {
          u_, static_cast<short>(POLLIN | POLLOUT | POLLPRI | (s == "poll" ? POLLRDHUP : 0)), 0};
      int n = poll(&p, 1, 0);
      out(i, s, n < 0 ? errname(errno) : poll_bits(p.revents));
    } else if (s == "epoll" || s == "epoll-") {
      int ep = epoll_create1(EPOLL_CLOEXEC);
      CHECK(ep >= 0);
      epoll_event ev = {};
      ev.events = EPOLLIN | EPOLLOUT | EPOLLPRI | (s == "epoll" ? uint32_t{EPOLLRDHUP} : 0u);
      CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, u_, &ev) == 0);
      epoll_event got = {};
      int n = epoll_wait(ep, &got, 1, 0);
      close(ep);
      out(i, s, n < 0 ? errname(errno) : n == 0 ? "none" : epoll_bits(got.events));
    } else if (s == "et") {
      epoll_event got = {};
      int n = epoll_wait(et_, &got, 1, 0);
      out(i, s, n < 0 ? errname(errno) : n == 0 ? "none" : epoll_bits(got.events));
    } else if (s == "read") {
      char buf[64];
      ssize_t r = recv(u_, buf, sizeof buf, MSG_DONTWAIT);
      out(i, s, result(r, errno));
    } else if (s == "write") {
      const char buf[10] = {};
      ssize_t r = send(u_, buf, sizeof buf, MSG_NOSIGNAL | MSG_DONTWAIT);
      out(i, s, result(r, errno));
    } else if (s == "write!") {
      const char buf[10] = {};
      g_sigpipes = 0;
      ssize_t r = write(u_, buf, sizeof buf);
      const int err = errno;
      out(i, s, result(r, err) + " sigpipe=" + std::to_string(g_sigpipes.load()));
    } else if (s == "peername") {
      sockaddr_storage ss;
      socklen_t len = sizeof ss;
      int r = getpeername(u_, reinterpret_cast<sockaddr*>(&ss), &len);
      out(i, s, r == 0 ? "ok" : errname(errno));
    } else if (s == "soerr") {
      int e = -1;
      socklen_t len = sizeof e;
      int r = getsockopt(u_, SOL_SOCKET, SO_ERROR, &e, &len);
      out(i, s, r < 0 ? "failed " + errname(errno) : errname(e));
    } else {
      die(__LINE__, "unknown step");
    }
  }

  int l_;
  int port_;
  const Scenario& sc_;
  pid_t child_ = -1;
  bool reaped_ = false;
  int cmd_ = -1, reply_ = -1;
  int u_ = -1, et_ = -1;
  std::thread bg_;  // a blocking call (bg-recv, bg-send)
  std::atomic<pid_t> bg_tid_{0};
  std::atomic<bool> bg_done_{false};
  std::string bg_result_;
};

// The scenarios. "Nothing unread" means the peer read every byte we sent.
const std::vector<Scenario>& scenarios() {
  static const std::vector<Scenario> k = {
      // The peer read everything and close()s: a FIN. Our first write
      // succeeds and draws an RST (we are in CLOSE_WAIT: EPIPE pending).
      {"close_read_all",
       {"send 3",   "peer read 3", "peer send 5", "et",     "peer close", "exit", "poll",
        "peername", "poll-",       "epoll",       "epoll-", "et",         "et",   "read",
        "read",     "poll",        "peername",    "write",  "pause",      "poll", "peername",
        "et",       "epoll-",      "read",        "soerr",  "soerr",      "poll", "peername",
        "et",       "write",       "write!",      "shutwr"}},
      {"close_read_all_write_first",
       {"send 3", "peer read 3", "peer close", "exit", "write!", "pause", "write!", "read", "soerr",
        "poll", "peername"}},
      {"close_read_all_data_left",
       {"peer send 5", "peer close", "exit", "write", "pause", "read", "read", "soerr", "poll",
        "peername"}},
      // The peer close()s with our bytes unread: an RST at once.
      {"close_unread",
       {"send 3",   "peer send 5", "et",    "peer close", "exit", "poll",     "peername", "poll-",
        "epoll-",   "et",          "et",    "read",       "poll", "peername", "read",     "poll",
        "peername", "read",        "soerr", "write!",     "poll", "peername"}},
      {"close_unread_write_first",
       {"send 3", "peer close", "exit", "write!", "write!", "read", "soerr"}},
      {"close_unread_soerr_first",
       {"send 3", "peer close", "exit", "soerr", "soerr", "read", "write", "shutwr", "shutrd",
        "poll", "peername"}},
      // exit() without close(), and SIGKILL: the kernel closes the socket.
      {"exit_read_all",
       {"send 3", "peer read 3", "exit", "poll", "peername", "read", "write", "pause", "poll",
        "peername", "soerr", "write"}},
      {"exit_unread", {"send 3", "exit", "poll", "peername", "read", "soerr", "write"}},
      {"killed_read_all",
       {"send 3", "peer read 3", "peer send 4", "kill", "poll", "peername", "epoll", "read", "read",
        "write!", "pause", "poll", "peername", "write!", "soerr"}},
      {"killed_read_all_write_first",
       {"send 3", "peer read 3", "kill", "write!", "pause", "write!", "read", "soerr"}},
      {"killed_unread",
       {"send 3", "peer send 4", "kill", "poll", "peername", "epoll-", "read", "read", "read",
        "write!", "soerr"}},
      {"killed_in_recv",
       {"peer recvwait", "peer-asleep", "kill", "poll", "peername", "read", "write", "pause",
        "write", "soerr", "poll", "peername"}},
      // epoll first, with no other call before it to notice the death.
      {"killed_epoll_first",
       {"send 3", "peer read 3", "peer send 4", "et", "kill", "epoll", "et", "et", "read", "read",
        "poll", "peername"}},
      {"killed_unread_et_first",
       {"send 3", "peer send 4", "kill", "et", "epoll-", "read", "read", "read", "soerr"}},
      {"exit_epoll_first",
       {"send 3", "peer read 3", "exit", "epoll-", "et", "read", "write", "pause", "epoll",
        "soerr"}},
      // The peer shuts down its sending side, reads on, then closes.
      {"peer_shutwr",
       {"peer send 5", "peer shutwr", "poll",  "peername", "et",           "read",  "read",
        "poll",        "peername",    "soerr", "write",    "peer read 10", "poll",  "peername",
        "send 7",      "peer read 7", "poll",  "peername", "peer close",   "exit",  "poll",
        "peername",    "write",       "pause", "poll",     "peername",     "soerr", "write"}},
      {"peer_shutwr_then_close_unread",
       {"peer shutwr", "read", "send 3", "peer close", "exit", "poll", "peername", "read", "soerr",
        "write", "write"}},
      {"peer_shutwr_then_close_unread_read_later",
       {"peer shutwr", "send 3", "peer close", "exit", "poll", "peername", "read", "soerr",
        "write"}},
      // SO_LINGER {1, 0}: an abortive close, an RST although nothing is unread.
      {"peer_linger0",
       {"send 3", "peer read 3", "peer send 2", "peer linger0", "peer close", "exit", "poll",
        "peername", "read", "read", "read", "write", "soerr"}},
      // Our own shutdowns.
      {"our_shutrd",
       {"peer send 3", "shutrd", "poll", "peername", "epoll", "read", "read", "peer send 2", "read",
        "read", "write", "peer read 10", "poll", "peername", "soerr"}},
      {"our_shutwr",
       {"shutwr", "poll", "peername", "epoll", "write!", "peer readeof", "read", "peer send 4",
        "read", "read", "poll", "peername", "soerr"}},
      {"our_shutrdwr",
       {"shutrd", "shutwr", "poll", "peername", "epoll", "read", "write", "peer readeof", "soerr"}},
      {"both_shutwr",
       {"peer shutwr", "shutwr", "poll", "peername", "read", "write", "shutrd", "peer close",
        "exit", "poll", "peername", "read", "write", "soerr", "shutwr"}},
      {"both_shutwr_peer_unread",
       {"send 3", "peer shutwr", "shutwr", "poll", "peername", "peer close", "exit", "poll",
        "peername", "read", "write", "soerr", "poll", "peername"}},
      // Blocked calls when the peer goes.
      {"blocked_recv_peer_closes",
       {"bg-recv", "peer close", "join", "poll", "peername", "read", "soerr"}},
      {"blocked_recv_peer_closes_unread",
       {"send 3", "bg-recv", "peer close", "join", "poll", "peername", "read", "soerr"}},
      {"blocked_recv_peer_killed", {"bg-recv", "kill", "join", "read", "write", "pause", "soerr"}},
      {"blocked_send_peer_closes",
       {"fill", "bg-send", "peer close", "join", "poll", "peername", "read", "soerr", "write"}},
      {"blocked_send_peer_killed", {"fill", "bg-send", "kill", "join", "read", "soerr"}},
  };
  return k;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--port") port = atoi(argv[i + 1]);
    if (k == "--only") only = argv[i + 1];
  }
  if (port <= 0) {
    fprintf(stderr, "usage: rs_close --port P [--only NAME]\n");
    return 2;
  }
  struct sigaction sa = {};
  sa.sa_handler = on_sigpipe;
  sigemptyset(&sa.sa_mask);
  CHECK(sigaction(SIGPIPE, &sa, nullptr) == 0);
  int l = listen_loopback(port, 8);
  CHECK(l >= 0);
  int ran = 0;
  for (const Scenario& sc : scenarios()) {
    if (!only.empty() && only != sc.name) continue;
    Run(l, port, sc).go();
    ++ran;
  }
  close(l);
  say("SCENARIOS n=" + std::to_string(ran));
  say("DONE");
  return 0;
}
