// The channel of a stream before its pairing (see prefix_channel.h).
#include "transport/prefix/prefix_channel.h"

#include <fcntl.h>
#include <sys/socket.h>

#include "common/own_fd.h"
#include "common/real.h"
#include "ring/wire.h"

namespace rsock {

PrefixChannel::PrefixChannel(int socket_fd, bool owned)
    : socket_(socket_fd, owned), switch_at_(kNotSwitched), peer_switch_at_(kNotSwitched) {
  prefix_ = {&tcp_sent_, &tcp_read_, &switch_at_, &peer_switch_at_, &peer_attached_, &peer_tcp_read_};
}

PrefixChannel::~PrefixChannel() = default;

void PrefixChannel::own_fds(std::vector<int>* out) {
  if (socket_.owned()) out->push_back(socket_.fd());
}

namespace {
std::atomic<int> g_dead_socket{-1};
}  // namespace

int prefix_dead_socket(bool make) {
  if (!make) return g_dead_socket.load(std::memory_order_acquire);
  static const int fd = [] {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return -1;
    real().close(sv[1]);
    const int dead = lift_fd(sv[0]);
    g_dead_socket.store(dead, std::memory_order_release);
    return dead;
  }();
  return fd;
}

void PrefixChannel::retire_socket() { socket_.retire(prefix_dead_socket()); }

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
