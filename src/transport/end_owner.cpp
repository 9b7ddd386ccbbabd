// The owner protocol of a connection end held by several processes (see
// end_owner.h).
#include "transport/end_owner.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/real.h"

namespace rsock {

uint64_t owner_init(EndOwner* o) {
  o->busy.store(0, std::memory_order_relaxed);
  o->owner_pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
  o->epoch.store(1, std::memory_order_release);
  return 1;
}

uint64_t owner_renew(EndOwner* o) {
  o->busy.store(0, std::memory_order_relaxed);
  o->owner_pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
  return o->epoch.fetch_add(1, std::memory_order_acq_rel) + 1;
}

bool owner_enter(EndOwner* o, uint64_t epoch) {
  // Dekker with owner_fence: we count ourselves, then look at the epoch;
  // the taker moves the epoch, then looks at the count. Sequentially
  // consistent on both sides, so one of us sees the other.
  o->busy.fetch_add(1, std::memory_order_seq_cst);
  if (o->epoch.load(std::memory_order_seq_cst) == epoch) return true;
  o->busy.fetch_sub(1, std::memory_order_release);
  return false;
}

void owner_leave(EndOwner* o) { o->busy.fetch_sub(1, std::memory_order_release); }

bool owner_owns(const EndOwner* o, uint64_t epoch) {
  return o->epoch.load(std::memory_order_acquire) == epoch;
}

bool pid_gone(int pid) {
  if (pid <= 0 || (kill(pid, 0) != 0 && errno == ESRCH)) return true;
  // A zombie (exited, not yet reaped) still answers kill(): its state in
  // /proc says it runs nothing any more.
  char path[32], buf[128];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = real().read(fd, buf, sizeof buf - 1);
  real().close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* paren = strrchr(buf, ')');  // "pid (comm) S ...": comm may hold anything
  return paren && (paren[1] == ' ') && (paren[2] == 'Z' || paren[2] == 'X');
}

int owner_fence(EndOwner* o, int64_t deadline_ms, uint64_t* epoch) {
  const int32_t me = static_cast<int32_t>(getpid());
  const int32_t old_pid = o->owner_pid.load(std::memory_order_acquire);
  const uint64_t e = o->epoch.fetch_add(1, std::memory_order_seq_cst) + 1;
  o->owner_pid.store(me, std::memory_order_release);
  *epoch = e;
  // The previous owner released the end, died, or was this process's image
  // before exec: nothing of it runs any more, and a count it left behind
  // (a thread killed inside an operation) is void.
  if (old_pid == 0 || old_pid == me || pid_gone(old_pid)) {
    o->busy.store(0, std::memory_order_seq_cst);
    return 0;
  }
  while (o->busy.load(std::memory_order_seq_cst) > 0) {
    if (pid_gone(old_pid)) {
      o->busy.store(0, std::memory_order_seq_cst);
      break;
    }
    if (monotonic_ms() >= deadline_ms) return -ETIMEDOUT;
    sched_yield();
  }
  return 0;
}

void owner_release(EndOwner* o, uint64_t epoch) {
  int32_t me = static_cast<int32_t>(getpid());
  if (o->epoch.load(std::memory_order_acquire) == epoch)
    o->owner_pid.compare_exchange_strong(me, 0, std::memory_order_acq_rel);
}

bool owner_reclaim(EndOwner* o, uint64_t epoch) {
  if (o->epoch.load(std::memory_order_acquire) != epoch) return false;
  int32_t zero = 0;
  o->owner_pid.compare_exchange_strong(zero, static_cast<int32_t>(getpid()),
                                       std::memory_order_acq_rel);
  return o->epoch.load(std::memory_order_acquire) == epoch;
}

bool owner_free(const EndOwner* o) {
  const int32_t pid = o->owner_pid.load(std::memory_order_acquire);
  return pid == 0 || pid_gone(pid);
}

}  // namespace rsock
