// Fuzz target: the same-host pairing messages a peer (or a process posing
// as one) sends on a rendezvous (src/ring/handshake.h: Hello, Proof, Offer,
// Answer). The first byte picks the decoder, the rest is the message. An
// Offer that decodes must describe a ring the limits allow and a region of
// exactly its size, computed without wrap-around; a Hello or Proof only
// decodes at its own size and version; an Answer accepts only its nonce.
// fuzz-sources: src/ring/handshake.cpp

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "config/config.h"
#include "fuzz_check.h"
#include "ring/handshake.h"
#include "ring/ring.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t which = data[0] % 4;
  // Exactly the message's bytes, so that ASan sees any read past its end.
  std::vector<uint8_t> msg(data + 1, data + size);
  const void* buf = msg.empty() ? nullptr : msg.data();
  switch (which) {
    case 0:
    case 1: {
      const rsock::MsgType want = which == 0 ? rsock::MsgType::kHello : rsock::MsgType::kProof;
      if (rsock::decode_hello(buf, msg.size(), want)) {
        FUZZ_CHECK(msg.size() == sizeof(rsock::HelloMsg));
        rsock::HelloMsg h;
        memcpy(&h, buf, sizeof h);
        FUZZ_CHECK(h.type == static_cast<uint32_t>(want));
        FUZZ_CHECK(h.version == rsock::kHandshakeVersion);
      }
      break;
    }
    case 2: {
      rsock::OfferMsg o;
      if (rsock::decode_offer(buf, msg.size(), &o)) {
        FUZZ_CHECK(rsock::is_power_of_two(o.ring_bytes));
        FUZZ_CHECK(o.ring_bytes >= rsock::kMinRingBytes && o.ring_bytes <= rsock::kMaxRingBytes);
        // The region holds the header and both rings, with no wrap-around.
        FUZZ_CHECK(o.region_bytes > o.ring_bytes);
        FUZZ_CHECK(o.region_bytes - rsock::region_header_bytes() == 2 * o.ring_bytes);
      }
      break;
    }
    default: {
      if (msg.size() >= sizeof(rsock::AnswerMsg)) {
        rsock::AnswerMsg a;
        memcpy(&a, msg.data(), sizeof a);
        const bool ok = rsock::decode_answer_accepts(buf, msg.size(), a.nonce);
        if (ok) {
          FUZZ_CHECK(msg.size() == sizeof a);
          FUZZ_CHECK(!rsock::decode_answer_accepts(buf, msg.size(), a.nonce + 1));
        }
      }
      break;
    }
  }
  return 0;
}
