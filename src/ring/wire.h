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
inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kCacheLine = 64;

// Control words of one direction. The producer writes `head`,
// `producer_flags` and `producer_waiting`; the consumer writes `consumed`,
// `consumer_flags` and `consumer_waiting`. The two groups live on separate
// cache lines so that a streaming producer and consumer do not false-share.
struct DirectionControl {
  alignas(kCacheLine) std::atomic<uint64_t> head;  // bytes published
  std::atomic<uint32_t> producer_flags;            // LocalFlag bits of the producer
  std::atomic<uint32_t> producer_waiting;          // producer threads asleep on credits
  alignas(kCacheLine) std::atomic<uint64_t> consumed;  // bytes consumed (credits)
  std::atomic<uint32_t> consumer_flags;                // LocalFlag bits of the consumer
  std::atomic<uint32_t> consumer_waiting;              // consumer threads asleep on data
};
static_assert(sizeof(DirectionControl) == 2 * kCacheLine);
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
  // Each side's own view of the TCP connection, [side][0] its local and
  // [side][1] its peer address (side 0 server, 1 client), written by that
  // side when it attaches and never by the other. A program that inherits
  // the connection through exec checks its socket against it before it
  // trusts the region (docs/protocol.md, section 8). It lies after the
  // control words, inside the header page, so no earlier offset moves.
  WireAddr endpoint[2][2];
};
static_assert(offsetof(RegionHeader, dir) % kCacheLine == 0);

inline constexpr size_t kPageBytes = 4096;
static_assert(sizeof(RegionHeader) <= kPageBytes, "the header must fit its page");
inline constexpr size_t region_header_bytes() {
  return (sizeof(RegionHeader) + kPageBytes - 1) & ~(kPageBytes - 1);
}
inline constexpr size_t region_bytes_for(size_t ring_bytes) {
  return region_header_bytes() + 2 * ring_bytes;
}

}  // namespace rsock
