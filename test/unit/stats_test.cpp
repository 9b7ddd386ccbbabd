// Unit tests for src/stats: the JSON line is parsed by a small strict JSON
// parser (objects, arrays, strings with escapes, numbers, literals; no raw
// control characters in strings, nothing after the value) and its keys and
// values checked; program names with quotes, backslashes and control
// characters round-trip; the fallback reason names are the documented stable
// strings; stats_reset zeroes everything; truncation never overflows; and
// stats_append writes one newline-terminated line per call.

#include "stats/stats.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "config/config.h"
#include "stats/publish.h"

namespace rsock {
namespace {

// Flattens a JSON document into path -> value: scalars by their text
// (strings decoded), objects as "{}" and arrays as "[]" (their members get
// "path.key" / "path[i]" entries).
class JsonFlattener {
 public:
  explicit JsonFlattener(const std::string& text) : s_(text) {}

  bool parse(std::map<std::string, std::string>* out) {
    out_ = out;
    skip_ws();
    if (!value("")) return false;
    skip_ws();
    return i_ == s_.size();
  }

 private:
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r'))
      ++i_;
  }
  bool eat(char c) {
    skip_ws();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool value(const std::string& path) {
    skip_ws();
    if (i_ >= s_.size()) return false;
    const char c = s_[i_];
    if (c == '{') return object(path);
    if (c == '[') return array(path);
    if (c == '"') {
      std::string v;
      if (!string(&v)) return false;
      return put(path, v);
    }
    for (const char* lit : {"true", "false", "null"}) {
      if (s_.compare(i_, strlen(lit), lit) == 0) {
        i_ += strlen(lit);
        return put(path, lit);
      }
    }
    return number(path);
  }
  bool put(const std::string& path, const std::string& v) {
    return out_->emplace(path, v).second;  // duplicate keys are an error here
  }
  bool object(const std::string& path) {
    ++i_;
    if (!put(path, "{}")) return false;
    if (eat('}')) return true;
    do {
      skip_ws();
      std::string key;
      if (i_ >= s_.size() || s_[i_] != '"' || !string(&key)) return false;
      if (!eat(':')) return false;
      if (!value(path.empty() ? key : path + "." + key)) return false;
    } while (eat(','));
    return eat('}');
  }
  bool array(const std::string& path) {
    ++i_;
    if (!put(path, "[]")) return false;
    if (eat(']')) return true;
    int n = 0;
    do {
      if (!value(path + "[" + std::to_string(n++) + "]")) return false;
    } while (eat(','));
    return eat(']');
  }
  bool number(const std::string& path) {
    const size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (i_ >= s_.size() || !isdigit(static_cast<unsigned char>(s_[i_]))) return false;
    if (s_[i_] == '0' && i_ + 1 < s_.size() && isdigit(static_cast<unsigned char>(s_[i_ + 1])))
      return false;  // no leading zeros
    while (i_ < s_.size() && isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) return false;
    return put(path, s_.substr(start, i_ - start));
  }
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  bool string(std::string* out) {
    ++i_;  // opening quote
    while (i_ < s_.size()) {
      const unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return true;
      if (c < 0x20) return false;  // raw control characters are invalid JSON
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        continue;
      }
      if (i_ >= s_.size()) return false;
      const char e = s_[i_++];
      switch (e) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          if (i_ + 4 > s_.size()) return false;
          int v = 0;
          for (int k = 0; k < 4; ++k) {
            const int h = hex(s_[i_++]);
            if (h < 0) return false;
            v = v * 16 + h;
          }
          if (v >= 0x80) return false;  // stats only escapes ASCII controls
          out->push_back(static_cast<char>(v));
          break;
        }
        default:
          return false;
      }
    }
    return false;  // unterminated
  }

  const std::string& s_;
  size_t i_ = 0;
  std::map<std::string, std::string>* out_ = nullptr;
};

std::map<std::string, std::string> parse_or_fail(const std::string& text) {
  std::map<std::string, std::string> m;
  EXPECT_TRUE(JsonFlattener(text).parse(&m)) << "invalid JSON: " << text;
  return m;
}

std::string format(int pid, const char* program, uint64_t open_sent = 0,
                   uint64_t open_received = 0) {
  char buf[4096];
  const int n = stats_format(buf, sizeof buf, pid, program, open_sent, open_received);
  EXPECT_GT(n, 0);
  EXPECT_LT(n, static_cast<int>(sizeof buf));
  EXPECT_EQ(strlen(buf), static_cast<size_t>(n));
  return std::string(buf, n > 0 ? n : 0);
}

class Stats : public ::testing::Test {
 protected:
  void SetUp() override { stats_reset(); }
  void TearDown() override { stats_reset(); }
};

TEST(JsonFlattenerSelfTest, RejectsWhatIsNotJson) {
  std::map<std::string, std::string> m;
  for (const char* bad : {"{", "{\"a\": 1", "{\"a\" 1}", "{\"a\": 1,}", "{\"a\": \"x\ny\"}",
                          "{\"a\": 01}", "{\"a\": \"\\q\"}", "{\"a\": 1} x", "{\"a\": 1, \"a\": 2}",
                          "{a: 1}", "{\"a\": \"unterminated}"}) {
    m.clear();
    EXPECT_FALSE(JsonFlattener(bad).parse(&m)) << bad;
  }
  m.clear();
  ASSERT_TRUE(JsonFlattener("{\"a\": {\"b\": [1, \"x\\\"\\u0001\"]}, \"c\": true}").parse(&m));
  EXPECT_EQ(m["a"], "{}");
  EXPECT_EQ(m["a.b[0]"], "1");
  EXPECT_EQ(m["a.b[1]"], std::string("x\"\x01"));
  EXPECT_EQ(m["c"], "true");
}

TEST_F(Stats, FreshCountersFormatAsZeros) {
  const std::string line = format(1234, "echo_srv");
  auto m = parse_or_fail(line);
  EXPECT_EQ(m[""], "{}");
  EXPECT_EQ(m["pid"], "1234");
  EXPECT_EQ(m["program"], "echo_srv");
  EXPECT_EQ(m["connections"], "{}");
  EXPECT_EQ(m["connections.shm"], "0");
  EXPECT_EQ(m["connections.rdma"], "0");
  EXPECT_EQ(m["connections.tcp"], "0");
  EXPECT_EQ(m["fallbacks"], "{}");
  EXPECT_EQ(m["resets"], "{}");
  EXPECT_EQ(m["rejected"], "{}");
  EXPECT_EQ(m["wakeups"], "{}");
  EXPECT_EQ(m["wakeups.sent"], "0");
  EXPECT_EQ(m["wakeups.spared"], "0");
  EXPECT_EQ(m["trimmed"], "{}");
  EXPECT_EQ(m["trimmed.rings"], "0");
  EXPECT_EQ(m["trimmed.bytes"], "0");
  EXPECT_EQ(m["held"], "{}");
  EXPECT_EQ(m["held.bytes"], "0");
  EXPECT_EQ(m["regions"], "{}");
  EXPECT_EQ(m["regions.made"], "0");
  EXPECT_EQ(m["regions.reused"], "0");
  EXPECT_EQ(m["bytes_sent"], "0");
  EXPECT_EQ(m["bytes_received"], "0");
  EXPECT_EQ(m["before_switch"], "{}");
  EXPECT_EQ(m["before_switch.sent"], "0");
  EXPECT_EQ(m["before_switch.received"], "0");
  EXPECT_EQ(m.size(), 26u);  // nothing else, in particular no reason entries
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

TEST_F(Stats, CountersAppearInTheLine) {
  stats_connection(Path::kShm);
  stats_connection(Path::kShm);
  stats_connection(Path::kTcp);
  stats_fallback(Fallback::kPairTimeout);
  stats_fallback(Fallback::kPairTimeout);
  stats_fallback(Fallback::kPairTimeout);
  stats_fallback(Fallback::kResources);
  stats_bytes(100, 200);
  stats_bytes(1, 2);
  stats_wakeup(true);
  stats_wakeup(false);
  stats_wakeup(false);
  stats_trimmed(65536);
  stats_trimmed(8192);
  stats_before_switch(40, 2);
  stats_held(4096);
  stats_held(100);
  stats_region(false);
  stats_region(true);
  stats_region(true);
  EXPECT_EQ(stats_connections(Path::kShm), 2u);
  EXPECT_EQ(stats_connections(Path::kRdma), 0u);
  EXPECT_EQ(stats_connections(Path::kTcp), 1u);
  EXPECT_EQ(stats_fallbacks(Fallback::kPairTimeout), 3u);
  EXPECT_EQ(stats_fallbacks(Fallback::kResources), 1u);
  EXPECT_EQ(stats_fallbacks(Fallback::kNotSameHost), 0u);
  auto m = parse_or_fail(format(7, "p", 5, 7));
  EXPECT_EQ(m["connections.shm"], "2");
  EXPECT_EQ(m["connections.rdma"], "0");
  EXPECT_EQ(m["connections.tcp"], "1");
  EXPECT_EQ(m["fallbacks.pair_timeout"], "3");
  EXPECT_EQ(m["fallbacks.resources"], "1");
  EXPECT_EQ(m.count("fallbacks.not_same_host"), 0u);  // zero reasons are left out
  EXPECT_EQ(m["bytes_sent"], "106");                  // closed 101 + open 5
  EXPECT_EQ(m["bytes_received"], "209");
  EXPECT_EQ(m["wakeups.sent"], "1");
  EXPECT_EQ(m["wakeups.spared"], "2");
  EXPECT_EQ(m["trimmed.rings"], "2");
  EXPECT_EQ(m["trimmed.bytes"], "73728");
  EXPECT_EQ(m["before_switch.sent"], "40");
  EXPECT_EQ(m["before_switch.received"], "2");
  EXPECT_EQ(m["held.bytes"], "4196");
  EXPECT_EQ(m["regions.made"], "1");
  EXPECT_EQ(m["regions.reused"], "2");
  EXPECT_EQ(m.size(), 28u);
}

TEST_F(Stats, ResetsAndRejectsAppearByName) {
  stats_reset_connection(Reset::kKernelBytes, kLogTrace, "not logged at the default level");
  stats_reset_connection(Reset::kKernelBytes, kLogTrace, "not logged at the default level");
  stats_reject(Reject::kUnproven, kLogTrace, "not logged at the default level");
  EXPECT_EQ(stats_resets(Reset::kKernelBytes), 2u);
  EXPECT_EQ(stats_rejects(Reject::kUnproven), 1u);
  auto m = parse_or_fail(format(7, "p"));
  EXPECT_EQ(m["resets.kernel_bytes"], "2");
  EXPECT_EQ(m["rejected.unproven"], "1");
  EXPECT_EQ(m.size(), 28u);
}

TEST_F(Stats, LargeCountersFormatInFull) {
  stats_bytes(uint64_t{1} << 40, UINT64_MAX - 10);
  auto m = parse_or_fail(format(1, "p", 3, 10));
  EXPECT_EQ(m["bytes_sent"], std::to_string((uint64_t{1} << 40) + 3));
  EXPECT_EQ(m["bytes_received"], std::to_string(UINT64_MAX));
}

TEST_F(Stats, EveryFallbackReasonIsAKeyWithItsName) {
  for (int i = 0; i < static_cast<int>(Fallback::kCount); ++i) {
    stats_reset();
    const Fallback f = static_cast<Fallback>(i);
    for (int k = 0; k <= i; ++k) stats_fallback(f);
    auto m = parse_or_fail(format(1, "p"));
    EXPECT_EQ(m["fallbacks." + std::string(fallback_name(f))], std::to_string(i + 1));
    EXPECT_EQ(m.size(), 27u) << fallback_name(f);
  }
}

TEST(StatsNames, FallbackNamesAreStable) {
  EXPECT_STREQ(fallback_name(Fallback::kPeerNotAccelerated), "peer_not_accelerated");
  EXPECT_STREQ(fallback_name(Fallback::kNotSameHost), "not_same_host");
  EXPECT_STREQ(fallback_name(Fallback::kNegativeCache), "negative_cache");
  EXPECT_STREQ(fallback_name(Fallback::kPairTimeout), "pair_timeout");
  EXPECT_STREQ(fallback_name(Fallback::kPairFailed), "pair_failed");
  EXPECT_STREQ(fallback_name(Fallback::kResources), "resources");
  EXPECT_STREQ(fallback_name(Fallback::kTransportDisabled), "transport_disabled");
  EXPECT_STREQ(fallback_name(Fallback::kUnsupportedSocket), "unsupported_socket");
  EXPECT_STREQ(fallback_name(Fallback::kNoRdmaDevice), "no_rdma_device");
  EXPECT_STREQ(fallback_name(Fallback::kRdmaAfterFork), "rdma_after_fork");
  EXPECT_STREQ(fallback_name(Fallback::kRendezvousTaken), "rendezvous_taken");
  EXPECT_STREQ(fallback_name(Fallback::kPeerUnproven), "peer_unproven");
  EXPECT_STREQ(fallback_name(Fallback::kClosedEarly), "closed_before_pairing");
  EXPECT_STREQ(fallback_name(Fallback::kRdmaPinnedLimit), "rdma_pinned_limit");
  EXPECT_EQ(static_cast<int>(Fallback::kCount), 14);
  std::set<std::string> names;
  for (int i = 0; i < static_cast<int>(Fallback::kCount); ++i)
    names.insert(fallback_name(static_cast<Fallback>(i)));
  EXPECT_EQ(names.size(), 14u);
}

TEST(StatsNames, ResetAndRejectNamesAreStable) {
  EXPECT_STREQ(reset_name(Reset::kKernelBytes), "kernel_bytes");
  EXPECT_STREQ(reset_name(Reset::kLostAtExec), "lost_at_exec");
  EXPECT_STREQ(reset_name(Reset::kTakenOver), "taken_over");
  EXPECT_STREQ(reset_name(Reset::kMoveFailed), "move_failed");
  EXPECT_STREQ(reset_name(Reset::kHeldAtFork), "held_at_fork");
  EXPECT_EQ(static_cast<int>(Reset::kCount), 5);
  EXPECT_STREQ(reject_name(Reject::kUnproven), "unproven");
  EXPECT_EQ(static_cast<int>(Reject::kCount), 1);
}

TEST_F(Stats, ProgramNameIsEscaped) {
  const std::string name = "we\"ird\\na\nme\x01\x1f\t/\x7f";
  const std::string line = format(1, name.c_str());
  auto m = parse_or_fail(line);
  EXPECT_EQ(m["program"], name);
  EXPECT_NE(line.find("we\\\"ird\\\\na"), std::string::npos) << line;
  EXPECT_NE(line.find("\\u0001"), std::string::npos) << line;
  EXPECT_NE(line.find("\\u001f"), std::string::npos) << line;
}

TEST_F(Stats, NonAsciiProgramNamePassesThrough) {
  const std::string name = "pr\xc3\xb6gram";  // UTF-8
  auto m = parse_or_fail(format(1, name.c_str()));
  EXPECT_EQ(m["program"], name);
}

TEST_F(Stats, LongProgramNamesAreCutButStayValid) {
  for (const std::string& unit : {std::string("a"), std::string("\""), std::string("\x01"),
                                  std::string("ab\x02"), std::string("\\")}) {
    std::string name;
    while (name.size() < 600) name += unit;
    auto m = parse_or_fail(format(1, name.c_str()));
    const std::string& prog = m["program"];
    EXPECT_GT(prog.size(), 30u);
    EXPECT_LT(prog.size(), name.size());
    EXPECT_EQ(name.compare(0, prog.size(), prog), 0) << "not a prefix of the name";
  }
  EXPECT_EQ(parse_or_fail(format(1, ""))["program"], "");
}

TEST_F(Stats, ResetZeroesEverything) {
  stats_connection(Path::kRdma);
  stats_fallback(Fallback::kNegativeCache);
  stats_reset_connection(Reset::kKernelBytes, kLogTrace, "not logged at the default level");
  stats_reject(Reject::kUnproven, kLogTrace, "not logged at the default level");
  stats_bytes(10, 20);
  stats_reset();
  EXPECT_EQ(stats_connections(Path::kRdma), 0u);
  EXPECT_EQ(stats_fallbacks(Fallback::kNegativeCache), 0u);
  EXPECT_EQ(stats_resets(Reset::kKernelBytes), 0u);
  EXPECT_EQ(stats_rejects(Reject::kUnproven), 0u);
  auto m = parse_or_fail(format(1, "p"));
  EXPECT_EQ(m["connections.rdma"], "0");
  EXPECT_EQ(m.count("fallbacks.negative_cache"), 0u);
  EXPECT_EQ(m["bytes_sent"], "0");
  EXPECT_EQ(m["bytes_received"], "0");
}

TEST_F(Stats, SmallBuffersAreTruncatedWithoutOverflow) {
  for (int i = 0; i < static_cast<int>(Fallback::kCount); ++i)
    stats_fallback(static_cast<Fallback>(i));
  stats_reset_connection(Reset::kKernelBytes, kLogTrace, "not logged at the default level");
  stats_reject(Reject::kUnproven, kLogTrace, "not logged at the default level");
  const std::string full = format(99, "program");
  for (int cap :
       {1, 2, 10, 40, 120, 200, static_cast<int>(full.size()), static_cast<int>(full.size()) + 1}) {
    std::string buf(cap + 16, '#');
    const int n = stats_format(buf.data(), cap, 99, "program", 0, 0);
    ASSERT_GE(n, 0) << "cap " << cap;
    ASSERT_LT(n, cap) << "cap " << cap;
    EXPECT_EQ(strlen(buf.c_str()), static_cast<size_t>(n)) << "cap " << cap;
    EXPECT_EQ(buf.compare(0, n, full, 0, n), 0) << "cap " << cap;  // a prefix of the full line
    EXPECT_EQ(buf.substr(cap), std::string(16, '#')) << "wrote past cap " << cap;
  }
}

TEST(StatsAppend, AppendsOneLinePerCall) {
  char path[] = "/tmp/rsock-stats-test-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  stats_append(path, "{\"a\": 1}", 8);
  stats_append(path, "{\"b\": 2}xx", 8);  // only len bytes
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  unlink(path);
  EXPECT_EQ(ss.str(), "{\"a\": 1}\n{\"b\": 2}\n");
}

// The start time that tells a live process from one that reused its pid:
// field 22 of /proc/<pid>/stat, after a program name that may hold spaces
// and parentheses.
TEST(PublishLayout, ParsesTheStartTime) {
  uint64_t v = 0;
  EXPECT_TRUE(pub::parse_start_ticks(
      "20602 (grep) R 20559 20559 13021 0 -1 4194304 151 0 0 0 0 0 0 0 20 0 1 0 2433006 3850240",
      &v));
  EXPECT_EQ(v, 2433006u);
  EXPECT_TRUE(pub::parse_start_ticks(
      "7 (a) b (c) ) S 1 7 7 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 99 1 2", &v));
  EXPECT_EQ(v, 99u);
  EXPECT_FALSE(pub::parse_start_ticks("7 (x) S 1 2 3", &v));
  EXPECT_FALSE(pub::parse_start_ticks("no parenthesis", &v));
  char self[1024] = {};
  FILE* f = fopen("/proc/self/stat", "r");
  ASSERT_NE(f, nullptr);
  ASSERT_GT(fread(self, 1, sizeof self - 1, f), 0u);
  fclose(f);
  EXPECT_TRUE(pub::parse_start_ticks(self, &v));
  EXPECT_GT(v, 0u);
}

// docs/reason-codes.md lists every code the library counts, in its table.
TEST(ReasonCodes, DocumentedInDocs) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  ASSERT_GT(n, 0);
  self[n] = '\0';
  std::string path = self;
  path = path.substr(0, path.rfind('/')) + "/../docs/reason-codes.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> names;
  for (int i = 0; i < static_cast<int>(Fallback::kCount); ++i)
    names.push_back(fallback_name(static_cast<Fallback>(i)));
  for (int i = 0; i < static_cast<int>(Reset::kCount); ++i)
    names.push_back(reset_name(static_cast<Reset>(i)));
  for (int i = 0; i < static_cast<int>(Reject::kCount); ++i)
    names.push_back(reject_name(static_cast<Reject>(i)));
  EXPECT_EQ(names.size(), 20u);
  for (const std::string& name : names)
    EXPECT_NE(text.find("\n| `" + name + "` | "), std::string::npos) << name << " not in " << path;
}

// The layout rsockstat reads: fixed sizes, the slots on their own page.
TEST(PublishLayout, SizesAreFixed) {
  EXPECT_EQ(sizeof(pub::Slot), 128u);
  EXPECT_EQ(offsetof(pub::Slot, c), 64u);
  EXPECT_LE(sizeof(pub::Header), pub::kSlotsOffset);
  EXPECT_EQ(pub::kSlotsOffset % pub::kPage, 0u);
  EXPECT_EQ(sizeof(pub::Code), 32u);
}

}  // namespace
}  // namespace rsock
