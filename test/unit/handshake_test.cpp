// Unit tests for the pairing messages (src/ring/handshake.h): every encoder
// round-trips through its decoder, every field a peer controls is checked
// (each check below fails if its condition is removed), and the proof
// scanners tell a proof from application data by a prefix, so that a
// server never consumes a plain client's bytes; likewise the move frames of
// a connection that moves to another process (their scanner tells them from
// any other byte on the kernel socket, and refuses fields no librsock
// writes).
#include "ring/handshake.h"

#include <gtest/gtest.h>
#include <string.h>

#include "config/config.h"

namespace rsock {
namespace {

WireAddr addr(uint8_t last, uint16_t port) {
  WireAddr w = {};
  w.addr[10] = w.addr[11] = 0xff;
  w.addr[12] = 10;
  w.addr[15] = last;
  w.port = port;
  return w;
}

TEST(Handshake, HelloDecodesOnlyItsOwnTypeAndVersion) {
  HelloMsg m = {static_cast<uint32_t>(MsgType::kHello), kHandshakeVersion, 0};
  EXPECT_TRUE(decode_hello(&m, sizeof m, MsgType::kHello));
  EXPECT_FALSE(decode_hello(&m, sizeof m, MsgType::kProof));
  EXPECT_FALSE(decode_hello(&m, sizeof m - 1, MsgType::kHello));
  m.version = 1;  // the version that passed the TCP socket itself
  EXPECT_FALSE(decode_hello(&m, sizeof m, MsgType::kHello));
  m.version = 2;  // before the Proof carried the client's token
  EXPECT_FALSE(decode_hello(&m, sizeof m, MsgType::kHello));
  EXPECT_FALSE(decode_hello(&m, 8, MsgType::kHello));  // version 2's size
}

TEST(Handshake, OfferChecksItsRingAndRegion) {
  OfferMsg m = {};
  m.type = static_cast<uint32_t>(MsgType::kOffer);
  m.version = kHandshakeVersion;
  m.ring_bytes = 1 << 16;
  m.region_bytes = region_bytes_for(m.ring_bytes);
  OfferMsg out;
  EXPECT_TRUE(decode_offer(&m, sizeof m, &out));
  OfferMsg bad = m;
  bad.ring_bytes = 3 << 12;  // not a power of two
  bad.region_bytes = region_bytes_for(bad.ring_bytes);
  EXPECT_FALSE(decode_offer(&bad, sizeof bad, &out));
  bad = m;
  bad.ring_bytes = uint64_t{1} << 63;  // region_bytes_for would wrap
  bad.region_bytes = region_bytes_for(bad.ring_bytes);
  EXPECT_FALSE(decode_offer(&bad, sizeof bad, &out));
  bad = m;
  bad.ring_bytes = kMinRingBytes / 2;
  bad.region_bytes = region_bytes_for(bad.ring_bytes);
  EXPECT_FALSE(decode_offer(&bad, sizeof bad, &out));
  bad = m;
  bad.region_bytes += 4096;
  EXPECT_FALSE(decode_offer(&bad, sizeof bad, &out));
  bad = m;
  bad.region_offset = 5 * kPageBytes;  // a region further in the file
  EXPECT_TRUE(decode_offer(&bad, sizeof bad, &out));
  EXPECT_EQ(out.region_offset, 5 * kPageBytes);
  bad.region_offset += 512;  // not on a page
  EXPECT_FALSE(decode_offer(&bad, sizeof bad, &out));
  bad = m;
  bad.type = static_cast<uint32_t>(MsgType::kAnswer);
  EXPECT_FALSE(decode_offer(&bad, sizeof bad, &out));
  EXPECT_FALSE(decode_offer(&m, sizeof m + 1, &out));
  EXPECT_FALSE(decode_offer(&m, sizeof m - 8, &out));  // version 3's size
}

TEST(Handshake, AnswerAcceptsOnlyWithTheNonce) {
  AnswerMsg a = {static_cast<uint32_t>(MsgType::kAnswer),
                 static_cast<uint32_t>(AnswerCode::kAccept), 42};
  EXPECT_TRUE(decode_answer_accepts(&a, sizeof a, 42));
  EXPECT_FALSE(decode_answer_accepts(&a, sizeof a, 43));
  a.code = static_cast<uint32_t>(AnswerCode::kDecline);
  EXPECT_FALSE(decode_answer_accepts(&a, sizeof a, 42));
}

TEST(Handshake, ConnectPrivRoundTripsAndFitsTheCmRequest) {
  ConnectInfo in;
  in.ring_log2 = 20;
  in.flags = kPrivClientListens;
  in.client = addr(2, 40000);
  in.server = addr(1, 6379);
  uint8_t buf[kConnectPrivBytes + 6] = {};  // rdma_cm may pad: extra bytes are ignored
  encode_connect_priv(in, buf);
  ConnectInfo out;
  ASSERT_TRUE(decode_connect_priv(buf, sizeof buf, &out));
  EXPECT_EQ(out.ring_log2, 20);
  EXPECT_EQ(out.flags, kPrivClientListens);
  EXPECT_EQ(memcmp(&out.client, &in.client, sizeof in.client), 0);
  EXPECT_EQ(memcmp(&out.server, &in.server, sizeof in.server), 0);
  EXPECT_EQ(out.challenge, 0u);
  EXPECT_LE(kConnectPrivBytes, 56u);
  EXPECT_FALSE(decode_connect_priv(buf, kConnectPrivBytes - 1, &out));
  EXPECT_FALSE(decode_connect_priv(nullptr, 0, &out));
}

TEST(Handshake, ConnectPrivRejectsWhatNoPeerSends) {
  ConnectInfo in;
  in.ring_log2 = 20;
  in.client = addr(2, 1);
  in.server = addr(1, 2);
  uint8_t buf[kConnectPrivBytes];
  ConnectInfo out;
  for (int log2 : {11, 29, 63}) {  // below 4 KiB, above 256 MiB
    in.ring_log2 = log2;
    encode_connect_priv(in, buf);
    EXPECT_FALSE(decode_connect_priv(buf, sizeof buf, &out)) << log2;
  }
  in.ring_log2 = 20;
  in.flags = 0x80;  // an unknown flag
  encode_connect_priv(in, buf);
  EXPECT_FALSE(decode_connect_priv(buf, sizeof buf, &out));
  in.flags = kPrivReverse;  // a reverse request must carry the server's challenge
  in.challenge = 0;
  encode_connect_priv(in, buf);
  EXPECT_FALSE(decode_connect_priv(buf, sizeof buf, &out));
  in.challenge = 7;
  encode_connect_priv(in, buf);
  EXPECT_TRUE(decode_connect_priv(buf, sizeof buf, &out));
  EXPECT_EQ(out.challenge, 7u);
  in.flags = 0;  // and a forward one none
  encode_connect_priv(in, buf);
  EXPECT_FALSE(decode_connect_priv(buf, sizeof buf, &out));
  in.challenge = 0;
  encode_connect_priv(in, buf);
  buf[0] ^= 1;  // magic
  EXPECT_FALSE(decode_connect_priv(buf, sizeof buf, &out));
}

TEST(Handshake, AcceptPrivRoundTrips) {
  AcceptInfo in;
  in.ring_log2 = 16;
  in.client_port = 5555;
  in.challenge = 0x0123456789abcdefull;
  uint8_t buf[kAcceptPrivBytes];
  encode_accept_priv(in, buf);
  AcceptInfo out;
  ASSERT_TRUE(decode_accept_priv(buf, sizeof buf, &out));
  EXPECT_EQ(out.ring_log2, 16);
  EXPECT_EQ(out.client_port, 5555);
  EXPECT_EQ(out.challenge, in.challenge);
  buf[5] = 1;  // a reserved byte
  EXPECT_FALSE(decode_accept_priv(buf, sizeof buf, &out));
}

TEST(Handshake, ClientProofIsToldFromDataByItsPrefix) {
  ClientProof in;
  in.challenge = 99;
  for (size_t i = 0; i < kProofKeyBytes; ++i) in.key[i] = static_cast<uint8_t>(i * 7);
  in.ring = {0xabcd, 0x7f0000001000ull};
  uint8_t buf[kClientProofBytes];
  encode_client_proof(in, buf);
  ClientProof out;
  ASSERT_EQ(scan_client_proof(buf, sizeof buf, &out), ProofScan::kProof);
  EXPECT_EQ(out.challenge, 99u);
  EXPECT_EQ(memcmp(out.key, in.key, kProofKeyBytes), 0);
  EXPECT_EQ(out.ring.rkey, 0xabcdu);
  EXPECT_EQ(out.ring.addr, 0x7f0000001000ull);
  // Any shorter prefix of a proof: wait for more. Application data: at once
  // not a proof, whatever its length (even a single byte).
  for (size_t n = 1; n < kClientProofBytes; ++n)
    EXPECT_EQ(scan_client_proof(buf, n, &out), ProofScan::kNeedMore) << n;
  const char* data[] = {"G", "GET / HTTP/1.1\r\n", "*1\r\n$4\r\nPING\r\n", "rsock/S2"};
  for (const char* d : data)
    EXPECT_EQ(scan_client_proof(d, strlen(d), &out), ProofScan::kNotProof) << d;
  uint8_t prefix_then_data[kClientProofBytes];
  memcpy(prefix_then_data, buf, sizeof buf);
  prefix_then_data[7] = 'X';
  EXPECT_EQ(scan_client_proof(prefix_then_data, 8, &out), ProofScan::kNotProof);
}

TEST(Handshake, ServerProofCarriesAcceptOrDecline) {
  ServerProof in;
  in.accept = true;
  in.key[3] = 9;
  in.ring = {5, 6};
  uint8_t buf[kServerProofBytes];
  encode_server_proof(in, buf);
  ServerProof out;
  ASSERT_EQ(scan_server_proof(buf, sizeof buf, &out), ProofScan::kProof);
  EXPECT_TRUE(out.accept);
  EXPECT_EQ(out.key[3], 9);
  EXPECT_EQ(out.ring.rkey, 5u);
  EXPECT_EQ(out.ring.addr, 6u);
  in.accept = false;  // a decline announces no ring
  encode_server_proof(in, buf);
  ASSERT_EQ(scan_server_proof(buf, sizeof buf, &out), ProofScan::kProof);
  EXPECT_FALSE(out.accept);
  EXPECT_EQ(out.ring.rkey, 0u);
  EXPECT_EQ(out.ring.addr, 0u);
  buf[8] = 2;  // neither accept nor decline
  EXPECT_EQ(scan_server_proof(buf, sizeof buf, &out), ProofScan::kNotProof);
  EXPECT_EQ(scan_server_proof(buf, 3, &out), ProofScan::kNeedMore);
}

MoveFrame sample_move() {
  MoveFrame f;
  f.type = MoveType::kMove;
  f.ring_log2 = 20;
  f.mtu = 3;
  f.flags = kMoveFin;
  f.qpn = 0x123456;
  f.psn = 0xabcdef;
  f.ring = {0x1234, 0x7f0000002000ull};
  f.nonce = 0x1122334455667788ull;
  f.rx_consumed = 5000000000ull;
  f.tx_sent = 6000000000ull;
  for (int i = 0; i < 16; ++i) f.gid[i] = static_cast<uint8_t>(0xf0 + i);
  return f;
}

TEST(MoveFrame, RoundTripsEveryField) {
  for (MoveType t : {MoveType::kMove, MoveType::kMoved}) {
    MoveFrame in = sample_move();
    in.type = t;
    uint8_t buf[kMoveFrameBytes];
    encode_move_frame(in, buf);
    MoveFrame out;
    ASSERT_EQ(scan_move_frame(buf, sizeof buf, &out), FrameScan::kFrame);
    EXPECT_EQ(out.type, t);
    EXPECT_EQ(out.ring_log2, 20);
    EXPECT_EQ(out.mtu, 3);
    EXPECT_EQ(out.flags, kMoveFin);
    EXPECT_EQ(out.qpn, 0x123456u);
    EXPECT_EQ(out.psn, 0xabcdefu);
    EXPECT_EQ(out.ring.rkey, 0x1234u);
    EXPECT_EQ(out.ring.addr, 0x7f0000002000ull);
    EXPECT_EQ(out.nonce, 0x1122334455667788ull);
    EXPECT_EQ(out.rx_consumed, 5000000000ull);
    EXPECT_EQ(out.tx_sent, 6000000000ull);
    EXPECT_EQ(memcmp(out.gid, in.gid, 16), 0);
  }
  MoveFrame reset;
  reset.type = MoveType::kReset;
  uint8_t buf[kMoveFrameBytes];
  encode_move_frame(reset, buf);
  MoveFrame out;
  ASSERT_EQ(scan_move_frame(buf, sizeof buf, &out), FrameScan::kFrame);
  EXPECT_EQ(out.type, MoveType::kReset);
  EXPECT_EQ(out.flags, 0);
  // A reset for bytes behind librsock says so.
  reset.flags = kMoveKernelBytes;
  encode_move_frame(reset, buf);
  ASSERT_EQ(scan_move_frame(buf, sizeof buf, &out), FrameScan::kFrame);
  EXPECT_EQ(out.type, MoveType::kReset);
  EXPECT_EQ(out.flags, kMoveKernelBytes);
}

TEST(MoveFrame, IsToldFromOtherBytesByItsPrefix) {
  uint8_t buf[kMoveFrameBytes];
  encode_move_frame(sample_move(), buf);
  MoveFrame out;
  EXPECT_EQ(scan_move_frame(buf, 0, &out), FrameScan::kNeedMore);
  for (size_t n = 1; n < kMoveFrameBytes; ++n)
    EXPECT_EQ(scan_move_frame(buf, n, &out), FrameScan::kNeedMore) << n;
  // Anything else on the kernel socket (a doorbell byte, a proof, bytes
  // written behind librsock) is not a frame, from its first differing byte.
  const char* other[] = {"\x01", "x", "rsock/C2", "rsock/S2", "rsock/M2", "hello"};
  for (const char* d : other)
    EXPECT_EQ(scan_move_frame(d, strlen(d), &out), FrameScan::kNotFrame) << d;
}

TEST(MoveFrame, RefusesFieldsNoLibrsockWrites) {
  uint8_t good[kMoveFrameBytes];
  encode_move_frame(sample_move(), good);
  MoveFrame out;
  auto bad_with = [&](size_t off, uint8_t v) {
    uint8_t b[kMoveFrameBytes];
    memcpy(b, good, sizeof b);
    b[off] = v;
    return scan_move_frame(b, sizeof b, &out);
  };
  EXPECT_EQ(bad_with(8, 0), FrameScan::kBad);    // type
  EXPECT_EQ(bad_with(8, 4), FrameScan::kBad);    // type
  EXPECT_EQ(bad_with(9, 2), FrameScan::kBad);    // ring size below the minimum
  EXPECT_EQ(bad_with(9, 40), FrameScan::kBad);   // ring size beyond the immediates' range
  EXPECT_EQ(bad_with(10, 0), FrameScan::kBad);   // mtu
  EXPECT_EQ(bad_with(10, 6), FrameScan::kBad);   // mtu
  EXPECT_EQ(bad_with(11, 16), FrameScan::kBad);  // unknown flag
  EXPECT_EQ(bad_with(12, 1), FrameScan::kBad);   // qpn beyond 24 bits
  EXPECT_EQ(bad_with(16, 1), FrameScan::kBad);   // psn beyond 24 bits
  EXPECT_EQ(bad_with(95, 1), FrameScan::kBad);   // reserved
  MoveFrame zero = sample_move();
  uint8_t b[kMoveFrameBytes];
  zero.qpn = 0;
  encode_move_frame(zero, b);
  EXPECT_EQ(scan_move_frame(b, sizeof b, &out), FrameScan::kBad);
  zero = sample_move();
  zero.nonce = 0;
  encode_move_frame(zero, b);
  EXPECT_EQ(scan_move_frame(b, sizeof b, &out), FrameScan::kBad);
  // A reset carries nothing else, but for the kernel-bytes flag.
  MoveFrame reset;
  reset.type = MoveType::kReset;
  encode_move_frame(reset, b);
  b[40] = 1;
  EXPECT_EQ(scan_move_frame(b, sizeof b, &out), FrameScan::kBad);
  encode_move_frame(reset, b);
  b[11] = kMoveFin;
  EXPECT_EQ(scan_move_frame(b, sizeof b, &out), FrameScan::kBad);
  b[11] = kMoveKernelBytes;
  EXPECT_EQ(scan_move_frame(b, sizeof b, &out), FrameScan::kFrame);
}

}  // namespace
}  // namespace rsock
