#include "common/sleep_token.h"

#include <sys/random.h>
#include <time.h>
#include <unistd.h>

namespace rsock {
namespace {

struct TokenState {
  uint64_t next;
  bool seeded;
};
constinit thread_local TokenState t_tokens = {0, false};

uint64_t seed() {
  uint64_t s = 0;
  if (getrandom(&s, sizeof s, GRND_NONBLOCK) == static_cast<ssize_t>(sizeof s)) return s;
  // No entropy yet (early boot): the time, the pid and the thread's
  // address, mixed; still distinct between the threads of one process.
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  s = static_cast<uint64_t>(ts.tv_nsec) ^ (static_cast<uint64_t>(ts.tv_sec) << 30) ^
      (static_cast<uint64_t>(getpid()) << 40) ^ reinterpret_cast<uintptr_t>(&t_tokens);
  return s * 0x9e3779b97f4a7c15ull;
}

}  // namespace

uint64_t new_sleep_token() {
  TokenState& t = t_tokens;
  if (!t.seeded) {
    t.next = seed();
    t.seeded = true;
  }
  // The low bits step: ring/sleepers.h keeps the low 52 bits of a token.
  return t.next++;
}

void sleep_tokens_after_fork_child() { t_tokens.seeded = false; }

}  // namespace rsock
