// Asymmetric fence through membarrier(2) (see barrier.h).
#include "common/barrier.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace rsock {

namespace barrier_detail {
std::atomic<bool> g_registered{false};
}

namespace {
long membarrier(int cmd) { return syscall(SYS_membarrier, cmd, 0, 0); }
}  // namespace

bool barrier_register() {
  if (barrier_detail::g_registered.load(std::memory_order_acquire)) return true;
  const long cmds = membarrier(MEMBARRIER_CMD_QUERY);
  if (cmds < 0 || (cmds & MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0 ||
      membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED) != 0)
    return false;
  barrier_detail::g_registered.store(true, std::memory_order_release);
  return true;
}

bool heavy_fence() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const bool ok = membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) == 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return ok;
}

}  // namespace rsock
