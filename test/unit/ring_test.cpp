// Unit tests for src/ring: ring_split at every boundary (empty, exactly to the
// end, wrap by one byte, a whole ring, positions beyond 2^32 and near 2^64,
// plus an exhaustive check on small rings), CreditLedger (stale, duplicate
// and reordered credits, violations) and ReceiveWindow (stale arrivals,
// violations, the credit rule). Also the shm layout rules of src/ring/wire.h,
// re-checked at run time on real objects.

#include "ring/ring.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ring/handshake.h"
#include "ring/wire.h"

namespace rsock {
namespace {

// ---------------------------------------------------------------- ring_split

TEST(RingSplit, ZeroLengthGivesNoSpan) {
  RingSpan s[2] = {{7, 7}, {7, 7}};
  EXPECT_EQ(ring_split(0, 0, 4096, s), 0);
  EXPECT_EQ(ring_split(4095, 0, 4096, s), 0);
  EXPECT_EQ(ring_split(uint64_t{1} << 40, 0, 4096, s), 0);
  // Nothing written.
  EXPECT_EQ(s[0].offset, 7u);
  EXPECT_EQ(s[0].len, 7u);
}

TEST(RingSplit, InsideTheRing) {
  RingSpan s[2];
  ASSERT_EQ(ring_split(10, 100, 4096, s), 1);
  EXPECT_EQ(s[0].offset, 10u);
  EXPECT_EQ(s[0].len, 100u);
}

TEST(RingSplit, ExactlyToTheEndIsOneSpan) {
  RingSpan s[2];
  ASSERT_EQ(ring_split(100, 4096 - 100, 4096, s), 1);
  EXPECT_EQ(s[0].offset, 100u);
  EXPECT_EQ(s[0].len, 4096u - 100);
  ASSERT_EQ(ring_split(4095, 1, 4096, s), 1);
  EXPECT_EQ(s[0].offset, 4095u);
  EXPECT_EQ(s[0].len, 1u);
}

TEST(RingSplit, WrapByOneByte) {
  RingSpan s[2];
  ASSERT_EQ(ring_split(100, 4096 - 99, 4096, s), 2);
  EXPECT_EQ(s[0].offset, 100u);
  EXPECT_EQ(s[0].len, 4096u - 100);
  EXPECT_EQ(s[1].offset, 0u);
  EXPECT_EQ(s[1].len, 1u);
  ASSERT_EQ(ring_split(4095, 2, 4096, s), 2);
  EXPECT_EQ(s[0].offset, 4095u);
  EXPECT_EQ(s[0].len, 1u);
  EXPECT_EQ(s[1].offset, 0u);
  EXPECT_EQ(s[1].len, 1u);
}

TEST(RingSplit, WholeRing) {
  RingSpan s[2];
  // From offset 0: one span covering the ring.
  ASSERT_EQ(ring_split(0, 4096, 4096, s), 1);
  EXPECT_EQ(s[0].offset, 0u);
  EXPECT_EQ(s[0].len, 4096u);
  ASSERT_EQ(ring_split(3 * 4096, 4096, 4096, s), 1);
  EXPECT_EQ(s[0].offset, 0u);
  // From the middle: the tail, then the head up to the start offset.
  ASSERT_EQ(ring_split(4096 + 1000, 4096, 4096, s), 2);
  EXPECT_EQ(s[0].offset, 1000u);
  EXPECT_EQ(s[0].len, 4096u - 1000);
  EXPECT_EQ(s[1].offset, 0u);
  EXPECT_EQ(s[1].len, 1000u);
}

TEST(RingSplit, PositionsBeyond32Bits) {
  RingSpan s[2];
  const uint64_t base = (uint64_t{5} << 32) + 7;  // offset 7 in any ring up to 2^32
  ASSERT_EQ(ring_split(base, 10, 4096, s), 1);
  EXPECT_EQ(s[0].offset, 7u);
  const size_t big = size_t{1} << 33;  // an 8 GiB ring: offsets above 2^32
  const uint64_t pos = (uint64_t{3} << 33) + (uint64_t{1} << 32) + 5;
  ASSERT_EQ(ring_split(pos, big, big, s), 2);
  EXPECT_EQ(s[0].offset, (size_t{1} << 32) + 5);
  EXPECT_EQ(s[0].len, big - ((size_t{1} << 32) + 5));
  EXPECT_EQ(s[1].offset, 0u);
  EXPECT_EQ(s[1].len, (size_t{1} << 32) + 5);
}

TEST(RingSplit, PositionsNearTwoToThe64Wrap) {
  RingSpan s[2];
  // 2^64 - 2 sits at offset size - 2 in every power-of-two ring.
  ASSERT_EQ(ring_split(UINT64_MAX - 1, 4, 8, s), 2);
  EXPECT_EQ(s[0].offset, 6u);
  EXPECT_EQ(s[0].len, 2u);
  EXPECT_EQ(s[1].offset, 0u);
  EXPECT_EQ(s[1].len, 2u);
}

// Every (pos, len) on small rings: the spans, walked in order, visit exactly
// the offsets (pos + i) mod size for i in [0, len), and every span is inside.
TEST(RingSplit, ExhaustiveSmallRings) {
  for (size_t size : {1, 2, 4, 8, 16, 32}) {
    std::vector<uint64_t> bases = {0, size, uint64_t{1} << 32, (uint64_t{1} << 63) - 3 * size};
    for (uint64_t base : bases) {
      for (uint64_t pos = base; pos < base + 2 * size; ++pos) {
        for (size_t len = 0; len <= size; ++len) {
          RingSpan s[2];
          const int n = ring_split(pos, len, size, s);
          ASSERT_EQ(n, len == 0 ? 0 : ((pos % size) + len > size ? 2 : 1))
              << "size " << size << " pos " << pos << " len " << len;
          std::vector<size_t> visited;
          for (int k = 0; k < n; ++k) {
            ASSERT_GT(s[k].len, 0u);
            ASSERT_LE(s[k].offset + s[k].len, size);
            for (size_t i = 0; i < s[k].len; ++i) visited.push_back(s[k].offset + i);
          }
          ASSERT_EQ(visited.size(), len);
          for (size_t i = 0; i < len; ++i) ASSERT_EQ(visited[i], (pos + i) % size);
        }
      }
    }
  }
}

TEST(Ring, IsPowerOfTwo) {
  EXPECT_FALSE(is_power_of_two(0));
  EXPECT_TRUE(is_power_of_two(1));
  EXPECT_TRUE(is_power_of_two(4096));
  EXPECT_FALSE(is_power_of_two(4097));
  EXPECT_FALSE(is_power_of_two(3 << 20));
  EXPECT_TRUE(is_power_of_two(uint64_t{1} << 63));
  EXPECT_FALSE(is_power_of_two(UINT64_MAX));
}

// -------------------------------------------------------------- CreditLedger

TEST(CreditLedger, StartsWithTheWholeRing) {
  CreditLedger l(4096);
  EXPECT_EQ(l.ring_bytes(), 4096u);
  EXPECT_EQ(l.available(), 4096u);
  EXPECT_EQ(l.in_flight(), 0u);
  EXPECT_EQ(l.sent(), 0u);
  EXPECT_EQ(l.credited(), 0u);
}

TEST(CreditLedger, SentBytesUseSpaceUntilCredited) {
  CreditLedger l(4096);
  l.on_sent(1000);
  EXPECT_EQ(l.in_flight(), 1000u);
  EXPECT_EQ(l.available(), 3096u);
  l.on_sent(3096);
  EXPECT_EQ(l.available(), 0u);
  ASSERT_TRUE(l.on_credit(2048));
  EXPECT_EQ(l.credited(), 2048u);
  EXPECT_EQ(l.available(), 2048u);
  ASSERT_TRUE(l.on_credit(4096));
  EXPECT_EQ(l.available(), 4096u);
}

TEST(CreditLedger, StaleDuplicateAndReorderedCreditsAreHarmless) {
  CreditLedger l(4096);
  l.on_sent(4096);
  ASSERT_TRUE(l.on_credit(3000));
  ASSERT_TRUE(l.on_credit(3000));  // duplicate
  EXPECT_EQ(l.credited(), 3000u);
  ASSERT_TRUE(l.on_credit(1000));  // stale: arrived after a larger one
  EXPECT_EQ(l.credited(), 3000u);
  EXPECT_EQ(l.available(), 3000u);
  ASSERT_TRUE(l.on_credit(0));
  EXPECT_EQ(l.credited(), 3000u);
  ASSERT_TRUE(l.on_credit(3500));
  EXPECT_EQ(l.credited(), 3500u);
}

TEST(CreditLedger, CreditBeyondSentIsAViolationAndChangesNothing) {
  CreditLedger l(4096);
  EXPECT_FALSE(l.on_credit(1));
  l.on_sent(100);
  ASSERT_TRUE(l.on_credit(50));
  EXPECT_FALSE(l.on_credit(101));
  EXPECT_EQ(l.credited(), 50u);
  EXPECT_EQ(l.available(), 4096u - 50);
  EXPECT_TRUE(l.on_credit(100));  // exactly what was sent is fine
  EXPECT_EQ(l.available(), 4096u);
}

TEST(CreditLedger, TotalsBeyond32Bits) {
  const size_t ring = size_t{1} << 20;
  CreditLedger l(ring);
  const uint64_t target = (uint64_t{1} << 32) + 3 * ring;
  while (l.sent() < target) {
    l.on_sent(l.available() - 1);
    ASSERT_EQ(l.available(), 1u);
    ASSERT_TRUE(l.on_credit(l.sent() - 7));
    ASSERT_EQ(l.in_flight(), 7u);
  }
  EXPECT_GT(l.sent(), uint64_t{1} << 32);
  EXPECT_FALSE(l.on_credit(l.sent() + 1));
  EXPECT_EQ(l.available(), ring - 7);
}

// ------------------------------------------------------------- ReceiveWindow

TEST(ReceiveWindow, ArrivalsAndConsumption) {
  ReceiveWindow w(4096);
  EXPECT_EQ(w.ring_bytes(), 4096u);
  EXPECT_EQ(w.readable(), 0u);
  ASSERT_TRUE(w.on_arrival(1000));
  EXPECT_EQ(w.arrived(), 1000u);
  EXPECT_EQ(w.readable(), 1000u);
  w.on_consumed(400);
  EXPECT_EQ(w.consumed(), 400u);
  EXPECT_EQ(w.readable(), 600u);
}

TEST(ReceiveWindow, StaleArrivalsAreIgnored) {
  ReceiveWindow w(4096);
  ASSERT_TRUE(w.on_arrival(3000));
  w.on_consumed(2000);
  EXPECT_TRUE(w.on_arrival(1000));  // stale, even below consumed
  EXPECT_EQ(w.arrived(), 3000u);
  EXPECT_TRUE(w.on_arrival(3000));  // duplicate
  EXPECT_EQ(w.readable(), 1000u);
  EXPECT_TRUE(w.on_arrival(0));
  EXPECT_EQ(w.arrived(), 3000u);
}

TEST(ReceiveWindow, MoreThanARingUnconsumedIsAViolation) {
  ReceiveWindow w(4096);
  EXPECT_TRUE(w.on_arrival(4096));  // exactly a full ring
  EXPECT_FALSE(w.on_arrival(4097));
  EXPECT_EQ(w.arrived(), 4096u);  // the bogus head is not applied
  w.on_consumed(100);
  EXPECT_TRUE(w.on_arrival(4196));
  EXPECT_FALSE(w.on_arrival(4197));
  EXPECT_FALSE(w.on_arrival(UINT64_MAX));
  EXPECT_EQ(w.arrived(), 4196u);
  EXPECT_EQ(w.readable(), 4096u);
}

TEST(ReceiveWindow, GrantsAfterHalfTheRingIsFreed) {
  ReceiveWindow w(4096);
  ASSERT_TRUE(w.on_arrival(4096));
  EXPECT_FALSE(w.should_grant(false));  // nothing freed
  w.on_consumed(2047);
  EXPECT_FALSE(w.should_grant(false));
  w.on_consumed(1);
  EXPECT_TRUE(w.should_grant(false));  // exactly half
  w.on_granted();
  EXPECT_EQ(w.granted(), 2048u);
  EXPECT_FALSE(w.should_grant(false));  // counted from the last grant
  w.on_consumed(2047);
  EXPECT_FALSE(w.should_grant(false));
  w.on_consumed(1);
  EXPECT_TRUE(w.should_grant(false));
}

TEST(ReceiveWindow, StalledSenderGetsAnyFreedByte) {
  ReceiveWindow w(4096);
  ASSERT_TRUE(w.on_arrival(4096));
  EXPECT_FALSE(w.should_grant(true));  // stalled, but nothing freed yet
  w.on_consumed(1);
  EXPECT_FALSE(w.should_grant(false));
  EXPECT_TRUE(w.should_grant(true));
  w.on_granted();
  EXPECT_EQ(w.granted(), 1u);
  EXPECT_FALSE(w.should_grant(true));  // nothing freed since the grant
}

// --------------------------------------------------------------- wire layout

TEST(WireLayout, DirectionControlGroupsOnSeparateCacheLines) {
  // Run-time values so that a layout change fails here and not only in the
  // static_asserts.
  volatile size_t line = kCacheLine;
  EXPECT_EQ(line, 64u);
  EXPECT_EQ(sizeof(DirectionControl), 3 * line);
  EXPECT_EQ(alignof(DirectionControl), line);
  EXPECT_EQ(offsetof(DirectionControl, head), 0u);
  EXPECT_EQ(offsetof(DirectionControl, consumed), line);
  EXPECT_LT(offsetof(DirectionControl, producer_flags), line);
  EXPECT_LT(offsetof(DirectionControl, producer_sleepers), line);
  EXPECT_GE(offsetof(DirectionControl, consumer_flags), line);
  EXPECT_GE(offsetof(DirectionControl, consumer_sleepers), line);
  EXPECT_LE(offsetof(DirectionControl, consumer_sleepers) + sizeof(uint64_t), 2 * line);
  // Version 4: the page-giving words on a third line, the producer's
  // `writing` among them (off the line the consumer polls).
  EXPECT_EQ(offsetof(DirectionControl, trim_seq), 2 * line);
  EXPECT_GE(offsetof(DirectionControl, writing), 2 * line);
  EXPECT_LE(offsetof(DirectionControl, writing) + sizeof(uint32_t), 3 * line);
  EXPECT_LE(offsetof(DirectionControl, trimmed) + sizeof(uint64_t), 3 * line);
}

TEST(WireLayout, RegionHeaderPlacesControlOnCacheLines) {
  EXPECT_EQ(offsetof(RegionHeader, dir) % kCacheLine, 0u);
  EXPECT_EQ(offsetof(RegionHeader, magic), 0u);
  // The fixed fields fit before the first control line.
  EXPECT_LE(offsetof(RegionHeader, region_bytes) + sizeof(uint64_t), offsetof(RegionHeader, dir));
  // Real objects: every control word group starts a cache line.
  std::vector<RegionHeader> headers(3);
  for (const RegionHeader& h : headers) {
    for (int d = 0; d < 2; ++d) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(&h.dir[d].head) % kCacheLine, 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(&h.dir[d].consumed) % kCacheLine, 0u);
      EXPECT_NE(reinterpret_cast<uintptr_t>(&h.dir[d].producer_sleepers) / kCacheLine,
                reinterpret_cast<uintptr_t>(&h.dir[d].consumed) / kCacheLine);
    }
    EXPECT_EQ(reinterpret_cast<uintptr_t>(&h.dir[1]) - reinterpret_cast<uintptr_t>(&h.dir[0]),
              3 * kCacheLine);
  }
}

TEST(WireLayout, HeaderIsPageAlignedAndRegionSized) {
  volatile size_t page = kPageBytes;
  EXPECT_EQ(page, 4096u);
  EXPECT_EQ(region_header_bytes() % page, 0u);
  EXPECT_GE(region_header_bytes(), sizeof(RegionHeader));
  EXPECT_LT(region_header_bytes() - sizeof(RegionHeader), page);  // the smallest such size
  for (size_t ring : {size_t{4096}, size_t{1} << 16, size_t{1} << 20, size_t{1} << 30}) {
    volatile size_t r = ring;
    EXPECT_EQ(region_bytes_for(r), region_header_bytes() + 2 * r);
    EXPECT_EQ(region_bytes_for(r) % page, 0u);
  }
}

TEST(WireLayout, HandshakeMessagesHaveFixedSizes) {
  EXPECT_EQ(sizeof(HelloMsg), 16u);
  EXPECT_EQ(sizeof(WireAddr), 20u);
  EXPECT_EQ(offsetof(WireAddr, port), 16u);
  EXPECT_EQ(offsetof(OfferMsg, nonce), 8u);
  EXPECT_EQ(offsetof(OfferMsg, region_offset), 32u);
  EXPECT_EQ(offsetof(OfferMsg, server), 40u);
  EXPECT_EQ(offsetof(OfferMsg, client), 60u);
  EXPECT_EQ(sizeof(OfferMsg), 80u);
  EXPECT_EQ(sizeof(AnswerMsg), 16u);
  EXPECT_EQ(offsetof(AnswerMsg, nonce), 8u);
  EXPECT_EQ(static_cast<uint32_t>(MsgType::kHello), 1u);
  EXPECT_EQ(static_cast<uint32_t>(MsgType::kOffer), 2u);
  EXPECT_EQ(static_cast<uint32_t>(MsgType::kAnswer), 3u);
  EXPECT_EQ(static_cast<uint32_t>(MsgType::kProof), 4u);
}

TEST(WireLayout, MagicSpellsTheProtocolName) {
  char text[9] = {};
  const uint64_t magic = kRegionMagic;
  memcpy(text, &magic, 8);  // little-endian host
  EXPECT_STREQ(text, "rrsockr1");
  EXPECT_EQ(kProtocolVersion, 6u);
}

TEST(WireLayout, EndpointLinesAreAppendedOnTheirOwnCacheLines) {
  // Version 2 appended end[] after dir[]: nothing before it moved.
  EXPECT_EQ(offsetof(RegionHeader, end),
            offsetof(RegionHeader, dir) + 2 * sizeof(DirectionControl));
  EXPECT_EQ(sizeof(EndpointControl), kCacheLine);
  EXPECT_EQ(offsetof(RegionHeader, end) % kCacheLine, 0u);
  EXPECT_LE(sizeof(RegionHeader), kPageBytes);
}

}  // namespace
}  // namespace rsock
