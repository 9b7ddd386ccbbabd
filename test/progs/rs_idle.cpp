// rs_idle: connections that carry a burst, go idle, then carry another, for
// the preload test IdleMemoryTest (test/preload/storm_test.cpp): librsock
// gives an idle ring's pages back (Stream::trim) from the server's epoll
// loop while the client sleeps outside any socket call, and the second burst
// must arrive intact over the pages given back. Plain POSIX calls only.
//
//   rs_idle --role server --port P --connections N [--wait epoll|blocking|poll]
//       accepts N connections and echoes what it reads: epoll (the
//       default), one thread waiting on one epoll set (level-triggered);
//       blocking, one thread per connection in blocking recv and send;
//       poll, one thread in poll() on all of them. Prints READY after
//       listen(), "RESULT echoed=B closed=N" once every connection has
//       ended (epoll: and "fds=F", the descriptors it held when the first
//       connection ended, the listener closed); exits 0.
//   rs_idle --role client --port P --connections N --bytes B --idle-ms M
//       opens N connections; sends B pattern bytes on each and reads the
//       echo back, checking it; reads its RssShmem (KiB, /proc/self/status),
//       sleeps M ms, reads it again; then a second burst like the first.
//       Prints "RESULT bytes=T shmem_busy_kib=S1 shmem_idle_kib=S2 fds=F"
//       (F: the descriptors it held after the first burst) and exits 0 iff every
//       echo came back intact.
//   rs_idle --role client ... --watch-ms W
//       before the first burst, right after each connect, watches every
//       connection so far for W ms with epoll_wait (level-triggered
//       EPOLLIN) and poll (POLLIN), both with timeout 0, in turns: the
//       server writes nothing before the client does, so a connection
//       reported readable there is a spurious event (exit 1). With
//       RSOCK_TCP_FIRST=1 and no pairing delay each connection switches
//       from TCP to the ring inside its watch. Adds "watches=K" (the
//       looks made) to the RESULT line.
// Every wait is bounded (10 s); exit 1 on any failure, 2 on bad usage.
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "progs.h"

namespace {

constexpr int kWaitMs = 10000;

[[noreturn]] void fail(const char* what) {
  fprintf(stderr, "rs_idle: %s: %s\n", what, strerror(errno));
  exit(1);
}

uint8_t pattern(int conn, uint64_t pos) {
  return static_cast<uint8_t>((pos * 131 + static_cast<uint64_t>(conn) * 7 + (pos >> 9)) & 0xff);
}

long shmem_kib() {
  FILE* f = fopen("/proc/self/status", "r");
  if (!f) fail("/proc/self/status");
  char line[256];
  long v = -1;
  while (fgets(line, sizeof line, f)) sscanf(line, "RssShmem: %ld", &v);
  fclose(f);
  return v;
}

// The descriptors this process holds now (its own and librsock's).
int open_fds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) fail("/proc/self/fd");
  int n = 0;
  while (const dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;  // the directory's own
}

// One thread per connection, blocking calls: returns the bytes echoed.
uint64_t echo_blocking(int fd) {
  std::vector<char> buf(1 << 16);
  uint64_t echoed = 0;
  for (;;) {
    const ssize_t r = recv(fd, buf.data(), buf.size(), 0);
    if (r == 0) break;
    if (r < 0) fail("recv");
    for (ssize_t off = 0; off < r;) {
      const ssize_t w = send(fd, buf.data() + off, static_cast<size_t>(r - off), MSG_NOSIGNAL);
      if (w < 0) fail("send");
      off += w;
    }
    echoed += static_cast<uint64_t>(r);
  }
  close(fd);
  return echoed;
}

// Echoes what one readable connection has (nonblocking read, blocking
// writes). Returns the bytes echoed, or -1 at EOF.
long echo_once(int fd, std::vector<char>& buf) {
  const ssize_t r = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
  if (r == 0) return -1;
  if (r < 0) {
    if (errno == EAGAIN) return 0;
    fail("recv");
  }
  for (ssize_t off = 0; off < r;) {
    const ssize_t w = send(fd, buf.data() + off, static_cast<size_t>(r - off), MSG_NOSIGNAL);
    if (w < 0) fail("send");
    off += w;
  }
  return r;
}

int server(int port, int n, const std::string& wait) {
  const bool blocking = wait == "blocking";
  const int l = listen_loopback(port, 128);
  if (l < 0) fail("listen");
  printf("READY\n");
  fflush(stdout);
  if (blocking) {
    std::vector<std::thread> threads;
    std::atomic<uint64_t> echoed{0};
    for (int i = 0; i < n; ++i) {
      const int c = accept(l, nullptr, nullptr);
      if (c < 0) fail("accept");
      threads.emplace_back([c, &echoed] { echoed += echo_blocking(c); });
    }
    close(l);
    for (auto& t : threads) t.join();
    printf("RESULT echoed=%llu closed=%d\n", static_cast<unsigned long long>(echoed.load()), n);
    return 0;
  }
  uint64_t echoed = 0;
  int closed = 0;
  std::vector<char> buf(1 << 16);
  if (wait == "poll") {
    std::vector<pollfd> pfds;
    for (int i = 0; i < n; ++i) {
      const int c = accept(l, nullptr, nullptr);
      if (c < 0) fail("accept");
      pfds.push_back({c, POLLIN, 0});
    }
    close(l);
    while (closed < n) {
      if (poll(pfds.data(), pfds.size(), -1) < 0 && errno != EINTR) fail("poll");
      for (pollfd& p : pfds) {
        if (p.fd < 0 || !p.revents) continue;
        const long e = echo_once(p.fd, buf);
        if (e < 0) {
          close(p.fd);
          p.fd = -1;
          ++closed;
        } else {
          echoed += static_cast<uint64_t>(e);
        }
      }
    }
    printf("RESULT echoed=%llu closed=%d\n", static_cast<unsigned long long>(echoed), closed);
    return 0;
  }
  const int ep = epoll_create1(0);
  if (ep < 0) fail("epoll_create1");
  for (int i = 0; i < n; ++i) {
    const int c = accept(l, nullptr, nullptr);
    if (c < 0) fail("accept");
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.fd = c;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev) != 0) fail("epoll_ctl ADD");
  }
  close(l);
  int fds = 0;
  while (closed < n) {
    epoll_event evs[16];
    const int k = epoll_wait(ep, evs, 16, -1);
    if (k < 0 && errno != EINTR) fail("epoll_wait");
    for (int i = 0; i < k; ++i) {
      const int fd = evs[i].data.fd;
      const long e = echo_once(fd, buf);
      if (e < 0 && closed == 0) fds = open_fds();  // every connection used, none closed
      if (e < 0) {
        epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
        close(fd);
        ++closed;
      } else {
        echoed += static_cast<uint64_t>(e);
      }
    }
  }
  printf("RESULT echoed=%llu closed=%d fds=%d\n", static_cast<unsigned long long>(echoed), closed,
         fds);
  return 0;
}

// Sends `bytes` pattern bytes from stream position `pos` on fd and reads the
// echo back, interleaved (the echo must not fill up while we only write).
void burst(int conn, int fd, uint64_t pos, uint64_t bytes) {
  std::vector<uint8_t> out(1 << 14), in(1 << 16);
  uint64_t sent = 0, got = 0;
  while (got < bytes) {
    pollfd p = {fd, static_cast<short>(POLLIN | (sent < bytes ? POLLOUT : 0)), 0};
    if (poll(&p, 1, kWaitMs) != 1) fail("no progress in 10 s");
    if ((p.revents & POLLOUT) && sent < bytes) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(out.size(), bytes - sent));
      for (size_t j = 0; j < n; ++j) out[j] = pattern(conn, pos + sent + j);
      const ssize_t w = send(fd, out.data(), n, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (w < 0 && errno != EAGAIN) fail("send");
      if (w > 0) sent += static_cast<uint64_t>(w);
    }
    if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t r = recv(fd, in.data(), in.size(), MSG_DONTWAIT);
      if (r == 0) {
        errno = ECONNRESET;
        fail("echo ended early");
      }
      if (r < 0 && errno != EAGAIN) fail("recv");
      for (ssize_t j = 0; j < r; ++j)
        if (in[j] != pattern(conn, pos + got + j)) {
          fprintf(stderr, "rs_idle: connection %d: byte %llu of the echo is wrong\n", conn,
                  static_cast<unsigned long long>(pos + got + j));
          exit(1);
        }
      if (r > 0) got += static_cast<uint64_t>(r);
    }
  }
}

// --watch-ms: nothing was sent to us yet, so nothing may be readable.
// Returns the number of looks.
uint64_t watch_quiet(int ep, const std::vector<int>& fds, int upto, int ms) {
  uint64_t looks = 0;
  std::vector<pollfd> p(static_cast<size_t>(upto));
  for (const int64_t end = now_ms() + ms; now_ms() < end; looks += 2) {
    epoll_event ev[16];
    const int k = epoll_wait(ep, ev, 16, 0);
    if (k < 0 && errno != EINTR) fail("epoll_wait");
    if (k > 0) {
      fprintf(stderr, "rs_idle: epoll_wait reported fd %d (events 0x%x) before any byte came\n",
              ev[0].data.fd, ev[0].events);
      exit(1);
    }
    for (int i = 0; i < upto; ++i)
      p[static_cast<size_t>(i)] = {fds[static_cast<size_t>(i)], POLLIN, 0};
    const int r = poll(p.data(), p.size(), 0);
    if (r < 0 && errno != EINTR) fail("poll");
    for (const pollfd& q : p)
      if (r > 0 && q.revents) {
        fprintf(stderr, "rs_idle: poll reported fd %d (revents 0x%x) before any byte came\n", q.fd,
                q.revents);
        exit(1);
      }
  }
  return looks;
}

int client(int port, int n, uint64_t bytes, int idle_ms, int watch_ms) {
  std::vector<int> fds(n);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) fail("epoll_create1");
  uint64_t looks = 0;
  for (int i = 0; i < n; ++i) {
    fds[i] = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(port);
    if (fds[i] < 0 || connect(fds[i], reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      fail("connect");
    if (watch_ms <= 0) continue;
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.fd = fds[i];
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev) != 0) fail("epoll_ctl ADD");
    looks += watch_quiet(ep, fds, i + 1, watch_ms);
  }
  close(ep);
  for (int i = 0; i < n; ++i) burst(i, fds[i], 0, bytes);
  const int open = open_fds();
  const long busy = shmem_kib();
  timespec ts = {idle_ms / 1000, (idle_ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
  const long idle = shmem_kib();
  for (int i = 0; i < n; ++i) burst(i, fds[i], bytes, bytes);
  for (int fd : fds) close(fd);
  printf("RESULT bytes=%llu shmem_busy_kib=%ld shmem_idle_kib=%ld watches=%llu fds=%d\n",
         static_cast<unsigned long long>(2 * bytes * static_cast<uint64_t>(n)), busy, idle,
         static_cast<unsigned long long>(looks), open);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string role;
  int port = 0, n = 0, idle_ms = 0, watch_ms = 0;
  std::string wait = "epoll";
  uint64_t bytes = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--role")
      role = argv[i + 1];
    else if (k == "--port")
      port = atoi(argv[i + 1]);
    else if (k == "--connections")
      n = atoi(argv[i + 1]);
    else if (k == "--bytes")
      bytes = strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--idle-ms")
      idle_ms = atoi(argv[i + 1]);
    else if (k == "--wait")
      wait = argv[i + 1];
    else if (k == "--watch-ms")
      watch_ms = atoi(argv[i + 1]);
  }
  if (port <= 0 || n <= 0) {
    fprintf(stderr,
            "usage: rs_idle --role server|client --port P --connections N "
            "[--wait epoll|blocking|poll] [--bytes B --idle-ms M [--watch-ms W]]\n");
    return 2;
  }
  if (role == "server" && (wait == "epoll" || wait == "blocking" || wait == "poll"))
    return server(port, n, wait);
  if (role == "client" && bytes > 0) return client(port, n, bytes, idle_ms, watch_ms);
  fprintf(stderr, "rs_idle: bad role or missing --bytes\n");
  return 2;
}
