// rs_echo: a verifying echo pair for the attack tests (test/preload/
// attack_test.cpp). Plain POSIX socket calls only, so it behaves the same
// with or without librsock preloaded.
//
//   rs_echo --role server --port P [--addr A] [--connections K] [--gate FILE]
//       listens, prints READY, waits until FILE exists (if given), then
//       accepts K connections, each served by its own thread: every byte
//       read is written back until EOF. Prints "RESULT connections=K
//       echoed=BYTES" and exits 0 when every connection ended cleanly.
//   rs_echo --role client --port P [--addr A] [--bind-port B] [--bytes N]
//       [--seed S] [--hold-ms H]
//       binds source port B (if given), connects, waits H ms (0: none; the
//       connection open and idle, e.g. while a pairing is decided in
//       librsock's default mode), sends N pseudo-random bytes
//       (a function of S and the offset) from a writer thread, shuts down its
//       sending side, and reads the echo to EOF, checking every byte. Prints
//       "RESULT sent=N received=M ok=0|1" and exits 0 iff all N came back.
// Every wait is bounded; exit 1 on any failure (details on stderr), 2 on
// bad usage. SIGPIPE is ignored.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "progs.h"

namespace {

constexpr int kGateTimeoutMs = 60000;

uint8_t pattern(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull ^ (i / 8) * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  return static_cast<uint8_t>(x >> (8 * (i % 8)));
}

sockaddr_in make_addr(const std::string& addr, int port) {
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
  return a;
}

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

int run_server(const std::string& addr, int port, int connections, const std::string& gate) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = make_addr(addr, port);
  if (ls < 0 || bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(ls, 64) != 0) {
    fprintf(stderr, "server: listen: %s\n", strerror(errno));
    return 1;
  }
  printf("READY\n");
  fflush(stdout);
  if (!gate.empty()) {
    const int64_t end = now_ms() + kGateTimeoutMs;
    struct stat st;
    while (stat(gate.c_str(), &st) != 0) {
      if (now_ms() > end) {
        fprintf(stderr, "server: the gate never opened\n");
        return 1;
      }
      usleep(2000);
    }
  }
  std::atomic<uint64_t> echoed{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < connections; ++i) {
    int c = accept(ls, nullptr, nullptr);
    if (c < 0) {
      fprintf(stderr, "server: accept: %s\n", strerror(errno));
      return 1;
    }
    printf("ACCEPTED %d\n", i + 1);
    fflush(stdout);
    threads.emplace_back([c, &echoed, &failures] {
      uint8_t buf[16384];
      for (;;) {
        ssize_t n = read(c, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) break;
        if (n < 0 || !write_all(c, buf, static_cast<size_t>(n))) {
          fprintf(stderr, "server: connection: %s\n", strerror(errno));
          ++failures;
          break;
        }
        echoed += static_cast<uint64_t>(n);
      }
      close(c);
    });
  }
  for (auto& t : threads) t.join();
  printf("RESULT connections=%d echoed=%llu\n", connections,
         static_cast<unsigned long long>(echoed.load()));
  return failures.load() == 0 ? 0 : 1;
}

int run_client(const std::string& addr, int port, int bind_port, uint64_t bytes, uint64_t seed,
               int hold_ms) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (bind_port > 0) {
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in b = make_addr("0.0.0.0", bind_port);
    if (bind(s, reinterpret_cast<sockaddr*>(&b), sizeof b) != 0) {
      fprintf(stderr, "client: bind %d: %s\n", bind_port, strerror(errno));
      return 1;
    }
  }
  sockaddr_in a = make_addr(addr, port);
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    fprintf(stderr, "client: connect: %s\n", strerror(errno));
    return 1;
  }
  printf("CONNECTED\n");
  fflush(stdout);
  if (hold_ms > 0) {
    timespec ts = {hold_ms / 1000, (hold_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
  }
  std::atomic<bool> sent_ok{false};
  std::thread writer([&] {
    uint8_t buf[8192];
    uint64_t off = 0;
    while (off < bytes) {
      size_t n = static_cast<size_t>(std::min<uint64_t>(sizeof buf, bytes - off));
      for (size_t i = 0; i < n; ++i) buf[i] = pattern(seed, off + i);
      if (!write_all(s, buf, n)) {
        fprintf(stderr, "client: write: %s\n", strerror(errno));
        return;
      }
      off += n;
    }
    shutdown(s, SHUT_WR);
    sent_ok = true;
  });
  uint64_t got = 0;
  bool match = true;
  uint8_t buf[16384];
  for (;;) {
    ssize_t n = read(s, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n < 0) fprintf(stderr, "client: read: %s\n", strerror(errno));
      break;
    }
    for (ssize_t i = 0; i < n && match; ++i)
      if (buf[i] != pattern(seed, got + static_cast<uint64_t>(i))) {
        fprintf(stderr, "client: byte %llu differs\n",
                static_cast<unsigned long long>(got + static_cast<uint64_t>(i)));
        match = false;
      }
    got += static_cast<uint64_t>(n);
  }
  writer.join();
  close(s);
  const bool ok = match && sent_ok && got == bytes;
  printf("RESULT sent=%llu received=%llu ok=%d\n", static_cast<unsigned long long>(bytes),
         static_cast<unsigned long long>(got), ok ? 1 : 0);
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string role, addr = "127.0.0.1", gate;
  int port = 0, bind_port = 0, connections = 1, hold_ms = 0;
  uint64_t bytes = 1 << 20, seed = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--role")
      role = v;
    else if (k == "--addr")
      addr = v;
    else if (k == "--port")
      port = atoi(v.c_str());
    else if (k == "--bind-port")
      bind_port = atoi(v.c_str());
    else if (k == "--connections")
      connections = atoi(v.c_str());
    else if (k == "--gate")
      gate = v;
    else if (k == "--bytes")
      bytes = strtoull(v.c_str(), nullptr, 10);
    else if (k == "--hold-ms")
      hold_ms = atoi(v.c_str());
    else if (k == "--seed")
      seed = strtoull(v.c_str(), nullptr, 10);
    else {
      fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (port <= 0 || (role != "server" && role != "client")) {
    fprintf(stderr, "usage: see the comment at the top of rs_echo.cpp\n");
    return 2;
  }
  return role == "server" ? run_server(addr, port, connections, gate)
                          : run_client(addr, port, bind_port, bytes, seed, hold_ms);
}
