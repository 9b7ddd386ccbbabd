// rs_vfork: a vfork() child that calls _exit() without exec (as after a
// failed exec), in a process holding an accelerated connection; for the
// preload test VforkTest (test/preload/vfork_test.cpp).
//
//   rs_vfork --port P
//       listens on 127.0.0.1:P and connects to itself (both ends of one
//       connection in this process: 2 connections for the stats), sends one
//       byte across, then vfork()s a child that calls _exit(3) at once,
//       reaps it, checks that the connection still carries a byte, and
//       prints "RESULT pid=PID child_status=3" and exits 0.
// Exit 1 on any failure (details on stderr), 2 on bad usage.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "--port") {
    fprintf(stderr, "usage: rs_vfork --port P\n");
    return 2;
  }
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(atoi(argv[2])));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int one = 1, l = socket(AF_INET, SOCK_STREAM, 0), c = socket(AF_INET, SOCK_STREAM, 0), s = -1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 4) != 0) {
    fprintf(stderr, "listen: %s\n", strerror(errno));
    return 1;
  }
  // A blocking connect pairs before it returns: accept in a thread meanwhile.
  std::thread acceptor([&] { s = accept(l, nullptr, nullptr); });
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    fprintf(stderr, "connect: %s\n", strerror(errno));
    return 1;
  }
  acceptor.join();
  char b = 'x';
  if (s < 0 || write(c, &b, 1) != 1 || read(s, &b, 1) != 1) {
    fprintf(stderr, "exchange: %s\n", strerror(errno));
    return 1;
  }
  pid_t p = vfork();
  if (p == 0) _exit(3);
  int st = 0;
  if (p < 0 || waitpid(p, &st, 0) != p) {
    fprintf(stderr, "vfork: %s\n", strerror(errno));
    return 1;
  }
  if (write(s, &b, 1) != 1 || read(c, &b, 1) != 1) {
    fprintf(stderr, "exchange after vfork: %s\n", strerror(errno));
    return 1;
  }
  printf("RESULT pid=%d child_status=%d\n", static_cast<int>(getpid()),
         WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return 0;
}
