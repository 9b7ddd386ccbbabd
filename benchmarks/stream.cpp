// stream: one-way TCP streaming made of plain blocking socket calls only
// (socket, setsockopt, bind, listen, accept, connect, send, recv, shutdown,
// close), so that any socket preload library (librsock, rsocket's
// librspreload.so) can carry it without special cases. The RECEIVER measures
// the rate. Used by benchmarks/rdma.sh.
//
//   stream server ADDR PORT
//       accepts ONE connection, reads until EOF, answers with the byte count
//       (8 bytes) and prints one line:
//         stream: received=BYTES seconds=S MBps=R
//       seconds = first byte to EOF; MBps = 10^6 bytes per second; then
//       cpu=S, the process's user + system time, on a line of its own:
//         stream: cpu=S
//   stream client ADDR PORT [SIZE=65000] [SECONDS=3]
//       writes SIZE-byte buffers for SECONDS, shuts down its sending side,
//       waits for the server's count and prints:
//         stream: sent=BYTES acked=BYTES seconds=S
//         stream: cpu=S
// Exit status: 0 on success (client: acked == sent), 1 otherwise.
#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <vector>

namespace {

int fail(const char* what) {
  fprintf(stderr, "stream: %s: %s\n", what, strerror(errno));
  return 1;
}

bool parse_addr(const char* host, const char* port, sockaddr_in* sa) {
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons(static_cast<uint16_t>(atoi(port)));
  return inet_pton(AF_INET, host, &sa->sin_addr) == 1;
}

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// This process's CPU time so far (user + system), in seconds.
double cpu_s() {
  rusage ru = {};
  getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& tv) {
    return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6;
  };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

bool send_all(int fd, const char* p, size_t len) {
  while (len > 0) {
    ssize_t n = send(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

int server(const sockaddr_in& sa) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) return fail("socket");
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(lfd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) return fail("bind");
  if (listen(lfd, 4) != 0) return fail("listen");
  int fd = accept(lfd, nullptr, nullptr);
  if (fd < 0) return fail("accept");
  std::vector<char> buf(65000);
  uint64_t total = 0;
  double first = 0, last = 0;
  for (;;) {
    ssize_t n = recv(fd, buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("recv");
    last = now_s();
    if (n == 0) break;
    if (total == 0) first = last;
    total += static_cast<uint64_t>(n);
  }
  uint64_t be = htobe64(total);
  if (!send_all(fd, reinterpret_cast<const char*>(&be), sizeof be)) return fail("send count");
  const double secs = last - first;
  printf("stream: received=%llu seconds=%.3f MBps=%.2f\n", static_cast<unsigned long long>(total),
         secs, secs > 0 ? static_cast<double>(total) / secs / 1e6 : 0.0);
  printf("stream: cpu=%.3f\n", cpu_s());
  close(fd);
  close(lfd);
  return 0;
}

int client(const sockaddr_in& sa, size_t size, double seconds) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return fail("socket");
  if (connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) return fail("connect");
  std::vector<char> buf(size);
  for (size_t i = 0; i < size; ++i) buf[i] = static_cast<char>(i * 131);
  uint64_t sent = 0;
  const double t0 = now_s();
  double t = t0;
  while (t - t0 < seconds) {
    if (!send_all(fd, buf.data(), size)) return fail("send");
    sent += size;
    t = now_s();
  }
  if (shutdown(fd, SHUT_WR) != 0) return fail("shutdown");
  uint64_t be = 0;
  size_t got = 0;
  while (got < sizeof be) {
    ssize_t n = recv(fd, reinterpret_cast<char*>(&be) + got, sizeof be - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = 0;
    if (n <= 0) return fail(errno ? "recv count" : "recv count: unexpected EOF");
    got += static_cast<size_t>(n);
  }
  close(fd);
  const uint64_t acked = be64toh(be);
  printf("stream: sent=%llu acked=%llu seconds=%.3f\n", static_cast<unsigned long long>(sent),
         static_cast<unsigned long long>(acked), t - t0);
  printf("stream: cpu=%.3f\n", cpu_s());
  if (acked != sent) {
    fprintf(stderr, "stream: the server received %llu of %llu bytes\n",
            static_cast<unsigned long long>(acked), static_cast<unsigned long long>(sent));
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sockaddr_in sa;
  if (argc >= 4 && strcmp(argv[1], "server") == 0 && parse_addr(argv[2], argv[3], &sa))
    return server(sa);
  if (argc >= 4 && strcmp(argv[1], "client") == 0 && parse_addr(argv[2], argv[3], &sa)) {
    const long size = argc > 4 ? atol(argv[4]) : 65000;
    const double seconds = argc > 5 ? atof(argv[5]) : 3;
    if (size >= 1 && size <= (16 << 20) && seconds > 0)
      return client(sa, static_cast<size_t>(size), seconds);
  }
  fprintf(stderr,
          "usage: stream server ADDR PORT\n"
          "       stream client ADDR PORT [SIZE=65000] [SECONDS=3]\n");
  return 2;
}
