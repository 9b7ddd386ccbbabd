// Byte stream over a Channel (see stream.h). The rules that matter:
//  - the sender writes only into credited space: size - (sent - credited);
//  - bytes become visible to the receiver only through publish(head);
//  - the receiver returns credits by the rule in ReceiveWindow::should_grant;
//  - every notification from the peer may be stale, duplicated or
//    reordered, so only larger totals count (ring.h).
#include "stream/stream.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#include "common/real.h"
#include "stats/stats.h"

namespace rsock {

Stream::Stream(std::unique_ptr<Channel> channel, ConnCounters* counters)
    : channel_(std::move(channel)),
      prefix_(channel_->tcp_prefix()),
      ledger_(channel_->ring_bytes()),
      window_(channel_->ring_bytes()),
      c_(counters ? counters : &own_) {
  channel_->set_counters(c_);
  if (prefix_ != nullptr) {
    // Where the end stands: fresh (both on the socket), or handed over by
    // exec with a direction already switched.
    tx_tcp_.store(prefix_->switch_at->load(std::memory_order_acquire) == kNotSwitched,
                  std::memory_order_relaxed);
    const uint64_t at = prefix_->peer_switch_at->load(std::memory_order_acquire);
    rx_tcp_.store(at == kNotSwitched || prefix_->tcp_read->load(std::memory_order_acquire) != at,
                  std::memory_order_relaxed);
  }
}

Stream::~Stream() {
  // The channel may outlive us (it lingers until the peer has read).
  if (channel_) channel_->set_counters(nullptr);
}

void Stream::fail() {
  broken_.store(true, std::memory_order_release);
  std::lock_guard<std::mutex> lock(state_mu_);
  reset_with(ECONNRESET);
}

void Stream::reset_with(int err) {
  if (reset_.load(std::memory_order_relaxed)) return;
  // The error before the flag: whoever sees the reset finds its error.
  sk_err_.store(err, std::memory_order_release);
  reset_.store(true, std::memory_order_release);
}

namespace {
constexpr uint32_t kEndFlags = kPeerFin | kPeerClosed | kPeerReset | kTransportError | kKernelBytes;
}  // namespace

// The kernel decides FIN or reset when the peer's socket closes: a reset
// if any byte we sent is still unread there (tcp_close) or if it asked
// for one (SO_LINGER 0), else a FIN, after which our next segment draws a
// reset (the socket is gone). A reset sets the pending error: EPIPE when
// the peer's FIN came first (our side was in CLOSE_WAIT), else ECONNRESET
// (tcp_reset). A dead peer's kernel closes its socket in the same way.
void Stream::observe(uint32_t flags) {
  flags &= kEndFlags;
  if ((flags & ~observed_.load(std::memory_order_acquire)) == 0) return;
  std::lock_guard<std::mutex> lock(state_mu_);
  const uint32_t fresh = flags & ~observed_.load(std::memory_order_relaxed);
  if (fresh == 0) return;
  // An explicit FIN (shutdown) came before whatever follows it.
  if (fresh & kPeerFin) fin_rcvd_.store(true, std::memory_order_release);
  // Bytes behind our back: where they belonged in the stream nobody knows,
  // so nothing more is delivered from the ring either (a loud reset, not a
  // stream with a hole in it).
  if (fresh & kKernelBytes) broken_.store(true, std::memory_order_release);
  if (fresh & (kTransportError | kKernelBytes)) {
    reset_with(ECONNRESET);
  } else if ((fresh & kPeerClosed) && !reset_.load(std::memory_order_relaxed)) {
    // The channel loads the peer's flags before its totals, so what the
    // peer read is final by now.
    uint64_t read = channel_->peer_read_total();
    // Once both FINs were exchanged the peer's socket has left the
    // connection (TIME_WAIT): its close sends nothing, unread bytes or not.
    const bool finished =
        fin_rcvd_.load(std::memory_order_relaxed) && shut_wr_.load(std::memory_order_relaxed);
    uint64_t sent =
        tx_origin_.load(std::memory_order_relaxed) + bytes_sent_.load(std::memory_order_acquire);
    if (prefix_ != nullptr) {
      // And what went on the socket before the switch (docs/protocol.md
      // section 10): the peer read it, or left it unread.
      sent += prefix_->tcp_sent->load(std::memory_order_acquire);
      read += prefix_->peer_tcp_read->load(std::memory_order_acquire);
    }
    if (!finished && ((flags & kPeerReset) || sent > read)) {
      const bool close_wait =
          fin_rcvd_.load(std::memory_order_relaxed) && !shut_wr_.load(std::memory_order_relaxed);
      reset_with(close_wait ? EPIPE : ECONNRESET);
    } else {
      fin_rcvd_.store(true, std::memory_order_release);
      peer_gone_.store(true, std::memory_order_release);
    }
  } else if ((fresh & kPeerReset) && peer_gone_.load(std::memory_order_relaxed) &&
             !reset_.load(std::memory_order_relaxed)) {
    // A reset after the close (verbs: the TCP connection's, sent by a
    // peer whose queue pair failed): the kernel would be in CLOSE_WAIT.
    reset_with(shut_wr_.load(std::memory_order_relaxed) ? ECONNRESET : EPIPE);
  }
  observed_.fetch_or(fresh, std::memory_order_acq_rel);
}

bool Stream::maybe_probe(bool force) {
  if (reset_.load(std::memory_order_relaxed)) return false;
  // CLOCK_MONOTONIC_COARSE is a vDSO read of a few ns, ticking every few ms:
  // a caller that keeps asking pays one system call per tick at most.
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  const int64_t now = static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  int64_t last = last_probe_.load(std::memory_order_relaxed);
  if (!force && (last == now || !last_probe_.compare_exchange_strong(last, now))) return false;
  channel_->probe();
  return true;
}

// A channel call failed: the carrier broke (the channel reports it from now
// on). The send fails the way a send after a reset does: with the pending
// error, once, whichever call takes it first.
ssize_t Stream::carrier_failed(bool moved) {
  observe(poll_peer().flags);
  if (!reset_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(state_mu_);
    reset_with(ECONNRESET);
  }
  const int e = take_pending(moved);
  return e ? -e : -EPIPE;
}

// tcp_sendmsg and tcp_recvmsg take the pending error only in a call that
// has moved nothing yet; one that has returns its count and leaves the
// error for the next call.
int Stream::take_pending(bool moved) {
  return moved ? sk_err_.load(std::memory_order_acquire)
               : sk_err_.exchange(0, std::memory_order_acq_rel);
}

int Stream::take_error() {
  maybe_probe();
  observe(poll_peer().flags);
  return sk_err_.exchange(0, std::memory_order_acq_rel);
}

bool Stream::closed() {
  maybe_probe();
  observe(poll_peer().flags);
  return reset_.load(std::memory_order_acquire) ||
         (fin_rcvd_.load(std::memory_order_acquire) && shut_wr_.load(std::memory_order_relaxed));
}

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
  observe(s.flags);
  return s;
}

namespace {
// Leaves the channel's operation bracket (Channel::enter) on every return,
// when there is one.
struct Bracket {
  Channel* ch;
  ~Bracket() {
    if (ch) ch->leave();
  }
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
  // What this copy of the stream knew of the peer's end (a fork copies the
  // parent's) came ahead of bytes that the channel delivers again from
  // at.rx_consumed on: a FIN or a close seen then would end the stream
  // before them. The channel reports the peer's end again, in order.
  std::lock_guard<std::mutex> state(state_mu_);
  if (!reset_.load(std::memory_order_relaxed)) {
    observed_.fetch_and(~static_cast<uint32_t>(kPeerFin | kPeerClosed | kPeerReset),
                        std::memory_order_acq_rel);
    fin_rcvd_.store(false, std::memory_order_release);
    peer_gone_.store(false, std::memory_order_release);
    eof_checked_.store(false, std::memory_order_relaxed);
  }
  return 0;
}

bool Stream::after_fork_child() {
  // Threads of the parent that held these at the fork do not exist here.
  new (&tx_mu_) std::mutex();
  new (&rx_mu_) std::mutex();
  new (&state_mu_) std::mutex();
  // The stats count what this process moves; the stream's sent total (what
  // the peer must have read for a close to be a FIN) stays.
  tx_origin_.fetch_add(bytes_sent_.exchange(0, std::memory_order_relaxed),
                       std::memory_order_relaxed);
  bytes_received_.store(0, std::memory_order_relaxed);
  tcp_sent_.store(0, std::memory_order_relaxed);
  tcp_received_.store(0, std::memory_order_relaxed);
  for (auto* c :
       {&c_->sent, &c_->received, &c_->tcp_sent, &c_->tcp_received, &c_->stalls, &c_->wakeups})
    c->store(0, std::memory_order_relaxed);
  channel_->after_fork_child();
  if (held_unread_.load(std::memory_order_relaxed) > 0) {
    // Both processes have the held bytes now, and each would deliver them:
    // the parent keeps them (its threads were reading this connection), and
    // this copy is reset, loudly, rather than deliver them twice.
    std::vector<uint8_t>().swap(held_);
    held_off_ = 0;
    held_unread_.store(0, std::memory_order_relaxed);
    orphaned_.store(true, std::memory_order_release);
    fail();
    return true;
  }
  return false;
}

ssize_t Stream::send(const struct iovec* iov, int iovcnt, bool moved) {
  if (orphaned_.load(std::memory_order_acquire)) {
    const int e = take_pending(moved);
    return e ? -e : -EPIPE;
  }
  // A failed move resets the stream (take_over), reported below as any reset.
  if (int rc = take_over(); rc == -EAGAIN) return rc;
  std::lock_guard<std::mutex> lock(tx_mu_);
  if (sealed_.load(std::memory_order_acquire)) return kForwarded;
  const int entered = channel_->enter();
  if (entered < 0) return entered;
  const Bracket bracket{entered == 0 ? channel_.get() : nullptr};
  // Still on the kernel socket, until the peer's receive path reads the
  // region: the kernel's TCP does everything, errors included.
  if (tx_tcp_.load(std::memory_order_acquire) && !reset_.load(std::memory_order_acquire) &&
      !switch_tx_locked())
    return send_tcp(iov, iovcnt);
  // A peer that died without a word: the kernel would know by now.
  maybe_probe();
  const PeerState s = poll_peer();
  if (!ledger_.on_credit(s.consumed)) fail();
  // tcp_sendmsg: a pending error first (reported once), then EPIPE.
  if (reset_.load(std::memory_order_acquire) || shut_wr_.load(std::memory_order_relaxed)) {
    const int e = take_pending(moved);
    return e ? -e : -EPIPE;
  }
  size_t want = 0;
  for (int i = 0; i < iovcnt; ++i) want += iov[i].iov_len;
  if (want == 0) return 0;
  if (peer_gone_.load(std::memory_order_acquire)) {
    // The peer closed cleanly: the kernel sends these bytes, and the
    // peer's kernel, whose socket is gone, answers with a reset. Nobody
    // will read them.
    add_count(bytes_sent_, c_->sent, want);
    std::lock_guard<std::mutex> state(state_mu_);
    reset_with(fin_rcvd_.load(std::memory_order_relaxed) ? EPIPE : ECONNRESET);
    return static_cast<ssize_t>(want);
  }
  size_t room = ledger_.available();
  // No credit (a full ring, or the transport's send window closed).
  if (room == 0 || (s.flags & kTxBlocked)) {
    c_->stalls.fetch_add(1, std::memory_order_relaxed);
    return -EAGAIN;
  }
  // The peer is giving the idle ring's pages back (shm): as a full ring.
  if (!channel_->begin_tx()) return -EAGAIN;
  struct EndTx {
    Channel* ch;
    ~EndTx() { ch->end_tx(); }
  } const end_tx{channel_.get()};
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
      if (channel_->write(spans[k].offset, src, spans[k].len) < 0) return carrier_failed(moved);
      src += spans[k].len;
    }
    done += len;
  }
  ledger_.on_sent(done);
  if (channel_->publish(ledger_.sent()) < 0) return carrier_failed(moved);
  add_count(bytes_sent_, c_->sent, done, std::memory_order_release);
  return static_cast<ssize_t>(done);
}

namespace {
// Copies len bytes of src into iov, from `skip` bytes into it on.
void copy_to_iov(const iovec* iov, int iovcnt, size_t skip, const uint8_t* src, size_t len) {
  for (int i = 0; i < iovcnt && len > 0; ++i) {
    if (skip >= iov[i].iov_len) {
      skip -= iov[i].iov_len;
      continue;
    }
    const size_t n = std::min(iov[i].iov_len - skip, len);
    memcpy(static_cast<uint8_t*>(iov[i].iov_base) + skip, src, n);
    src += n;
    len -= n;
    skip = 0;
  }
}
}  // namespace

void Stream::take_held(size_t n) {
  if (n == 0) return;
  held_off_ += n;
  const size_t left = held_unread_.load(std::memory_order_relaxed) - n;
  held_unread_.store(left, std::memory_order_release);
  if (left == 0) {
    // The memory stays for the next time (a peer that keeps sending whole
    // messages this large), until the connection idles (trim).
    held_.clear();
    held_off_ = 0;
  }
}

bool Stream::may_relieve() const {
  return !orphaned_.load(std::memory_order_relaxed) && !sealed_.load(std::memory_order_relaxed) &&
         !reset_.load(std::memory_order_relaxed) && !shut_rd_.load(std::memory_order_relaxed) &&
         !(prefix_ != nullptr && rx_tcp_.load(std::memory_order_acquire)) &&
         held_unread_.load(std::memory_order_relaxed) < kHeldMax && channel_->sole_holder();
}

size_t Stream::relieve() {
  if (!may_relieve() || channel_->needs_take_over()) return 0;
  // A thread of ours that reads frees the ring itself.
  std::unique_lock<std::mutex> lock(rx_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return 0;
  const int entered = channel_->enter();
  if (entered < 0) return 0;
  const Bracket bracket{entered == 0 ? channel_.get() : nullptr};
  const PeerState s = poll_peer();
  refresh_rx(s);
  if (broken_.load(std::memory_order_acquire) || reset_.load(std::memory_order_acquire)) return 0;
  // Only a full ring holds the peer up (a sender fills what its credits
  // allow before it waits), or a peer that says it waits.
  const size_t readable = window_.readable();
  if (readable == 0 || (readable < window_.ring_bytes() && !(s.flags & kPeerStalled))) return 0;
  const size_t held = held_unread_.load(std::memory_order_relaxed);
  const size_t n = std::min(readable, kHeldMax - std::min(held, kHeldMax));
  if (n == 0) return 0;
  if (held_off_ > 0) {
    held_.erase(held_.begin(), held_.begin() + static_cast<ptrdiff_t>(held_off_));
    held_off_ = 0;
  }
  RingSpan spans[2];
  const int k = ring_split(window_.consumed(), n, window_.ring_bytes(), spans);
  const uint8_t* ring = channel_->rx_ring();
  for (int i = 0; i < k; ++i)
    held_.insert(held_.end(), ring + spans[i].offset, ring + spans[i].offset + spans[i].len);
  held_unread_.store(held + n, std::memory_order_release);
  held_spare_.store(true, std::memory_order_relaxed);
  held_total_.fetch_add(n, std::memory_order_relaxed);
  stats_held(n);
  window_.on_consumed(n);
  (void)channel_->grant(window_.consumed());  // a failure shows on the next call
  window_.on_granted();
  pay_owed_doorbell();
  return n;
}

void Stream::refresh_rx(const PeerState& s) {
  if (!window_.on_arrival(s.head)) fail();
}

ssize_t Stream::recv(const struct iovec* iov, int iovcnt, bool peek, bool moved, bool look) {
  if (orphaned_.load(std::memory_order_acquire)) {
    const int e = take_pending(moved);
    return e ? -e : 0;
  }
  if (int rc = take_over(); rc == -EAGAIN) return rc;
  std::lock_guard<std::mutex> lock(rx_mu_);
  if (sealed_.load(std::memory_order_acquire)) return kForwarded;
  const int entered = channel_->enter();
  if (entered < 0) return entered;
  const Bracket bracket{entered == 0 ? channel_.get() : nullptr};
  // A reset does not end the prefix: what the socket still holds came
  // before it, and the kernel delivers it first (tcp_recvmsg reads its
  // queue before the error); recv_tcp goes on to the ring's loop below,
  // which reports the error, once the socket has nothing more. Not after
  // bytes behind our back (broken): nothing more is delivered then.
  if (rx_tcp_.load(std::memory_order_acquire) && !broken_.load(std::memory_order_acquire)) {
    const ssize_t n = recv_tcp(iov, iovcnt, peek);
    if (n != kOnRing) return n;
  }
  bool probed = !look;
  size_t readable = 0;
  PeerState s;
  for (;;) {
    s = poll_peer();
    refresh_rx(s);
    if (broken_.load(std::memory_order_acquire)) {
      const int e = take_pending(moved);
      return e ? -e : 0;
    }
    readable = window_.readable() + held_unread_.load(std::memory_order_relaxed);
    if (readable > 0) break;
    // tcp_recvmsg with nothing queued: EOF after the peer's FIN, else the
    // pending error (once), else EOF once receiving is shut down. Before
    // the first EOF, one look at the carrier: bytes that reached it behind
    // our back must reset the stream, not end it quietly short.
    if (fin_rcvd_.load(std::memory_order_acquire)) {
      if (!eof_checked_.exchange(true)) {
        maybe_probe(true);
        continue;
      }
      return 0;
    }
    if (const int e = take_pending(moved)) return -e;
    if (shut_rd_.load(std::memory_order_relaxed) || reset_.load(std::memory_order_acquire))
      return 0;
    // Nothing yet: unless the peer died without a word.
    if (probed || !maybe_probe()) return -EAGAIN;
    probed = true;
  }
  size_t want = 0;
  for (int i = 0; i < iovcnt; ++i) want += iov[i].iov_len;
  // What relieve() held comes first: it is older than the ring's bytes.
  const size_t from_held = std::min(want, held_unread_.load(std::memory_order_relaxed));
  if (from_held > 0) copy_to_iov(iov, iovcnt, 0, held_.data() + held_off_, from_held);
  const size_t from_ring = std::min(want - from_held, window_.readable());
  RingSpan spans[2];
  const int n = ring_split(window_.consumed(), from_ring, window_.ring_bytes(), spans);
  size_t done = from_held;
  for (int k = 0; k < n; ++k) {
    copy_to_iov(iov, iovcnt, done, channel_->rx_ring() + spans[k].offset, spans[k].len);
    done += spans[k].len;
  }
  if (!peek) {
    take_held(from_held);
    window_.on_consumed(from_ring);
    // What the application read: the held bytes are consumed from the ring,
    // not read.
    channel_->note_read(window_.consumed() - held_unread_.load(std::memory_order_relaxed));
    add_count(bytes_received_, c_->received, done);
    if (window_.should_grant((s.flags & kPeerStalled) != 0)) {
      // A failed grant is a carrier failure (see send): the rest of the ring
      // stays readable, then recv reports ECONNRESET.
      (void)channel_->grant(window_.consumed());
      window_.on_granted();
      pay_owed_doorbell();
    }
  }
  return static_cast<ssize_t>(done);
}

// ------------------------------------------------------- starting on TCP --
//
// docs/protocol.md section 10. Each direction's bytes go on the kernel
// socket until its sender switches, at a count it stores in the region
// before the one doorbell that announces it. The receiver reads the socket
// up to that count, then the ring; whatever it reads past the count is
// doorbells. A sender switches only once the peer's receive path reads the
// region (`attached`), and rings no doorbell before it has switched (one
// would read as data): a doorbell held back then is owed, and paid by the
// switch.

void Stream::attach() {
  channel_->attach();
  if (!tx_tcp_.load(std::memory_order_acquire)) return;
  std::unique_lock<std::mutex> lock(tx_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // a sender: it switches itself
  const int entered = channel_->enter();
  if (entered < 0) return;
  const Bracket bracket{entered == 0 ? channel_.get() : nullptr};
  (void)switch_tx_locked();
}

bool Stream::switch_tx_locked() {
  if (prefix_->switch_at->load(std::memory_order_acquire) == kNotSwitched) {
    if (prefix_->peer_attached->load(std::memory_order_acquire) == 0) return false;
    channel_->switch_tx(prefix_->tcp_sent->load(std::memory_order_relaxed));
  } else if (channel_->doorbell_owed()) {
    channel_->switch_tx(kNotSwitched);  // switched by another holder: only rings
  }
  tx_tcp_.store(false, std::memory_order_release);
  return true;
}

void Stream::pay_owed_doorbell() {
  if (!channel_->doorbell_owed() || !tx_tcp_.load(std::memory_order_acquire)) return;
  std::unique_lock<std::mutex> lock(tx_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // the sender that holds it switches after its call
  (void)switch_tx_locked();
}

namespace {
// The first `limit` bytes of iov, in out[] (at most kMax entries: a read
// may return fewer bytes than asked).
constexpr int kMaxTcpIov = 64;
int clip_iov(const iovec* iov, int iovcnt, size_t limit, iovec* out) {
  int n = 0;
  for (int i = 0; i < iovcnt && n < kMaxTcpIov && limit > 0; ++i) {
    const size_t len = std::min(iov[i].iov_len, limit);
    if (len == 0) continue;
    out[n++] = {iov[i].iov_base, len};
    limit -= len;
  }
  return n;
}
}  // namespace

ssize_t Stream::send_tcp(const iovec* iov, int iovcnt) {
  iovec part[kMaxTcpIov];
  const int n = clip_iov(iov, iovcnt, SIZE_MAX, part);
  if (n == 0) return 0;
  msghdr mh = {};
  mh.msg_iov = part;
  mh.msg_iovlen = static_cast<size_t>(n);
  const ssize_t sent = real().sendmsg(channel_->kernel_socket(), &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (sent < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  prefix_->tcp_sent->store(prefix_->tcp_sent->load(std::memory_order_relaxed) + sent,
                           std::memory_order_release);
  add_count(tcp_sent_, c_->tcp_sent, static_cast<uint64_t>(sent));
  // A receiver of ours granted meanwhile (doorbell owed), or the peer has
  // attached since: switch now, so that the next call uses the ring.
  if (channel_->doorbell_owed() || prefix_->peer_attached->load(std::memory_order_acquire) != 0)
    (void)switch_tx_locked();
  return sent;
}

ssize_t Stream::sendfile_tcp(int in_fd, off_t* offset, size_t count) {
  if (orphaned_.load(std::memory_order_acquire) || take_over() < 0) return kNotOnTcp;
  std::lock_guard<std::mutex> lock(tx_mu_);
  if (sealed_.load(std::memory_order_acquire)) return kForwarded;
  const int entered = channel_->enter();
  if (entered < 0) return kNotOnTcp;
  const Bracket bracket{entered == 0 ? channel_.get() : nullptr};
  if (!tx_tcp_.load(std::memory_order_acquire) || reset_.load(std::memory_order_acquire) ||
      switch_tx_locked())
    return kNotOnTcp;
  const ssize_t sent = real().sendfile(channel_->kernel_socket(), in_fd, offset, count);
  if (sent < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  prefix_->tcp_sent->store(prefix_->tcp_sent->load(std::memory_order_relaxed) + sent,
                           std::memory_order_release);
  add_count(tcp_sent_, c_->tcp_sent, static_cast<uint64_t>(sent));
  if (channel_->doorbell_owed() || prefix_->peer_attached->load(std::memory_order_acquire) != 0)
    (void)switch_tx_locked();
  return sent;
}

bool Stream::rx_prefix_done_locked() {
  const uint64_t at = prefix_->peer_switch_at->load(std::memory_order_acquire);
  if (at == kNotSwitched || prefix_->tcp_read->load(std::memory_order_relaxed) != at) return false;
  channel_->switch_rx(0);
  rx_tcp_.store(false, std::memory_order_release);
  return true;
}

// We read more of the peer's prefix than its count says it sent: bytes
// went on its socket behind its librsock (a raw write, stdio). As bytes
// behind our back on the ring's socket: a loud reset on both ends.
ssize_t Stream::foreign_prefix_bytes() {
  channel_->foreign_bytes();
  observe(poll_peer().flags);
  if (!reset_.load(std::memory_order_acquire)) fail();  // a channel that cannot tell
  const int e = take_pending(false);
  return e ? -e : -ECONNRESET;
}

ssize_t Stream::recv_tcp(const iovec* iov, int iovcnt, bool peek) {
  const uint64_t read = prefix_->tcp_read->load(std::memory_order_relaxed);
  const uint64_t at = prefix_->peer_switch_at->load(std::memory_order_acquire);
  if (at != kNotSwitched && read >= at) {
    if (read > at) return foreign_prefix_bytes();
    return rx_prefix_done_locked() ? kOnRing : -EAGAIN;
  }
  iovec part[kMaxTcpIov];
  const int cnt = clip_iov(iov, iovcnt, at == kNotSwitched ? SIZE_MAX : at - read, part);
  if (cnt == 0) return 0;  // nothing asked for (at > read here)
  msghdr mh = {};
  mh.msg_iov = part;
  mh.msg_iovlen = static_cast<size_t>(cnt);
  const ssize_t n =
      real().recvmsg(channel_->kernel_socket(), &mh, MSG_DONTWAIT | (peek ? MSG_PEEK : 0));
  if (n < 0) {
    const int e = errno == EWOULDBLOCK ? EAGAIN : errno;
    if (e == ECONNRESET && !peek) {
      // The peer's kernel reset: for our unread data (a reset), or its
      // unread doorbells of ours, or after it closed having read all (a
      // FIN, as kernel TCP would have sent). The region tells.
      channel_->tcp_closed(true);
      observe(poll_peer().flags);
      // A FIN, in the region's word: EOF before a pending error (ours,
      // from a send since), as tcp_recvmsg reads it.
      if (fin_rcvd_.load(std::memory_order_acquire)) return 0;
      if (const int err = take_pending(false)) return -err;
      return 0;
    }
    // The peer may have switched with nothing more before its count (its
    // doorbell not here yet).
    if (e == EAGAIN && rx_prefix_done_locked()) return kOnRing;
    // Nothing queued, and the stream knows of a reset: the ring's loop
    // reports it.
    if (e == EAGAIN && reset_.load(std::memory_order_acquire)) return kOnRing;
    // shutdown(SHUT_RD): what is queued is still read, then EOF.
    if (e == EAGAIN && shut_rd_.load(std::memory_order_relaxed)) return 0;
    return -e;
  }
  // Loaded after the read: a count stored before the bytes we read is
  // seen, and whatever we read past it is the peer's doorbells.
  const uint64_t at2 = prefix_->peer_switch_at->load(std::memory_order_acquire);
  if (n == 0) {
    // The peer's socket closed. Having switched first (its count is all
    // read), its end is the ring's to report; else an end on plain TCP.
    if (at2 != kNotSwitched && rx_prefix_done_locked()) return kOnRing;
    if (!peek && channel_->peer_told_close()) {
      // A reset the peer told (it closed over unread bytes, or with
      // SO_LINGER 0: its kernel sent no FIN) is the end, though a
      // doorbell of ours took the socket's error and left an EOF: the
      // ring's loop reports it.
      observe(poll_peer().flags);
      if (reset_.load(std::memory_order_acquire) && !fin_rcvd_.load(std::memory_order_acquire))
        return kOnRing;
    }
    // The peer's FIN, as tcp_recvmsg reports it before a pending error;
    // a reset that follows finds us in CLOSE_WAIT (EPIPE). Not after our
    // own shutdown(SHUT_RD) on the socket, which reads EOF by itself.
    if (!shut_rd_.load(std::memory_order_relaxed)) {
      std::lock_guard<std::mutex> state(state_mu_);
      fin_rcvd_.store(true, std::memory_order_release);
    }
    return 0;
  }
  size_t keep = static_cast<size_t>(n);
  if (at2 != kNotSwitched) {
    if (at2 < read) return foreign_prefix_bytes();
    keep = std::min<uint64_t>(keep, at2 - read);
  }
  if (peek) return keep > 0 ? static_cast<ssize_t>(keep) : kOnRing;
  prefix_->tcp_read->store(read + keep, std::memory_order_release);
  add_count(tcp_received_, c_->tcp_received, keep);
  if (at2 != kNotSwitched && read + keep == at2) {
    channel_->switch_rx(static_cast<uint64_t>(n) - keep);
    rx_tcp_.store(false, std::memory_order_release);
  }
  return keep > 0 ? static_cast<ssize_t>(keep) : kOnRing;
}

// The directions still on the kernel socket take its readiness (one may
// have switched already, and shows the ring's).
void Stream::tcp_overlay(StreamEvents* ev, uint64_t* tcp_rx, uint32_t socket_events, bool edges) {
  {
    std::unique_lock<std::mutex> lock(rx_mu_, std::try_to_lock);
    if (lock.owns_lock() && rx_tcp_.load(std::memory_order_acquire)) (void)rx_prefix_done_locked();
  }
  if (tx_tcp_.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> lock(tx_mu_, std::try_to_lock);
    if (lock.owns_lock() && tx_tcp_.load(std::memory_order_acquire)) (void)switch_tx_locked();
  }
  const bool rx_tcp = rx_tcp_.load(std::memory_order_acquire);
  const bool tx_tcp = tx_tcp_.load(std::memory_order_acquire);
  if (!rx_tcp && !tx_tcp) return;
  // The poll bits are epoll's (the same values).
  static_assert(POLLIN == EPOLLIN && POLLOUT == EPOLLOUT && POLLRDHUP == EPOLLRDHUP &&
                POLLERR == EPOLLERR && POLLHUP == EPOLLHUP);
  short r =
      static_cast<short>(socket_events & (EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLERR | EPOLLHUP));
  if (r == 0) {
    pollfd p = {channel_->kernel_socket(), POLLIN | POLLOUT | POLLRDHUP, 0};
    if (real().poll(&p, 1, 0) < 0) p.revents = 0;
    r = p.revents;
  }
  if (r & (POLLERR | POLLHUP)) {
    // The peer's kernel reset (or both FINs went): its end is gone. Whether
    // the application sees a FIN or a reset the region tells, as recv_tcp
    // decides; the ring's state below says which.
    channel_->tcp_closed((r & POLLERR) != 0);
    observe(poll_peer().flags);
    // As tcp_poll(): both directions shut (by the peer's FIN or our
    // SHUT_RD, and our SHUT_WR), or a reset.
    const bool reset = reset_.load(std::memory_order_acquire);
    const bool rcv_shut =
        fin_rcvd_.load(std::memory_order_acquire) || shut_rd_.load(std::memory_order_acquire);
    const bool snd_shut = shut_wr_.load(std::memory_order_acquire) || reset;
    ev->error = sk_err_.load(std::memory_order_acquire) != 0;
    ev->hup = reset || (rcv_shut && snd_shut);
    r = static_cast<short>((r & ~(POLLERR | POLLHUP)) | POLLIN | POLLRDHUP | POLLOUT);
  }
  if (rx_tcp) {
    // Past the peer's count the socket holds doorbells, which are no data
    // and no news: once we have read exactly up to it (and another thread
    // holds the receive lock, so the direction has not switched yet), only
    // the ring's readiness counts. (Read past it: bytes behind the peer's
    // back, which the next call reports as a reset.)
    const uint64_t read = prefix_->tcp_read->load(std::memory_order_relaxed);
    const uint64_t at = prefix_->peer_switch_at->load(std::memory_order_acquire);
    if (at == kNotSwitched || read != at) {
      ev->rdhup = ev->rdhup || (r & POLLRDHUP) != 0;
      ev->readable = ev->readable || (r & (POLLIN | POLLRDHUP)) != 0;
      int inq = 0;
      if (edges && ev->readable && real().ioctl(channel_->kernel_socket(), FIONREAD, &inq) != 0)
        inq = 0;
      *tcp_rx = read + static_cast<uint64_t>(inq);
      if (at != kNotSwitched) *tcp_rx = std::min(*tcp_rx, at);
    }
  }
  if (tx_tcp) {
    // The ring's room is not ours yet: the socket's, or a send that fails.
    ev->writable = (r & POLLOUT) != 0 || ev->error || reset_.load(std::memory_order_acquire) ||
                   shut_wr_.load(std::memory_order_relaxed);
  }
}

void Stream::continue_from(uint64_t sent, uint64_t read) {
  if (prefix_ == nullptr) return;
  prefix_->tcp_sent->store(sent, std::memory_order_release);
  prefix_->tcp_read->store(read, std::memory_order_release);
  tcp_sent_.store(sent, std::memory_order_relaxed);
  tcp_received_.store(read, std::memory_order_relaxed);
  c_->tcp_sent.store(sent, std::memory_order_relaxed);
  c_->tcp_received.store(read, std::memory_order_relaxed);
}

uint64_t Stream::tcp_bytes_sent() const { return tcp_sent_.load(std::memory_order_relaxed); }
uint64_t Stream::tcp_bytes_received() const {
  return tcp_received_.load(std::memory_order_relaxed);
}

bool Stream::socket_readable() const {
  pollfd p = {channel_->kernel_socket(), POLLIN | POLLRDHUP, 0};
  return real().poll(&p, 1, 0) == 1;
}

size_t Stream::readable_bytes() {
  if (orphaned_.load(std::memory_order_acquire) || take_over() < 0) return 0;
  std::lock_guard<std::mutex> lock(rx_mu_);
  if (rx_tcp_.load(std::memory_order_acquire) && !rx_prefix_done_locked()) {
    // What the socket holds of the prefix (past the count: doorbells).
    int inq = 0;
    if (real().ioctl(channel_->kernel_socket(), FIONREAD, &inq) != 0 || inq < 0) return 0;
    const uint64_t at = prefix_->peer_switch_at->load(std::memory_order_acquire);
    const uint64_t read = prefix_->tcp_read->load(std::memory_order_relaxed);
    if (at == kNotSwitched || static_cast<uint64_t>(inq) < at - read)
      return static_cast<size_t>(inq);
    // All of the prefix waits there; what the ring holds comes after it.
    refresh_rx(poll_peer());
    return static_cast<size_t>(at - read + window_.readable());
  }
  refresh_rx(poll_peer());
  return window_.readable() + held_unread_.load(std::memory_order_relaxed);
}

size_t Stream::writable_bytes() {
  if (orphaned_.load(std::memory_order_acquire) || take_over() < 0) return 0;
  std::lock_guard<std::mutex> lock(tx_mu_);
  if (tx_tcp_.load(std::memory_order_acquire) && !switch_tx_locked()) {
    // A chunk for the kernel socket when it takes one (send_tcp may still
    // take less); its errors are send()'s to report.
    pollfd p = {channel_->kernel_socket(), POLLOUT, 0};
    if (real().poll(&p, 1, 0) != 1) return 0;
    return (p.revents & (POLLERR | POLLHUP)) ? 0 : ledger_.ring_bytes();
  }
  maybe_probe();
  const PeerState s = poll_peer();
  if (!ledger_.on_credit(s.consumed)) fail();
  // Errors, and a stream shut for writing, are send()'s to report.
  if (reset_.load(std::memory_order_acquire) || shut_wr_.load(std::memory_order_relaxed)) return 0;
  // The peer's end is gone: a send goes out and resets (send()), whatever
  // the credits say.
  if (peer_gone_.load(std::memory_order_acquire)) return ledger_.ring_bytes();
  if (s.flags & kTxBlocked) return 0;
  return ledger_.available();
}

size_t Stream::trim() {
  // Never waits: a thread inside a send or recv is not idle.
  std::unique_lock<std::mutex> tx(tx_mu_, std::try_to_lock);
  if (!tx.owns_lock()) return 0;
  std::unique_lock<std::mutex> rx(rx_mu_, std::try_to_lock);
  if (!rx.owns_lock() || channel_->needs_take_over() || broken_.load(std::memory_order_acquire) ||
      orphaned_.load(std::memory_order_acquire))
    return 0;
  const int entered = channel_->enter();
  if (entered < 0) return 0;
  const Bracket bracket{entered == 0 ? channel_.get() : nullptr};
  grant_all_read();  // the region must say that everything we read is read
  if (held_unread_.load(std::memory_order_relaxed) == 0) {
    std::vector<uint8_t>().swap(held_);
    held_spare_.store(false, std::memory_order_relaxed);
  }
  return channel_->trim(window_.consumed());
}

void Stream::report_consumed() {
  std::lock_guard<std::mutex> lock(rx_mu_);
  grant_all_read();
}

void Stream::grant_all_read() {
  // A failed grant is a carrier failure that the next call on the stream
  // finds: nothing to do about it here.
  if (window_.consumed() == window_.granted()) return;
  (void)channel_->grant(window_.consumed());
  window_.on_granted();
}

void Stream::quiesce() {
  for (std::mutex* m : {&tx_mu_, &rx_mu_}) {
    for (int i = 0; i < 5000; ++i) {
      if (m->try_lock()) {
        m->unlock();
        break;
      }
      usleep(10);
    }
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
  // What this process sent itself (bytes_sent_, the stats) is part of
  // tx_sent already.
  const uint64_t mine = bytes_sent_.load(std::memory_order_relaxed);
  tx_origin_.store(tx_sent >= mine ? tx_sent - mine : 0, std::memory_order_relaxed);
  shut_wr_.store(shut_wr, std::memory_order_relaxed);
  return true;
}

StreamEvents Stream::events(bool look, uint32_t socket_events, bool edges) {
  StreamEvents ev;
  if (sealed_.load(std::memory_order_acquire)) {
    // A waiter wakes, calls again and is forwarded to the successor.
    ev.readable = ev.writable = true;
    return ev;
  }
  if (orphaned_.load(std::memory_order_acquire)) {
    // Reset (after_fork_child): as ring_events reports a reset.
    ev.readable = ev.writable = ev.rdhup = ev.hup = true;
    ev.error = sk_err_.load(std::memory_order_acquire) != 0;
    return ev;
  }
  // Moving here: nothing to report yet (the channel's wait_fd wakes the
  // caller when the move can go on). A failed move reset the stream, which
  // shows below as any reset.
  if (take_over() == -EAGAIN) return ev;
  ev = ring_events(look);
  if (prefix_ == nullptr) return ev;
  // The generations count from the stream's first byte, its prefix's
  // included, so that they go on across the switch (and from a stream
  // sealed to its successor, which goes on from its counts): a change is
  // news, and nothing else is.
  const uint64_t ring_rx = ev.rx_gen, ring_tx = ev.tx_gen;
  uint64_t tcp_rx = prefix_->tcp_read->load(std::memory_order_acquire);
  const uint64_t tcp_tx = prefix_->tcp_sent->load(std::memory_order_acquire);
  if (tx_tcp_.load(std::memory_order_acquire) || rx_tcp_.load(std::memory_order_acquire))
    tcp_overlay(&ev, &tcp_rx, socket_events, edges);
  ev.rx_gen = tcp_rx + ring_rx;
  ev.tx_gen = tcp_tx + ring_tx;
  return ev;
}

StreamEvents Stream::ring_events(bool look) {
  StreamEvents ev;
  for (bool probed = !look;; probed = true) {
    const PeerState s = poll_peer();
    size_t readable, room;
    {
      std::lock_guard<std::mutex> lock(rx_mu_);
      refresh_rx(s);
      readable = window_.readable() + held_unread_.load(std::memory_order_relaxed);
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
    // tcp_poll(): RCV_SHUTDOWN (the peer's FIN, SHUT_RD, a reset) makes the
    // socket readable and RDHUP; SEND_SHUTDOWN (SHUT_WR, a reset) writable;
    // both, or a reset, HUP; a pending error ERR.
    const bool reset = reset_.load(std::memory_order_acquire);
    const bool rcv_shut = fin_rcvd_.load(std::memory_order_acquire) ||
                          shut_rd_.load(std::memory_order_relaxed) || reset;
    const bool snd_shut = shut_wr_.load(std::memory_order_relaxed) || reset;
    ev.error = sk_err_.load(std::memory_order_acquire) != 0;
    ev.readable = readable > 0 || rcv_shut || ev.error;
    // Once the peer's end is gone a send does not wait (it resets).
    ev.writable = room > 0 || snd_shut || ev.error || peer_gone_.load(std::memory_order_acquire);
    ev.rdhup = rcv_shut;
    ev.hup = (rcv_shut && snd_shut) || reset;
    // Unless the peer died without a word (rate-limited: one system call
    // per clock tick at most).
    if (ev.rdhup || probed || !maybe_probe()) return ev;
  }
}

void Stream::abort_stuck_switch() {
  shut_rd_.store(true, std::memory_order_relaxed);
  shut_wr_.store(true, std::memory_order_relaxed);
  fail();
}

int Stream::shutdown(bool rd, bool wr) {
  if (orphaned_.load(std::memory_order_acquire)) return 0;  // reset: nothing to tell
  (void)take_over();  // a FIN while the carrier moves here is sent once it has
  if (wr && tx_tcp_.load(std::memory_order_acquire)) {
    // The FIN goes in the region, behind our prefix: the peer must be able
    // to read the count there, so our sender switches first.
    std::lock_guard<std::mutex> lock(tx_mu_);
    if (tx_tcp_.load(std::memory_order_acquire) && !shut_wr_.load(std::memory_order_relaxed) &&
        !switch_tx_locked())
      return -EAGAIN;
  }
  if (rd) shut_rd_.store(true, std::memory_order_relaxed);
  if (wr && !shut_wr_.exchange(true)) channel_->signal(kSendFin);
  return 0;
}

void Stream::shut_on_tcp(bool rd, bool wr) {
  // Release: a thread the kernel's shutdown wakes looks after these.
  if (rd) shut_rd_.store(true, std::memory_order_release);
  if (wr) shut_wr_.store(true, std::memory_order_release);
}

void Stream::close(bool abort) {
  // A last look: bytes left behind our back on the carrier are reported
  // (and the peer told) rather than closed over.
  maybe_probe(true);
  shut_rd_.store(true, std::memory_order_relaxed);
  shut_wr_.store(true, std::memory_order_relaxed);
  {
    // Credits for everything we read, so that the peer knows exactly what
    // we left unread (a reset) even on a transport without another count.
    std::lock_guard<std::mutex> lock(rx_mu_);
    grant_all_read();
  }
  release_holder(abort);
}

void Stream::release_at_exit() {
  release_holder(false);
  channel_->at_exit();
}

void Stream::release_holder(bool abort) {
  if (holder_dropped_.exchange(true)) return;
  // Bytes the application never read (held, or the parent's that an
  // orphan lost): the kernel resets a connection closed over unread bytes.
  abort = abort || holds_unread();
  // After fork, another process may still hold this end: only the last
  // holder tells the peer.
  if (channel_->drop_holder()) channel_->signal(kSendClosed | (abort ? kSendReset : 0u));
}

}  // namespace rsock
