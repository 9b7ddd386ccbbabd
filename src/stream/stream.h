// Stream: a reliable, ordered byte stream in both directions over one
// Channel, with credit-based flow control (src/ring). One implementation for
// every transport. Calls never block: they return -EAGAIN and the socket
// layer (src/socket) decides whether and how to wait.
// Thread-safety: send-side calls serialise on one mutex, receive-side calls
// on another, so one thread may send while another receives.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "ring/ring.h"
#include "transport/channel.h"

namespace rsock {

// Readiness of a stream, in poll(2) terms.
struct StreamEvents {
  bool readable = false;  // recv would not return -EAGAIN (data, EOF or error)
  bool writable = false;  // send would not return -EAGAIN (space or error)
  bool rdhup = false;     // the peer shut down its sending side
  bool hup = false;       // both directions are finished
  bool error = false;     // the carrier failed
  uint64_t rx_gen = 0;    // bytes arrived so far: a change is a new edge for EPOLLET
  uint64_t tx_gen = 0;    // bytes credited so far: likewise for EPOLLOUT
};

class Stream {
 public:
  explicit Stream(std::unique_ptr<Channel> channel);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Copies as much of iov as fits. Returns the bytes copied (> 0), -EAGAIN
  // when the ring is full, -EPIPE after shutdown(SHUT_WR) or once the peer
  // closed, -ECONNRESET when the carrier failed.
  ssize_t send(const struct iovec* iov, int iovcnt);

  // Copies up to the readable bytes. Returns the count (> 0), 0 at end of
  // stream, -EAGAIN when nothing is readable yet, -ECONNRESET when the
  // carrier failed with the ring empty. With peek, nothing is consumed.
  ssize_t recv(const struct iovec* iov, int iovcnt, bool peek);

  // Bytes readable right now (FIONREAD).
  size_t readable_bytes();
  // Bytes send() would take right now without waiting (0 when it would
  // fail or block).
  size_t writable_bytes();

  // Exec hand-off. report_consumed() returns credits for every byte read so
  // far, so that the region says exactly what was consumed; resume() makes
  // a new stream continue from totals read back from the region (before
  // the stream is shared): bytes published and credited in our direction,
  // bytes granted in the peer's, and whether we had shut down sending.
  // Returns false when the totals are impossible (the caller must not use
  // the stream then).
  void report_consumed();
  bool resume(uint64_t tx_sent, uint64_t tx_credited, uint64_t rx_granted, bool shut_wr);

  StreamEvents events();

  // A process that holds this end but not its carrier (a fork's child, an
  // exec'd image over verbs: Channel::needs_take_over) takes it over before
  // its first operation; every call below does this first. Returns 0,
  // -EAGAIN while the carrier moves here (wait on the channel's wait_fd),
  // or another negative errno when the move failed (the stream is reset).
  int take_over();
  // In a fork's child: the locks that the parent's other threads held at
  // the fork are released, the byte counts (the parent's) start again, and
  // the channel learns that it is in another process.
  void after_fork_child();

  void shutdown(bool rd, bool wr);
  // Tells the peer we are gone (it reads EOF after the ring, its writes fail).
  void close();

  Channel& channel() { return *channel_; }
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }

 private:
  PeerState poll_peer();                // channel poll with head/consumed folded into maxima
  void refresh_rx(const PeerState& s);  // under rx_mu_
  void fail();                          // protocol violation: reset
  bool resume_locked(uint64_t tx_sent, uint64_t tx_credited, uint64_t rx_granted, bool shut_wr);

  std::unique_ptr<Channel> channel_;
  std::mutex tx_mu_;
  CreditLedger ledger_;
  std::mutex rx_mu_;
  ReceiveWindow window_;
  std::atomic<bool> shut_rd_{false};
  std::atomic<bool> shut_wr_{false};
  std::atomic<bool> broken_{false};  // protocol violation seen: behave as reset
  // Largest totals any poll() has reported. A poll made for one direction
  // also delivers the other direction's notifications, and a later stale one
  // may replace them in the channel's PeerState: without these, a fresh
  // credit seen by recv() (or head seen by send()) could be lost for good.
  std::atomic<uint64_t> peer_head_{0};
  std::atomic<uint64_t> peer_consumed_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
};

}  // namespace rsock
