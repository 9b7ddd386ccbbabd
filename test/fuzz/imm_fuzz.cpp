// Fuzz target: the 32-bit immediate of the verbs transport (verbs_imm in
// src/transport/verbs/verbs_channel.h: 2-bit type, 30-bit value, 64-bit
// totals rebuilt from the last known total). Two parts: any 32-bit
// immediate decodes to one of the four types and a value below 2^30, and
// extend() of any value from any total moves forward by less than 2^30 and
// lands on that value mod 2^30; then a sender's sequence of totals, each
// step below 2^30 as docs/protocol.md promises (at most a ring, 256 MiB),
// is encoded and rebuilt exactly by the receiver, type by type.
// fuzz-sources:

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>

#include "fuzz_check.h"
#include "transport/verbs/verbs_channel.h"

namespace imm = rsock::verbs_imm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);

  // Any immediate a peer may send.
  const uint32_t raw = in.ConsumeIntegral<uint32_t>();
  const uint64_t last = in.ConsumeIntegral<uint64_t>();
  FUZZ_CHECK(static_cast<uint32_t>(imm::type_of(raw)) <= imm::kAck);
  const uint32_t v = imm::value_of(raw);
  FUZZ_CHECK(v <= imm::kValueMask);
  FUZZ_CHECK(imm::encode(imm::type_of(raw), v) == raw);
  const uint64_t ext = imm::extend(last, v);
  FUZZ_CHECK(ext - last <= imm::kValueMask);  // forward, by less than 2^30 (mod 2^64)
  FUZZ_CHECK((ext & imm::kValueMask) == v);

  // A sender's totals per type and the receiver's reconstruction of them.
  uint64_t sent[4];
  for (uint64_t& t : sent) t = in.ConsumeIntegral<uint64_t>();
  uint64_t seen[4];
  for (int t = 0; t < 4; ++t) seen[t] = sent[t];  // both sides start in agreement
  while (in.remaining_bytes() > 0) {
    const auto type = static_cast<imm::Type>(in.ConsumeIntegralInRange<uint32_t>(0, 3));
    const uint64_t step = in.ConsumeIntegralInRange<uint64_t>(0, imm::kValueMask);
    sent[type] += step;
    const uint32_t wire = imm::encode(type, sent[type]);
    FUZZ_CHECK(imm::type_of(wire) == type);
    seen[type] = imm::extend(seen[type], imm::value_of(wire));
    FUZZ_CHECK(seen[type] == sent[type]);
  }
  return 0;
}
