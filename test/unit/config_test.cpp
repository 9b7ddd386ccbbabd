// Unit tests for src/config: peer rule and size syntax, every RSOCK_* variable
// (valid values, invalid values that must disable librsock and name the
// variable), the rule file format with its line-numbered errors, environment
// over file precedence, and that the shipped conf/rsock.conf parses; error
// messages cut long values, escape non-printable bytes and report over-long
// rule-file lines (with the inputs config_env_fuzz and config_file_fuzz
// found, kept in test/fuzz/corpus/).

#include "config/config.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace rsock {
namespace {

using Env = std::map<std::string, std::string>;

EnvLookup lookup(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

Config parse_env(const Env& env, std::vector<ConfigError>* errors,
                 const std::string* conf_text = nullptr) {
  return parse_config(lookup(env), conf_text, errors);
}

std::string join(const std::vector<ConfigError>& errors) {
  std::string out;
  for (const ConfigError& e : errors) out += e.to_string() + "\n";
  return out;
}

std::string v4_text(const PeerRule& r) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, r.addr, buf, sizeof(buf));
  return buf;
}

std::string v6_text(const PeerRule& r) {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, r.addr, buf, sizeof(buf));
  return buf;
}

std::string read_file(const std::string& path, bool* ok) {
  std::ifstream in(path);
  *ok = static_cast<bool>(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---------------------------------------------------------------------------
// Names and sizes

TEST(ConfigNames, TransportAndRoleNames) {
  EXPECT_STREQ(transport_name(TransportKind::kAuto), "auto");
  EXPECT_STREQ(transport_name(TransportKind::kRdma), "rdma");
  EXPECT_STREQ(transport_name(TransportKind::kShm), "shm");
  EXPECT_STREQ(transport_name(TransportKind::kTcp), "tcp");
  EXPECT_STREQ(role_name(Role::kAny), "any");
  EXPECT_STREQ(role_name(Role::kClient), "client");
  EXPECT_STREQ(role_name(Role::kServer), "server");
}

TEST(ConfigParseSize, AcceptsBinaryUnits) {
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"0", 0},
      {"65536", 65536},
      {"4096B", 4096},
      {"4096b", 4096},
      {"64K", 64u << 10},
      {"64k", 64u << 10},
      {"64KB", 64u << 10},
      {"64kb", 64u << 10},
      {"64KiB", 64u << 10},
      {"64kib", 64u << 10},
      {"1M", 1u << 20},
      {"3m", 3u << 20},
      {"2MiB", 2u << 20},
      {"1G", size_t{1} << 30},
      {"1gb", size_t{1} << 30},
      {"007K", 7u << 10},
  };
  for (const auto& [text, want] : cases) {
    size_t got = 12345;
    EXPECT_TRUE(parse_size(text, &got)) << text;
    EXPECT_EQ(got, want) << text;
  }
}

TEST(ConfigParseSize, RejectsJunk) {
  for (const char* text :
       {"", "K", "B", "iB", "-1", "+1", " 1M", "1M ", "1 M", "1.5M", "1T", "1KK", "1iB", "1KiBB",
        "0x10", "1e6", "99999999999999999999", "18446744073709551616", "17179869184G"}) {
    size_t got = 777;
    EXPECT_FALSE(parse_size(text, &got)) << '"' << text << '"';
    EXPECT_EQ(got, 777u) << "output written on failure for \"" << text << '"';
  }
}

// ---------------------------------------------------------------------------
// parse_peer_rule

TEST(ConfigPeerRule, Ipv4HostAndPort) {
  PeerRule r;
  r.transport = TransportKind::kShm;
  r.role = Role::kServer;
  r.program = "keep";
  std::string err;
  ASSERT_TRUE(parse_peer_rule("10.1.2.3:80", &r, &err)) << err;
  EXPECT_EQ(r.family, AF_INET);
  EXPECT_EQ(v4_text(r), "10.1.2.3");
  EXPECT_EQ(r.prefix_len, 32);
  EXPECT_EQ(r.port_lo, 80);
  EXPECT_EQ(r.port_hi, 80);
  // Only the address part is parsed; the scope fields are the caller's.
  EXPECT_EQ(r.transport, TransportKind::kShm);
  EXPECT_EQ(r.role, Role::kServer);
  EXPECT_EQ(r.program, "keep");
}

TEST(ConfigPeerRule, Ipv4PrefixMasksHostBits) {
  const std::vector<std::tuple<std::string, std::string, int>> cases = {
      {"10.1.2.3/8:80", "10.0.0.0", 8},
      {"10.1.255.3/20:80", "10.1.240.0", 20},
      {"10.1.2.3/0:80", "0.0.0.0", 0},
      {"192.168.7.9/32:80", "192.168.7.9", 32},
      {"192.168.7.255/31:80", "192.168.7.254", 31},
      {"172.31.255.255/12:80", "172.16.0.0", 12},
  };
  for (const auto& [text, addr, prefix] : cases) {
    PeerRule r;
    std::string err;
    ASSERT_TRUE(parse_peer_rule(text, &r, &err)) << text << ": " << err;
    EXPECT_EQ(r.family, AF_INET) << text;
    EXPECT_EQ(v4_text(r), addr) << text;
    EXPECT_EQ(r.prefix_len, prefix) << text;
    for (int i = 4; i < 16; ++i) EXPECT_EQ(r.addr[i], 0) << text << " byte " << i;
  }
}

TEST(ConfigPeerRule, PortForms) {
  const std::vector<std::tuple<std::string, int, int>> cases = {
      {"10.0.0.1:*", 0, 65535},         {"10.0.0.1:1", 1, 1},
      {"10.0.0.1:65535", 65535, 65535}, {"10.0.0.1:1000-2000", 1000, 2000},
      {"10.0.0.1:80-80", 80, 80},       {"10.0.0.1:1-65535", 1, 65535},
      {"10.0.0.1:0080", 80, 80},        {"[::1]:*", 0, 65535},
      {"[::1]:5000-5100", 5000, 5100},
  };
  for (const auto& [text, lo, hi] : cases) {
    PeerRule r;
    r.port_lo = 4242;
    r.port_hi = 4243;
    std::string err;
    ASSERT_TRUE(parse_peer_rule(text, &r, &err)) << text << ": " << err;
    EXPECT_EQ(r.port_lo, lo) << text;
    EXPECT_EQ(r.port_hi, hi) << text;
  }
}

TEST(ConfigPeerRule, Ipv6) {
  const std::vector<std::tuple<std::string, std::string, int>> cases = {
      {"[::1]:80", "::1", 128},
      {"[fd00::]/8:1000-2000", "fd00::", 8},
      {"[fd12:3456::1]/12:*", "fd10::", 12},
      {"[2001:db8:ffff::1]/33:443", "2001:db8:8000::", 33},
      {"[2001:db8::1]/0:443", "::", 0},
      {"[2001:db8::1]/128:443", "2001:db8::1", 128},
  };
  for (const auto& [text, addr, prefix] : cases) {
    PeerRule r;
    std::string err;
    ASSERT_TRUE(parse_peer_rule(text, &r, &err)) << text << ": " << err;
    EXPECT_EQ(r.family, AF_INET6) << text;
    EXPECT_EQ(v6_text(r), addr) << text;
    EXPECT_EQ(r.prefix_len, prefix) << text;
  }
}

TEST(ConfigPeerRule, V4MappedIpv6BecomesIpv4) {
  PeerRule r;
  std::string err;
  ASSERT_TRUE(parse_peer_rule("[::ffff:10.0.0.1]:80", &r, &err)) << err;
  EXPECT_EQ(r.family, AF_INET);
  EXPECT_EQ(v4_text(r), "10.0.0.1");
  EXPECT_EQ(r.prefix_len, 32);
  for (int i = 4; i < 16; ++i) EXPECT_EQ(r.addr[i], 0) << i;

  ASSERT_TRUE(parse_peer_rule("[::ffff:10.9.8.7]/104:80", &r, &err)) << err;
  EXPECT_EQ(r.family, AF_INET);
  EXPECT_EQ(v4_text(r), "10.0.0.0");
  EXPECT_EQ(r.prefix_len, 8);

  // A prefix shorter than the mapped range says something about IPv6 space
  // in general, so it stays IPv6.
  ASSERT_TRUE(parse_peer_rule("[::ffff:10.9.8.7]/80:80", &r, &err)) << err;
  EXPECT_EQ(r.family, AF_INET6);
  EXPECT_EQ(r.prefix_len, 80);
}

TEST(ConfigPeerRule, SurroundingWhitespaceIgnored) {
  PeerRule r;
  std::string err;
  ASSERT_TRUE(parse_peer_rule(" \t10.0.0.1:80 ", &r, &err)) << err;
  EXPECT_EQ(v4_text(r), "10.0.0.1");
  EXPECT_EQ(r.port_lo, 80);
}

TEST(ConfigPeerRule, RejectsInvalidWithClearMessage) {
  // {input, a phrase the error must contain}
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "empty"},
      {"   ", "empty"},
      {"10.0.0.1", "missing :PORT"},
      {"10.0.0.1/8", "missing :PORT"},
      {"10.0.0.1:", "missing port"},
      {"10.0.0.1:0", "\"0\" is out of range"},
      {"10.0.0.1:70000", "\"70000\" is out of range"},
      {"10.0.0.1:65536", "out of range"},
      {"10.0.0.1:99999999999999999999999", "out of range"},
      {"10.0.0.1:2000-1000", "reversed"},
      {"10.0.0.1:0-100", "\"0\" is out of range"},
      {"10.0.0.1:100-70000", "\"70000\" is out of range"},
      {"10.0.0.1:http", "\"http\" is not a number"},
      {"10.0.0.1:80-", "missing port"},
      {"10.0.0.1:-80", "missing port"},
      {"10.0.0.1:*-80", "is not a number"},
      {"10.0.0.1:80-90-100", "is not a number"},
      {"10.0.0.1:+80", "is not a number"},
      {"10.0.0.1:80 x", "is not a number"},
      {"10.0.0.1/33:80", "prefix \"33\""},
      {"10.0.0.1/:80", "prefix \"\""},
      {"10.0.0.1/x:80", "prefix \"x\""},
      {"10.0.0.1/-1:80", "prefix"},
      {"[::1]/129:80", "prefix \"129\""},
      {"[::1]/:80", "prefix"},
      {"::1:80", "brackets"},
      {"fd00::/8:80", "brackets"},
      {"[::1:80", "missing ']'"},
      {"[::1]80", "unexpected \"80\""},
      {"[::1]", "missing :PORT"},
      {"[]:80", "missing address"},
      {":80", "missing address"},
      {"/8:80", "missing address"},
      {"10.0.0:80", "\"10.0.0\" is not a numeric IPv4 address"},
      {"256.0.0.1:80", "not a numeric IPv4"},
      {"example.com:80", "host names"},
      {"junk", "not a numeric IPv4"},
      {"[10.0.0.1]:80", "not a numeric IPv6"},
      {"[fd00::/8]:80", "not a numeric IPv6"},
      {"[fe80::1%eth0]:80", "not a numeric IPv6"},
  };
  for (const auto& [text, phrase] : cases) {
    PeerRule r;
    r.family = AF_INET6;
    r.prefix_len = 99;
    r.port_lo = 4242;
    r.port_hi = 4243;
    std::string err;
    EXPECT_FALSE(parse_peer_rule(text, &r, &err)) << '"' << text << '"';
    EXPECT_NE(err.find(phrase), std::string::npos)
        << '"' << text << "\" gave \"" << err << "\", expected it to contain \"" << phrase << '"';
    // *out is left alone on failure.
    EXPECT_EQ(r.family, AF_INET6) << text;
    EXPECT_EQ(r.prefix_len, 99) << text;
    EXPECT_EQ(r.port_lo, 4242) << text;
    EXPECT_EQ(r.port_hi, 4243) << text;
  }
}

TEST(ConfigPeerRule, NullErrorPointerIsAllowed) {
  PeerRule r;
  EXPECT_FALSE(parse_peer_rule("junk", &r, nullptr));
  EXPECT_TRUE(parse_peer_rule("10.0.0.1:1", &r, nullptr));
}

// ---------------------------------------------------------------------------
// Environment

TEST(ConfigEnv, DefaultsWhenNothingSet) {
  std::vector<ConfigError> errors;
  const Config c = parse_env({}, &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_FALSE(c.disabled);
  EXPECT_EQ(c.log_level, kDefaultLogLevel);
  EXPECT_EQ(c.log_level, kLogWarn);
  EXPECT_EQ(c.log_file, "");
  EXPECT_EQ(c.stats_path, "");
  EXPECT_EQ(c.conf_path, "");
  EXPECT_EQ(c.ring_bytes, kDefaultRingBytes);
  EXPECT_EQ(c.spin_us, kDefaultSpinUs);
  EXPECT_EQ(c.connect_timeout_ms, kDefaultConnectTimeoutMs);
  EXPECT_TRUE(c.rules.empty());
}

TEST(ConfigEnv, EmptyLookupFunctionAndNullErrors) {
  const Config c = parse_config(EnvLookup(), nullptr, nullptr);
  EXPECT_FALSE(c.disabled);
  EXPECT_TRUE(c.rules.empty());
  // Errors still disable even when the caller does not collect them.
  const Env env = {{"RSOCK_SPIN_US", "x"}};
  EXPECT_TRUE(parse_config(lookup(env), nullptr, nullptr).disabled);
}

TEST(ConfigEnv, ErrorsAreAppended) {
  std::vector<ConfigError> errors = {{"earlier", "kept"}};
  const Config c = parse_env({{"RSOCK_SPIN_US", "x"}}, &errors);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_EQ(errors[0].source, "earlier");
  EXPECT_EQ(errors[1].source, "RSOCK_SPIN_US");
  EXPECT_TRUE(c.disabled);
  // A pre-existing entry alone does not disable: only this parse's errors do.
  std::vector<ConfigError> old = {{"earlier", "kept"}};
  EXPECT_FALSE(parse_env({}, &old).disabled);
}

TEST(ConfigEnv, ErrorToString) {
  const ConfigError e{"RSOCK_RING_SIZE", "\"3M\" is not a power of two"};
  EXPECT_EQ(e.to_string(),
            "librsock: RSOCK_RING_SIZE: \"3M\" is not a power of two; running on plain TCP");
}

TEST(ConfigEnv, Disable) {
  for (const auto& [value, disabled] : std::vector<std::pair<std::string, bool>>{
           {"1", true}, {"0", false}, {"", false}, {" 1 ", true}}) {
    std::vector<ConfigError> errors;
    const Config c = parse_env({{"RSOCK_DISABLE", value}}, &errors);
    EXPECT_TRUE(errors.empty()) << value << ": " << join(errors);
    EXPECT_EQ(c.disabled, disabled) << '"' << value << '"';
  }
  for (const char* bad : {"yes", "true", "2", "-1", "01", "on"}) {
    std::vector<ConfigError> errors;
    const Config c = parse_env({{"RSOCK_DISABLE", bad}}, &errors);
    EXPECT_TRUE(c.disabled) << bad;
    ASSERT_EQ(errors.size(), 1u) << bad;
    EXPECT_EQ(errors[0].source, "RSOCK_DISABLE");
    EXPECT_NE(errors[0].message.find(std::string("\"") + bad + "\""), std::string::npos)
        << errors[0].message;
    EXPECT_NE(errors[0].message.find("expected 0 or 1"), std::string::npos) << errors[0].message;
  }
}

TEST(ConfigEnv, PeersList) {
  std::vector<ConfigError> errors;
  const Config c =
      parse_env({{"RSOCK_PEERS", "10.0.0.1:80, [::1]:443 ,\t192.168.0.0/16:*,,"}}, &errors);
  ASSERT_TRUE(errors.empty()) << join(errors);
  EXPECT_FALSE(c.disabled);
  ASSERT_EQ(c.rules.size(), 3u);
  EXPECT_EQ(c.rules[0].family, AF_INET);
  EXPECT_EQ(v4_text(c.rules[0]), "10.0.0.1");
  EXPECT_EQ(c.rules[0].port_lo, 80);
  EXPECT_EQ(c.rules[1].family, AF_INET6);
  EXPECT_EQ(v6_text(c.rules[1]), "::1");
  EXPECT_EQ(c.rules[1].port_lo, 443);
  EXPECT_EQ(v4_text(c.rules[2]), "192.168.0.0");
  EXPECT_EQ(c.rules[2].prefix_len, 16);
  EXPECT_EQ(c.rules[2].port_lo, 0);
  EXPECT_EQ(c.rules[2].port_hi, 65535);
  for (const PeerRule& r : c.rules) {
    EXPECT_EQ(r.transport, TransportKind::kAuto);
    EXPECT_EQ(r.role, Role::kAny);
    EXPECT_EQ(r.program, "");
  }
}

TEST(ConfigEnv, PeersEveryBadRuleReported) {
  std::vector<ConfigError> errors;
  const Config c =
      parse_env({{"RSOCK_PEERS", "10.0.0.1:70000, 10.0.0.2:80, ::1:80, 10.0.0.3"}}, &errors);
  EXPECT_TRUE(c.disabled);
  ASSERT_EQ(errors.size(), 3u) << join(errors);
  for (const ConfigError& e : errors) EXPECT_EQ(e.source, "RSOCK_PEERS");
  EXPECT_NE(errors[0].message.find("\"10.0.0.1:70000\""), std::string::npos) << errors[0].message;
  EXPECT_NE(errors[0].message.find("out of range"), std::string::npos) << errors[0].message;
  EXPECT_NE(errors[1].message.find("\"::1:80\""), std::string::npos) << errors[1].message;
  EXPECT_NE(errors[2].message.find("\"10.0.0.3\""), std::string::npos) << errors[2].message;
  EXPECT_NE(errors[2].message.find("missing :PORT"), std::string::npos) << errors[2].message;
}

TEST(ConfigEnv, LogLevel) {
  const std::vector<std::pair<std::string, int>> cases = {
      {"error", kLogError}, {"warn", kLogWarn}, {"info", kLogInfo},   {"debug", kLogDebug},
      {"trace", kLogTrace}, {"0", kLogError},   {"1", kLogWarn},      {"2", kLogInfo},
      {"3", kLogDebug},     {"4", kLogTrace},   {"DEBUG", kLogDebug}, {"Trace", kLogTrace},
      {" info ", kLogInfo},
  };
  for (const auto& [value, level] : cases) {
    std::vector<ConfigError> errors;
    const Config c = parse_env({{"RSOCK_LOG_LEVEL", value}}, &errors);
    EXPECT_TRUE(errors.empty()) << value << ": " << join(errors);
    EXPECT_EQ(c.log_level, level) << value;
    EXPECT_FALSE(c.disabled) << value;
  }
}

// Shared check for a variable given an invalid value: librsock is disabled,
// exactly one error names the variable and quotes the value.
void expect_rejected(const std::string& var, const std::string& value,
                     const std::string& expected_phrase) {
  std::vector<ConfigError> errors;
  const Config c = parse_env({{var, value}}, &errors);
  EXPECT_TRUE(c.disabled) << var << "=" << value;
  ASSERT_EQ(errors.size(), 1u) << var << "=" << value << "\n" << join(errors);
  EXPECT_EQ(errors[0].source, var);
  EXPECT_NE(errors[0].message.find("\"" + value + "\""), std::string::npos) << errors[0].message;
  EXPECT_NE(errors[0].message.find(expected_phrase), std::string::npos) << errors[0].message;
  const std::string line = errors[0].to_string();
  EXPECT_EQ(line.rfind("librsock: " + var + ": ", 0), 0u) << line;
}

TEST(ConfigEnv, LogLevelInvalid) {
  for (const char* bad : {"verbose", "5", "-1", "warning", "10", "1.0", "err"}) {
    expect_rejected("RSOCK_LOG_LEVEL", bad, "error, warn, info, debug, trace or 0..4");
  }
}

TEST(ConfigEnv, Paths) {
  std::vector<ConfigError> errors;
  const Config c =
      parse_env({{"RSOCK_LOG_FILE", "/tmp/my log.txt"}, {"RSOCK_STATS", " /tmp/stats"}}, &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  // Paths are taken verbatim, spaces included.
  EXPECT_EQ(c.log_file, "/tmp/my log.txt");
  EXPECT_EQ(c.stats_path, " /tmp/stats");
}

TEST(ConfigEnv, RingSize) {
  const std::vector<std::pair<std::string, size_t>> cases = {
      {"4K", kMinRingBytes}, {"4096", 4096},    {"256M", kMaxRingBytes}, {"64k", 64u << 10},
      {"1MiB", 1u << 20},    {"2mb", 2u << 20}, {" 128K ", 128u << 10},  {"268435456", 256u << 20},
  };
  for (const auto& [value, bytes] : cases) {
    std::vector<ConfigError> errors;
    const Config c = parse_env({{"RSOCK_RING_SIZE", value}}, &errors);
    EXPECT_TRUE(errors.empty()) << value << ": " << join(errors);
    EXPECT_EQ(c.ring_bytes, bytes) << value;
  }
}

TEST(ConfigEnv, RingSizeInvalid) {
  expect_rejected("RSOCK_RING_SIZE", "3M", "not a power of two");
  expect_rejected("RSOCK_RING_SIZE", "65537", "not a power of two");
  expect_rejected("RSOCK_RING_SIZE", "2K", "out of range");
  expect_rejected("RSOCK_RING_SIZE", "0", "out of range");
  expect_rejected("RSOCK_RING_SIZE", "512M", "out of range");
  expect_rejected("RSOCK_RING_SIZE", "1G", "out of range");
  expect_rejected("RSOCK_RING_SIZE", "1T", "not a size");
  expect_rejected("RSOCK_RING_SIZE", "abc", "not a size");
  expect_rejected("RSOCK_RING_SIZE", "-1M", "not a size");
  expect_rejected("RSOCK_RING_SIZE", "99999999999999999999999", "not a size");
  // The message states the accepted range in the same units the user types.
  std::vector<ConfigError> errors;
  parse_env({{"RSOCK_RING_SIZE", "3M"}}, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("from 4K to 256M"), std::string::npos) << errors[0].message;
  // A rejected value leaves the default in place.
  EXPECT_EQ(parse_env({{"RSOCK_RING_SIZE", "3M"}}, nullptr).ring_bytes, kDefaultRingBytes);
}

TEST(ConfigEnv, SpinUs) {
  for (const auto& [value, us] : std::vector<std::pair<std::string, uint32_t>>{
           {"0", 0}, {"1", 1}, {"1000000", kMaxSpinUs}, {" 7 ", 7}}) {
    std::vector<ConfigError> errors;
    const Config c = parse_env({{"RSOCK_SPIN_US", value}}, &errors);
    EXPECT_TRUE(errors.empty()) << value << ": " << join(errors);
    EXPECT_EQ(c.spin_us, us) << value;
  }
  for (const char* bad : {"1000001", "-1", "1.5", "abc", "10us", "99999999999999999999999"}) {
    expect_rejected("RSOCK_SPIN_US", bad, "integer from 0 to 1000000");
  }
}

TEST(ConfigEnv, ConnectTimeout) {
  for (const auto& [value, ms] : std::vector<std::pair<std::string, uint32_t>>{
           {"1", 1}, {"250", 250}, {"600000", kMaxConnectTimeoutMs}}) {
    std::vector<ConfigError> errors;
    const Config c = parse_env({{"RSOCK_CONNECT_TIMEOUT_MS", value}}, &errors);
    EXPECT_TRUE(errors.empty()) << value << ": " << join(errors);
    EXPECT_EQ(c.connect_timeout_ms, ms) << value;
  }
  for (const char* bad : {"0", "600001", "x", "-5", "1s"}) {
    expect_rejected("RSOCK_CONNECT_TIMEOUT_MS", bad, "integer from 1 to 600000");
  }
}

TEST(ConfigEnv, TcpFirstAndPairDelay) {
  std::vector<ConfigError> errors;
  Config c = parse_env({}, &errors);
  EXPECT_TRUE(c.tcp_first);
  EXPECT_EQ(c.pair_delay_ms, kDefaultPairDelayMs);
  c = parse_env({{"RSOCK_TCP_FIRST", "1"}, {"RSOCK_PAIR_DELAY_MS", "0"}}, &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_TRUE(c.tcp_first);
  EXPECT_EQ(c.pair_delay_ms, 0u);
  c = parse_env({{"RSOCK_TCP_FIRST", "0"}, {"RSOCK_PAIR_DELAY_MS", "60000"}}, &errors);
  EXPECT_FALSE(c.tcp_first);
  EXPECT_EQ(c.pair_delay_ms, kMaxPairDelayMs);
  for (const char* bad : {"2", "yes", "-1"}) expect_rejected("RSOCK_TCP_FIRST", bad, "0 or 1");
  for (const char* bad : {"60001", "x", "-5", "5ms"})
    expect_rejected("RSOCK_PAIR_DELAY_MS", bad, "integer from 0 to 60000");
}

TEST(ConfigEnv, StatsAll) {
  std::vector<ConfigError> errors;
  EXPECT_FALSE(parse_env({}, &errors).stats_all);
  EXPECT_TRUE(parse_env({{"RSOCK_STATS_ALL", "1"}}, &errors).stats_all);
  EXPECT_FALSE(parse_env({{"RSOCK_STATS_ALL", "0"}}, &errors).stats_all);
  EXPECT_TRUE(errors.empty()) << join(errors);
  for (const char* bad : {"2", "yes", "-1"}) expect_rejected("RSOCK_STATS_ALL", bad, "0 or 1");
}

TEST(ConfigEnv, Publish) {
  std::vector<ConfigError> errors;
  Config c = parse_env({}, &errors);
  EXPECT_TRUE(c.publish);
  EXPECT_EQ(c.publish_dir, "/dev/shm");
  c = parse_env({{"RSOCK_PUBLISH", "0"}, {"RSOCK_PUBLISH_DIR", "/run/user/1000"}}, &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_FALSE(c.publish);
  EXPECT_EQ(c.publish_dir, "/run/user/1000");
  for (const char* bad : {"2", "on"}) expect_rejected("RSOCK_PUBLISH", bad, "0 or 1");
  for (const char* bad : {"relative/dir", "dev/shm"})
    expect_rejected("RSOCK_PUBLISH_DIR", bad, "not an absolute directory path");
}

TEST(ConfigEnv, TestHandoverPause) {
  std::vector<ConfigError> errors;
  Config c = parse_env({}, &errors);
  EXPECT_EQ(c.test_handover_pause_us, 0u);
  c = parse_env({{"RSOCK_TEST_HANDOVER_PAUSE_US", " 3000 "}}, &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_EQ(c.test_handover_pause_us, 3000u);
  c = parse_env({{"RSOCK_TEST_HANDOVER_PAUSE_US", "100000"}}, &errors);
  EXPECT_EQ(c.test_handover_pause_us, kMaxTestHandoverPauseUs);
  for (const char* bad : {"100001", "x", "-5", "3ms"})
    expect_rejected("RSOCK_TEST_HANDOVER_PAUSE_US", bad, "integer from 0 to 100000");
}

TEST(ConfigEnv, TestEpollPause) {
  std::vector<ConfigError> errors;
  Config c = parse_env({}, &errors);
  EXPECT_EQ(c.test_epoll_pause_us, 0u);
  c = parse_env({{"RSOCK_TEST_EPOLL_PAUSE_US", " 2500 "}}, &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_EQ(c.test_epoll_pause_us, 2500u);
  EXPECT_EQ(c.test_handover_pause_us, 0u);
  for (const char* bad : {"100001", "x", "-5"})
    expect_rejected("RSOCK_TEST_EPOLL_PAUSE_US", bad, "integer from 0 to 100000");
}

TEST(ConfigEnv, RegionFile) {
  std::vector<ConfigError> errors;
  Config c = parse_env({}, &errors);
  EXPECT_FALSE(c.region_file_per_connection);
  c = parse_env({{"RSOCK_REGION_FILE", "connection"}}, &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_TRUE(c.region_file_per_connection);
  c = parse_env({{"RSOCK_REGION_FILE", "Pair"}}, &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_FALSE(c.region_file_per_connection);
  for (const char* bad : {"1", "per-connection", "pairs"})
    expect_rejected("RSOCK_REGION_FILE", bad, "expected pair or connection");
}

TEST(ConfigEnv, RegionCache) {
  std::vector<ConfigError> errors;
  Config c = parse_env({}, &errors);
  EXPECT_EQ(c.region_cache, kDefaultRegionCache);
  c = parse_env({{"RSOCK_REGION_CACHE", "0"}}, &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_EQ(c.region_cache, 0u);
  c = parse_env({{"RSOCK_REGION_CACHE", "4096"}}, &errors);
  EXPECT_EQ(c.region_cache, kMaxRegionCache);
  for (const char* bad : {"4097", "x", "-1", "16 regions"})
    expect_rejected("RSOCK_REGION_CACHE", bad, "integer from 0 to 4096");
}

TEST(ConfigEnv, RdmaPinned) {
  std::vector<ConfigError> errors;
  Config c = parse_env({}, &errors);
  EXPECT_EQ(c.rdma_pinned, kDefaultRdmaPinned);
  c = parse_env({{"RSOCK_RDMA_PINNED", "0"}}, &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_EQ(c.rdma_pinned, 0u);
  c = parse_env({{"RSOCK_RDMA_PINNED", "64M"}}, &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_EQ(c.rdma_pinned, 64ull << 20);
  c = parse_env({{"RSOCK_RDMA_PINNED", "1048576M"}}, &errors);
  EXPECT_EQ(c.rdma_pinned, kMaxRdmaPinned);
  for (const char* bad : {"x", "-1", "1M pinned"})
    expect_rejected("RSOCK_RDMA_PINNED", bad, "is not a size; expected a size from 0 to");
  expect_rejected("RSOCK_RDMA_PINNED", "2048G", "is out of range");
}

TEST(ConfigEnv, EmptyValueMeansUnset) {
  std::vector<ConfigError> errors;
  const Config c = parse_env({{"RSOCK_RING_SIZE", ""},
                              {"RSOCK_SPIN_US", ""},
                              {"RSOCK_CONNECT_TIMEOUT_MS", ""},
                              {"RSOCK_LOG_LEVEL", " \t"},
                              {"RSOCK_PEERS", " , "},
                              {"RSOCK_CONF", ""}},
                             &errors);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_FALSE(c.disabled);
  EXPECT_EQ(c.ring_bytes, kDefaultRingBytes);
  EXPECT_EQ(c.spin_us, kDefaultSpinUs);
  EXPECT_EQ(c.log_level, kDefaultLogLevel);
  EXPECT_EQ(c.conf_path, "");
  EXPECT_TRUE(c.rules.empty());
}

TEST(ConfigEnv, AllErrorsReportedInOrder) {
  std::vector<ConfigError> errors;
  const Config c = parse_env({{"RSOCK_DISABLE", "maybe"},
                              {"RSOCK_PEERS", "bogus"},
                              {"RSOCK_RING_SIZE", "3M"},
                              {"RSOCK_SPIN_US", "-1"},
                              {"RSOCK_CONNECT_TIMEOUT_MS", "0"},
                              {"RSOCK_LOG_LEVEL", "loud"},
                              {"RSOCK_SPARE", "ignored"}},
                             &errors);
  EXPECT_TRUE(c.disabled);
  ASSERT_EQ(errors.size(), 6u) << join(errors);
  EXPECT_EQ(errors[0].source, "RSOCK_DISABLE");
  EXPECT_EQ(errors[1].source, "RSOCK_PEERS");
  EXPECT_EQ(errors[2].source, "RSOCK_RING_SIZE");
  EXPECT_EQ(errors[3].source, "RSOCK_SPIN_US");
  EXPECT_EQ(errors[4].source, "RSOCK_CONNECT_TIMEOUT_MS");
  EXPECT_EQ(errors[5].source, "RSOCK_LOG_LEVEL");
}

// ---------------------------------------------------------------------------
// Rule file

TEST(ConfigFile, UnreadableFile) {
  std::vector<ConfigError> errors;
  const Config c = parse_env({{"RSOCK_CONF", "/etc/rsock.conf"}}, &errors, nullptr);
  EXPECT_TRUE(c.disabled);
  EXPECT_EQ(c.conf_path, "/etc/rsock.conf");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].source, "RSOCK_CONF");
  EXPECT_EQ(errors[0].message, "cannot read \"/etc/rsock.conf\"");
  // The reason, when the caller knows it.
  errors.clear();
  parse_config(lookup({{"RSOCK_CONF", "/etc/rsock.conf"}}), nullptr, &errors, "not a regular file");
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].message, "cannot read \"/etc/rsock.conf\": not a regular file");
}

TEST(ConfigFile, TextIgnoredWithoutRsockConf) {
  const std::string text = "rule auto any 10.0.0.1:80\n";
  std::vector<ConfigError> errors;
  const Config c = parse_env({}, &errors, &text);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_TRUE(c.rules.empty());
}

TEST(ConfigFile, RulesAndComments) {
  const std::string text =
      "# a comment\n"
      "\n"
      "   \t\n"
      "rule tcp any 10.0.0.5:*\n"
      "rule auto client 10.0.0.0/8:5000-5100   # trailing comment\n"
      "\trule  rdma\tserver [fd00::]/8:80 program=redis-server\r\n"
      "rule shm any 127.0.0.1:7000#comment right after\n"
      "rule auto any [::1]:9000";  // no final newline
  std::vector<ConfigError> errors;
  const Config c = parse_env({{"RSOCK_CONF", "/x.conf"}}, &errors, &text);
  ASSERT_TRUE(errors.empty()) << join(errors);
  EXPECT_FALSE(c.disabled);
  EXPECT_EQ(c.conf_path, "/x.conf");
  ASSERT_EQ(c.rules.size(), 5u);

  EXPECT_EQ(c.rules[0].transport, TransportKind::kTcp);
  EXPECT_EQ(c.rules[0].role, Role::kAny);
  EXPECT_EQ(v4_text(c.rules[0]), "10.0.0.5");
  EXPECT_EQ(c.rules[0].port_hi, 65535);

  EXPECT_EQ(c.rules[1].transport, TransportKind::kAuto);
  EXPECT_EQ(c.rules[1].role, Role::kClient);
  EXPECT_EQ(c.rules[1].prefix_len, 8);
  EXPECT_EQ(c.rules[1].port_lo, 5000);
  EXPECT_EQ(c.rules[1].port_hi, 5100);
  EXPECT_EQ(c.rules[1].program, "");

  EXPECT_EQ(c.rules[2].transport, TransportKind::kRdma);
  EXPECT_EQ(c.rules[2].role, Role::kServer);
  EXPECT_EQ(c.rules[2].family, AF_INET6);
  EXPECT_EQ(c.rules[2].program, "redis-server");

  EXPECT_EQ(c.rules[3].transport, TransportKind::kShm);
  EXPECT_EQ(c.rules[3].port_lo, 7000);

  EXPECT_EQ(c.rules[4].family, AF_INET6);
  EXPECT_EQ(c.rules[4].port_lo, 9000);
}

TEST(ConfigFile, Knobs) {
  const std::string text =
      "set ring_size 64K\n"
      "set spin_us 7\n"
      "set connect_timeout_ms 2500\n"
      "set log_level debug\n"
      "set log_file /var/log/rsock.log\n"
      "set stats /tmp/rsock.stats\n"
      "set stats_all 1\n";
  std::vector<ConfigError> errors;
  const Config c = parse_env({{"RSOCK_CONF", "f"}}, &errors, &text);
  ASSERT_TRUE(errors.empty()) << join(errors);
  EXPECT_EQ(c.ring_bytes, 64u << 10);
  EXPECT_EQ(c.spin_us, 7u);
  EXPECT_EQ(c.connect_timeout_ms, 2500u);
  EXPECT_EQ(c.log_level, kLogDebug);
  EXPECT_EQ(c.log_file, "/var/log/rsock.log");
  EXPECT_EQ(c.stats_path, "/tmp/rsock.stats");
  EXPECT_TRUE(c.stats_all);
  EXPECT_TRUE(c.rules.empty());
}

TEST(ConfigFile, LaterSetWins) {
  const std::string text = "set spin_us 7\nset spin_us 9\n";
  std::vector<ConfigError> errors;
  const Config c = parse_env({{"RSOCK_CONF", "f"}}, &errors, &text);
  ASSERT_TRUE(errors.empty()) << join(errors);
  EXPECT_EQ(c.spin_us, 9u);
}

TEST(ConfigFile, EnvironmentOverridesFile) {
  const std::string text =
      "set ring_size 64K\n"
      "set spin_us 7\n"
      "set connect_timeout_ms 2500\n"
      "set log_level debug\n"
      "set log_file /from/file\n"
      "set stats /from/file.stats\n";
  std::vector<ConfigError> errors;
  const Config c = parse_env({{"RSOCK_CONF", "f"},
                              {"RSOCK_RING_SIZE", "128K"},
                              {"RSOCK_CONNECT_TIMEOUT_MS", "30"},
                              {"RSOCK_LOG_LEVEL", "error"},
                              {"RSOCK_STATS", "/from/env.stats"}},
                             &errors, &text);
  ASSERT_TRUE(errors.empty()) << join(errors);
  EXPECT_EQ(c.ring_bytes, 128u << 10);
  EXPECT_EQ(c.connect_timeout_ms, 30u);
  EXPECT_EQ(c.log_level, kLogError);
  EXPECT_EQ(c.stats_path, "/from/env.stats");
  // Knobs the environment leaves alone keep the file's value.
  EXPECT_EQ(c.spin_us, 7u);
  EXPECT_EQ(c.log_file, "/from/file");
}

TEST(ConfigFile, PeersRulesComeFirst) {
  const std::string text = "rule tcp client 10.0.0.1:1\nrule shm server 10.0.0.2:2\n";
  std::vector<ConfigError> errors;
  const Config c =
      parse_env({{"RSOCK_CONF", "f"}, {"RSOCK_PEERS", "10.0.0.3:3,10.0.0.4:4"}}, &errors, &text);
  ASSERT_TRUE(errors.empty()) << join(errors);
  ASSERT_EQ(c.rules.size(), 4u);
  EXPECT_EQ(c.rules[0].port_lo, 3);
  EXPECT_EQ(c.rules[1].port_lo, 4);
  EXPECT_EQ(c.rules[2].port_lo, 1);
  EXPECT_EQ(c.rules[2].transport, TransportKind::kTcp);
  EXPECT_EQ(c.rules[3].port_lo, 2);
  EXPECT_EQ(c.rules[3].transport, TransportKind::kShm);
}

TEST(ConfigFile, SyntaxErrorsCarryLineNumbers) {
  const std::string text =
      "# line 1 is fine\n"
      "rule auto any 10.0.0.1:80\n"                  // 2 ok
      "rules auto any 10.0.0.1:80\n"                 // 3 unknown directive
      "rule fast any 10.0.0.1:80\n"                  // 4 transport
      "rule auto peer 10.0.0.1:80\n"                 // 5 role
      "rule auto any 10.0.0.1:70000\n"               // 6 port
      "rule auto any 10.0.0.1:80 prog=x\n"           // 7 option
      "rule auto any 10.0.0.1:80 program=\n"         // 8 empty program
      "rule auto any 10.0.0.1:80 program=a extra\n"  // 9 extra word
      "rule auto any\n"                              // 10 incomplete
      "set spin_us\n"                                // 11 arity
      "set log_file /a b\n"                          // 12 arity
      "set ring_bytes 1M\n"                          // 13 unknown knob
      "set ring_size 3M\n"                           // 14 bad value
      "set log_level chatty\n"                       // 15 bad value
      "RULE auto any 10.0.0.1:80\n"                  // 16 case-sensitive
      "rule auto any 10.0.0.2:81 program=b\n";       // 17 ok
  std::vector<ConfigError> errors;
  const Config c = parse_env({{"RSOCK_CONF", "/etc/r.conf"}}, &errors, &text);
  EXPECT_TRUE(c.disabled);
  const std::vector<std::pair<int, std::string>> want = {
      {3, "unknown directive \"rules\""},  {4, "unknown transport \"fast\""},
      {5, "unknown role \"peer\""},        {6, "\"70000\" is out of range"},
      {7, "unexpected \"prog=x\""},        {8, "empty program name"},
      {9, "unexpected \"extra\""},         {10, "incomplete rule"},
      {11, "set <knob> <value>"},          {12, "set <knob> <value>"},
      {13, "unknown knob \"ring_bytes\""}, {14, "ring_size: \"3M\" is not a power of two"},
      {15, "log_level: \"chatty\""},       {16, "unknown directive \"RULE\""},
  };
  ASSERT_EQ(errors.size(), want.size()) << join(errors);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(errors[i].source, "/etc/r.conf:" + std::to_string(want[i].first));
    EXPECT_NE(errors[i].message.find(want[i].second), std::string::npos)
        << "line " << want[i].first << ": " << errors[i].message;
  }
  // Good lines around the bad ones are still parsed.
  ASSERT_EQ(c.rules.size(), 2u);
  EXPECT_EQ(c.rules[0].port_lo, 80);
  EXPECT_EQ(c.rules[1].program, "b");
  EXPECT_EQ(errors[0].to_string(),
            "librsock: /etc/r.conf:3: unknown directive \"rules\"; expected rule or set; "
            "running on plain TCP");
}

TEST(ConfigFile, EnvironmentErrorsPrecedeFileErrors) {
  const std::string text = "bogus\n";
  std::vector<ConfigError> errors;
  parse_env({{"RSOCK_CONF", "f"}, {"RSOCK_SPIN_US", "x"}}, &errors, &text);
  ASSERT_EQ(errors.size(), 2u) << join(errors);
  EXPECT_EQ(errors[0].source, "RSOCK_SPIN_US");
  EXPECT_EQ(errors[1].source, "f:1");
}

TEST(ConfigFile, ShippedExampleParsesToNothing) {
  bool ok = false;
  const std::string text = read_file("conf/rsock.conf", &ok);
  ASSERT_TRUE(ok) << "run the tests from the repository root";
  ASSERT_FALSE(text.empty());
  std::vector<ConfigError> errors;
  const Config c = parse_env({{"RSOCK_CONF", "conf/rsock.conf"}}, &errors, &text);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_FALSE(c.disabled);
  EXPECT_TRUE(c.rules.empty());
  EXPECT_EQ(c.ring_bytes, kDefaultRingBytes);
  EXPECT_EQ(c.log_file, "");
}

// The example lines ("#rule ..." / "#set ...") must be valid once uncommented,
// and the knob values they show must be the real defaults.
TEST(ConfigFile, ShippedExamplesAreValidWhenUncommented) {
  bool ok = false;
  const std::string text = read_file("conf/rsock.conf", &ok);
  ASSERT_TRUE(ok) << "run the tests from the repository root";
  std::string uncommented;
  int examples = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("#rule ", 0) == 0 || line.rfind("#set ", 0) == 0) {
      line.erase(0, 1);
      ++examples;
    }
    uncommented += line + "\n";
  }
  EXPECT_GE(examples, 6);
  std::vector<ConfigError> errors;
  const Config c = parse_env({{"RSOCK_CONF", "conf/rsock.conf"}}, &errors, &uncommented);
  EXPECT_TRUE(errors.empty()) << join(errors);
  EXPECT_GE(c.rules.size(), 3u);
  EXPECT_EQ(c.ring_bytes, kDefaultRingBytes);
  EXPECT_EQ(c.spin_us, kDefaultSpinUs);
  EXPECT_EQ(c.connect_timeout_ms, kDefaultConnectTimeoutMs);
  EXPECT_EQ(c.log_level, kDefaultLogLevel);
  // The first example is the tcp exclusion that must precede the broad rule.
  ASSERT_FALSE(c.rules.empty());
  EXPECT_EQ(c.rules[0].transport, TransportKind::kTcp);
}

// ---------------------------------------------------------------------------
// Messages: values from a hostile environment or file stay short and printable

// Every byte of a line that reaches stderr is printable ASCII.
bool printable(const std::string& line) {
  for (unsigned char c : line)
    if (c < 0x20 || c >= 0x7f) return false;
  return true;
}

TEST(ConfigMessages, MessageTextEscapesAndCuts) {
  EXPECT_EQ(message_text("plain /path:80"), "plain /path:80");
  EXPECT_EQ(message_text(""), "");
  EXPECT_EQ(message_text("a\"b\\c"), "a\\\"b\\\\c");
  EXPECT_EQ(message_text("\t\n\r"), "\\t\\n\\r");
  EXPECT_EQ(message_text(std::string("\x1b[2J\x07\x7f\x9b\0", 8)), "\\x1b[2J\\x07\\x7f\\x9b\\x00");
  EXPECT_EQ(message_text("caf\xc3\xa9"), "caf\\xc3\\xa9");
  const std::string exact(kMessageValueBytes, 'a');
  EXPECT_EQ(message_text(exact), exact);
  EXPECT_EQ(message_text(exact + "b"), exact + "...");
  // The worst case: every byte escaped.
  const std::string worst(1000, '\x01');
  EXPECT_EQ(message_text(worst).size(), 4 * kMessageValueBytes + 3);
  EXPECT_TRUE(printable(message_text(worst)));
}

TEST(ConfigMessages, LongValueIsCut) {
  const std::string value(300, '7');
  std::vector<ConfigError> errors;
  parse_env({{"RSOCK_SPIN_US", value}}, &errors);
  ASSERT_EQ(errors.size(), 1u);
  const std::string line = errors[0].to_string();
  EXPECT_NE(line.find("\"" + value.substr(0, kMessageValueBytes) + "\"..."), std::string::npos)
      << line;
  EXPECT_EQ(line.find(value.substr(0, kMessageValueBytes + 1)), std::string::npos) << line;
  EXPECT_LT(line.size(), 250u) << line;
}

TEST(ConfigMessages, LongPeersRuleAndFilePathAreCut) {
  const std::string rule = "10.0.0.1:" + std::string(500, '9');
  const std::string path = "/etc/" + std::string(200, 'p') + ".conf";
  const std::string text = "bogus\n";
  std::vector<ConfigError> errors;
  parse_env({{"RSOCK_PEERS", rule}, {"RSOCK_CONF", path}}, &errors, &text);
  ASSERT_EQ(errors.size(), 2u) << join(errors);
  EXPECT_EQ(errors[0].source, "RSOCK_PEERS");
  EXPECT_EQ(errors[0].message.find(std::string(kMessageValueBytes + 1, '9')), std::string::npos)
      << "the rule and the port in it are each cut: " << errors[0].message;
  EXPECT_NE(errors[0].message.find(std::string(kMessageValueBytes, '9') + "\"..."),
            std::string::npos)
      << errors[0].message;
  EXPECT_EQ(errors[1].source, path.substr(0, kMessageValueBytes) + "...:1");
  for (const ConfigError& e : errors) EXPECT_LT(e.to_string().size(), 400u) << e.to_string();
}

TEST(ConfigMessages, ControlBytesAreEscaped) {
  // A terminal escape in a value (clear screen, then a forged line).
  const std::string evil = "\x1b[2J\rlibrsock: all good\x07";
  std::vector<ConfigError> errors;
  const std::string text = "rule auto any " + evil + "\nset log_level \x9b" + "31m\n";
  parse_env({{"RSOCK_LOG_LEVEL", evil},
             {"RSOCK_PEERS", evil},
             {"RSOCK_CONF", "/etc/\x1b]0;title\x07.conf"}},
            &errors, &text);
  ASSERT_EQ(errors.size(), 4u) << join(errors);
  for (const ConfigError& e : errors) EXPECT_TRUE(printable(e.to_string())) << e.to_string();
  EXPECT_NE(errors[0].message.find("\"\\x1b[2J\\rlibrsock: all good\\x07\""), std::string::npos)
      << errors[0].message;
  EXPECT_EQ(errors[2].source, "/etc/\\x1b]0;title\\x07.conf:1");
  const std::string csi = "\"\\x9b31m\"";  // 0x9b: the one-byte CSI of 8-bit terminals
  EXPECT_NE(errors[3].message.find(csi), std::string::npos) << errors[3].message;
}

TEST(ConfigMessages, UnreadableConfPathIsEscaped) {
  std::vector<ConfigError> errors;
  parse_env({{"RSOCK_CONF", "/tmp/\x1b[31m" + std::string(100, 'x')}}, &errors, nullptr);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(printable(errors[0].to_string())) << errors[0].to_string();
  EXPECT_NE(errors[0].message.find("\"/tmp/\\x1b[31mxxx"), std::string::npos) << errors[0].message;
  EXPECT_NE(errors[0].message.find("\"..."), std::string::npos) << errors[0].message;
}

TEST(ConfigFile, OverlongLineIsReportedAsSuch) {
  const std::string long_rule = "rule auto any 10.0.0.1:80 program=" + std::string(2000, 'x');
  const std::string max_comment = "#" + std::string(kMaxConfLineBytes - 1, 'c');
  const std::string text = "rule auto any 10.0.0.2:81\n" + long_rule + "\n" + max_comment + "\n" +
                           max_comment + "c\r\nrule auto any 10.0.0.3:82\n";
  std::vector<ConfigError> errors;
  const Config c = parse_env({{"RSOCK_CONF", "r.conf"}}, &errors, &text);
  EXPECT_TRUE(c.disabled);
  ASSERT_EQ(errors.size(), 2u) << join(errors);
  EXPECT_EQ(errors[0].source, "r.conf:2");
  EXPECT_EQ(errors[0].message,
            "line is " + std::to_string(long_rule.size()) + " bytes long; the limit is 1024 bytes");
  // A line of exactly the limit is fine; one more byte (the CR counts) is not.
  EXPECT_EQ(errors[1].source, "r.conf:4");
  EXPECT_NE(errors[1].message.find("line is 1026 bytes long"), std::string::npos);
  // The lines around them still parse; the long one added no rule.
  ASSERT_EQ(c.rules.size(), 2u);
  EXPECT_EQ(c.rules[1].port_lo, 82);
}

// Inputs the fuzz targets found (test/fuzz/corpus/, named regress-*), fed
// the way the target reads them: every error line must be printable.
TEST(ConfigFuzzRegression, ControlByteInPeers) {
  // config_env_fuzz: RSOCK_PEERS="1\v7.0.0.1:6379" (the input up to its first NUL).
  bool ok = false;
  const std::string input = read_file("test/fuzz/corpus/config_env/regress-control-byte", &ok);
  ASSERT_TRUE(ok) << "run the tests from the repository root";
  const std::string peers = input.substr(0, input.find('\0'));
  ASSERT_NE(peers.find('\v'), std::string::npos);
  std::vector<ConfigError> errors;
  parse_env({{"RSOCK_PEERS", peers}}, &errors);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_TRUE(printable(errors[0].to_string())) << errors[0].to_string();
  EXPECT_NE(errors[0].message.find("\\x0b"), std::string::npos) << errors[0].message;
}

TEST(ConfigFuzzRegression, NonAsciiByteInRuleFile) {
  // config_file_fuzz: the example file with one address byte turned into 0xb0.
  bool ok = false;
  const std::string text = read_file("test/fuzz/corpus/config_file/regress-non-ascii", &ok);
  ASSERT_TRUE(ok) << "run the tests from the repository root";
  std::vector<ConfigError> errors;
  parse_env({{"RSOCK_CONF", "/etc/rsock.conf"}}, &errors, &text);
  ASSERT_FALSE(errors.empty());
  for (const ConfigError& e : errors) EXPECT_TRUE(printable(e.to_string())) << e.to_string();
  EXPECT_NE(errors[0].message.find("\\xb0"), std::string::npos) << errors[0].message;
}

}  // namespace
}  // namespace rsock

namespace rsock {
namespace {

// rsock-run --help documents every variable librsock reads (the script
// keeps its own list; this keeps it complete). rsock-run sits beside this
// test binary (BUILD/rsock-run, make all).
TEST(RsockRunHelp, NamesEveryVariable) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  std::string run = self;
  run = run.substr(0, run.rfind('/')) + "/rsock-run";
  ASSERT_EQ(access(run.c_str(), X_OK), 0) << run << ": run `make all` first";
  FILE* f = popen((run + " --help").c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string help;
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof buf, f)) > 0) help.append(buf, got);
  EXPECT_EQ(pclose(f), 0);
  const std::vector<std::string> names = config_env_names();
  EXPECT_GE(names.size(), 14u);
  for (const std::string& name : names)
    EXPECT_NE(help.find("\n  " + name + " "), std::string::npos) << name << " missing:\n" << help;
}

}  // namespace
}  // namespace rsock
