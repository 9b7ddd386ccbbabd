// The channel of a stream before its pairing (see prefix_channel.h).
#include "transport/prefix/prefix_channel.h"

#include <fcntl.h>
#include <sys/socket.h>

#include "common/own_fd.h"
#include "common/real.h"
#include "ring/wire.h"

namespace rsock {

PrefixChannel::PrefixChannel(int socket_fd, bool owned)
    : socket_fd_(socket_fd),
      owned_(owned),
      switch_at_(kNotSwitched),
      peer_switch_at_(kNotSwitched) {
  prefix_ = {&tcp_sent_, &tcp_read_, &switch_at_, &peer_switch_at_, &peer_attached_, &peer_tcp_read_};
}

PrefixChannel::~PrefixChannel() {
  if (owned_.load(std::memory_order_acquire)) real().close(socket_fd_.load());
}

void PrefixChannel::own_fds(std::vector<int>* out) {
  if (owned_.load(std::memory_order_acquire)) out->push_back(socket_fd_.load());
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

int PrefixChannel::own_socket() {
  std::lock_guard<std::mutex> lock(own_mu_);
  if (owned_.load(std::memory_order_relaxed) || retired_.load()) return 0;
  const int d = dup_high(socket_fd_.load(std::memory_order_relaxed));
  if (d < 0) return -errno;
  socket_fd_.store(d, std::memory_order_release);
  owned_.store(true, std::memory_order_release);
  return 0;
}

void PrefixChannel::retire_socket() {
  std::lock_guard<std::mutex> lock(own_mu_);
  if (retired_.exchange(true)) return;
  const int dead = prefix_dead_socket();
  if (owned_.load(std::memory_order_relaxed)) {
    // Without a placeholder the socket stays until the channel goes.
    if (dead >= 0) real().dup3(dead, socket_fd_.load(std::memory_order_relaxed), O_CLOEXEC);
    return;
  }
  // The application's number: nothing of ours to close, and the number is
  // no longer the socket's.
  socket_fd_.store(dead, std::memory_order_release);
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
