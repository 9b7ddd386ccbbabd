// A closed end keeps its kernel socket until the peer has read its TCP
// prefix (docs/design.md, "Connection setup"; only RSOCK_TCP_FIRST=1 ends
// have a prefix).
//
// The bytes an end wrote on the kernel socket before its sender switched to
// the ring may still wait in the socket's send queue when the application
// closes. Kernel TCP delivers them after the close. But Linux answers data
// that reaches a socket its last holder closed with a reset, and the reset
// discards that send queue; and the peer's librsock writes bytes the peer's
// application never wrote (its doorbells: its own switch, its FIN, its
// wakeups). So a closed end whose peer has not read all of its prefix
// keeps the socket open here, not read by anyone, until the peer has read
// the prefix, or the peer's end closed, or its socket ended, or a bound
// passed, or more ends than kShmLingerMaxEnds linger (the oldest goes
// first); then it closes the socket (a FIN: the doorbells that came are
// drained first when every byte still coming is one). A thread of its own
// looks every few milliseconds while an end lingers, and exits when none
// does. Thread-safety: every call may come from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rsock {

struct ShmLinger {
  int socket_fd = -1;   // the end's dup of the kernel socket
  void* map = nullptr;  // the region, where the peer's counts are
  size_t map_len = 0;
  // Owned: the socket is closed and the region unmapped at the end. Not
  // owned (the process exits): both go with the process; the exit waits.
  bool owned = true;
  uint64_t sent = 0;                            // our prefix, final
  const std::atomic<uint64_t>* peer_read;       // of it, what the peer read
  const std::atomic<uint32_t>* peer_flags;      // kSendClosed: the peer's end closed
  const std::atomic<uint64_t>* peer_switch_at;  // the peer's prefix, once it switched
  const std::atomic<uint64_t>* read;            // of it, what we read
};

// The most ends that linger at once (each holds a descriptor and its
// region's mapping); the oldest closes when one more comes.
inline constexpr size_t kShmLingerMaxEnds = 256;

// Whether an end that closed with `sent` prefix bytes, of which the peer
// read `peer_read`, must linger.
inline bool shm_linger_needed(uint64_t sent, uint64_t peer_read) { return peer_read < sent; }

// Takes the end over (its socket and mapping, when owned) until it is done.
void shm_linger(const ShmLinger& end);

// The process exits, or its image is replaced (exec: the lingering
// sockets are close-on-exec): waits until every lingering end is done, for
// 10 s at most (past that a peer still reading may meet a reset). An exec
// that fails leaves the rest lingering as before.
void shm_linger_settle();

// The lingering sockets (an application's closefrom must leave them open).
void shm_linger_own_fds(std::vector<int>* out);

// fork(): the list is held across it; the child closes its copies (the
// parent's ends linger in the parent).
void shm_linger_fork_prepare();
void shm_linger_after_fork_parent();
void shm_linger_after_fork_child();

}  // namespace rsock
