// Address helpers shared by the transports (see addr.h).
#include "transport/addr.h"

#include <arpa/inet.h>

namespace rsock {

bool to_wire(const sockaddr* sa, WireAddr* out) {
  memset(out, 0, sizeof *out);
  if (sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    out->addr[10] = 0xff;
    out->addr[11] = 0xff;
    memcpy(out->addr + 12, &in->sin_addr, 4);
    out->port = ntohs(in->sin_port);
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    memcpy(out->addr, &in6->sin6_addr, 16);
    out->port = ntohs(in6->sin6_port);
    return true;
  }
  return false;
}

socklen_t to_sockaddr(const WireAddr& w, sockaddr_storage* ss) {
  memset(ss, 0, sizeof *ss);
  if (is_mapped_v4(w.addr)) {
    auto* in = reinterpret_cast<sockaddr_in*>(ss);
    in->sin_family = AF_INET;
    memcpy(&in->sin_addr, w.addr + 12, 4);
    in->sin_port = htons(w.port);
    return sizeof *in;
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(ss);
  in6->sin6_family = AF_INET6;
  memcpy(&in6->sin6_addr, w.addr, 16);
  in6->sin6_port = htons(w.port);
  return sizeof *in6;
}

bool fd_addrs(int fd, WireAddr* local, WireAddr* peer) {
  sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      !to_wire(reinterpret_cast<sockaddr*>(&ss), local))
    return false;
  len = sizeof ss;
  return getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0 &&
         to_wire(reinterpret_cast<sockaddr*>(&ss), peer);
}

}  // namespace rsock
