// Channel: the interface every transport implements (shared memory, verbs,
// and the in-process fake used by unit tests). A Channel carries one
// connection: it moves bytes into the peer's receive ring, publishes how far
// the ring is filled, returns credits, carries the close flags and wakes a
// sleeping peer. It knows nothing of sockets or of POSIX semantics: Stream
// (src/stream) builds the byte stream on top, identically for every
// transport. Thread-safety: write/publish are called under the stream's send
// lock, grant under its receive lock; poll, arm, disarm, signal and
// drain_wakeups may be called from any thread; take_over under both of the
// stream's locks; enter/leave/note_read under the lock of the operation
// they bracket. The wakeups wait_fd() carries belong to the connection, not
// to a thread: the socket layer passes one that a thread consumed on to the
// others (socket/wake_hub.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ring/wire.h"
#include "stats/publish.h"

namespace rsock {

// What this side knows of the peer, refreshed by Channel::poll().
struct PeerState {
  uint64_t head = 0;      // bytes the peer has published into our receive ring
  uint64_t consumed = 0;  // bytes of ours the peer has consumed (its credits)
  uint32_t flags = 0;     // PeerFlag bits
  // Bumped each time a transport-level send limit (kTxBlocked) lifts; part of
  // the EPOLLOUT edge, since no byte credit changes then. 0 for transports
  // without such a limit.
  uint64_t tx_epoch = 0;
};

enum PeerFlag : uint32_t {
  // The peer shut down its sending side (shutdown SHUT_WR): after its last
  // byte, EOF. Not set by a close: the stream tells a close from a reset.
  kPeerFin = 1u << 0,
  // The peer's end is gone: it closed the socket, or its process died (the
  // kernel socket ended). Whether that reads as a FIN or a reset here is the
  // stream's decision (docs/protocol.md section 6).
  kPeerClosed = 1u << 1,
  kPeerStalled = 1u << 2,     // the peer waits for credits: grant as soon as anything is freed
  kTransportError = 1u << 3,  // the carrier broke (reset, QP error): ECONNRESET
  // The transport cannot take a publication now (verbs: out of message
  // credits): a send must wait exactly as if the ring were full.
  kTxBlocked = 1u << 4,
  kPeerReset = 1u << 5,  // the peer closed with SO_LINGER {1, 0}: a reset, as the kernel sends
  // Bytes reached a kernel socket of this connection behind librsock (seen
  // here or by the peer): the connection is reset (Reset::kKernelBytes).
  kKernelBytes = 1u << 6,
};

// Flags this side sends with Channel::signal().
enum LocalFlag : uint32_t {
  kSendFin = 1u << 0,          // we shut down our sending direction
  kSendClosed = 1u << 1,       // we closed the socket (not a FIN by itself: see kPeerClosed)
  kSendReset = 1u << 2,        // with kSendClosed: an abortive close (SO_LINGER {1, 0})
  kSendKernelBytes = 1u << 3,  // we reset the connection: bytes reached our kernel socket
};

// Where a process that took an end over continues (Channel::take_over).
struct EndPositions {
  uint64_t tx_sent = 0;      // bytes of ours published to the peer
  uint64_t tx_credited = 0;  // of those, bytes the peer has consumed
  uint64_t rx_consumed = 0;  // bytes of the peer's our application has read
  bool fin_sent = false;     // we shut down our sending side
};

// Starting on TCP (version 5, docs/protocol.md section 10): a stream's
// first bytes in each direction may travel on the kernel socket, and each
// sender moves to its ring at a byte count it announces, once the peer's
// receive path looks at the channel. The words live where every process
// holding the end finds them (the shm region), so that a fork's child or an
// exec'd image that takes the end over goes on from them.
struct TcpPrefix {
  std::atomic<uint64_t>* tcp_sent;   // bytes we wrote to the socket as data; under the send lock
  std::atomic<uint64_t>* tcp_read;   // bytes of the peer's prefix we read; under the receive lock
  std::atomic<uint64_t>* switch_at;  // ours: kNotSwitched until our sender switched
  const std::atomic<uint64_t>* peer_switch_at;
  const std::atomic<uint32_t>* peer_attached;
  const std::atomic<uint64_t>* peer_tcp_read;  // the peer's tcp_read: our prefix it has read
};

class ExecSink;             // transport/handoff.h
class SocketNumber;         // transport/socket_number.h
enum class ExecKind : int;  // transport/handoff.h

// What a sleeper waits for, passed to arm()/disarm().
enum WaitFor : uint32_t { kWantData = 1u << 0, kWantSpace = 1u << 1 };

class Channel {
 public:
  virtual ~Channel() = default;

  virtual const char* name() const = 0;  // "shm", "rdma", "fake": the stats' transport name

  // Where the connection counts what its channel does (the doorbells it
  // rings): the stream's counters, set while a stream uses the channel.
  void set_counters(ConnCounters* c) { counters_.store(c, std::memory_order_relaxed); }
  void count_wakeup() {
    if (ConnCounters* c = counters_.load(std::memory_order_relaxed))
      c->wakeups.fetch_add(1, std::memory_order_relaxed);
  }
  virtual size_t ring_bytes() const = 0;  // both directions' rings have this size

  // The local receive ring (the peer writes into it; we read it after poll()
  // reported the bytes as published).
  virtual const uint8_t* rx_ring() const = 0;

  // Copies len bytes to offset `offset` of the peer's receive ring; the
  // caller has split the range so that it does not wrap. Returns 0 or a
  // negative errno.
  virtual int write(size_t offset, const void* src, size_t len) = 0;

  // Brackets the writes of one send: begin_tx() before its first write(),
  // end_tx() after its publish() or when it gives up. begin_tx() returns
  // false when the peer's ring cannot take writes right now (shm: the
  // consumer is giving the idle ring's pages back, which takes a system
  // call): the send then waits as for a full ring, and poll() reports
  // kTxBlocked until it can go on (and bumps tx_epoch when it can).
  virtual bool begin_tx() { return true; }
  virtual void end_tx() {}

  // Gives back the memory of this connection's rings where nothing is in
  // flight (docs/design.md, "Pages that follow the traffic"): a caller that
  // has seen the connection idle for a while, holding both of the stream's
  // locks, inside an operation bracket (enter), with every byte it read
  // granted (`rx_consumed`). Returns the bytes given back (0: nothing to
  // give, or the transport cannot: verbs rings are registered memory).
  virtual size_t trim(uint64_t /*rx_consumed*/) { return 0; }
  // Whether trim() could give anything back once the connection is idle
  // (traffic has touched enough pages since the last time): a cheap look,
  // from any thread, for a sleeper deciding whether to wake up for it.
  virtual bool trimmable() const { return false; }

  // Makes all bytes written before `head` (absolute position) visible to
  // the peer and wakes it if it sleeps. Returns 0 or a negative errno.
  virtual int publish(uint64_t head) = 0;

  // Reports that we consumed `consumed` bytes in total (returns credits) and
  // wakes the peer if it sleeps on credits. Returns 0 or a negative errno.
  virtual int grant(uint64_t consumed) = 0;

  // Sends LocalFlag bits to the peer (sticky) and wakes it. The peer sees
  // the flags no earlier than every head published before them (so that a
  // FIN can never hide the last bytes).
  virtual void signal(uint32_t flags) = 0;

  // Refreshes and returns the peer's state.
  virtual PeerState poll() = 0;

  // A sleeper announces itself before blocking on wait_fd(), then re-checks
  // its condition; disarm() after waking. Counts nest (several threads).
  // `sleep` names this sleep (new_sleep_token(), common/sleep_token.h):
  // one sleep on several channels arms them all with the same token, and
  // it must disarm every one of them before it looks at any after waking
  // (a peer that rang the sleep once may skip the others: ring/sleepers.h).
  // Returns true when it consumed a wakeup that was pending on wait_fd()
  // (see drain_wakeups).
  [[nodiscard]] virtual bool arm(uint32_t want, uint64_t sleep) = 0;
  virtual void disarm(uint32_t want) = 0;

  // An fd that turns readable when the peer publishes, grants or signals
  // while we are armed, or when the carrier fails.
  virtual int wait_fd() const = 0;

  // Consumes pending wakeups after wait_fd() was readable; notices a carrier
  // failure or a peer that is gone (reported from then on by poll() as
  // kTransportError or kPeerClosed) and bytes that reached the kernel socket
  // behind librsock (kKernelBytes). Returns true when it consumed anything
  // that made wait_fd() readable: every thread of the process that watches
  // wait_fd() shares those wakeups, so the caller must then wake the
  // others (socket/wake_hub.h), which may have slept through this one.
  [[nodiscard]] virtual bool drain_wakeups() = 0;
  // A transport whose wakeups may be consumed on a thread of its own
  // (verbs: the engine's, verbs_engine.h) wakes the connection's sleepers
  // with fn(arg), the connection's WakeHub kick; fn must not call back
  // into the channel. Others ignore it.
  virtual void set_async_kick(void (* /*fn*/)(void*), void* /*arg*/) {}
  // A sleeper that wakes on wait_fd() to find what it waited for may leave
  // the wakeups there (true: this transport keeps them for later), so that
  // the drain is off the path to the application's next call, and the
  // next sleeper on the channel drains them first (drain_left_wakeups, as
  // drain_wakeups). A sleeper that is not woken by them (poll, epoll_wait)
  // drains them as any other. false: the caller drains now.
  virtual bool leave_wakeups() { return false; }
  [[nodiscard]] virtual bool drain_left_wakeups() { return false; }

  // Looks at the carrier without consuming anything (one system call): a
  // peer that died shows in poll() from then on, as do bytes that reached
  // the kernel socket behind librsock. For callers that would otherwise
  // report "nothing yet" without sleeping (a sleeper learns both by itself).
  virtual void probe() {}
  // Whether wait_fd() turns readable by itself for everything probe()
  // looks for (a peer that is gone, bytes on the kernel socket), so that a
  // caller that keeps wait_fd() in its kernel set and drains it when it is
  // readable (epoll_wait) needs no probe.
  virtual bool wait_fd_shows_carrier() const { return false; }

  // Bytes of ours the peer's application has read, as exactly as this
  // transport knows it (at least the credited total). Asked once the peer
  // is gone, to tell a clean close from one that left our bytes unread.
  virtual uint64_t peer_read_total() = 0;
  // Reports that our application has read `total` bytes in all (exact, not
  // a credit: see peer_read_total; verbs also keeps it for the process that
  // takes the end over next). Under the receive lock, inside the bracket
  // (enter) of the recv that read them.
  virtual void note_read(uint64_t /*total*/) {}

  // Starting on TCP (TcpPrefix above). nullptr: every byte of the stream
  // travels on the ring (verbs, the fake), and the calls below do nothing.
  virtual TcpPrefix* tcp_prefix() { return nullptr; }
  // This end's receive path now looks at the channel (the stream is the
  // fd's state): the peer may switch from now on.
  virtual void attach() {}
  // Our sender switches after `at` bytes on the kernel socket, under the
  // send lock: announced, then doorbells may go out (one now, for a
  // receiver asleep on the socket, which must learn of the switch).
  virtual void switch_tx(uint64_t /*at*/) {}
  // Whether a doorbell was held back because our sender had not switched
  // (on the socket it would have read as data): the stream switches as
  // soon as it may, which rings. Cleared by switch_tx.
  virtual bool doorbell_owed() const { return false; }
  // Our receiver has read the peer's whole prefix: every byte on the kernel
  // socket from now on is a doorbell. `taken`: bytes past the prefix that
  // the stream's last read of the socket took (doorbells, drained).
  virtual void switch_rx(uint64_t /*taken*/) {}
  // Our receiver read more of the peer's prefix than the peer's count says
  // it sent: bytes reached the socket behind the peer's librsock (raw
  // system calls, stdio), as kKernelBytes reports them once on the ring.
  virtual void foreign_bytes() {}
  // Our receiver, still on the socket, read its end there (EOF or a reset):
  // the peer's end is gone (kPeerClosed from now on), and the stream decides
  // between a FIN and a reset by what each side read, as it does on the
  // ring (a reset can be the peer's kernel's answer to our unread doorbells).
  // kernel_reset: the kernel reported a reset (ECONNRESET, POLLERR), which
  // a channel without a region (PrefixChannel) takes as the verdict.
  virtual void tcp_closed(bool /*kernel_reset*/) {}
  // Whether the peer's librsock told us it closed its end (its counts are
  // final, so the end it told, a FIN or a reset, is exact). An EOF read on
  // the socket after it told a reset is that reset, whose error a send of
  // ours on the socket (a doorbell) met first.
  virtual bool peer_told_close() const { return false; }

  // The connection's kernel TCP socket (a private dup, or the
  // application's number: socket_number()), or -1.
  virtual int kernel_socket() const { return -1; }
  // A channel that may reach its socket through the application's own
  // number (one descriptor per connection): how it does (socket_number.h).
  // nullptr: the channel's descriptors are all its own.
  virtual SocketNumber* socket_number() { return nullptr; }
  // Appends the descriptors this channel opened in this process (besides
  // wait_fd()), which a close_range/closefrom of the application must leave
  // open.
  virtual void own_fds(std::vector<int>* /*out*/) {}

  // Process holders of this end (fork): a forked child adds itself; a
  // process that closes its copy drops itself, and only the last one tells
  // the peer (returns true).
  virtual void add_holder() {}
  virtual bool drop_holder() { return true; }
  // Whether this process is the only holder of the end right now: no other
  // process could take it over and go on from what our application read
  // (Stream::relieve reads ahead of the application only then).
  virtual bool sole_holder() const { return true; }

  // Several processes may hold one end (fork, exec). A transport whose
  // carrier belongs to one process at a time (verbs: a queue pair) moves it
  // to the process that uses the end, and fails the calls of a process that
  // lost it (docs/design.md, "RDMA connections that move").
  //
  // needs_take_over(): this process holds the end but not its carrier; the
  // stream then calls take_over() before anything else. take_over() returns
  // 0 with *at filled (continue from there), -EAGAIN while the move is in
  // progress (wait_fd() wakes when it can go on; call again), or another
  // negative errno when it failed (the stream is then reset).
  virtual bool needs_take_over() { return false; }
  virtual int take_over(EndPositions* /*at*/) { return 0; }
  // Brackets every stream operation that moves bytes (send, recv): enter()
  // returns 0 (inside the bracket: leave() ends it), 1 (no bracket needed,
  // no leave(): the connection is reset here, and the call goes on to
  // report it as a reset; or no other process holds the end), or a
  // negative errno when this process may not use the end (another one took
  // it over: the call fails, nothing moved).
  virtual int enter() { return 0; }
  virtual void leave() {}
  // In a fork's child, before anything else: the carrier stays the
  // parent's (and locks held by the parent's other threads are void here).
  virtual void after_fork_child() {}
  // The process exits without closing this end (after drop_holder, and the
  // signal of the last holder): deliver what was posted (bounded), and let
  // another holder take it over.
  virtual void at_exit() {}
  // Exec hand-off (transport/handoff.h): this process is about to exec, or
  // to spawn a child that execs (kind); inherited: the new image keeps a
  // descriptor of the connection. Describes the end to the new image
  // through `sink`. The default: an inherited end cannot cross exec.
  virtual void exec_prepare(ExecKind kind, bool inherited, ExecSink& sink);
  // The exec or spawn failed: undoes what exec_prepare asked to (its token).
  virtual void exec_undo(ExecKind /*kind*/, uint32_t /*token*/) {}

 private:
  std::atomic<ConnCounters*> counters_{nullptr};
};

}  // namespace rsock
