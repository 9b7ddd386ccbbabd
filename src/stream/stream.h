// Stream: a reliable, ordered byte stream in both directions over one
// Channel, with credit-based flow control (src/ring). One implementation for
// every transport. Calls never block: they return -EAGAIN and the socket
// layer (src/socket) decides whether and how to wait. The end of a stream
// follows the kernel's TCP state machine (docs/protocol.md section 6): a
// peer that closes or dies with none of our bytes unread is a FIN, after
// which our first send succeeds and resets the connection (the kernel's
// RST from a closed socket); one that leaves bytes unread, or asks for it
// (SO_LINGER 0), is a reset at once; a reset leaves one pending error
// (ECONNRESET, or EPIPE after the peer's FIN) that the next recv, send or
// SO_ERROR reports.
// Thread-safety: send-side calls serialise on one mutex, receive-side calls
// on another, so one thread may send while another receives.
#pragma once

#include <errno.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ring/ring.h"
#include "stats/publish.h"
#include "transport/channel.h"

namespace rsock {

// Readiness of a stream, in poll(2) terms: what tcp_poll() reports for a
// kernel socket in the same state.
struct StreamEvents {
  bool readable = false;  // recv would not return -EAGAIN (data, EOF or error)
  bool writable = false;  // send would not return -EAGAIN (space, or it would fail)
  bool rdhup = false;     // receiving is shut down (the peer's FIN, SHUT_RD, a reset)
  bool hup = false;       // both directions are shut down, or the connection was reset
  bool error = false;     // an error is pending (SO_ERROR would report it)
  uint64_t rx_gen = 0;    // bytes arrived so far: a change is a new edge for EPOLLET
  uint64_t tx_gen = 0;    // bytes credited so far: likewise for EPOLLOUT
};

// How long a connection goes without traffic before the waits that see it
// idle (epoll_wait, a blocking recv) give its rings' pages back
// (Stream::trim): long enough that a connection between bursts keeps them.
inline constexpr int64_t kTrimIdleNs = 1000 * 1000 * 1000;

class Stream {
 public:
  // counters: where the stream shows what it moves (a connection's slot in
  // the file rsockstat reads), living as long as the stream; nullptr: none.
  explicit Stream(std::unique_ptr<Channel> channel, ConnCounters* counters = nullptr);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // Copies as much of iov as fits. Returns the bytes copied (> 0), -EAGAIN
  // when the ring is full, the pending error after a reset, else -EPIPE
  // after shutdown(SHUT_WR) or a reset. Once the peer's end is gone, takes
  // everything (nobody reads it) and resets the stream. moved: the caller's
  // socket call has moved bytes already (it will return those): the
  // pending error is then left for the next call, as the kernel leaves it.
  ssize_t send(const struct iovec* iov, int iovcnt, bool moved = false);

  // sendfile(2) while our sending side is still on the kernel socket: the
  // kernel's own sendfile on it, its result and errors as they are, the
  // bytes counted as send() counts them on the socket. kNotOnTcp when the
  // side is on the ring (or the stream is reset, moved or taken over): the
  // caller copies through send(). Only for a socket that does not block
  // (O_NONBLOCK): a blocking one would sleep in the kernel holding the send
  // lock, which the pairing's seal waits for.
  static constexpr ssize_t kNotOnTcp = INT64_MIN + 1;
  ssize_t sendfile_tcp(int in_fd, off_t* offset, size_t count);

  // Copies up to the readable bytes. Returns the count (> 0), 0 at end of
  // stream, -EAGAIN when nothing is readable yet, the pending error after a
  // reset (once the ring is drained; then 0). With peek, nothing is
  // consumed. moved: as for send. look: on an empty ring, look for a peer
  // that died without a word (rate-limited) before answering -EAGAIN; a
  // caller that will sleep next passes false (its sleep sees the death).
  ssize_t recv(const struct iovec* iov, int iovcnt, bool peek, bool moved = false,
               bool look = true);

  // Two peers that each block in a send, neither reading (an echo of whole
  // messages larger than the rings, each side sending before it reads),
  // would wait for each other forever: the kernel's TCP takes the peer's
  // bytes into its receive queue meanwhile, up to a few MiB, and so does
  // relieve(). A sender that waits for room calls it: when our receive ring
  // is full (or the peer waits for credits) and no thread of ours is
  // reading, the ring's bytes move to a private queue (at most kHeldMax)
  // and the peer gets their credits; recv() reads that queue first. Only
  // while this process alone holds the end (another holder could take it
  // over and read on from what our application read). Returns the bytes
  // moved.
  static constexpr size_t kHeldMax = 4u << 20;
  size_t relieve();
  // Whether relieve() could ever move anything now (a cheap look): a
  // sender's wait then also wakes for the peer's bytes.
  bool may_relieve() const;
  // What a thread about to sleep for `want` (kWantData, kWantSpace) arms:
  // a wait for room alone, on a connection that may relieve, wakes for the
  // peer's bytes too, and the sleeper calls relieve() once armed. The one
  // rule of blocking calls, poll/select and epoll.
  uint32_t sleep_wants(uint32_t want) const {
    return want == kWantSpace && may_relieve() ? want | kWantData : want;
  }
  // Bytes relieve() has moved so far (stats), and whether some still wait
  // for the application (a close then resets, as the kernel's does with
  // unread bytes; an exec cannot hand them over).
  uint64_t bytes_held() const { return held_total_.load(std::memory_order_relaxed); }
  bool holds_unread() const {
    return held_unread_.load(std::memory_order_acquire) > 0 ||
           orphaned_.load(std::memory_order_acquire);
  }

  // SO_ERROR: the pending error (a positive errno), cleared; or 0.
  int take_error();

  // Whether the kernel's socket would be in TCP_CLOSE: reset, or both FINs
  // exchanged (getpeername() and shutdown() then give ENOTCONN).
  bool closed();

  // Whether the peer's end has shown (its FIN or close) or the stream was
  // reset, as last observed: readiness may then change with no doorbell
  // (our next send resets the stream). No probe.
  bool ending() const {
    return reset_.load(std::memory_order_acquire) || fin_rcvd_.load(std::memory_order_acquire) ||
           peer_gone_.load(std::memory_order_acquire);
  }

  // Bytes readable right now (FIONREAD).
  size_t readable_bytes();
  // Whether the kernel socket has bytes, an end or an error for a read now
  // (one poll): the readiness of a stream whose bytes all go on it
  // (PrefixChannel), where nothing past the bytes can wait there.
  bool socket_readable() const;
  // Bytes send() would take right now without waiting (0 when it would
  // fail or block).
  size_t writable_bytes();

  // Gives back the ring memory that traffic has touched, where nothing is
  // in flight (Channel::trim), for a caller that has seen the connection
  // idle for a while. Returns the bytes given back; 0 at once when another
  // thread is inside a send or recv.
  size_t trim();
  // Whether trim() could give anything back once the connection is idle
  // (Channel::trimmable, or relieve()'s queue kept its memory).
  bool trimmable() const {
    return channel_->trimmable() || held_spare_.load(std::memory_order_relaxed);
  }

  // Exec hand-off. report_consumed() returns credits for every byte read so
  // far, so that the region says exactly what was consumed; resume() makes
  // a new stream continue from totals read back from the region (before
  // the stream is shared): bytes published and credited in our direction,
  // bytes granted in the peer's, and whether we had shut down sending.
  // Returns false when the totals are impossible (the caller must not use
  // the stream then).
  void report_consumed();
  // Waits until no operation is in progress on this stream (bounded: a
  // fork from a signal handler may interrupt one in this very thread).
  // After a new process was counted as a holder (fork, spawn), every
  // operation that starts from then on sees it (Channel::enter).
  void quiesce();
  bool resume(uint64_t tx_sent, uint64_t tx_credited, uint64_t rx_granted, bool shut_wr);

  // look: the caller reports the answer to the application (poll, epoll),
  // so a peer that died without a word must show (Channel::probe, rate-
  // limited); a caller that only decides whether to wait (conn_wait)
  // passes false: its sleep learns of a death by itself.
  //
  // socket_events: what an epoll registration of the kernel socket reported
  // just now (EPOLLIN, EPOLLOUT, EPOLLRDHUP, EPOLLERR, EPOLLHUP), which
  // stands for the poll() of the directions still on the socket; 0: poll.
  //
  // edges: the caller compares rx_gen with an earlier answer's (an
  // edge-triggered epoll member). Only then does a receiver still on the
  // kernel socket count what waits there (one more system call); else
  // rx_gen leaves those bytes out.
  StreamEvents events(bool look = true, uint32_t socket_events = 0, bool edges = false);

  // A process that holds this end but not its carrier (a fork's child, an
  // exec'd image over verbs: Channel::needs_take_over) takes it over before
  // its first operation; every call below does this first. Returns 0,
  // -EAGAIN while the carrier moves here (wait on the channel's wait_fd),
  // or another negative errno when the move failed: the stream is then
  // reset, and the calls report it as they report any reset (the pending
  // ECONNRESET once).
  int take_over();
  // In a fork's child: the locks that the parent's other threads held at
  // the fork are released, the byte counts (the parent's, for the stats)
  // start again (the stream's sent total stays: tx_origin_), and the
  // channel learns that it is in another process. Returns true when this
  // copy is reset instead (the parent holds bytes of it: see relieve()).
  bool after_fork_child();

  // -EAGAIN (nothing done) when shutting the sending side needs our sender
  // to switch first, and the peer's receive path does not read the region
  // yet: the caller waits a little and calls again.
  int shutdown(bool rd, bool wr);
  // The kernel socket of a stream that will never switch is shut down for
  // reading (rd) and/or writing (wr) as kernel TCP: its calls and readiness
  // say so from now on, as the kernel's would (a send fails with EPIPE;
  // both directions shut make HUP). Called just before the kernel's
  // shutdown, whose wakeup of a thread asleep on the socket must find the
  // stream shut too. Nothing is signalled: the FIN goes on the socket.
  void shut_on_tcp(bool rd, bool wr);
  // The peer never took the connection over from TCP (shutdown waited in
  // vain): the stream resets, as a broken carrier does.
  void abort_stuck_switch();
  // Tells the peer we are gone: a FIN to it when we read all it sent, else
  // (or when abort, SO_LINGER {1, 0}) a reset.
  void close(bool abort = false);
  // At process exit, for a connection the program never closed (a forked
  // child or an inetd service that just exits): this process stops holding
  // the end and, if it was the last holder, tells the peer as close() does
  // (the peer then tells a FIN from a reset by what we read). Without it
  // the kernel closes the socket with the peer's unread doorbell bytes in
  // it, which resets the connection. Nothing changes locally (other threads
  // may still run during exit). A holder is dropped once per stream,
  // whichever of this and close() comes first. Then the channel's own exit
  // work (Channel::at_exit: verbs delivers what it posted, and an owner that
  // other processes still hold hands the end over to them).
  void release_at_exit();

  // Starting on TCP (docs/protocol.md section 10): whether a direction
  // still moves its bytes on the kernel socket (the channel's TcpPrefix).
  // Each turns false once, when that direction switches to its ring; the
  // socket layer then waits on the socket itself (POLLOUT, POLLIN).
  bool tx_on_tcp() const { return tx_tcp_.load(std::memory_order_acquire); }
  bool rx_on_tcp() const { return rx_tcp_.load(std::memory_order_acquire); }
  // The peer's sender has not switched: every byte on the socket is the
  // application's (after its switch the peer's doorbells come there too).
  bool peer_sends_on_tcp() const {
    return prefix_ && prefix_->peer_switch_at->load(std::memory_order_acquire) == kNotSwitched;
  }
  // The stream is the fd's state now: this end reads the region, and the
  // peer may switch. Then our own sender switches too, if it may.
  void attach();
  // Bytes moved on the kernel socket before the switch (stats).
  uint64_t tcp_bytes_sent() const;
  uint64_t tcp_bytes_received() const;

  // A stream that carried its first bytes before its connection paired
  // (its channel a PrefixChannel: every byte on the socket, counted) is
  // sealed when the pairing ends: under both of its locks, so that no call
  // is inside it, f(sent, read) receives the bytes that went on the socket
  // each way (for the successor's continue_from), and from then on send()
  // and recv() return kForwarded without touching anything: the caller
  // goes on with the successor. events() then reports readable and
  // writable, so that a waiter wakes and finds the successor.
  static constexpr ssize_t kForwarded = -ECHRNG;
  template <class F>
  void seal(F f) {
    std::scoped_lock lock(tx_mu_, rx_mu_);
    f(prefix_ ? prefix_->tcp_sent->load(std::memory_order_acquire) : 0,
      prefix_ ? prefix_->tcp_read->load(std::memory_order_acquire) : 0);
    sealed_.store(true, std::memory_order_release);
  }
  bool sealed() const { return sealed_.load(std::memory_order_acquire); }
  // The successor of a sealed stream: the bytes its predecessor moved on the
  // socket were this stream's first (its prefix, in the channel's words and
  // the stats). Before attach() and before the stream is shared.
  void continue_from(uint64_t sent, uint64_t read);

  Channel& channel() { return *channel_; }
  uint64_t bytes_sent() const { return bytes_sent_.load(std::memory_order_relaxed); }
  uint64_t bytes_received() const { return bytes_received_.load(std::memory_order_relaxed); }

 private:
  PeerState poll_peer();                // channel poll with head/consumed folded into maxima
  void refresh_rx(const PeerState& s);  // under rx_mu_
  void fail();                          // protocol violation: reset
  void grant_all_read();                // credits for every byte read; under rx_mu_
  bool resume_locked(uint64_t tx_sent, uint64_t tx_credited, uint64_t rx_granted, bool shut_wr);
  // Follows the peer's end (FIN, gone, reset) into our emulated TCP state.
  void observe(uint32_t flags);
  void reset_with(int err);            // the RST "arrived": both directions shut, err pending
  ssize_t carrier_failed(bool moved);  // a channel call failed: reset; what send returns
  int take_pending(bool moved);        // the pending error: taken, or only read when moved
  // Looks at the carrier (Channel::probe) at most once per coarse clock
  // tick, or now when forced. Returns whether it looked.
  bool maybe_probe(bool force = false);
  // Drops this process as a holder of the end, once; the last holder tells
  // the peer (kSendClosed, with kSendReset when abort).
  void release_holder(bool abort);
  // Starting on TCP. Our sender switches once the peer's receive path
  // reads the region (under tx_mu_): returns whether it is on the ring.
  bool switch_tx_locked();
  // A doorbell was held back before our sender switched: switch now if the
  // send lock is free (a sender that holds it looks after its call).
  void pay_owed_doorbell();
  ssize_t send_tcp(const struct iovec* iov, int iovcnt);  // under tx_mu_
  // Reads the peer's prefix (under rx_mu_); kOnRing once it is all read.
  static constexpr ssize_t kOnRing = INT64_MIN;
  ssize_t recv_tcp(const struct iovec* iov, int iovcnt, bool peek);
  // Whether our receiver has read the whole prefix (switches it if so).
  bool rx_prefix_done_locked();
  // *tcp_rx: the bytes that arrived on the socket so far (a receiver
  // still on it: what it read, and with `edges` what waits there).
  void tcp_overlay(StreamEvents* ev, uint64_t* tcp_rx, uint32_t socket_events, bool edges);
  ssize_t foreign_prefix_bytes();  // under rx_mu_: the reset, and what recv returns
  StreamEvents ring_events(bool look);

  std::unique_ptr<Channel> channel_;
  TcpPrefix* prefix_;  // the channel's, or nullptr: every byte on the ring
  std::atomic<bool> sealed_{false};  // seal(): every call goes to the successor
  std::atomic<bool> tx_tcp_{false};
  std::atomic<bool> rx_tcp_{false};
  std::mutex tx_mu_;
  CreditLedger ledger_;
  std::mutex rx_mu_;
  ReceiveWindow window_;
  // relieve()'s queue, under rx_mu_: bytes of the stream from position
  // window_.consumed() - held_unread_ on, which the application has not
  // read (held_[held_off_..]).
  std::vector<uint8_t> held_;
  size_t held_off_ = 0;
  std::atomic<size_t> held_unread_{0};
  std::atomic<uint64_t> held_total_{0};
  std::atomic<bool> held_spare_{false};  // held_ has memory that trim() gives back
  // A fork's child whose parent held bytes for the application: the child
  // has a copy of them, which it must not deliver as well (the parent may);
  // its copy of the connection is reset, and stays away from the carrier.
  std::atomic<bool> orphaned_{false};
  void take_held(size_t n);  // under rx_mu_
  std::atomic<bool> shut_rd_{false};
  std::atomic<bool> shut_wr_{false};
  std::atomic<bool> holder_dropped_{false};  // close() or release_at_exit() ran
  std::atomic<bool> broken_{false};  // protocol violation seen: the ring is not to be trusted
  // The kernel's view of this end (see the opening comment). Each moves
  // one way only; observe() changes them under state_mu_.
  std::mutex state_mu_;
  std::atomic<uint32_t> observed_{0};     // peer flags already followed
  std::atomic<bool> fin_rcvd_{false};     // the peer's FIN is behind its last byte (SOCK_DONE)
  std::atomic<bool> peer_gone_{false};    // its end is closed: our next send resets
  std::atomic<bool> reset_{false};        // reset: both directions shut (TCP_CLOSE)
  std::atomic<int> sk_err_{0};            // pending error, reported once
  std::atomic<int64_t> last_probe_{0};    // coarse clock of the last Channel::probe
  std::atomic<bool> eof_checked_{false};  // the carrier was looked at before the first EOF
  // Largest totals any poll() has reported. A poll made for one direction
  // also delivers the other direction's notifications, and a later stale one
  // may replace them in the channel's PeerState: without these, a fresh
  // credit seen by recv() (or head seen by send()) could be lost for good.
  std::atomic<uint64_t> peer_head_{0};
  std::atomic<uint64_t> peer_consumed_{0};
  std::atomic<uint64_t> tcp_sent_{0};  // prefix bytes by this process (stats)
  std::atomic<uint64_t> tcp_received_{0};
  std::atomic<uint64_t> bytes_sent_{0};  // by this process (stats)
  std::atomic<uint64_t> bytes_received_{0};
  // What rsockstat shows of them: the connection's slot in the published
  // file (stats/publish.h), or own_. Only a view: a fork's child starts
  // from a copy of the file taken before the fork, and the counts above,
  // which decide how the stream ends, must be exact there.
  ConnCounters own_;
  ConnCounters* c_;
  // Adds n to one of our counts and shows the new total in the view (a
  // plain store: each count changes under one of the stream's locks).
  static void add_count(std::atomic<uint64_t>& mine, std::atomic<uint64_t>& shown, uint64_t n,
                        std::memory_order order = std::memory_order_relaxed) {
    shown.store(mine.fetch_add(n, order) + n, std::memory_order_relaxed);
  }
  // Stream offset this process started sending at (resume() after an exec
  // hand-off or a takeover, or what the parent had sent at a fork):
  // tx_origin_ + bytes_sent_ is the stream's sent total.
  std::atomic<uint64_t> tx_origin_{0};
};

}  // namespace rsock
