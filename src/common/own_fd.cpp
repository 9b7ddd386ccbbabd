#include "common/own_fd.h"

#include <fcntl.h>
#include <sys/resource.h>

#include <cerrno>

#include "common/real.h"

namespace rsock {

int own_fd_floor() {
  rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 0;
  const rlim_t cur = rl.rlim_cur;
  if (cur < 64) return 0;
  if (cur >= 2048) return 1024;  // RLIM_INFINITY too
  return static_cast<int>(cur / 2);
}

int dup_high(int fd, bool cloexec) {
  const int cmd = cloexec ? F_DUPFD_CLOEXEC : F_DUPFD;
  const int saved = errno;
  int d = real().fcntl(fd, cmd, own_fd_floor());
  if (d >= 0) return d;
  errno = saved;
  return real().fcntl(fd, cmd, 0);  // nothing free above the floor
}

int lift_fd(int fd) {
  if (fd < 0) return fd;
  const int floor = own_fd_floor();
  if (fd >= floor) return fd;
  const int saved = errno;
  const int d = real().fcntl(fd, F_DUPFD_CLOEXEC, floor);
  if (d < 0) {
    errno = saved;
    return fd;
  }
  real().close(fd);
  return d;
}

}  // namespace rsock
