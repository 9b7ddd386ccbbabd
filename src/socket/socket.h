// Per-socket state and POSIX semantics on accelerated sockets: blocking and
// O_NONBLOCK, MSG_* flags, timeouts, SIGPIPE, shutdown, socket options; and
// the connection setup that decides, per stream, between a transport and
// plain TCP (connect, listen, accept). The application's fd is always the
// kernel TCP socket; acceleration is the state attached to it in FdTable.
// Thread-safety: ConnectionState is shared by threads through FdRef; its
// Stream serialises senders and receivers separately.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "common/spin.h"
#include "fdtable/fdtable.h"
#include "socket/interruptible.h"
#include "socket/wake_hub.h"
#include "stats/stats.h"
#include "stream/stream.h"
#include "transport/setup.h"

namespace rsock {

struct Runtime;
struct Config;

class ClientSetup;
class Pairing;

// A listening socket whose streams are candidates (a rule matched): the
// transports' side of it (transport/setup.h) pairs what it accepts.
class ListenerState final : public FdState {
 public:
  ListenerState(int fd, TransportKind kind) : FdState(Kind::kListener), setup_(fd, kind) {}
  ListenSetup& setup() { return setup_; }

 private:
  ListenSetup setup_;
};

// An accelerated connection.
class ConnectionState final : public FdState {
 public:
  ConnectionState(std::unique_ptr<Channel> channel, Path path, int fd);
  ~ConnectionState() override;
  void on_last_close() override;

  Stream& stream() { return stream_; }
  Path path() const { return path_; }

  // The peer's address, as getpeername() gave it at the switch: the kernel
  // socket's own state after that says what the doorbells met, not what
  // the application would see (see the getpeername wrapper).
  sockaddr_storage peer_addr = {};
  socklen_t peer_len = 0;

  // The application's O_NONBLOCK and SO_RCVTIMEO/SO_SNDTIMEO (0 = none),
  // as the kernel socket holds them. The wrappers of fcntl, ioctl and
  // setsockopt store what the application sets. A connection starts with
  // them unknown and asks the kernel at their first use: most short
  // connections never block, and never pay the three system calls.
  bool nonblocking();
  bool nonblocking_known_true() const { return nonblocking_.load(std::memory_order_relaxed) == 1; }
  int64_t rcv_timeout_us() { return timeout_us(rcv_timeout_us_, SO_RCVTIMEO); }
  int64_t snd_timeout_us() { return timeout_us(snd_timeout_us_, SO_SNDTIMEO); }
  void set_nonblocking(bool on) { nonblocking_.store(on ? 1 : 0, std::memory_order_relaxed); }
  void set_timeout_us(int opt, int64_t us) {
    (opt == SO_RCVTIMEO ? rcv_timeout_us_ : snd_timeout_us_).store(us, std::memory_order_relaxed);
  }
  // Reads all three from the kernel socket sock_fd now.
  void options_from(int sock_fd);

  SpinGovernor spin;  // conn_wait's spin length

  // Every thread of this process asleep on the connection (conn_wait,
  // poll/select, epoll_wait) joins it: a transport wakeup that one of them
  // consumes reaches all of them (wake_hub.h).
  WakeHub wake;

  // RSOCK_TCP_FIRST: a connection before its pairing, over a PrefixChannel
  // (new_prefix_connection). It counts nothing in the stats (its successor
  // does, from its counts on).
  bool prefix_only() const { return prefix_only_; }
  // The pairing ended: the stream is sealed and `next` (one reference,
  // taken over) goes on from its counts. A call that meets the sealed
  // stream goes on with next() (conn_send, conn_recv).
  void seal_to(ConnectionState* next);
  ConnectionState* next() const { return next_.load(std::memory_order_acquire); }
  // The readiness of the connection that carries this one's bytes now (it,
  // or the successor of its sealed stream), and that connection (*live).
  // The stream may be sealed between a look at next() and a look at its
  // events, which then say ready to every caller (so that its waiters wake
  // and find the successor): a poll or epoll_wait reporting that would
  // report a spurious event. Here the successor answers.
  // socket_events, edges: Stream::events'.
  StreamEvents live_events(bool look, ConnectionState** live = nullptr, uint32_t socket_events = 0,
                           bool edges = false);
  // A prefix-only connection whose application fd is closed: its socket is
  // no longer the stream's (PrefixChannel::retire_socket).
  void retire_prefix_socket();
  // A prefix-only connection's stream uses the application's fd for its
  // socket until this makes it a private dup (PrefixChannel::own_socket):
  // before that number may come to name another file while the stream
  // still runs. 0 or -errno; 0 for any other connection.
  int own_prefix_socket();
  bool prefix_socket_owned();
  // What rsockstat shows of it (stats/publish.h).
  PublishedConn& published() { return published_; }

 private:
  friend ConnectionState* new_prefix_connection(int sock_fd, Path path);
  static constexpr int64_t kUnknown = -1;
  int64_t timeout_us(std::atomic<int64_t>& cached, int opt);
  std::atomic<int8_t> nonblocking_{kUnknown};
  std::atomic<int64_t> rcv_timeout_us_{kUnknown};
  std::atomic<int64_t> snd_timeout_us_{kUnknown};
  PublishedConn published_;  // what rsockstat shows; outlives stream_, which counts into it
  Stream stream_;
  Path path_;
  bool prefix_only_ = false;
  std::atomic<ConnectionState*> next_{nullptr};
  // on_last_close ran: a pairing's outcome may be ended by the close of
  // its PendingState's fd and by its own (socket/pending.cpp, end_outcome).
  std::atomic<bool> ended_{false};
};

// I/O on accelerated connections. Each returns the libc result or a
// negative errno; the wrapper sets errno (and raises SIGPIPE when due).
ssize_t conn_send(ConnectionState& c, const struct iovec* iov, int iovcnt, int flags);
ssize_t conn_recv(ConnectionState& c, const struct iovec* iov, int iovcnt, int flags);
int conn_shutdown(ConnectionState& c, int how);

// Waits until the stream has data (want = kWantData) or space
// (kWantSpace), with the spin-then-block policy. deadline_ns is CLOCK_MONOTONIC
// nanoseconds, or -1 for none; on_signal says how the calling socket call
// answers a signal handler (socket/interruptible.h). Returns 0 (ready, or
// woken: the caller retries its call), -EAGAIN on timeout, -EINTR (the call
// fails, or returns what it moved) or -ERESTART (the call starts over).
int conn_wait(ConnectionState& c, uint32_t want, int64_t deadline_ns, OnSignal on_signal);

// Connection setup, called by the wrappers with the runtime active.
// Each returns the libc result of the underlying call, or a negative errno.
// fresh: fd is a TCP socket socket() made and nothing connected since
// (FreshTcp), which the kernel then need not be asked.
int setup_connect(const Runtime& rt, int fd, const struct sockaddr* addr, socklen_t len,
                  bool fresh = false);
// A candidate listener's accept queue holds at least kMinListenBacklog
// connections (Linux's SOMAXCONN before 5.4), whatever listen() asked for:
// see setup_listen.
inline constexpr int kMinListenBacklog = 128;
int setup_listen(const Runtime& rt, int fd, int backlog);
// After a successful real accept: pairs if the listener is a candidate, in
// accept() or, for an event loop (nonblocking listener or new socket) or
// while more connections wait to be accepted, in the background
// (socket/pending.h).
struct Accepted {
  int listen_fd;
  int flags;             // accept4's (SOCK_NONBLOCK)
  const sockaddr* peer;  // the peer's address, or nullptr (getpeername)
  uint64_t children;     // children_made() before the accept (PairJob::children)
};
void setup_accepted(const Runtime& rt, FdState* listener, int newfd, const Accepted& how);

// Setup internals shared with pending.cpp. A new connection over ch (one
// reference, for the caller; counted in the stats unless `count` is false:
// a close counted it already); it reads O_NONBLOCK and
// the timeouts of the kernel socket sock_fd at their first use, and
// connection_options_from reads them now (ConnectionState::options_from).
// app_fd: the application's number for it, which rsockstat shows (-1:
// sock_fd is).
ConnectionState* new_connection(int sock_fd, std::unique_ptr<Channel> ch, Path path,
                                bool count = true, int app_fd = -1);
// RSOCK_TCP_FIRST: a connection for the time before its pairing, its bytes
// on a private dup of sock_fd (PrefixChannel), not counted in the stats.
// nullptr when no descriptor is left for the dup.
ConnectionState* new_prefix_connection(int sock_fd, Path path);
void connection_options_from(int sock_fd, ConnectionState* c);
// One descriptor per connection (issue 9; transport/socket_number.h).
// A number whose state is s (a connection, or a pairing with the outcome
// it lent the number to: PendingState::lend_number) is about to get a
// second (dup and its kin): the channel takes a dup of its own, since
// either may be closed first. 0, or -errno when no descriptor is left.
int socket_number_shared(FdState* s);
// fd's number, whose state was s, is about to name another file (close, a
// dup2 onto it, close_range: its slot is cleared by now): a channel that
// uses it for its socket takes a dup of its own first, unless `s_last`:
// the caller holds s's last reference, and a connection that ends when it
// goes does so before the number does.
void socket_number_leaving(int fd, FdState* s, bool s_last);
// A client pairing's outcome: log; on fallback, stats and negative cache.
void record_client_outcome(int fd, const struct sockaddr* addr, bool accelerated, Path path,
                           Fallback why);
void record_server_outcome(int fd, bool accelerated, Path path, Fallback why);

}  // namespace rsock
