// rs_stale: an epoll set must say nothing of an fd once it is closed, for
// the preload test TcpFirstTest.AClosedFdLeavesNoRegistrationBehind. On
// kernel TCP a registration goes with the socket's file at its close; a
// pairing that ended on plain TCP hands librsock's registration of the fd
// to the kernel while librsock may still hold a dup of the socket, which
// would keep it reporting the closed fd's socket.
//
//   rs_stale --role server --port P --connections N --send-after-ms S (ms,
//       like C and W below, under 1000)
//       accepts N connections one after the other; S ms after each accept
//       writes one byte on it, then waits for the client's close (EOF).
//       Prints READY after listen(), "RESULT served=N" at the end.
//   rs_stale --role client --port P --connections N --close-after-ms C
//            --watch-ms W [--add-after-ms A]
//       for each connection: socket, connect, (sleeps A ms,) EPOLL_CTL_ADD
//       for EPOLLIN with data.fd = the fd, sleeps C ms, closes the fd (without
//       EPOLL_CTL_DEL, as programs do), then watches the set for W ms. An
//       event there names a closed fd: "STALE" and exit 1. Prints
//       "RESULT clean=N" when none came.
//   rs_stale --role server --port P --held 1 --send-after-ms S
//   rs_stale --role client --port P --held 1 --watch-ms W
//       a registration that outlives its fd: the client connects A, adds
//       it (EPOLLIN, level-triggered), lets a process it starts through
//       system() keep A's socket for 2 s ("sleep 2 &": librsock does not
//       see that child), closes A without EPOLL_CTL_DEL, then connects B,
//       which gets A's number, and adds it too. The server accepts A and
//       B, and S ms later writes a byte on A alone. On kernel TCP the set
//       still holds A's registration (the kernel drops it with the file,
//       which the child keeps) and reports A under A's data; B must not
//       be reported: "STALE" and exit 1 if it is, "RESULT clean=1" if
//       nothing names B within W ms. The server waits for A's end (the
//       child's exit) and prints "RESULT served=2".
//   rs_stale --role client --port P --connections N --once 1 --watch-ms W
//       one answer names an fd once: for each connection, socket, connect,
//       EPOLL_CTL_ADD for EPOLLIN (level-triggered, data.fd = the fd), then
//       epoll_wait for up to 8 events in 10 ms slices for W ms, while the
//       server's byte waits unread (each answer reports the fd); then the
//       close. An answer that names the fd twice: "TWICE" and exit 1.
//       Prints "RESULT once=N answers=A" when none did (A: the answers
//       that reported the fd).
// Every wait is bounded; exit 1 on any failure, 2 on bad usage.
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "progs.h"

namespace {

[[noreturn]] void fail(const char* what) {
  fprintf(stderr, "rs_stale: %s: %s\n", what, strerror(errno));
  exit(1);
}

// A blocking connect to the server, added to ep for EPOLLIN
// (level-triggered) with `data`, or with the fd itself as data.fd for
// kDataIsFd. Returns the fd.
constexpr uint64_t kDataIsFd = ~0ull;
int connect_and_add(int ep, int port, uint64_t data, int add_after_ms = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const sockaddr_in a = loopback(port);
  if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) fail("connect");
  if (add_after_ms > 0) pause_ms(add_after_ms);
  epoll_event ev = {};
  ev.events = EPOLLIN;
  if (data == kDataIsFd)
    ev.data.fd = fd;
  else
    ev.data.u64 = data;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) fail("epoll_ctl ADD");
  return fd;
}

int server(int port, int n, int send_after_ms) {
  const int l = listen_loopback(port, 16);
  if (l < 0) fail("listen");
  printf("READY\n");
  fflush(stdout);
  for (int i = 0; i < n; ++i) {
    const int c = accept(l, nullptr, nullptr);
    if (c < 0) fail("accept");
    pause_ms(send_after_ms);
    if (write(c, "x", 1) != 1) fail("write");
    pollfd p = {c, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) fail("the client's close never came");
    char b;
    // The client closes over our unread byte: a reset, or its FIN.
    if (read(c, &b, 1) != 0 && errno != ECONNRESET) fail("read: no end");
    close(c);
  }
  printf("RESULT served=%d\n", n);
  return 0;
}

int server_held(int port, int send_after_ms) {
  const int l = listen_loopback(port, 16);
  if (l < 0) fail("listen");
  printf("READY\n");
  fflush(stdout);
  const int a = accept(l, nullptr, nullptr);
  const int b = a < 0 ? -1 : accept(l, nullptr, nullptr);
  if (b < 0) fail("accept");
  pause_ms(send_after_ms);
  if (write(a, "x", 1) != 1) fail("write");
  char c;
  for (const int fd : {a, b}) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 10000) != 1) fail("the client's end never came");
    if (read(fd, &c, 1) != 0 && errno != ECONNRESET) fail("read: no end");
    close(fd);
  }
  printf("RESULT served=2\n");
  return 0;
}

int client_held(int port, int watch_ms) {
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) fail("epoll_create1");
  const int a = connect_and_add(ep, port, 1);
  if (system("sleep 2 &") != 0) fail("system");
  if (close(a) != 0) fail("close");
  const int b = connect_and_add(ep, port, 2);
  if (b != a) {
    fprintf(stderr, "rs_stale: B got fd %d, not A's %d\n", b, a);
    return 1;
  }
  // In slices: the set may report A (the kernel's way) before the watch is
  // over, and every report is looked at.
  for (int i = 0; i < watch_ms / 10; ++i) {
    epoll_event got;
    const int k = epoll_wait(ep, &got, 1, 10);
    if (k < 0 && errno != EINTR) fail("epoll_wait");
    if (k > 0 && got.data.u64 == 2) {
      printf("STALE B (fd %d) reported, events 0x%x: the byte came on A\n", b, got.events);
      return 1;
    }
  }
  close(b);
  printf("RESULT clean=1\n");
  return 0;
}

int client(int port, int n, int add_after_ms, int close_after_ms, int watch_ms) {
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) fail("epoll_create1");
  for (int i = 0; i < n; ++i) {
    const int fd = connect_and_add(ep, port, kDataIsFd, add_after_ms);
    pause_ms(close_after_ms);
    if (close(fd) != 0) fail("close");
    epoll_event got;
    const int k = epoll_wait(ep, &got, 1, watch_ms);
    if (k < 0) fail("epoll_wait");
    if (k > 0) {
      printf("STALE connection %d: fd %d (closed) reported, events 0x%x\n", i, got.data.fd,
             got.events);
      return 1;
    }
  }
  printf("RESULT clean=%d\n", n);
  return 0;
}

int client_once(int port, int n, int watch_ms) {
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) fail("epoll_create1");
  int answers = 0;
  for (int i = 0; i < n; ++i) {
    const int fd = connect_and_add(ep, port, kDataIsFd);
    for (const int64_t end = now_ms() + watch_ms; now_ms() < end;) {
      epoll_event got[8];
      const int k = epoll_wait(ep, got, 8, 10);
      if (k < 0 && errno != EINTR) fail("epoll_wait");
      int named = 0;
      for (int j = 0; j < k; ++j)
        if (got[j].data.fd == fd) ++named;
      if (named > 1) {
        printf("TWICE connection %d: fd %d named %d times in one answer of %d\n", i, fd, named, k);
        return 1;
      }
      answers += named;
    }
    if (close(fd) != 0) fail("close");
  }
  printf("RESULT once=%d answers=%d\n", n, answers);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string role;
  int port = 0, n = 0, send_after = 0, add_after = 0, close_after = 0, watch = 0, held = 0,
      once = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int v = atoi(argv[i + 1]);
    if (k == "--role")
      role = argv[i + 1];
    else if (k == "--port")
      port = v;
    else if (k == "--connections")
      n = v;
    else if (k == "--send-after-ms")
      send_after = v;
    else if (k == "--add-after-ms")
      add_after = v;
    else if (k == "--close-after-ms")
      close_after = v;
    else if (k == "--watch-ms")
      watch = v;
    else if (k == "--held")
      held = v;
    else if (k == "--once")
      once = v;
  }
  if (held && port > 0 && role == "server") return server_held(port, send_after);
  if (held && port > 0 && role == "client") return client_held(port, watch);
  if (once && port > 0 && n > 0 && role == "client") return client_once(port, n, watch);
  if (port <= 0 || n <= 0 || (role != "server" && role != "client")) {
    fprintf(stderr,
            "usage: rs_stale --role server --port P --connections N --send-after-ms S\n"
            "       rs_stale --role client --port P --connections N --close-after-ms C "
            "--watch-ms W [--add-after-ms A]\n"
            "       rs_stale --role server|client --port P --held 1 [--send-after-ms S] "
            "[--watch-ms W]\n"
            "       rs_stale --role client --port P --connections N --once 1 --watch-ms W\n");
    return 2;
  }
  return role == "server" ? server(port, n, send_after)
                          : client(port, n, add_after, close_after, watch);
}
