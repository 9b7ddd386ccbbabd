// Fuzz target: the shared region's header as the attaching side checks it
// (region_header_check in src/ring/region.h, called by shm_region_attach).
// The first byte picks how the rest is read. Mode 0: the handshake's
// region_bytes, nonce and ring_bytes, then raw header bytes of any length
// (in a buffer of exactly that length, so ASan sees any read past it).
// Mode 1: nonce and ring_bytes; region_bytes and the header are what an
// honest creator (shm_region_create) would send, then the input's bytes
// are XORed over the header. Property: an accepted header describes two
// rings of ring_bytes, a power of two, that lie inside region_bytes right
// after the header, computed without wrap-around; and the header says so.
// fuzz-sources:

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "ring/region.h"

namespace {

struct Fields {  // RegionHeader's checked fields at their offsets
  uint64_t magic, nonce, ring_bytes, region_bytes, offset0, offset1;
  uint32_t version;
};

Fields read_fields(const uint8_t* p) {
  Fields f;
  using rsock::RegionHeader;
  std::memcpy(&f.magic, p + offsetof(RegionHeader, magic), 8);
  std::memcpy(&f.version, p + offsetof(RegionHeader, version), 4);
  std::memcpy(&f.nonce, p + offsetof(RegionHeader, nonce), 8);
  std::memcpy(&f.ring_bytes, p + offsetof(RegionHeader, ring_bytes), 8);
  std::memcpy(&f.region_bytes, p + offsetof(RegionHeader, region_bytes), 8);
  std::memcpy(&f.offset0, p + offsetof(RegionHeader, ring_offset), 8);
  std::memcpy(&f.offset1, p + offsetof(RegionHeader, ring_offset) + 8, 8);
  return f;
}

void write_honest_header(uint8_t* p, uint64_t nonce, uint64_t ring_bytes) {
  using rsock::RegionHeader;
  const uint64_t magic = rsock::kRegionMagic, hdr = rsock::region_header_bytes();
  const uint64_t region = rsock::region_bytes_for(ring_bytes), off1 = hdr + ring_bytes;
  const uint32_t version = rsock::kProtocolVersion;
  std::memcpy(p + offsetof(RegionHeader, magic), &magic, 8);
  std::memcpy(p + offsetof(RegionHeader, version), &version, 4);
  std::memcpy(p + offsetof(RegionHeader, nonce), &nonce, 8);
  std::memcpy(p + offsetof(RegionHeader, ring_bytes), &ring_bytes, 8);
  std::memcpy(p + offsetof(RegionHeader, region_bytes), &region, 8);
  std::memcpy(p + offsetof(RegionHeader, ring_offset), &hdr, 8);
  std::memcpy(p + offsetof(RegionHeader, ring_offset) + 8, &off1, 8);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  const bool honest = in.ConsumeBool();
  uint64_t region_bytes = honest ? 0 : in.ConsumeIntegral<uint64_t>();
  const uint64_t nonce = in.ConsumeIntegral<uint64_t>();
  const uint64_t ring_bytes = in.ConsumeIntegral<uint64_t>();
  std::vector<uint8_t> header;
  if (honest) {
    region_bytes = rsock::region_bytes_for(ring_bytes);
    header.assign(rsock::region_header_bytes(), 0);
    write_honest_header(header.data(), nonce, ring_bytes);
    const std::vector<uint8_t> edits = in.ConsumeRemainingBytes<uint8_t>();
    for (size_t i = 0; i < edits.size() && i < header.size(); ++i) header[i] ^= edits[i];
  } else {
    header = in.ConsumeRemainingBytes<uint8_t>();
  }
  // Exactly as many bytes as there are, on the heap: ASan flags any overread.
  uint8_t* bytes = header.empty() ? nullptr : new uint8_t[header.size()];
  if (bytes) std::memcpy(bytes, header.data(), header.size());

  const int rc = rsock::region_header_check(bytes, header.size(), region_bytes, nonce, ring_bytes);
  FUZZ_CHECK(rc == 0 || rc == -EPROTO);
  if (rc == 0) {
    FUZZ_CHECK(rsock::is_power_of_two(ring_bytes));
    // The layout, in 128 bits: header, ring 0, ring 1, all inside the region.
    const unsigned __int128 hdr = rsock::region_header_bytes();
    FUZZ_CHECK(hdr + 2 * static_cast<unsigned __int128>(ring_bytes) == region_bytes);
    FUZZ_CHECK(header.size() >= sizeof(rsock::RegionHeader));
    const Fields f = read_fields(bytes);
    FUZZ_CHECK(f.magic == rsock::kRegionMagic && f.version == rsock::kProtocolVersion);
    FUZZ_CHECK(f.nonce == nonce && f.ring_bytes == ring_bytes && f.region_bytes == region_bytes);
    FUZZ_CHECK(f.offset0 == hdr && f.offset1 == hdr + ring_bytes);
  }
  delete[] bytes;
  return 0;
}
