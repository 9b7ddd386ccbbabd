// Config: every librsock knob, parsed once from the environment and the
// optional rule file into one immutable value. Pure: no I/O, no globals; the
// caller (src/lifecycle) fetches the environment and the file text and prints
// the errors. Thread-safety: a Config is immutable after parse_config returns.
#pragma once

#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace rsock {

// Which path a matching stream should take. kAuto = the best available one
// (shared memory for a same-host peer, RDMA otherwise, else plain TCP).
enum class TransportKind : uint8_t { kAuto, kRdma, kShm, kTcp };
// Which side of a stream a rule names. kAny matches both.
enum class Role : uint8_t { kAny, kClient, kServer };

const char* transport_name(TransportKind t);  // "auto", "rdma", "shm", "tcp"
const char* role_name(Role r);                // "any", "client", "server"

// One peer rule: ADDR[/PREFIX]:PORT[-PORT] plus optional scope.
struct PeerRule {
  TransportKind transport = TransportKind::kAuto;
  Role role = Role::kAny;
  std::string program;  // empty: any program; else exact match of the short name
  sa_family_t family = AF_INET;  // AF_INET or AF_INET6
  uint8_t addr[16] = {};         // network byte order; first 4 bytes for AF_INET
  uint8_t prefix_len = 32;       // 0..32 (v4) or 0..128 (v6)
  uint16_t port_lo = 0;          // inclusive, host byte order; '*' = 0..65535
  uint16_t port_hi = 65535;
};

// Defaults, the single place they are defined (README.md and docs/configuration.md mirror this).
inline constexpr size_t kDefaultRingBytes = 256u << 10;      // RSOCK_RING_SIZE
inline constexpr size_t kMinRingBytes = 4u << 10;            // 4 KiB
inline constexpr size_t kMaxRingBytes = 256u << 20;          // 256 MiB
inline constexpr uint32_t kDefaultSpinUs = 50;               // RSOCK_SPIN_US
inline constexpr uint32_t kMaxSpinUs = 1000000;
inline constexpr uint32_t kDefaultConnectTimeoutMs = 1000;   // RSOCK_CONNECT_TIMEOUT_MS
inline constexpr uint32_t kMaxConnectTimeoutMs = 600000;
inline constexpr int kDefaultLogLevel = 1;                   // RSOCK_LOG_LEVEL = warn
inline constexpr uint32_t kDefaultPairDelayMs = 5;           // RSOCK_PAIR_DELAY_MS
inline constexpr uint32_t kMaxPairDelayMs = 60000;
inline constexpr uint32_t kDefaultRegionCache = 16;  // RSOCK_REGION_CACHE
inline constexpr uint32_t kMaxRegionCache = 4096;
inline constexpr uint64_t kDefaultRdmaPinned = 512ull << 20;  // RSOCK_RDMA_PINNED
inline constexpr uint64_t kMaxRdmaPinned = 1ull << 40;        // 1 TiB
inline constexpr uint32_t kMaxTestHandoverPauseUs = 100000;  // RSOCK_TEST_*_PAUSE_US

// Messages about configuration (and the files it names) echo values from
// the environment and the rule file, which may be hostile: a value is cut to
// its first kMessageValueBytes bytes, and a rule-file line longer than
// kMaxConfLineBytes is reported by its length alone (docs/configuration.md).
inline constexpr size_t kMessageValueBytes = 64;
inline constexpr size_t kMaxConfLineBytes = 1024;
// The rule file is read whole; a larger one is refused ("cannot read").
inline constexpr size_t kMaxConfFileBytes = 1u << 20;

enum LogLevel : int { kLogError = 0, kLogWarn = 1, kLogInfo = 2, kLogDebug = 3, kLogTrace = 4 };

struct Config {
  bool disabled = false;  // RSOCK_DISABLE=1, or a configuration error
  int log_level = kDefaultLogLevel;
  std::string log_file;     // RSOCK_LOG_FILE; empty = stderr
  std::string stats_path;   // RSOCK_STATS; empty = no stats file
  // RSOCK_STATS_ALL=1: every process writes its stats line, also one that
  // made no TCP socket and counted nothing (stats_anything).
  bool stats_all = false;
  // RSOCK_PUBLISH=0: this process is not shown by rsockstat (no file in
  // RSOCK_PUBLISH_DIR, stats/publish.h).
  bool publish = true;
  std::string publish_dir = "/dev/shm";
  std::string conf_path;    // RSOCK_CONF; empty = none
  size_t ring_bytes = kDefaultRingBytes;
  uint32_t spin_us = kDefaultSpinUs;
  uint32_t connect_timeout_ms = kDefaultConnectTimeoutMs;
  // RSOCK_TCP_FIRST (1 by default): a shared-memory candidate starts on
  // TCP and pairs in the background; each side starts its pairing
  // pair_delay_ms after connect() and accept(), and never for a connection
  // that ended first (docs/design.md, "Connection setup"). 0 pairs it
  // inside connect() and accept() (eager pairing).
  bool tcp_first = true;
  uint32_t pair_delay_ms = kDefaultPairDelayMs;
  // How many regions of closed shared-memory connections a process keeps
  // for its next connections with the same peer processes, and as many
  // mappings (transport/shm/region_cache.h); 0 keeps none.
  uint32_t region_cache = kDefaultRegionCache;
  // RSOCK_RDMA_PINNED: the most memory the RDMA rings of one process may
  // pin (registered memory, kept rings included); a connection beyond it
  // stays on TCP (transport/verbs/verbs_rings.h). 0: none goes over RDMA.
  uint64_t rdma_pinned = kDefaultRdmaPinned;
  // RSOCK_REGION_FILE=connection: each shared-memory connection's region
  // in a memfd of its own (one more descriptor per connection), not in the
  // file of the pair of processes (transport/shm/arena.h), for a program
  // that hands accelerated sockets to programs it trusts less through exec
  // or spawn: such a program gets the file with the socket.
  bool region_file_per_connection = false;
  // RSOCK_TEST_HANDOVER_PAUSE_US, for tests: the pairing's thread pauses
  // this long twice in each hand-over (socket/pending.cpp, hand_over): once
  // after the outcome is published and the epoll members converted, before
  // an fd's own call may hand it over (pending_settle), and once more after,
  // before the pairing's thread hands over the fds not handed yet. A thread
  // that loses the processor there opens the same windows; the pause makes
  // them wide enough for a test to meet often.
  uint32_t test_handover_pause_us = 0;
  // RSOCK_TEST_EPOLL_PAUSE_US, for tests: an epoll_wait whose first look at
  // its members found one ready pauses this long before it asks the kernel
  // too (progress/readiness.cpp, rs_epoll_wait), with the set's lock held.
  uint32_t test_epoll_pause_us = 0;
  std::vector<PeerRule> rules;  // RSOCK_PEERS rules first, then the rule file's, in order
};

// One problem found while parsing: `source` names the variable or
// "file:line" of the rule file; `message` says what is wrong and what was expected.
struct ConfigError {
  std::string source;
  std::string message;
  std::string to_string() const;  // "librsock: RSOCK_RING_SIZE: ... ; running on plain TCP"
};

using EnvLookup = std::function<const char*(const char* name)>;

// Parses the environment (RSOCK_*) and, when RSOCK_CONF is set, `conf_text`
// (the rule file's contents, read by the caller; pass nullptr when the file
// could not be read, which is itself an error, and `conf_error` may say
// why: "not a regular file"). On any error the returned Config has
// disabled = true (plain TCP everywhere) and `errors` says why: every
// problem is appended, environment first, then the file in line order.
// `errors` may be nullptr. Environment knobs override the file's `set` lines.
Config parse_config(const EnvLookup& env, const std::string* conf_text,
                    std::vector<ConfigError>* errors, const char* conf_error = nullptr);

// The environment variables a user may set (RSOCK_TEST_* aside): what
// rsock-run --help must document.
std::vector<std::string> config_env_names();

// Parses one rule "ADDR[/PREFIX]:PORT[-PORT]" (IPv6 in brackets: "[::1]:80",
// "[fd00::]/8:*"). Returns false and sets *error (may be nullptr) on bad input,
// leaving *out unchanged. On success sets only the address and port fields of
// *out (transport, role and program are the caller's); host bits beyond the
// prefix are cleared and a v4-mapped IPv6 rule with prefix >= 96 becomes IPv4.
bool parse_peer_rule(std::string_view text, PeerRule* out, std::string* error);

// A value as it may appear in a message: its first kMessageValueBytes
// bytes, then "..." if it was longer; '"' and '\' are backslash-escaped, tab,
// newline and carriage return become \t \n \r, and every other byte outside
// printable ASCII becomes \xHH, so that no value can write a terminal control
// sequence. The result is printable ASCII, at most 4 * kMessageValueBytes + 3
// bytes long.
std::string message_text(std::string_view value);

// Parses a size such as "65536", "64K", "1M", "64KiB" (binary units, any case,
// optional trailing B/iB). No range check; false on junk or overflow.
bool parse_size(std::string_view text, size_t* out);

}  // namespace rsock
