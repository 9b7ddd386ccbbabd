// Config parsing: turns the RSOCK_* environment and the rule file text into a
// Config, collecting every problem instead of stopping at the first. It runs in
// the preloaded library's constructor, before the program's main(), so it never
// throws, never uses std::regex (locale and exception machinery), and does no
// I/O of its own: the caller reads the file and prints the errors.

#include "config/config.h"

#include <arpa/inet.h>

#include <array>
#include <cstring>
#include <limits>
#include <optional>

namespace rsock {
namespace {

constexpr std::string_view kSpace = " \t\r\n\v\f";

std::string_view trim(std::string_view s) {
  const size_t first = s.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  const size_t last = s.find_last_not_of(kSpace);
  return s.substr(first, last - first + 1);
}

char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

// Values are echoed back in messages; quoting makes empty and space-padded
// values visible, and message_text() keeps them short and printable.
std::string quoted(std::string_view s) {
  const bool cut = s.size() > kMessageValueBytes;
  std::string out = "\"" + message_text(s.substr(0, kMessageValueBytes)) + "\"";
  if (cut) out += "...";
  return out;
}

// Unsigned decimal only: no sign, no base prefix, no whitespace, so that
// "-1", "0x10" or "5 " are reported instead of being half-accepted the way
// strtoul would.
bool parse_uint(std::string_view s, uint64_t max, uint64_t* out) {
  if (s.empty()) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (max - d) / 10) return false;  // v * 10 + d would exceed max
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

std::string size_text(size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

// The knobs that can be set both from the environment and with `set` in the
// rule file; one table keeps the two spellings and the validation together.
enum class Knob {
  kRingSize,
  kSpinUs,
  kConnectTimeoutMs,
  kTcpFirst,
  kPairDelayMs,
  kRegionCache,
  kRdmaPinned,
  kRegionFile,
  kLogLevel,
  kLogFile,
  kStats,
  kStatsAll,
  kPublish,
  kPublishDir
};

struct KnobName {
  Knob knob;
  const char* env;
  const char* file;
  bool is_path;  // paths are taken verbatim; other values are trimmed
};

constexpr std::array<KnobName, 14> kKnobs = {{
    {Knob::kRingSize, "RSOCK_RING_SIZE", "ring_size", false},
    {Knob::kSpinUs, "RSOCK_SPIN_US", "spin_us", false},
    {Knob::kConnectTimeoutMs, "RSOCK_CONNECT_TIMEOUT_MS", "connect_timeout_ms", false},
    {Knob::kTcpFirst, "RSOCK_TCP_FIRST", "tcp_first", false},
    {Knob::kPairDelayMs, "RSOCK_PAIR_DELAY_MS", "pair_delay_ms", false},
    {Knob::kRegionCache, "RSOCK_REGION_CACHE", "region_cache", false},
    {Knob::kRdmaPinned, "RSOCK_RDMA_PINNED", "rdma_pinned", false},
    {Knob::kRegionFile, "RSOCK_REGION_FILE", "region_file", false},
    {Knob::kLogLevel, "RSOCK_LOG_LEVEL", "log_level", false},
    {Knob::kLogFile, "RSOCK_LOG_FILE", "log_file", true},
    {Knob::kStats, "RSOCK_STATS", "stats", true},
    {Knob::kStatsAll, "RSOCK_STATS_ALL", "stats_all", false},
    {Knob::kPublish, "RSOCK_PUBLISH", "publish", false},
    {Knob::kPublishDir, "RSOCK_PUBLISH_DIR", "publish_dir", true},
}};

constexpr std::array<const char*, 5> kLogLevelNames = {"error", "warn", "info", "debug", "trace"};

// A 0/1 knob.
bool apply_flag(std::string_view value, bool* flag, std::string* error) {
  if (value != "0" && value != "1") {
    *error = quoted(value) + " is not valid; expected 0 or 1";
    return false;
  }
  *flag = value == "1";
  return true;
}

bool apply_knob(Knob knob, std::string_view value, Config* config, std::string* error) {
  switch (knob) {
    case Knob::kRingSize: {
      const std::string expected = "expected a power of two from " + size_text(kMinRingBytes) +
                                   " to " + size_text(kMaxRingBytes) +
                                   " (bytes, optional K/M/G suffix, e.g. 1M)";
      size_t bytes = 0;
      if (!parse_size(value, &bytes)) {
        *error = quoted(value) + " is not a size; " + expected;
        return false;
      }
      if (bytes < kMinRingBytes || bytes > kMaxRingBytes) {
        *error = quoted(value) + " is out of range; " + expected;
        return false;
      }
      if ((bytes & (bytes - 1)) != 0) {
        *error = quoted(value) + " is not a power of two; " + expected;
        return false;
      }
      config->ring_bytes = bytes;
      return true;
    }
    case Knob::kSpinUs: {
      uint64_t v = 0;
      if (!parse_uint(value, kMaxSpinUs, &v)) {
        *error = quoted(value) + " is not valid; expected an integer from 0 to " +
                 std::to_string(kMaxSpinUs) + " (microseconds)";
        return false;
      }
      config->spin_us = static_cast<uint32_t>(v);
      return true;
    }
    case Knob::kConnectTimeoutMs: {
      uint64_t v = 0;
      if (!parse_uint(value, kMaxConnectTimeoutMs, &v) || v == 0) {
        *error = quoted(value) + " is not valid; expected an integer from 1 to " +
                 std::to_string(kMaxConnectTimeoutMs) + " (milliseconds)";
        return false;
      }
      config->connect_timeout_ms = static_cast<uint32_t>(v);
      return true;
    }
    case Knob::kTcpFirst:
      return apply_flag(value, &config->tcp_first, error);
    case Knob::kPairDelayMs: {
      uint64_t v = 0;
      if (!parse_uint(value, kMaxPairDelayMs, &v)) {
        *error = quoted(value) + " is not valid; expected an integer from 0 to " +
                 std::to_string(kMaxPairDelayMs) + " (milliseconds)";
        return false;
      }
      config->pair_delay_ms = static_cast<uint32_t>(v);
      return true;
    }
    case Knob::kRegionCache: {
      uint64_t v = 0;
      if (!parse_uint(value, kMaxRegionCache, &v)) {
        *error = quoted(value) + " is not valid; expected an integer from 0 to " +
                 std::to_string(kMaxRegionCache) + " (regions; 0 keeps none)";
        return false;
      }
      config->region_cache = static_cast<uint32_t>(v);
      return true;
    }
    case Knob::kRdmaPinned: {
      const std::string expected = "expected a size from 0 to " + size_text(kMaxRdmaPinned) +
                                   " (bytes, optional K/M/G suffix, e.g. 512M; 0: no RDMA)";
      size_t bytes = 0;
      if (!parse_size(value, &bytes)) {
        *error = quoted(value) + " is not a size; " + expected;
        return false;
      }
      if (bytes > kMaxRdmaPinned) {
        *error = quoted(value) + " is out of range; " + expected;
        return false;
      }
      config->rdma_pinned = bytes;
      return true;
    }
    case Knob::kRegionFile:
      if (!iequals(value, "pair") && !iequals(value, "connection")) {
        *error = quoted(value) + " is not valid; expected pair or connection";
        return false;
      }
      config->region_file_per_connection = iequals(value, "connection");
      return true;
    case Knob::kLogLevel: {
      for (size_t i = 0; i < kLogLevelNames.size(); ++i) {
        if (iequals(value, kLogLevelNames[i]) ||
            (value.size() == 1 && value[0] == static_cast<char>('0' + i))) {
          config->log_level = static_cast<int>(i);
          return true;
        }
      }
      *error = quoted(value) +
               " is not a log level; expected error, warn, info, debug, trace "
               "or 0..4";
      return false;
    }
    case Knob::kLogFile:
      config->log_file = std::string(value);
      return true;
    case Knob::kStats:
      config->stats_path = std::string(value);
      return true;
    case Knob::kStatsAll:
      return apply_flag(value, &config->stats_all, error);
    case Knob::kPublish:
      return apply_flag(value, &config->publish, error);
    case Knob::kPublishDir:
      if (value.empty() || value.front() != '/') {
        *error = quoted(value) + " is not an absolute directory path";
        return false;
      }
      config->publish_dir = std::string(value);
      return true;
  }
  *error = "internal error: unknown knob";
  return false;
}

bool parse_transport(std::string_view s, TransportKind* out) {
  for (TransportKind t :
       {TransportKind::kAuto, TransportKind::kRdma, TransportKind::kShm, TransportKind::kTcp}) {
    if (s == transport_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

bool parse_role(std::string_view s, Role* out) {
  for (Role r : {Role::kAny, Role::kClient, Role::kServer}) {
    if (s == role_name(r)) {
      *out = r;
      return true;
    }
  }
  return false;
}

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  size_t pos = 0;
  while (true) {
    const size_t start = line.find_first_not_of(kSpace, pos);
    if (start == std::string_view::npos) break;
    size_t end = line.find_first_of(kSpace, start);
    if (end == std::string_view::npos) end = line.size();
    words.push_back(line.substr(start, end - start));
    pos = end;
  }
  return words;
}

constexpr const char* kRuleUsage =
    "expected: rule <auto|rdma|shm|tcp> <any|client|server> "
    "<ADDR[/PREFIX]:PORT[-PORT]> [program=<name>]";

// Parses one `rule` line (already split into words, words[0] == "rule").
bool parse_rule_line(const std::vector<std::string_view>& words, PeerRule* rule,
                     std::string* error) {
  if (words.size() < 4) {
    *error = std::string("incomplete rule; ") + kRuleUsage;
    return false;
  }
  if (!parse_transport(words[1], &rule->transport)) {
    *error = "unknown transport " + quoted(words[1]) + "; expected auto, rdma, shm or tcp";
    return false;
  }
  if (!parse_role(words[2], &rule->role)) {
    *error = "unknown role " + quoted(words[2]) + "; expected any, client or server";
    return false;
  }
  std::string why;
  if (!parse_peer_rule(words[3], rule, &why)) {
    *error = "bad address " + quoted(words[3]) + ": " + why;
    return false;
  }
  if (words.size() >= 5) {
    constexpr std::string_view kProgram = "program=";
    if (words[4].substr(0, kProgram.size()) != kProgram) {
      *error = "unexpected " + quoted(words[4]) + "; " + kRuleUsage;
      return false;
    }
    rule->program = std::string(words[4].substr(kProgram.size()));
    if (rule->program.empty()) {
      *error = "empty program name in " + quoted(words[4]) + "; expected program=<name>";
      return false;
    }
  }
  if (words.size() > 5) {
    *error = "unexpected " + quoted(words[5]) + " after the rule; " + kRuleUsage;
    return false;
  }
  return true;
}

// Parses the rule file: rules go to *rules, `set` knobs straight into *config
// (the environment is applied afterwards so that it wins).
void parse_rule_file(std::string_view text, const std::string& path, Config* config,
                     std::vector<PeerRule>* rules, std::vector<ConfigError>* errors) {
  size_t line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;

    // Only a line with an error needs its source.
    auto source = [&path, line_no] { return message_text(path) + ":" + std::to_string(line_no); };
    // A line this long is no rule: it is reported as what it is, not as
    // whatever its first word would make of it, and nothing of it is echoed.
    if (line.size() > kMaxConfLineBytes) {
      errors->push_back({source(), "line is " + std::to_string(line.size()) +
                                       " bytes long; the limit is " +
                                       std::to_string(kMaxConfLineBytes) + " bytes"});
      continue;
    }
    const size_t hash = line.find('#');
    if (hash != std::string_view::npos) line = line.substr(0, hash);
    const std::vector<std::string_view> words = split_words(line);
    if (words.empty()) continue;
    std::string error;
    if (words[0] == "rule") {
      PeerRule rule;
      if (parse_rule_line(words, &rule, &error)) {
        rules->push_back(std::move(rule));
      } else {
        errors->push_back({source(), error});
      }
    } else if (words[0] == "set") {
      if (words.size() != 3) {
        errors->push_back({source(), "expected: set <knob> <value> (one word each)"});
        continue;
      }
      const KnobName* found = nullptr;
      for (const KnobName& k : kKnobs) {
        if (words[1] == k.file) found = &k;
      }
      if (found == nullptr) {
        errors->push_back(
            {source(), "unknown knob " + quoted(words[1]) +
                           "; expected ring_size, spin_us, connect_timeout_ms, "
                           "tcp_first, pair_delay_ms, region_cache, rdma_pinned, region_file, "
                           "log_level, "
                           "log_file or stats"});
        continue;
      }
      if (!apply_knob(found->knob, words[2], config, &error)) {
        errors->push_back({source(), std::string(found->file) + ": " + error});
      }
    } else {
      errors->push_back(
          {source(), "unknown directive " + quoted(words[0]) + "; expected rule or set"});
    }
  }
}

// Masks off host bits so that matching can compare whole bytes of the prefix
// and so that "10.1.2.3/8" and "10.0.0.0/8" are the same rule.
void mask_host_bits(uint8_t* addr, size_t addr_bytes, unsigned prefix_len) {
  for (size_t i = 0; i < addr_bytes; ++i) {
    const unsigned bit = static_cast<unsigned>(i) * 8;
    if (bit >= prefix_len) {
      addr[i] = 0;
    } else if (prefix_len - bit < 8) {
      addr[i] &= static_cast<uint8_t>(0xFFu << (8 - (prefix_len - bit)));
    }
  }
}

constexpr const char* kPortUsage = "expected a port 1..65535, a range LO-HI, or *";

bool parse_port(std::string_view s, uint16_t* out, std::string* error) {
  uint64_t v = 0;
  if (s.empty()) {
    *error = std::string("missing port; ") + kPortUsage;
    return false;
  }
  if (s.find_first_not_of("0123456789") != std::string_view::npos) {
    *error = "port " + quoted(s) + " is not a number; " + kPortUsage;
    return false;
  }
  if (!parse_uint(s, 65535, &v) || v < 1) {
    *error = "port " + quoted(s) + " is out of range; " + kPortUsage;
    return false;
  }
  *out = static_cast<uint16_t>(v);
  return true;
}

}  // namespace

const char* transport_name(TransportKind t) {
  switch (t) {
    case TransportKind::kAuto:
      return "auto";
    case TransportKind::kRdma:
      return "rdma";
    case TransportKind::kShm:
      return "shm";
    case TransportKind::kTcp:
      return "tcp";
  }
  return "?";
}

const char* role_name(Role r) {
  switch (r) {
    case Role::kAny:
      return "any";
    case Role::kClient:
      return "client";
    case Role::kServer:
      return "server";
  }
  return "?";
}

std::string message_text(std::string_view value) {
  static constexpr char kHex[] = "0123456789abcdef";
  const bool cut = value.size() > kMessageValueBytes;
  if (cut) value = value.substr(0, kMessageValueBytes);
  std::string out;
  out.reserve(value.size() + 3);
  for (const char ch : value) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
      case '\\':
        out += '\\';
        out += ch;
        break;
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c >= 0x20 && c < 0x7f) {
          out += ch;
        } else {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 0xf];
        }
    }
  }
  if (cut) out += "...";
  return out;
}

std::string ConfigError::to_string() const {
  return "librsock: " + source + ": " + message + "; running on plain TCP";
}

bool parse_size(std::string_view text, size_t* out) {
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  if (digits == 0) return false;
  std::string_view suffix = text.substr(digits);
  size_t shift = 0;
  if (!suffix.empty()) {
    switch (ascii_lower(suffix[0])) {
      case 'k':
        shift = 10;
        break;
      case 'm':
        shift = 20;
        break;
      case 'g':
        shift = 30;
        break;
      default:
        break;
    }
    if (shift != 0) suffix.remove_prefix(1);
    // "B" may follow a unit or a bare number; "iB" only a unit ("64iB" is junk).
    if (!(suffix.empty() || iequals(suffix, "b") || (shift != 0 && iequals(suffix, "ib")))) {
      return false;
    }
  }
  const uint64_t max = std::numeric_limits<size_t>::max() >> shift;
  uint64_t v = 0;
  if (!parse_uint(text.substr(0, digits), max, &v)) return false;
  *out = static_cast<size_t>(v) << shift;
  return true;
}

bool parse_peer_rule(std::string_view text, PeerRule* out, std::string* error) {
  std::string scratch;
  if (error == nullptr) error = &scratch;
  const std::string_view s = trim(text);
  if (s.empty()) {
    *error = "empty rule; expected ADDR[/PREFIX]:PORT[-PORT]";
    return false;
  }

  sa_family_t family;
  std::string_view addr_text;
  std::string_view rest;  // "[/PREFIX]:PORTS"
  if (s[0] == '[') {
    family = AF_INET6;
    const size_t close = s.find(']');
    if (close == std::string_view::npos) {
      *error = "missing ']' after the IPv6 address; expected e.g. [fd00::]/8:80";
      return false;
    }
    addr_text = s.substr(1, close - 1);
    rest = s.substr(close + 1);
  } else {
    family = AF_INET;
    const size_t colon = s.find(':');
    if (colon != std::string_view::npos && s.find(':', colon + 1) != std::string_view::npos) {
      *error = "IPv6 addresses must be in brackets, e.g. [::1]:80 or [fd00::]/8:*";
      return false;
    }
    const size_t addr_end = s.find_first_of("/:");
    addr_text = s.substr(0, addr_end == std::string_view::npos ? s.size() : addr_end);
    rest = addr_end == std::string_view::npos ? std::string_view() : s.substr(addr_end);
  }
  if (addr_text.empty()) {
    *error = "missing address; expected ADDR[/PREFIX]:PORT[-PORT]";
    return false;
  }

  uint8_t addr[16] = {};
  const std::string addr_z(addr_text);  // inet_pton needs a terminated string
  if (inet_pton(family, addr_z.c_str(), addr) != 1) {
    *error = quoted(addr_text) +
             (family == AF_INET ? " is not a numeric IPv4 address (host names are not resolved)"
                                : " is not a numeric IPv6 address");
    return false;
  }
  const unsigned max_prefix = family == AF_INET ? 32 : 128;

  unsigned prefix_len = max_prefix;
  if (!rest.empty() && rest[0] == '/') {
    const size_t colon = rest.find(':');
    const std::string_view prefix_text =
        rest.substr(1, colon == std::string_view::npos ? std::string_view::npos : colon - 1);
    uint64_t v = 0;
    if (!parse_uint(prefix_text, std::numeric_limits<uint64_t>::max(), &v) || v > max_prefix) {
      *error = "prefix " + quoted(prefix_text) + " is not valid; expected /0../" +
               std::to_string(max_prefix) + (family == AF_INET ? " for IPv4" : " for IPv6");
      return false;
    }
    prefix_len = static_cast<unsigned>(v);
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon);
  }

  if (rest.empty()) {
    *error = "missing :PORT after the address (use :* for any port)";
    return false;
  }
  if (rest[0] != ':') {
    *error = "unexpected " + quoted(rest) + " after the address; expected :PORT[-PORT]";
    return false;
  }
  const std::string_view ports = rest.substr(1);
  uint16_t port_lo = 0;
  uint16_t port_hi = 65535;
  if (ports != "*") {
    const size_t dash = ports.find('-');
    if (!parse_port(ports.substr(0, dash), &port_lo, error)) return false;
    port_hi = port_lo;
    if (dash != std::string_view::npos) {
      if (!parse_port(ports.substr(dash + 1), &port_hi, error)) return false;
      if (port_lo > port_hi) {
        *error = "port range " + quoted(ports) + " is reversed; expected LO <= HI";
        return false;
      }
    }
  }

  // A v4-mapped IPv6 rule is stored as the IPv4 rule it means, because policy
  // compares v4-mapped socket addresses as IPv4.
  static constexpr uint8_t kV4MappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (family == AF_INET6 && prefix_len >= 96 &&
      std::memcmp(addr, kV4MappedPrefix, sizeof(kV4MappedPrefix)) == 0) {
    family = AF_INET;
    std::memmove(addr, addr + 12, 4);
    std::memset(addr + 4, 0, 12);
    prefix_len -= 96;
  }
  mask_host_bits(addr, family == AF_INET ? 4 : 16, prefix_len);

  out->family = family;
  std::memcpy(out->addr, addr, sizeof(out->addr));
  out->prefix_len = static_cast<uint8_t>(prefix_len);
  out->port_lo = port_lo;
  out->port_hi = port_hi;
  return true;
}

std::vector<std::string> config_env_names() {
  std::vector<std::string> names = {"RSOCK_DISABLE", "RSOCK_CONF", "RSOCK_PEERS"};
  for (const KnobName& k : kKnobs) names.emplace_back(k.env);
  return names;
}

Config parse_config(const EnvLookup& env, const std::string* conf_text,
                    std::vector<ConfigError>* errors, const char* conf_error) {
  std::vector<ConfigError> scratch;
  if (errors == nullptr) errors = &scratch;
  const size_t first_error = errors->size();

  // An empty variable counts as unset, the usual shell convention for
  // switching a knob off with `RSOCK_X= program`.
  auto get = [&env](const char* name) -> std::optional<std::string_view> {
    if (!env) return std::nullopt;
    const char* v = env(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string_view(v);
  };

  Config config;
  if (auto v = get("RSOCK_DISABLE")) {
    const std::string_view t = trim(*v);
    if (t == "1") {
      config.disabled = true;
    } else if (t != "0" && !t.empty()) {
      errors->push_back({"RSOCK_DISABLE", quoted(*v) + " is not valid; expected 0 or 1"});
    }
  }

  // The file is parsed before the environment's knobs so that those override
  // it; its errors are reported after the environment's, in line order.
  std::vector<PeerRule> file_rules;
  std::vector<ConfigError> file_errors;
  if (auto v = get("RSOCK_CONF")) {
    config.conf_path = std::string(*v);
    if (conf_text == nullptr) {
      std::string message = "cannot read " + quoted(config.conf_path);
      if (conf_error != nullptr && *conf_error != '\0') message += std::string(": ") + conf_error;
      errors->push_back({"RSOCK_CONF", message});
    } else {
      parse_rule_file(*conf_text, config.conf_path, &config, &file_rules, &file_errors);
    }
  }

  if (auto v = get("RSOCK_PEERS")) {
    size_t pos = 0;
    while (pos <= v->size()) {
      size_t comma = v->find(',', pos);
      if (comma == std::string_view::npos) comma = v->size();
      const std::string_view item = trim(v->substr(pos, comma - pos));
      pos = comma + 1;
      if (item.empty()) continue;  // tolerate "a,,b" and a trailing comma
      PeerRule rule;
      std::string why;
      if (parse_peer_rule(item, &rule, &why)) {
        config.rules.push_back(std::move(rule));
      } else {
        errors->push_back({"RSOCK_PEERS", "bad rule " + quoted(item) + ": " + why});
      }
    }
  }

  for (const KnobName& k : kKnobs) {
    auto v = get(k.env);
    if (!v) continue;
    const std::string_view value = k.is_path ? *v : trim(*v);
    if (value.empty()) continue;  // whitespace only: unset, like an empty value
    std::string why;
    if (!apply_knob(k.knob, value, &config, &why)) errors->push_back({k.env, why});
  }
  // For tests only (no rule-file spelling): see Config.
  auto test_pause = [&](const char* env, uint32_t* out) {
    auto v = get(env);
    if (!v || trim(*v).empty()) return;
    uint64_t us = 0;
    if (parse_uint(trim(*v), kMaxTestHandoverPauseUs, &us)) {
      *out = static_cast<uint32_t>(us);
    } else {
      errors->push_back({env, quoted(trim(*v)) + " is not valid; expected an integer from 0 to " +
                                  std::to_string(kMaxTestHandoverPauseUs) + " (microseconds)"});
    }
  };
  test_pause("RSOCK_TEST_HANDOVER_PAUSE_US", &config.test_handover_pause_us);
  test_pause("RSOCK_TEST_EPOLL_PAUSE_US", &config.test_epoll_pause_us);

  for (PeerRule& rule : file_rules) config.rules.push_back(std::move(rule));
  for (ConfigError& e : file_errors) errors->push_back(std::move(e));
  if (errors->size() > first_error) config.disabled = true;
  return config;
}

}  // namespace rsock
