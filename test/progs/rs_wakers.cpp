// rs_wakers: sleeps on many connections from a few threads, then counts the
// eventfds the process holds, for WakeupsTest (test/preload/
// wakeups_test.cpp). Plain POSIX calls only, so it runs the same with or
// without librsock preloaded.
//
//   rs_wakers --port P [--conns K]
//       connects K times to an echo server (rs_echo --role server) and
//       makes a reader sleep on each connection in turn, in three phases,
//       each on a thread of its own that exits when its phase is over: a
//       blocking recv per connection, a poll over all of them, an
//       epoll_wait over all of them (one set). In each phase the main
//       thread sends one byte on one connection at a time, 5 ms after the
//       reader went to wait for it, and the reader takes the echo. Prints
//       "RESULT conns=K eventfds=N", N being the eventfds open at the end.
// Exit 0 when every echo came back, 1 on any failure, 2 on bad usage.
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "progs.h"

namespace {

int count_eventfds() {
  int n = 0;
  for (int fd = 0; fd < 65536; ++fd) {
    char path[64], link[128];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    const ssize_t len = readlink(path, link, sizeof link - 1);
    if (len < 0) continue;
    link[len] = 0;
    if (strcmp(link, "anon_inode:[eventfd]") == 0) ++n;
  }
  return n;
}

bool read_one(int fd) {
  char c;
  return recv(fd, &c, 1, 0) == 1 && c == 'w';
}

// Runs one phase: reader(i) waits for and takes the echo on connection i,
// after the main thread has sent it (5 ms after `waiting` said i).
template <class Reader>
bool phase(const std::vector<int>& conns, Reader reader) {
  std::atomic<int> waiting{-1};
  std::atomic<bool> ok{true};
  std::thread t([&] {
    for (size_t i = 0; i < conns.size() && ok; ++i) {
      waiting.store(static_cast<int>(i));
      if (!reader(i)) ok = false;
    }
  });
  for (size_t i = 0; i < conns.size() && ok; ++i) {
    for (int spins = 0; waiting.load() != static_cast<int>(i); ++spins) {
      if (spins > 20000 || !ok) {
        ok = false;
        break;
      }
      pause_ms(1);
    }
    pause_ms(5);  // the reader is asleep by now
    if (send(conns[i], "w", 1, MSG_NOSIGNAL) != 1) ok = false;
  }
  t.join();
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int port = -1, k = 12;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    if (key == "--port")
      port = atoi(argv[i + 1]);
    else if (key == "--conns")
      k = atoi(argv[i + 1]);
    else
      return 2;
  }
  if (port <= 0 || k <= 0) return 2;
  std::vector<int> conns;
  for (int i = 0; i < k; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    const sockaddr_in a = loopback(port);
    if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      perror("connect");
      return 1;
    }
    conns.push_back(fd);
  }
  bool ok = phase(conns, [&](size_t i) { return read_one(conns[i]); });
  ok = ok && phase(conns, [&](size_t i) {
         std::vector<pollfd> p;
         for (int fd : conns) p.push_back({fd, POLLIN, 0});
         if (poll(p.data(), p.size(), 20000) != 1 || !(p[i].revents & POLLIN)) return false;
         return read_one(conns[i]);
       });
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  for (size_t i = 0; i < conns.size(); ++i) {
    epoll_event ev = {};
    ev.events = EPOLLIN;
    ev.data.u32 = static_cast<uint32_t>(i);
    if (epoll_ctl(ep, EPOLL_CTL_ADD, conns[i], &ev) != 0) ok = false;
  }
  ok = ok && phase(conns, [&](size_t i) {
         epoll_event ev;
         if (epoll_wait(ep, &ev, 1, 20000) != 1 || ev.data.u32 != i) return false;
         return read_one(conns[i]);
       });
  const int eventfds = count_eventfds();
  close(ep);
  for (int fd : conns) close(fd);
  if (!ok) {
    fprintf(stderr, "rs_wakers: an echo did not come back\n");
    return 1;
  }
  printf("RESULT conns=%d eventfds=%d\n", k, eventfds);
  return 0;
}
