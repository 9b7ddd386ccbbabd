// What the test programs share. Plain POSIX calls only, so that a program
// runs the same with and without librsock; each program keeps its own way
// of reporting a failure.
#pragma once

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

// 127.0.0.1:port.
inline sockaddr_in loopback(int port) {
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A TCP listener on 127.0.0.1:port with SO_REUSEADDR; `type_flags` are
// or'ed into socket()'s type (SOCK_CLOEXEC, SOCK_NONBLOCK). Returns the fd,
// or -1 with errno.
inline int listen_loopback(int port, int backlog, int type_flags = 0) {
  const int l = socket(AF_INET, SOCK_STREAM | type_flags, 0);
  if (l < 0) return -1;
  const int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  const sockaddr_in a = loopback(port);
  if (bind(l, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 || listen(l, backlog) != 0) {
    const int err = errno;
    close(l);
    errno = err;
    return -1;
  }
  return l;
}

// Sleeps ms milliseconds (under 1000).
inline void pause_ms(int ms) {
  timespec ts = {0, ms * 1000000L};
  nanosleep(&ts, nullptr);
}

// CLOCK_MONOTONIC in milliseconds.
inline int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}
