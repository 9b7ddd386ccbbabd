// An asymmetric fence for a Dekker pair across processes whose one side is
// a hot path and the other a rare one: the hot side (light_fence) costs a
// compiler barrier, the rare side (heavy_fence) a membarrier(2) system
// call that makes every thread of every registered process execute a full
// barrier (MEMBARRIER_CMD_GLOBAL_EXPEDITED). Used by the shm transport so
// that a receiver can give back the pages of an idle ring while the sender
// writes with no locked instruction (docs/design.md, "Pages that follow the
// traffic").
//
// Correct in every combination: a process that could not register (an old
// kernel, a seccomp filter) makes light_fence a full fence, and a caller of
// heavy_fence that gets false must not rely on the pair at all.
// Thread-safety: a process-wide flag set once (registration is per process
// and inherited across fork; exec clears it and the new image registers
// again at its own init).
#pragma once

#include <atomic>

namespace rsock {

namespace barrier_detail {
extern std::atomic<bool> g_registered;
}

// Registers this process for heavy_fence's barriers. Idempotent; false when
// the kernel refuses (light_fence is then a full fence here).
bool barrier_register();

// The hot side: orders this thread's stores before its later loads as seen
// by a thread that called heavy_fence in between.
inline void light_fence() {
  if (barrier_detail::g_registered.load(std::memory_order_relaxed))
    std::atomic_signal_fence(std::memory_order_seq_cst);
  else
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

// The rare side: a full fence here and in every thread of every registered
// process. False when the system call is not available: the pair must not
// be relied on then.
bool heavy_fence();

}  // namespace rsock
