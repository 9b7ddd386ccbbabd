// The carrier TCP connection (see carrier.h).
#include "transport/carrier.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>

#include "common/real.h"

namespace rsock {

int carrier_info(int fd, CarrierInfo* out) {
  tcp_info ti = {};
  socklen_t len = sizeof ti;
  if (real().getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return -errno;
  // We never shut the carrier down ourselves, so any state but ESTABLISHED
  // (1) means the peer's kernel sent a FIN (CLOSE_WAIT) or a reset (CLOSE).
  out->open = ti.tcpi_state == 1;
  return 0;
}

}  // namespace rsock
