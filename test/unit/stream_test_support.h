// Helpers shared by the Stream tests over the fake and the shm transports: a
// position-addressed byte pattern (the byte at absolute stream position p is a
// pure function of (seed, p), so a receiver verifies any chunking without
// storing the stream), a blocking wait that mirrors src/socket's conn_wait
// (spin on events(), then join the end's WakeHub, arm, re-check, poll on
// wait_fd and the hub's fd with a timeout, drain, kick), and a two-thread
// pump that streams a pattern from one Stream to another.
#pragma once

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/sleep_token.h"
#include "socket/wake_hub.h"
#include "stream/stream.h"
#include "transport/channel.h"

namespace rsock::testing {

inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Writes the pattern bytes [pos, pos + n) of stream `seed` to dst.
inline void fill_pattern(uint64_t seed, uint64_t pos, uint8_t* dst, size_t n) {
  while (n > 0) {
    const uint64_t word = mix64(seed ^ (pos >> 3) * 0x100000001b3ull);
    const unsigned k = static_cast<unsigned>(pos & 7);
    const size_t take = std::min<size_t>(8 - k, n);
    for (size_t j = 0; j < take; ++j) dst[j] = static_cast<uint8_t>(word >> (8 * (k + j)));
    dst += take;
    pos += take;
    n -= take;
  }
}

// Returns the index of the first byte of src that differs from the pattern at
// pos, or n when all match. scratch is resized as needed.
inline size_t check_pattern(uint64_t seed, uint64_t pos, const uint8_t* src, size_t n,
                            std::vector<uint8_t>& scratch) {
  if (scratch.size() < n) scratch.resize(n);
  fill_pattern(seed, pos, scratch.data(), n);
  if (memcmp(scratch.data(), src, n) == 0) return n;
  for (size_t i = 0; i < n; ++i)
    if (scratch[i] != src[i]) return i;
  return n;
}

// Splits [buf, buf + len) into 1..4 iovecs at random cut points (some may be
// empty). Returns the iovec count.
inline int random_iov(std::mt19937_64& rng, uint8_t* buf, size_t len, iovec out[4]) {
  const int cnt = static_cast<int>(rng() % 4) + 1;
  size_t cuts[5] = {0, 0, 0, 0, len};
  for (int i = 1; i < cnt; ++i) cuts[i] = len ? rng() % (len + 1) : 0;
  std::sort(cuts + 1, cuts + cnt);
  cuts[cnt] = len;
  for (int i = 0; i < cnt; ++i) out[i] = {buf + cuts[i], cuts[i + 1] - cuts[i]};
  return cnt;
}

// A size for one send/recv call: mostly small or around the ring size, so
// that both many-small and ring-filling patterns occur.
inline size_t random_io_size(std::mt19937_64& rng, size_t ring_bytes) {
  switch (rng() % 4) {
    case 0:
      return 1 + rng() % 16;
    case 1:
      return 1 + rng() % 512;
    case 2:
      return 1 + rng() % ring_bytes;
    default:
      return 1 + rng() % (2 * ring_bytes);
  }
}

// Shared by the two pump threads: progress is any byte moved or any end
// condition seen; a side that times out in its wait many times in a row while
// nothing progressed anywhere declares a deadlock and stops both.
struct PumpShared {
  std::atomic<uint64_t> progress{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> deadlock{false};
  std::atomic<uint64_t> timeouts{0};  // waits that ended by timeout, not by a wakeup
  std::atomic<uint64_t> sleeps{0};    // waits that reached poll()
};

struct WaitParams {
  int spin = 256;          // events() polls before arming (the fake ticks on each)
  int timeout_ms = 1;      // poll() timeout on wait_fd
  int stall_limit = 5000;  // consecutive no-progress timeouts before declaring deadlock
};

// The WakeHub of a stream end, as the socket layer's ConnectionState holds
// one: the threads that wait on one end share it.
inline WakeHub& hub_of(const Stream& s) {
  static std::mutex mu;
  static std::map<const Stream*, std::unique_ptr<WakeHub>> hubs;
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<WakeHub>& h = hubs[&s];
  if (!h) h = std::make_unique<WakeHub>();
  return *h;
}

// Waits like src/socket's conn_wait until `want` is ready on s. Returns false
// when the pump was stopped or a deadlock was declared.
inline bool wait_ready(Stream& s, uint32_t want, PumpShared& sh, const WaitParams& wp) {
  auto ready = [&] {
    StreamEvents ev = s.events();
    return want == kWantData ? ev.readable : ev.writable;
  };
  for (int i = 0; i < wp.spin; ++i)
    if (ready()) return true;
  Channel& ch = s.channel();
  WakeHub& hub = hub_of(s);
  int stalled = 0;
  uint64_t seen = sh.progress.load();
  for (;;) {
    if (sh.stop.load()) return false;
    SleepWaker own;
    const WakeHub::Ticket t = hub.join(own.get());
    if (ch.arm(want, new_sleep_token())) hub.kick(true);
    if (ready()) {
      ch.disarm(want);
      hub.leave(t);
      return true;
    }
    // A sending side still on the kernel socket waits for its POLLOUT.
    const short kev = want == kWantSpace && s.tx_on_tcp() ? POLLIN | POLLOUT : POLLIN;
    pollfd p[2] = {{ch.wait_fd(), kev, 0}, {t.waker ? t.waker->fd() : -1, POLLIN, 0}};
    sh.sleeps.fetch_add(1);
    int rc = ::poll(p, 2, wp.timeout_ms);
    if (ch.drain_wakeups()) hub.kick(true);
    ch.disarm(want);
    hub.leave(t);
    if (ready()) return true;
    if (rc == 0) {
      sh.timeouts.fetch_add(1);
      const uint64_t now = sh.progress.load();
      if (now != seen) {
        seen = now;
        stalled = 0;
      } else if (++stalled > wp.stall_limit) {
        sh.deadlock.store(true);
        sh.stop.store(true);
        return false;
      }
    }
  }
}

struct SendResult {
  uint64_t sent = 0;  // bytes accepted by successful send() calls
  int error = 0;      // the negative errno that ended sending, 0 if all was sent
  bool finished = false;
};

struct RecvResult {
  uint64_t received = 0;
  uint64_t first_bad = UINT64_MAX;  // stream position of the first corrupt byte
  bool eof = false;
  int error = 0;
};

// Sends `total` pattern bytes of stream `seed` with random sizes and iovec
// splits, then closes (or shuts down the write side).
inline SendResult pump_send(Stream& s, uint64_t seed, uint64_t total, uint64_t rng_seed,
                            PumpShared& sh, const WaitParams& wp, bool close_at_end) {
  SendResult r;
  std::mt19937_64 rng(rng_seed);
  const size_t ring = s.channel().ring_bytes();
  std::vector<uint8_t> buf(2 * ring + 16);
  while (r.sent < total && !sh.stop.load()) {
    const size_t n = std::min<uint64_t>(random_io_size(rng, ring), total - r.sent);
    fill_pattern(seed, r.sent, buf.data(), n);
    iovec iov[4];
    const int cnt = random_iov(rng, buf.data(), n, iov);
    ssize_t rc = s.send(iov, cnt);
    if (rc > 0) {
      r.sent += static_cast<uint64_t>(rc);
      sh.progress.fetch_add(1);
    } else if (rc == -EAGAIN) {
      if (!wait_ready(s, kWantSpace, sh, wp)) return r;
    } else {
      r.error = static_cast<int>(rc);
      sh.progress.fetch_add(1);
      return r;
    }
  }
  if (close_at_end) {
    s.close();
  } else {
    // A sender still on the socket switches first (the peer must read the
    // region): waits for that, as the socket layer does.
    while (s.shutdown(false, true) == -EAGAIN && !sh.stop.load())
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  r.finished = r.sent == total;
  sh.progress.fetch_add(1);
  return r;
}

// Receives until EOF or an error, verifying every byte against the pattern.
inline RecvResult pump_recv(Stream& s, uint64_t seed, uint64_t rng_seed, PumpShared& sh,
                            const WaitParams& wp) {
  RecvResult r;
  std::mt19937_64 rng(rng_seed);
  const size_t ring = s.channel().ring_bytes();
  std::vector<uint8_t> buf(2 * ring + 16), scratch;
  while (!sh.stop.load()) {
    const size_t n = random_io_size(rng, ring);
    iovec iov[4];
    const int cnt = random_iov(rng, buf.data(), n, iov);
    ssize_t rc = s.recv(iov, cnt, false);
    if (rc > 0) {
      const size_t got = static_cast<size_t>(rc);
      const size_t ok = check_pattern(seed, r.received, buf.data(), got, scratch);
      if (ok != got && r.first_bad == UINT64_MAX) r.first_bad = r.received + ok;
      r.received += got;
      sh.progress.fetch_add(1);
    } else if (rc == 0) {
      r.eof = true;
      sh.progress.fetch_add(1);
      return r;
    } else if (rc == -EAGAIN) {
      if (!wait_ready(s, kWantData, sh, wp)) return r;
    } else {
      r.error = static_cast<int>(rc);
      sh.progress.fetch_add(1);
      return r;
    }
  }
  return r;
}

}  // namespace rsock::testing
