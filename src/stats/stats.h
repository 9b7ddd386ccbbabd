// Process-wide counters: connections by the path that carried their data,
// fallbacks by reason code, accelerated connections reset by librsock and
// intruders rejected at a pairing endpoint (both by reason code), bytes moved
// on accelerated connections. Written as one JSON line appended to
// RSOCK_STATS at exit and before exec, by a process with anything to
// report (stats_anything) or RSOCK_STATS_ALL=1.
// Thread-safety: counters are relaxed atomics; writing is serialised.
#pragma once

#include <cstdint>

namespace rsock {

// Why a candidate stream (a rule matched) ended up on plain TCP. The names
// are stable: tests, operators and rsockstat read them.
enum class Fallback : int {
  kPeerNotAccelerated,  // "peer_not_accelerated": no librsock listener/rendezvous at the peer
  kNotSameHost,         // "not_same_host": peer is remote and no RDMA transport is available
  kNegativeCache,       // "negative_cache": an earlier attempt to this peer failed recently
  kPairTimeout,         // "pair_timeout": the handshake did not complete in time (ours or the
                        // peer's: a peer that ran out of time left it)
  kPairFailed,          // "pair_failed": the handshake broke (declined, bad offer, I/O error)
  kResources,           // "resources": memfd/mmap/socket creation failed
  kTransportDisabled,   // "transport_disabled": the rule forces a transport that cannot serve
  kUnsupportedSocket,   // "unsupported_socket": matched address but not a plain TCP socket
  kNoRdmaDevice,        // "no_rdma_device": RDMA is needed and this host has no RDMA device
  kRdmaAfterFork,       // "rdma_after_fork": this process was forked from one that had used RDMA;
                        // the RDMA descriptors it inherited work only in its parent
  kRendezvousTaken,     // "rendezvous_taken": another process holds the name or port this
                        // connection's pairing needs (docs/security.md)
  kPeerUnproven,        // "peer_unproven": the other side of the pairing could not prove that it
                        // holds the other end of the TCP connection
  kClosedEarly,         // "closed_before_pairing": RSOCK_TCP_FIRST=1: the connection ended (the
                        // peer's FIN, or the fd's close) before its pairing began or finished
  kRdmaPinnedLimit,     // "rdma_pinned_limit": the RDMA rings of this process pin RSOCK_RDMA_PINNED
                        // (or RLIMIT_MEMLOCK) already (transport/verbs/verbs_rings.h)
  kCount
};
const char* fallback_name(Fallback f);

// Why librsock broke an accelerated connection after the switch (the
// application sees ECONNRESET or EPIPE, and one log line names the cause).
// Stable names, like the fallback reasons.
enum class Reset : int {
  kKernelBytes,  // "kernel_bytes": bytes reached the connection's kernel socket behind librsock
                 // (a raw syscall, io_uring, stdio on the fd, a program without librsock)
  kLostAtExec,   // "lost_at_exec": this program inherited the connection through exec and cannot
                 // take it over (its hand-off failed checks)
  kTakenOver,    // "taken_over": another process holding this RDMA connection (a fork's child, an
                 // exec'd program) took it over; this process's calls on it fail
  kMoveFailed,   // "move_failed": moving an RDMA connection to another process failed (here or at
                 // the other end): the connection is reset
  kHeldAtFork,   // "held_at_fork": a fork's child inherited a connection whose parent held bytes
                 // for its application (Stream::relieve); the parent keeps them, the child's copy
                 // is reset rather than deliver them twice
  kCount
};
const char* reset_name(Reset r);

// A process that tried to reach one of our pairings and was turned away
// (docs/security.md). The pairing itself goes on with the real peer.
enum class Reject : int {
  kUnproven,  // "unproven": it could not prove that it holds the other end of the TCP connection
  kCount
};
const char* reject_name(Reject r);

enum class Path : int { kShm, kRdma, kTcp, kCount };

void stats_connection(Path p);
void stats_fallback(Fallback f);
// Counts the reset and logs it: one line at `level` (a LogLevel) that ends
// with its code, "(reset: kernel_bytes)", as the stats file names it.
void stats_reset_connection(Reset r, int level, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
// Counts the rejection and logs it likewise, "(rejected: unproven)".
void stats_reject(Reject r, int level, const char* fmt, ...) __attribute__((format(printf, 3, 4)));
void stats_bytes(uint64_t sent, uint64_t received);  // from a closed accelerated connection
// Bytes a closed accelerated connection carried on the kernel socket
// before each direction switched to its ring (docs/protocol.md section 10).
void stats_before_switch(uint64_t sent, uint64_t received);
uint64_t stats_before_switch_bytes(bool sent);
// A doorbell rung for a sleeping peer (sent), or not rung because this
// thread had just rung the same sleep (spared; ring/sleepers.h).
void stats_wakeup(bool sent);
uint64_t stats_wakeups(bool sent);
// Ring memory given back from an idle connection (bytes of one ring).
void stats_trimmed(uint64_t bytes);
uint64_t stats_trims();
uint64_t stats_trimmed_bytes();
// Bytes a blocked sender moved out of its full receive ring into a queue of
// its own, so that a peer blocked in a send could go on (Stream::relieve).
void stats_held(uint64_t bytes);
uint64_t stats_held_bytes();
// A shared-memory region this process made or mapped for a pairing (false),
// or one it kept from an earlier connection with the same peer process
// and used again (true; transport/shm/region_cache.h).
void stats_region(bool reused);
uint64_t stats_regions(bool reused);
// The registered rings of an RDMA connection: made for it (false) or kept
// from an ended connection and used again (true; transport/verbs/verbs_rings.h).
void stats_rdma_rings(bool reused);
uint64_t stats_rdma_rings_count(bool reused);
uint64_t stats_connections(Path p);
uint64_t stats_fallbacks(Fallback f);
uint64_t stats_resets(Reset r);
uint64_t stats_rejects(Reject r);

// Formats the JSON object (without newline) into buf; returns its length.
// open_sent/open_received (and open_before_sent/received) add the bytes of
// connections still open.
int stats_format(char* buf, int cap, int pid, const char* program, uint64_t open_sent,
                 uint64_t open_received, uint64_t open_before_sent = 0,
                 uint64_t open_before_received = 0);
// Appends one line to path (O_APPEND, one write), opened with
// open_append_file (no symbolic link, only a regular file of ours). A path
// that cannot be used gives one warning line on stderr per process, naming
// RSOCK_STATS, the path (cut if long) and the reason.
void stats_append(const char* path, const char* line, int len);
// Zeroes the counters (fork child: its parent reports what came before).
void stats_reset();
// The process made a TCP socket (socket() with AF_INET or AF_INET6 and
// SOCK_STREAM), it or the process it was forked from (not an image before
// an exec). A process that made none and counted nothing writes no stats
// line (RSOCK_STATS_ALL=1 asks for one from every process).
void stats_socket_made();
// Whether there is anything to report: a TCP socket made, or any count.
bool stats_anything();

}  // namespace rsock
