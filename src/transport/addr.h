// Socket addresses as both ends of a connection name them (WireAddr: 16
// bytes, IPv4 as v4-mapped IPv6, port in host order), shared by the
// transports' setup code. Pure helpers over caller-owned values and fds.
#pragma once

#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

#include "ring/wire.h"

namespace rsock {

// Converts an AF_INET/AF_INET6 address; false for other families.
bool to_wire(const sockaddr* sa, WireAddr* out);
// The sockaddr form of w: plain AF_INET for a v4-mapped address.
socklen_t to_sockaddr(const WireAddr& w, sockaddr_storage* ss);
// The local and peer addresses of a connected socket.
bool fd_addrs(int fd, WireAddr* local, WireAddr* peer);

inline bool same_wire(const WireAddr& a, const WireAddr& b) {
  return a.port == b.port && memcmp(a.addr, b.addr, 16) == 0;
}
inline bool is_mapped_v4(const uint8_t a[16]) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return memcmp(a, kPrefix, 12) == 0;
}

}  // namespace rsock
