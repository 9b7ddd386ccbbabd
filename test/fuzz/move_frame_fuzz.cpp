// Fuzz target: the bytes at the head of an RDMA connection's kernel TCP
// socket after the switch, as the scanner of move frames sees them
// (src/ring/handshake.h, MoveFrame): frames from the other end (a process
// that took it over, or the other end's owner), or anything else that
// reached the socket. A scan must never read beyond its input, must say
// "need more" only for a true prefix of the magic, and a frame it accepts
// must hold a ring size within the limits, a 24-bit non-zero queue pair
// number, a 24-bit PSN, an MTU enum, known flags and (but for a reset) a
// non-zero nonce (a reset: no flag but kernel bytes), and re-encode to its
// bytes.
// fuzz-sources: src/ring/handshake.cpp

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_check.h"
#include "ring/handshake.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> msg(data, data + size);
  rsock::MoveFrame f;
  const rsock::FrameScan s = rsock::scan_move_frame(msg.data(), msg.size(), &f);
  if (s == rsock::FrameScan::kNeedMore) FUZZ_CHECK(msg.size() < rsock::kMoveFrameBytes);
  if (s == rsock::FrameScan::kFrame) {
    FUZZ_CHECK(msg.size() >= rsock::kMoveFrameBytes);
    if (f.type != rsock::MoveType::kReset) {
      FUZZ_CHECK(rsock::ring_log2_ok(f.ring_log2));
      FUZZ_CHECK(f.qpn != 0 && f.qpn < (1u << 24) && f.psn < (1u << 24));
      FUZZ_CHECK(f.mtu >= 1 && f.mtu <= 5 && f.nonce != 0);
      FUZZ_CHECK((f.flags & ~rsock::kMoveKnownFlags) == 0);
    } else {
      FUZZ_CHECK((f.flags & ~rsock::kMoveKernelBytes) == 0);
    }
    uint8_t again[rsock::kMoveFrameBytes];
    rsock::encode_move_frame(f, again);
    FUZZ_CHECK(memcmp(again, msg.data(), sizeof again) == 0);
  }
  return 0;
}
