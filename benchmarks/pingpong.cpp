// pingpong: a TCP ping-pong made of plain blocking socket calls only (socket,
// setsockopt, bind, listen, accept, connect, send, recv, shutdown, close), so
// that any socket preload library (librsock, rsocket's librspreload.so) can
// carry it without special cases. Used by benchmarks/rdma.sh.
//
//   pingpong server ADDR PORT
//       accepts ONE connection and echoes every byte back until EOF.
//   pingpong client ADDR PORT [SIZE=64] [ITERS=2000] [WARMUP=200]
//       sends SIZE bytes, waits for the SIZE bytes to come back, ITERS times
//       after WARMUP unmeasured rounds, and prints one line:
//         pingpong: size=64 iters=2000 p50_us=... p99_us=... min_us=... avg_us=...
//                   cpu_us=...
//       Latencies are half round trips (RTT/2, as sockperf reports them);
//       cpu_us is the client's CPU time (user + system) per round trip.
// Exit status: 0 on success, 1 on any socket error (printed with errno).
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace {

int fail(const char* what) {
  fprintf(stderr, "pingpong: %s: %s\n", what, strerror(errno));
  return 1;
}

bool parse_addr(const char* host, const char* port, sockaddr_in* sa) {
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons(static_cast<uint16_t>(atoi(port)));
  return inet_pton(AF_INET, host, &sa->sin_addr) == 1;
}

double cpu_us() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec +
         ru.ru_stime.tv_usec;
}

double now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

// Sends/receives exactly len bytes. false on error or EOF (errno 0 on EOF).
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

bool recv_all(int fd, char* p, size_t len) {
  while (len > 0) {
    ssize_t n = recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) errno = 0;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
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
  set_nodelay(fd);
  char buf[65536];
  unsigned long long echoed = 0;
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) break;
    if (n < 0) return fail("recv");
    if (!send_all(fd, buf, static_cast<size_t>(n))) return fail("send");
    echoed += static_cast<unsigned long long>(n);
  }
  printf("pingpong: server echoed %llu bytes\n", echoed);
  close(fd);
  close(lfd);
  return 0;
}

int client(const sockaddr_in& sa, size_t size, int iters, int warmup) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return fail("socket");
  if (connect(fd, reinterpret_cast<const sockaddr*>(&sa), sizeof sa) != 0) return fail("connect");
  set_nodelay(fd);
  std::vector<char> out(size, 'p'), in(size);
  std::vector<double> half_rtt;
  half_rtt.reserve(static_cast<size_t>(iters));
  double cpu0 = 0;
  for (int i = 0; i < warmup + iters; ++i) {
    if (i == warmup) cpu0 = cpu_us();
    out[0] = static_cast<char>(i);
    const double t0 = now_us();
    if (!send_all(fd, out.data(), size)) return fail("send");
    if (!recv_all(fd, in.data(), size)) return fail(errno ? "recv" : "recv: unexpected EOF");
    const double t1 = now_us();
    if (in[0] != out[0]) {
      fprintf(stderr, "pingpong: reply %d does not match its request\n", i);
      return 1;
    }
    if (i >= warmup) half_rtt.push_back((t1 - t0) / 2);
  }
  const double cpu = (cpu_us() - cpu0) / iters;
  shutdown(fd, SHUT_WR);
  char c;
  while (recv(fd, &c, 1, 0) > 0) {  // the server's EOF: it has seen ours
  }
  close(fd);
  std::vector<double> s = half_rtt;
  std::sort(s.begin(), s.end());
  auto pct = [&](double p) {  // nearest rank
    size_t k = static_cast<size_t>(p / 100.0 * static_cast<double>(s.size()) + 0.999999);
    return s[std::min(s.size(), std::max<size_t>(k, 1)) - 1];
  };
  double sum = 0;
  for (double v : s) sum += v;
  printf(
      "pingpong: size=%zu iters=%d p50_us=%.3f p99_us=%.3f min_us=%.3f avg_us=%.3f cpu_us=%.1f\n",
      size, iters, pct(50), pct(99), s.front(), sum / static_cast<double>(s.size()), cpu);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  sockaddr_in sa;
  if (argc >= 4 && strcmp(argv[1], "server") == 0 && parse_addr(argv[2], argv[3], &sa))
    return server(sa);
  if (argc >= 4 && strcmp(argv[1], "client") == 0 && parse_addr(argv[2], argv[3], &sa)) {
    const long size = argc > 4 ? atol(argv[4]) : 64;
    const int iters = argc > 5 ? atoi(argv[5]) : 2000;
    const int warmup = argc > 6 ? atoi(argv[6]) : 200;
    if (size >= 1 && size <= (1 << 20) && iters >= 1 && warmup >= 0)
      return client(sa, static_cast<size_t>(size), iters, warmup);
  }
  fprintf(stderr,
          "usage: pingpong server ADDR PORT\n"
          "       pingpong client ADDR PORT [SIZE=64] [ITERS=2000] [WARMUP=200]\n");
  return 2;
}
