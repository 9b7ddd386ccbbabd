// Helpers shared by the libFuzzer targets of test/fuzz (README.md there):
// FUZZ_CHECK, which turns a broken property into a crash that libFuzzer
// records as a finding, and the properties every parsed Config must have,
// used by the configuration targets. Thread-safety: none needed (a fuzz
// target runs one input at a time).
#pragma once

#include <arpa/inet.h>
#include <stdio.h>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "config/config.h"

// A property the code under test must keep whatever the input: when it does
// not, say which one and crash, so that libFuzzer saves the input.
#define FUZZ_CHECK(cond)                                                             \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "FUZZ_CHECK failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      __builtin_trap();                                                              \
    }                                                                                \
  } while (0)

namespace rsock::fuzz {

// The longest error line the configuration parser may produce
// (docs/configuration.md: values and paths are cut, so a line stays short).
inline constexpr size_t kMaxErrorLine = 1024;

// What every error line must look like: printable ASCII only (no terminal
// control sequence, no byte of a hostile value left raw) and bounded.
inline void check_error_line(const std::string& line) {
  FUZZ_CHECK(line.size() <= kMaxErrorLine);
  for (unsigned char c : line) FUZZ_CHECK(c >= 0x20 && c < 0x7f);
}

// The invariants of a parsed Config, whatever text produced it.
// `disable_requested`: RSOCK_DISABLE was "1" (trimmed).
inline void check_config(const Config& c, const std::vector<ConfigError>& errors,
                         bool disable_requested) {
  FUZZ_CHECK(c.disabled == (disable_requested || !errors.empty()));
  for (const ConfigError& e : errors) check_error_line(e.to_string());
  FUZZ_CHECK(c.ring_bytes >= kMinRingBytes && c.ring_bytes <= kMaxRingBytes);
  FUZZ_CHECK((c.ring_bytes & (c.ring_bytes - 1)) == 0);
  FUZZ_CHECK(c.spin_us <= kMaxSpinUs);
  FUZZ_CHECK(c.connect_timeout_ms >= 1 && c.connect_timeout_ms <= kMaxConnectTimeoutMs);
  FUZZ_CHECK(c.log_level >= kLogError && c.log_level <= kLogTrace);
  static constexpr uint8_t kV4Mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  for (const PeerRule& r : c.rules) {
    FUZZ_CHECK(r.family == AF_INET || r.family == AF_INET6);
    const unsigned max_len = r.family == AF_INET ? 32 : 128;
    FUZZ_CHECK(r.prefix_len <= max_len);
    FUZZ_CHECK(r.port_lo <= r.port_hi);
    // Host bits beyond the prefix, and bytes beyond an IPv4 address, are zero.
    for (unsigned bit = r.prefix_len; bit < 128; ++bit)
      FUZZ_CHECK((r.addr[bit / 8] & (0x80u >> (bit % 8))) == 0);
    // A v4-mapped rule that names only IPv4 hosts is stored as IPv4.
    if (r.family == AF_INET6 && r.prefix_len >= 96)
      FUZZ_CHECK(std::string_view(reinterpret_cast<const char*>(r.addr), 12) !=
                 std::string_view(reinterpret_cast<const char*>(kV4Mapped), 12));
    for (char ch : r.program) FUZZ_CHECK(ch != ' ' && ch != '\t' && ch != '#' && ch != '\n');
  }
}

}  // namespace rsock::fuzz
