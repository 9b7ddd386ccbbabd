// The sleepers word of one direction's waiters (DirectionControl's
// `producer_sleepers` and `consumer_sleepers`): how many threads sleep on
// it, and which sleep, when exactly one does.
//
// A thread that sleeps on several connections at once (epoll_wait, poll)
// arms each of them with one token, unique to that sleep. The peer rings a
// doorbell when it finds a connection armed; a peer that answers many of
// them in one pass (a server answering all of a client's connections)
// would ring one per connection, about 4 us each, although one doorbell
// ends the whole sleep: the sleeper disarms every connection before it
// looks at any of them, so whatever was published before the disarm is
// seen. So a ringing thread remembers the last token it rang and skips a
// connection armed by that token alone (shm_channel.cpp, WakeupMemo). The
// same holds for several publishes on one connection before its sleeper
// wakes. A word with several sleepers carries no token: it always rings.
//
// Layout: the low kCountBits count the sleepers, the rest is the token of
// the only one (0: none known). Pure functions on the atomic word; each
// CAS loop retries only while another sleeper arms or disarms at once.
#pragma once

#include <atomic>
#include <cstdint>

namespace rsock::sleepers {

inline constexpr int kCountBits = 12;
inline constexpr uint64_t kCountMask = (uint64_t{1} << kCountBits) - 1;
// A count that reached this stays there: it can no longer be kept exact,
// and a count too high only costs spare doorbells (never a lost one).
inline constexpr uint64_t kSaturated = kCountMask;
inline constexpr uint64_t kTokenBits = 64 - kCountBits;

inline uint64_t count(uint64_t word) { return word & kCountMask; }
inline uint64_t token(uint64_t word) { return word >> kCountBits; }

// The part of a sleep token the word keeps. 0 names no sleep: such a
// sleeper is always rung.
inline uint64_t fit_token(uint64_t raw) { return raw & ((uint64_t{1} << kTokenBits) - 1); }

// One more sleeper, of sleep `tok` (from fit_token). Sequentially
// consistent: it pairs with the waker's fence (no lost wakeup).
inline void arm(std::atomic<uint64_t>& w, uint64_t tok) {
  uint64_t cur = w.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t n = count(cur);
    uint64_t next;
    if (n == 0)
      next = (tok << kCountBits) | 1;
    else if (n >= kSaturated)
      next = kSaturated;  // no token
    else
      next = n + 1;  // several sleepers: no token
    if (w.compare_exchange_weak(cur, next, std::memory_order_seq_cst)) return;
  }
}

// k sleepers fewer (disarm, or a process that leaves takes back its
// share), stopping at zero. The token goes with the first one that leaves:
// whoever stays may be another sleep.
inline void disarm(std::atomic<uint64_t>& w, uint64_t k = 1) {
  uint64_t cur = w.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t n = count(cur);
    if (n == 0 || n >= kSaturated || k == 0) return;
    const uint64_t next = n > k ? n - k : 0;
    if (w.compare_exchange_weak(cur, next, std::memory_order_seq_cst)) return;
  }
}

}  // namespace rsock::sleepers
