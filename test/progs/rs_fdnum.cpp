// rs_fdnum: what a program sees of descriptor numbers and of its listen
// backlog, for the preload tests (test/preload/fdnum_test.cpp). It uses only
// plain POSIX calls, so it behaves the same with or without librsock.
//
//   rs_fdnum server PORT COUNT BACKLOG DELAY_MS
//       listen(BACKLOG) on 127.0.0.1:PORT, print READY, sleep DELAY_MS (so
//       that connections queue up), then accept COUNT connections: read one
//       byte from each and write it back. Prints "RESULT served=S".
//   rs_fdnum seq PORT COUNT
//       COUNT blocking connects, one after the other, each kept open after
//       one byte went each way; then one open("/dev/null").
//   rs_fdnum nonblock PORT COUNT
//       COUNT nonblocking connects issued back to back (each returns
//       EINPROGRESS or 0), then poll for each, then one byte each way;
//       then one open("/dev/null").
//   rs_fdnum burst PORT COUNT
//       COUNT threads connect at once (blocking), one byte each way.
// seq and nonblock print "RESULT ok=K dense=0|1 highest=H first=F file=D":
// dense is 1 when the sockets got consecutive numbers and the file the next
// one, as the kernel numbers them for a program that closes nothing; highest
// is the highest number among the sockets and the file. burst prints
// "RESULT ok=K". Exit status 0 when every connection carried its byte, 1
// otherwise (the numbers are the test's to judge).
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <vector>

#include "progs.h"

namespace {

// One byte there and back on a blocking socket.
bool ping(int fd) {
  char c = 'x';
  if (write(fd, &c, 1) != 1) return false;
  c = 0;
  return read(fd, &c, 1) == 1 && c == 'x';
}

int server(int port, int count, int backlog, int delay_ms) {
  int l = listen_loopback(port, backlog);
  if (l < 0) {
    perror("rs_fdnum server: bind/listen");
    return 1;
  }
  printf("READY\n");
  fflush(stdout);
  usleep(static_cast<useconds_t>(delay_ms) * 1000);
  int served = 0;
  for (int i = 0; i < count; ++i) {
    int c = accept(l, nullptr, nullptr);
    if (c < 0) {
      perror("rs_fdnum server: accept");
      break;
    }
    char b;
    if (read(c, &b, 1) == 1 && write(c, &b, 1) == 1) ++served;
    close(c);
  }
  printf("RESULT served=%d\n", served);
  return served == count ? 0 : 1;
}

int report_numbers(const std::vector<int>& fds, int ok) {
  const int file = open("/dev/null", O_RDONLY);
  bool dense = !fds.empty() && file == fds.back() + 1;
  for (size_t i = 1; i < fds.size(); ++i) dense = dense && fds[i] == fds[i - 1] + 1;
  int highest = file;
  for (int fd : fds) highest = fd > highest ? fd : highest;
  printf("RESULT ok=%d dense=%d highest=%d first=%d file=%d\n", ok, dense ? 1 : 0, highest,
         fds.empty() ? -1 : fds.front(), file);
  if (!dense) {
    fprintf(stderr, "rs_fdnum: numbers:");
    for (int fd : fds) fprintf(stderr, " %d", fd);
    fprintf(stderr, ", then the file: %d\n", file);
  }
  return ok == static_cast<int>(fds.size()) ? 0 : 1;
}

int sequential(int port, int count) {
  std::vector<int> fds;
  int ok = 0;
  const sockaddr_in a = loopback(port);
  for (int i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    fds.push_back(fd);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 && ping(fd)) ++ok;
  }
  return report_numbers(fds, ok);
}

int nonblocking(int port, int count) {
  std::vector<int> fds;
  const sockaddr_in a = loopback(port);
  for (int i = 0; i < count; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    fds.push_back(fd);
    if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS)
      perror("rs_fdnum: connect");
  }
  int ok = 0;
  for (int fd : fds) {
    pollfd p = {fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (poll(&p, 1, 30000) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ||
        err != 0)
      continue;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (ping(fd)) ++ok;
  }
  return report_numbers(fds, ok);
}

int burst(int port, int count) {
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  const sockaddr_in a = loopback(port);
  for (int i = 0; i < count; ++i)
    threads.emplace_back([&] {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 && ping(fd)) ++ok;
      close(fd);
    });
  for (auto& t : threads) t.join();
  printf("RESULT ok=%d\n", ok.load());
  return ok == count ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: rs_fdnum server|seq|nonblock|burst PORT COUNT [BACKLOG DELAY_MS]\n");
    return 2;
  }
  const int port = atoi(argv[2]), count = atoi(argv[3]);
  if (strcmp(argv[1], "server") == 0 && argc == 6)
    return server(port, count, atoi(argv[4]), atoi(argv[5]));
  if (strcmp(argv[1], "seq") == 0) return sequential(port, count);
  if (strcmp(argv[1], "nonblock") == 0) return nonblocking(port, count);
  if (strcmp(argv[1], "burst") == 0) return burst(port, count);
  fprintf(stderr, "rs_fdnum: bad arguments\n");
  return 2;
}
