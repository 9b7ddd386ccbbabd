// LostChannel: the carrier of a connection that this program image cannot
// reach any more. A program that inherits an accelerated fd through exec,
// and cannot take the connection over (a region or an RDMA end that fails
// validation, a connection that was still pairing; an RDMA end itself moves
// to the new image, docs/protocol.md section 8), attaches a stream over
// this channel so that the calls on the fd fail loudly, as on a reset
// connection, instead of reaching the kernel socket, whose peer no longer
// reads it: the first gets ECONNRESET, poll reports an error.
// Thread-safety: immutable after construction.
#pragma once

#include <errno.h>

#include "transport/channel.h"

namespace rsock {

class LostChannel final : public Channel {
 public:
  // Takes ownership of wait_fd (a private dup of the socket, so that the
  // readiness layer has a kernel fd to register), which may be -1.
  explicit LostChannel(int wait_fd) : wait_fd_(wait_fd) {}
  ~LostChannel() override;

  const char* name() const override { return "lost"; }
  size_t ring_bytes() const override { return sizeof rx_; }
  const uint8_t* rx_ring() const override { return rx_; }
  int write(size_t, const void*, size_t) override { return -ECONNRESET; }
  int publish(uint64_t) override { return -ECONNRESET; }
  int grant(uint64_t) override { return 0; }
  void signal(uint32_t) override {}
  PeerState poll() override {
    PeerState s;
    s.flags = kTransportError;  // a reset: the first call fails with ECONNRESET
    return s;
  }
  bool arm(uint32_t, uint64_t) override { return false; }
  void disarm(uint32_t) override {}
  int wait_fd() const override { return wait_fd_; }
  bool drain_wakeups() override { return false; }
  uint64_t peer_read_total() override { return 0; }

 private:
  int wait_fd_;
  uint8_t rx_[4096] = {};
};

}  // namespace rsock
