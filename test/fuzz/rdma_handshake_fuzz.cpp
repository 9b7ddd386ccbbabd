// Fuzz target: what a process on the fabric (or on the client's host)
// controls in an RDMA pairing (src/ring/handshake.h): the rdma_cm private
// data of a connect request and of an accept, and the first bytes a server
// reads from its client, or a client from its server, on the TCP
// connection. The first byte picks the decoder. Decoded private data must
// hold a ring size the limits allow and known flags only, and must encode
// back to the same bytes; a proof scan must never read beyond what it was
// given, must say "need more" only for a true prefix of a proof's magic,
// and a complete proof must re-encode to its bytes (for a decline: with no
// ring).
// fuzz-sources: src/ring/handshake.cpp

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "ring/handshake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t which = data[0] % 4;
  std::vector<uint8_t> msg(data + 1, data + size);
  const void* buf = msg.empty() ? nullptr : msg.data();
  switch (which) {
    case 0: {
      rsock::ConnectInfo c;
      if (rsock::decode_connect_priv(buf, msg.size(), &c)) {
        FUZZ_CHECK(rsock::ring_log2_ok(c.ring_log2));
        FUZZ_CHECK((c.flags & ~(rsock::kPrivClientListens | rsock::kPrivReverse)) == 0);
        FUZZ_CHECK(((c.flags & rsock::kPrivReverse) != 0) == (c.challenge != 0));
        uint8_t again[rsock::kConnectPrivBytes];
        rsock::encode_connect_priv(c, again);
        FUZZ_CHECK(memcmp(again, msg.data(), sizeof again) == 0);
      }
      break;
    }
    case 1: {
      rsock::AcceptInfo a;
      if (rsock::decode_accept_priv(buf, msg.size(), &a)) {
        FUZZ_CHECK(rsock::ring_log2_ok(a.ring_log2));
        uint8_t again[rsock::kAcceptPrivBytes];
        rsock::encode_accept_priv(a, again);
        FUZZ_CHECK(memcmp(again, msg.data(), sizeof again) == 0);
      }
      break;
    }
    case 2: {
      rsock::ClientProof p;
      const rsock::ProofScan s = rsock::scan_client_proof(msg.data(), msg.size(), &p);
      if (s == rsock::ProofScan::kNeedMore) FUZZ_CHECK(msg.size() < rsock::kClientProofBytes);
      if (s == rsock::ProofScan::kProof) {
        FUZZ_CHECK(msg.size() >= rsock::kClientProofBytes);
        uint8_t again[rsock::kClientProofBytes];
        rsock::encode_client_proof(p, again);
        // Equal, but for a proof whose reserved word was not zero: the
        // scanner then voids its challenge (it can match no request).
        if (memcmp(again, msg.data(), sizeof again) != 0) FUZZ_CHECK(p.challenge == 0);
      }
      break;
    }
    default: {
      rsock::ServerProof p;
      const rsock::ProofScan s = rsock::scan_server_proof(msg.data(), msg.size(), &p);
      if (s == rsock::ProofScan::kNeedMore) FUZZ_CHECK(msg.size() < rsock::kServerProofBytes);
      if (s == rsock::ProofScan::kProof) {
        FUZZ_CHECK(msg.size() >= rsock::kServerProofBytes);
        uint8_t again[rsock::kServerProofBytes];
        rsock::encode_server_proof(p, again);
        if (p.accept)
          FUZZ_CHECK(memcmp(again, msg.data(), sizeof again) == 0);
        else
          FUZZ_CHECK(p.ring.rkey == 0 && p.ring.addr == 0);
      }
      break;
    }
  }
  return 0;
}
