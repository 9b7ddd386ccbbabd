// Wire formats of the stream protocol (docs/protocol.md is the prose spec):
// the shared region that holds both rings and their control words, and the
// address form both ends use (the pairing messages are in handshake.h). Pure declarations
// with static_asserts on every layout rule. Thread-safety: the control words
// are atomics written by exactly one side each (see DirectionControl).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rsock {

inline constexpr uint64_t kRegionMagic = 0x31726b636f737272ull;  // "rrsockr1"
inline constexpr uint32_t kProtocolVersion = 6;
inline constexpr size_t kCacheLine = 64;

// Control words of one direction. The producer writes `head`,
// `producer_flags` and `producer_sleepers`; the consumer writes `consumed`,
// `consumer_flags` and `consumer_sleepers`. The two groups live on separate
// cache lines so that a streaming producer and consumer do not false-share.
// The third line is for giving the ring's pages back: the producer's
// `writing`, and two words written by whichever end gives pages back.
// A sleepers word counts the threads asleep and names the sleep of the
// only one (ring/sleepers.h; version 3: version 2 had 32-bit counts).
struct DirectionControl {
  alignas(kCacheLine) std::atomic<uint64_t> head;  // bytes published
  std::atomic<uint32_t> producer_flags;                // LocalFlag bits of the producer
  std::atomic<uint64_t> producer_sleepers;             // producer threads asleep on credits
  alignas(kCacheLine) std::atomic<uint64_t> consumed;  // bytes consumed (credits)
  std::atomic<uint32_t> consumer_flags;                // LocalFlag bits of the consumer
  std::atomic<uint64_t> consumer_sleepers;             // consumer threads asleep on data
  // Giving the ring's pages back while it is empty and idle (version 4,
  // docs/protocol.md section 9), by either end: `trim_seq` is odd while one
  // end does it (taken by a compare-and-swap from even, released by a store
  // of the next even value), and the producer writes nothing meanwhile.
  // `trimmed` is the ring position up to which pages were given back
  // (written only by the end that holds trim_seq): from there to `head`
  // lie the pages that traffic has touched since. `writing` (the
  // producer's) is 1 while it writes into free space, from before its
  // first copy until after its publish. The producer writes and reads this
  // line on every send and the consumer only when it gives pages back, so
  // it stays in the producer's cache; on the producer's own line, which a
  // spinning consumer polls, each store would take the line back.
  alignas(kCacheLine) std::atomic<uint64_t> trim_seq;
  std::atomic<uint64_t> trimmed;
  std::atomic<uint32_t> writing;
};
static_assert(sizeof(DirectionControl) == 3 * kCacheLine);
static_assert(offsetof(DirectionControl, consumed) == kCacheLine);
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

// Direction 0 carries server -> client bytes, direction 1 client -> server.
enum Direction : int { kServerToClient = 0, kClientToServer = 1 };

struct WireAddr {  // an address as both ends name it: IPv4 stored as v4-mapped IPv6
  uint8_t addr[16];
  uint16_t port;  // host byte order
  uint16_t pad;
};
static_assert(sizeof(WireAddr) == 20);

// What one end (side 0 server, 1 client) tells the other off the data path,
// on a line of its own: only that end writes it (all of its processes,
// after fork), and the other end reads it only on slow paths (draining its
// doorbells, or once this end is gone), so the line costs the data path
// nothing.
struct EndpointControl {
  // Doorbell bytes this end has put on the kernel TCP socket: counted
  // before each send, taken back when the send fails. The other end drains
  // its socket and counts what it took (`drained`, its own line): a drained
  // total above this one is a byte that reached the socket behind librsock.
  alignas(kCacheLine) std::atomic<uint64_t> doorbells;
  std::atomic<uint64_t> drained;  // bytes this end has taken from its own kernel socket
  // Bytes this end's application has read from its receive ring, exactly
  // (the credits in DirectionControl::consumed may lag). Once this end has
  // closed or died, the other end compares it with what it sent: any unread
  // byte makes the end a reset, as the kernel resets a socket closed with
  // unread data.
  std::atomic<uint64_t> read;
  // Starting on TCP (version 5, docs/protocol.md section 10): a stream
  // begins on the kernel socket, and each direction moves to its ring at a
  // byte count its sender announces. `switch_at`: the bytes this end wrote
  // to the kernel socket before it switched (kNotSwitched until then);
  // `tcp_sent` and `tcp_read`: the bytes this end has written to and read
  // from the kernel socket so far as data (the prefixes), kept here so that
  // a fork's child or an exec'd image that takes the end over goes on from
  // them; `attached`: 1 once this end's receive path looks at the region
  // (before that the peer must not switch: its doorbells would read as
  // data here).
  std::atomic<uint64_t> switch_at;
  std::atomic<uint64_t> tcp_sent;
  std::atomic<uint64_t> tcp_read;
  std::atomic<uint32_t> attached;
};
static_assert(sizeof(EndpointControl) == kCacheLine);
inline constexpr uint64_t kNotSwitched = ~uint64_t{0};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Which process, of those holding one end (fork, exec), moves its bytes
// (the protocol is in transport/end_owner.h).
struct EndOwner {
  std::atomic<uint64_t> epoch;     // bumped by each takeover
  std::atomic<int32_t> owner_pid;  // the owner's pid; 0: released (closed, exit, exec)
  std::atomic<int32_t> busy;       // the owner's operations in progress
};
static_assert(sizeof(EndOwner) == 16);
static_assert(std::atomic<int32_t>::is_always_lock_free);

// The start of the shared region (a memfd created by the accepting side).
// Ring data follows at ring_offset[d], page-aligned, ring_bytes long each.
struct RegionHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t nonce;       // per-connection random value, also in the handshake
  uint64_t ring_bytes;  // size of each ring, a power of two
  uint64_t ring_offset[2];
  uint64_t region_bytes;
  std::atomic<uint32_t> holders[2];  // processes holding the server (0) / client (1) end
  alignas(kCacheLine) DirectionControl dir[2];
  EndpointControl end[2];  // indexed by side: 0 server, 1 client (version 2)
  // Each side's own view of the TCP connection, [side][0] its local and
  // [side][1] its peer address (side 0 server, 1 client), written by that
  // side when it attaches and never by the other. A program that inherits
  // the connection through exec checks its socket against it before it
  // trusts the region (docs/protocol.md, section 8). It lies after the
  // control words, inside the header page, so no earlier offset moves.
  WireAddr endpoint[2][2];
  // The owner of each side's end among the processes that hold it (side 0
  // server, 1 client), on a line of its own: the owner's operations count
  // themselves in `busy`. Zero in a fresh region; each side initialises its
  // own when it attaches. One line each: the owner's every operation
  // writes `busy`, and the two sides' owners are different processes.
  struct alignas(kCacheLine) OwnerLine {
    EndOwner o;
  } owner[2];
  // 1 once a side's end is done with the region for good (version 6): its
  // only process, which no fork, exec or spawn ever shared it with, stores
  // it after its last touch. The creator gives a region whose peer end
  // says so to its next connection with the same process
  // (transport/shm/region_cache.h); 0 in a fresh or refreshed header.
  alignas(kCacheLine) std::atomic<uint32_t> released[2];
};
static_assert(offsetof(RegionHeader, dir) % kCacheLine == 0);
static_assert(offsetof(RegionHeader, end) % kCacheLine == 0);

inline constexpr size_t kPageBytes = 4096;
static_assert(sizeof(RegionHeader) <= kPageBytes, "the header must fit its page");
inline constexpr size_t region_header_bytes() {
  return (sizeof(RegionHeader) + kPageBytes - 1) & ~(kPageBytes - 1);
}
inline constexpr size_t region_bytes_for(size_t ring_bytes) {
  return region_header_bytes() + 2 * ring_bytes;
}

}  // namespace rsock
