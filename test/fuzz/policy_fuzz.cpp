// Fuzz target: the policy decision (src/policy) on fuzzed socket addresses
// against fuzzed rules. The input gives the program, the role, up to eight
// rules built field by field (including prefix lengths no parser would
// produce) and then the raw sockaddr bytes with their length, in a buffer
// of exactly that length (so ASan sees any read past it). decide() is
// compared with a reference matcher written here from the rules of
// docs/configuration.md ("Matching"), bit by bit; any difference is a
// finding.
// fuzz-sources: src/config/config.cpp src/policy/policy.cpp

#include <fuzzer/FuzzedDataProvider.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "config/config.h"
#include "fuzz_check.h"
#include "policy/policy.h"

namespace {

using rsock::Config;
using rsock::PeerRule;
using rsock::Role;
using rsock::TransportKind;

// The address as docs/configuration.md describes it: IPv4 or IPv6, a
// v4-mapped IPv6 address taken as IPv4, all zeros being the wildcard.
struct RefAddr {
  int family = 0;
  uint8_t addr[16] = {};
  uint16_t port = 0;
  bool wildcard = false;
};

bool ref_addr(const uint8_t* p, size_t len, RefAddr* out) {
  if (len < sizeof(sa_family_t)) return false;
  sa_family_t family;
  std::memcpy(&family, p, sizeof family);
  if (family == AF_INET && len >= sizeof(sockaddr_in)) {
    out->family = AF_INET;
    out->port = static_cast<uint16_t>(p[2] << 8 | p[3]);
    std::memcpy(out->addr, p + offsetof(sockaddr_in, sin_addr), 4);
  } else if (family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    out->port = static_cast<uint16_t>(p[2] << 8 | p[3]);
    const uint8_t* a = p + offsetof(sockaddr_in6, sin6_addr);
    bool mapped = a[10] == 0xff && a[11] == 0xff;
    for (int i = 0; i < 10; ++i) mapped = mapped && a[i] == 0;
    out->family = mapped ? AF_INET : AF_INET6;
    std::memcpy(out->addr, mapped ? a + 12 : a, mapped ? 4 : 16);
  } else {
    return false;
  }
  out->wildcard = true;
  for (uint8_t b : out->addr) out->wildcard = out->wildcard && b == 0;
  return true;
}

bool bit(const uint8_t* a, unsigned i) { return (a[i / 8] >> (7 - i % 8)) & 1; }

int reference(const Config& c, const std::string& program, Role role, const uint8_t* p,
              size_t len) {
  RefAddr sa;
  if (c.disabled || !ref_addr(p, len, &sa)) return -1;
  for (size_t i = 0; i < c.rules.size(); ++i) {
    const PeerRule& r = c.rules[i];
    if (!r.program.empty() && r.program != program) continue;
    if (r.role != Role::kAny && r.role != role) continue;
    if (sa.port < r.port_lo || sa.port > r.port_hi) continue;
    bool match;
    if (role == Role::kServer && sa.wildcard) {
      // 0.0.0.0 matches IPv4 rules on port alone; the dual-stack :: both.
      match = sa.family == AF_INET6 || r.family == AF_INET;
    } else if (r.family != sa.family) {
      match = false;
    } else {
      const unsigned max_len = r.family == AF_INET ? 32 : 128;
      const unsigned n = r.prefix_len < max_len ? r.prefix_len : max_len;
      match = true;
      for (unsigned b = 0; b < n && match; ++b) match = bit(r.addr, b) == bit(sa.addr, b);
    }
    if (match) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Config c;
  c.disabled = in.ConsumeIntegralInRange<int>(0, 15) == 0;
  const Role role = static_cast<Role>(in.ConsumeIntegralInRange<int>(0, 2));
  const std::string program = in.ConsumeBool() ? "redis-server" : "client";
  const int nrules = in.ConsumeIntegralInRange<int>(0, 8);
  for (int i = 0; i < nrules; ++i) {
    PeerRule r;
    r.transport = static_cast<TransportKind>(in.ConsumeIntegralInRange<int>(0, 3));
    r.role = static_cast<Role>(in.ConsumeIntegralInRange<int>(0, 2));
    const int prog = in.ConsumeIntegralInRange<int>(0, 2);
    r.program = prog == 0 ? "" : prog == 1 ? "redis-server" : "other";
    r.family = in.ConsumeBool() ? AF_INET6 : AF_INET;
    r.prefix_len = in.ConsumeIntegral<uint8_t>();
    r.port_lo = in.ConsumeIntegral<uint16_t>();
    r.port_hi = in.ConsumeIntegral<uint16_t>();
    in.ConsumeData(r.addr, r.family == AF_INET ? 4 : 16);
    c.rules.push_back(r);
  }
  // The address: the rest of the input, exactly as long as it claims.
  const std::vector<uint8_t> rest = in.ConsumeRemainingBytes<uint8_t>();
  uint8_t* addr = rest.empty() ? nullptr : new uint8_t[rest.size()];
  if (addr) std::memcpy(addr, rest.data(), rest.size());
  const socklen_t len = static_cast<socklen_t>(rest.size());

  const rsock::Decision d =
      rsock::decide(c, program, role, reinterpret_cast<const sockaddr*>(addr), len);
  const int want = reference(c, program, role, addr, rest.size());
  FUZZ_CHECK(d.rule_index == want);
  if (want >= 0) {
    FUZZ_CHECK(d.transport == c.rules[want].transport);
    FUZZ_CHECK(d.candidate == (d.transport != TransportKind::kTcp));
  } else {
    FUZZ_CHECK(!d.candidate && d.transport == TransportKind::kTcp);
  }
  delete[] addr;
  return 0;
}
