// The carrier TCP connection (see carrier.h).
#include "transport/carrier.h"

#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cerrno>

#include "common/log.h"
#include "common/real.h"
#include "stats/stats.h"

namespace rsock {

int carrier_info(int fd, CarrierInfo* out) {
  tcp_info ti = {};
  socklen_t len = sizeof ti;
  if (real().getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return -errno;
  // We never shut the carrier down ourselves, so any state but ESTABLISHED
  // (1) means the peer's kernel sent a FIN (CLOSE_WAIT) or a reset (CLOSE).
  out->open = ti.tcpi_state == 1;
  out->reset = ti.tcpi_state == 7;
  return 0;
}

uint64_t carrier_unread(int fd) {
  int n = 0;
  return real().ioctl(fd, SIOCINQ, &n) == 0 && n > 0 ? static_cast<uint64_t>(n) : 0;
}

void report_kernel_bytes(const char* transport, bool seen_here) {
  if (seen_here)
    stats_reset_connection(
        Reset::kKernelBytes, kLogError,
        "%s connection reset: bytes reached its kernel TCP socket behind librsock (the peer "
        "wrote to the socket with a raw system call, io_uring, stdio, or from a program "
        "without librsock)",
        transport);
  else
    stats_reset_connection(
        Reset::kKernelBytes, kLogError,
        "%s connection reset by the peer: bytes written to this socket bypassed librsock "
        "(a raw system call, io_uring, stdio on the fd, or an exec'd program without "
        "librsock)",
        transport);
}

}  // namespace rsock
