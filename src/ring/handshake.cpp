// Pairing handshake messages (see handshake.h).
#include "ring/handshake.h"

#include <string.h>

#include "config/config.h"
#include "ring/ring.h"

namespace rsock {
namespace {

// Big-endian field access over byte buffers (no alignment assumed).
void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (24 - 8 * i));
}
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (56 - 8 * i));
}
uint16_t get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }
uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = v << 8 | p[i];
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | p[i];
  return v;
}

int log2_of(size_t v) {
  int n = 0;
  while ((size_t{1} << n) < v) ++n;
  return n;
}

constexpr uint32_t kConnectMagic = 0x72737632;  // "rsv2"
constexpr uint32_t kAcceptMagic = 0x72736132;   // "rsa2"
constexpr uint8_t kClientProofMagic[8] = {'r', 's', 'o', 'c', 'k', '/', 'C', '2'};
constexpr uint8_t kServerProofMagic[8] = {'r', 's', 'o', 'c', 'k', '/', 'S', '2'};
constexpr uint8_t kMoveMagic[8] = {'r', 's', 'o', 'c', 'k', '/', 'M', '1'};
constexpr uint8_t kKnownFlags = kPrivClientListens | kPrivReverse;

// ConnectPriv: magic(4) ring_log2(1) flags(1) client_port(2) server_port(2)
//              client_addr(16) server_addr(16) challenge(8)
static_assert(4 + 1 + 1 + 2 + 2 + 16 + 16 + 8 == kConnectPrivBytes);
static_assert(kConnectPrivBytes <= 56, "IB CM REQ private data room");
// AcceptPriv: magic(4) ring_log2(1) zero(1) client_port(2) challenge(8)
static_assert(4 + 1 + 1 + 2 + 8 == kAcceptPrivBytes);
// ClientProof: magic(8) challenge(8) key(16) rkey(4) zero(4) addr(8)
static_assert(8 + 8 + kProofKeyBytes + 4 + 4 + 8 == kClientProofBytes);
// ServerProof: magic(8) code(1) zero(3) rkey(4) key(16) addr(8)
static_assert(8 + 1 + 3 + 4 + kProofKeyBytes + 8 == kServerProofBytes);
// MoveFrame: magic(8) type(1) ring_log2(1) mtu(1) flags(1) qpn(4) psn(4)
//            rkey(4) addr(8) nonce(8) rx_consumed(8) tx_sent(8) gid(16) zero(24)
static_assert(8 + 4 + 4 + 4 + 4 + 8 + 8 + 8 + 8 + 16 + 24 == kMoveFrameBytes);

// Classifies a prefix of a proof: its magic decides (application data that
// starts with these 8 bytes is not a concern: 2^-64).
ProofScan scan_magic(const uint8_t* p, size_t len, const uint8_t (&magic)[8], size_t full) {
  if (len == 0) return ProofScan::kNeedMore;
  const size_t n = len < 8 ? len : 8;
  if (memcmp(p, magic, n) != 0) return ProofScan::kNotProof;
  return len < full ? ProofScan::kNeedMore : ProofScan::kProof;
}

}  // namespace

bool ring_log2_ok(int log2) {
  return log2 >= log2_of(kMinRingBytes) && log2 <= log2_of(kMaxRingBytes) && log2 <= 28;
}

bool decode_hello(const void* buf, size_t len, MsgType want) {
  if (len != sizeof(HelloMsg)) return false;
  HelloMsg m;
  memcpy(&m, buf, sizeof m);
  return m.type == static_cast<uint32_t>(want) && m.version == kHandshakeVersion;
}

bool decode_offer(const void* buf, size_t len, OfferMsg* out) {
  if (len != sizeof(OfferMsg)) return false;
  OfferMsg m;
  memcpy(&m, buf, sizeof m);
  if (m.type != static_cast<uint32_t>(MsgType::kOffer) || m.version != kHandshakeVersion)
    return false;
  if (!is_power_of_two(m.ring_bytes) || m.ring_bytes < kMinRingBytes ||
      m.ring_bytes > kMaxRingBytes || m.region_bytes != region_bytes_for(m.ring_bytes) ||
      m.region_offset % kPageBytes != 0)
    return false;
  *out = m;
  return true;
}

bool decode_answer_accepts(const void* buf, size_t len, uint64_t nonce) {
  if (len != sizeof(AnswerMsg)) return false;
  AnswerMsg m;
  memcpy(&m, buf, sizeof m);
  return m.type == static_cast<uint32_t>(MsgType::kAnswer) &&
         m.code == static_cast<uint32_t>(AnswerCode::kAccept) && m.nonce == nonce;
}

void encode_connect_priv(const ConnectInfo& in, uint8_t out[kConnectPrivBytes]) {
  put32(out, kConnectMagic);
  out[4] = static_cast<uint8_t>(in.ring_log2);
  out[5] = in.flags;
  put16(out + 6, in.client.port);
  put16(out + 8, in.server.port);
  memcpy(out + 10, in.client.addr, 16);
  memcpy(out + 26, in.server.addr, 16);
  put64(out + 42, in.challenge);
}

bool decode_connect_priv(const void* buf, size_t len, ConnectInfo* out) {
  // rdma_cm may hand us more than we sent (the transport pads): the extra
  // bytes are ignored.
  if (buf == nullptr || len < kConnectPrivBytes) return false;
  const auto* p = static_cast<const uint8_t*>(buf);
  ConnectInfo c;
  c.ring_log2 = p[4];
  c.flags = p[5];
  if (get32(p) != kConnectMagic || !ring_log2_ok(c.ring_log2) || (c.flags & ~kKnownFlags) != 0)
    return false;
  c.client.port = get16(p + 6);
  c.server.port = get16(p + 8);
  memcpy(c.client.addr, p + 10, 16);
  memcpy(c.server.addr, p + 26, 16);
  c.challenge = get64(p + 42);
  // A reverse request carries the server's challenge; a forward one none.
  if (((c.flags & kPrivReverse) != 0) != (c.challenge != 0)) return false;
  *out = c;
  return true;
}

void encode_accept_priv(const AcceptInfo& in, uint8_t out[kAcceptPrivBytes]) {
  put32(out, kAcceptMagic);
  out[4] = static_cast<uint8_t>(in.ring_log2);
  out[5] = 0;
  put16(out + 6, in.client_port);
  put64(out + 8, in.challenge);
}

bool decode_accept_priv(const void* buf, size_t len, AcceptInfo* out) {
  if (buf == nullptr || len < kAcceptPrivBytes) return false;
  const auto* p = static_cast<const uint8_t*>(buf);
  AcceptInfo a;
  a.ring_log2 = p[4];
  if (get32(p) != kAcceptMagic || !ring_log2_ok(a.ring_log2) || p[5] != 0) return false;
  a.client_port = get16(p + 6);
  a.challenge = get64(p + 8);
  *out = a;
  return true;
}

void encode_client_proof(const ClientProof& in, uint8_t out[kClientProofBytes]) {
  memcpy(out, kClientProofMagic, 8);
  put64(out + 8, in.challenge);
  memcpy(out + 16, in.key, kProofKeyBytes);
  put32(out + 32, in.ring.rkey);
  put32(out + 36, 0);
  put64(out + 40, in.ring.addr);
}

void encode_server_proof(const ServerProof& in, uint8_t out[kServerProofBytes]) {
  memcpy(out, kServerProofMagic, 8);
  out[8] = in.accept ? 1 : 0;
  out[9] = out[10] = out[11] = 0;
  put32(out + 12, in.accept ? in.ring.rkey : 0);
  memcpy(out + 16, in.key, kProofKeyBytes);
  put64(out + 32, in.accept ? in.ring.addr : 0);
}

ProofScan scan_client_proof(const void* buf, size_t len, ClientProof* out) {
  const auto* p = static_cast<const uint8_t*>(buf);
  ProofScan s = scan_magic(p, len, kClientProofMagic, kClientProofBytes);
  if (s != ProofScan::kProof) return s;
  ClientProof c;
  c.challenge = get64(p + 8);
  memcpy(c.key, p + 16, kProofKeyBytes);
  c.ring.rkey = get32(p + 32);
  c.ring.addr = get64(p + 40);
  // A librsock client wrote it; fields it cannot have written mean a
  // broken one: still a proof (to be consumed), but one that fails.
  if (get32(p + 36) != 0) c.challenge = 0;
  *out = c;
  return s;
}

ProofScan scan_server_proof(const void* buf, size_t len, ServerProof* out) {
  const auto* p = static_cast<const uint8_t*>(buf);
  ProofScan s = scan_magic(p, len, kServerProofMagic, kServerProofBytes);
  if (s != ProofScan::kProof) return s;
  if (p[8] > 1 || p[9] != 0 || p[10] != 0 || p[11] != 0) return ProofScan::kNotProof;
  ServerProof r;
  r.accept = p[8] == 1;
  memcpy(r.key, p + 16, kProofKeyBytes);
  if (r.accept) r.ring = {get32(p + 12), get64(p + 32)};  // a decline announces no ring
  *out = r;
  return s;
}

void encode_move_frame(const MoveFrame& in, uint8_t out[kMoveFrameBytes]) {
  memset(out, 0, kMoveFrameBytes);
  memcpy(out, kMoveMagic, 8);
  out[8] = static_cast<uint8_t>(in.type);
  out[11] = in.flags;
  if (in.type == MoveType::kReset) return;  // nothing else: every other field is zero
  out[9] = in.ring_log2;
  out[10] = in.mtu;
  put32(out + 12, in.qpn);
  put32(out + 16, in.psn);
  put32(out + 20, in.ring.rkey);
  put64(out + 24, in.ring.addr);
  put64(out + 32, in.nonce);
  put64(out + 40, in.rx_consumed);
  put64(out + 48, in.tx_sent);
  memcpy(out + 56, in.gid, 16);
}

FrameScan scan_move_frame(const void* buf, size_t len, MoveFrame* out) {
  const auto* p = static_cast<const uint8_t*>(buf);
  if (len == 0) return FrameScan::kNeedMore;
  if (memcmp(p, kMoveMagic, len < 8 ? len : 8) != 0) return FrameScan::kNotFrame;
  if (len < kMoveFrameBytes) return FrameScan::kNeedMore;
  for (size_t i = 72; i < kMoveFrameBytes; ++i)
    if (p[i] != 0) return FrameScan::kBad;
  MoveFrame f;
  if (p[8] < 1 || p[8] > 3) return FrameScan::kBad;
  f.type = static_cast<MoveType>(p[8]);
  if (f.type == MoveType::kReset) {
    for (size_t i = 9; i < 72; ++i)
      if (i != 11 && p[i] != 0) return FrameScan::kBad;
    if ((p[11] & ~kMoveKernelBytes) != 0) return FrameScan::kBad;
    f.flags = p[11];
    *out = f;
    return FrameScan::kFrame;
  }
  f.ring_log2 = p[9];
  f.mtu = p[10];
  f.flags = p[11];
  f.qpn = get32(p + 12);
  f.psn = get32(p + 16);
  f.ring.rkey = get32(p + 20);
  f.ring.addr = get64(p + 24);
  f.nonce = get64(p + 32);
  f.rx_consumed = get64(p + 40);
  f.tx_sent = get64(p + 48);
  memcpy(f.gid, p + 56, 16);
  if (!ring_log2_ok(f.ring_log2) || f.mtu < 1 || f.mtu > 5 || (f.flags & ~kMoveKnownFlags) != 0 ||
      f.qpn == 0 || f.qpn >= (1u << 24) || f.psn >= (1u << 24) || f.nonce == 0)
    return FrameScan::kBad;
  *out = f;
  return FrameScan::kFrame;
}

}  // namespace rsock
