// PrefixChannel: the channel of a stream that has not paired yet
// (docs/design.md, "Connection setup"). It has no ring and no region: its
// switch words (TcpPrefix) are private and no peer ever attaches, so both
// directions of the stream stay on the kernel socket, with every byte
// counted, which is exactly what Stream's prefix path does before a switch.
// When the pairing ends, the stream is sealed and a paired stream goes on
// from its counts (Stream::seal, Stream::continue_from); when it never
// pairs, the connection is plain TCP through this channel to its end, and
// its end is the kernel socket's: a reset only when the kernel reports
// one.
//
// The socket is the application's own fd while that number is sure to name
// it: a connection that never pairs costs one fd, as on TCP. The channel
// takes a private dup (own_socket) before the number could come to name
// something else while the stream still needs the socket: the
// application's dup of it (a second fd may outlive the first), a dup2 onto
// it, a pairing that ends on plain TCP while a call is inside the stream.
// At the application's last close the number stops being ours
// (retire_socket). Thread-safety: as Channel; the words are atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "transport/channel.h"
#include "transport/socket_number.h"

namespace rsock {

// The placeholder of retired sockets (PrefixChannel::retire_socket): one end
// of a socket pair whose other end is closed, made once per process (make:
// now, if it was not); -1 when there is none.
int prefix_dead_socket(bool make = true);

class PrefixChannel final : public Channel {
 public:
  // socket_fd: the application's fd of the connection's kernel socket (not
  // owned), or with owned a dup of it that the channel closes.
  explicit PrefixChannel(int socket_fd, bool owned = false);
  ~PrefixChannel() override;

  const char* name() const override { return "tcp"; }
  size_t ring_bytes() const override { return kRingBytes; }
  const uint8_t* rx_ring() const override;
  // No ring: a stream on its prefix path never calls these; one that did
  // would reset (an error, not bytes in the wrong place).
  int write(size_t, const void*, size_t) override { return -EPROTO; }
  int publish(uint64_t) override { return -EPROTO; }
  int grant(uint64_t) override { return -EPROTO; }
  void signal(uint32_t) override {}
  PeerState poll() override;
  bool arm(uint32_t, uint64_t) override { return false; }
  void disarm(uint32_t) override {}
  int wait_fd() const override { return socket_.fd(); }
  bool drain_wakeups() override { return false; }  // the socket holds data, never doorbells
  // What the peer read of ours is not known here, and not needed: whether
  // its end was a FIN or a reset is the kernel's word (tcp_closed).
  uint64_t peer_read_total() override { return UINT64_MAX / 2; }
  TcpPrefix* tcp_prefix() override { return &prefix_; }
  void tcp_closed(bool kernel_reset) override;
  int kernel_socket() const override { return socket_.fd(); }
  void own_fds(std::vector<int>* out) override;
  // No bracket: nothing here is shared with another process but the socket.
  int enter() override { return 1; }

  // From now on the channel holds a private dup of the socket, not the
  // application's number (which must still name it). Returns 0 or -errno
  // (EMFILE: no descriptor left). Idempotent.
  int own_socket() { return socket_.own(); }
  bool owns_socket() const { return socket_.owned(); }

  // The application closes its last fd: a dead socket takes the socket's
  // place in the channel, so that a thread still polling or calling on it
  // meets an ended socket, never another file that took the number. An
  // owned dup goes with it (its FIN, or the reset SO_LINGER asks for, as
  // the application's close would have sent it). Idempotent.
  void retire_socket();

  // The bytes that went on the socket each way (what a successor goes on
  // from: Stream::continue_from).
  uint64_t sent() const { return tcp_sent_.load(std::memory_order_acquire); }
  uint64_t read() const { return tcp_read_.load(std::memory_order_acquire); }

 private:
  static constexpr size_t kRingBytes = 4096;  // the smallest ring; never used

  SocketNumber socket_;
  std::atomic<uint64_t> tcp_sent_{0};
  std::atomic<uint64_t> tcp_read_{0};
  std::atomic<uint64_t> switch_at_;       // kNotSwitched, always
  std::atomic<uint64_t> peer_switch_at_;  // kNotSwitched, always
  std::atomic<uint32_t> peer_attached_{0};
  std::atomic<uint64_t> peer_tcp_read_{0};
  std::atomic<uint32_t> flags_{0};  // PeerFlag: the socket's end, once seen
  TcpPrefix prefix_;
};

}  // namespace rsock
