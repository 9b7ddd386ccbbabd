// The pairing handshakes' messages (docs/protocol.md sections 2 and 7;
// docs/security.md says what each one proves): their layouts, and pure
// encoders and decoders. Every decoder checks every field that a peer, or
// an intruder posing as one, controls: a message that decodes is well
// formed, though not yet trusted (the pairing code checks the proofs).
// No I/O; safe to feed arbitrary bytes (test/fuzz).
// Thread-safety: pure functions over caller-owned values.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ring/wire.h"

namespace rsock {

inline constexpr uint32_t kHandshakeVersion = 4;

// ---- Same host: AF_UNIX SOCK_SEQPACKET, one message per packet ----------
//
//   server -> client  Hello  + [O_PATH proof of the server's TCP socket]
//   client -> server  Proof  + [O_PATH proof of the client's TCP socket]
//   server -> client  Offer  + [the memfd holding the region]
//   client -> server  Answer
//
// The server connects to the client's rendezvous and speaks first; the
// client answers only a connection whose proof names the other end of its
// own TCP connection, and the server sends the region only after the
// client's proof (src/transport/shm/possession.h).
enum class MsgType : uint32_t { kHello = 1, kOffer = 2, kAnswer = 3, kProof = 4 };

struct HelloMsg {  // kHello (server -> client) and kProof (client -> server)
  uint32_t type;
  uint32_t version;  // kHandshakeVersion
  // The Proof's: the client process's random token (version 3), which with
  // its pid names the process a region may be kept for
  // (transport/shm/region_cache.h). 0 in a Hello.
  uint64_t token;
};

struct OfferMsg {
  uint32_t type;  // MsgType::kOffer
  uint32_t version;
  uint64_t nonce;  // also in the region header, and echoed in the Answer
  uint64_t ring_bytes;
  uint64_t region_bytes;
  // Where the region starts in the file sent with the offer, a page
  // multiple (version 4: one file holds the regions of a pair of
  // processes, transport/shm/arena.h).
  uint64_t region_offset;
  WireAddr server;  // the accepted socket's local address
  WireAddr client;  // its peer address
};

enum class AnswerCode : uint32_t { kAccept = 0, kDecline = 1 };

struct AnswerMsg {
  uint32_t type;  // MsgType::kAnswer
  uint32_t code;  // AnswerCode
  uint64_t nonce;
};

// A Hello or Proof (want) of our version, exactly len == sizeof(HelloMsg).
bool decode_hello(const void* buf, size_t len, MsgType want);
// An Offer of our version whose ring size is a power of two within the
// configurable limits and whose region size fits it.
bool decode_offer(const void* buf, size_t len, OfferMsg* out);
// An Answer that accepts the offer with this nonce.
bool decode_answer_accepts(const void* buf, size_t len, uint64_t nonce);

// A ring size the handshakes accept (a power of two within the limits of
// RSOCK_RING_SIZE, at most 2^28 for the verbs immediates).
bool ring_log2_ok(int log2);

// ---- RDMA: rdma_cm private data -----------------------------------------
// Big-endian fields. The connect request's private data must fit the 56
// bytes rdma_cm leaves on InfiniBand/RoCE (IB CM REQ). No rkey travels here:
// rings are announced only in the in-band proofs below, which only the two
// TCP endpoints can read.

inline constexpr size_t kConnectPrivBytes = 50;
inline constexpr size_t kAcceptPrivBytes = 16;

// ConnectInfo.flags.
inline constexpr uint8_t kPrivClientListens = 1u << 0;  // the client has an rdma_cm rendezvous
inline constexpr uint8_t kPrivReverse = 1u << 1;  // a server's request to that rendezvous

struct ConnectInfo {
  int ring_log2 = 0;  // both rings have 2^ring_log2 bytes
  uint8_t flags = 0;
  WireAddr client = {};  // the TCP connection as its client sees it:
  WireAddr server = {};  //   local end, peer end (ports in host order)
  // Reverse requests: the server's challenge, which the client's in-band
  // proof must echo. Forward requests: 0 (the challenge is in the accept).
  uint64_t challenge = 0;
};

struct AcceptInfo {
  int ring_log2 = 0;         // echo of the request's
  uint16_t client_port = 0;  // echo of the request's
  uint64_t challenge = 0;    // forward: the server's challenge; reverse: 0
};

void encode_connect_priv(const ConnectInfo& in, uint8_t out[kConnectPrivBytes]);
bool decode_connect_priv(const void* buf, size_t len, ConnectInfo* out);
void encode_accept_priv(const AcceptInfo& in, uint8_t out[kAcceptPrivBytes]);
bool decode_accept_priv(const void* buf, size_t len, AcceptInfo* out);

// ---- RDMA: in-band proofs on the TCP stream -----------------------------
// Once its rdma_cm connection is established, the client writes a
// ClientProof on the TCP connection: the server's challenge (which the
// server gave only to its rdma_cm peer) and a fresh key of the client's.
// The server reads it as the first bytes from the client (an 8-byte magic
// tells it from application data, which a plain client may send instead)
// and answers with a ServerProof echoing the key. Each proof also carries
// its sender's receive ring. So each end learns that its rdma_cm peer holds
// the other end of the TCP connection, and only that peer ever learns an
// rkey.

inline constexpr size_t kClientProofBytes = 48;
inline constexpr size_t kServerProofBytes = 40;
inline constexpr size_t kProofKeyBytes = 16;

struct RingInfo {
  uint32_t rkey = 0;
  uint64_t addr = 0;
};

struct ClientProof {
  uint64_t challenge = 0;             // echo of the server's
  uint8_t key[kProofKeyBytes] = {};   // the client's, echoed by the server
  RingInfo ring;                      // the client's receive ring
};

struct ServerProof {
  bool accept = false;  // false: the server declines (both stay on TCP)
  uint8_t key[kProofKeyBytes] = {};  // echo of the client's
  RingInfo ring;                     // the server's receive ring (accept only)
};

void encode_client_proof(const ClientProof& in, uint8_t out[kClientProofBytes]);
void encode_server_proof(const ServerProof& in, uint8_t out[kServerProofBytes]);

// What the first `len` bytes from a client are (MSG_PEEK, so that a plain
// client's data stays unread).
enum class ProofScan { kNeedMore, kNotProof, kProof };
ProofScan scan_client_proof(const void* buf, size_t len, ClientProof* out);
ProofScan scan_server_proof(const void* buf, size_t len, ServerProof* out);

// ---- RDMA: moving a connection to another process (in band) ------------
// After the switch the kernel TCP socket of a verbs connection carries no
// application byte. When a process takes an end over (a fork's child, an
// exec'd image: docs/protocol.md section 7, "Moving a connection"), it and
// the owner of the other end exchange these frames on that socket, which
// only the two endpoints can read or write: the new queue pair, the new
// ring's rkey and the positions to continue from travel nowhere else. Both
// ends are librsock (they paired), so in-band bytes are safe; the 8-byte
// magic tells a frame from any byte that reached the socket behind
// librsock (such bytes are never a frame). Fixed size, big-endian.

inline constexpr size_t kMoveFrameBytes = 96;

enum class MoveType : uint8_t {
  kMove = 1,   // a process took this end over: its queue pair and positions
  kMoved = 2,  // the other end's answer: its new queue pair and positions
  kReset = 3   // the sender reset the connection (a move failed, or kernel bytes)
};

// MoveFrame.flags: what the sender's end has signalled (sticky): FIN,
// CLOSED, RESET (an abortive close, with CLOSED), KERNEL_BYTES (it reset the
// connection because bytes reached its kernel socket behind librsock). A
// kReset frame carries KERNEL_BYTES or nothing.
inline constexpr uint8_t kMoveFin = 1u << 0;
inline constexpr uint8_t kMoveClosed = 1u << 1;
inline constexpr uint8_t kMoveReset = 1u << 2;
inline constexpr uint8_t kMoveKernelBytes = 1u << 3;
inline constexpr uint8_t kMoveKnownFlags = kMoveFin | kMoveClosed | kMoveReset | kMoveKernelBytes;

struct MoveFrame {
  MoveType type = MoveType::kMove;
  uint8_t ring_log2 = 0;     // both rings have 2^ring_log2 bytes (must match ours)
  uint8_t mtu = 0;           // the sender's port MTU (enum ibv_mtu: 1..5 = 256..4096)
  uint8_t flags = 0;         // kMoveFin, kMoveClosed, kMoveReset, kMoveKernelBytes
  uint32_t qpn = 0;          // the sender's new RC queue pair (24 bits)
  uint32_t psn = 0;          // its first packet sequence number (24 bits)
  RingInfo ring;             // the sender's receive ring (rkey of its own protection domain)
  uint64_t nonce = 0;        // kMove: the taker's, non-zero; kMoved: the echo
  uint64_t rx_consumed = 0;  // bytes of the other end's stream this end has read
  uint64_t tx_sent = 0;      // bytes this end has published
  uint8_t gid[16] = {};      // the sender's RoCE GID (its TCP address)
};

void encode_move_frame(const MoveFrame& in, uint8_t out[kMoveFrameBytes]);

// What the bytes at the head of the kernel socket are: a prefix of a frame
// (kNeedMore), not a frame (kNotFrame: the magic differs), a frame
// (decoded into *out), or a frame with the magic whose fields no librsock
// writes (kBad: a protocol violation).
enum class FrameScan { kNeedMore, kNotFrame, kFrame, kBad };
FrameScan scan_move_frame(const void* buf, size_t len, MoveFrame* out);

}  // namespace rsock
