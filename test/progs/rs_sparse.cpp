// rs_sparse: sparse traffic over many connections into one epoll set waited
// on by several threads, for the preload test DormantStorm
// (test/preload/storm_test.cpp). Most connections sit quiet for many of the
// server's sleeps, long enough for librsock to stop looking at them on each
// wait (dormant epoll members); each message must still wake the server. A
// lost wakeup shows as an echo that never comes. Plain POSIX calls only.
//
//   rs_sparse --role server --port P --connections N --threads T
//       accepts N connections into one epoll set (EPOLLIN | EPOLLONESHOT,
//       re-armed with EPOLL_CTL_MOD after each turn, as a thread pool does)
//       and runs T threads in epoll_wait on it, each echoing what it reads.
//       Prints READY after listen(), "RESULT echoed=B closed=N" once every
//       connection has ended; exits 0.
//   rs_sparse --role client --port P --connections N --rounds R
//       opens N connections, then R rounds: a message of 1-64 bytes (a
//       pattern per connection and position) to each of 1-8 random
//       connections, then reads every echo back and checks it; every
//       fourth round first pauses 5-25 ms, so that the server sleeps.
//       Prints "RESULT rounds=R bytes=B" and exits 0 iff every echo came
//       back intact.
// Every wait is bounded (10 s); exit 1 on any failure, 2 on bad usage.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "progs.h"

namespace {

constexpr int kWaitMs = 10000;

[[noreturn]] void fail(const char* what) {
  fprintf(stderr, "rs_sparse: %s: %s\n", what, strerror(errno));
  exit(1);
}

uint8_t pattern(int conn, uint64_t pos) {
  return static_cast<uint8_t>((pos * 131 + static_cast<uint64_t>(conn) * 7 + (pos >> 8)) & 0xff);
}

void raise_fd_limit() {
  rlimit r;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

int server(int port, int n, int threads) {
  const int l = listen_loopback(port, 512);
  if (l < 0) fail("listen");
  printf("READY\n");
  fflush(stdout);
  const int ep = epoll_create1(0);
  if (ep < 0) fail("epoll_create1");
  for (int i = 0; i < n; ++i) {
    const int c = accept(l, nullptr, nullptr);
    if (c < 0) fail("accept");
    epoll_event ev = {};
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.fd = c;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) != 0) fail("epoll_ctl ADD");
  }
  close(l);
  std::atomic<uint64_t> echoed{0};
  std::atomic<int> closed{0};
  auto loop = [&] {
    epoll_event evs[8];
    while (closed.load() < n) {
      const int k = epoll_wait(ep, evs, 8, 50);
      if (k < 0 && errno != EINTR) fail("epoll_wait");
      for (int i = 0; i < k; ++i) {
        const int fd = evs[i].data.fd;
        char buf[512];
        const ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r == 0) {
          close(fd);  // ONESHOT: no other thread has it
          closed.fetch_add(1);
          continue;
        }
        if (r < 0 && errno != EAGAIN) fail("recv");
        for (ssize_t off = 0; r > 0 && off < r;) {
          const ssize_t w = send(fd, buf + off, static_cast<size_t>(r - off), MSG_NOSIGNAL);
          if (w < 0) fail("send");
          off += w;
        }
        if (r > 0) echoed.fetch_add(static_cast<uint64_t>(r));
        epoll_event ev = {};
        ev.events = EPOLLIN | EPOLLONESHOT;
        ev.data.fd = fd;
        if (epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev) != 0) fail("epoll_ctl MOD");
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(loop);
  for (auto& t : pool) t.join();
  printf("RESULT echoed=%llu closed=%d\n", (unsigned long long)echoed.load(), closed.load());
  return 0;
}

int client(int port, int n, int rounds) {
  std::vector<int> fds(n);
  std::vector<uint64_t> sent(n, 0);
  for (int i = 0; i < n; ++i) {
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(port);
    if (fds[i] < 0 || connect(fds[i], reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      fail("connect");
  }
  std::mt19937 rng(12345);
  uint64_t bytes = 0;
  for (int round = 0; round < rounds; ++round) {
    if (round % 4 == 3) usleep(5000 + rng() % 20000);
    const int k = 1 + static_cast<int>(rng() % 8);
    std::vector<std::pair<int, size_t>> out;  // connection, length
    for (int j = 0; j < k; ++j) {
      const int c = static_cast<int>(rng() % n);
      bool dup = false;
      for (auto& o : out) dup |= o.first == c;
      if (dup) continue;
      const size_t len = 1 + rng() % 64;
      uint8_t msg[64];
      for (size_t b = 0; b < len; ++b) msg[b] = pattern(c, sent[c] + b);
      if (send(fds[c], msg, len, MSG_NOSIGNAL) != static_cast<ssize_t>(len)) fail("send");
      out.push_back({c, len});
    }
    for (auto& [c, len] : out) {
      uint8_t got[64];
      for (size_t have = 0; have < len;) {
        pollfd p = {fds[c], POLLIN, 0};
        if (poll(&p, 1, kWaitMs) != 1) {
          fprintf(stderr, "rs_sparse: round %d: connection %d: no echo in %d ms (lost wakeup)\n",
                  round, c, kWaitMs);
          exit(1);
        }
        const ssize_t r = recv(fds[c], got + have, len - have, 0);
        if (r <= 0) fail("recv");
        have += static_cast<size_t>(r);
      }
      for (size_t b = 0; b < len; ++b)
        if (got[b] != pattern(c, sent[c] + b)) {
          fprintf(stderr, "rs_sparse: round %d: connection %d: byte %llu wrong\n", round, c,
                  (unsigned long long)(sent[c] + b));
          exit(1);
        }
      sent[c] += len;
      bytes += len;
    }
  }
  for (int fd : fds) close(fd);
  printf("RESULT rounds=%d bytes=%llu\n", rounds, (unsigned long long)bytes);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string role;
  int port = 0, n = 0, threads = 2, rounds = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--role")
      role = argv[i + 1];
    else if (k == "--port")
      port = atoi(argv[i + 1]);
    else if (k == "--connections")
      n = atoi(argv[i + 1]);
    else if (k == "--threads")
      threads = atoi(argv[i + 1]);
    else if (k == "--rounds")
      rounds = atoi(argv[i + 1]);
  }
  if (port <= 0 || n <= 0 || threads <= 0 || (role == "client" && rounds <= 0) ||
      (role != "server" && role != "client")) {
    fprintf(stderr,
            "usage: rs_sparse --role server --port P --connections N [--threads T]\n"
            "       rs_sparse --role client --port P --connections N --rounds R\n");
    return 2;
  }
  raise_fd_limit();
  return role == "server" ? server(port, n, threads) : client(port, n, rounds);
}
