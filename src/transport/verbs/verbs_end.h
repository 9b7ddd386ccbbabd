// VerbsEnd: the memory of one end of a verbs connection that every process
// holding that end shares (docs/design.md, "RDMA connections that move";
// docs/protocol.md section 7, "Moving a connection"). A queue pair belongs
// to the process that created it, but fork and exec give the connection's
// fd to other processes; whichever of them uses the end takes it over with
// a queue pair of its own. What it needs to continue exactly where the
// previous owner stopped lives here, in a sealed memfd that fork inherits
// and the exec hand-off passes on:
//
//   page 0       VerbsEndHeader: identity of the connection, the owner
//                (epoch, pid), the owner's positions, holder count, locks
//   page 1..     the receive ring (the peer RDMA-writes into it)
//   then         the send mirror (the bytes we published, by ring offset)
//
// Ring and mirror are shared too: bytes that reached the ring before a move
// stay readable, and a new owner can resend anything its predecessors
// published. Both are addressed by stream position (offset = pos mod size),
// so writing a mirror byte into the peer's ring again is always harmless.
//
// The owner protocol is transport/end_owner.h (shm uses it too); the
// owner records its positions here inside its enter/leave bracket. Besides:
//  * Frames on the kernel socket are written and consumed under
//    `frame_lock` (a pid; a dead holder's lock is taken over), so that the
//    frames of the processes on one host reach the wire in the order of
//    their takeovers, and only the current owner consumes them.
// Thread-safety: the header's fields are atomics shared by processes; a
// VerbsEnd object (the mappings) belongs to one Channel, which serialises
// its use.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "ring/wire.h"
#include "transport/end_owner.h"

namespace rsock {

inline constexpr uint64_t kVerbsEndMagic = 0x31646e6576737272ull;  // "rrsvend1"
inline constexpr uint32_t kVerbsEndVersion = 1;

struct VerbsEndHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t ring_bytes;    // each of the ring and the mirror, a power of two
  uint64_t region_bytes;  // header page + 2 * ring_bytes
  uint64_t nonce;         // random; the exec hand-off names the region by it
  WireAddr local;         // the TCP connection as this end sees it
  WireAddr peer;
  // Ownership.
  alignas(kCacheLine) EndOwner own;  // epoch, owner pid, busy (transport/end_owner.h)
  std::atomic<int32_t> frame_lock;   // pid of the process writing/consuming frames, 0: free
  std::atomic<uint32_t> holders;     // processes holding this end
  std::atomic<uint64_t> move_nonce;  // nonce of the latest takeover's MOVE frame
  // The owner's positions (written inside enter/leave, or under its lock).
  alignas(kCacheLine) std::atomic<uint64_t> tx_sent;  // bytes published to the peer
  std::atomic<uint64_t> rx_consumed;  // bytes of the peer's the application has read
  std::atomic<uint64_t> rx_head;      // bytes of the peer's known to be in the ring
  std::atomic<uint32_t> flags_sent;   // kMoveFin / kMoveClosed we signalled
  std::atomic<uint32_t> peer_flags;   // kMoveFin / kMoveClosed the peer signalled
  // Bytes of move frames consumed from this end's kernel socket, by any of
  // its processes: what a count of the socket's received bytes
  // (tcpi_bytes_received) must not take for bytes behind librsock's back.
  std::atomic<uint64_t> frame_bytes_in;
};
static_assert(sizeof(VerbsEndHeader) <= kPageBytes);
static_assert(std::atomic<int32_t>::is_always_lock_free);

class VerbsEnd {
 public:
  VerbsEnd() = default;
  ~VerbsEnd();
  VerbsEnd(VerbsEnd&& o) noexcept { *this = static_cast<VerbsEnd&&>(o); }
  VerbsEnd& operator=(VerbsEnd&& o) noexcept;
  VerbsEnd(const VerbsEnd&) = delete;
  VerbsEnd& operator=(const VerbsEnd&) = delete;

  // A new end: a sealed memfd (close-on-exec) of header + ring + mirror,
  // header initialised (this process owns it, epoch 1, one holder), rings
  // mapped. Returns 0 or a negative errno.
  static int create(size_t ring_bytes, const WireAddr& local, const WireAddr& peer, VerbsEnd* out);
  // An end whose connection ended, with no process holding it, made ready
  // for a new connection (verbs_rings.h): a new nonce, no addresses yet,
  // positions and flags at 0, this process the owner at the next epoch,
  // one holder. Its rings stay mapped.
  void renew();
  // An end inherited through exec: takes memfd over (made close-on-exec)
  // only if it is a sealed memfd of the right size whose header has our
  // magic, version, layout and this nonce, and was made for the TCP
  // connection of socket_fd (its local and peer address). Maps the header,
  // not the rings. Returns 0 or a negative errno (-EPROTO: not this
  // connection's end); on failure memfd stays the caller's.
  static int validate(int memfd, int socket_fd, uint64_t nonce, VerbsEnd* out);

  // Maps the ring and the mirror (MAP_SHARED) at a fresh address, for this
  // process's registrations. Returns 0 or a negative errno.
  int map_rings();
  // Forgets the ring mapping: unmapped here (a fork's child: the mapping it
  // inherited, if any; memory registered with ibv_fork_init is not).
  void unmap_rings();

  bool valid() const { return hdr_ != nullptr; }
  VerbsEndHeader* hdr() const { return hdr_; }
  int memfd() const { return memfd_; }
  size_t ring_bytes() const { return ring_bytes_; }
  uint8_t* rx_ring() const { return rings_; }
  uint8_t* tx_mirror() const { return rings_ ? rings_ + ring_bytes_ : nullptr; }

 private:
  void release();

  VerbsEndHeader* hdr_ = nullptr;
  int memfd_ = -1;
  size_t ring_bytes_ = 0;
  uint8_t* rings_ = nullptr;  // rx ring, then the mirror
};

// A random 64-bit value, never 0 (an end's or a move's nonce).
uint64_t verbs_random_nonce();

// A process that was counted as a holder of the end in memfd (named by its
// nonce) never held it (a spawned child that did not get the socket).
void verbs_end_drop_holder(int memfd, uint64_t nonce);

// ---- the owner protocol -------------------------------------------------

// An operation of the owner that took `epoch` begins: false (and nothing
// counted) when another process has taken the end over since.
bool end_enter(VerbsEndHeader* h, uint64_t epoch);
void end_leave(VerbsEndHeader* h);
// Whether `epoch` is still the current one (a cheap look, no bracket).
bool end_owns(const VerbsEndHeader* h, uint64_t epoch);

// The frame lock, held by pid. A holder that died is replaced. Returns
// false at the deadline (CLOCK_MONOTONIC ms).
bool end_lock_frames(VerbsEndHeader* h, int64_t deadline_ms);
void end_unlock_frames(VerbsEndHeader* h);

// Makes this process the owner (under the frame lock): bumps the epoch,
// records our pid, then waits until the previous owner has left its
// operations: at once when it released the end or died (then its count is
// cleared), else until `busy` is 0 (its operations are short: a copy and a
// post). Returns the new epoch in *epoch, or -ETIMEDOUT at the deadline
// (the end is then ours but its positions are not known to be final).
int end_fence(VerbsEndHeader* h, int64_t deadline_ms, uint64_t* epoch);

// The owner lets go of the end (close, exit or exec while other processes
// hold it): a taker need not wait for it. Its epoch stays current until a
// taker comes, so an exec that fails can go on (end_reclaim).
void end_release(VerbsEndHeader* h, uint64_t epoch);
bool end_reclaim(VerbsEndHeader* h, uint64_t epoch);

}  // namespace rsock
