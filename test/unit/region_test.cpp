// Unit tests for src/ring/region.h, the pure check of a shared region's
// header that shm_region_attach makes: an honest header passes, each field
// that disagrees with the handshake fails, short and unaligned buffers are
// handled; and the input region_header_fuzz found (a ring of 2^63 bytes,
// whose region size wraps around to 4096) is refused by the check and by
// shm_region_attach on a real sealed memfd.

#include "ring/region.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "transport/shm/shm_channel.h"

namespace rsock {
namespace {

constexpr uint64_t kNonce = 0x0123456789abcdefull;

// The bytes an honest creator writes (as shm_region_create does).
std::vector<uint8_t> honest_header(uint64_t nonce, uint64_t ring_bytes) {
  std::vector<uint8_t> h(region_header_bytes(), 0);
  auto put = [&h](size_t off, const void* v, size_t n) { std::memcpy(h.data() + off, v, n); };
  const uint64_t magic = kRegionMagic, hdr = region_header_bytes();
  const uint64_t region = region_bytes_for(ring_bytes), off1 = hdr + ring_bytes;
  const uint32_t version = kProtocolVersion;
  put(offsetof(RegionHeader, magic), &magic, 8);
  put(offsetof(RegionHeader, version), &version, 4);
  put(offsetof(RegionHeader, nonce), &nonce, 8);
  put(offsetof(RegionHeader, ring_bytes), &ring_bytes, 8);
  put(offsetof(RegionHeader, region_bytes), &region, 8);
  put(offsetof(RegionHeader, ring_offset), &hdr, 8);
  put(offsetof(RegionHeader, ring_offset) + 8, &off1, 8);
  return h;
}

TEST(RegionHeaderCheck, HonestHeaderPasses) {
  for (uint64_t ring : {uint64_t{4096}, uint64_t{1} << 20, uint64_t{kMaxRingBytes}}) {
    const std::vector<uint8_t> h = honest_header(kNonce, ring);
    EXPECT_EQ(region_header_check(h.data(), h.size(), region_bytes_for(ring), kNonce, ring), 0)
        << ring;
  }
}

TEST(RegionHeaderCheck, EveryCheckedFieldMatters) {
  const uint64_t ring = 8192, region = region_bytes_for(ring);
  const std::vector<size_t> fields = {
      offsetof(RegionHeader, magic),          offsetof(RegionHeader, version),
      offsetof(RegionHeader, nonce),          offsetof(RegionHeader, ring_bytes),
      offsetof(RegionHeader, region_bytes),   offsetof(RegionHeader, ring_offset),
      offsetof(RegionHeader, ring_offset) + 8};
  for (size_t off : fields) {
    std::vector<uint8_t> h = honest_header(kNonce, ring);
    h[off] ^= 1;
    EXPECT_EQ(region_header_check(h.data(), h.size(), region, kNonce, ring), -EPROTO) << off;
  }
  const std::vector<uint8_t> h = honest_header(kNonce, ring);
  EXPECT_EQ(region_header_check(h.data(), h.size(), region, kNonce + 1, ring), -EPROTO);
  EXPECT_EQ(region_header_check(h.data(), h.size(), region + 4096, kNonce, ring), -EPROTO);
  EXPECT_EQ(region_header_check(h.data(), h.size(), region, kNonce, 12288), -EPROTO);
  // Fields the check does not name are not looked at.
  std::vector<uint8_t> other = h;
  other[offsetof(RegionHeader, header_bytes)] ^= 0xff;
  EXPECT_EQ(region_header_check(other.data(), other.size(), region, kNonce, ring), 0);
}

TEST(RegionHeaderCheck, ShortAndUnalignedBuffers) {
  const uint64_t ring = 4096, region = region_bytes_for(ring);
  const std::vector<uint8_t> h = honest_header(kNonce, ring);
  EXPECT_EQ(region_header_check(nullptr, 0, region, kNonce, ring), -EPROTO);
  EXPECT_EQ(region_header_check(h.data(), sizeof(RegionHeader) - 1, region, kNonce, ring), -EPROTO);
  EXPECT_EQ(region_header_check(h.data(), sizeof(RegionHeader), region, kNonce, ring), 0);
  alignas(8) static uint8_t shifted[region_header_bytes() + 1];
  std::memcpy(shifted + 1, h.data(), region_header_bytes());
  EXPECT_EQ(region_header_check(shifted + 1, region_header_bytes(), region, kNonce, ring), 0);
}

TEST(RegionHeaderCheck, RingLimitIsTheConfigLimit) {
  static_assert(kMaxRegionRingBytes == kMaxRingBytes);
  EXPECT_TRUE(region_params_valid(region_bytes_for(kMaxRingBytes), kMaxRingBytes));
  EXPECT_FALSE(region_params_valid(region_bytes_for(2 * kMaxRingBytes), 2 * kMaxRingBytes));
}

// The input region_header_fuzz found, decoded as the target reads it: the
// first flag, then the integers, are taken from the end of the input
// (FuzzedDataProvider), each little-endian as stored; in the honest mode
// (flag 1) the header is what shm_region_create would write for that ring,
// with the input's leading bytes XORed over it.
TEST(RegionHeaderCheck, FuzzRegressionRingSizeThatWrapsTheRegion) {
  std::ifstream in("test/fuzz/corpus/region_header/regress-ring-wrap", std::ios::binary);
  ASSERT_TRUE(in) << "run the tests from the repository root";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string input = ss.str();
  ASSERT_EQ(input.size(), 34u);
  size_t end = input.size();
  auto take_u64 = [&]() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | static_cast<uint8_t>(input[--end]);
    return v;
  };
  ASSERT_EQ(input[--end] & 1, 1) << "honest mode";
  const uint64_t nonce = take_u64();
  const uint64_t ring = take_u64();
  EXPECT_EQ(ring, uint64_t{1} << 63);
  std::vector<uint8_t> h = honest_header(nonce, ring);
  for (size_t i = 0; i < end; ++i) h[i] ^= static_cast<uint8_t>(input[i]);
  const uint64_t region = region_bytes_for(ring);
  EXPECT_EQ(region, region_header_bytes()) << "2 * 2^63 wraps to 0";
  EXPECT_FALSE(region_params_valid(region, ring));
  EXPECT_EQ(region_header_check(h.data(), h.size(), region, nonce, ring), -EPROTO);
}

// The same offer through shm_region_attach: a sealed 4096-byte memfd whose
// header claims two rings of 2^63 bytes. Accepted, it would have the stream
// write far outside the mapping.
TEST(RegionHeaderCheck, AttachRefusesARingThatWrapsTheRegion) {
  const uint64_t ring = uint64_t{1} << 63;
  const std::vector<uint8_t> h = honest_header(kNonce, ring);
  int fd = memfd_create("rsock-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, static_cast<off_t>(region_header_bytes())), 0);
  ASSERT_EQ(pwrite(fd, h.data(), h.size(), 0), static_cast<ssize_t>(h.size()));
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
  void* map = nullptr;
  EXPECT_EQ(shm_region_attach(fd, 0, region_header_bytes(), kNonce, ring, &map), -EPROTO);
  EXPECT_EQ(map, nullptr);
  close(fd);
}

}  // namespace
}  // namespace rsock
