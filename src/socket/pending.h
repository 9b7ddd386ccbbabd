// Pairing in the background, for event loops. A nonblocking connect to a
// candidate peer reports its outcome the way the kernel reports a
// nonblocking connect, through EPOLLOUT/POLLOUT and SO_ERROR, never by
// blocking connect() (DESIGN.md, "hard cases"); a nonblocking accept()
// returns the new socket at once.
//
// connect() returns EINPROGRESS at once; a background thread waits for the
// TCP handshake and pairs (shm or rdma); after accept(), it pairs the new
// socket. Until the outcome is in, the fd carries a PendingState, and:
//   - poll/select/epoll show no readiness for it (the kernel socket may
//     already be writable, but a byte written to it now would bypass the
//     transport); they wait on the pairing's eventfd instead;
//   - nonblocking I/O fails with EAGAIN, as on a socket still connecting;
//     blocking I/O and shutdown wait for the outcome;
//   - connect() again fails with EALREADY, as the kernel's would;
//   - options and flags go to the kernel socket; the connection copies
//     them when it is made.
// The outcome replaces the PendingState in every fd that holds it: the new
// ConnectionState, or nothing (plain TCP; a failed handshake's error is the
// kernel's SO_ERROR). Epoll members are converted first, then the fds, then
// the eventfd and the waiters are signalled.
// Thread-safety: all members are safe from any thread. A fork waits for the
// pairings in flight (bounded) so that no child inherits a half-made one.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "fdtable/fdtable.h"
#include "socket/interruptible.h"
#include "stats/stats.h"

namespace rsock {

struct Config;
class ClientSetup;
class Pairing;

class ConnectionState;

class PendingState final : public FdState {
 public:
  // live: RSOCK_TCP_FIRST, the connection before its pairing (one
  // reference, taken over), which the fd's data calls and readiness use
  // meanwhile; the outcome seals it into the paired connection. Its
  // event_fd is -1: made when a call first waits for the outcome.
  // children: PairJob's.
  PendingState(int fd, int event_fd, ConnectionState* live = nullptr, uint64_t children = ~0ull);
  ~PendingState() override;
  // The application closed every fd: the outcome will be discarded.
  void on_last_close() override;

  int fd() const { return fd_; }              // the application's fd at connect()
  // Readable once the outcome is in (-1 for a live one: wait() makes it).
  int event_fd() const { return event_fd_; }
  // No pairing may begin: the application closed every fd, or (live) shut
  // the connection down first (shut_before_pairing).
  bool cancelled();
  // The application closed every fd.
  bool closed();
  // The pairing's thread, once hand_over has given every fd the outcome:
  // from now on the close of the last fd that still holds this state is
  // the outcome's close (on_last_close makes it). Returns whether that
  // close came first: then the caller makes it.
  bool handed_over();
  // RSOCK_TCP_FIRST, the driver, when the delayed pairing of a live one
  // begins: a private dup of its socket, or -ECANCELED when the application
  // closed the fd first (nothing may begin then), or another negative
  // errno. Until then no pairing holds the socket, so that a close before
  // it (on_last_close) ends the connection at once, with no thread woken.
  int take_socket();
  // RSOCK_TCP_FIRST: the application shuts the connection down (either side)
  // before its pairing began. The pairing then never begins (the fd stays on
  // TCP, counted as closed_before_pairing; the FIN of a shutdown for writing
  // ends the peer's pairing too, which otherwise finds no rendezvous): true.
  // false when there is no such pairing, or it has begun (the caller waits
  // for its outcome).
  bool shut_before_pairing();
  // RSOCK_TCP_FIRST: the connection the fd uses until the outcome, or null.
  ConnectionState* live() const { return live_; }
  // Whether the application's fd is, as far as librsock can tell, the only
  // holder of its socket: a live connection whose pairing has not begun (a
  // pairing's thread holds a dup), whose stream has no dup of its own
  // (PrefixChannel::own_socket), in a process that has made no child since
  // the socket was made. Its close then ends the socket's file, and the
  // kernel's epoll registrations of it with it (epoll_forget).
  bool socket_unshared();
  // The outcome is in and the epoll members are the outcome's (or the
  // kernel's): until then an fd keeps its PendingState in the table, so
  // that an epoll_ctl on it waits for the conversion (pending_settle).
  bool converted() const { return converted_.load(std::memory_order_acquire); }
  void set_converted() { converted_.store(true, std::memory_order_release); }
  // The stats count a connection once: whoever claims it first (the
  // outcome, or a close that comes first) counts it.
  bool claim_count() { return !counted_.exchange(true); }

  // Waits for the outcome (*out: the connection, or empty for plain TCP)
  // and returns 0; or -EINTR when a signal handler ends the wait, as it
  // would end the blocking call waiting here (socket/interruptible.h).
  int wait(OnSignal on_signal, FdRef* out);
  // The outcome, valid once resolved() (which is set before any fd changes
  // hands).
  FdRef outcome();
  bool resolved() const { return resolved_.load(std::memory_order_seq_cst); }

  // One descriptor per connection (transport/socket_number.h): before the
  // hand-over makes the outcome c visible to any other thread, c's channel
  // gives up its private dup of the socket for the application's number,
  // if that number names the socket alone (this state in its slot, no
  // other fd of it, not closed). Decided under this state's lock, where a
  // close or dup of the number finds c (numbered) and has it take a dup of
  // its own again.
  void lend_number(ConnectionState* c);
  FdRef numbered();

  // Worker side: publish the outcome (nullptr = plain TCP), then finish.
  void resolve(FdState* outcome);
  void finish();

 private:
  const int fd_;
  int event_fd_;  // under mu_ while -1 (made by wait())
  ConnectionState* const live_;
  const uint64_t children_;  // children_made() when the socket was made (PairJob)
  std::atomic<bool> counted_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  bool cancelled_ = false;      // under mu_
  bool closed_ = false;         // under mu_
  bool started_ = false;        // under mu_: take_socket() gave the socket
  bool handed_ = false;         // under mu_: handed_over() ran
  FdState* outcome_ = nullptr;  // holds a reference; under mu_
  FdState* numbered_ = nullptr;  // lend_number's connection (a reference); under mu_
  bool done_ = false;  // under mu_: finish() ran
  std::atomic<bool> resolved_{false};
  std::atomic<bool> converted_{false};
};

// What the background pairing needs to know of a connect() or accept().
struct PairJob {
  int fd = -1;          // the application's fd
  bool server = false;  // accept(): pair on `listener`; else connect()
  // connect(), which returned EINPROGRESS:
  sockaddr_storage addr = {};
  socklen_t addr_len = 0;
  Path path = Path::kShm;               // the transport it pairs over
  std::unique_ptr<ClientSetup> client;  // what the transport set up before connect()
  // accept():
  FdRef listener;                    // the ListenerState (alive while its pairing runs)
  std::unique_ptr<Pairing> pairing;  // started by accept(), continued in the background
  // RSOCK_TCP_FIRST: the fd carries its bytes on TCP meanwhile (a driven
  // pairing only); the server's side starts pairing cfg.pair_delay_ms later.
  bool live = false;
  // The socket is known to be O_NONBLOCK (accept4's SOCK_NONBLOCK): the
  // live connection need not ask the kernel at its first use.
  bool nonblocking = false;
  // children_made() before the socket was made (accept) or, for a socket
  // fresh from socket() (FreshTcp), before its connect; kUnknownChildren
  // when not known (PendingState::socket_unshared).
  uint64_t children = kUnknownChildren;
  static constexpr uint64_t kUnknownChildren = ~0ull;
};

// RSOCK_TCP_FIRST: the connection a socket still pairing uses meanwhile
// (PendingState::live), for the data calls and readiness; else `r`.
FdRef pending_live(FdRef r);

// Attaches a PendingState to job.fd and starts its pairing, taking the job
// over. Returns 0, or a negative errno when no thread could be started
// (nothing attached, the job untouched: the caller pairs synchronously).
int pending_start(PairJob& job, const Config& cfg);

// For calls on an fd whose state is `r`: a resolved pairing's outcome in
// place of its PendingState (fixing fd's slot); anything else unchanged.
FdRef pending_settle(int fd, FdRef r);

// Whether a pairing thread is handing an outcome over right now: from
// before its outcome becomes visible (so that pending_settle can already
// have handed an fd over) until its epoll members are converted. close()
// of an fd must then drop the fd's epoll members itself even when the fd
// has no state left, or the conversion could act on the fd number after
// it names another file.
bool pending_handover_in_flight();
// At exit, before the connections are let go and the stats written: waits
// (up to half a second) for the hand-overs in progress, which may still end
// the outcome of an fd the application has closed (its bytes are counted
// then).
void pending_finish_at_exit();

// The process exits (RSOCK_TCP_FIRST): a connection that ran on TCP and is
// still pairing ends with it, before its outcome, and is counted as one
// that closed first (closed_before_pairing), as its close would count it.
void pending_count_at_exit();

// The descriptor librsock keeps for background pairing (the driver thread's
// eventfd), which close_range and closefrom must leave open.
void pending_own_fds(std::vector<int>* out);

// Waits (bounded) for every pairing in flight (exec).
void pending_before_fork();
// Fork's prepare handler: the same wait, then no pairing can start until
// the fork is done (pending_after_fork_parent or _child must follow).
void pending_fork_prepare();
void pending_after_fork_parent();
// Fork, in the child: pairings that were still in flight stay plain TCP.
void pending_after_fork_child();

}  // namespace rsock
