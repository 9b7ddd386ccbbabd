// Validation of a shared region's header as the attaching side receives it
// from its peer (layout in ring/wire.h, prose in docs/protocol.md): the
// checks that decide whether the bytes at the start of a peer's memfd
// describe the region the handshake promised. Pure: reads only the bytes it
// is given, no I/O, no globals, so it can be fuzzed on arbitrary input and
// called on a mapping. Thread-safety: none needed (reads a snapshot; the
// caller owns what the peer may change after the check).
#pragma once

#include <errno.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ring/ring.h"
#include "ring/wire.h"

namespace rsock {

// The handshake's side of the check: ring_bytes and region_bytes as the
// offer states them. A ring must be a power of two no larger than
// kMaxRegionRingBytes and the region exactly its header plus two rings.
// The upper bound keeps region_bytes_for() from wrapping: with ring_bytes =
// 2^63 it would compute 4096 + 2^64 = 4096, and a 4096-byte region would
// pass while naming rings far outside the mapping (found by
// region_header_fuzz). It is the largest ring a librsock peer offers
// (kMaxRingBytes, RSOCK_RING_SIZE), which the verbs transport's 30-bit
// immediates rely on too.
inline constexpr uint64_t kMaxRegionRingBytes = uint64_t{256} << 20;
inline constexpr bool region_params_valid(uint64_t region_bytes, uint64_t ring_bytes) {
  return is_power_of_two(ring_bytes) && ring_bytes <= kMaxRegionRingBytes &&
         region_bytes == region_bytes_for(ring_bytes);
}

// Checks the header at `bytes` (`len` readable bytes, the start of the
// peer's region) against the handshake: parameters as above, then magic,
// version, nonce, ring size, region size and both ring offsets. The fields
// are copied out with memcpy, so `bytes` needs no alignment. Returns 0, or
// -EPROTO when anything disagrees or `len` cannot hold a header. Fields the
// check does not name (header_bytes, holders, the control words) are not
// looked at.
inline int region_header_check(const void* bytes, size_t len, uint64_t region_bytes, uint64_t nonce,
                               uint64_t ring_bytes) {
  if (!region_params_valid(region_bytes, ring_bytes)) return -EPROTO;
  if (bytes == nullptr || len < sizeof(RegionHeader)) return -EPROTO;
  const auto* p = static_cast<const uint8_t*>(bytes);
  auto u64_at = [p](size_t offset) {
    uint64_t v;
    std::memcpy(&v, p + offset, sizeof v);
    return v;
  };
  uint32_t version;
  std::memcpy(&version, p + offsetof(RegionHeader, version), sizeof version);
  const size_t offsets = offsetof(RegionHeader, ring_offset);
  if (u64_at(offsetof(RegionHeader, magic)) != kRegionMagic || version != kProtocolVersion ||
      u64_at(offsetof(RegionHeader, nonce)) != nonce ||
      u64_at(offsetof(RegionHeader, ring_bytes)) != ring_bytes ||
      u64_at(offsetof(RegionHeader, region_bytes)) != region_bytes ||
      u64_at(offsets + kServerToClient * sizeof(uint64_t)) != region_header_bytes() ||
      u64_at(offsets + kClientToServer * sizeof(uint64_t)) != region_header_bytes() + ring_bytes)
    return -EPROTO;
  return 0;
}

}  // namespace rsock
