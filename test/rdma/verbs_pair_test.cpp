// verbs_pair_test.cpp - the verbs transport (src/transport/verbs) between two
// hosts, below the socket layer: kernel TCP connect/accept, then
// verbs_client_pairing / verbs_server_pairing, then rsock::Stream over the channel,
// blocking the way the socket layer does (spin, arm, re-check, poll the wait
// fd, drain, disarm).
//
//   verbs_pair_test server PORT CASE...       (host A) one accept per case
//   verbs_pair_test client HOST PORT CASE...  (host B) one connect per case
//   verbs_pair_test plain-server PORT         a TCP listener without rdma_cm
//
// Cases (same list, same order on both ends):
//   xfer          8 MiB each direction at once, random write sizes, every
//                 byte checked, then shutdown -> EOF on both ends, close;
//                 first, the channel holds at most 3 descriptors, no timer
//   rings         kRingRounds connections one after the other, each using
//                 the registered rings the one before gave back (at most
//                 one set made); then the client's pinned-memory bound
//                 turns a connection away (rdma_pinned_limit) until a
//                 closed one gives its rings back
//   many          kManyConns more connections at once, paired one after
//                 the other: a blocking ping-pong on each in turn (every
//                 wait sleeps on the engine's wakeups), then 32 KiB each
//                 way on all of them at once, every byte checked; each side
//                 closes as soon as it has read everything (the other may
//                 be busy reading: the closes must not reach it as resets).
//                 The process's descriptors grow by at most 4 per connection
//                 (its socket and the channel's 3), its completion and
//                 rdma_cm event channels not at all, and the channels
//                 share one engine with at most a CQ per 4 connections
//   rkeys         two connections: the client writes into the server's ring
//                 of the first with its rkey, through the second's queue
//                 pair (inline RDMA write). It must fail (each connection
//                 has its own protection domain) and leave that ring as it
//                 was; the first connection still works
//   linger        two connections; the server moves its queue pair of the
//                 first to the error state (its device acknowledges nothing
//                 more); the client sends on it and closes: the close must
//                 return with the queue pair lingering in the engine, which
//                 ends it at its verdict (retries spent) and releases its
//                 descriptors
//   pingpong      64-byte ping-pong over the stream: latency percentiles
//   bw            32 MiB client -> server in 65000-byte writes: throughput
//   tcp-pingpong, tcp-bw   the same over kernel TCP (no pairing), for reference
//   kill          the server SIGKILLs itself after 1 MiB; the client must see
//                 an error or EOF within the bound (server: exit status 137)
//   nolistener    client only, against plain-server: pairing must return
//                 nullptr with peer_not_accelerated
//   move-early    xfer, but the server forks after 1.5 MiB each way and its
//   move-late     child takes the connection over (docs/protocol.md section 7,
//                 "Moving a connection") and finishes it: the parent closes
//                 its copy at once (early: before the child's first call;
//                 late: after the child took over). Every byte checked on
//                 both ends, EOF; the parent's calls after the takeover fail
//                 with ECONNRESET (late)
//   move-both     the same, with the client's end moving too, both at once
//                 (each side's child takes its end over at the same time)
//   move-twice    the server's child moves the end again to a grandchild
//   move-kill     the server's child sends its MOVE and dies before it
//                 finishes the move while the parent keeps the socket open:
//                 the client's calls must fail (ECONNRESET) within
//                 kVerbsMoveMs plus slack, never hang
//   move-raw      the server's child takes the end over (its parent closes
//                 at once) and both exchange 1000 bytes more; then the
//                 client writes 3 bytes on its kernel TCP socket behind the
//                 stream: the child, which read the frames of the move on
//                 that socket, must take these for bytes behind librsock,
//                 and both ends' next recv fail with ECONNRESET
//   move-raw-detached  the same, but the client's raw bytes reach the
//                 server's socket while its end has no owner (the parent
//                 let it go, the child has not used it yet); the child
//                 finds them when it takes the end over, before the
//                 answer to its MOVE: the client's end, waiting for that
//                 move, learns of the reset by a RESET frame (KERNEL_BYTES)
// Each case prints "PASS <case>" or "FAIL <case>: why"; exit 0 iff all passed.
// Every wait is bounded (kWaitMs). Built by test/rdma/verbs.sh.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/sleep_token.h"
#include "config/config.h"
#include "socket/wake_hub.h"
#include "stats/stats.h"
#include "stream/stream.h"
#include "transport/verbs/verbs_channel.h"
#include "transport/verbs/verbs_engine.h"
#include "transport/verbs/verbs_setup.h"

namespace {

constexpr int kWaitMs = 30000;           // bound of any single wait
constexpr size_t kXferBytes = 8u << 20;  // per direction
constexpr size_t kBwBytes = 32u << 20;
constexpr size_t kBwWrite = 65000;
constexpr int kPingIters = 2000;
constexpr int kManyConns = 40;
constexpr size_t kManyBytes = 32u << 10;  // each way on each connection, at once
int g_spin_us = 50;  // RSOCK_SPIN_US, as the socket layer

const char* g_role = "?";

void say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::printf("%s: ", g_role);
  std::vprintf(fmt, ap);
  std::printf("\n");
  std::fflush(stdout);
  va_end(ap);
}

int64_t now_us() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000ll + ts.tv_nsec / 1000;
}

// Deterministic byte stream per direction: both ends can regenerate it.
struct Pattern {
  uint64_t x;
  explicit Pattern(uint64_t seed) : x(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint8_t next() {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return static_cast<uint8_t>(x >> 24);
  }
};

// The configuration every pairing of this process gets (test_config();
// the rings case changes region_cache for a while).
rsock::Config g_cfg;

rsock::Config test_config() {
  rsock::Config cfg;
  cfg.connect_timeout_ms = 5000;  // emulated guests are slow
  if (const char* t = getenv("RSOCK_CONNECT_TIMEOUT_MS")) cfg.connect_timeout_ms = atoi(t);
  if (const char* r = getenv("RSOCK_RING_SIZE")) {
    size_t v;
    if (rsock::parse_size(r, &v)) cfg.ring_bytes = v;
  }
  return cfg;
}

// ------------------------------------------------------------- blocking I/O --

// The stream's WakeHub, as the socket layer's ConnectionState holds one
// (this program has one stream at a time): the threads that wait on it
// share it.
rsock::WakeHub g_wake;

// Waits until the stream is readable (kWantData) or writable (kWantSpace),
// as src/socket does. Returns false after kWaitMs.
bool wait_ready(rsock::Stream& s, uint32_t want, rsock::WakeHub& hub) {
  auto ready = [&] {
    rsock::StreamEvents ev = s.events();
    return want == rsock::kWantData ? ev.readable : ev.writable;
  };
  const int64_t spin_end = now_us() + g_spin_us;
  do {
    if (ready()) return true;
  } while (now_us() < spin_end);
  const int64_t deadline = now_us() + kWaitMs * 1000ll;
  rsock::Channel& ch = s.channel();
  for (;;) {
    rsock::SleepWaker own;
    const rsock::WakeHub::Ticket t = hub.join(own.get());
    if (ch.arm(want, rsock::new_sleep_token())) hub.kick(true);
    if (ready()) {
      ch.disarm(want);
      hub.leave(t);
      return true;
    }
    const int64_t left = deadline - now_us();
    if (left <= 0) {
      ch.disarm(want);
      hub.leave(t);
      return false;
    }
    pollfd p[2] = {{ch.wait_fd(), POLLIN, 0}, {t.waker ? t.waker->fd() : -1, POLLIN, 0}};
    poll(p, 2, static_cast<int>(left / 1000) + 1);
    if (ch.drain_wakeups()) hub.kick(true);
    ch.disarm(want);
    hub.leave(t);
    if (ready()) return true;
  }
}

// The engine's kick (Channel::set_async_kick): the stream's sleepers.
void kick_wake(void* hub) { static_cast<rsock::WakeHub*>(hub)->kick(false); }

// The verbs end's state in this process, for a failure report.
std::string channel_state(rsock::Stream& s) {
  auto* v = dynamic_cast<rsock::VerbsChannel*>(&s.channel());
  return v ? v->describe() : std::string("(not a verbs channel)");
}

// Sends all of buf. Returns 0 or a negative errno (-ETIMEDOUT on a stuck wait).
int send_all(rsock::Stream& s, const uint8_t* buf, size_t len, rsock::WakeHub& hub = g_wake) {
  while (len > 0) {
    iovec iov = {const_cast<uint8_t*>(buf), len};
    ssize_t n = s.send(&iov, 1);
    if (n > 0) {
      buf += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n != -EAGAIN) return static_cast<int>(n);
    if (!wait_ready(s, rsock::kWantSpace, hub)) return -ETIMEDOUT;
  }
  return 0;
}

// Receives up to len bytes (at least one). Returns the count, 0 at EOF, or a
// negative errno.
ssize_t recv_some(rsock::Stream& s, uint8_t* buf, size_t len, rsock::WakeHub& hub = g_wake) {
  for (;;) {
    iovec iov = {buf, len};
    ssize_t n = s.recv(&iov, 1, false);
    if (n != -EAGAIN) return n;
    if (!wait_ready(s, rsock::kWantData, hub)) return -ETIMEDOUT;
  }
}

int recv_all(rsock::Stream& s, uint8_t* buf, size_t len, rsock::WakeHub& hub = g_wake) {
  while (len > 0) {
    ssize_t n = recv_some(s, buf, len, hub);
    if (n <= 0) return n == 0 ? -EPIPE : static_cast<int>(n);
    buf += n;
    len -= static_cast<size_t>(n);
  }
  return 0;
}

// Same for kernel TCP.
int tcp_io_all(int fd, uint8_t* p, size_t n, bool writing) {
  while (n) {
    pollfd pfd{fd, static_cast<short>(writing ? POLLOUT : POLLIN), 0};
    if (poll(&pfd, 1, kWaitMs) != 1) return -ETIMEDOUT;
    ssize_t r = writing ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return -EPIPE;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return 0;
}

// ------------------------------------------------------------------- cases --

struct Result {
  bool ok = true;
  std::string why;
  void fail(const char* fmt, ...) {
    if (!ok) return;
    ok = false;
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    why = buf;
  }
};

// Both directions at once: this thread sends, a helper thread receives.
// The descriptors a connected channel holds in this process (own_fds):
// none is a timer (made only for a move's deadline, 2026-12-06), and
// there are at most `most`. "" or why not.
std::string check_channel_fds(rsock::Channel& ch, size_t most) {
  std::vector<int> fds;
  ch.own_fds(&fds);
  for (int fd : fds) {
    char link[64] = {}, path[32];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    if (readlink(path, link, sizeof link - 1) > 0 && strstr(link, "timerfd"))
      return "fd " + std::to_string(fd) + " is a timer (" + link + ")";
  }
  if (fds.size() > most)
    return std::to_string(fds.size()) + " descriptors, want at most " + std::to_string(most);
  return "";
}

void case_xfer(rsock::Stream& s, bool is_server, Result* res) {
  // Its socket dup, epoll set and the end's memfd (the completion channel,
  // CQ and rdma_cm event channel are the process's engine's).
  if (const std::string why = check_channel_fds(s.channel(), 3); !why.empty())
    res->fail("the channel's descriptors: %s", why.c_str());
  const uint64_t tx_seed = is_server ? 1 : 2, rx_seed = is_server ? 2 : 1;
  std::atomic<bool> rx_ok{true};
  std::string rx_why;
  std::thread rx([&] {
    Pattern pat(rx_seed);
    std::vector<uint8_t> buf(70000);
    size_t got = 0;
    uint32_t r = 12345;
    for (;;) {
      r = r * 1103515245 + 12345;
      size_t want = 1 + (r >> 8) % buf.size();
      ssize_t n = recv_some(s, buf.data(), want);
      if (n == 0) break;
      if (n < 0) {
        rx_ok = false;
        rx_why = "recv: " + std::string(strerror(static_cast<int>(-n)));
        return;
      }
      for (ssize_t i = 0; i < n; ++i) {
        if (buf[i] != pat.next()) {
          rx_ok = false;
          rx_why = "data mismatch at byte " + std::to_string(got + i);
          return;
        }
      }
      got += static_cast<size_t>(n);
    }
    if (got != kXferBytes) {
      rx_ok = false;
      rx_why = "EOF after " + std::to_string(got) + " bytes";
    }
  });
  Pattern pat(tx_seed);
  std::vector<uint8_t> buf(70000);
  size_t sent = 0;
  uint32_t r = is_server ? 777 : 999;
  const int64_t t0 = now_us();
  while (sent < kXferBytes) {
    r = r * 1103515245 + 12345;
    size_t n = std::min<size_t>(1 + (r >> 8) % (r & 1 ? 64 : buf.size()), kXferBytes - sent);
    for (size_t i = 0; i < n; ++i) buf[i] = pat.next();
    int rc = send_all(s, buf.data(), n);
    if (rc < 0) {
      res->fail("send: %s", strerror(-rc));
      break;
    }
    sent += n;
  }
  s.shutdown(false, true);  // FIN: the peer's reader sees EOF after the last byte
  rx.join();
  const double secs = (now_us() - t0) / 1e6;
  if (!rx_ok) res->fail("%s", rx_why.c_str());
  if (res->ok)
    say("xfer: %zu bytes each way, checked, EOF on both directions, %.2f s (%.1f MB/s each way)",
        kXferBytes, secs, kXferBytes / secs / 1e6);
}

void print_latency(const char* what, std::vector<int64_t>& us) {
  std::sort(us.begin(), us.end());
  double sum = 0;
  for (auto v : us) sum += v;
  say("%s: %zu round trips of 64 B: p50 %lld us, p90 %lld us, p99 %lld us, avg %.1f us "
      "(one-way ~ p50/2)",
      what, us.size(), static_cast<long long>(us[us.size() / 2]),
      static_cast<long long>(us[us.size() * 9 / 10]),
      static_cast<long long>(us[us.size() * 99 / 100]), sum / us.size());
}

void case_pingpong(rsock::Stream& s, bool is_server, Result* res) {
  uint8_t buf[64];
  memset(buf, 0x5a, sizeof buf);
  std::vector<int64_t> rtt;
  for (int i = 0; i < kPingIters && res->ok; ++i) {
    int rc;
    if (is_server) {
      rc = recv_all(s, buf, sizeof buf);
      if (rc == 0) rc = send_all(s, buf, sizeof buf);
    } else {
      buf[0] = static_cast<uint8_t>(i);
      const int64_t t0 = now_us();
      rc = send_all(s, buf, sizeof buf);
      if (rc == 0) rc = recv_all(s, buf, sizeof buf);
      rtt.push_back(now_us() - t0);
      if (rc == 0 && buf[0] != static_cast<uint8_t>(i)) res->fail("echo mismatch");
    }
    if (rc < 0) res->fail("iteration %d: %s", i, strerror(-rc));
  }
  if (!is_server && res->ok) print_latency("pingpong rdma (Stream)", rtt);
}

void case_bw(rsock::Stream& s, bool is_server, Result* res) {
  std::vector<uint8_t> buf(kBwWrite);
  uint8_t ack = 0;
  if (is_server) {
    size_t got = 0;
    while (got < kBwBytes) {
      ssize_t n = recv_some(s, buf.data(), buf.size());
      if (n <= 0) {
        res->fail("recv after %zu bytes: %s", got, n == 0 ? "EOF" : strerror(static_cast<int>(-n)));
        return;
      }
      got += static_cast<size_t>(n);
    }
    if (int rc = send_all(s, &ack, 1); rc < 0) res->fail("ack: %s", strerror(-rc));
    return;
  }
  memset(buf.data(), 0xa5, buf.size());
  const int64_t t0 = now_us();
  size_t sent = 0;
  while (sent < kBwBytes && res->ok) {
    size_t n = std::min(kBwWrite, kBwBytes - sent);
    if (int rc = send_all(s, buf.data(), n); rc < 0) res->fail("send: %s", strerror(-rc));
    sent += n;
  }
  if (res->ok && recv_all(s, &ack, 1) != 0) res->fail("no ack");
  const double secs = (now_us() - t0) / 1e6;
  if (res->ok)
    say("bw rdma (Stream): %zu bytes in %zu-byte writes: %.2f s, %.1f MB/s (%.0f Mbit/s)", kBwBytes,
        kBwWrite, secs, kBwBytes / secs / 1e6, kBwBytes * 8 / secs / 1e6);
}

void case_tcp_pingpong(int fd, bool is_server, Result* res) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint8_t buf[64] = {};
  std::vector<int64_t> rtt;
  for (int i = 0; i < kPingIters && res->ok; ++i) {
    int rc;
    if (is_server) {
      rc = tcp_io_all(fd, buf, sizeof buf, false);
      if (rc == 0) rc = tcp_io_all(fd, buf, sizeof buf, true);
    } else {
      const int64_t t0 = now_us();
      rc = tcp_io_all(fd, buf, sizeof buf, true);
      if (rc == 0) rc = tcp_io_all(fd, buf, sizeof buf, false);
      rtt.push_back(now_us() - t0);
    }
    if (rc < 0) res->fail("iteration %d: %s", i, strerror(-rc));
  }
  if (!is_server && res->ok) print_latency("pingpong kernel TCP", rtt);
}

void case_tcp_bw(int fd, bool is_server, Result* res) {
  std::vector<uint8_t> buf(kBwWrite);
  uint8_t ack = 0;
  if (is_server) {
    size_t got = 0;
    while (got < kBwBytes) {
      ssize_t n = recv(fd, buf.data(), buf.size(), 0);
      if (n <= 0) {
        res->fail("recv after %zu bytes", got);
        return;
      }
      got += static_cast<size_t>(n);
    }
    if (tcp_io_all(fd, &ack, 1, true) != 0) res->fail("ack");
    return;
  }
  const int64_t t0 = now_us();
  size_t sent = 0;
  while (sent < kBwBytes && res->ok) {
    size_t n = std::min(kBwWrite, kBwBytes - sent);
    if (int rc = tcp_io_all(fd, buf.data(), n, true); rc < 0) res->fail("send: %s", strerror(-rc));
    sent += n;
  }
  if (res->ok && tcp_io_all(fd, &ack, 1, false) != 0) res->fail("no ack");
  const double secs = (now_us() - t0) / 1e6;
  if (res->ok)
    say("bw kernel TCP: %zu bytes in %zu-byte writes: %.2f s, %.1f MB/s (%.0f Mbit/s)", kBwBytes,
        kBwWrite, secs, kBwBytes / secs / 1e6, kBwBytes * 8 / secs / 1e6);
}

// The server dies after 1 MiB; the client keeps sending and must see the end.
void case_kill(rsock::Stream& s, bool is_server, Result* res) {
  std::vector<uint8_t> buf(65536);
  if (is_server) {
    size_t got = 0;
    while (got < (1u << 20)) {
      ssize_t n = recv_some(s, buf.data(), buf.size());
      if (n <= 0) {
        res->fail("recv: %zd", n);
        return;
      }
      got += static_cast<size_t>(n);
    }
    say("kill: received 1 MiB, SIGKILL to self");
    kill(getpid(), SIGKILL);
    pause();
  }
  const int64_t t0 = now_us();
  int64_t seen_at = -1;
  size_t sent = 0;
  std::string how;
  // Send until the stream reports the peer gone (bounded by kWaitMs per
  // wait inside send_all and by 256 MiB of total volume).
  while (sent < (256u << 20)) {
    int rc = send_all(s, buf.data(), buf.size());
    if (rc == -ETIMEDOUT) {
      res->fail("send blocked for %d ms with the peer dead", kWaitMs);
      return;
    }
    if (rc < 0) {
      how = std::string("send: ") + strerror(-rc);
      break;
    }
    sent += buf.size();
  }
  if (how.empty()) {
    res->fail("256 MiB sent to a dead peer without an error");
    return;
  }
  seen_at = now_us();
  ssize_t n;
  do {
    n = recv_some(s, buf.data(), buf.size());
  } while (n > 0);
  how += n == 0 ? ", recv: EOF" : std::string(", recv: ") + strerror(static_cast<int>(-n));
  if (n == -ETIMEDOUT) res->fail("recv blocked with the peer dead");
  if (res->ok)
    say("kill: peer death seen after %zu bytes sent (%s), %.0f ms after the first send", sent,
        how.c_str(), (seen_at - t0) / 1e3);
}

// ------------------------------------------------------------------- moves --

// Both directions at once for tx_n / rx_n bytes, continuing the patterns.
void duplex(rsock::Stream& s, Pattern* tx, Pattern* rx, size_t tx_n, size_t rx_n, uint32_t seed,
            Result* res) {
  std::string rx_why;
  std::thread reader([&] {
    std::vector<uint8_t> buf(70000);
    size_t got = 0;
    uint32_t r = seed ^ 0x55;
    while (got < rx_n) {
      r = r * 1103515245 + 12345;
      const size_t want = std::min<size_t>(1 + (r >> 8) % buf.size(), rx_n - got);
      ssize_t n = recv_some(s, buf.data(), want);
      if (n <= 0) {
        rx_why = n == 0 ? "EOF after " + std::to_string(got) + " bytes"
                        : "recv: " + std::string(strerror(static_cast<int>(-n)));
        return;
      }
      for (ssize_t i = 0; i < n; ++i)
        if (buf[i] != rx->next()) {
          rx_why = "data mismatch at byte " + std::to_string(got + i) + " of this part";
          return;
        }
      got += static_cast<size_t>(n);
    }
  });
  std::vector<uint8_t> buf(70000);
  size_t sent = 0;
  uint32_t r = seed;
  while (sent < tx_n) {
    r = r * 1103515245 + 12345;
    const size_t n = std::min<size_t>(1 + (r >> 8) % (r & 1 ? 64 : buf.size()), tx_n - sent);
    for (size_t i = 0; i < n; ++i) buf[i] = tx->next();
    if (int rc = send_all(s, buf.data(), n); rc < 0) {
      res->fail("send: %s", strerror(-rc));
      break;
    }
    sent += n;
  }
  reader.join();
  if (!rx_why.empty()) res->fail("%s", rx_why.c_str());
  if (!res->ok) say("the stuck end: %s", channel_state(s).c_str());
}

// After the last part: FIN out, EOF in.
void finish_stream(rsock::Stream& s, Result* res) {
  s.shutdown(false, true);
  uint8_t b;
  ssize_t n = recv_some(s, &b, 1);
  if (n != 0)
    res->fail("no EOF at the end: %s", n > 0 ? "more bytes" : strerror(static_cast<int>(-n)));
}

constexpr size_t kMovePart = 1536u << 10;  // before the move, each way
constexpr size_t kMoveTotal = 6u << 20;    // in all, each way

// The process that takes the stream over: a fork's child of its holder.
// Returns its pid; the child runs fn(s) and exits 0 if it passed.
template <class Fn>
pid_t fork_taker(rsock::Stream& s, Fn fn) {
  s.channel().add_holder();  // as the fork hook does, before the fork
  const pid_t pid = fork();
  if (pid != 0) return pid;
  rsock::VerbsEngine::after_fork_child();  // as the fork hook does, in the child
  s.after_fork_child();
  _exit(fn() ? 0 : 1);
}

bool wait_child(pid_t pid, const char* who, Result* res) {
  int st = 0;
  const int64_t deadline = now_us() + 4ll * kWaitMs * 1000;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) break;
    if (now_us() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &st, 0);
      res->fail("%s hung", who);
      return false;
    }
    usleep(10000);
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    res->fail("%s failed (status %d)", who, st);
    return false;
  }
  return true;
}

// move-early / move-late / move-both / move-twice on this side. `moves`:
// whether this side's end moves (the client's only in move-both).
void case_move(std::unique_ptr<rsock::Stream>& sp, bool is_server, const std::string& c,
               Result* res) {
  rsock::Stream& s = *sp;
  const bool moves = is_server || c == "move-both";
  Pattern tx(is_server ? 11 : 12), rx(is_server ? 12 : 11);
  duplex(s, &tx, &rx, kMovePart, kMovePart, is_server ? 5 : 6, res);
  if (!res->ok) return;
  if (!moves) {
    duplex(s, &tx, &rx, kMoveTotal - kMovePart, kMoveTotal - kMovePart, 7, res);
    if (res->ok) finish_stream(s, res);
    if (res->ok) say("%s: %zu bytes each way checked, EOF", c.c_str(), kMoveTotal);
    return;
  }
  int took[2];
  if (pipe(took) != 0) {
    res->fail("pipe");
    return;
  }
  const pid_t child = fork_taker(s, [&] {
    close(took[0]);
    Result r;
    // The first call takes the end over.
    const size_t first = 1000;
    duplex(s, &tx, &rx, first, first, 9, &r);
    (void)!write(took[1], "t", 1);
    if (r.ok && c == "move-twice") {
      // Hand it on again: a grandchild finishes it; we close at once.
      const pid_t grand = fork_taker(s, [&] {
        Result g;
        duplex(s, &tx, &rx, kMoveTotal - kMovePart - first, kMoveTotal - kMovePart - first, 10, &g);
        if (g.ok) finish_stream(s, &g);
        if (!g.ok) say("%s grandchild: %s", c.c_str(), g.why.c_str());
        s.channel().at_exit();
        return g.ok;
      });
      s.close();
      s.channel().at_exit();  // what this process's close does before it exits
      wait_child(grand, "grandchild", &r);
      if (!r.ok) say("%s child: %s", c.c_str(), r.why.c_str());
      return r.ok;
    }
    if (r.ok)
      duplex(s, &tx, &rx, kMoveTotal - kMovePart - first, kMoveTotal - kMovePart - first, 8, &r);
    if (r.ok) finish_stream(s, &r);
    if (!r.ok) say("%s child: %s", c.c_str(), r.why.c_str());
    s.channel().at_exit();  // the exit hook: deliver what is posted
    return r.ok;
  });
  close(took[1]);
  if (c == "move-late") {
    // The child's first call comes first: wait for it, then try ours.
    char b;
    pollfd p{took[0], POLLIN, 0};
    if (poll(&p, 1, kWaitMs) != 1 || read(took[0], &b, 1) != 1)
      res->fail("the child never took over");
    uint8_t x = 0;
    iovec iov = {&x, 1};
    const ssize_t n = s.send(&iov, 1);
    if (n != -ECONNRESET)
      res->fail("the parent's send after the takeover returned %zd, want ECONNRESET", n);
  }
  close(took[0]);
  sp->close();  // our copy goes at once (fork per connection)
  sp.reset();
  wait_child(child, "the child", res);
  if (res->ok)
    say("%s: moved to a child process; %zu bytes each way checked, EOF", c.c_str(), kMoveTotal);
}

// The server's child sends its MOVE and dies; the parent keeps holding the
// socket. The client must see its stream reset within the move bound.
void case_move_kill(rsock::Stream& s, int tcp_fd, bool is_server, Result* res) {
  uint8_t b = 0;
  if (!is_server) {
    const int64_t t0 = now_us();
    ssize_t n = recv_some(s, &b, 1);
    const double secs = (now_us() - t0) / 1e6;
    if (n != -ECONNRESET)
      res->fail("recv returned %zd (%s), want ECONNRESET", n,
                n < 0 ? strerror(static_cast<int>(-n)) : "");
    else if (secs > rsock::kVerbsMoveMs / 1000.0 + 20)
      res->fail("the reset took %.1f s", secs);
    else
      say("move-kill: the stream was reset %.1f s after the taker died", secs);
    return;
  }
  const pid_t child = fork_taker(s, [&] {
    iovec iov = {&b, 1};
    const ssize_t n = s.recv(&iov, 1, false);  // starts the takeover: MOVE out
    if (n != -EAGAIN) say("move-kill child: the first recv returned %zd", n);
    return true;  // and dies without finishing it
  });
  wait_child(child, "the child", res);
  // Hold the socket until the client has given up on the move and closed
  // it: on the kernel socket, its RESET frame, then EOF.
  const int64_t end = now_us() + (rsock::kVerbsMoveMs + 20000) * 1000;
  uint8_t junk[256];
  for (;;) {
    pollfd p{tcp_fd, POLLIN, 0};
    if (now_us() > end) {
      res->fail("the client did not close its end");
      break;
    }
    if (poll(&p, 1, 200) != 1) continue;
    if (recv(tcp_fd, junk, sizeof junk, 0) <= 0) break;
  }
  iovec iov = {&b, 1};
  const ssize_t n = s.recv(&iov, 1, false);
  if (n != -ECONNRESET)
    res->fail("the parent's recv returned %zd, want ECONNRESET (taken over)", n);
}

// Bytes behind librsock on a moved or moving end (move-raw,
// move-raw-detached): both ends reset, the bytes before them delivered.
void case_move_raw(std::unique_ptr<rsock::Stream>& sp, int tcp_fd, bool is_server,
                   const std::string& c, Result* res) {
  rsock::Stream& s = *sp;
  const bool detached = c == "move-raw-detached";
  Pattern tx(is_server ? 21 : 22), rx(is_server ? 22 : 21);
  duplex(s, &tx, &rx, kMovePart, kMovePart, is_server ? 5 : 6, res);
  if (!res->ok) return;
  uint8_t b = 0;
  auto expect_reset = [&](Result* r, const char* who, const char* since, int64_t t0) {
    const ssize_t n = recv_some(s, &b, 1);
    if (n != -ECONNRESET)
      r->fail("%s: recv returned %zd (%s), want ECONNRESET", who, n,
              n < 0 ? strerror(static_cast<int>(-n)) : "");
    else
      say("%s: %s reset %.1f s after %s", c.c_str(), who, (now_us() - t0) / 1e6, since);
  };
  if (!is_server) {
    if (detached)
      usleep(1000 * 1000);  // the server's parent has let the end go by now
    else
      duplex(s, &tx, &rx, 1000, 1000, 9, res);  // the end has moved
    if (!res->ok) return;
    const int64_t t0 = now_us();
    if (send(tcp_fd, "RAW", 3, MSG_NOSIGNAL) != 3) {
      res->fail("raw send: %s", strerror(errno));
      return;
    }
    expect_reset(res, "the client", "its raw bytes", t0);
    return;
  }
  const pid_t child = fork_taker(s, [&] {
    Result r;
    const int64_t t0 = now_us();
    if (detached) {
      // Our first call (the takeover) once the raw bytes wait in the socket.
      pollfd p{tcp_fd, POLLIN, 0};
      if (poll(&p, 1, kWaitMs) != 1) r.fail("the raw bytes never came");
    } else {
      duplex(s, &tx, &rx, 1000, 1000, 9, &r);
    }
    if (r.ok) expect_reset(&r, "the child", "it began", t0);
    if (!r.ok) say("%s child: %s", c.c_str(), r.why.c_str());
    s.channel().at_exit();
    return r.ok;
  });
  sp->close();  // our copy goes at once: the child alone holds the end
  sp.reset();
  wait_child(child, "the child", res);
}

// ------------------------------------------------------------------ driver --

// --------------------------------------------------------------- many --

// This process's descriptors whose link names `needle` (all: nullptr).
int count_fds(const char* needle) {
  int n = 0;
  for (int fd = 0; fd < 4096; ++fd) {
    char link[128] = {}, path[32];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    if (readlink(path, link, sizeof link - 1) <= 0) continue;
    if (!needle || strstr(link, needle)) ++n;
  }
  return n;
}

struct ManyConn {
  int fd = -1;
  rsock::WakeHub hub;  // its own sleepers, as each ConnectionState's
  std::unique_ptr<rsock::Stream> s;
};

using OpenFn = std::function<int(std::unique_ptr<rsock::Channel>*)>;

// Makes c, a connection `open` pairs, with its own WakeHub for the engine's
// kicks. false: not paired.
bool open_conn(ManyConn& c, const OpenFn& open) {
  std::unique_ptr<rsock::Channel> ch;
  c.fd = open(&ch);
  if (c.fd < 0 || !ch) return false;
  ch->set_async_kick(&kick_wake, &c.hub);
  c.s = std::make_unique<rsock::Stream>(std::move(ch));
  return true;
}

// The channel (queue pair) goes before the TCP socket.
void close_conn(ManyConn& c) {
  if (c.s) c.s->close();
  c.s.reset();
  if (c.fd >= 0) close(c.fd);
  c.fd = -1;
}

// kManyConns connections made and paired one after the other (the peer
// does the same), then the case. `open` makes one: its fd and channel.
bool run_many(bool is_server, const OpenFn& open) {
  Result res;
  // Completion channels and the contexts' async descriptors are anonymous
  // "[infinibandevent]" files, rdma_cm event channels /dev/infiniband/rdma_cm.
  const int fds0 = count_fds(nullptr), events0 = count_fds("infinibandevent");
  const int cm0 = count_fds("rdma_cm");
  std::vector<std::unique_ptr<ManyConn>> conns;
  for (int i = 0; i < kManyConns && res.ok; ++i) {
    auto c = std::make_unique<ManyConn>();
    if (!open_conn(*c, open)) {
      res.fail("connection %d: not paired", i);
      close_conn(*c);
      break;
    }
    conns.push_back(std::move(c));
  }
  const int fds1 = count_fds(nullptr), events1 = count_fds("infinibandevent");
  const int cm1 = count_fds("rdma_cm");
  rsock::VerbsEngine* engine = nullptr;
  if (res.ok) {
    for (auto& c : conns) {
      auto* v = dynamic_cast<rsock::VerbsChannel*>(&c->s->channel());
      rsock::VerbsEngine* e = v ? v->engine() : nullptr;
      if (!e || (engine && e != engine)) res.fail("the channels do not share one engine");
      engine = e;
    }
  }
  // (+ 5: the engine's own, should the first of them make it.)
  if (res.ok && fds1 - fds0 > 4 * kManyConns + 5)
    res.fail("%d descriptors more for %d connections, want at most 4 each", fds1 - fds0,
             kManyConns);
  if (res.ok && cm1 > cm0 + 1)  // (the engine's, made by the first connection)
    res.fail("%d rdma_cm event channels more for %d connections", cm1 - cm0, kManyConns);
  if (res.ok && events1 > events0 + 2)  // (the first connection's context and engine)
    res.fail("%d completion channels and event descriptors more for %d connections",
             events1 - events0, kManyConns);
  const int cqs = engine ? engine->cqs() : 0;
  if (res.ok && (cqs < 1 || cqs > kManyConns / 4))
    res.fail("%d CQs for %d connections", cqs, kManyConns);
  // A ping-pong on each in turn: the side that waits sleeps (the other has
  // nothing to send until it answered), woken by the engine.
  uint8_t buf[100];
  for (int round = 0; round < 2 && res.ok; ++round) {
    for (int i = 0; i < kManyConns && res.ok; ++i) {
      ManyConn& c = *conns[i];
      Pattern p(1000 + 10 * i + round);
      if (!is_server) {
        for (uint8_t& b : buf) b = p.next();
        int rc = send_all(*c.s, buf, sizeof buf, c.hub);
        if (rc == 0) rc = recv_all(*c.s, buf, sizeof buf, c.hub);
        Pattern q(1000 + 10 * i + round);
        for (size_t k = 0; rc == 0 && k < sizeof buf; ++k)
          if (buf[k] != q.next()) rc = -EBADMSG;
        if (rc < 0) res.fail("ping-pong on connection %d: %s", i, strerror(-rc));
      } else {
        int rc = recv_all(*c.s, buf, sizeof buf, c.hub);
        for (size_t k = 0; rc == 0 && k < sizeof buf; ++k)
          if (buf[k] != p.next()) rc = -EBADMSG;
        if (rc == 0) rc = send_all(*c.s, buf, sizeof buf, c.hub);
        if (rc < 0)
          res.fail("ping-pong on connection %d: %s (%s)", i, strerror(-rc),
                   channel_state(*c.s).c_str());
      }
    }
  }
  // All at once: a thread sends on each in turn while this one receives.
  if (res.ok) {
    std::string tx_why;
    std::thread tx([&] {
      std::vector<uint8_t> out(kManyBytes);
      for (int i = 0; i < kManyConns && tx_why.empty(); ++i) {
        Pattern p(5000 + 2 * i + (is_server ? 1 : 0));
        for (uint8_t& b : out) b = p.next();
        if (int rc = send_all(*conns[i]->s, out.data(), out.size(), conns[i]->hub); rc < 0)
          tx_why = "send on connection " + std::to_string(i) + ": " + strerror(-rc);
      }
    });
    std::vector<uint8_t> in(kManyBytes);
    for (int i = 0; i < kManyConns && res.ok; ++i) {
      int rc = recv_all(*conns[i]->s, in.data(), in.size(), conns[i]->hub);
      Pattern p(5000 + 2 * i + (is_server ? 0 : 1));
      for (size_t k = 0; rc == 0 && k < in.size(); ++k)
        if (in[k] != p.next()) rc = -EBADMSG;
      if (rc < 0) res.fail("recv on connection %d: %s", i, strerror(-rc));
    }
    tx.join();
    if (!tx_why.empty()) res.fail("%s", tx_why.c_str());
  }
  // Each side closes as soon as it has read everything, while the other
  // may still be reading its connections in turn: the closes must reach a
  // busy reader as its data and EOF, not a reset (a packet lost in this
  // burst is sent again; the close waits for the queue pair's verdict).
  for (auto& c : conns) close_conn(*c);
  if (res.ok)
    say("PASS many (%d connections: %d descriptors more, %d event descriptors more, %d rdma_cm "
        "channels more, %d CQs)",
        kManyConns, fds1 - fds0, events1 - events0, cm1 - cm0, cqs);
  else
    say("FAIL many: %s", res.why.c_str());
  return res.ok;
}

// ------------------------------------------------------------- rkeys --

// What the server tells the client of its first connection, over the second.
struct RkeyTarget {
  uint64_t addr;  // where in the server's ring of the first connection
  uint32_t rkey;  // that ring's rkey
  uint8_t pattern[12];
};

bool run_rkeys(bool is_server, const OpenFn& open) {
  Result res;
  ManyConn conns[2];
  for (int i = 0; i < 2 && res.ok; ++i)
    if (!open_conn(conns[i], open)) res.fail("connection %d: not paired", i);
  auto* v0 = res.ok ? dynamic_cast<rsock::VerbsChannel*>(&conns[0].s->channel()) : nullptr;
  auto* v1 = res.ok ? dynamic_cast<rsock::VerbsChannel*>(&conns[1].s->channel()) : nullptr;
  if (res.ok && (!v0 || !v1)) res.fail("not verbs channels");
  // A place in the first connection's ring that its traffic (one byte)
  // never reaches.
  const size_t spot = res.ok ? v0->ring_bytes() - 64 : 0;
  RkeyTarget t = {};
  if (res.ok && is_server) {
    t.addr = v0->rx_addr() + spot;
    t.rkey = v0->rx_rkey();
    Pattern p(static_cast<uint64_t>(now_us()));
    for (uint8_t& b : t.pattern) b = p.next();
    const uint8_t* ring = v0->rx_ring() + spot;
    if (memcmp(ring, t.pattern, sizeof t.pattern) == 0)
      res.fail("the pattern is in the ring already");
    int rc = send_all(*conns[1].s, reinterpret_cast<const uint8_t*>(&t), sizeof t, conns[1].hub);
    uint8_t b = 0;  // the client has tried
    if (rc == 0) rc = recv_all(*conns[0].s, &b, 1, conns[0].hub);
    if (memcmp(ring, t.pattern, sizeof t.pattern) == 0)
      res.fail("the peer of connection 1 wrote into connection 0's ring with its rkey");
    if (rc < 0) res.fail("waiting for the client on connection 0: %s", strerror(-rc));
    if (rc == 0) rc = send_all(*conns[0].s, &b, 1, conns[0].hub);
    if (rc < 0) res.fail("answering on connection 0: %s", strerror(-rc));
  } else if (res.ok) {
    int rc = recv_all(*conns[1].s, reinterpret_cast<uint8_t*>(&t), sizeof t, conns[1].hub);
    if (rc < 0) res.fail("reading the target on connection 1: %s", strerror(-rc));
    ibv_qp* qp = v1->id() ? v1->id()->qp : nullptr;
    if (res.ok && !qp) res.fail("connection 1 has no rdma_cm queue pair");
    if (res.ok) {
      ibv_sge sge = {reinterpret_cast<uintptr_t>(t.pattern), sizeof t.pattern, 0};
      ibv_send_wr wr = {};
      wr.wr_id = 0;  // (none of the channel's: a failure is all it will see)
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.wr.rdma.remote_addr = t.addr;
      wr.wr.rdma.rkey = t.rkey;
      ibv_send_wr* bad = nullptr;
      if (ibv_post_send(qp, &wr, &bad) != 0) res.fail("ibv_post_send: %s", strerror(errno));
    }
    // The write fails at the server's device: connection 1 breaks.
    uint8_t b = 0;
    const ssize_t n = res.ok ? recv_some(*conns[1].s, &b, 1, conns[1].hub) : -1;
    if (res.ok && n != -ECONNRESET && n != -EPIPE && n != 0)
      res.fail("connection 1 after the write: %zd, want it broken", n);
    // Tell the server, and hear back: connection 0 is unharmed.
    b = 7;
    if (res.ok) rc = send_all(*conns[0].s, &b, 1, conns[0].hub);
    if (res.ok && rc == 0) rc = recv_all(*conns[0].s, &b, 1, conns[0].hub);
    if (res.ok && (rc < 0 || b != 7))
      res.fail("connection 0 after the write: %s", rc < 0 ? strerror(-rc) : "wrong byte");
  }
  for (auto& c : conns) close_conn(c);
  if (res.ok)
    say("PASS rkeys (connection 0's rkey refused on connection 1's queue pair)");
  else
    say("FAIL rkeys: %s", res.why.c_str());
  return res.ok;
}

// ------------------------------------------------------------ linger --

bool run_linger(bool is_server, const OpenFn& open) {
  Result res;
  ManyConn conns[2];  // 0: the one closed, 1: control
  for (int i = 0; i < 2 && res.ok; ++i)
    if (!open_conn(conns[i], open)) res.fail("connection %d: not paired", i);
  auto* v0 = res.ok ? dynamic_cast<rsock::VerbsChannel*>(&conns[0].s->channel()) : nullptr;
  if (res.ok && (!v0 || !v0->id() || !v0->id()->qp)) res.fail("connection 0 has no queue pair");
  uint8_t b = 1;
  if (res.ok && is_server) {
    ibv_qp_attr a = {};
    a.qp_state = IBV_QPS_ERR;  // drops what comes: nothing is acknowledged
    if (ibv_modify_qp(v0->id()->qp, &a, IBV_QP_STATE) != 0)
      res.fail("ibv_modify_qp(ERR): %s", strerror(errno));
    int rc = res.ok ? send_all(*conns[1].s, &b, 1, conns[1].hub) : 0;
    if (rc == 0 && res.ok) rc = recv_all(*conns[1].s, &b, 1, conns[1].hub);  // the client is done
    if (rc < 0) res.fail("control connection: %s", strerror(-rc));
  } else if (res.ok) {
    int rc = recv_all(*conns[1].s, &b, 1, conns[1].hub);
    if (rc < 0) res.fail("control connection: %s", strerror(-rc));
    std::vector<uint8_t> out(1000, 0x5a);
    if (res.ok) rc = send_all(*conns[0].s, out.data(), out.size(), conns[0].hub);
    if (res.ok && rc < 0) res.fail("send on connection 0: %s", strerror(-rc));
    rsock::VerbsEngine* engine = v0->engine();
    const int before = engine->lingering();
    if (res.ok) close_conn(conns[0]);
    const int fds_closed = count_fds(nullptr);
    if (res.ok && engine->lingering() != before + 1)
      res.fail("close() returned with %d queue pairs lingering, want %d", engine->lingering(),
               before + 1);
    // Its verdict: the retries spent (about 2 s), or the deadline.
    const int64_t give_up = now_us() + 20 * 1000000ll;
    while (res.ok && engine->lingering() > before && now_us() < give_up) usleep(10000);
    if (res.ok && engine->lingering() != before)
      res.fail("the lingering queue pair was not finished in 20 s");
    if (res.ok && count_fds(nullptr) >= fds_closed)
      res.fail("the finished queue pair kept its descriptors (%d, %d at the close)",
               count_fds(nullptr), fds_closed);
    b = 2;
    rc = send_all(*conns[1].s, &b, 1, conns[1].hub);
    if (res.ok && rc < 0) res.fail("control connection: %s", strerror(-rc));
  }
  for (auto& c : conns) close_conn(c);
  if (res.ok)
    say("PASS linger");
  else
    say("FAIL linger: %s", res.why.c_str());
  return res.ok;
}

// ------------------------------------------------------------- rings --

constexpr int kRingRounds = 6;
rsock::Fallback g_open_why = rsock::Fallback::kCount;  // the last open_one's

// A closed connection's rings come back when its queue pair goes: at the
// close, or at the verdict of one that lingers.
bool wait_no_lingering(rsock::VerbsEngine* e) {
  const int64_t give_up = now_us() + 20 * 1000000ll;
  while (e->lingering() > 0 && now_us() < give_up) usleep(5000);
  return e->lingering() == 0;
}

// One byte there and back on c (the client starts).
int ping(ManyConn& c, bool is_server, uint8_t b) {
  uint8_t got = 0;
  int rc = is_server ? recv_all(*c.s, &got, 1, c.hub) : send_all(*c.s, &b, 1, c.hub);
  if (rc == 0) rc = is_server ? send_all(*c.s, &got, 1, c.hub) : recv_all(*c.s, &got, 1, c.hub);
  return rc < 0 ? rc : got == b ? 0 : -EBADMSG;
}

rsock::VerbsEngine* engine_of(ManyConn& c) {
  auto* v = dynamic_cast<rsock::VerbsChannel*>(&c.s->channel());
  return v ? v->engine() : nullptr;
}

struct Rounds {
  uint64_t made = 0, reused = 0;  // rings, by the stats
  double median_ms = 0;           // of the pairings
};

// n connections one after the other, a byte each way on each, each closed
// and its queue pair gone before the next.
Rounds rings_rounds(int n, bool is_server, const OpenFn& open, rsock::VerbsEngine* engine,
                    Result* res) {
  const uint64_t made0 = rsock::stats_rdma_rings_count(false);
  const uint64_t reused0 = rsock::stats_rdma_rings_count(true);
  std::vector<double> ms;
  for (int i = 0; i < n && res->ok; ++i) {
    ManyConn c;
    const int64_t t0 = now_us();
    if (!open_conn(c, open)) res->fail("round %d: not paired", i);
    ms.push_back((now_us() - t0) / 1e3);
    if (res->ok)
      if (int rc = ping(c, is_server, static_cast<uint8_t>(i + 1)); rc < 0)
        res->fail("round %d: %s", i, strerror(-rc));
    close_conn(c);
    if (res->ok && !wait_no_lingering(engine)) res->fail("round %d: still lingering after 20 s", i);
  }
  Rounds r;
  r.made = rsock::stats_rdma_rings_count(false) - made0;
  r.reused = rsock::stats_rdma_rings_count(true) - reused0;
  std::sort(ms.begin(), ms.end());
  if (!ms.empty()) r.median_ms = ms[ms.size() / 2];
  return r;
}

// Connections one after the other use the registered rings of the one
// before (verbs_rings.h), unless none may be kept (RSOCK_REGION_CACHE=0);
// the client's pinned memory bound turns a connection away
// (rdma_pinned_limit) until a closed one gives its rings back. The server
// mirrors the client's steps. Connection a stays open throughout.
bool run_rings(bool is_server, const OpenFn& open) {
  Result res;
  ManyConn a, b, c;
  rsock::VerbsEngine* engine = nullptr;
  if (!open_conn(a, open)) res.fail("connection a: not paired");
  if (res.ok && !(engine = engine_of(a))) res.fail("connection a: no engine");
  if (res.ok)
    if (int rc = ping(a, is_server, 41); rc < 0) res.fail("connection a: %s", strerror(-rc));
  // None kept: each connection makes its own.
  g_cfg.region_cache = 0;
  if (res.ok) engine->release_kept_rings();
  const Rounds fresh = res.ok ? rings_rounds(kRingRounds, is_server, open, engine, &res) : Rounds();
  if (res.ok && (fresh.made != kRingRounds || fresh.reused != 0))
    res.fail("RSOCK_REGION_CACHE=0: %d connections made %llu rings and reused %llu", kRingRounds,
             static_cast<unsigned long long>(fresh.made),
             static_cast<unsigned long long>(fresh.reused));
  if (res.ok && engine->kept_rings() != 0)
    res.fail("RSOCK_REGION_CACHE=0 kept %d rings", engine->kept_rings());
  // Kept: the first makes them (or not even it), the others reuse them.
  g_cfg.region_cache = rsock::kDefaultRegionCache;
  const Rounds kept = res.ok ? rings_rounds(kRingRounds, is_server, open, engine, &res) : Rounds();
  if (res.ok && (kept.made > 1 || kept.reused + 1 < kRingRounds))
    res.fail("%d connections in a row made %llu rings and reused %llu, want at most 1 made",
             kRingRounds, static_cast<unsigned long long>(kept.made),
             static_cast<unsigned long long>(kept.reused));
  if (res.ok && rsock::verbs_pinned_bytes() == 0) res.fail("nothing counted as pinned");
  if (res.ok && engine->kept_rings() < 1) res.fail("no rings kept after the last close");

  // The bound: the client gives its kept rings up and leaves no room for
  // another connection beside a.
  if (res.ok && !is_server) {
    engine->release_kept_rings();
    rsock::verbs_set_pinned_limit_for_test(rsock::verbs_pinned_bytes());
  }
  if (res.ok)  // (the server waits for the client's bound)
    if (int rc = ping(a, is_server, 42); rc < 0) res.fail("connection a: %s", strerror(-rc));
  const uint64_t pinned_full = rsock::verbs_pinned_bytes();
  if (res.ok && open_conn(b, open)) res.fail("connection b paired beyond the bound");
  if (res.ok && !is_server && g_open_why != rsock::Fallback::kRdmaPinnedLimit)
    res.fail("connection b stayed on TCP for %s, want rdma_pinned_limit",
             rsock::fallback_name(g_open_why));
  if (res.ok && !is_server && rsock::verbs_pinned_bytes() != pinned_full)
    res.fail("pinned %llu bytes after the refusal, %llu before",
             static_cast<unsigned long long>(rsock::verbs_pinned_bytes()),
             static_cast<unsigned long long>(pinned_full));
  close_conn(b);
  // a's rings come back and serve c, within the bound.
  close_conn(a);
  if (res.ok && !wait_no_lingering(engine)) res.fail("connection a still lingering after 20 s");
  if (res.ok && !open_conn(c, open))
    res.fail("connection c: not paired after a gave its rings back (%s)",
             rsock::fallback_name(g_open_why));
  if (res.ok)
    if (int rc = ping(c, is_server, 43); rc < 0) res.fail("connection c: %s", strerror(-rc));
  close_conn(c);
  rsock::verbs_set_pinned_limit_for_test(0);
  if (res.ok)
    say("PASS rings (%d in a row: none kept: %llu made, pairing median %.2f ms; kept: %llu made, "
        "%llu reused, pairing median %.2f ms; beyond the bound: %s)",
        kRingRounds, static_cast<unsigned long long>(fresh.made), fresh.median_ms,
        static_cast<unsigned long long>(kept.made), static_cast<unsigned long long>(kept.reused),
        kept.median_ms, is_server ? "no request came" : "rdma_pinned_limit");
  else
    say("FAIL rings: %s", res.why.c_str());
  return res.ok;
}

bool is_tcp_case(const std::string& c) { return c.rfind("tcp-", 0) == 0; }

// The cases that open their own connections (several), or nullptr.
using MultiCase = bool (*)(bool, const OpenFn&);
MultiCase multi_case(const std::string& c) {
  return c == "many"     ? run_many
         : c == "rkeys"  ? run_rkeys
         : c == "linger" ? run_linger
         : c == "rings"  ? run_rings
                         : nullptr;
}

// Runs a pairing to its end: its channel, or nullptr with *why.
std::unique_ptr<rsock::Channel> run_pairing(std::unique_ptr<rsock::Pairing> p, rsock::Fallback* why) {
  p->run(INT64_MAX);
  *why = p->why();
  return p->take_channel();
}

int make_listener(int port) {
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || listen(ls, 16) != 0) {
    say("bind/listen :%d: %s", port, strerror(errno));
    exit(2);
  }
  return ls;
}

int accept_one(int ls) {
  pollfd p{ls, POLLIN, 0};
  if (poll(&p, 1, 4 * kWaitMs) != 1) return -1;
  return accept(ls, nullptr, nullptr);
}

int connect_to(const char* host, int port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) return -1;
  for (int attempt = 0; attempt < 20; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) return fd;
    close(fd);
    usleep(100000 * (attempt + 1));
  }
  return -1;
}

bool run_case(const std::string& c, int fd, std::unique_ptr<rsock::Channel> ch, bool is_server) {
  Result res;
  if (is_tcp_case(c)) {
    if (c == "tcp-pingpong")
      case_tcp_pingpong(fd, is_server, &res);
    else if (c == "tcp-bw")
      case_tcp_bw(fd, is_server, &res);
    else
      res.fail("unknown case");
  } else {
    ch->set_async_kick(&kick_wake, &g_wake);  // as ConnectionState does
    auto sp = std::make_unique<rsock::Stream>(std::move(ch));
    rsock::Stream& s = *sp;
    if (c == "xfer")
      case_xfer(s, is_server, &res);
    else if (c == "pingpong")
      case_pingpong(s, is_server, &res);
    else if (c == "bw")
      case_bw(s, is_server, &res);
    else if (c == "kill")
      case_kill(s, is_server, &res);
    else if (c == "move-early" || c == "move-late" || c == "move-both" || c == "move-twice")
      case_move(sp, is_server, c, &res);
    else if (c == "move-kill")
      case_move_kill(s, fd, is_server, &res);
    else if (c == "move-raw" || c == "move-raw-detached")
      case_move_raw(sp, fd, is_server, c, &res);
    else
      res.fail("unknown case");
    if (sp) sp->close();
  }  // the channel (QP) goes before the TCP socket
  close(fd);
  if (res.ok)
    say("PASS %s", c.c_str());
  else
    say("FAIL %s: %s", c.c_str(), res.why.c_str());
  return res.ok;
}

int server(int port, const std::vector<std::string>& cases) {
  g_role = "server";
  g_cfg = test_config();
  const rsock::Config& cfg = g_cfg;
  int ls = make_listener(port);
  rsock::Fallback why;
  rsock::VerbsListener* vl = rsock::verbs_listen(ls, &why);
  if (!vl) {
    say("FAIL setup: verbs_listen: %s", rsock::fallback_name(why));
    return 1;
  }
  say("listening on :%d (TCP + rdma_cm)", port);
  int failed = 0;
  const auto open_one = [&](std::unique_ptr<rsock::Channel>* ch) {
    const int fd = accept_one(ls);
    if (fd >= 0) *ch = run_pairing(rsock::verbs_server_pairing(vl, fd, cfg), &why);
    g_open_why = why;
    return fd;
  };
  for (const auto& c : cases) {
    if (auto run = multi_case(c)) {
      if (!run(true, open_one)) ++failed;
      continue;
    }
    int fd = accept_one(ls);
    if (fd < 0) {
      say("FAIL %s: no connection", c.c_str());
      ++failed;
      continue;
    }
    std::unique_ptr<rsock::Channel> ch;
    if (!is_tcp_case(c)) {
      const int64_t t0 = now_us();
      ch = run_pairing(rsock::verbs_server_pairing(vl, fd, cfg), &why);
      if (!ch) {
        say("FAIL %s: verbs_server_pair: %s", c.c_str(), rsock::fallback_name(why));
        ++failed;
        close(fd);
        continue;
      }
      say("%s: paired over %s in %.1f ms", c.c_str(), ch->name(), (now_us() - t0) / 1e3);
    }
    if (!run_case(c, fd, std::move(ch), true)) ++failed;
  }
  rsock::verbs_listener_close(vl);
  close(ls);
  return failed ? 1 : 0;
}

int plain_server(int port) {
  g_role = "plain-server";
  int ls = make_listener(port);
  say("listening on :%d (TCP only)", port);
  int fd = accept_one(ls);
  if (fd < 0) return 1;
  char b;
  pollfd p{fd, POLLIN, 0};
  poll(&p, 1, kWaitMs);  // until the client closes
  (void)!read(fd, &b, 1);
  close(fd);
  close(ls);
  return 0;
}

int client(const char* host, int port, const std::vector<std::string>& cases) {
  g_role = "client";
  g_cfg = test_config();
  const rsock::Config& cfg = g_cfg;
  int failed = 0;
  const auto open_one = [&](std::unique_ptr<rsock::Channel>* ch) {
    const int fd = connect_to(host, port);
    rsock::Fallback why = rsock::Fallback::kCount;
    if (fd >= 0) *ch = run_pairing(rsock::verbs_client_pairing(fd, nullptr, cfg), &why);
    g_open_why = why;
    return fd;
  };
  for (const auto& c : cases) {
    if (auto run = multi_case(c)) {
      if (!run(false, open_one)) ++failed;
      continue;
    }
    int fd = connect_to(host, port);
    if (fd < 0) {
      say("FAIL %s: TCP connect to %s:%d failed", c.c_str(), host, port);
      ++failed;
      continue;
    }
    std::unique_ptr<rsock::Channel> ch;
    rsock::Fallback why = rsock::Fallback::kCount;
    if (c == "nolistener") {
      const int64_t t0 = now_us();
      ch = run_pairing(rsock::verbs_client_pairing(fd, nullptr, cfg), &why);
      const double ms = (now_us() - t0) / 1e3;
      const bool ok = !ch && why == rsock::Fallback::kPeerNotAccelerated;
      if (ok)
        say("PASS nolistener (nullptr, %s, after %.1f ms)", rsock::fallback_name(why), ms);
      else
        say("FAIL nolistener: %s, %s", ch ? "paired" : "nullptr",
            ch ? "" : rsock::fallback_name(why));
      ch.reset();
      close(fd);
      if (!ok) ++failed;
      continue;
    }
    if (!is_tcp_case(c)) {
      const int64_t t0 = now_us();
      ch = run_pairing(rsock::verbs_client_pairing(fd, nullptr, cfg), &why);
      if (!ch) {
        say("FAIL %s: verbs_client_pair: %s", c.c_str(), rsock::fallback_name(why));
        ++failed;
        close(fd);
        continue;
      }
      say("%s: paired over %s in %.1f ms", c.c_str(), ch->name(), (now_us() - t0) / 1e3);
    }
    if (!run_case(c, fd, std::move(ch), false)) ++failed;
  }
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  if (const char* v = getenv("RSOCK_SPIN_US")) g_spin_us = atoi(v);
  // The runtime is not started here: the log level is taken as a digit.
  if (const char* v = getenv("RSOCK_LOG_LEVEL"); v && v[0] >= '0' && v[0] <= '4' && !v[1])
    rsock::g_log_level = v[0] - '0';
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "server" && argc >= 4)
    return server(atoi(argv[2]), std::vector<std::string>(argv + 3, argv + argc));
  if (mode == "plain-server" && argc == 3) return plain_server(atoi(argv[2]));
  if (mode == "client" && argc >= 5)
    return client(argv[2], atoi(argv[3]), std::vector<std::string>(argv + 4, argv + argc));
  std::fprintf(stderr,
               "usage: verbs_pair_test server PORT CASE... | client HOST PORT CASE... |\n"
               "       verbs_pair_test plain-server PORT\n");
  return 2;
}
