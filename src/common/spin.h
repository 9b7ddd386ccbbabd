// SpinGovernor: adapts how long a waiter spins before it sleeps. Spinning
// pays when the peer answers within the spin (same host, a fast NIC); when
// it does not (a slow or emulated link, a peer that thinks), every spin is
// CPU burnt for nothing, and on a machine with few cores it also delays the
// very work (the peer, a soft-RoCE kernel thread) that would answer. So a
// waiter that missed kMissesToShrink times in a row spins 1/kShrink of the
// budget, with a full-length probe every kProbeEvery waits; one answer
// caught while spinning restores the full budget.
// Thread-safety: relaxed atomics; a lost update only shifts one decision.
#pragma once

#include <atomic>
#include <cstdint>

namespace rsock {

class SpinGovernor {
 public:
  // The spin for the next wait, given the configured budget.
  int64_t budget(int64_t full_ns) const {
    const uint8_t m = misses_.load(std::memory_order_relaxed);
    if (m < kMissesToShrink || m % kProbeEvery == 0) return full_ns;
    return full_ns / kShrink;
  }
  // The wait ended while spinning (not at its first look).
  void caught() {
    if (misses_.load(std::memory_order_relaxed) != 0) misses_.store(0, std::memory_order_relaxed);
  }
  // The spin ran out: the waiter goes to sleep.
  void missed() {
    const uint8_t m = misses_.load(std::memory_order_relaxed);
    misses_.store(m == 255 ? kMissesToShrink : static_cast<uint8_t>(m + 1),
                  std::memory_order_relaxed);
  }

 private:
  static constexpr uint8_t kMissesToShrink = 4;
  static constexpr uint8_t kProbeEvery = 16;
  static constexpr int64_t kShrink = 8;
  std::atomic<uint8_t> misses_{0};
};

}  // namespace rsock
