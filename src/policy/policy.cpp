// Policy: matches one socket (program, role, address) against the ordered peer
// rules of a Config and says whether to try acceleration and with which
// transport. The first matching rule wins, so a `tcp` rule placed before a
// broader one carves out an exception. Pure; safe to call from any thread.

#include "policy/policy.h"

#include <netinet/in.h>

#include <cstring>

namespace rsock {
namespace {

// The socket address reduced to what the rules can talk about. v4-mapped IPv6
// addresses are unwrapped to IPv4 because a dual-stack socket reports IPv4
// peers that way and users write those peers as IPv4 rules.
struct SocketAddr {
  sa_family_t family = AF_UNSPEC;
  uint8_t addr[16] = {};
  uint16_t port = 0;  // host byte order
  bool wildcard = false;
};

constexpr uint8_t kV4MappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};

bool to_socket_addr(const sockaddr* sa, socklen_t len, SocketAddr* out) {
  if (sa == nullptr || len < static_cast<socklen_t>(sizeof(sa_family_t))) return false;
  if (sa->sa_family == AF_INET) {
    if (len < static_cast<socklen_t>(sizeof(sockaddr_in))) return false;
    sockaddr_in sin;
    std::memcpy(&sin, sa, sizeof(sin));  // the caller's buffer may be unaligned
    out->family = AF_INET;
    std::memcpy(out->addr, &sin.sin_addr, 4);
    out->port = ntohs(sin.sin_port);
    out->wildcard = sin.sin_addr.s_addr == htonl(INADDR_ANY);
    return true;
  }
  if (sa->sa_family == AF_INET6) {
    if (len < static_cast<socklen_t>(sizeof(sockaddr_in6))) return false;
    sockaddr_in6 sin6;
    std::memcpy(&sin6, sa, sizeof(sin6));
    out->port = ntohs(sin6.sin6_port);
    const uint8_t* a = sin6.sin6_addr.s6_addr;
    if (std::memcmp(a, kV4MappedPrefix, sizeof(kV4MappedPrefix)) == 0) {
      out->family = AF_INET;
      std::memcpy(out->addr, a + 12, 4);
      out->wildcard = a[12] == 0 && a[13] == 0 && a[14] == 0 && a[15] == 0;
      return true;
    }
    out->family = AF_INET6;
    std::memcpy(out->addr, a, 16);
    static constexpr uint8_t kZero[16] = {};
    out->wildcard = std::memcmp(a, kZero, 16) == 0;
    return true;
  }
  return false;  // AF_UNIX and friends are never accelerated
}

bool prefix_matches(const uint8_t* rule_addr, const uint8_t* addr, unsigned prefix_len) {
  const unsigned whole = prefix_len / 8;
  if (std::memcmp(rule_addr, addr, whole) != 0) return false;
  const unsigned bits = prefix_len % 8;
  if (bits == 0) return true;
  const uint8_t mask = static_cast<uint8_t>(0xFFu << (8 - bits));
  return (rule_addr[whole] & mask) == (addr[whole] & mask);
}

bool address_matches(const PeerRule& rule, const SocketAddr& sa, Role role) {
  // A wildcard listener accepts on every local address of its family, so
  // whatever address the rule names is among them. An IPv6 wildcard is
  // dual-stack (unless IPV6_V6ONLY, which we cannot see here) and so also
  // covers IPv4 rules; an IPv4 wildcard never sees IPv6 traffic.
  if (role == Role::kServer && sa.wildcard) {
    return sa.family == AF_INET6 || rule.family == AF_INET;
  }
  if (rule.family != sa.family) return false;
  // Clamped because a hand-built PeerRule could carry a prefix longer than
  // its address, which would read past rule.addr.
  const unsigned max_len = rule.family == AF_INET ? 32 : 128;
  const unsigned prefix_len = rule.prefix_len < max_len ? rule.prefix_len : max_len;
  return prefix_matches(rule.addr, sa.addr, prefix_len);
}

}  // namespace

Decision decide(const Config& config, std::string_view program, Role role, const sockaddr* addr,
                socklen_t len) {
  Decision decision;
  // A disabled Config (RSOCK_DISABLE=1 or a configuration error) means plain
  // TCP everywhere, even if some rules parsed.
  if (config.disabled) return decision;
  SocketAddr sa;
  if (!to_socket_addr(addr, len, &sa)) return decision;
  for (size_t i = 0; i < config.rules.size(); ++i) {
    const PeerRule& rule = config.rules[i];
    if (!rule.program.empty() && rule.program != program) continue;
    if (rule.role != Role::kAny && rule.role != role) continue;
    if (sa.port < rule.port_lo || sa.port > rule.port_hi) continue;
    if (!address_matches(rule, sa, role)) continue;
    decision.rule_index = static_cast<int>(i);
    decision.transport = rule.transport;
    decision.candidate = rule.transport != TransportKind::kTcp;
    return decision;
  }
  return decision;
}

}  // namespace rsock
