// rs_signals: how blocking socket calls answer signals, as a transcript.
// Driven by test/preload/signals_test.cpp, which runs it once on plain TCP
// and once under librsock and compares the two transcripts line by line
// (DESIGN.md invariant 10). Plain POSIX calls only.
//
// The process (the prober) listens on --port, forks a peer, and the peer
// connects: A, the connection under test. The peer also listens on --port2
// and accepts there only when told (B: a socket still connecting, or under
// librsock still pairing). The prober commands the peer over a pipe:
//   send N       write N bytes on A           readall   read A until quiet
//   accept       accept B on --port2           sendB N   write N bytes on B
//   cont PID MS  after MS ms, SIGCONT to PID   quit      exit
//
// Each case blocks the prober's main thread in one call, and a signaller
// thread delivers a signal once that thread has been asleep in the kernel
// for a while (/proc/self/task/TID/stat says 'S'), waits until the handler
// ran (or 100 ms for a signal without handler), then has the peer make the
// call complete. One line per case:
//   CASE name result=R handler=H [more=...]
// R is a byte count or an errno name; H how many times the handler ran.
// Every case is deterministic: the signal always arrives while the call
// sleeps, and the call can only complete after the handler ran.
//
// Usage: rs_signals --port P --port2 P2
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
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
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "progs.h"

namespace {

[[noreturn]] void die(int line, const char* what) {
  fprintf(stderr, "FAIL rs_signals line %d: %s (errno %d %s)\n", line, what, errno,
          strerror(errno));
  fflush(stderr);
  _exit(1);
}
#define CHECK(cond)                    \
  do {                                 \
    if (!(cond)) die(__LINE__, #cond); \
  } while (0)

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

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

void sleep_ms(int ms) {
  timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

const char* errname(int e) {
  switch (e) {
    case EINTR:
      return "EINTR";
    case EAGAIN:
      return "EAGAIN";
    case EPIPE:
      return "EPIPE";
    case ECONNRESET:
      return "ECONNRESET";
    default:
      return "EOTHER";
  }
}

std::string result(long r, int err) { return r >= 0 ? std::to_string(r) : errname(err); }

int listen_on(int port) {
  int s = listen_loopback(port, 8);
  CHECK(s >= 0);
  return s;
}

// ---- pipes between prober and peer --------------------------------------------------

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

// ---- the peer -------------------------------------------------------------------------

[[noreturn]] void run_peer(int port, int port2, int cmd_fd, int reply_fd) {
  int l2 = listen_on(port2);
  int a = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(a >= 0);
  sockaddr_in sa = loopback(port);
  CHECK(connect(a, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  int b = -1;
  put_line(reply_fd, "ready");
  static char buf[1 << 16];
  for (;;) {
    std::string line = get_line(cmd_fd, 60000);
    char word[32] = {};
    long x = 0, y = 0;
    sscanf(line.c_str(), "%31s %ld %ld", word, &x, &y);
    std::string w = word;
    if (w == "quit" || w == "<eof>") break;
    if (w == "send" || w == "sendB") {
      memset(buf, 'd', static_cast<size_t>(x));
      CHECK(send(w == "send" ? a : b, buf, static_cast<size_t>(x), 0) == x);
      put_line(reply_fd, "ok");
    } else if (w == "readall") {
      long total = 0;
      for (;;) {
        pollfd p = {a, POLLIN, 0};
        if (poll(&p, 1, 200) != 1) break;
        ssize_t r = recv(a, buf, sizeof buf, 0);
        if (r <= 0) break;
        total += r;
      }
      put_line(reply_fd, "read " + std::to_string(total));
    } else if (w == "accept") {
      b = accept(l2, nullptr, nullptr);
      CHECK(b >= 0);
      put_line(reply_fd, "ok");
    } else if (w == "cont") {
      put_line(reply_fd, "ok");
      sleep_ms(static_cast<int>(y));
      kill(static_cast<pid_t>(x), SIGCONT);
    } else {
      die(__LINE__, "unknown command");
    }
  }
  exit(0);  // exit(), not _exit(): librsock writes the stats line
}

// ---- the prober -----------------------------------------------------------------------

int g_cmd = -1;    // to the peer
int g_reply = -1;  // from the peer
int A = -1;

std::string peer(const std::string& c) {
  put_line(g_cmd, c);
  return get_line(g_reply);
}

std::atomic<int> g_handled{0};
void on_signal(int) { g_handled.fetch_add(1); }

enum class Disp { kRestart, kNoRestart, kResetHand, kIgnore, kDefault };

void set_disp(int sig, Disp d) {
  struct sigaction sa = {};
  sigemptyset(&sa.sa_mask);
  switch (d) {
    case Disp::kRestart:
      sa.sa_handler = on_signal;
      sa.sa_flags = SA_RESTART;
      break;
    case Disp::kNoRestart:
      sa.sa_handler = on_signal;
      break;
    case Disp::kResetHand:  // sysv_signal(): one-shot, not restarting
      sa.sa_handler = on_signal;
      sa.sa_flags = SA_RESETHAND | SA_NODEFER;
      break;
    case Disp::kIgnore:
      sa.sa_handler = SIG_IGN;
      break;
    case Disp::kDefault:
      sa.sa_handler = SIG_DFL;
      break;
  }
  CHECK(sigaction(sig, &sa, nullptr) == 0);
}

bool handler_runs(Disp d) {
  return d == Disp::kRestart || d == Disp::kNoRestart || d == Disp::kResetHand;
}

pid_t gettid_() { return static_cast<pid_t>(syscall(SYS_gettid)); }

char task_state(pid_t tid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/task/%d/stat", tid);
  FILE* f = fopen(path, "r");
  if (!f) return '?';
  char buf[512] = {};
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* p = strrchr(buf, ')');
  return p && p[1] == ' ' ? p[2] : '?';
}

// Waits until thread tid has been asleep ('S') at five looks 10 ms apart.
// The main thread is inside the call under test (not yet back from it).
std::atomic<bool> g_in_call{false};

// Waits until thread tid has been asleep ('S') at five looks 10 ms apart;
// with in_call, only while the main thread is inside the call (false when
// the call returned without sleeping).
bool wait_asleep(pid_t tid, bool in_call = false) {
  const int64_t end = now_ms() + 20000;
  int streak = 0;
  while (now_ms() < end) {
    if (in_call && !g_in_call.load()) return false;
    streak = task_state(tid) == 'S' ? streak + 1 : 0;
    if (streak >= 5 && (!in_call || g_in_call.load())) return true;
    sleep_ms(10);
  }
  return false;
}

// How a case's signal is delivered.
enum class To { kThread, kProcess, kStopCont };

struct Case {
  std::string name;
  int sig = SIGUSR1;
  Disp disp = Disp::kNoRestart;
  To to = To::kThread;
  std::function<std::string()> call;   // the blocking call, its result as text
  std::function<void()> release;       // makes it complete (after the signal)
  std::function<void()> cleanup;       // afterwards: leftovers, for the transcript
  std::function<void()> before;        // in the main thread, before anything
  std::function<void()> after_asleep;  // once the main thread sleeps, before the signal
};

std::string g_extra;  // appended to the case's line by cleanup

// The second thread of the two-thread cases.
std::thread g_other;
std::atomic<pid_t> g_other_tid{0};
std::string g_other_result;

void run_case(Case c) {
  for (int attempt = 0;; ++attempt) {
    CHECK(attempt < 20);
    g_handled = 0;
    g_extra.clear();
    if (c.to != To::kStopCont) set_disp(c.sig, c.disp);
    if (c.before) c.before();
    const pid_t tid = gettid_();
    std::atomic<bool> signalled{false};
    g_in_call = true;
    std::thread signaller([&] {
      // Process-directed signals must find no other taker than the sleeper.
      sigset_t block;
      sigfillset(&block);
      pthread_sigmask(SIG_BLOCK, &block, nullptr);
      if (c.after_asleep && wait_asleep(tid, true)) c.after_asleep();
      if (!wait_asleep(tid, true)) {
        // The call did not sleep (try again), or sleeps no more: let it end.
        if (g_in_call.load()) c.release();
        return;
      }
      signalled = true;
      if (c.to == To::kThread) {
        CHECK(syscall(SYS_tgkill, getpid(), tid, c.sig) == 0);
      } else if (c.to == To::kProcess) {
        CHECK(kill(getpid(), c.sig) == 0);
      } else {
        CHECK(peer("cont " + std::to_string(getpid()) + " 300") == "ok");
        CHECK(kill(getpid(), SIGSTOP) == 0);  // stops this thread too, until the SIGCONT
      }
      if (c.to != To::kStopCont && handler_runs(c.disp)) {
        const int64_t end = now_ms() + 20000;
        while (g_handled.load() == 0 && now_ms() < end) sleep_ms(1);
      }
      sleep_ms(100);  // an interrupted call returns meanwhile; a restarted one sleeps on
      c.release();
    });
    std::string r = c.call();
    g_in_call = false;
    signaller.join();
    if (c.cleanup) c.cleanup();
    if (c.to != To::kStopCont) set_disp(c.sig, Disp::kIgnore);
    // Only a send on a socket that took one byte more than it seemed to
    // can return without sleeping; its cleanup read everything, and the
    // case runs again on a socket filled anew.
    if (!signalled) continue;
    say("CASE %s result=%s handler=%d%s", c.name.c_str(), r.c_str(), g_handled.load(),
        g_extra.c_str());
    return;
  }
}

// Reads what is left on A (the peer's data an interrupted call did not take).
void drain_a() {
  char buf[4096];
  long total = 0;
  for (;;) {
    pollfd p = {A, POLLIN, 0};
    if (poll(&p, 1, 200) != 1) break;
    ssize_t r = recv(A, buf, sizeof buf, MSG_DONTWAIT);
    if (r <= 0) break;
    total += r;
  }
  g_extra += " left=" + std::to_string(total);
}

std::string do_recv(int fd, size_t len, int flags) {
  char buf[64];
  ssize_t r = recv(fd, buf, len, flags);
  return result(r, errno);
}

void set_timeo(int fd, int opt, int ms) {
  timeval tv = {ms / 1000, (ms % 1000) * 1000};
  CHECK(setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof tv) == 0);
}

// A blocking recv of 3 bytes on A, interrupted, then the peer sends 3.
Case recv_case(const std::string& name, int sig, Disp d, To to = To::kThread) {
  Case c;
  c.name = name;
  c.sig = sig;
  c.disp = d;
  c.to = to;
  c.call = [] { return do_recv(A, 3, 0); };
  c.release = [] { CHECK(peer("send 3") == "ok"); };
  c.cleanup = drain_a;
  return c;
}

// Fills A's send direction (nonblocking writes until EAGAIN); returns the
// bytes written.
long fill_a() {
  // Big writes, then single bytes, until the socket has taken nothing for
  // three looks 20 ms apart (the kernel's buffers may grow meanwhile).
  static char buf[1 << 16];
  memset(buf, 'f', sizeof buf);
  long total = 0;
  for (size_t chunk : {sizeof buf, size_t{1}}) {
    for (int quiet = 0; quiet < 3;) {
      ssize_t r = send(A, buf, chunk, MSG_DONTWAIT);
      if (r > 0) {
        total += r;
        quiet = 0;
        continue;
      }
      CHECK(r < 0 && errno == EAGAIN);
      ++quiet;
      sleep_ms(20);
    }
  }
  return total;
}

// A blocking send of 1 byte on a full A, interrupted, then the peer reads.
// timeo_ms > 0 sets SO_SNDTIMEO, < 0 SO_RCVTIMEO (which does not change how
// a send answers).
Case send_case(const std::string& name, Disp d, int timeo_ms) {
  const int opt = timeo_ms > 0 ? SO_SNDTIMEO : SO_RCVTIMEO;
  Case c;
  c.name = name;
  c.disp = d;
  c.before = [=] {
    fill_a();
    if (timeo_ms) set_timeo(A, opt, abs(timeo_ms));
  };
  c.call = [] {
    char x = 'x';
    ssize_t r = send(A, &x, 1, 0);
    return result(r, errno);
  };
  c.release = [] { CHECK(peer("readall").rfind("read ", 0) == 0); };
  c.cleanup = [=] {
    if (timeo_ms) set_timeo(A, opt, 0);
    CHECK(peer("readall").rfind("read ", 0) == 0);  // the byte, if it went
  };
  return c;
}

int run(int port, int port2) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  signal(SIGPIPE, SIG_IGN);
  int l = listen_on(port);
  int to_peer[2], from_peer[2];
  CHECK(pipe2(to_peer, O_CLOEXEC) == 0 && pipe2(from_peer, O_CLOEXEC) == 0);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    close(l);
    close(to_peer[1]);
    close(from_peer[0]);
    run_peer(port, port2, to_peer[0], from_peer[1]);
  }
  close(to_peer[0]);
  close(from_peer[1]);
  g_cmd = to_peer[1];
  g_reply = from_peer[0];
  A = accept(l, nullptr, nullptr);
  CHECK(A >= 0);
  CHECK(get_line(g_reply) == "ready");
  say("PEER pid=%d", static_cast<int>(child));

  // Receives on A.
  run_case(recv_case("recv_restart", SIGUSR1, Disp::kRestart));
  run_case(recv_case("recv_norestart", SIGUSR1, Disp::kNoRestart));
  run_case(recv_case("recv_resethand", SIGUSR1, Disp::kResetHand));
  run_case(recv_case("recv_ignored", SIGUSR1, Disp::kIgnore));
  run_case(recv_case("recv_default_ignored", SIGWINCH, Disp::kDefault));
  run_case(recv_case("recv_process_restart", SIGUSR2, Disp::kRestart, To::kProcess));
  run_case(recv_case("recv_process_norestart", SIGUSR2, Disp::kNoRestart, To::kProcess));
  run_case(recv_case("recv_stop_cont", SIGSTOP, Disp::kDefault, To::kStopCont));
  {
    Case c = recv_case("read_norestart", SIGUSR1, Disp::kNoRestart);
    c.call = [] {
      char buf[3];
      ssize_t r = read(A, buf, sizeof buf);
      return result(r, errno);
    };
    run_case(c);
  }
  {
    // A close of every signalfd the process has (librsock's, kept by the
    // thread for its sleeps; the kernel run has none), and a pipe put at
    // its number: the next sleep must still see the signal.
    Case c = recv_case("recv_norestart_signalfds_closed", SIGUSR1, Disp::kNoRestart);
    static int p[2] = {-1, -1};
    static std::vector<int> reused;
    c.before = [] {
      DIR* d = opendir("/proc/self/fd");
      CHECK(d != nullptr);
      std::vector<int> sfds;
      while (dirent* e = readdir(d)) {
        char path[300], target[64] = {};
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        if (readlink(path, target, sizeof target - 1) > 0 &&
            strcmp(target, "anon_inode:[signalfd]") == 0)
          sfds.push_back(atoi(e->d_name));
      }
      closedir(d);
      CHECK(pipe(p) == 0);
      for (int fd : sfds) {
        close(fd);
        CHECK(dup2(p[0], fd) == fd);
      }
      reused = sfds;
    };
    c.cleanup = [] {
      drain_a();
      for (int fd : reused) close(fd);
      close(p[0]);
      close(p[1]);
    };
    run_case(c);
  }
  {
    // SO_RCVTIMEO: every handler interrupts, SA_RESTART or not.
    Case c = recv_case("recv_rcvtimeo_restart", SIGUSR1, Disp::kRestart);
    c.before = [] { set_timeo(A, SO_RCVTIMEO, 20000); };
    c.cleanup = [] {
      set_timeo(A, SO_RCVTIMEO, 0);
      drain_a();
    };
    run_case(c);
  }
  {
    // A send timeout does not change how a receive answers.
    Case c = recv_case("recv_sndtimeo_restart", SIGUSR1, Disp::kRestart);
    c.before = [] { set_timeo(A, SO_SNDTIMEO, 20000); };
    c.cleanup = [] {
      set_timeo(A, SO_SNDTIMEO, 0);
      drain_a();
    };
    run_case(c);
  }
  {
    // MSG_WAITALL that has 2 of its 5 bytes: a restarting handler still ends
    // it with the 2.
    Case c = recv_case("recv_waitall_partial_restart", SIGUSR1, Disp::kRestart);
    c.before = [] { CHECK(peer("send 2") == "ok"); };
    c.call = [] { return do_recv(A, 5, MSG_WAITALL); };
    run_case(c);
  }

  // Two threads asleep in recv on A: the main thread is signalled, the
  // other gets the data. Under librsock the first to sleep waits on the
  // doorbell and the second behind it: both orders.
  for (bool main_first : {true, false}) {
    Case c = recv_case(main_first ? "recv_two_threads_main_first" : "recv_two_threads_main_second",
                       SIGUSR1, Disp::kNoRestart);
    auto start_other = [] {
      g_other_tid = 0;
      g_other = std::thread([] {
        // Signals for the main thread only.
        sigset_t block;
        sigfillset(&block);
        pthread_sigmask(SIG_BLOCK, &block, nullptr);
        g_other_tid = gettid_();
        g_other_result = do_recv(A, 3, 0);
      });
      while (g_other_tid.load() == 0) sleep_ms(1);
      CHECK(wait_asleep(g_other_tid.load()));
    };
    if (main_first)
      c.after_asleep = start_other;
    else
      c.before = start_other;
    c.cleanup = [] {
      g_other.join();
      g_extra += " other=" + g_other_result;
      drain_a();
    };
    run_case(c);
  }

  // Sends on a full A.
  run_case(send_case("send_restart", Disp::kRestart, 0));
  run_case(send_case("send_norestart", Disp::kNoRestart, 0));
  run_case(send_case("send_sndtimeo_restart", Disp::kRestart, 20000));
  run_case(send_case("send_rcvtimeo_restart", Disp::kRestart, -20000));

  // poll and epoll_wait are never restarted.
  {
    Case c = recv_case("poll_restart", SIGUSR1, Disp::kRestart);
    c.call = [] {
      pollfd p = {A, POLLIN, 0};
      int n = poll(&p, 1, -1);
      return result(n, errno);
    };
    run_case(c);
  }
  {
    Case c = recv_case("epoll_wait_restart", SIGUSR1, Disp::kRestart);
    c.call = [] {
      int ep = epoll_create1(EPOLL_CLOEXEC);
      CHECK(ep >= 0);
      epoll_event ev = {};
      ev.events = EPOLLIN;
      CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, A, &ev) == 0);
      int n = epoll_wait(ep, &ev, 1, -1);
      const int err = errno;
      close(ep);
      return result(n, err);
    };
    run_case(c);
  }
  {
    Case c = recv_case("poll_ignored", SIGUSR1, Disp::kIgnore);
    c.call = [] {
      pollfd p = {A, POLLIN, 0};
      int n = poll(&p, 1, -1);
      return result(n, errno) + (p.revents & POLLIN ? "/IN" : "/-");
    };
    run_case(c);
  }

  // A blocking recv on B, made by a nonblocking connect that the peer has
  // not accepted yet (under librsock: still pairing).
  for (Disp d : {Disp::kRestart, Disp::kNoRestart}) {
    Case c;
    c.name = d == Disp::kRestart ? "connecting_recv_restart" : "connecting_recv_norestart";
    c.disp = d;
    static int b = -1;
    c.before = [port2] {
      b = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      CHECK(b >= 0);
      sockaddr_in sa = loopback(port2);
      const int r = connect(b, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
      CHECK(r == 0 || errno == EINPROGRESS);
      int fl = fcntl(b, F_GETFL);
      CHECK(fcntl(b, F_SETFL, fl & ~O_NONBLOCK) == 0);
    };
    c.call = [] { return do_recv(b, 3, 0); };
    c.release = [] {
      CHECK(peer("accept") == "ok");
      CHECK(peer("sendB 3") == "ok");
      CHECK(peer("sendB 1") == "ok");  // so that the cleanup always finds a byte
    };
    c.cleanup = [] {
      // What an interrupted call left (once B is connected, or paired).
      char buf[8];
      pollfd p = {b, POLLIN, 0};
      CHECK(poll(&p, 1, 20000) == 1);
      ssize_t r = recv(b, buf, sizeof buf, MSG_DONTWAIT);
      g_extra += " left=" + result(r, errno);
      close(b);
      b = -1;
    };
    run_case(c);
  }

  CHECK(peer("quit") == "<eof>");
  int st = 0;
  CHECK(waitpid(child, &st, 0) == child);
  say("PEER exit=%d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  close(A);
  close(l);
  say("DONE");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0, port2 = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--port") port = atoi(argv[i + 1]);
    if (k == "--port2") port2 = atoi(argv[i + 1]);
  }
  if (port <= 0 || port2 <= 0) {
    fprintf(stderr, "usage: rs_signals --port P --port2 P2\n");
    return 2;
  }
  return run(port, port2);
}
