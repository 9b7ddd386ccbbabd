// Pairing: one attempt, on one side, to move a TCP connection onto a
// transport (docs/protocol.md: shared memory in section 2, verbs in section
// 7; docs/security.md: what each step proves). The socket layer creates a
// Pairing through the transport's factory and drives it; it does not know
// the transport's steps.
//
// A Pairing is a resumable state machine: run(limit) advances it until it
// has finished or `limit` (CLOCK_MONOTONIC milliseconds) has passed. An
// unfinished pairing can be run again later, from another thread, with a
// later limit. accept() uses this to give a pairing a short budget and hand
// the rest to a background thread (socket/pending.h), so that a peer that
// stalls its pairing never holds up accept() for other connections. Each
// pairing also has its own overall deadline, fixed when it was created
// (Config::connect_timeout_ms): past it, run() finishes with a fallback.
//
// Once run() returned true: take_channel() is the channel (both ends have
// committed) or nullptr, in which case the stream stays on TCP and why()
// says why. Thread-safety: one thread at a time; the owner hands the whole
// object over.
#pragma once

#include <poll.h>

#include <cstdint>
#include <memory>

#include "stats/stats.h"
#include "transport/channel.h"

namespace rsock {

class Pairing {
 public:
  virtual ~Pairing() = default;

  // Advances until finished (true) or until limit_ms has passed (false).
  virtual bool run(int64_t limit_ms) = 0;

  // A driven pairing can be advanced without ever waiting, so that one
  // thread drives every such pairing of the process from one poll()
  // (socket/pending.cpp): wait_fds() says what it waits for now, wake_at_ms()
  // when it must be stepped even if none of those fired (its deadline, a
  // retry), and step() advances it as far as it can without waiting. A
  // pairing that is not driven (rdma: rdma_cm and verbs calls that block)
  // runs on a thread of its own through run().
  static constexpr int kMaxWaitFds = 16;
  virtual bool driven() const { return false; }
  // Fills out[0..n) (n <= kMaxWaitFds) and returns n.
  virtual int wait_fds(pollfd* out) { return 0; }
  virtual int64_t wake_at_ms() const { return INT64_MAX; }
  // Advances without waiting: true when finished (as run()).
  virtual bool step() { return run(0); }

  // From now on, reach the TCP socket through tcp_fd: another descriptor
  // of the same socket (the background thread's private dup, which the
  // application cannot close under us).
  virtual void rebind(int tcp_fd) = 0;

  // The connection ended while this pairing ran (RSOCK_TCP_FIRST: the
  // application closed its fd, or the peer's FIN came): a pairing whose
  // peer may have committed already decides at once whether it did, and is
  // finished (true; a channel then if it had). false: the peer cannot
  // have committed, and the pairing is simply dropped.
  virtual bool settle() { return false; }

  // After run() returned true.
  virtual std::unique_ptr<Channel> take_channel() = 0;
  virtual Fallback why() const = 0;
};

// How long accept() pairs before it hands a pairing to a background thread:
// a cooperative peer on the same host answers well within it, so only a
// slow or stalling peer costs a thread.
inline constexpr int64_t kAcceptInlineMs = 20;

// How long, past its own deadline and one more timeout, a pairing waits for
// a peer that may be committing (docs/protocol.md section 7, commit points).
// A cooperating peer always ends that wait with a message; this bound only
// catches a broken peer or an impostor, so it is far longer than any stall
// of a busy host, and no connection is failed because a timeout was short.
inline constexpr int64_t kPeerDecisionMs = 30000;

}  // namespace rsock
