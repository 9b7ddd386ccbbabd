// CLOCK_MONOTONIC readings, the one clock of every deadline and spin in
// librsock (waits, pairing bounds, takeovers). Header-only so the data
// path's spin loops inline it; vDSO-backed, no system call.
// Thread-safety: none needed.
#pragma once

#include <time.h>

#include <cstdint>

namespace rsock {

inline int64_t monotonic_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

inline int64_t monotonic_ms() { return monotonic_ns() / 1000000; }

// The deadline `us` microseconds from now, or -1 (none) for us <= 0.
inline int64_t deadline_after_us(int64_t us) { return us > 0 ? monotonic_ns() + us * 1000 : -1; }

}  // namespace rsock
