// rs_sleepclose: a blocking ping-pong in which the client sleeps on every
// hop, then the client closes; prints the state the server's kernel socket
// is left in. For WakeupsTest.ACloseAfterSleepsSendsAFin (test/preload/
// wakeups_test.cpp). Plain POSIX calls only, so it runs the same with or
// without librsock preloaded.
//
//   rs_sleepclose --port P [--rounds N]
//       forks a client that connects to 127.0.0.1:P. N times the server
//       waits 5 ms (the client is asleep in a blocking recv by then), sends
//       one byte, and takes the client's one-byte answer. The client then
//       close()s and exits. The server reaps it, reads the end of the
//       stream, waits 50 ms (a reset would have come by then) and asks the
//       kernel, bypassing any preloaded library, for its socket's TCP state.
//       Prints "RESULT rounds=N eof=1 state=close_wait" (a FIN came),
//       "state=close" (a reset came) or "state=<number>".
// Exit 0 when the rounds and the EOF went as above, 1 on any failure, 2 on
// bad usage.
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

#include <string>

#include "progs.h"

namespace {

int fail(const char* what) {
  fprintf(stderr, "rs_sleepclose: %s: %s\n", what, strerror(errno));
  return 1;
}

bool recv_one(int fd) {
  char b;
  ssize_t n;
  do n = recv(fd, &b, 1, 0);
  while (n < 0 && errno == EINTR);
  return n == 1;
}

bool send_one(int fd) {
  const char b = 'x';
  return send(fd, &b, 1, MSG_NOSIGNAL) == 1;
}

int client(int port, int rounds) {
  const int s = socket(AF_INET, SOCK_STREAM, 0);
  const sockaddr_in a = loopback(port);
  if (s < 0 || connect(s, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    return fail("client connect");
  for (int i = 0; i < rounds; ++i)
    if (!recv_one(s) || !send_one(s)) return fail("client round");
  if (close(s) != 0) return fail("client close");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0, rounds = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--port")
      port = atoi(argv[i + 1]);
    else if (k == "--rounds")
      rounds = atoi(argv[i + 1]);
    else
      return 2;
  }
  if (port <= 0 || rounds <= 0) return 2;
  const int l = listen_loopback(port, 4);
  if (l < 0) return fail("listen");
  const pid_t pid = fork();
  if (pid < 0) return fail("fork");
  if (pid == 0) {
    close(l);
    _exit(client(port, rounds));
  }
  const int s = accept(l, nullptr, nullptr);
  if (s < 0) return fail("accept");
  for (int i = 0; i < rounds; ++i) {
    pause_ms(5);
    if (!send_one(s) || !recv_one(s)) return fail("server round");
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "rs_sleepclose: the client failed\n");
    return 1;
  }
  char b;
  const ssize_t eof = recv(s, &b, 1, 0);
  pause_ms(50);
  tcp_info ti = {};
  socklen_t len = sizeof ti;
  if (syscall(SYS_getsockopt, s, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
    return fail("getsockopt(TCP_INFO)");
  const char* state = ti.tcpi_state == TCP_CLOSE_WAIT ? "close_wait"
                      : ti.tcpi_state == TCP_CLOSE    ? "close"
                                                      : nullptr;
  if (state)
    printf("RESULT rounds=%d eof=%d state=%s\n", rounds, eof == 0 ? 1 : 0, state);
  else
    printf("RESULT rounds=%d eof=%d state=%d\n", rounds, eof == 0 ? 1 : 0, ti.tcpi_state);
  close(s);
  close(l);
  return eof == 0 ? 0 : 1;
}
