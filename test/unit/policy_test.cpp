// Unit tests for src/policy: prefix and port matching for clients, wildcard
// and specific listening addresses for servers, IPv4-mapped IPv6, program and
// role scoping, first-match-wins with tcp exclusions, and sockets that must
// never match (non-inet families, short or null addresses, disabled Config).

#include "policy/policy.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/un.h>

#include <cstring>
#include <string>

namespace rsock {
namespace {

// A socket address in whichever family `text` is written in.
struct Addr {
  sockaddr_storage ss{};
  socklen_t len = 0;
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&ss); }
};

Addr make_addr(const std::string& text, uint16_t port) {
  Addr a;
  if (text.find(':') == std::string::npos) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&a.ss);
    sin->sin_family = AF_INET;
    sin->sin_port = htons(port);
    EXPECT_EQ(inet_pton(AF_INET, text.c_str(), &sin->sin_addr), 1) << text;
    a.len = sizeof(sockaddr_in);
  } else {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&a.ss);
    sin6->sin6_family = AF_INET6;
    sin6->sin6_port = htons(port);
    EXPECT_EQ(inet_pton(AF_INET6, text.c_str(), &sin6->sin6_addr), 1) << text;
    a.len = sizeof(sockaddr_in6);
  }
  return a;
}

PeerRule rule(const std::string& spec, TransportKind transport = TransportKind::kAuto,
              Role role = Role::kAny, const std::string& program = "") {
  PeerRule r;
  std::string err;
  EXPECT_TRUE(parse_peer_rule(spec, &r, &err)) << spec << ": " << err;
  r.transport = transport;
  r.role = role;
  r.program = program;
  return r;
}

Decision decide_for(const Config& c, Role role, const std::string& addr, uint16_t port,
                    std::string_view program = "app") {
  const Addr a = make_addr(addr, port);
  return decide(c, program, role, a.sa(), a.len);
}

// The index of the rule that decided, or -1.
int matched(const Config& c, Role role, const std::string& addr, uint16_t port,
            std::string_view program = "app") {
  return decide_for(c, role, addr, port, program).rule_index;
}

TEST(PolicyDecide, NoRulesNoCandidate) {
  const Config c;
  const Decision d = decide_for(c, Role::kClient, "10.0.0.1", 80);
  EXPECT_FALSE(d.candidate);
  EXPECT_EQ(d.rule_index, -1);
  EXPECT_EQ(d.transport, TransportKind::kTcp);
}

TEST(PolicyDecide, ClientPrefixAndPortRange) {
  Config c;
  c.rules = {rule("10.0.0.0/8:5000-5100")};
  const Decision d = decide_for(c, Role::kClient, "10.1.2.3", 5000);
  EXPECT_TRUE(d.candidate);
  EXPECT_EQ(d.rule_index, 0);
  EXPECT_EQ(d.transport, TransportKind::kAuto);
  EXPECT_EQ(matched(c, Role::kClient, "10.255.255.255", 5100), 0);
  EXPECT_EQ(matched(c, Role::kClient, "10.1.2.3", 4999), -1);
  EXPECT_EQ(matched(c, Role::kClient, "10.1.2.3", 5101), -1);
  EXPECT_EQ(matched(c, Role::kClient, "11.0.0.1", 5000), -1);
  EXPECT_EQ(matched(c, Role::kClient, "9.255.255.255", 5000), -1);
}

TEST(PolicyDecide, ExactHostAndPort) {
  Config c;
  c.rules = {rule("192.168.1.10:443")};
  EXPECT_EQ(matched(c, Role::kClient, "192.168.1.10", 443), 0);
  EXPECT_EQ(matched(c, Role::kClient, "192.168.1.11", 443), -1);
  EXPECT_EQ(matched(c, Role::kClient, "192.168.1.10", 444), -1);
}

TEST(PolicyDecide, NonByteAlignedPrefix) {
  Config c;
  c.rules = {rule("172.16.0.0/12:*")};
  EXPECT_EQ(matched(c, Role::kClient, "172.16.0.1", 1), 0);
  EXPECT_EQ(matched(c, Role::kClient, "172.31.255.255", 65535), 0);
  EXPECT_EQ(matched(c, Role::kClient, "172.32.0.0", 1), -1);
  EXPECT_EQ(matched(c, Role::kClient, "172.15.255.255", 1), -1);
}

TEST(PolicyDecide, HostBitsInRuleDoNotMatter) {
  Config c;
  c.rules = {rule("10.9.9.9/8:80")};
  EXPECT_EQ(matched(c, Role::kClient, "10.0.0.1", 80), 0);
}

TEST(PolicyDecide, StarMatchesEveryPortIncludingZero) {
  Config c;
  c.rules = {rule("10.0.0.1:*")};
  EXPECT_EQ(matched(c, Role::kServer, "10.0.0.1", 0), 0);
  EXPECT_EQ(matched(c, Role::kClient, "10.0.0.1", 1), 0);
  EXPECT_EQ(matched(c, Role::kClient, "10.0.0.1", 65535), 0);
  Config explicit_range;
  explicit_range.rules = {rule("10.0.0.1:1-65535")};
  EXPECT_EQ(matched(explicit_range, Role::kServer, "10.0.0.1", 0), -1);
}

TEST(PolicyDecide, ZeroPrefixMatchesWholeFamilyOnly) {
  Config c;
  c.rules = {rule("0.0.0.0/0:80")};
  EXPECT_EQ(matched(c, Role::kClient, "203.0.113.5", 80), 0);
  EXPECT_EQ(matched(c, Role::kClient, "2001:db8::1", 80), -1);
  Config v6;
  v6.rules = {rule("[::]/0:80")};
  EXPECT_EQ(matched(v6, Role::kClient, "2001:db8::1", 80), 0);
  EXPECT_EQ(matched(v6, Role::kClient, "203.0.113.5", 80), -1);
}

TEST(PolicyDecide, Ipv6Prefix) {
  Config c;
  c.rules = {rule("[fd00::]/8:1000-2000")};
  EXPECT_EQ(matched(c, Role::kClient, "fd12:3456::1", 1500), 0);
  EXPECT_EQ(matched(c, Role::kClient, "fdff:ffff::ffff", 2000), 0);
  EXPECT_EQ(matched(c, Role::kClient, "fe00::1", 1500), -1);
  EXPECT_EQ(matched(c, Role::kClient, "fd00::1", 999), -1);
  Config odd;
  odd.rules = {rule("[2001:db8:8000::]/33:*")};
  EXPECT_EQ(matched(odd, Role::kClient, "2001:db8:ffff::1", 1), 0);
  EXPECT_EQ(matched(odd, Role::kClient, "2001:db8:7fff::1", 1), -1);
  Config host;
  host.rules = {rule("[::1]:80")};
  EXPECT_EQ(matched(host, Role::kClient, "::1", 80), 0);
  EXPECT_EQ(matched(host, Role::kClient, "::2", 80), -1);
}

TEST(PolicyDecide, V4MappedPeerMatchesIpv4Rule) {
  Config c;
  c.rules = {rule("[fd00::]/8:80"), rule("10.0.0.0/8:80")};
  EXPECT_EQ(matched(c, Role::kClient, "::ffff:10.1.2.3", 80), 1);
  EXPECT_EQ(matched(c, Role::kClient, "::ffff:11.1.2.3", 80), -1);
  EXPECT_EQ(matched(c, Role::kServer, "::ffff:10.1.2.3", 80), 1);
  // A v4-mapped rule is the same as the IPv4 rule.
  Config mapped_rule;
  mapped_rule.rules = {rule("[::ffff:10.0.0.0]/104:80")};
  EXPECT_EQ(matched(mapped_rule, Role::kClient, "10.3.3.3", 80), 0);
  EXPECT_EQ(matched(mapped_rule, Role::kClient, "::ffff:10.3.3.3", 80), 0);
}

TEST(PolicyDecide, ServerIpv4WildcardMatchesIpv4RulesByPort) {
  Config c;
  c.rules = {rule("10.0.0.0/8:6379", TransportKind::kAuto, Role::kServer)};
  EXPECT_EQ(matched(c, Role::kServer, "0.0.0.0", 6379), 0);
  EXPECT_EQ(matched(c, Role::kServer, "0.0.0.0", 6380), -1);
  EXPECT_EQ(matched(c, Role::kServer, "10.2.3.4", 6379), 0);
  EXPECT_EQ(matched(c, Role::kServer, "192.168.1.1", 6379), -1);
  // An IPv4 wildcard never sees IPv6 traffic.
  Config v6;
  v6.rules = {rule("[fd00::]/8:6379", TransportKind::kAuto, Role::kServer)};
  EXPECT_EQ(matched(v6, Role::kServer, "0.0.0.0", 6379), -1);
}

TEST(PolicyDecide, ServerIpv6WildcardMatchesBothFamiliesByPort) {
  Config c;
  c.rules = {rule("10.0.0.0/8:6379", TransportKind::kShm, Role::kServer),
             rule("[fd00::]/8:7000", TransportKind::kRdma, Role::kServer)};
  Decision d = decide_for(c, Role::kServer, "::", 6379);
  EXPECT_EQ(d.rule_index, 0);
  EXPECT_EQ(d.transport, TransportKind::kShm);
  d = decide_for(c, Role::kServer, "::", 7000);
  EXPECT_EQ(d.rule_index, 1);
  EXPECT_EQ(d.transport, TransportKind::kRdma);
  EXPECT_EQ(matched(c, Role::kServer, "::", 7001), -1);
  EXPECT_EQ(matched(c, Role::kServer, "fd00::5", 7000), 1);
  EXPECT_EQ(matched(c, Role::kServer, "fe00::5", 7000), -1);
}

TEST(PolicyDecide, ServerV4MappedWildcardIsIpv4Wildcard) {
  Config c;
  c.rules = {rule("[fd00::]/8:80"), rule("10.0.0.0/8:80")};
  EXPECT_EQ(matched(c, Role::kServer, "::ffff:0.0.0.0", 80), 1);
}

TEST(PolicyDecide, ClientWildcardDestinationIsNotSpecial) {
  Config c;
  c.rules = {rule("10.0.0.0/8:80")};
  // connect() to 0.0.0.0 or :: reaches the local host; it is an ordinary
  // address there, not "any".
  EXPECT_EQ(matched(c, Role::kClient, "0.0.0.0", 80), -1);
  EXPECT_EQ(matched(c, Role::kClient, "::", 80), -1);
  EXPECT_EQ(matched(c, Role::kServer, "0.0.0.0", 80), 0);
}

TEST(PolicyDecide, RoleScoping) {
  Config c;
  c.rules = {rule("10.0.0.1:1", TransportKind::kAuto, Role::kClient),
             rule("10.0.0.1:2", TransportKind::kAuto, Role::kServer),
             rule("10.0.0.1:3", TransportKind::kAuto, Role::kAny)};
  EXPECT_EQ(matched(c, Role::kClient, "10.0.0.1", 1), 0);
  EXPECT_EQ(matched(c, Role::kServer, "10.0.0.1", 1), -1);
  EXPECT_EQ(matched(c, Role::kServer, "10.0.0.1", 2), 1);
  EXPECT_EQ(matched(c, Role::kClient, "10.0.0.1", 2), -1);
  EXPECT_EQ(matched(c, Role::kClient, "10.0.0.1", 3), 2);
  EXPECT_EQ(matched(c, Role::kServer, "10.0.0.1", 3), 2);
}

TEST(PolicyDecide, ProgramScoping) {
  Config c;
  c.rules = {rule("10.0.0.1:80", TransportKind::kRdma, Role::kAny, "redis-server"),
             rule("10.0.0.1:80", TransportKind::kShm)};
  Decision d = decide_for(c, Role::kClient, "10.0.0.1", 80, "redis-server");
  EXPECT_EQ(d.rule_index, 0);
  EXPECT_EQ(d.transport, TransportKind::kRdma);
  // Another program skips the scoped rule and falls through to the next.
  d = decide_for(c, Role::kClient, "10.0.0.1", 80, "redis-cli");
  EXPECT_EQ(d.rule_index, 1);
  EXPECT_EQ(d.transport, TransportKind::kShm);
  EXPECT_EQ(matched(c, Role::kClient, "10.0.0.1", 80, ""), 1);
  EXPECT_EQ(matched(c, Role::kClient, "10.0.0.1", 80, "redis-server2"), 1);
  EXPECT_EQ(matched(c, Role::kClient, "10.0.0.1", 80, "redis"), 1);
}

TEST(PolicyDecide, FirstMatchWinsWithTcpExclusion) {
  Config c;
  c.rules = {rule("10.0.0.5:*", TransportKind::kTcp), rule("10.0.0.0/8:*")};
  Decision d = decide_for(c, Role::kClient, "10.0.0.5", 9100);
  EXPECT_FALSE(d.candidate);
  EXPECT_EQ(d.rule_index, 0);
  EXPECT_EQ(d.transport, TransportKind::kTcp);
  d = decide_for(c, Role::kClient, "10.0.0.6", 9100);
  EXPECT_TRUE(d.candidate);
  EXPECT_EQ(d.rule_index, 1);
  EXPECT_EQ(d.transport, TransportKind::kAuto);

  // Order matters: the broad rule first swallows the exception.
  std::swap(c.rules[0], c.rules[1]);
  d = decide_for(c, Role::kClient, "10.0.0.5", 9100);
  EXPECT_TRUE(d.candidate);
  EXPECT_EQ(d.rule_index, 0);
}

TEST(PolicyDecide, TransportIsTheRulesTransport) {
  for (TransportKind t : {TransportKind::kAuto, TransportKind::kRdma, TransportKind::kShm}) {
    Config c;
    c.rules = {rule("10.0.0.1:80", t)};
    const Decision d = decide_for(c, Role::kClient, "10.0.0.1", 80);
    EXPECT_TRUE(d.candidate) << transport_name(t);
    EXPECT_EQ(d.transport, t) << transport_name(t);
  }
}

TEST(PolicyDecide, NonInetAndMalformedAddressesNeverMatch) {
  Config c;
  c.rules = {rule("0.0.0.0/0:*"), rule("[::]/0:*")};

  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  std::strcpy(un.sun_path, "/tmp/sock");
  Decision d = decide(c, "app", Role::kClient, reinterpret_cast<const sockaddr*>(&un), sizeof(un));
  EXPECT_FALSE(d.candidate);
  EXPECT_EQ(d.rule_index, -1);
  d = decide(c, "app", Role::kServer, reinterpret_cast<const sockaddr*>(&un), sizeof(un));
  EXPECT_EQ(d.rule_index, -1);

  sockaddr_storage unspec{};
  unspec.ss_family = AF_UNSPEC;
  EXPECT_EQ(
      decide(c, "app", Role::kClient, reinterpret_cast<const sockaddr*>(&unspec), sizeof(unspec))
          .rule_index,
      -1);

  EXPECT_EQ(decide(c, "app", Role::kClient, nullptr, 0).rule_index, -1);

  // Truncated addresses are ignored rather than read past their end.
  const Addr v4 = make_addr("10.0.0.1", 80);
  EXPECT_EQ(decide(c, "app", Role::kClient, v4.sa(), v4.len).rule_index, 0);
  EXPECT_EQ(decide(c, "app", Role::kClient, v4.sa(), v4.len - 1).rule_index, -1);
  const Addr v6 = make_addr("fd00::1", 80);
  EXPECT_EQ(decide(c, "app", Role::kClient, v6.sa(), v6.len).rule_index, 1);
  EXPECT_EQ(decide(c, "app", Role::kClient, v6.sa(), sizeof(sockaddr_in)).rule_index, -1);
}

TEST(PolicyDecide, DisabledConfigNeverAccelerates) {
  Config c;
  c.rules = {rule("10.0.0.0/8:*")};
  EXPECT_TRUE(decide_for(c, Role::kClient, "10.0.0.1", 80).candidate);
  c.disabled = true;
  const Decision d = decide_for(c, Role::kClient, "10.0.0.1", 80);
  EXPECT_FALSE(d.candidate);
  EXPECT_EQ(d.rule_index, -1);
}

TEST(PolicyDecide, OversizedHandBuiltPrefixIsClamped) {
  Config c;
  PeerRule r = rule("10.0.0.1:80");
  r.prefix_len = 200;  // not producible by the parser
  c.rules = {r};
  EXPECT_EQ(matched(c, Role::kClient, "10.0.0.1", 80), 0);
  EXPECT_EQ(matched(c, Role::kClient, "10.0.0.2", 80), -1);
}

TEST(PolicyDecide, EndToEndFromParsedConfig) {
  const std::string text =
      "rule tcp any 10.0.0.0/8:9100\n"
      "rule auto server 0.0.0.0/0:6379 program=redis-server\n"
      "rule rdma client [fd00::]/8:*\n";
  const auto env = [](const char* name) -> const char* {
    if (std::strcmp(name, "RSOCK_CONF") == 0) return "t.conf";
    if (std::strcmp(name, "RSOCK_PEERS") == 0) return "10.0.0.0/8:9000-9200";
    return nullptr;
  };
  std::vector<ConfigError> errors;
  const Config c = parse_config(env, &text, &errors);
  ASSERT_TRUE(errors.empty());
  ASSERT_EQ(c.rules.size(), 4u);
  // RSOCK_PEERS comes first, so it wins over the file's tcp exclusion.
  Decision d = decide_for(c, Role::kClient, "10.0.0.1", 9100);
  EXPECT_TRUE(d.candidate);
  EXPECT_EQ(d.rule_index, 0);
  d = decide_for(c, Role::kClient, "10.0.0.1", 9300);
  EXPECT_EQ(d.rule_index, -1);
  d = decide_for(c, Role::kServer, "::", 6379, "redis-server");
  EXPECT_EQ(d.rule_index, 2);
  EXPECT_TRUE(d.candidate);
  EXPECT_EQ(matched(c, Role::kServer, "::", 6379, "nginx"), -1);
  d = decide_for(c, Role::kClient, "fd00::9", 5201);
  EXPECT_EQ(d.rule_index, 3);
  EXPECT_EQ(d.transport, TransportKind::kRdma);
  EXPECT_EQ(matched(c, Role::kServer, "fd00::9", 5201), -1);
}

}  // namespace
}  // namespace rsock
