// The kernel TCP connection under an accelerated stream (the carrier), as
// the transports look at it: whether the peer's end is still there, how many
// bytes wait unread on it, and the one loud report when bytes reached it
// behind librsock. Shared by the shm and verbs transports. Thread-safety: stateless
// functions.
#pragma once

#include <cstdint>

namespace rsock {

struct CarrierInfo {
  bool open = true;    // no FIN and no reset from the peer's kernel yet
  bool reset = false;  // the peer's kernel reset the connection (TCP_CLOSE)
};

// One getsockopt(TCP_INFO) on fd, which consumes nothing. Returns 0 or a
// negative errno.
int carrier_info(int fd, CarrierInfo* out);

// Bytes queued on fd, not yet read (SIOCINQ). Returns the count, or 0.
uint64_t carrier_unread(int fd);

// Logs one line and counts the connection as reset for kernel_bytes
// (Reset::kKernelBytes). The caller calls it once per connection.
// seen_here: this process found the bytes on its socket; else the peer did.
void report_kernel_bytes(const char* transport, bool seen_here);

}  // namespace rsock
