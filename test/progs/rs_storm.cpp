// rs_storm: bursts of nonblocking connects against an event-loop server, for
// the preload test NonblockingConnectStorm (test/preload/storm_test.cpp).
// Each nonblocking connect to a librsock server starts a short-lived pairing
// thread; this runs thousands of them, several at a time, the way ab or an
// event-loop client does. Plain POSIX calls only.
//
//   rs_storm --role server --port P --connections N
//       a nonblocking listener in an epoll loop: accepts (accept4,
//       SOCK_NONBLOCK) and reads each connection to EOF, then closes it.
//       Prints READY after listen(), and "RESULT accepted=N bytes=B" once
//       N connections have ended; exits 0.
//   rs_storm --role client --port P --connections N --burst K
//       N connections, K at a time: K nonblocking connect()s (EINPROGRESS),
//       poll() for POLLOUT, SO_ERROR must be 0, one byte written, close().
//       Prints "RESULT connected=N" and exits 0 iff every one connected.
//   --answer 1 (both roles): the server answers each connection's byte with
//       one of its own and closes it at once, and the client reads that byte
//       and then EOF before it closes: the server's side ends first.
//   --epoll 1 (client, with --answer 1): one connection at a time, driven
//       from an epoll set as apr's pollset drives ab's: the socket added for
//       EPOLLOUT, deleted once writable, its byte written, added again for
//       EPOLLIN, and deleted once the answer and EOF are read. Every
//       epoll_ctl must succeed (ab aborts on a failed delete).
//   --count-threads 1 (either role): also counts this process's threads
//       whose name starts with "rsock-pair" (librsock's pairing threads)
//       after every burst or accept batch, and prints "PAIRING
//       max_threads=M", the most it saw at once.
// Every wait is bounded (10 s); exit 1 on any failure, 2 on bad usage.
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace {

constexpr int kWaitMs = 10000;

bool g_count_threads = false;
bool g_answer = false;
bool g_epoll = false;
int g_max_threads = 0;

// Notes how many of this process's threads are librsock's pairing threads.
void sample_threads() {
  if (!g_count_threads) return;
  DIR* d = opendir("/proc/self/task");
  if (!d) return;
  int n = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    char path[300], name[64] = {};
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    FILE* f = fopen(path, "re");
    if (!f) continue;
    if (fgets(name, sizeof name, f) && strncmp(name, "rsock-pair", 10) == 0) ++n;
    fclose(f);
  }
  closedir(d);
  if (n > g_max_threads) g_max_threads = n;
}

void report_threads() {
  if (g_count_threads) printf("PAIRING max_threads=%d\n", g_max_threads);
}

int usage() {
  fprintf(stderr,
          "usage: rs_storm --role server|client --port P --connections N [--burst K] "
          "[--answer 1] [--epoll 1] [--count-threads 1]\n");
  return 2;
}

int run_server(const sockaddr_in& a, long n) {
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), one = 1;
  if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(lfd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 || listen(lfd, 1024) != 0) {
    fprintf(stderr, "server: listen: %s\n", strerror(errno));
    return 1;
  }
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.fd = lfd;
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  printf("READY\n");
  fflush(stdout);
  long ended = 0, bytes = 0;
  epoll_event evs[64];
  while (ended < n) {
    int k = epoll_wait(ep, evs, 64, kWaitMs);
    if (k <= 0) {
      fprintf(stderr, "server: nothing happened for %d ms (%ld of %ld ended): %s\n", kWaitMs, ended,
              n, k < 0 ? strerror(errno) : "timeout");
      return 1;
    }
    for (int i = 0; i < k; ++i) {
      const int fd = evs[i].data.fd;
      if (fd == lfd) {
        int c;
        while ((c = accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
          epoll_event e = {};
          e.events = EPOLLIN | EPOLLRDHUP;
          e.data.fd = c;
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &e);
        }
        sample_threads();
        continue;
      }
      char buf[256];
      ssize_t r;
      long got = 0;
      while ((r = read(fd, buf, sizeof buf)) > 0) got += r;
      bytes += got;
      if (g_answer && got > 0) {
        if (write(fd, "y", 1) != 1) {
          fprintf(stderr, "server: answer: %s\n", strerror(errno));
          return 1;
        }
        close(fd);
        ++ended;
        continue;
      }
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        if (r < 0) fprintf(stderr, "server: read: %s\n", strerror(errno));
        close(fd);
        ++ended;
      }
    }
  }
  printf("RESULT accepted=%ld bytes=%ld\n", ended, bytes);
  report_threads();
  return 0;
}

// --answer: the server's byte, then its EOF, on nonblocking fd.
bool read_answer(int fd) {
  std::string got;
  for (;;) {
    pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, kWaitMs) != 1) return false;
    char buf[16];
    const ssize_t r = read(fd, buf, sizeof buf);
    if (r > 0) {
      got.append(buf, static_cast<size_t>(r));
      continue;
    }
    if (r == 0) return got == "y";
    if (errno != EAGAIN && errno != EINTR) return false;
  }
}

// Waits in ep for fd's events; false (with a message) on a timeout or error.
bool epoll_once(int ep, int fd, uint32_t events, long i) {
  epoll_event e = {};
  e.events = events;
  e.data.fd = fd;
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) != 0) {
    fprintf(stderr, "client: connection %ld: epoll add: %s\n", i, strerror(errno));
    return false;
  }
  epoll_event got;
  const int k = epoll_wait(ep, &got, 1, kWaitMs);
  if (k != 1 || got.data.fd != fd) {
    fprintf(stderr, "client: connection %ld: epoll_wait: %s\n", i,
            k < 0 ? strerror(errno) : "timeout");
    return false;
  }
  return true;
}

bool epoll_del(int ep, int fd, long i, const char* after) {
  if (epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr) == 0) return true;
  fprintf(stderr, "client: connection %ld: epoll delete after %s: %s\n", i, after, strerror(errno));
  return false;
}

// --epoll: as ab -c 1 does with apr's pollset (see the usage above).
int run_epoll_client(const sockaddr_in& a, long n) {
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  for (long i = 0; i < n; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    if (fd < 0 || (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 &&
                   errno != EINPROGRESS)) {
      fprintf(stderr, "client: connect %ld: %s\n", i, strerror(errno));
      return 1;
    }
    if (!epoll_once(ep, fd, EPOLLOUT, i) || !epoll_del(ep, fd, i, "connect")) return 1;
    if (write(fd, "x", 1) != 1) {
      fprintf(stderr, "client: connection %ld: write: %s\n", i, strerror(errno));
      return 1;
    }
    std::string got;
    bool eof = false;
    while (!eof) {
      if (!epoll_once(ep, fd, EPOLLIN, i)) return 1;
      char buf[16];
      ssize_t r;
      while ((r = read(fd, buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(r));
      if (r < 0 && errno != EAGAIN) {
        fprintf(stderr, "client: connection %ld: read: %s\n", i, strerror(errno));
        return 1;
      }
      eof = r == 0;
      if (!epoll_del(ep, fd, i, eof ? "EOF" : "bytes")) return 1;
    }
    if (got != "y") {
      fprintf(stderr, "client: connection %ld: answer '%s'\n", i, got.c_str());
      return 1;
    }
    close(fd);
  }
  printf("RESULT connected=%ld\n", n);
  return 0;
}

int run_client(const sockaddr_in& a, long n, int burst) {
  if (g_epoll) return run_epoll_client(a, n);
  std::vector<pollfd> p(static_cast<size_t>(burst));
  long connected = 0;
  for (long done = 0; done < n;) {
    const int k = static_cast<int>(std::min<long>(burst, n - done));
    for (int i = 0; i < k; ++i) {
      p[i].fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      p[i].events = POLLOUT;
      if (p[i].fd < 0 || (connect(p[i].fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 &&
                          errno != EINPROGRESS)) {
        fprintf(stderr, "client: connect %ld: %s\n", done + i, strerror(errno));
        return 1;
      }
    }
    sample_threads();
    for (int left = k; left > 0;) {
      int r = poll(p.data(), static_cast<nfds_t>(k), kWaitMs);
      sample_threads();
      if (r <= 0) {
        fprintf(stderr, "client: poll: %s\n", r < 0 ? strerror(errno) : "timeout");
        return 1;
      }
      for (int i = 0; i < k; ++i) {
        if (p[i].fd < 0 || !p[i].revents) continue;
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(p[i].fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0 || write(p[i].fd, "x", 1) != 1) {
          fprintf(stderr, "client: connection %ld: %s\n", done + i, strerror(err ? err : errno));
          return 1;
        }
        if (g_answer && !read_answer(p[i].fd)) {
          fprintf(stderr, "client: connection %ld: no answer and EOF: %s\n", done + i,
                  strerror(errno));
          return 1;
        }
        close(p[i].fd);
        p[i].fd = -1;
        ++connected;
        --left;
      }
    }
    done += k;
  }
  printf("RESULT connected=%ld\n", connected);
  report_threads();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string role;
  int port = 0, burst = 10;
  long n = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--role")
      role = argv[i + 1];
    else if (k == "--port")
      port = atoi(argv[i + 1]);
    else if (k == "--connections")
      n = atol(argv[i + 1]);
    else if (k == "--burst")
      burst = atoi(argv[i + 1]);
    else if (k == "--count-threads")
      g_count_threads = atoi(argv[i + 1]) != 0;
    else if (k == "--answer")
      g_answer = atoi(argv[i + 1]) != 0;
    else if (k == "--epoll")
      g_epoll = atoi(argv[i + 1]) != 0;
    else
      return usage();
  }
  if (port <= 0 || n <= 0 || burst <= 0 || burst > 1000) return usage();
  signal(SIGPIPE, SIG_IGN);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (role == "server") return run_server(a, n);
  if (role == "client") return run_client(a, n, burst);
  return usage();
}
