// Process-wide counters (see stats.h).
#include "stats/stats.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include <atomic>
#include <string>

#include "common/append_file.h"
#include "common/log.h"
#include "common/real.h"
#include "config/config.h"
#include "stats/publish.h"

namespace rsock {
namespace {

std::atomic<uint64_t> g_paths[static_cast<int>(Path::kCount)];
std::atomic<uint64_t> g_fallbacks[static_cast<int>(Fallback::kCount)];
std::atomic<uint64_t> g_resets[static_cast<int>(Reset::kCount)];
std::atomic<uint64_t> g_rejects[static_cast<int>(Reject::kCount)];
std::atomic<uint64_t> g_sent{0};
std::atomic<uint64_t> g_received{0};
std::atomic<uint64_t> g_wakeups[2];  // [0] spared, [1] sent
std::atomic<uint64_t> g_trims{0};
std::atomic<uint64_t> g_trimmed{0};  // bytes
std::atomic<uint64_t> g_held{0};     // bytes
std::atomic<uint64_t> g_regions[2];  // [0] made or mapped, [1] reused
std::atomic<uint64_t> g_rdma_rings[2];     // [0] made, [1] reused
std::atomic<uint64_t> g_before_switch[2];  // bytes received [0] / sent [1] on TCP before a switch

const char* const kFallbackNames[] = {
    "peer_not_accelerated",  "not_same_host",    "negative_cache",     "pair_timeout",
    "pair_failed",           "resources",        "transport_disabled", "unsupported_socket",
    "no_rdma_device",        "rdma_after_fork",  "rendezvous_taken",   "peer_unproven",
    "closed_before_pairing", "rdma_pinned_limit"};
static_assert(sizeof(kFallbackNames) / sizeof(kFallbackNames[0]) ==
              static_cast<size_t>(Fallback::kCount));

const char* const kResetNames[] = {"kernel_bytes", "lost_at_exec", "taken_over", "move_failed",
                                   "held_at_fork"};
static_assert(sizeof(kResetNames) / sizeof(kResetNames[0]) == static_cast<size_t>(Reset::kCount));

const char* const kRejectNames[] = {"unproven"};
static_assert(sizeof(kRejectNames) / sizeof(kRejectNames[0]) ==
              static_cast<size_t>(Reject::kCount));

// Appends `"key": {"name": count, ...}` (only non-zero counts) at buf + n.
int format_counts(char* buf, int cap, int n, const char* key, std::atomic<uint64_t>* counts,
                  const char* const* names, int count) {
  if (n < cap) n += snprintf(buf + n, cap - n, ", \"%s\": {", key);
  bool first = true;
  for (int i = 0; i < count && n < cap; ++i) {
    uint64_t v = counts[i].load();
    if (v == 0) continue;
    n += snprintf(buf + n, cap - n, "%s\"%s\": %llu", first ? "" : ", ", names[i],
                  static_cast<unsigned long long>(v));
    first = false;
  }
  if (n < cap) n += snprintf(buf + n, cap - n, "}");
  return n;
}

}  // namespace

const char* fallback_name(Fallback f) { return kFallbackNames[static_cast<int>(f)]; }
const char* reset_name(Reset r) { return kResetNames[static_cast<int>(r)]; }
const char* reject_name(Reject r) { return kRejectNames[static_cast<int>(r)]; }

// Each count also goes to the file rsockstat reads (publish.h).
void stats_connection(Path p) {
  g_paths[static_cast<int>(p)].fetch_add(1, std::memory_order_relaxed);
  publish_connection(static_cast<int>(p));
}
void stats_fallback(Fallback f) {
  g_fallbacks[static_cast<int>(f)].fetch_add(1, std::memory_order_relaxed);
  publish_code(pub::kCodeFallback, static_cast<int>(f));
}
namespace {
// One log line that ends with its code: "<what> (<kind>: <code>)".
void log_coded(int level, const char* kind, const char* code, const char* fmt, va_list ap) {
  if (level > RSOCK_LOG_CEILING || level > g_log_level) return;
  char what[512];
  vsnprintf(what, sizeof what, fmt, ap);
  log_write(level, "%s (%s: %s)", what, kind, code);
}
}  // namespace

void stats_reset_connection(Reset r, int level, const char* fmt, ...) {
  g_resets[static_cast<int>(r)].fetch_add(1, std::memory_order_relaxed);
  publish_code(pub::kCodeReset, static_cast<int>(r));
  va_list ap;
  va_start(ap, fmt);
  log_coded(level, "reset", reset_name(r), fmt, ap);
  va_end(ap);
}
void stats_reject(Reject r, int level, const char* fmt, ...) {
  g_rejects[static_cast<int>(r)].fetch_add(1, std::memory_order_relaxed);
  publish_code(pub::kCodeReject, static_cast<int>(r));
  va_list ap;
  va_start(ap, fmt);
  log_coded(level, "rejected", reject_name(r), fmt, ap);
  va_end(ap);
}
void stats_bytes(uint64_t sent, uint64_t received) {
  g_sent.fetch_add(sent, std::memory_order_relaxed);
  g_received.fetch_add(received, std::memory_order_relaxed);
  publish_closed_bytes(sent, received);
}
void stats_before_switch(uint64_t sent, uint64_t received) {
  g_before_switch[1].fetch_add(sent, std::memory_order_relaxed);
  g_before_switch[0].fetch_add(received, std::memory_order_relaxed);
}
uint64_t stats_before_switch_bytes(bool sent) { return g_before_switch[sent ? 1 : 0].load(); }
void stats_wakeup(bool sent) { g_wakeups[sent ? 1 : 0].fetch_add(1, std::memory_order_relaxed); }
uint64_t stats_wakeups(bool sent) { return g_wakeups[sent ? 1 : 0].load(); }
void stats_trimmed(uint64_t bytes) {
  g_trims.fetch_add(1, std::memory_order_relaxed);
  g_trimmed.fetch_add(bytes, std::memory_order_relaxed);
}
uint64_t stats_trims() { return g_trims.load(); }
uint64_t stats_trimmed_bytes() { return g_trimmed.load(); }
void stats_held(uint64_t bytes) { g_held.fetch_add(bytes, std::memory_order_relaxed); }
uint64_t stats_held_bytes() { return g_held.load(); }
void stats_region(bool reused) { g_regions[reused].fetch_add(1, std::memory_order_relaxed); }
uint64_t stats_regions(bool reused) { return g_regions[reused].load(); }
void stats_rdma_rings(bool reused) { g_rdma_rings[reused].fetch_add(1, std::memory_order_relaxed); }
uint64_t stats_rdma_rings_count(bool reused) { return g_rdma_rings[reused].load(); }
uint64_t stats_connections(Path p) { return g_paths[static_cast<int>(p)].load(); }
uint64_t stats_fallbacks(Fallback f) { return g_fallbacks[static_cast<int>(f)].load(); }
uint64_t stats_resets(Reset r) { return g_resets[static_cast<int>(r)].load(); }
uint64_t stats_rejects(Reject r) { return g_rejects[static_cast<int>(r)].load(); }

namespace {
std::atomic<bool> g_socket_made{false};

template <class Array>
bool any_of(const Array& a) {
  for (const auto& c : a)
    if (c.load(std::memory_order_relaxed) != 0) return true;
  return false;
}
}  // namespace

void stats_socket_made() {
  if (!g_socket_made.load(std::memory_order_relaxed)) {
    g_socket_made.store(true, std::memory_order_relaxed);
    publish_begin();
  }
}

bool stats_anything() {
  return g_socket_made.load() || any_of(g_paths) || any_of(g_fallbacks) || any_of(g_resets) ||
         any_of(g_rejects) || g_sent.load() || g_received.load() || any_of(g_wakeups) ||
         g_trims.load() || g_held.load() || any_of(g_regions) || any_of(g_before_switch);
}

void stats_reset() {
  // g_socket_made stays: a fork's child holds the sockets its parent made
  // (an idle worker of a preforking server still reports, with zeros).
  for (auto& c : g_paths) c.store(0);
  for (auto& c : g_fallbacks) c.store(0);
  for (auto& c : g_resets) c.store(0);
  for (auto& c : g_rejects) c.store(0);
  g_sent.store(0);
  g_received.store(0);
  for (auto& c : g_wakeups) c.store(0);
  g_trims.store(0);
  g_trimmed.store(0);
  g_held.store(0);
  for (auto& c : g_regions) c.store(0);
  for (auto& c : g_before_switch) c.store(0);
}

int stats_format(char* buf, int cap, int pid, const char* program, uint64_t open_sent,
                 uint64_t open_received, uint64_t open_before_sent, uint64_t open_before_received) {
  // Program names come from argv[0]: escape what JSON requires.
  char prog[256];
  int p = 0;
  for (const char* c = program; *c && p < static_cast<int>(sizeof prog) - 7; ++c) {
    unsigned char ch = static_cast<unsigned char>(*c);
    if (ch == '"' || ch == '\\') {
      prog[p++] = '\\';
      prog[p++] = static_cast<char>(ch);
    } else if (ch < 0x20) {
      p += snprintf(prog + p, sizeof prog - p, "\\u%04x", ch);
    } else {
      prog[p++] = static_cast<char>(ch);
    }
  }
  prog[p] = '\0';
  int n = snprintf(buf, cap,
                   "{\"pid\": %d, \"program\": \"%s\", \"connections\": {\"shm\": %llu, "
                   "\"rdma\": %llu, \"tcp\": %llu}",
                   pid, prog, static_cast<unsigned long long>(stats_connections(Path::kShm)),
                   static_cast<unsigned long long>(stats_connections(Path::kRdma)),
                   static_cast<unsigned long long>(stats_connections(Path::kTcp)));
  n = format_counts(buf, cap, n, "fallbacks", g_fallbacks, kFallbackNames,
                    static_cast<int>(Fallback::kCount));
  n = format_counts(buf, cap, n, "resets", g_resets, kResetNames, static_cast<int>(Reset::kCount));
  n = format_counts(buf, cap, n, "rejected", g_rejects, kRejectNames,
                    static_cast<int>(Reject::kCount));
  if (n < cap)
    n += snprintf(buf + n, cap - n, ", \"wakeups\": {\"sent\": %llu, \"spared\": %llu}",
                  static_cast<unsigned long long>(stats_wakeups(true)),
                  static_cast<unsigned long long>(stats_wakeups(false)));
  if (n < cap)
    n += snprintf(buf + n, cap - n, ", \"trimmed\": {\"rings\": %llu, \"bytes\": %llu}",
                  static_cast<unsigned long long>(stats_trims()),
                  static_cast<unsigned long long>(stats_trimmed_bytes()));
  if (n < cap)
    n += snprintf(buf + n, cap - n, ", \"held\": {\"bytes\": %llu}",
                  static_cast<unsigned long long>(stats_held_bytes()));
  if (n < cap)
    n += snprintf(buf + n, cap - n, ", \"regions\": {\"made\": %llu, \"reused\": %llu}",
                  static_cast<unsigned long long>(stats_regions(false)),
                  static_cast<unsigned long long>(stats_regions(true)));
  if (n < cap && (g_rdma_rings[0].load() | g_rdma_rings[1].load()) != 0)
    n += snprintf(buf + n, cap - n, ", \"rdma_rings\": {\"made\": %llu, \"reused\": %llu}",
                  static_cast<unsigned long long>(stats_rdma_rings_count(false)),
                  static_cast<unsigned long long>(stats_rdma_rings_count(true)));
  if (n < cap)
    n +=
        snprintf(buf + n, cap - n, ", \"before_switch\": {\"sent\": %llu, \"received\": %llu}",
                 static_cast<unsigned long long>(g_before_switch[1].load() + open_before_sent),
                 static_cast<unsigned long long>(g_before_switch[0].load() + open_before_received));
  if (n < cap)
    n += snprintf(buf + n, cap - n, ", \"bytes_sent\": %llu, \"bytes_received\": %llu}",
                  static_cast<unsigned long long>(g_sent.load() + open_sent),
                  static_cast<unsigned long long>(g_received.load() + open_received));
  return n < cap ? n : cap - 1;
}

void stats_append(const char* path, const char* line, int len) {
  const char* why = nullptr;
  int fd = open_append_file(path, &why);
  if (fd < 0) {
    // Said once per process, however often the statistics are flushed.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      const std::string msg = "librsock: RSOCK_STATS: cannot append to \"" + message_text(path) +
                              "\": " + why + "; no statistics written\n";
      real().write(2, msg.data(), msg.size());
    }
    return;
  }
  char buf[4096];
  if (len > static_cast<int>(sizeof buf) - 1) len = sizeof buf - 1;
  __builtin_memcpy(buf, line, len);
  buf[len] = '\n';
  real().write(fd, buf, len + 1);
  real().close(fd);
}

}  // namespace rsock
