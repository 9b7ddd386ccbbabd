// rs_fork: a process that pairs with itself in the background and forks,
// for the lifecycle tests (test/preload/lifecycle_test.cpp). It listens on
// 127.0.0.1:PORT (the test names that address in RSOCK_PEERS) and connects
// to itself; each pair of sockets comes from a nonblocking connect() and a
// nonblocking accept(), so librsock pairs both ends in background threads:
//   1. a pair made and used before the fork;
//   2. a pair whose pairings are still in flight when the process forks (the
//      fork waits for them); the parent closes its copies, the child uses it;
//   3. in the child, a pair made after the fork (nothing that the parent's
//      threads held at the fork may stay held there).
// Each pair carries one message each way.
//   rs_fork --port P [--hold FILE]
// With --hold, for rsockstat's test: the parent prints "CLOSED" once it has
// closed its copies of pair 2, and the child "HOLDING <pid>" once it has
// made pair 3; the child then waits (bounded, 30 s) until FILE exists.
// Output: "OK <step>" per step, then "RESULT child=<pid>" (parent). Exit
// status 0 when every step worked in both processes, 1 otherwise (details
// on stderr), 2 on bad usage.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>

namespace {

constexpr int kTimeoutMs = 20000;  // an upper bound only, never expected
int g_port = 0;
const char* g_hold = nullptr;  // --hold FILE

bool fail(const char* step, const char* what) {
  fprintf(stderr, "rs_fork %d: %s: %s (%s)\n", static_cast<int>(getpid()), step, what,
          strerror(errno));
  return false;
}

sockaddr_in loopback() {
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(g_port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

bool wait_for(int fd, short events, const char* step) {
  pollfd p = {fd, events, 0};
  int r;
  do {
    r = poll(&p, 1, kTimeoutMs);
  } while (r < 0 && errno == EINTR);
  return r == 1 || fail(step, r == 0 ? "poll timed out" : "poll");
}

struct Pair {
  int c = -1;  // connected
  int a = -1;  // accepted
};

// connect() and accept() return at once; both ends then pair in the
// background.
bool start_pair(int listener, Pair* p, const char* step) {
  p->c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (p->c < 0) return fail(step, "socket");
  const sockaddr_in addr = loopback();
  if (connect(p->c, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 &&
      errno != EINPROGRESS)
    return fail(step, "connect");
  if (!wait_for(listener, POLLIN, step)) return false;
  p->a = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  return p->a >= 0 || fail(step, "accept4");
}

bool send_msg(int fd, const std::string& msg, const char* step) {
  if (!wait_for(fd, POLLOUT, step)) return false;
  ssize_t n = send(fd, msg.data(), msg.size(), MSG_NOSIGNAL);
  return n == static_cast<ssize_t>(msg.size()) || fail(step, "send");
}

bool recv_msg(int fd, const std::string& want, const char* step) {
  std::string got;
  while (got.size() < want.size()) {
    if (!wait_for(fd, POLLIN, step)) return false;
    char buf[64];
    ssize_t n = recv(fd, buf, std::min(sizeof buf, want.size() - got.size()), 0);
    if (n < 0 && errno == EAGAIN) continue;
    if (n <= 0) return fail(step, n == 0 ? "early EOF" : "recv");
    got.append(buf, static_cast<size_t>(n));
  }
  if (got != want) {
    errno = 0;
    return fail(step, ("read '" + got + "', want '" + want + "'").c_str());
  }
  return true;
}

// The connect's outcome (POLLOUT, SO_ERROR), then a message each way.
bool use_pair(const Pair& p, const char* step) {
  if (!wait_for(p.c, POLLOUT, step)) return false;
  int err = -1;
  socklen_t len = sizeof err;
  if (getsockopt(p.c, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
    errno = err;
    return fail(step, "SO_ERROR");
  }
  const std::string ping = std::string("ping ") + step, pong = std::string("pong ") + step;
  if (!send_msg(p.c, ping, step) || !recv_msg(p.a, ping, step) || !send_msg(p.a, pong, step) ||
      !recv_msg(p.c, pong, step))
    return false;
  printf("OK %s\n", step);
  fflush(stdout);
  return true;
}

int run() {
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int on = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  const sockaddr_in addr = loopback();
  if (listener < 0 || bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(listener, 8) != 0)
    return fail("listen", "socket/bind/listen"), 1;

  Pair before, across;
  if (!start_pair(listener, &before, "before") || !use_pair(before, "before")) return 1;
  if (!start_pair(listener, &across, "across")) return 1;
  fflush(stdout);
  const pid_t child = fork();
  if (child < 0) return fail("fork", "fork"), 1;
  if (child == 0) {
    Pair after;
    const bool ok = use_pair(across, "across") && start_pair(listener, &after, "after") &&
                    use_pair(after, "after");
    if (ok && g_hold) {
      printf("HOLDING %d\n", static_cast<int>(getpid()));
      fflush(stdout);
      for (int i = 0; i < 3000 && access(g_hold, F_OK) != 0; ++i) usleep(10000);
    }
    exit(ok ? 0 : 1);  // exit, not _exit: the stats line is written at exit
  }
  // The child holds the second pair now: closing our copies must not close it.
  close(across.c);
  close(across.a);
  if (g_hold) {
    printf("CLOSED\n");
    fflush(stdout);
  }
  int st = 0;
  while (waitpid(child, &st, 0) < 0 && errno == EINTR) {
  }
  printf("RESULT child=%d\n", static_cast<int>(child));
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    errno = 0;
    return fail("child", "exited with failure"), 1;
  }
  return use_pair(before, "parent-after") ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const bool hold = argc == 5 && strcmp(argv[3], "--hold") == 0;
  if ((argc != 3 && !hold) || strcmp(argv[1], "--port") != 0) {
    fprintf(stderr, "usage: rs_fork --port P [--hold FILE]\n");
    return 2;
  }
  g_port = atoi(argv[2]);
  if (hold) g_hold = argv[4];
  return run();
}
