#include "common/own_fd.h"

#include <fcntl.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>

#include "common/real.h"

namespace rsock {

int set_nonblock(int fd) {
  const int fl = real().fcntl(fd, F_GETFL, 0);
  if (fl < 0) return -errno;
  return real().fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

int own_fd_floor() {
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  const rlim_t cur = rl.rlim_cur;
  if (cur < 64) return 0;
  if (cur >= 2048) return 1024;  // RLIM_INFINITY too
  return static_cast<int>(cur / 2);
}

namespace {

// The floor as last computed: a connection makes several descriptors, and
// the limit seldom changes. A limit lowered below it makes F_DUPFD fail with
// EINVAL, which recomputes it; a limit raised leaves it lower than it could
// be, which is harmless.
std::atomic<int> g_floor{-1};

int cached_floor() {
  int f = g_floor.load(std::memory_order_relaxed);
  if (f < 0) {
    f = own_fd_floor();
    g_floor.store(f, std::memory_order_relaxed);
  }
  return f;
}

// fcntl(fd, cmd, floor), recomputing the floor once if the limit fell below it.
int dup_at_floor(int fd, int cmd) {
  int d = real().fcntl(fd, cmd, cached_floor());
  if (d < 0 && errno == EINVAL) {
    g_floor.store(-1, std::memory_order_relaxed);
    d = real().fcntl(fd, cmd, cached_floor());
  }
  return d;
}

}  // namespace

int dup_high(int fd, bool cloexec) {
  const int cmd = cloexec ? F_DUPFD_CLOEXEC : F_DUPFD;
  const int saved = errno;
  int d = dup_at_floor(fd, cmd);
  if (d >= 0) return d;
  errno = saved;
  return real().fcntl(fd, cmd, 0);  // nothing free above the floor
}

int lift_fd(int fd) {
  if (fd < 0 || fd >= cached_floor()) return fd;
  const int saved = errno;
  const int d = dup_at_floor(fd, F_DUPFD_CLOEXEC);
  if (d < 0) {
    errno = saved;
    return fd;
  }
  real().close(fd);
  return d;
}

}  // namespace rsock
