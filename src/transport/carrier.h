// The kernel TCP connection under an accelerated stream (the carrier), as
// the transports look at it: whether the peer's end is still there. Shared
// by the shm and verbs transports. Thread-safety: stateless functions.
#pragma once

#include <cstdint>

namespace rsock {

struct CarrierInfo {
  bool open = true;  // no FIN and no reset from the peer's kernel yet
};

// One getsockopt(TCP_INFO) on fd, which consumes nothing. Returns 0 or a
// negative errno.
int carrier_info(int fd, CarrierInfo* out);

}  // namespace rsock
