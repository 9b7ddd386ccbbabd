#include "common/sleep_token.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

namespace rsock {
namespace {

// The thread's next token; 0 until the thread's first sleep seeds it. An
// atomic, so that a signal handler's sleep in the middle of the outer
// call's step still takes a step of its own (one fetch_add cannot be
// split), not the same token.
constinit thread_local std::atomic<uint64_t> t_next{0};

uint64_t seed() {
  uint64_t s = 0;
  if (getrandom(&s, sizeof s, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof s)) {
    // No entropy yet (early boot): the time, the pid and the thread's
    // address, mixed; still distinct between the threads of one process.
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    s = static_cast<uint64_t>(ts.tv_nsec) ^ (static_cast<uint64_t>(ts.tv_sec) << 30) ^
        (static_cast<uint64_t>(getpid()) << 40) ^ reinterpret_cast<uintptr_t>(&t_next);
    s *= 0x9e3779b97f4a7c15ull;
  }
  return s == 0 ? 1 : s;
}

}  // namespace

uint64_t new_sleep_token() {
  if (t_next.load(std::memory_order_relaxed) == 0) {
    // A handler that seeds in between wins; the outer call then steps on.
    uint64_t unseeded = 0;
    t_next.compare_exchange_strong(unseeded, seed(), std::memory_order_relaxed);
  }
  // The low bits step: ring/sleepers.h keeps the low 52 bits of a token.
  return t_next.fetch_add(1, std::memory_order_relaxed);
}

void sleep_tokens_after_fork_child() { t_next.store(0, std::memory_order_relaxed); }

}  // namespace rsock
