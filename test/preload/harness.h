// Shared harness of the preload tests: spawns the test programs of
// test/progs (BUILD/progs/NAME) as real processes, with or without
// LD_PRELOAD=BUILD/librsock.so and with an exact environment, captures their
// stdout/stderr in files of a per-test scratch directory, waits for them with
// bounded timeouts, and kills (by pid) and reaps whatever is left in
// TearDown. It also parses the RSOCK_STATS JSON lines (a small, strict JSON
// reader) and the "RESULT k=v ..." lines the programs print. Free ports come
// from binding port 0. BUILD is the folder of the running test binary
// (build/, or build-tsan/ for `make tsan`), or RSOCK_TEST_BUILD when set, so
// that a sanitizer build spawns its own instrumented library and programs.
// Under a sanitizer, every spawned process writes its reports to files in
// the scratch directory, and a test with any such report fails (TearDown).
// Thread-safety: one fixture per test, used by one thread.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <grp.h>
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <link.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace rsock_test {

// ---- time ---------------------------------------------------------------------

inline int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

inline void sleep_ms(int ms) {
  timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// ---- files --------------------------------------------------------------------

inline std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline bool file_exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

inline std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) out.push_back(line);
  return out;
}

inline void remove_tree(const std::string& path) {
  DIR* d = opendir(path.c_str());
  if (d) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      std::string p = path + "/" + name;
      struct stat st;
      if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
        remove_tree(p);
      else
        unlink(p.c_str());
    }
    closedir(d);
  }
  rmdir(path.c_str());
}

// ---- JSON -----------------------------------------------------------------------

// A parsed JSON value. Numbers keep their text's integer value when they are
// non-negative integers (the stats counters), else only the double.
struct Json {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  double number = 0;
  bool is_uint = false;
  uint64_t uint = 0;
  std::string string;
  std::vector<Json> array;
  std::map<std::string, Json> object;

  bool has(const std::string& key) const { return type == Type::kObject && object.count(key) != 0; }
  const Json* get(const std::string& key) const {
    if (type != Type::kObject) return nullptr;
    auto it = object.find(key);
    return it == object.end() ? nullptr : &it->second;
  }
};

// Strict recursive-descent parser of one JSON text (RFC 8259, without
// surrogate-pair decoding: \u escapes above U+007F become '?').
class JsonParser {
 public:
  explicit JsonParser(const std::string& text) : s_(text) {}

  std::optional<Json> parse() {
    Json v;
    skip_ws();
    if (!value(&v, 0)) return std::nullopt;
    skip_ws();
    if (i_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  bool lit(const char* w) {
    size_t n = strlen(w);
    if (s_.compare(i_, n, w) != 0) return false;
    i_ += n;
    return true;
  }
  bool value(Json* v, int depth) {
    if (depth > 64 || i_ >= s_.size()) return false;
    char c = s_[i_];
    if (c == '{') return object(v, depth);
    if (c == '[') return array(v, depth);
    if (c == '"') {
      v->type = Json::Type::kString;
      return string(&v->string);
    }
    if (c == 't' || c == 'f') {
      v->type = Json::Type::kBool;
      v->boolean = c == 't';
      return lit(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      v->type = Json::Type::kNull;
      return lit("null");
    }
    return number(v);
  }
  bool object(Json* v, int depth) {
    v->type = Json::Type::kObject;
    ++i_;
    skip_ws();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return true;
    }
    for (;;) {
      skip_ws();
      std::string key;
      if (i_ >= s_.size() || s_[i_] != '"' || !string(&key)) return false;
      skip_ws();
      if (i_ >= s_.size() || s_[i_] != ':') return false;
      ++i_;
      skip_ws();
      Json member;
      if (!value(&member, depth + 1)) return false;
      if (v->object.count(key)) return false;  // duplicate keys: reject, stats never repeat one
      v->object.emplace(key, std::move(member));
      skip_ws();
      if (i_ >= s_.size()) return false;
      if (s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (s_[i_] == '}') {
        ++i_;
        return true;
      }
      return false;
    }
  }
  bool array(Json* v, int depth) {
    v->type = Json::Type::kArray;
    ++i_;
    skip_ws();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return true;
    }
    for (;;) {
      skip_ws();
      Json item;
      if (!value(&item, depth + 1)) return false;
      v->array.push_back(std::move(item));
      skip_ws();
      if (i_ >= s_.size()) return false;
      if (s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (s_[i_] == ']') {
        ++i_;
        return true;
      }
      return false;
    }
  }
  bool string(std::string* out) {
    ++i_;  // opening quote
    while (i_ < s_.size()) {
      unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') return true;
      if (c < 0x20) return false;
      if (c != '\\') {
        out->push_back(static_cast<char>(c));
        continue;
      }
      if (i_ >= s_.size()) return false;
      char e = s_[i_++];
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
          unsigned code = 0;
          for (int k = 0; k < 4; ++k) {
            char h = s_[i_++];
            if (!isxdigit(static_cast<unsigned char>(h))) return false;
            code = code * 16 + static_cast<unsigned>(isdigit(static_cast<unsigned char>(h))
                                                         ? h - '0'
                                                         : (tolower(h) - 'a' + 10));
          }
          out->push_back(code < 0x80 ? static_cast<char>(code) : '?');
          break;
        }
        default:
          return false;
      }
    }
    return false;
  }
  bool number(Json* v) {
    size_t start = i_;
    if (i_ < s_.size() && s_[i_] == '-') ++i_;
    if (i_ >= s_.size() || !isdigit(static_cast<unsigned char>(s_[i_]))) return false;
    if (s_[i_] == '0' && i_ + 1 < s_.size() && isdigit(static_cast<unsigned char>(s_[i_ + 1])))
      return false;  // no leading zeros
    while (i_ < s_.size() && isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    bool integer = true;
    if (i_ < s_.size() && s_[i_] == '.') {
      integer = false;
      ++i_;
      if (i_ >= s_.size() || !isdigit(static_cast<unsigned char>(s_[i_]))) return false;
      while (i_ < s_.size() && isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      integer = false;
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (i_ >= s_.size() || !isdigit(static_cast<unsigned char>(s_[i_]))) return false;
      while (i_ < s_.size() && isdigit(static_cast<unsigned char>(s_[i_]))) ++i_;
    }
    std::string text = s_.substr(start, i_ - start);
    v->type = Json::Type::kNumber;
    v->number = strtod(text.c_str(), nullptr);
    if (integer && text[0] != '-' && text.size() <= 20) {
      errno = 0;
      unsigned long long u = strtoull(text.c_str(), nullptr, 10);
      if (errno == 0) {
        v->is_uint = true;
        v->uint = u;
      }
    }
    return true;
  }

  const std::string& s_;
  size_t i_ = 0;
};

inline std::optional<Json> parse_json(const std::string& text) { return JsonParser(text).parse(); }

// ---- stats ----------------------------------------------------------------------

// One RSOCK_STATS line, validated against the documented shape.
struct Stats {
  int pid = 0;
  std::string program;
  std::map<std::string, uint64_t> connections;  // shm, rdma, tcp
  std::map<std::string, uint64_t> fallbacks;    // reason -> count (absent = 0)
  std::map<std::string, uint64_t> resets;       // reason -> count (absent = 0)
  std::map<std::string, uint64_t> rejected;     // reason -> count (absent = 0)
  uint64_t wakeups_sent = 0;                    // doorbells rung for a sleeping peer
  uint64_t wakeups_spared = 0;                  // not rung: the same sleep had just been rung
  uint64_t trimmed_rings = 0;                   // idle rings whose pages were given back
  uint64_t trimmed_bytes = 0;
  uint64_t held_bytes = 0;  // taken out of a full ring by a blocked sender (Stream::relieve)
  uint64_t regions_made = 0;    // shm regions made (server) or mapped (client) for a pairing
  uint64_t regions_reused = 0;  // kept from an earlier connection and used again
  uint64_t bytes_sent = 0;  // through the rings
  uint64_t bytes_received = 0;
  uint64_t before_sent = 0;  // on the kernel socket before the switch (protocol.md section 10)
  uint64_t before_received = 0;
  // What accelerated connections moved in all: through the rings, and on
  // their sockets before each direction switched.
  uint64_t total_sent() const { return bytes_sent + before_sent; }
  uint64_t total_received() const { return bytes_received + before_received; }

  uint64_t conn(const std::string& path) const {
    auto it = connections.find(path);
    return it == connections.end() ? 0 : it->second;
  }
  uint64_t fallback(const std::string& reason) const {
    auto it = fallbacks.find(reason);
    return it == fallbacks.end() ? 0 : it->second;
  }
  uint64_t reset(const std::string& reason) const {
    auto it = resets.find(reason);
    return it == resets.end() ? 0 : it->second;
  }
  uint64_t rejects(const std::string& reason) const {
    auto it = rejected.find(reason);
    return it == rejected.end() ? 0 : it->second;
  }
  uint64_t total_fallbacks() const {
    uint64_t t = 0;
    for (auto& [k, v] : fallbacks) t += v;
    return t;
  }
};

// The fallback reasons librsock documents (src/stats/stats.h).
inline const std::vector<std::string>& known_fallbacks() {
  static const std::vector<std::string> k = {
      "peer_not_accelerated", "not_same_host", "negative_cache",     "pair_timeout",
      "pair_failed",          "resources",     "transport_disabled", "unsupported_socket",
      "no_rdma_device",       "rdma_after_fork", "rendezvous_taken",   "peer_unproven",
      "closed_before_pairing"};
  return k;
}

// The reset and rejection reasons librsock documents (src/stats/stats.h).
inline const std::vector<std::string>& known_resets() {
  static const std::vector<std::string> k = {"kernel_bytes", "lost_at_exec", "taken_over",
                                             "move_failed"};
  return k;
}
inline const std::vector<std::string>& known_rejects() {
  static const std::vector<std::string> k = {"unproven"};
  return k;
}

// Parses one stats line; *error says what is wrong when it returns nullopt.
inline std::optional<Stats> parse_stats_line(const std::string& line, std::string* error) {
  auto j = parse_json(line);
  if (!j || j->type != Json::Type::kObject) {
    *error = "not a JSON object: " + line;
    return std::nullopt;
  }
  auto uint_field = [&](const Json& obj, const char* key, uint64_t* out) {
    const Json* v = obj.get(key);
    if (!v || v->type != Json::Type::kNumber || !v->is_uint) {
      *error = std::string("field '") + key + "' missing or not a non-negative integer: " + line;
      return false;
    }
    *out = v->uint;
    return true;
  };
  Stats s;
  uint64_t pid = 0;
  if (!uint_field(*j, "pid", &pid)) return std::nullopt;
  s.pid = static_cast<int>(pid);
  const Json* prog = j->get("program");
  if (!prog || prog->type != Json::Type::kString) {
    *error = "field 'program' missing: " + line;
    return std::nullopt;
  }
  s.program = prog->string;
  const Json* conns = j->get("connections");
  if (!conns || conns->type != Json::Type::kObject) {
    *error = "field 'connections' missing: " + line;
    return std::nullopt;
  }
  for (const char* path : {"shm", "rdma", "tcp"}) {
    uint64_t v = 0;
    if (!uint_field(*conns, path, &v)) return std::nullopt;
    s.connections[path] = v;
  }
  // "fallbacks", "resets", "rejected": objects of documented reason -> count.
  auto reasons = [&](const char* key, const std::vector<std::string>& known_names,
                     std::map<std::string, uint64_t>* out) {
    const Json* obj = j->get(key);
    if (!obj || obj->type != Json::Type::kObject) {
      *error = std::string("field '") + key + "' missing: " + line;
      return false;
    }
    for (auto& [reason, v] : obj->object) {
      bool known = false;
      for (auto& k : known_names) known |= k == reason;
      if (!known || v.type != Json::Type::kNumber || !v.is_uint) {
        *error = std::string("unknown ") + key + " reason or bad count '" + reason + "': " + line;
        return false;
      }
      (*out)[reason] = v.uint;
    }
    return true;
  };
  if (!reasons("fallbacks", known_fallbacks(), &s.fallbacks) ||
      !reasons("resets", known_resets(), &s.resets) ||
      !reasons("rejected", known_rejects(), &s.rejected))
    return std::nullopt;
  const Json* wakeups = j->get("wakeups");
  if (!wakeups || wakeups->type != Json::Type::kObject) {
    *error = "field 'wakeups' missing: " + line;
    return std::nullopt;
  }
  if (!uint_field(*wakeups, "sent", &s.wakeups_sent) ||
      !uint_field(*wakeups, "spared", &s.wakeups_spared))
    return std::nullopt;
  const Json* trimmed = j->get("trimmed");
  if (!trimmed || trimmed->type != Json::Type::kObject) {
    *error = "field 'trimmed' missing: " + line;
    return std::nullopt;
  }
  if (!uint_field(*trimmed, "rings", &s.trimmed_rings) ||
      !uint_field(*trimmed, "bytes", &s.trimmed_bytes))
    return std::nullopt;
  const Json* held = j->get("held");
  if (!held || held->type != Json::Type::kObject) {
    *error = "field 'held' missing: " + line;
    return std::nullopt;
  }
  if (!uint_field(*held, "bytes", &s.held_bytes)) return std::nullopt;
  const Json* regions = j->get("regions");
  if (!regions || regions->type != Json::Type::kObject) {
    *error = "field 'regions' missing: " + line;
    return std::nullopt;
  }
  if (!uint_field(*regions, "made", &s.regions_made) ||
      !uint_field(*regions, "reused", &s.regions_reused))
    return std::nullopt;
  if (!uint_field(*j, "bytes_sent", &s.bytes_sent) ||
      !uint_field(*j, "bytes_received", &s.bytes_received))
    return std::nullopt;
  const Json* before = j->get("before_switch");
  if (!before || before->type != Json::Type::kObject) {
    *error = "field 'before_switch' missing: " + line;
    return std::nullopt;
  }
  if (!uint_field(*before, "sent", &s.before_sent) ||
      !uint_field(*before, "received", &s.before_received))
    return std::nullopt;
  return s;
}

// All lines of a stats file; a malformed line is a test failure.
inline std::vector<Stats> read_stats(const std::string& path) {
  std::vector<Stats> out;
  for (const std::string& line : split_lines(read_file(path))) {
    if (line.empty()) continue;
    std::string error;
    auto s = parse_stats_line(line, &error);
    EXPECT_TRUE(s.has_value()) << error;
    if (s) out.push_back(*s);
  }
  return out;
}

// ---- RESULT lines -----------------------------------------------------------------

// "RESULT a=1 b=x" -> {a: "1", b: "x"} (the last RESULT line of text).
inline std::map<std::string, std::string> parse_result(const std::string& text,
                                                       const std::string& tag = "RESULT") {
  std::map<std::string, std::string> kv;
  for (const std::string& line : split_lines(text)) {
    if (line.rfind(tag + " ", 0) != 0) continue;
    kv.clear();
    std::istringstream in(line.substr(tag.size() + 1));
    std::string tok;
    while (in >> tok) {
      size_t eq = tok.find('=');
      if (eq != std::string::npos) kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
  }
  return kv;
}

inline uint64_t to_u64(const std::string& s) { return strtoull(s.c_str(), nullptr, 10); }

// ---- build folder and sanitizers ---------------------------------------------------

// The build folder whose library and programs the tests spawn:
// RSOCK_TEST_BUILD, else the folder of this test binary (the Makefile puts
// BUILD/preload_tests beside BUILD/librsock.so), else "build".
inline std::string build_dir() {
  const char* env = getenv("RSOCK_TEST_BUILD");
  if (env && *env) return env;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return "build";
  std::string path(exe, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

// The sanitizer runtimes loaded into this (instrumented) test binary: the
// programs of its build folder carry the same ones.
struct Sanitizers {
  // The runtime that must come first in a spawned program's LD_PRELOAD, or
  // "". ASan refuses to start unless its runtime is the first object after
  // the program; a call of the program then goes ASan -> librsock -> libc
  // (each finds the next with dlsym(RTLD_NEXT)), so librsock still sits
  // between the program and libc, and ASan still checks the program's
  // buffers. TSan is left where the program's own dependencies put it,
  // after the preloaded librsock (either runtime still starts first: the
  // instrumented program calls its init from .preinit_array, before any
  // library's constructor). TSan ignores the interceptors, locks and
  // atomics called from inside a blocking call it intercepts (poll,
  // epoll_wait, recv, ...), so with TSan first, librsock's locks taken
  // inside the program's poll() would be invisible and every hand-over
  // under them a false race. With librsock first, its calls reach libc
  // through TSan like the program's own. UBSan intercepts nothing and needs
  // no place.
  std::string preload_first;
  std::vector<std::string> option_vars;  // ASAN_OPTIONS, ... of the loaded runtimes
  // How much slower instrumented programs run: the harness's waits are
  // upper bounds against hangs, stretched by this much (TSan moves the 1 GiB
  // transfer in 70 to 120 s on a loaded 2-core machine, against 1 to 3 s
  // plain). The plain build keeps the bounds the tests state.
  int slowdown = 1;
  bool tsan = false;  // ThreadSanitizer (it runs vfork() as fork())
};

inline Sanitizers loaded_sanitizers() {
  Sanitizers found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        auto* f = static_cast<Sanitizers*>(arg);
        const char* name = info->dlpi_name;
        const char* base = name ? strrchr(name, '/') : nullptr;
        base = base ? base + 1 : name;
        if (!base) return 0;
        const bool asan = strncmp(base, "libasan.so", 10) == 0;
        const bool tsan = strncmp(base, "libtsan.so", 10) == 0;
        if (asan) f->preload_first = name;
        const bool ubsan = strncmp(base, "libubsan.so", 11) == 0;
        if (asan) f->option_vars.push_back("ASAN_OPTIONS");
        if (tsan) f->option_vars.push_back("TSAN_OPTIONS");
        if (tsan) f->tsan = true;
        if (ubsan) f->option_vars.push_back("UBSAN_OPTIONS");
        f->slowdown = std::max(f->slowdown, tsan ? 5 : asan ? 3 : ubsan ? 2 : 1);
        return 0;
      },
      &found);
  return found;
}

// The prefix of the report files a spawned process writes (the runtime
// appends ".PID").
inline constexpr const char* kSanitizerLog = "sanitizer-report";

// ---- ports ----------------------------------------------------------------------

// A port that was free a moment ago on addr (bind port 0, read it, close).
inline int free_port(const char* addr = "127.0.0.1") {
  const bool v6 = strchr(addr, ':') != nullptr;
  int s = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  sockaddr_storage ss = {};
  socklen_t len;
  if (v6) {
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    inet_pton(AF_INET6, addr, &a->sin6_addr);
    len = sizeof *a;
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    inet_pton(AF_INET, addr, &a->sin_addr);
    len = sizeof *a;
  }
  int port = -1;
  if (bind(s, reinterpret_cast<sockaddr*>(&ss), len) == 0 &&
      getsockname(s, reinterpret_cast<sockaddr*>(&ss), &len) == 0)
    port = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                    : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  close(s);
  return port;
}

// A free port other than `taken`: free_port() may hand out the same number
// twice in a row (the kernel picks bind(0)'s port afresh each time).
inline int free_port_besides(int taken) {
  int port = free_port();
  for (int i = 0; i < 20 && port == taken; ++i) port = free_port();
  return port;
}

// ---- processes --------------------------------------------------------------------

using Env = std::map<std::string, std::string>;

// Upper bounds only (never expected to be reached): generous against 2x noise.
inline constexpr int kReadyTimeoutMs = 10000;  // a server prints READY after listen()
inline constexpr int kExitTimeoutMs = 30000;   // a small exchange finishes

struct Proc {
  std::string name;  // label for messages, e.g. "server"
  pid_t pid = -1;
  std::string out_path;
  std::string err_path;
  bool reaped = false;
  int status = 0;
  bool sanitizer_to_stderr = false;  // its sanitizer reports go to err_path

  std::string out() const { return read_file(out_path); }
  std::string err() const { return read_file(err_path); }
  bool exited_ok() const { return reaped && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  std::string describe() const {
    std::ostringstream o;
    o << name << " (pid " << pid << "): ";
    if (!reaped)
      o << "still running";
    else if (WIFEXITED(status))
      o << "exit " << WEXITSTATUS(status);
    else if (WIFSIGNALED(status))
      o << "killed by signal " << WTERMSIG(status);
    o << "\n--- stdout ---\n" << out() << "--- stderr ---\n" << err();
    return o.str();
  }
};

class PreloadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/rsock-preload-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr) << strerror(errno);
    dir_ = tmpl;
    const std::string build = build_dir();
    char* lib = realpath((build + "/librsock.so").c_str(), nullptr);
    ASSERT_NE(lib, nullptr) << build << "/librsock.so not found: run the tests from the "
                            << "repository root after `make all`";
    lib_ = lib;
    free(lib);
    char* progs = realpath((build + "/progs").c_str(), nullptr);
    ASSERT_NE(progs, nullptr) << build << "/progs not found: run `make all` first";
    progs_ = progs;
    free(progs);
    stats_path_ = dir_ + "/stats.jsonl";
    san_ = loaded_sanitizers();
  }

  void TearDown() override {
    // Kill (by pid) and reap everything this test started and did not reap,
    // and whatever those started and left behind (each program leads a
    // process group of its own: an inetd's exec'd service, a forked worker).
    for (auto& p : procs_) {
      kill(-p->pid, SIGKILL);
      if (p->reaped) continue;
      kill(p->pid, SIGKILL);
      int st = 0;
      while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR) {
      }
      p->reaped = true;
      p->status = st;
    }
    expect_no_sanitizer_reports();
    if (HasFailure()) {
      for (auto& p : procs_) std::cerr << p->describe() << "\n";
      std::cerr << "--- stats ---\n"
                << read_file(stats_path_) << "(scratch kept: " << dir_ << ")\n";
    } else if (!dir_.empty()) {
      remove_tree(dir_);
    }
  }

  // The environment of a librsock process: LD_PRELOAD plus RSOCK_STATS.
  // The tier tests eager pairing (RSOCK_TCP_FIRST=0), whose connections
  // are accelerated when connect() and accept() return, unless the test
  // sets the mode; RSOCK_TCP_FIRST and RSOCK_PAIR_DELAY_MS of the test's
  // own environment reach the programs (a run of the tier in that mode).
  // The default mode has its own tests (tcp_first_test.cpp and the cases
  // of others that name it) and the apps tier.
  Env preloaded(Env extra = {}) const {
    extra["LD_PRELOAD"] = lib_;
    if (!extra.count("RSOCK_STATS")) extra["RSOCK_STATS"] = stats_path_;
    for (const char* var : {"RSOCK_TCP_FIRST", "RSOCK_PAIR_DELAY_MS"})
      if (const char* v = getenv(var); v && !extra.count(var)) extra[var] = v;
    if (!extra.count("RSOCK_TCP_FIRST")) extra["RSOCK_TCP_FIRST"] = "0";
    return extra;
  }

  // The arguments of a two-connection test program (rs_sem, rs_exec):
  // "--role server|client --port P --port2 P2", then `client_more` on the
  // client's, and on the server's too when `server_too`.
  struct RoleArgs {
    std::vector<std::string> server, client;
  };
  static RoleArgs two_port_args(int port, int port2, const std::vector<std::string>& client_more,
                                bool server_too = false) {
    auto base = [&](const char* role) {
      return std::vector<std::string>{
          "--role", role, "--port", std::to_string(port), "--port2", std::to_string(port2)};
    };
    RoleArgs a{base("server"), base("client")};
    a.client.insert(a.client.end(), client_more.begin(), client_more.end());
    if (server_too) a.server.insert(a.server.end(), client_more.begin(), client_more.end());
    return a;
  }

  // Starts build/progs/<prog> with args. The environment is this process's
  // minus every LD_PRELOAD and RSOCK_* variable, plus `env`.
  // as_user >= 0: the program runs as that uid and gid, with no
  // supplementary groups (another user than the test); prog may then be an
  // absolute path (the user must be able to execute it).
  Proc& spawn(const std::string& label, const std::string& prog,
              const std::vector<std::string>& args, const Env& env, int as_user = -1) {
    auto p = std::make_unique<Proc>();
    p->name = label;
    const int idx = static_cast<int>(procs_.size());
    p->out_path = dir_ + "/" + std::to_string(idx) + "-" + label + ".out";
    p->err_path = dir_ + "/" + std::to_string(idx) + "-" + label + ".err";
    const std::string path = prog[0] == '/' ? prog : progs_ + "/" + prog;

    // Everything the child needs is built before fork (the child only calls
    // async-signal-safe functions).
    std::vector<std::string> argv_s = {path};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      if (kv.rfind("LD_PRELOAD=", 0) == 0 || kv.rfind("RSOCK_", 0) == 0) continue;
      std::string key = kv.substr(0, kv.find('='));
      if (env.count(key)) continue;
      env_s.push_back(kv);
    }
    for (auto& [k, v] : env) {
      if (std::find(san_.option_vars.begin(), san_.option_vars.end(), k) != san_.option_vars.end())
        continue;  // below
      // The sanitizer runtime first, then what the test preloads (see
      // Sanitizers).
      if (k == "LD_PRELOAD" && !san_.preload_first.empty() && !v.empty())
        env_s.push_back(k + "=" + san_.preload_first + " " + v);
      else
        env_s.push_back(k + "=" + v);
    }
    // Reports go to files of the scratch directory, which TearDown checks:
    // a report must fail the test even from a process killed on purpose or
    // whose exit status the test does not look at. The sanitizer's own exit
    // status (66) makes exited_ok() fail too. A later option overrides an
    // earlier one: this process's options, then the test's, then ours. A
    // program run as another user cannot create files in the (private)
    // scratch directory: its reports go to its stderr, which TearDown reads.
    p->sanitizer_to_stderr = as_user >= 0;
    for (const std::string& var : san_.option_vars) {
      const char* base = getenv(var.c_str());
      std::string kv = var + "=" + (base ? base : "");
      if (env.count(var)) kv += ":" + env.at(var);
      if (!p->sanitizer_to_stderr) kv += ":log_path=" + dir_ + "/" + kSanitizerLog;
      kv += ":exitcode=66";
      std::erase_if(env_s, [&](const std::string& e) { return e.rfind(var + "=", 0) == 0; });
      env_s.push_back(kv);
    }
    // Test programs that wait on purpose (rs_sem's nb_* cases) stretch their
    // windows by the same factor as the harness's bounds.
    if (san_.slowdown > 1 && !env.count("RS_TEST_SLOWDOWN")) {
      std::erase_if(env_s,
                    [](const std::string& e) { return e.rfind("RS_TEST_SLOWDOWN=", 0) == 0; });
      env_s.push_back("RS_TEST_SLOWDOWN=" + std::to_string(san_.slowdown));
    }
    std::vector<char*> argv, envp;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);

    int in = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int out = open(p->out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = open(p->err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    EXPECT_TRUE(in >= 0 && out >= 0 && err >= 0) << strerror(errno);
    pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);  // a group of its own, which TearDown kills whole
      dup2(in, 0);
      dup2(out, 1);
      dup2(err, 2);
      // Nothing of the test process but stdio reaches the program.
      if (syscall(SYS_close_range, 3u, ~0u, 0u) != 0)
        for (int fd = 3; fd < 4096; ++fd) close(fd);
      if (as_user >= 0 && (setgroups(0, nullptr) != 0 || setgid(static_cast<gid_t>(as_user)) != 0 ||
                           setuid(static_cast<uid_t>(as_user)) != 0))
        _exit(126);
      execve(path.c_str(), argv.data(), envp.data());
      _exit(127);
    }
    close(in);
    close(out);
    close(err);
    EXPECT_GT(pid, 0) << "fork: " << strerror(errno);
    p->pid = pid;
    procs_.push_back(std::move(p));
    return *procs_.back();
  }

  // Waits (bounded; the bound stretched under a sanitizer) for p to exit;
  // false on timeout (p keeps running).
  bool wait_exit(Proc& p, int timeout_ms) {
    const int64_t end = now_ms() + int64_t{timeout_ms} * san_.slowdown;
    for (;;) {
      if (p.reaped) return true;
      int st = 0;
      pid_t r = waitpid(p.pid, &st, WNOHANG);
      if (r == p.pid) {
        p.reaped = true;
        p.status = st;
        return true;
      }
      if (r < 0 && errno != EINTR) return false;
      if (now_ms() >= end) return false;
      sleep_ms(2);
    }
  }

  // Waits (bounded, as wait_exit) until p's stdout has a line starting with
  // `prefix`; false when p exits first or on timeout.
  bool wait_line(Proc& p, const std::string& prefix, int timeout_ms) {
    const int64_t end = now_ms() + int64_t{timeout_ms} * san_.slowdown;
    for (;;) {
      for (const std::string& line : split_lines(p.out()))
        if (line.rfind(prefix, 0) == 0) return true;
      if (p.reaped) return false;
      int st = 0;
      if (waitpid(p.pid, &st, WNOHANG) == p.pid) {
        p.reaped = true;
        p.status = st;
        continue;  // one more look at the output it left
      }
      if (now_ms() >= end) return false;
      sleep_ms(2);
    }
  }

  // Starts a server program and waits (bounded) for its "READY" line.
  // Check the result with ASSERT_TRUE(wait_line(...)) semantics: on failure
  // the returned Proc has printed no READY (see describe()).
  Proc& start_server(const std::string& label, const std::string& prog,
                     const std::vector<std::string>& args, const Env& env, bool* ready) {
    Proc& p = spawn(label, prog, args, env);
    *ready = wait_line(p, "READY", kReadyTimeoutMs);
    return p;
  }

  // Kills p and its process group (SIGKILL) and reaps it.
  void kill_proc(Proc& p) {
    kill(-p.pid, SIGKILL);
    if (p.reaped) return;
    kill(p.pid, SIGKILL);
    int st = 0;
    while (waitpid(p.pid, &st, 0) < 0 && errno == EINTR) {
    }
    p.reaped = true;
    p.status = st;
  }

  std::vector<Stats> stats() const { return read_stats(stats_path_); }

  // The one stats line of p (by pid), or nullopt (with a failure) if there
  // is none or more than one.
  std::optional<Stats> stats_of(const Proc& p) const {
    std::optional<Stats> found;
    int count = 0;
    for (const Stats& s : stats())
      if (s.pid == p.pid) {
        found = s;
        ++count;
      }
    EXPECT_EQ(count, 1) << "expected one stats line for " << p.name << " (pid " << p.pid << ")";
    return count == 1 ? found : std::nullopt;
  }

  // The report files the spawned processes wrote so far (paths).
  std::vector<std::string> sanitizer_reports() const {
    std::vector<std::string> out;
    DIR* d = opendir(dir_.c_str());
    if (!d) return out;
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind(kSanitizerLog, 0) == 0) out.push_back(dir_ + "/" + name);
    }
    closedir(d);
    return out;
  }

  // Fails the test for every sanitizer report a spawned process wrote.
  // One notice is not a report: LeakSanitizer in the child of a fork made
  // while another thread was still running (a pairing thread on its way
  // out) names that thread, which does not exist in the child, as "not
  // suspended" before it checks. Any leak it then finds is written below
  // the notice and still fails the test.
  void expect_no_sanitizer_reports() const {
    for (const std::string& path : sanitizer_reports()) {
      const std::string text = read_file(path);
      bool report = false;
      for (const std::string& line : split_lines(text))
        if (!line.empty() &&
            line.find("was not suspended. False leaks are possible.") == std::string::npos)
          report = true;
      if (report)
        ADD_FAILURE() << "sanitizer report from a spawned process (" << path << "):\n" << text;
    }
    for (const auto& p : procs_) {
      if (!p->sanitizer_to_stderr) continue;
      const std::string text = p->err();
      if (text.find("Sanitizer") != std::string::npos ||
          text.find(" runtime error: ") != std::string::npos)
        ADD_FAILURE() << "sanitizer report from " << p->name << " (pid " << p->pid << "):\n"
                      << text;
    }
  }

  const Sanitizers& sanitizers() const { return san_; }

  const std::string& dir() const { return dir_; }
  const std::string& lib() const { return lib_; }
  const std::string& progs() const { return progs_; }
  const std::string& stats_path() const { return stats_path_; }

 private:
  std::string dir_;
  std::string lib_;
  std::string progs_;
  std::string stats_path_;
  Sanitizers san_;  // the runtimes of this build (none in a plain build)
  std::vector<std::unique_ptr<Proc>> procs_;
};

// ---- assertions on stats ------------------------------------------------------------

// The process carried exactly `shm` shm and `tcp` tcp connections, no rdma.
inline void expect_paths(const Stats& s, uint64_t shm, uint64_t tcp, const std::string& who) {
  EXPECT_EQ(s.conn("shm"), shm) << who << ": connections.shm";
  EXPECT_EQ(s.conn("tcp"), tcp) << who << ": connections.tcp";
  EXPECT_EQ(s.conn("rdma"), 0u) << who << ": connections.rdma";
}

// Exactly the given fallbacks (reason -> count) and no others.
inline void expect_fallbacks(const Stats& s, const std::map<std::string, uint64_t>& want,
                             const std::string& who) {
  for (auto& [reason, count] : want)
    EXPECT_EQ(s.fallback(reason), count) << who << ": fallbacks." << reason;
  uint64_t total = 0;
  for (auto& [reason, count] : want) total += count;
  EXPECT_EQ(s.total_fallbacks(), total) << who << ": unexpected fallback reasons recorded";
}

}  // namespace rsock_test
