// Process-wide runtime: init, fork and exit hooks (see runtime.h).
#include "lifecycle/runtime.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <vector>

#include "common/barrier.h"
#include "common/log.h"
#include "common/real.h"
#include "common/sleep_token.h"
#include "fdtable/fdtable.h"
#include "lifecycle/exec_handoff.h"
#include "progress/readiness.h"
#include "socket/interruptible.h"
#include "socket/pending.h"
#include "socket/socket.h"
#include "stats/publish.h"
#include "stats/stats.h"
#include "transport/setup.h"

extern char* program_invocation_short_name;

namespace rsock {
namespace {

enum InitState : int { kNotStarted = 0, kRunning = 1, kReady = 2, kDisabled = 3 };
std::atomic<int> g_state{kNotStarted};
std::atomic<pthread_t> g_init_thread{};
Runtime* g_runtime = nullptr;  // never freed: wrappers may run during exit

// Reads the rule file whole. Only a regular file of at most
// kMaxConfFileBytes: the open does not block and a FIFO or a device is
// refused, so that RSOCK_CONF cannot hang the program in our constructor.
// Returns false with *why set to what completes "cannot read <path>: ...".
bool read_conf_file(const char* path, std::string* out, const char** why) {
  int fd = ::open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    *why = strerrordesc_np(errno);
    return false;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    *why = "not a regular file";
    real().close(fd);
    return false;
  }
  char buf[4096];
  for (;;) {
    ssize_t n = real().read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n < 0) *why = strerrordesc_np(errno);
      real().close(fd);
      return n == 0;
    }
    out->append(buf, static_cast<size_t>(n));
    if (out->size() > kMaxConfFileBytes) {  // a rule file is small; refuse anything huge
      *why = "larger than 1 MiB";
      real().close(fd);
      return false;
    }
  }
}

std::atomic<int> g_pid{0};  // this process's pid, as of init or its fork
std::atomic<uint64_t> g_children{0};

// The child will hold every open connection too. It is counted before the
// fork, in the parent: counted in the child, a parent that closes its copy
// right after fork() (fork per connection) could be seen as the last holder
// first and tell the peer the connection closed.
void before_fork() {
  count_child();
  fresh_tcp().clear_all();  // both processes hold those sockets now
  pending_fork_prepare();
  transports_fork_prepare();
  for (const FdRef& c : connection_refs()) {
    Stream& s = c.as<ConnectionState>()->stream();
    s.channel().add_holder();
    s.quiesce();  // an operation that began before the count ends before the fork
  }
  transports_fork_prepare_last();
  publish_fork_prepare();
}

void after_fork_parent() {
  publish_after_fork_parent();
  transports_after_fork_parent_first();
  transports_after_fork_parent();
  pending_after_fork_parent();
}

void after_fork_child() {
  // First: until then this process writes its parent's rsockstat file.
  publish_after_fork_child();
  fd_table().after_fork_child();
  g_pid.store(static_cast<int>(getpid()), std::memory_order_relaxed);
  // The parent's sleepers are not here (socket/wake_hub.h).
  fd_table().for_each([](int, FdState* s) {
    if (s->kind() == FdState::Kind::kConnection)
      static_cast<ConnectionState*>(s)->wake.after_fork_child();
  });
  // The child reports only what it does itself, and holds its inherited
  // connections alongside its parent.
  stats_reset();
  // Inherited rdma_cm listeners and devices stay the parent's.
  transports_after_fork_child();
  fd_table().for_each([](int, FdState* s) {
    if (s->kind() != FdState::Kind::kListener) return;
    static_cast<ListenerState*>(s)->setup().forked_child();
  });
  pending_after_fork_child();
  epoll_after_fork_child();
  interruptible_after_fork_child();
  wakers_after_fork_child();
  sleep_tokens_after_fork_child();
  // The connections' carriers stay the parent's (an RDMA queue pair): the
  // first use here takes one over (Channel::after_fork_child).
  for (const FdRef& r : connection_refs()) {
    if (!r.as<ConnectionState>()->stream().after_fork_child()) continue;
    stats_reset_connection(
        Reset::kHeldAtFork, kLogWarn,
        "fork: an inherited accelerated connection is reset in the child: its parent holds "
        "bytes of it that the program has not read yet");
  }
}

void init() {
  const int saved_errno = errno;
  const char* disable = getenv("RSOCK_DISABLE");
  if (disable && strcmp(disable, "1") == 0) {
    // Pure passthrough: not even the configuration is looked at. A hand-off
    // from the image before exec is dropped, so that no later image takes
    // over connections this one used as plain sockets.
    unsetenv(kHandoffVar);
    g_state.store(kDisabled, std::memory_order_release);
    errno = saved_errno;
    return;
  }
  g_pid.store(static_cast<int>(getpid()), std::memory_order_relaxed);
  auto* rt = new Runtime();
  std::vector<ConfigError> errors;
  const char* conf_path = getenv("RSOCK_CONF");
  std::string conf_text;
  const char* conf_why = nullptr;
  bool have_conf = conf_path && *conf_path && read_conf_file(conf_path, &conf_text, &conf_why);
  rt->config = parse_config(
      [](const char* name) -> const char* { return getenv(name); },
      (conf_path && *conf_path) ? (have_conf ? &conf_text : nullptr) : nullptr, &errors, conf_why);
  const char* prog = program_invocation_short_name ? program_invocation_short_name : "";
  strncpy(rt->program, prog, sizeof rt->program - 1);
  g_log_level = rt->config.log_level;
  g_log_fd_is_stream = [](int fd) { return fd_table().has(fd); };
  log_open(rt->config.log_file.c_str());
  if (!errors.empty()) {
    // One clear line; the program runs on plain TCP.
    std::string line = errors.front().to_string();
    line += '\n';
    real().write(2, line.data(), line.size());
  }
  rt->accelerate = !rt->config.disabled && !rt->config.rules.empty();
  rt->stats = !rt->config.stats_path.empty();
  // Connections inherited through exec, before the program can touch them.
  // Once one is attached the wrappers must stay active, rules or not.
  const bool adopted = exec_adopt() > 0;
  if (!rt->accelerate && !rt->stats && !adopted) {
    g_runtime = rt;  // kept for spin settings; wrappers see "inactive"
    g_state.store(kDisabled, std::memory_order_release);
    errno = saved_errno;
    return;
  }
  g_runtime = rt;
  pthread_atfork(before_fork, after_fork_parent, after_fork_child);
  // So that a peer can give back an idle ring's pages while our sends stay
  // free of locked instructions (common/barrier.h); without it our sends
  // fence for real.
  barrier_register();
  g_state.store(kReady, std::memory_order_release);
  LOG_INFO("active: %zu rule(s), ring %zu bytes, spin %u us", rt->config.rules.size(),
           rt->config.ring_bytes, rt->config.spin_us);
  errno = saved_errno;
}

__attribute__((constructor)) void rsock_constructor() {
  resolve_real_calls();
  runtime();
}

__attribute__((destructor)) void rsock_destructor() {
  // Before the stats line: what the connections do as they are let go (a
  // move that fails, say) is this process's to report.
  release_at_exit();
  flush_stats();
  publish_at_exit();
}

}  // namespace

uint64_t children_made() { return g_children.load(std::memory_order_acquire); }
void count_child() { g_children.fetch_add(1, std::memory_order_acq_rel); }

std::vector<FdRef> connection_refs() {
  std::vector<FdRef> conns;
  fd_table().for_each_ref([&](int, FdRef& r) {
    // An fd may use its pairing's outcome before the table hands it over
    // (pending_settle).
    if (r.get()->kind() == FdState::Kind::kPending && r.as<PendingState>()->resolved())
      r = r.as<PendingState>()->outcome();
    if (!r || r.get()->kind() != FdState::Kind::kConnection) return;
    conns.push_back(std::move(r));
  });
  // Once each: dup'd fds share a connection. Sorted, not searched, so that
  // a fork with 10,000 connections open does not compare 50 million pairs.
  auto by_state = [](const FdRef& a, const FdRef& b) { return a.get() < b.get(); };
  std::sort(conns.begin(), conns.end(), by_state);
  conns.erase(std::unique(conns.begin(), conns.end(),
                          [](const FdRef& a, const FdRef& b) { return a.get() == b.get(); }),
              conns.end());
  return conns;
}

bool in_vfork_child() {
  const int pid = g_pid.load(std::memory_order_relaxed);
  return pid != 0 && pid != static_cast<int>(getpid());
}

const Runtime* runtime() {
  int s = g_state.load(std::memory_order_acquire);
  if (__builtin_expect(s == kReady, 1)) return g_runtime;
  if (s == kDisabled) return nullptr;
  if (s == kNotStarted) {
    int expected = kNotStarted;
    if (g_state.compare_exchange_strong(expected, kRunning)) {
      g_init_thread.store(pthread_self());
      init();
      return runtime();
    }
  }
  // Initialising: a recursive call from our own init goes to libc; another
  // thread waits for the (short) init to finish.
  if (pthread_equal(g_init_thread.load(), pthread_self())) return nullptr;
  while (g_state.load(std::memory_order_acquire) == kRunning) sched_yield();
  return runtime();
}

void release_at_exit() {
  if (g_state.load(std::memory_order_acquire) != kReady || in_vfork_child()) return;
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;  // exit handlers and an explicit _exit
  // Each through a reference: other threads may still run and close one.
  // Shared memory: the holder is dropped, the last one tells the peer. RDMA
  // the same, and then the queue pair, which dies with this process, first
  // delivers what was posted; an owner that other processes still hold
  // hands the end to them (Channel::at_exit).
  pending_finish_at_exit();
  for (const FdRef& r : connection_refs()) r.as<ConnectionState>()->stream().release_at_exit();
  pending_count_at_exit();
  transports_at_exit();
}

void flush_stats(FlushAt when) {
  if (g_state.load(std::memory_order_acquire) != kReady || !g_runtime->stats) return;
  if (when == FlushAt::kExec && stats_connections(Path::kShm) + stats_connections(Path::kRdma) +
                                        stats_connections(Path::kTcp) ==
                                    0)
    return;
  // Written once per process image: exit handlers and an explicit _exit
  // may both get here.
  static std::atomic<bool> written{false};
  if (when == FlushAt::kExit && written.exchange(true)) return;
  uint64_t open_sent = 0, open_received = 0, before_sent = 0, before_received = 0;
  // Through references: at exit the pairing thread may still end a
  // pairing and free what the table held (a TSan report, 2026-12-05).
  const std::vector<FdRef> open = connection_refs();
  // A process that made no TCP socket, holds no connection and counted
  // nothing (a shell, a wrapper, a version manager's shims) has nothing to
  // say, unless the user asks for every process.
  if (open.empty() && !stats_anything() && !g_runtime->config.stats_all) return;
  for (const FdRef& r : open) {
    const Stream& s = r.as<ConnectionState>()->stream();
    open_sent += s.bytes_sent();
    open_received += s.bytes_received();
    before_sent += s.tcp_bytes_sent();
    before_received += s.tcp_bytes_received();
  }
  char line[2048];
  int n = stats_format(line, sizeof line, static_cast<int>(getpid()), g_runtime->program, open_sent,
                       open_received, before_sent, before_received);
  stats_append(g_runtime->config.stats_path.c_str(), line, n);
}

}  // namespace rsock
