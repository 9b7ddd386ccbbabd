// Accelerated-socket semantics and connection setup (see socket.h).
#include "socket/socket.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/own_fd.h"
#include "common/real.h"
#include "common/sleep_token.h"
#include "lifecycle/runtime.h"
#include "policy/policy.h"
#include "socket/pending.h"
#include "transport/pairing.h"
#include "transport/prefix/prefix_channel.h"
#include "transport/setup.h"
#include "transport/socket_number.h"

namespace rsock {
namespace {

// SO_PROTOCOL IPPROTO_TCP with SO_TYPE SOCK_STREAM is a TCP socket of
// AF_INET or AF_INET6 (a raw socket of IPPROTO_TCP is SOCK_RAW; MPTCP
// answers IPPROTO_MPTCP): the domain needs no third system call.
bool is_tcp_stream(int fd) {
  // The kernel has TCP for SOCK_STREAM sockets only.
  int proto = 0;
  socklen_t len = sizeof proto;
  return real().getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &len) == 0 && proto == IPPROTO_TCP;
}

// connect(): whether fd is a TCP socket with no connection (TCP_CLOSE: new,
// or its last connect failed). connect() again on one that is connecting
// or connected (APR asks so whether a nonblocking connect is done) is the
// kernel's to answer: no new connection, to count or to pair. One system
// call: TCP_INFO is answered by TCP sockets of both domains and by MPTCP
// (whose stream to a candidate peer is carried as TCP's would be; its
// listeners are never candidates, is_tcp_stream); UDP, raw, SCTP and Unix
// sockets refuse it.
bool is_unconnected_tcp(int fd) {
  tcp_info ti = {};
  socklen_t len = sizeof ti;
  return real().getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 && ti.tcpi_state == TCP_CLOSE;
}

int64_t timeval_us(int fd, int opt) {
  timeval tv = {};
  socklen_t len = sizeof tv;
  if (real().getsockopt(fd, SOL_SOCKET, opt, &tv, &len) != 0) return 0;
  return static_cast<int64_t>(tv.tv_sec) * 1000000 + tv.tv_usec;
}

// Attaches an accelerated connection to fd.
void attach(int fd, std::unique_ptr<Channel> ch, Path path) {
  // The channel takes the application's number for its socket (one
  // descriptor per connection): the fd has no other yet, and no thread
  // but this one knows the connection.
  if (SocketNumber* n = ch->socket_number()) (void)n->use(fd);
  ConnectionState* c = new_connection(fd, std::move(ch), path);
  fd_table().set(fd, c);
  c->stream().attach();  // our receive path reads the region: the peer may switch
  c->unref();            // the table holds it now
}

// Iovec cursor: the part of an iovec array not yet transferred. Up to
// kInline entries live on the stack, so the usual send/recv allocates
// nothing; longer arrays (up to IOV_MAX) use the heap.
class IovCursor {
 public:
  IovCursor(const iovec* iov, int n) : n_(static_cast<size_t>(n)) {
    if (n_ > kInline) {
      heap_.assign(iov, iov + n_);
      v_ = heap_.data();
    } else {
      std::copy(iov, iov + n_, inline_);
      v_ = inline_;
    }
  }
  void advance(size_t n) {
    while (n > 0 && first_ < n_) {
      size_t k = std::min(n, v_[first_].iov_len);
      v_[first_].iov_base = static_cast<char*>(v_[first_].iov_base) + k;
      v_[first_].iov_len -= k;
      n -= k;
      if (v_[first_].iov_len == 0) ++first_;
    }
  }
  const iovec* data() const { return v_ + first_; }
  int count() const { return static_cast<int>(n_ - first_); }

 private:
  static constexpr size_t kInline = 8;
  iovec inline_[kInline];
  std::vector<iovec> heap_;
  iovec* v_;
  size_t n_;
  size_t first_ = 0;
};

size_t iov_total(const iovec* iov, int n) {
  size_t t = 0;
  for (int i = 0; i < n; ++i) t += iov[i].iov_len;
  return t;
}

uint32_t spin_ns() {
  const Runtime* rt = runtime();
  return (rt ? rt->config.spin_us : kDefaultSpinUs) * 1000u;
}

}  // namespace

ConnectionState* new_connection(int sock_fd, std::unique_ptr<Channel> ch, Path path, bool count,
                                int app_fd) {
  auto* c = new ConnectionState(std::move(ch), path, sock_fd);
  // Its O_NONBLOCK and timeouts are read at their first use (as a prefix
  // connection's): a connection that never blocks never pays for them.
  c->peer_len = sizeof c->peer_addr;
  if (real().getpeername(sock_fd, reinterpret_cast<sockaddr*>(&c->peer_addr), &c->peer_len) != 0)
    c->peer_len = 0;
  c->published().describe(sock_fd, app_fd >= 0 ? app_fd : sock_fd, path == Path::kRdma,
                          pub::kAccelerated, reinterpret_cast<sockaddr*>(&c->peer_addr),
                          c->peer_len);
  if (count) stats_connection(path);
  return c;
}

void connection_options_from(int sock_fd, ConnectionState* c) { c->options_from(sock_fd); }

void ConnectionState::options_from(int sock_fd) {
  const int fl = real().fcntl(sock_fd, F_GETFL);
  set_nonblocking(fl >= 0 && (fl & O_NONBLOCK));
  set_timeout_us(SO_RCVTIMEO, timeval_us(sock_fd, SO_RCVTIMEO));
  set_timeout_us(SO_SNDTIMEO, timeval_us(sock_fd, SO_SNDTIMEO));
}

// The first use of an unknown option asks the kernel. A store of the
// application's (after its own system call) wins over what we read: the
// exchange from unknown fails once it is there.
bool ConnectionState::nonblocking() {
  int8_t v = nonblocking_.load(std::memory_order_relaxed);
  if (v != kUnknown) return v == 1;
  const int ks = stream_.channel().kernel_socket();
  const int fl = ks >= 0 ? real().fcntl(ks, F_GETFL) : -1;
  const int8_t read = fl >= 0 && (fl & O_NONBLOCK) ? 1 : 0;
  return nonblocking_.compare_exchange_strong(v, read, std::memory_order_relaxed) ? read == 1
                                                                                  : v == 1;
}

int64_t ConnectionState::timeout_us(std::atomic<int64_t>& cached, int opt) {
  int64_t v = cached.load(std::memory_order_relaxed);
  if (v != kUnknown) return v;
  const int ks = stream_.channel().kernel_socket();
  const int64_t read = ks >= 0 ? timeval_us(ks, opt) : 0;
  return cached.compare_exchange_strong(v, read, std::memory_order_relaxed) ? read : v;
}

void record_client_outcome(int fd, const sockaddr* addr, bool accelerated, Path path,
                           Fallback why) {
  if (accelerated) {
    LOG_INFO("connect fd %d: accelerated (%s)", fd, path == Path::kShm ? "shm" : "rdma");
    return;
  }
  client_fell_back(addr, why);
  stats_fallback(why);
  stats_connection(Path::kTcp);
  LOG_INFO("connect fd %d: plain TCP (%s)", fd, fallback_name(why));
}

ConnectionState::ConnectionState(std::unique_ptr<Channel> channel, Path path, int /*fd*/)
    : FdState(Kind::kConnection), stream_(std::move(channel), published_.counters()), path_(path) {
  // (The hub outlives the channel: stream_ is declared after it.)
  stream_.channel().set_async_kick([](void* hub) { static_cast<WakeHub*>(hub)->kick(false); },
                                   &wake);
}

ConnectionState::~ConnectionState() {
  if (ConnectionState* n = next_.load(std::memory_order_acquire)) n->unref();
}

ConnectionState* new_prefix_connection(int sock_fd, Path path) {
  auto* c = new ConnectionState(std::make_unique<PrefixChannel>(sock_fd), path, sock_fd);
  c->prefix_only_ = true;
  // Its options are read at their first use, and getpeername() asks the
  // kernel socket, whose state is the connection's while it runs on TCP.
  // rsockstat shows it once its pairing begins (pending.cpp, advance): the
  // addresses cost two system calls, which a connection that ends first,
  // the usual short one, does not pay.
  return c;
}

void ConnectionState::retire_prefix_socket() {
  if (prefix_only_) static_cast<PrefixChannel&>(stream_.channel()).retire_socket();
}

int ConnectionState::own_prefix_socket() {
  return prefix_only_ ? static_cast<PrefixChannel&>(stream_.channel()).own_socket() : 0;
}

bool ConnectionState::prefix_socket_owned() {
  return !prefix_only_ || static_cast<PrefixChannel&>(stream_.channel()).owns_socket();
}

void ConnectionState::seal_to(ConnectionState* next) {
  stream_.seal([&](uint64_t sent, uint64_t read) {
    next->stream().continue_from(sent, read);
    next_.store(next, std::memory_order_release);
  });
}

StreamEvents ConnectionState::live_events(bool look, ConnectionState** live, uint32_t socket_events,
                                          bool edges) {
  ConnectionState* c = this;
  for (;;) {
    // seal() stores next before it marks the stream sealed.
    if (ConnectionState* n = c->next()) {
      c = n;
      continue;
    }
    // The socket's report is this stream's only: a successor looks anew.
    const StreamEvents ev = c->stream().events(look, c == this ? socket_events : 0, edges);
    if (c->stream().sealed()) continue;
    if (live) *live = c;
    return ev;
  }
}

namespace {

// The channel behind s that may use the application's number for its
// socket (*hold keeps a pairing's outcome alive), or nullptr.
SocketNumber* number_behind(FdState* s, FdRef* hold, ConnectionState** conn = nullptr) {
  ConnectionState* c = nullptr;
  if (s->kind() == FdState::Kind::kConnection) {
    c = static_cast<ConnectionState*>(s);
  } else if (s->kind() == FdState::Kind::kPending) {
    *hold = static_cast<PendingState*>(s)->numbered();
    if (*hold && hold->get()->kind() == FdState::Kind::kConnection) c = hold->as<ConnectionState>();
  }
  if (!c || c->prefix_only()) return nullptr;
  if (conn) *conn = c;
  return c->stream().channel().socket_number();
}

}  // namespace

int socket_number_shared(FdState* s) {
  FdRef hold;
  SocketNumber* n = number_behind(s, &hold);
  return n ? n->own() : 0;
}

void socket_number_leaving(int fd, FdState* s, bool s_last) {
  FdRef hold;
  ConnectionState* c = nullptr;
  SocketNumber* n = number_behind(s, &hold, &c);
  if (!n || (s_last && s->kind() == FdState::Kind::kConnection)) return;
  {
    std::lock_guard<std::mutex> lock(n->mutex());
    if (!n->uses(fd)) return;
    if (const int rc = n->own_locked(); rc < 0) {
      LOG_WARN("fd %d: no descriptor to keep its connection's socket past its close (%s)", fd,
               strerror(-rc));
      return;
    }
  }
  // A thread asleep on the old number (a blocking call on the connection,
  // a poll) looks again, and sleeps on the dup from then on.
  c->wake.kick(false);
}

void ConnectionState::on_last_close() {
  if (ended_.exchange(true, std::memory_order_acq_rel)) return;
  // SO_LINGER {1, 0}: the application asks for a reset, not a FIN.
  bool abort = false;
  if (const int ks = stream_.channel().kernel_socket(); ks >= 0) {
    linger l = {};
    socklen_t len = sizeof l;
    abort =
        real().getsockopt(ks, SOL_SOCKET, SO_LINGER, &l, &len) == 0 && l.l_onoff && l.l_linger == 0;
  }
  stream_.close(abort);
  if (prefix_only_) return;  // its successor, if any, counts its bytes
  stats_bytes(stream_.bytes_sent(), stream_.bytes_received());
  stats_before_switch(stream_.tcp_bytes_sent(), stream_.tcp_bytes_received());
}

namespace {

// conn_wait for a direction that still moves its bytes on the kernel socket
// (Stream::rx_on_tcp, tx_on_tcp): the socket's POLLIN or POLLOUT ends the
// sleep, as do the peer's switch (its doorbell) and another thread's kick.
int tcp_wait(ConnectionState& c, uint32_t want, int64_t deadline_ns, OnSignal on_signal) {
  for (;;) {
    SleepWaker waker;
    // Joined with its waker, never as the doorbell's owner (join_blocking):
    // the owner is the one blocking call that watches the doorbell for the
    // others, which sleep on the hub's word, and this sleep watches the
    // socket for its own direction only. A sender here (POLLOUT) that owned
    // it left a receiver on the ring asleep on the word through the peer's
    // doorbell (SemanticsTcpFirstTest mt_recv_send: "the reader never woke
    // for its byte").
    const WakeHub::Ticket t = c.wake.join(waker.get());
    const StreamEvents ev = c.stream().events(false);
    if (want == kWantData ? ev.readable : ev.writable) {
      c.wake.leave(t);
      return 0;
    }
    if (deadline_ns >= 0 && deadline_ns <= monotonic_ns()) {
      c.wake.leave(t);
      return -EAGAIN;
    }
    int64_t until = deadline_ns;
    const int64_t slice = monotonic_ns() + WakeHub::kBlindSliceNs;
    if (!t.waker && (until < 0 || until > slice)) until = slice;
    const int rc = sleep_on_fd(c.stream().channel().kernel_socket(), until, on_signal,
                               t.waker ? t.waker->fd() : -1, want == kWantData ? POLLIN : POLLOUT);
    c.wake.leave(t);
    if (rc == -EINTR || rc == -ERESTART) return rc;
    return 0;  // the caller's retry looks (it may find the direction switched)
  }
}

}  // namespace

// The sleeps of a sender whose socket holds the peer's unread bytes (see
// conn_wait): how soon it sees the peer's credit.
constexpr int64_t kBusySocketSliceNs = 1000 * 1000;

int conn_wait(ConnectionState& c, uint32_t want, int64_t deadline_ns, OnSignal on_signal) {
  auto ready = [&] {
    StreamEvents ev = c.stream().events(false);
    return want == kWantData ? ev.readable : ev.writable;
  };
  // Spin briefly: a peer that answers within the spin costs no syscall
  // (SpinGovernor shortens it for a peer that never does).
  if (ready()) return 0;
  // A direction still on the kernel socket waits for the socket itself.
  if (want == kWantData ? c.stream().rx_on_tcp() : c.stream().tx_on_tcp())
    return tcp_wait(c, want, deadline_ns, on_signal);
  const int64_t spin_end = monotonic_ns() + c.spin.budget(spin_ns());
  // No PAUSE here: under emulation (TCG) and hypervisors with pause-loop
  // exiting it leaves the vCPU, which costs far more than the check.
  for (;;) {
    if (ready()) {
      c.spin.caught();
      return 0;
    }
    if (monotonic_ns() >= spin_end) break;
  }
  c.spin.missed();

  Channel& ch = c.stream().channel();
  // A reader that sleeps on an idle connection gives its rings' pages back
  // after a second (Stream::trim), once per call: its first sleep is cut
  // there when the rings hold any to give.
  bool trim_due = want == kWantData;
  // RSOCK_TCP_FIRST: a sender waiting for ring space while the peer's bytes
  // from before its switch wait unread on the socket. They keep the socket
  // readable, and the peer's credit doorbell queues behind them: the socket
  // cannot wake us (a sleep on it returned at once, a busy loop). It then
  // sleeps on this thread's waker in short slices.
  bool socket_busy = false;
  // A sender whose own receive ring may be what holds the peer up (both
  // blocked in a send: Stream::relieve) also wakes for the peer's bytes,
  // and moves them out of a full ring after arming (the re-check).
  const uint32_t arm_for = c.stream().sleep_wants(want);
  const bool relief = arm_for != want;
  for (;;) {
    // Join before arming and re-checking: a wakeup that another thread of
    // this process consumes after our re-check (a poller draining the
    // doorbell rung for us) is then passed on to us (wake_hub.h). One
    // blocking call sleeps on the doorbell (and this thread's waker); the
    // others on the hub's word, until a kick or until that one returns.
    SleepWaker waker;
    const WakeHub::Ticket t = c.wake.join_blocking(waker.get());
    // What the last sleeper left on the socket (leave_wakeups, below) would
    // end this sleep at once.
    if (ch.drain_left_wakeups()) c.wake.kick(true);
    if (ch.arm(arm_for, new_sleep_token())) c.wake.kick(true);
    auto leave = [&] {
      ch.disarm(arm_for);
      c.wake.leave(t);
    };
    if (relief) (void)c.stream().relieve();
    if (ready()) {
      leave();
      return 0;
    }
    const int64_t now = monotonic_ns();
    if (deadline_ns >= 0 && deadline_ns <= now) {
      leave();
      return -EAGAIN;
    }
    // Both sleeps end on a signal as the kernel's would (interruptible.h).
    if (t.kind == WakeHub::Ticket::kWord) {
      const int w = sleep_on_word(c.wake.word(), t.word, deadline_ns, on_signal);
      leave();
      if (w == -EINTR) return -EINTR;
      if (ready()) return 0;
      continue;
    }
    // Without a waker (out of fds) nothing could wake us for another
    // thread's drain: sleep in slices and look again.
    int64_t until = deadline_ns;
    if (!t.waker && (until < 0 || until > now + WakeHub::kBlindSliceNs))
      until = now + WakeHub::kBlindSliceNs;
    if (socket_busy && (until < 0 || until > now + kBusySocketSliceNs))
      until = now + kBusySocketSliceNs;
    bool trim_cut = false;
    if (trim_due && (until < 0 || until > now + kTrimIdleNs) && c.stream().trimmable()) {
      until = now + kTrimIdleNs;
      trim_cut = true;
    }
    const int rc = sleep_on_fd(socket_busy ? -1 : ch.wait_fd(), until, on_signal,
                               t.waker ? t.waker->fd() : -1);
    // Woken to find what we waited for: the doorbell can wait on the
    // socket until the next sleep, which drains it before it arms. On a
    // blocking ping-pong whose hops all sleep, the drain's two recv() were
    // on the path to the reply (docs/design.md, "A hop that sleeps").
    if (rc > 0 && ready() && ch.leave_wakeups()) {
      leave();
      return 0;
    }
    const bool drained = ch.drain_wakeups();
    if (drained) c.wake.kick(true);
    leave();
    if (rc == -EINTR || rc == -ERESTART) return rc;
    if (rc == 0 && trim_cut) {
      trim_due = false;
      (void)c.stream().trim();
    }
    // Woken by a doorbell: the caller's own retry looks at the stream (one
    // look fewer on the way to the reply); a spurious wakeup brings it back
    // here. Woken by another thread's kick (or by nothing we drained): look
    // here, and sleep again without a new spin when it was not for us.
    if (rc > 0 && drained) return 0;
    if (ready()) return 0;
    if (rc > 0 && want == kWantSpace && c.stream().rx_on_tcp()) socket_busy = true;
  }
}

namespace {

// A blocking call's deadline before its first wait (-1 is none).
constexpr int64_t kNoDeadlineYet = INT64_MIN;

// How a blocked call answers a signal handler: restartable (SA_RESTART
// decides) only while it has no timeout and has moved nothing (signal(7);
// tcp_sendmsg and tcp_recvmsg return a partial count after any handler).
OnSignal on_signal_for(int64_t deadline, size_t done) {
  return deadline >= 0 || done > 0 ? OnSignal::kInterrupt : OnSignal::kRestartable;
}

}  // namespace

ssize_t conn_send(ConnectionState& c, const iovec* iov, int iovcnt, int flags) {
  // O_NONBLOCK and the timeout are looked at when the call would wait, not
  // before (a prefix-only connection reads them from the kernel then).
  auto nonblock = [&] { return (flags & MSG_DONTWAIT) || c.nonblocking(); };
  const size_t total = iov_total(iov, iovcnt);
  if (total == 0) {
    const ssize_t n = c.stream().send(iov, iovcnt);
    return n == Stream::kForwarded ? conn_send(*c.next(), iov, iovcnt, flags) : n;
  }
  int64_t deadline = kNoDeadlineYet;
  IovCursor cur(iov, iovcnt);
  size_t done = 0;
  for (;;) {
    ssize_t n = c.stream().send(cur.data(), cur.count(), done > 0);
    if (n == Stream::kForwarded) {
      // Paired meanwhile (RSOCK_TCP_FIRST): the rest goes on the successor.
      const ssize_t r = conn_send(*c.next(), cur.data(), cur.count(), flags);
      if (r < 0) return done ? static_cast<ssize_t>(done) : r;
      return static_cast<ssize_t>(done) + r;
    }
    if (n > 0) {
      done += static_cast<size_t>(n);
      if (done == total || nonblock()) return static_cast<ssize_t>(done);
      cur.advance(static_cast<size_t>(n));
      continue;
    }
    if (n != -EAGAIN) return done ? static_cast<ssize_t>(done) : n;
    if (nonblock()) return done ? static_cast<ssize_t>(done) : -EAGAIN;
    // The timeout counts from the call's first wait.
    if (deadline == kNoDeadlineYet) deadline = deadline_after_us(c.snd_timeout_us());
    int w = conn_wait(c, kWantSpace, deadline, on_signal_for(deadline, done));
    if (w == -ERESTART) {
      // The kernel starts the call over: with the flags and timeout the
      // handler may have changed.
      deadline = kNoDeadlineYet;
      continue;
    }
    if (w < 0) return done ? static_cast<ssize_t>(done) : w;
  }
}

ssize_t conn_recv(ConnectionState& c, const iovec* iov, int iovcnt, int flags) {
  if (flags & MSG_OOB) return -EINVAL;  // no urgent data on an accelerated stream
  const bool dontwait = flags & MSG_DONTWAIT;
  const bool peek = flags & MSG_PEEK;
  const bool waitall = (flags & MSG_WAITALL) && !peek;
  const size_t total = iov_total(iov, iovcnt);
  if (total == 0) return 0;
  int64_t deadline = kNoDeadlineYet;
  IovCursor cur(iov, iovcnt);
  size_t done = 0;
  for (;;) {
    // A blocking call sleeps next, which sees a dead peer by itself. (A
    // prefix-only connection's bytes come from its socket, not from a ring
    // to look at: its O_NONBLOCK is not asked for that.)
    const bool look = dontwait || (c.prefix_only() ? c.nonblocking_known_true() : c.nonblocking());
    ssize_t n = c.stream().recv(cur.data(), cur.count(), peek, done > 0, look);
    if (n == Stream::kForwarded) {
      // Paired meanwhile (RSOCK_TCP_FIRST): the successor has the rest.
      if (done > 0 && !waitall) return static_cast<ssize_t>(done);
      const ssize_t r = conn_recv(*c.next(), cur.data(), cur.count(), flags);
      if (r < 0) return done ? static_cast<ssize_t>(done) : r;
      return static_cast<ssize_t>(done) + r;
    }
    if (n > 0) {
      done += static_cast<size_t>(n);
      if (!waitall || done == total) return static_cast<ssize_t>(done);
      cur.advance(static_cast<size_t>(n));
      continue;
    }
    if (n == 0) return static_cast<ssize_t>(done);
    if (n != -EAGAIN) return done ? static_cast<ssize_t>(done) : n;
    // A connection still on its kernel socket whose peer answered by now
    // (a request and its reply): no O_NONBLOCK or timeout to read, no wait
    // to prepare. (One known to be nonblocking returns at once instead.)
    if (deadline == kNoDeadlineYet && !dontwait && c.prefix_only() && !c.nonblocking_known_true() &&
        c.stream().socket_readable())
      continue;
    if (dontwait || c.nonblocking()) return done ? static_cast<ssize_t>(done) : -EAGAIN;
    if (deadline == kNoDeadlineYet) deadline = deadline_after_us(c.rcv_timeout_us());
    int w = conn_wait(c, kWantData, deadline, on_signal_for(deadline, done));
    if (w == -ERESTART) {
      deadline = kNoDeadlineYet;
      continue;
    }
    if (w < 0) return done ? static_cast<ssize_t>(done) : w;
  }
}

int conn_shutdown(ConnectionState& c, int how) {
  if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR) return -EINVAL;
  // As inet_shutdown() on a socket already in TCP_CLOSE (reset, or both
  // FINs exchanged): applied, but ENOTCONN.
  const bool closed = c.stream().closed();
  // The kernel socket is left open in both directions: it carries the
  // doorbells and liveness until close(). A FIN goes behind our bytes on
  // the kernel socket, so our sender switches first: at once unless the
  // peer's side of the pairing is still being handed over (bounded).
  const int64_t give_up = monotonic_ns() + 10'000'000'000;
  while (c.stream().shutdown(how != SHUT_WR, how != SHUT_RD) == -EAGAIN) {
    if (monotonic_ns() > give_up) {
      LOG_WARN("shutdown: the peer never took the connection over from TCP; resetting it");
      c.stream().abort_stuck_switch();
      break;
    }
    usleep(200);
  }
  // No doorbell tells this process's own sleepers (a thread blocked in
  // recv, send or epoll_wait on the connection): kernel TCP wakes them at
  // once, and stopping a reader thread with shutdown() relies on it. Every
  // sleeper looks again.
  c.wake.kick(false);
  return closed ? -ENOTCONN : 0;
}

namespace {

// After a successful TCP connect: commit to the channel, or record why not.
int finish_pairing(int fd, const sockaddr* addr, std::unique_ptr<Channel> ch, Path path,
                   Fallback why) {
  const bool accelerated = ch != nullptr;
  if (ch) attach(fd, std::move(ch), path);
  record_client_outcome(fd, addr, accelerated, path, why);
  return 0;
}

// A nonblocking connect whose pairing could not go to the background:
// waits (bounded) for the TCP handshake. Returns 0 when connected, else
// -EINPROGRESS (a failure is then reported through SO_ERROR, as usual).
int wait_connected(int fd, const Config& cfg) {
  pollfd p = {fd, POLLOUT, 0};
  int pr = real().poll(&p, 1, static_cast<int>(cfg.connect_timeout_ms));
  if (pr == 1 && p.revents == POLLOUT) return 0;
  if (pr == 0) {  // still connecting: the stream stays on TCP
    stats_fallback(Fallback::kPairTimeout);
    stats_connection(Path::kTcp);
  }
  return -EINPROGRESS;
}

// The real connect(), then the pairing that `setup` prepared (consumed). A
// blocking socket pairs here; a nonblocking one returns EINPROGRESS and
// pairs in the background (pending.h).
int connect_and_pair(int fd, const sockaddr* addr, socklen_t len, const Config& cfg,
                     std::unique_ptr<ClientSetup> setup, uint64_t children) {
  // RSOCK_TCP_FIRST: the connection runs on TCP from here on, and pairs in
  // the background (pending.h).
  const bool live = cfg.tcp_first && setup->driven();
  auto background = [&](int rc) {
    PairJob job;
    job.fd = fd;
    job.server = false;
    job.addr_len = std::min<socklen_t>(len, sizeof job.addr);
    memcpy(&job.addr, addr, job.addr_len);
    job.path = setup->path();
    job.client = std::move(setup);
    job.live = live;
    job.children = children;
    if (pending_start(job, cfg) == 0) return true;
    setup = std::move(job.client);  // not started: ours again
    (void)rc;
    return false;
  };
  if (real().connect(fd, addr, len) != 0) {
    int r = -errno;
    if (r == -EINPROGRESS) {
      if (background(r)) return -EINPROGRESS;
      r = wait_connected(fd, cfg);
    }
    if (r != 0) return r;  // the setup goes with it
  } else if (live && background(0)) {
    return 0;
  }
  const Path path = setup->path();
  std::unique_ptr<Pairing> p = setup->pairing(fd, cfg);
  p->run(INT64_MAX);
  return finish_pairing(fd, addr, p->take_channel(), path, p->why());
}

}  // namespace

int setup_connect(const Runtime& rt, int fd, const sockaddr* addr, socklen_t len, bool fresh) {
  const Config& cfg = rt.config;
  Decision d = decide(cfg, rt.program, Role::kClient, addr, len);
  auto plain = [&](bool count_tcp) {
    int r = real().connect(fd, addr, len);
    int err = errno;
    if ((r == 0 || err == EINPROGRESS) && count_tcp) stats_connection(Path::kTcp);
    return r == 0 ? 0 : -err;
  };
  if (!d.candidate) return plain(rt.stats && (fresh || is_unconnected_tcp(fd)));
  if (!fresh && !is_unconnected_tcp(fd)) return plain(false);
  // A fork since socket() cleared `fresh`; one from now on counts.
  const uint64_t children = fresh ? children_made() : PairJob::kUnknownChildren;

  Fallback why;
  if (std::unique_ptr<ClientSetup> setup = client_setup(fd, addr, d.transport, cfg.tcp_first, &why))
    return connect_and_pair(fd, addr, len, cfg, std::move(setup), children);
  stats_fallback(why);
  LOG_INFO("connect fd %d: plain TCP (%s)", fd, fallback_name(why));
  return plain(true);
}

int setup_listen(const Runtime& rt, int fd, int backlog) {
  if (real().listen(fd, backlog) != 0) return -errno;
  if (fd_table().has(fd)) return 0;  // listen() again on a candidate listener
  sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return 0;
  Decision d = decide(rt.config, rt.program, Role::kServer, reinterpret_cast<sockaddr*>(&ss), len);
  if (!d.candidate || !is_tcp_stream(fd)) return 0;
  // A deeper accept queue than asked for. On kernel TCP a client whose
  // handshake the full queue dropped completes it with its first data
  // segment, at once; a librsock client writes nothing before its pairing,
  // so it would wait for the kernel's SYN-ACK retransmission (1 s, as long
  // as its whole pairing bound) instead.
  if (backlog < kMinListenBacklog) real().listen(fd, kMinListenBacklog);
  auto* st = new ListenerState(fd, d.transport);
  fd_table().set(fd, st);
  LOG_INFO("listen fd %d: candidate listener (shm %s, rdma %s)", fd,
           st->setup().has(Path::kShm) ? "yes" : "no", st->setup().has(Path::kRdma) ? "yes" : "no");
  st->unref();
  return 0;
}

void record_server_outcome(int fd, bool accelerated, Path path, Fallback why) {
  if (accelerated) {
    LOG_INFO("accept fd %d: accelerated (%s)", fd, path == Path::kShm ? "shm" : "rdma");
    return;
  }
  stats_fallback(why);
  stats_connection(Path::kTcp);
  LOG_INFO("accept fd %d: plain TCP (%s)", fd, fallback_name(why));
}

namespace {

// An event loop (nonblocking listener or new socket) pairs in the
// background; a blocking accept() pairs before it returns, unless more
// connections wait to be accepted: pairing them one after the other would
// hold the accept queue full under a burst of connects (a small backlog
// then overflows, and the kernel retries the handshake only after a
// second, by when the clients have given up pairing).
bool accept_in_background(const Accepted& how) {
  if (how.flags & SOCK_NONBLOCK) return true;
  const int fl = real().fcntl(how.listen_fd, F_GETFL);
  if (fl >= 0 && (fl & O_NONBLOCK)) return true;
  pollfd more = {how.listen_fd, POLLIN, 0};
  return real().poll(&more, 1, 0) == 1 && (more.revents & POLLIN);
}

}  // namespace

void setup_accepted(const Runtime& rt, FdState* listener, int newfd, const Accepted& how) {
  if (listener == nullptr || listener->kind() != FdState::Kind::kListener) {
    if (rt.stats && is_tcp_stream(newfd)) stats_connection(Path::kTcp);
    return;
  }
  auto* l = static_cast<ListenerState*>(listener);
  Path path;
  Fallback why;
  std::unique_ptr<Pairing> p = l->setup().accept(newfd, how.peer, rt.config, &path, &why);
  // A blocking accept() pairs here, for a short while: a cooperative peer
  // is done by then. An event loop's accept(), one with more connections
  // waiting behind it, and a pairing whose peer has not finished in that
  // time, go on in the background (pending.h), so that a peer that stalls
  // never holds up the accept() of other connections.
  // RSOCK_TCP_FIRST: the connection runs on TCP from here on, and pairs in
  // the background a little later (pending.h).
  const bool live = p && rt.config.tcp_first && p->driven();
  if (p &&
      (live || accept_in_background(how) || !p->run(monotonic_ns() / 1000000 + kAcceptInlineMs))) {
    PairJob job;
    job.fd = newfd;
    job.server = true;
    job.path = path;
    job.live = live;
    job.nonblocking = (how.flags & SOCK_NONBLOCK) != 0;
    job.children = how.children;
    job.pairing = std::move(p);
    l->ref();
    job.listener = FdRef(l);  // the pairing may use the listener's rdma_cm id
    if (pending_start(job, rt.config) == 0) return;
    p = std::move(job.pairing);  // no thread: finish here
    p->run(INT64_MAX);
  }
  std::unique_ptr<Channel> ch = p ? ListenSetup::result(*p, newfd, path, &why) : nullptr;
  const bool accelerated = ch != nullptr;
  if (ch) attach(newfd, std::move(ch), path);
  record_server_outcome(newfd, accelerated, path, why);
}

}  // namespace rsock
