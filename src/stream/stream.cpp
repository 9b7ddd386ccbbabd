// Byte stream over a Channel (see stream.h). The rules that matter:
//  - the sender writes only into credited space: size - (sent - credited);
//  - bytes become visible to the receiver only through publish(head);
//  - the receiver returns credits by the rule in ReceiveWindow::should_grant;
//  - every notification from the peer may be stale, duplicated or
//    reordered, so only larger totals count (ring.h).
#include "stream/stream.h"

#include <errno.h>
#include <string.h>

#include <algorithm>
#include <new>

namespace rsock {

Stream::Stream(std::unique_ptr<Channel> channel)
    : channel_(std::move(channel)),
      ledger_(channel_->ring_bytes()),
      window_(channel_->ring_bytes()) {}

Stream::~Stream() = default;

void Stream::fail() { broken_.store(true, std::memory_order_release); }

namespace {
// Release/acquire: a head folded in by one thread's poll is used by another
// thread to read the ring, so it must carry the poll's view of the bytes.
uint64_t fold_max(std::atomic<uint64_t>& max, uint64_t v) {
  uint64_t cur = max.load(std::memory_order_acquire);
  while (v > cur &&
         !max.compare_exchange_weak(cur, v, std::memory_order_acq_rel, std::memory_order_acquire)) {
  }
  return v > cur ? v : cur;
}
}  // namespace

PeerState Stream::poll_peer() {
  PeerState s = channel_->poll();
  s.head = fold_max(peer_head_, s.head);
  s.consumed = fold_max(peer_consumed_, s.consumed);
  return s;
}

namespace {
// Leaves the channel's operation bracket (Channel::enter) on every return.
struct Bracket {
  Channel* ch;
  ~Bracket() { ch->leave(); }
};
}  // namespace

int Stream::take_over() {
  if (!channel_->needs_take_over()) return 0;
  std::scoped_lock lock(tx_mu_, rx_mu_);
  // Only take_over() ends a move that succeeds, and only under these locks.
  if (!channel_->needs_take_over()) return 0;  // another thread finished it first
  EndPositions at;
  const int rc = channel_->take_over(&at);
  if (rc == -EAGAIN) return rc;
  if (rc < 0) {
    fail();
    return rc;
  }
  // Where the previous owner stopped, exactly (verbs_end.h): bytes it read
  // are not read again here, bytes it wrote are not written again.
  if (!resume_locked(at.tx_sent, at.tx_credited, at.rx_consumed, at.fin_sent)) {
    fail();
    return -ECONNRESET;
  }
  return 0;
}

void Stream::after_fork_child() {
  // Threads of the parent that held these at the fork do not exist here.
  new (&tx_mu_) std::mutex();
  new (&rx_mu_) std::mutex();
  bytes_sent_.store(0, std::memory_order_relaxed);
  bytes_received_.store(0, std::memory_order_relaxed);
  channel_->after_fork_child();
}

ssize_t Stream::send(const struct iovec* iov, int iovcnt) {
  if (int rc = take_over(); rc < 0) return rc;
  std::lock_guard<std::mutex> lock(tx_mu_);
  if (int rc = channel_->enter(); rc < 0) return rc;
  const Bracket bracket{channel_.get()};
  if (broken_.load(std::memory_order_acquire)) return -ECONNRESET;
  if (shut_wr_.load(std::memory_order_relaxed)) return -EPIPE;
  const PeerState s = poll_peer();
  if (s.flags & kTransportError) return -ECONNRESET;
  if (s.flags & kPeerClosed) return -EPIPE;
  if (!ledger_.on_credit(s.consumed)) {
    fail();
    return -ECONNRESET;
  }
  size_t want = 0;
  for (int i = 0; i < iovcnt; ++i) want += iov[i].iov_len;
  if (want == 0) return 0;
  if (s.flags & kTxBlocked) return -EAGAIN;  // transport send window closed: as a full ring
  size_t room = ledger_.available();
  if (room == 0) return -EAGAIN;
  size_t total = std::min(want, room);
  size_t done = 0;
  const size_t size = ledger_.ring_bytes();
  for (int i = 0; i < iovcnt && done < total; ++i) {
    const auto* src = static_cast<const uint8_t*>(iov[i].iov_base);
    size_t len = std::min(iov[i].iov_len, total - done);
    RingSpan spans[2];
    int n = ring_split(ledger_.sent() + done, len, size, spans);
    for (int k = 0; k < n; ++k) {
      // A channel error is a carrier failure, which poll() reports from now
      // on; it is not a violation, so the receive side still drains the ring.
      int rc = channel_->write(spans[k].offset, src, spans[k].len);
      if (rc < 0) return rc;
      src += spans[k].len;
    }
    done += len;
  }
  ledger_.on_sent(done);
  int rc = channel_->publish(ledger_.sent());
  if (rc < 0) return rc;
  bytes_sent_.fetch_add(done, std::memory_order_relaxed);
  return static_cast<ssize_t>(done);
}

void Stream::refresh_rx(const PeerState& s) {
  if (!window_.on_arrival(s.head)) fail();
}

ssize_t Stream::recv(const struct iovec* iov, int iovcnt, bool peek) {
  if (int rc = take_over(); rc < 0) return rc;
  std::lock_guard<std::mutex> lock(rx_mu_);
  if (int rc = channel_->enter(); rc < 0) return rc;
  const Bracket bracket{channel_.get()};
  const PeerState s = poll_peer();
  refresh_rx(s);
  if (broken_.load(std::memory_order_acquire)) return -ECONNRESET;
  const size_t readable = window_.readable();
  if (readable == 0) {
    if (shut_rd_.load(std::memory_order_relaxed)) return 0;
    if (s.flags & kTransportError) return -ECONNRESET;
    if (s.flags & kPeerFin) return 0;
    return -EAGAIN;
  }
  size_t want = 0;
  for (int i = 0; i < iovcnt; ++i) want += iov[i].iov_len;
  const size_t total = std::min(want, readable);
  const size_t size = window_.ring_bytes();
  const uint8_t* ring = channel_->rx_ring();
  size_t done = 0;
  for (int i = 0; i < iovcnt && done < total; ++i) {
    auto* dst = static_cast<uint8_t*>(iov[i].iov_base);
    size_t len = std::min(iov[i].iov_len, total - done);
    RingSpan spans[2];
    int n = ring_split(window_.consumed() + done, len, size, spans);
    for (int k = 0; k < n; ++k) {
      memcpy(dst, ring + spans[k].offset, spans[k].len);
      dst += spans[k].len;
    }
    done += len;
  }
  if (!peek) {
    window_.on_consumed(done);
    channel_->note_read(window_.consumed());
    bytes_received_.fetch_add(done, std::memory_order_relaxed);
    if (window_.should_grant((s.flags & kPeerStalled) != 0)) {
      // A failed grant is a carrier failure (see send): the rest of the ring
      // stays readable, then recv reports ECONNRESET.
      (void)channel_->grant(window_.consumed());
      window_.on_granted();
    }
  }
  return static_cast<ssize_t>(done);
}

size_t Stream::readable_bytes() {
  if (take_over() < 0) return 0;
  std::lock_guard<std::mutex> lock(rx_mu_);
  refresh_rx(poll_peer());
  return window_.readable();
}

size_t Stream::writable_bytes() {
  if (take_over() < 0) return 0;
  std::lock_guard<std::mutex> lock(tx_mu_);
  if (broken_.load(std::memory_order_acquire) || shut_wr_.load(std::memory_order_relaxed)) return 0;
  const PeerState s = poll_peer();
  if (s.flags & (kTransportError | kPeerClosed | kTxBlocked)) return 0;
  if (!ledger_.on_credit(s.consumed)) {
    fail();
    return 0;
  }
  return ledger_.available();
}

void Stream::report_consumed() {
  std::lock_guard<std::mutex> lock(rx_mu_);
  if (window_.consumed() != window_.granted()) {
    (void)channel_->grant(window_.consumed());
    window_.on_granted();
  }
}

bool Stream::resume(uint64_t tx_sent, uint64_t tx_credited, uint64_t rx_granted, bool shut_wr) {
  std::scoped_lock lock(tx_mu_, rx_mu_);
  return resume_locked(tx_sent, tx_credited, rx_granted, shut_wr);
}

bool Stream::resume_locked(uint64_t tx_sent, uint64_t tx_credited, uint64_t rx_granted,
                           bool shut_wr) {
  if (tx_credited > tx_sent || tx_sent - tx_credited > ledger_.ring_bytes()) return false;
  ledger_.restore(tx_sent, tx_credited);
  window_.restore(rx_granted);
  peer_head_.store(rx_granted, std::memory_order_relaxed);
  peer_consumed_.store(tx_credited, std::memory_order_relaxed);
  shut_wr_.store(shut_wr, std::memory_order_relaxed);
  return true;
}

StreamEvents Stream::events() {
  StreamEvents ev;
  if (int rc = take_over(); rc < 0) {
    // Moving here: nothing to report yet (the channel's wait_fd wakes the
    // caller when the move can go on). Failed: an error, as a reset.
    if (rc != -EAGAIN) ev.error = ev.readable = ev.writable = ev.hup = true;
    return ev;
  }
  const PeerState s = poll_peer();
  size_t readable, room;
  {
    std::lock_guard<std::mutex> lock(rx_mu_);
    refresh_rx(s);
    readable = window_.readable();
    ev.rx_gen = window_.arrived();
    // A receiver that stopped reading early must still let a stalled sender
    // proceed once it has freed anything (see ReceiveWindow::should_grant).
    if ((s.flags & kPeerStalled) && window_.should_grant(true)) {
      (void)channel_->grant(window_.consumed());
      window_.on_granted();
    }
  }
  {
    std::lock_guard<std::mutex> lock(tx_mu_);
    if (!ledger_.on_credit(s.consumed)) fail();
    room = (s.flags & kTxBlocked) ? 0 : ledger_.available();
    ev.tx_gen = ledger_.credited() + s.tx_epoch;
  }
  const bool broken = broken_.load(std::memory_order_acquire) || (s.flags & kTransportError);
  const bool fin = (s.flags & kPeerFin) != 0;
  const bool wr_done = shut_wr_.load(std::memory_order_relaxed) || (s.flags & kPeerClosed);
  ev.error = broken;
  ev.readable = readable > 0 || fin || broken || shut_rd_.load(std::memory_order_relaxed);
  ev.writable = room > 0 || wr_done || broken;
  ev.rdhup = fin;
  ev.hup = broken || (fin && wr_done);
  return ev;
}

void Stream::shutdown(bool rd, bool wr) {
  (void)take_over();  // a FIN while the carrier moves here is sent once it has
  if (rd) shut_rd_.store(true, std::memory_order_relaxed);
  if (wr && !shut_wr_.exchange(true)) channel_->signal(kSendFin);
}

void Stream::close() {
  shut_rd_.store(true, std::memory_order_relaxed);
  shut_wr_.store(true, std::memory_order_relaxed);
  // After fork, another process may still hold this end: only the last
  // holder tells the peer.
  if (channel_->drop_holder()) channel_->signal(kSendClosed);
}

}  // namespace rsock
