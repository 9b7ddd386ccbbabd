// connrate: connection setup rate, the short-connection workload of
// `make bench` (benchmarks/conns.sh). Plain POSIX calls only, so it runs the
// same with and without librsock.
//
//   connrate server PORT block|epoll
//       block: accept, read 1 byte, write it back, close, one connection
//       after the other. epoll: a nonblocking listener and connections in
//       one edge-triggered epoll loop, the same exchange. Prints READY and
//       serves until SIGTERM or SIGINT, then prints "SERVED conns=N
//       cpu_us=C" (its CPU time, user and system, per connection it served)
//       and exits 0 (so that librsock writes its stats line).
//   connrate client PORT N block|epoll [INFLIGHT]
//       N connections to 127.0.0.1:PORT, each: socket, connect, write 1
//       byte, read it back, close. block: one after the other. epoll:
//       nonblocking connects, INFLIGHT (default 8) at a time, in one epoll
//       loop. Prints "RESULT conns=N seconds=S rate=R p50_us=P p99_us=Q
//       cpu_us=C",
//       where the percentiles are of one connection's time from socket() to
//       the byte read back, and cpu_us the process's CPU time (user and
//       system) per connection. Exit status 0 when all N carried their byte.
//   connrate sink PORT K BYTES [IDLE_MS]
//       a server for hold: accepts K connections in an epoll loop, reads
//       BYTES from each and answers one byte; once all K have, prints its
//       own cost per connection (as hold does, once its descriptor count
//       has held still for half a second) and serves until killed.
//       With IDLE_MS, it prints the cost again as an IDLE line after the
//       connections have been idle for that long (its epoll loop runs on).
//   connrate hold PORT K BYTES [IDLE_MS]
//       opens K connections at once (blocking, one after the other), writes
//       BYTES on each and reads the sink's one-byte answer, so that every
//       connection has carried data and is idle. Then prints what the K
//       connections cost this process, per connection, against its state
//       before the first: "RESULT fds=F vm_kib=V rss_kib=R shmem_kib=S
//       pinned_kib=L" (descriptors, VmSize, VmRSS, RssShmem, and VmLck +
//       VmPin, locked and pinned pages such as registered RDMA memory, from
//       /proc/self/status), then " seconds=T", the time from the first
//       socket() to the last answer, and " settled=U", the time from the
//       first socket() to the last change of this process's descriptor
//       count (a connection that pairs in the background gets its
//       descriptors after its first bytes; the cost is measured once the
//       count has held still for half a second), and waits to be killed. With
//       IDLE_MS, "IDLE fds=..." (the same fields, no seconds) after sleeping
//       that long.
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

sockaddr_in loopback(int port) {
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

volatile sig_atomic_t g_stop = 0;
long g_served = 0;  // connections the server closed after its exchange

// This process's CPU time (user + system) so far, in microseconds.
double cpu_us() {
  rusage ru = {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

int serve_blocking(int l) {
  while (!g_stop) {
    int c = accept(l, nullptr, nullptr);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      perror("connrate: accept");
      return 1;
    }
    char b;
    if (read(c, &b, 1) == 1) (void)!write(c, &b, 1);
    close(c);
    ++g_served;
  }
  return 0;
}

int serve_epoll(int l) {
  fcntl(l, F_SETFL, O_NONBLOCK);
  int ep = epoll_create1(0);
  epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.fd = l;
  epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
  epoll_event evs[64];
  while (!g_stop) {
    int n = epoll_wait(ep, evs, 64, -1);
    for (int i = 0; i < n; ++i) {
      int fd = evs[i].data.fd;
      if (fd == l) {
        for (int c; (c = accept4(l, nullptr, nullptr, SOCK_NONBLOCK)) >= 0;) {
          epoll_event ce = {};
          ce.events = EPOLLIN | EPOLLRDHUP | EPOLLET;
          ce.data.fd = c;
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
        }
        continue;
      }
      char b;
      ssize_t r = read(fd, &b, 1);
      if (r == 1) (void)!write(fd, &b, 1);
      if (r == 1 || r == 0 || (r < 0 && errno != EAGAIN)) {
        close(fd);  // one exchange each
        ++g_served;
      }
    }
  }
  return 0;
}

// SIGTERM and SIGINT set g_stop; no SA_RESTART, so accept/epoll_wait/pause
// return EINTR and the loops end (the process exits 0 and librsock writes
// its stats line).
void stop_on_signals() {
  struct sigaction sa = {};
  sa.sa_handler = [](int) { g_stop = 1; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

// A listener on 127.0.0.1:port, or -1 (reported).
int listen_loopback(int port, int backlog) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = loopback(port);
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, backlog) != 0) {
    perror("connrate: bind/listen");
    close(l);
    return -1;
  }
  return l;
}

int server(int port, bool epoll) {
  const int l = listen_loopback(port, 512);
  if (l < 0) return 1;
  stop_on_signals();
  printf("READY\n");
  fflush(stdout);
  const double cpu0 = cpu_us();
  const int rc = epoll ? serve_epoll(l) : serve_blocking(l);
  if (g_served > 0)
    printf("SERVED conns=%ld cpu_us=%.1f\n", g_served,
           (cpu_us() - cpu0) / static_cast<double>(g_served));
  return rc;
}

void report(int n, int ok, int64_t t0, double cpu0, std::vector<int64_t>& lat) {
  const double secs = static_cast<double>(now_ns() - t0) / 1e9;
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) {
    return lat.empty() ? 0.0 : static_cast<double>(lat[static_cast<size_t>(p * (lat.size() - 1))]) / 1e3;
  };
  printf("RESULT conns=%d ok=%d seconds=%.3f rate=%.0f p50_us=%.1f p99_us=%.1f cpu_us=%.1f\n", n,
         ok, secs, ok / secs, pct(0.5), pct(0.99), (cpu_us() - cpu0) / (n > 0 ? n : 1));
}

int client_blocking(int port, int n) {
  const sockaddr_in a = loopback(port);
  std::vector<int64_t> lat;
  lat.reserve(n);
  int ok = 0;
  const int64_t t0 = now_ns();
  const double cpu0 = cpu_us();
  for (int i = 0; i < n; ++i) {
    const int64_t s = now_ns();
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    char b = 'x';
    if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 && write(fd, &b, 1) == 1 &&
        read(fd, &b, 1) == 1) {
      ++ok;
      lat.push_back(now_ns() - s);
    }
    close(fd);
  }
  report(n, ok, t0, cpu0, lat);
  return ok == n ? 0 : 1;
}

struct Conn {
  int64_t start = 0;
  bool sent = false;
};

int client_epoll(int port, int n, int inflight) {
  const sockaddr_in a = loopback(port);
  int ep = epoll_create1(0);
  std::vector<Conn> conns(65536);
  std::vector<int64_t> lat;
  lat.reserve(n);
  int started = 0, done = 0, ok = 0, live = 0;
  const int64_t t0 = now_ns();
  const double cpu0 = cpu_us();
  auto start_one = [&] {
    const int64_t s = now_ns();
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0 || fd >= static_cast<int>(conns.size())) {
      if (fd >= 0) close(fd);
      ++done;
      return;
    }
    int r = connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
    if (r != 0 && errno != EINPROGRESS) {
      close(fd);
      ++done;
      return;
    }
    conns[fd] = Conn{s, false};
    epoll_event ev = {};
    ev.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    ++live;
  };
  epoll_event evs[64];
  while (done < n) {
    while (live < inflight && started < n) {
      ++started;
      start_one();
    }
    if (live == 0) continue;
    int k = epoll_wait(ep, evs, 64, 10000);
    if (k == 0) {
      fprintf(stderr, "connrate: no event for 10 s\n");
      break;
    }
    for (int i = 0; i < k; ++i) {
      const int fd = evs[i].data.fd;
      Conn& c = conns[fd];
      bool finished = false, good = false;
      if (!c.sent && (evs[i].events & EPOLLOUT)) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        char b = 'x';
        if (err == 0 && write(fd, &b, 1) == 1) {
          c.sent = true;
          epoll_event ev = {};
          ev.events = EPOLLIN | EPOLLRDHUP;
          ev.data.fd = fd;
          epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
        } else {
          finished = true;
        }
      } else if (c.sent && (evs[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
        char b;
        ssize_t r = read(fd, &b, 1);
        if (r < 0 && errno == EAGAIN) continue;
        finished = true;
        good = r == 1;
      } else if (evs[i].events & (EPOLLHUP | EPOLLERR)) {
        finished = true;
      }
      if (finished) {
        if (good) {
          ++ok;
          lat.push_back(now_ns() - c.start);
        }
        epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        close(fd);
        --live;
        ++done;
      }
    }
  }
  report(n, ok, t0, cpu0, lat);
  return ok == n ? 0 : 1;
}

// What this process holds: descriptors and the /proc/self/status lines
// that count memory (KiB).
struct Footprint {
  long fds = 0, vm = 0, rss = 0, shmem = 0, locked = 0, pinned = 0;
};

Footprint footprint() {
  Footprint f;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++f.fds;
    closedir(d);
    --f.fds;  // the directory's own
  }
  if (FILE* st = fopen("/proc/self/status", "r")) {
    char line[256];
    while (fgets(line, sizeof line, st)) {
      sscanf(line, "VmSize: %ld", &f.vm);
      sscanf(line, "VmRSS: %ld", &f.rss);
      sscanf(line, "RssShmem: %ld", &f.shmem);
      sscanf(line, "VmLck: %ld", &f.locked);
      sscanf(line, "VmPin: %ld", &f.pinned);
    }
    fclose(st);
  }
  return f;
}

// Whether this process's descriptor count has held still for kSteadyNs,
// looked at every call (at least every 50 ms); last_change_ns is when it
// last changed.
struct Settle {
  static constexpr int64_t kSteadyNs = 500 * 1000000L;
  long fds = -1;
  int64_t last_change_ns = 0;
  bool steady() {
    const long now_fds = footprint().fds;
    const int64_t t = now_ns();
    if (now_fds != fds) fds = now_fds, last_change_ns = t;
    return t - last_change_ns >= kSteadyNs;
  }
};

// seconds, settled < 0: not reported.
void report_cost(const Footprint& before, int k, double seconds = -1, const char* label = "RESULT",
                 double settled = -1) {
  const Footprint now = footprint();
  const double n = k > 0 ? k : 1;
  printf("%s fds=%.2f vm_kib=%.1f rss_kib=%.1f shmem_kib=%.1f pinned_kib=%.1f", label,
         (now.fds - before.fds) / n, (now.vm - before.vm) / n, (now.rss - before.rss) / n,
         (now.shmem - before.shmem) / n,
         (now.locked + now.pinned - before.locked - before.pinned) / n);
  if (seconds >= 0) printf(" seconds=%.3f", seconds);
  if (settled >= 0) printf(" settled=%.3f", settled);
  printf("\n");
  fflush(stdout);
}

// Reads and discards up to `want` bytes; returns what it read, 0 on EOF or
// error (EAGAIN: -1).
long drain(int fd, long want) {
  static char buf[1 << 16];
  long got = 0;
  while (got < want) {
    ssize_t r = read(fd, buf, std::min<long>(sizeof buf, want - got));
    if (r > 0) {
      got += r;
      continue;
    }
    if (r < 0 && errno == EAGAIN) return got > 0 ? got : -1;
    break;
  }
  return got;
}

int sink(int port, int k, long bytes, int idle_ms) {
  const Footprint before = footprint();
  const int l = listen_loopback(port, 4096);
  if (l < 0) return 1;
  printf("READY\n");
  fflush(stdout);
  fcntl(l, F_SETFL, O_NONBLOCK);
  int ep = epoll_create1(0);
  epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.fd = l;
  epoll_ctl(ep, EPOLL_CTL_ADD, l, &ev);
  std::vector<long> left(1 << 17, -1);
  int done = 0;
  epoll_event evs[64];
  int64_t idle_at = -1;  // when to print the IDLE line (ns), once
  Settle settle;
  bool settling = false;  // all K done, the RESULT line not printed yet
  while (!g_stop) {
    int wait_ms = -1;
    if (settling) {
      if (settle.steady()) {
        report_cost(before, k);
        settling = false;
        if (idle_ms > 0) idle_at = now_ns() + int64_t{idle_ms} * 1000000;
        continue;
      }
      wait_ms = 50;
    } else if (idle_at >= 0) {
      const int64_t left = idle_at - now_ns();
      if (left <= 0) {
        report_cost(before, k, -1, "IDLE");
        idle_at = -1;
        continue;
      }
      wait_ms = static_cast<int>(left / 1000000) + 1;
    }
    int n = epoll_wait(ep, evs, 64, wait_ms);
    for (int i = 0; i < n; ++i) {
      const int fd = evs[i].data.fd;
      if (fd == l) {
        for (int c; (c = accept4(l, nullptr, nullptr, SOCK_NONBLOCK)) >= 0;) {
          if (c >= static_cast<int>(left.size())) {
            close(c);
            continue;
          }
          left[c] = bytes;
          epoll_event ce = {};
          ce.events = EPOLLIN;
          ce.data.fd = c;
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
        }
        if (errno == EMFILE || errno == ENFILE) {
          // Out of fds: the listener would stay readable and this loop
          // spin. Stop accepting; hold gives up on the rest.
          fprintf(stderr, "connrate sink: accept: %s; no more connections\n", strerror(errno));
          epoll_ctl(ep, EPOLL_CTL_DEL, l, nullptr);
        }
        continue;
      }
      if (left[fd] <= 0) {  // idle after its data: only EOF is expected
        char b;
        if (read(fd, &b, 1) == 0) {
          epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
          close(fd);
        }
        continue;
      }
      long r = drain(fd, left[fd]);
      if (r == 0) {
        epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        close(fd);
        continue;
      }
      if (r > 0) left[fd] -= r;
      if (left[fd] == 0) {
        char b = 'k';
        (void)!write(fd, &b, 1);
        if (++done == k) settling = true;
      }
    }
  }
  return 0;
}

int hold(int port, int k, long bytes, int idle_ms) {
  const Footprint before = footprint();
  const sockaddr_in a = loopback(port);
  std::vector<char> data(1 << 16, 'd');
  std::vector<int> fds;
  const int64_t t0 = now_ns();
  for (int i = 0; i < k; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      perror("connrate hold: connect");
      return 1;
    }
    // A server that cannot answer (out of descriptors itself) fails the
    // run in seconds instead of hanging it.
    timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (long sent = 0; sent < bytes;) {
      ssize_t w = write(fd, data.data(), std::min<long>(data.size(), bytes - sent));
      if (w <= 0) {
        perror("connrate hold: write");
        return 1;
      }
      sent += w;
    }
    char b;
    if (read(fd, &b, 1) != 1) {
      fprintf(stderr, "connrate hold: no answer on connection %d\n", i);
      return 1;
    }
    fds.push_back(fd);
  }
  const double seconds = static_cast<double>(now_ns() - t0) / 1e9;
  Settle settle;
  while (!settle.steady() && !g_stop) usleep(50 * 1000);
  report_cost(before, k, seconds, "RESULT", static_cast<double>(settle.last_change_ns - t0) / 1e9);
  if (idle_ms > 0) {
    timespec ts = {idle_ms / 1000, (idle_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR && !g_stop) {
    }
    report_cost(before, k, -1, "IDLE");
  }
  while (!g_stop) pause();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 5 && (strcmp(argv[1], "sink") == 0 || strcmp(argv[1], "hold") == 0)) {
    stop_on_signals();
    const int port = atoi(argv[2]), k = atoi(argv[3]);
    const long bytes = atol(argv[4]);
    const int idle_ms = argc >= 6 ? atoi(argv[5]) : 0;
    return argv[1][0] == 's' ? sink(port, k, bytes, idle_ms) : hold(port, k, bytes, idle_ms);
  }
  if (argc >= 4 && strcmp(argv[1], "server") == 0)
    return server(atoi(argv[2]), strcmp(argv[3], "epoll") == 0);
  if (argc >= 5 && strcmp(argv[1], "client") == 0) {
    const int port = atoi(argv[2]), n = atoi(argv[3]);
    if (strcmp(argv[4], "epoll") == 0) return client_epoll(port, n, argc > 5 ? atoi(argv[5]) : 8);
    return client_blocking(port, n);
  }
  fprintf(stderr,
          "usage: connrate server PORT block|epoll | client PORT N block|epoll [INFLIGHT]\n"
          "       connrate sink PORT K BYTES [IDLE_MS] | hold PORT K BYTES [IDLE_MS]\n");
  return 2;
}
