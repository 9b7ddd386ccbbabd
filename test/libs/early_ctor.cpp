// A library whose constructor uses the socket API before librsock's own
// constructor may have run (preload it before or after librsock.so). It
// exercises the wrappers' lazy resolution and the runtime's first-use init:
// a loopback TCP round trip, poll and a socketpair, all from a constructor.
// The result is printed so that the test can check it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

namespace {

bool socketpair_round_trip() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) return false;
  char out = 'x', in = 0;
  bool ok = write(sv[0], &out, 1) == 1;
  pollfd p = {sv[1], POLLIN, 0};
  ok = ok && poll(&p, 1, 1000) == 1 && read(sv[1], &in, 1) == 1 && in == out;
  close(sv[0]);
  close(sv[1]);
  return ok;
}

bool tcp_round_trip() {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (l < 0 || bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 1) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return false;
  int c = socket(AF_INET, SOCK_STREAM, 0);
  bool ok = connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  int s = accept(l, nullptr, nullptr);
  const char msg[] = "early";
  char buf[8] = {};
  ok = ok && s >= 0 && send(c, msg, sizeof msg, 0) == sizeof msg &&
       recv(s, buf, sizeof msg, MSG_WAITALL) == sizeof msg && memcmp(buf, msg, sizeof msg) == 0;
  close(c);
  if (s >= 0) close(s);
  close(l);
  return ok;
}

__attribute__((constructor)) void early() {
  bool ok = socketpair_round_trip() && tcp_round_trip();
  dprintf(2, "early_ctor: %s\n", ok ? "ok" : "FAILED");
}

}  // namespace
