// rs_fanout: one epoll sleep on many connections, answered in one pass (a
// server answering every connection of one client). Driven by
// test/preload/wakeups_test.cpp with both ends preloaded: the server's
// stats then show one doorbell per round, not one per connection
// (ring/sleepers.h). Plain POSIX calls only.
//
//   rs_fanout --role server --port P --conns N --rounds R
//       listens, prints READY, accepts N connections (in the client's
//       order). Each round: reads one byte from the first connection
//       (blocking), waits 5 ms so that the client sleeps in epoll_wait,
//       then writes one byte, the round's number, to every connection in
//       turn. Then waits for the client's EOF, closes them and prints
//       "RESULT rounds=R".
//   rs_fanout --role client --port P --conns N --rounds R
//       connects N times (one after the other), puts all N in one epoll
//       set; each round writes one byte to the first and waits in
//       epoll_wait until each connection has delivered that round's byte.
//       Prints "RESULT rounds=R bytes=N*R waits=W", W being its epoll_wait
//       calls.
// Every wait is bounded (10 s); exit 1 on any failure, 2 on bad usage.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "progs.h"

namespace {

int fail(const char* what) {
  perror(what);
  return 1;
}

int server(int port, int conns, int rounds) {
  const int l = listen_loopback(port, conns);
  if (l < 0) return fail("listen");
  printf("READY\n");
  std::vector<int> c;
  for (int i = 0; i < conns; ++i) {
    const int fd = accept(l, nullptr, nullptr);
    if (fd < 0) return fail("accept");
    const timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    c.push_back(fd);
  }
  for (int r = 0; r < rounds; ++r) {
    char go;
    if (recv(c[0], &go, 1, 0) != 1) return fail("recv go");
    usleep(5000);
    const char b = static_cast<char>(r);
    for (int fd : c)
      if (send(fd, &b, 1, MSG_NOSIGNAL) != 1) return fail("send");
  }
  // The client closes first: an EOF must not show up in its last round.
  char end;
  if (recv(c[0], &end, 1, 0) != 0) return fail("recv EOF");
  for (int fd : c) close(fd);
  close(l);
  printf("RESULT rounds=%d\n", rounds);
  return 0;
}

int client(int port, int conns, int rounds) {
  std::vector<int> c;
  const int ep = epoll_create1(0);
  if (ep < 0) return fail("epoll_create1");
  for (int i = 0; i < conns; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(port);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      return fail("connect");
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<uint32_t>(i);
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) return fail("epoll_ctl");
    c.push_back(fd);
  }
  long bytes = 0, waits = 0;
  std::vector<epoll_event> evs(conns);
  for (int r = 0; r < rounds; ++r) {
    if (send(c[0], "g", 1, MSG_NOSIGNAL) != 1) return fail("send go");
    std::vector<bool> got(conns, false);
    for (int left = conns; left > 0;) {
      const int n = epoll_wait(ep, evs.data(), conns, 10000);
      ++waits;
      if (n <= 0) {
        fprintf(stderr, "round %d: epoll_wait returned %d with %d bytes missing\n", r, n, left);
        return 1;
      }
      for (int k = 0; k < n; ++k) {
        const uint32_t i = evs[k].data.u32;
        char b;
        if (got[i] || recv(c[i], &b, 1, MSG_DONTWAIT) != 1 || b != static_cast<char>(r)) {
          fprintf(stderr, "round %d: connection %u: a wrong or extra byte\n", r, i);
          return 1;
        }
        got[i] = true;
        ++bytes;
        --left;
      }
    }
  }
  for (int fd : c) close(fd);
  printf("RESULT rounds=%d bytes=%ld waits=%ld\n", rounds, bytes, waits);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IONBF, 0);
  std::string role;
  int port = 0, conns = 0, rounds = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--role")
      role = argv[i + 1];
    else if (k == "--port")
      port = atoi(argv[i + 1]);
    else if (k == "--conns")
      conns = atoi(argv[i + 1]);
    else if (k == "--rounds")
      rounds = atoi(argv[i + 1]);
  }
  if (port <= 0 || conns <= 0 || rounds <= 0 || (argc - 1) % 2 != 0) {
    fprintf(stderr, "usage: rs_fanout --role server|client --port P --conns N --rounds R\n");
    return 2;
  }
  if (role == "server") return server(port, conns, rounds);
  if (role == "client") return client(port, conns, rounds);
  fprintf(stderr, "rs_fanout: --role server or client\n");
  return 2;
}
