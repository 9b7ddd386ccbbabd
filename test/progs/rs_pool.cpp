// rs_pool: two threads of a server waiting on one epoll set, one of them
// blocked in the application while the other must serve a connection that
// had gone quiet, for the preload test PoolTest (test/preload/storm_test.cpp).
// The kernel wakes any thread waiting on a set for any member; librsock
// must too, also for a member it had stopped looking at (a dormant member)
// and that another thread woke meanwhile. Plain POSIX calls only.
//
//   rs_pool --role server --port P
//       accepts connections X then Y into one epoll set (level-triggered),
//       and runs two threads in epoll_wait on it. Y: every byte is echoed
//       (pings). X: the thread that reads '1' echoes it and then blocks until
//       another thread has read '2' on X and echoed it (at most 10 s; then
//       it prints "FAIL" and exits 1). Prints READY after listen() and
//       "RESULT served=N" once both connections have ended.
//   rs_pool --role client --port P
//       connects X and Y; 12 pings on Y, 20 ms apart (X sits quiet through
//       the server's sleeps); then '1' on X, waits for its echo, and '2' on
//       X, whose echo must come back within 10 s although the thread that
//       served '1' is blocked. Prints "RESULT ok" and exits 0, or exits 1.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "progs.h"

namespace {

constexpr int kWaitMs = 10000;

[[noreturn]] void fail(const char* what) {
  fprintf(stderr, "rs_pool: %s (%s)\n", what, strerror(errno));
  exit(1);
}

int server(int port) {
  const int l = listen_loopback(port, 8);
  if (l < 0) fail("listen");
  printf("READY\n");
  fflush(stdout);
  const int x = accept(l, nullptr, nullptr);
  const int y = accept(l, nullptr, nullptr);
  if (x < 0 || y < 0) fail("accept");
  close(l);
  // Waits without a timeout (a timeout would re-arm everything and hide a
  // lost wakeup); the thread that sees the second connection end writes to
  // `quit`, which every thread then sees (level-triggered).
  int quit[2];
  if (pipe(quit) != 0) fail("pipe");
  const int ep = epoll_create1(0);
  for (int fd : {x, y, quit[0]}) {
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) fail("epoll_ctl");
  }
  std::mutex mu;
  std::condition_variable cv;
  bool second = false;
  std::atomic<int> ended{0}, served{0};
  std::atomic<bool> x_done{false}, y_done{false};
  auto loop = [&] {
    for (;;) {
      epoll_event ev;
      const int n = epoll_wait(ep, &ev, 1, -1);
      if (n < 0 && errno != EINTR) fail("epoll_wait");
      if (n != 1) continue;
      const int fd = ev.data.fd;
      if (fd == quit[0]) return;
      std::atomic<bool>& done = fd == x ? x_done : y_done;
      char b;
      const ssize_t r = recv(fd, &b, 1, MSG_DONTWAIT);
      if (r < 0 && errno == EAGAIN) continue;  // the other thread took it
      if (r <= 0) {
        if (!done.exchange(true)) {
          epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
          if (ended.fetch_add(1) == 1 && write(quit[1], "q", 1) != 1) fail("write");
        }
        continue;
      }
      if (send(fd, &b, 1, MSG_NOSIGNAL) != 1) fail("send");
      served.fetch_add(1);
      if (fd != x) continue;
      std::unique_lock<std::mutex> lock(mu);
      if (b == '2') {
        second = true;
        cv.notify_all();
      } else if (!cv.wait_for(lock, std::chrono::milliseconds(kWaitMs), [&] { return second; })) {
        printf("FAIL no other thread served X's second byte (lost wakeup)\n");
        fflush(stdout);
        exit(1);
      }
    }
  };
  std::thread t1(loop), t2(loop);
  t1.join();
  t2.join();
  close(x);
  close(y);
  printf("RESULT served=%d\n", served.load());
  return 0;
}

void exchange(int fd, char b) {
  if (send(fd, &b, 1, MSG_NOSIGNAL) != 1) fail("send");
  pollfd p = {fd, POLLIN, 0};
  char got = 0;
  if (poll(&p, 1, kWaitMs) != 1 || recv(fd, &got, 1, 0) != 1 || got != b) {
    fprintf(stderr, "rs_pool: no echo of '%c' in %d ms (lost wakeup)\n", b, kWaitMs);
    exit(1);
  }
}

int client(int port) {
  int fds[2];
  for (int& fd : fds) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(port);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fail("connect");
  }
  const int x = fds[0], y = fds[1];
  for (int i = 0; i < 12; ++i) {
    usleep(20000);
    exchange(y, 'p');
  }
  usleep(20000);
  exchange(x, '1');
  exchange(x, '2');
  close(x);
  close(y);
  printf("RESULT ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string role;
  int port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--role")
      role = argv[i + 1];
    else if (k == "--port")
      port = atoi(argv[i + 1]);
  }
  if (port <= 0 || (role != "server" && role != "client")) {
    fprintf(stderr, "usage: rs_pool --role server|client --port P\n");
    return 2;
  }
  return role == "server" ? server(port) : client(port);
}
