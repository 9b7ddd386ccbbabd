// The channel of a stream before its pairing (see prefix_channel.h).
#include "transport/prefix/prefix_channel.h"

#include "common/real.h"
#include "ring/wire.h"

namespace rsock {

PrefixChannel::PrefixChannel(int socket_fd)
    : socket_fd_(socket_fd), switch_at_(kNotSwitched), peer_switch_at_(kNotSwitched) {
  prefix_ = {&tcp_sent_, &tcp_read_, &switch_at_, &peer_switch_at_, &peer_attached_, &peer_tcp_read_};
}

PrefixChannel::~PrefixChannel() {
  if (socket_fd_ >= 0) real().close(socket_fd_);
}

const uint8_t* PrefixChannel::rx_ring() const {
  alignas(64) static const uint8_t kNone[kRingBytes] = {};
  return kNone;
}

PeerState PrefixChannel::poll() {
  PeerState s;
  s.flags = flags_.load(std::memory_order_acquire);
  return s;
}

void PrefixChannel::tcp_closed(bool kernel_reset) {
  const uint32_t f = kPeerClosed | (kernel_reset ? uint32_t{kPeerReset} : 0u);
  flags_.fetch_or(f, std::memory_order_acq_rel);
}

}  // namespace rsock
