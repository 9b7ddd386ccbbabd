// Exec hand-off (see exec_handoff.h).
//
// The variable (docs/protocol.md section 8):
//   RSOCK_EXEC_HANDOFF=2:<mode>:<pid>[;<entry>]...
// mode "x": this process execs, <pid> is its pid (the new image checks
// getpid()); mode "s": posix_spawn, <pid> is the spawning parent's (the new
// image checks getppid()). A variable left over in some later process's
// environment therefore matches nothing. Entries, fields separated by ',',
// each a tag and its fields; most continue with the socket's identity
// (<sdev>,<sino>: device and inode of its sockfs file). The transports'
// entries are theirs (transport/handoff.h: S and C for shared memory, R for
// RDMA); this file writes one more itself:
//   L,<sdev>,<sino>,<why>
//       a connection that cannot cross exec (why: pairing, resources):
//       calls on its fd fail in the new image.
// The new image finds the fds by the socket's identity, not by number
// (posix_spawn file actions may have moved them).
#include "lifecycle/exec_handoff.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/own_fd.h"
#include "common/real.h"
#include "fdtable/fdtable.h"
#include "lifecycle/runtime.h"
#include "socket/pending.h"
#include "socket/socket.h"
#include "stats/stats.h"
#include "transport/handoff.h"
#include "transport/lost/lost_channel.h"
#include "transport/setup.h"
#include "transport/socket_number.h"

extern char** environ;

namespace rsock {
namespace {

// The variable's value is at most this long (the kernel's limit for one
// environment string is 128 KiB); connections beyond it are not described,
// and a warning says so.
constexpr size_t kVarCap = 120 * 1024;
constexpr size_t kPrefixLen = sizeof kHandoffVar;  // "RSOCK_EXEC_HANDOFF="

struct Held {
  int fd;
  FdState* state;
  bool inherited;  // not close-on-exec
};

bool is_handoff_entry(const char* kv) {
  return strncmp(kv, kHandoffVar, kPrefixLen - 1) == 0 && kv[kPrefixLen - 1] == '=';
}

bool socket_id(int fd, uint64_t* dev, uint64_t* ino) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  *dev = st.st_dev;
  *ino = st.st_ino;
  return true;
}

// Appends printf output to the variable being built; false when full.
struct VarBuilder {
  char* buf;
  size_t cap;
  size_t len = 0;
  bool add(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
    if (n < 0 || static_cast<size_t>(n) >= cap - len) {
      buf[len] = '\0';
      return false;
    }
    len += static_cast<size_t>(n);
    return true;
  }
};

// What one connection's end writes (Channel::exec_prepare).
class Sink final : public ExecSink {
 public:
  Sink(VarBuilder& vb, ExecHandoff* h, uint64_t sdev, uint64_t sino)
      : vb_(vb), h_(h), sdev_(sdev), sino_(sino) {}
  Stream* stream = nullptr;
  Channel* channel = nullptr;
  int undescribed = 0;  // entries with a socket that did not fit

  bool add(char tag, bool with_socket, const char* fields) override {
    // (a failed add leaves the variable as it was)
    const bool ok = with_socket
                        ? vb_.add(";%c,%" PRIu64 ",%" PRIu64 ",%s", tag, sdev_, sino_, fields)
                        : vb_.add(";%c,%s", tag, fields);
    if (!ok && with_socket) ++undescribed;
    return ok;
  }
  void keep(int fd) override { h_->dups[h_->ndups++] = fd; }
  void undo_later(uint32_t token) override { h_->undo[h_->nundo++] = {channel, token}; }
  void report_consumed() override {
    if (stream) stream->report_consumed();
  }
  void quiesce() override {
    if (stream) stream->quiesce();
  }

 private:
  VarBuilder& vb_;
  ExecHandoff* h_;
  const uint64_t sdev_, sino_;
};

}  // namespace

void exec_prepare(char* const envp[], ExecKind kind, ExecHandoff* h) {
  // A vfork child that execs is a new process, like a spawned one, though
  // it runs in its parent's memory (our tables are the parent's).
  const bool vforked = kind == ExecKind::kReplace && in_vfork_child();
  if (vforked) kind = ExecKind::kSpawn;
  if (kind == ExecKind::kSpawn) count_child();  // the new process may keep our sockets
  if (kind == ExecKind::kReplace) transports_before_exec();
  *h = ExecHandoff{};
  h->kind = kind;
  h->envp = envp;
  // A pairing still running in the background dies with this image: let it
  // finish first (bounded, as for fork).
  bool pending = false;
  fd_table().for_each([&](int, FdState* s) { pending |= s->kind() == FdState::Kind::kPending; });
  if (pending) {
    pending_before_fork();
    std::vector<int> fds;
    fd_table().for_each([&](int fd, FdState* s) {
      if (s->kind() == FdState::Kind::kPending) fds.push_back(fd);
    });
    for (int fd : fds) pending_settle(fd, fd_table().get(fd));
  }

  // Every fd of a connection (or a pairing that did not finish), with its
  // close-on-exec flag. The references keep the states alive meanwhile.
  int nheld = 0;
  fd_table().for_each([&](int, FdState* s) {
    nheld += s->kind() == FdState::Kind::kConnection || s->kind() == FdState::Kind::kPending;
  });
  if (nheld == 0) return;
  size_t nenv = 0;
  for (char* const* e = envp; e && *e; ++e) ++nenv;
  // One mapping holds everything (no malloc: this may be a vfork child).
  const size_t held_bytes = sizeof(Held) * (nheld + 16);
  const size_t env_bytes = sizeof(char*) * (nenv + 2);
  // Per connection at most one descriptor and two undo steps.
  const size_t list_bytes = (sizeof(int) + 2 * sizeof(ExecHandoff::Undo)) * (nheld + 16);
  const size_t len = held_bytes + env_bytes + list_bytes + kVarCap + kPrefixLen + 64;
  void* mem = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    LOG_WARN("exec: no memory to hand accelerated connections over; they fail in the new image");
    return;
  }
  h->mem = mem;
  h->mem_len = len;
  auto* held = static_cast<Held*>(mem);
  auto* new_env = reinterpret_cast<char**>(static_cast<char*>(mem) + held_bytes);
  // The pointers before the ints: both sizes above are multiples of 8, so
  // each array is aligned for its type (ints first would misalign the
  // pointers whenever nheld is odd).
  h->undo = reinterpret_cast<ExecHandoff::Undo*>(static_cast<char*>(mem) + held_bytes + env_bytes);
  h->dups = reinterpret_cast<int*>(h->undo + 2 * (nheld + 16));
  char* var = reinterpret_cast<char*>(h->dups) + sizeof(int) * (nheld + 16);

  // The fds first, then a counted reference to each one's state (taken
  // under the table's slot lock: another thread may close meanwhile).
  int nfds = 0;
  fd_table().for_each([&](int fd, FdState* s) {
    if (nfds < nheld + 16 &&
        (s->kind() == FdState::Kind::kConnection || s->kind() == FdState::Kind::kPending))
      held[nfds++].fd = fd;
  });
  int n = 0;
  for (int i = 0; i < nfds; ++i) {
    const int fd = held[i].fd;
    FdRef r = fd_table().get(fd);
    const int fl = real().fcntl(fd, F_GETFD);
    if (!r || fl < 0) continue;  // closed meanwhile
    if (r.get()->kind() != FdState::Kind::kConnection && r.get()->kind() != FdState::Kind::kPending)
      continue;
    r.get()->ref();  // released at the end of exec_prepare
    held[n++] = {fd, r.get(), (fl & FD_CLOEXEC) == 0};
  }

  memcpy(var, kHandoffVar, kPrefixLen - 1);
  var[kPrefixLen - 1] = '=';
  VarBuilder vb{var + kPrefixLen, kVarCap};
  // Mode and the pid the new image checks: its own (exec), or its parent's.
  vb.add("2:%c:%d", kind == ExecKind::kReplace ? 'x' : 's',
         static_cast<int>(vforked ? getppid() : getpid()));
  const size_t header_len = vb.len;
  int undescribed = 0;

  for (int i = 0; i < n; ++i) {
    FdState* s = held[i].state;
    bool seen = false, inherited = false;
    for (int j = 0; j < n; ++j) {
      if (held[j].state != s) continue;
      if (j < i) seen = true;
      inherited |= held[j].inherited;
    }
    if (seen) continue;  // one entry per connection, whatever its dups
    uint64_t sdev = 0, sino = 0;
    if (!socket_id(held[i].fd, &sdev, &sino)) continue;
    Sink sink(vb, h, sdev, sino);
    if (s->kind() == FdState::Kind::kConnection) {
      auto* c = static_cast<ConnectionState*>(s);
      sink.stream = &c->stream();
      sink.channel = &c->stream().channel();
      if (inherited && c->stream().holds_unread())  // Stream::relieve
        (void)sink.add('L', true, strcmp(sink.channel->name(), "rdma") == 0 ? "held_rdma" : "held");
      else
        sink.channel->exec_prepare(kind, inherited, sink);
    } else if (inherited) {
      (void)sink.add('L', true, "pairing");
    }
    undescribed += sink.undescribed;
  }
  for (int i = 0; i < n; ++i) held[i].state->unref();
  if (undescribed)
    LOG_WARN(
        "exec: %d inherited accelerated connection(s) do not fit in %s; the new image "
        "does not know them",
        undescribed, kHandoffVar);

  // The new environment: the caller's, minus any stale hand-off, plus ours.
  size_t k = 0;
  for (char* const* e = envp; e && *e; ++e)
    if (!is_handoff_entry(*e)) new_env[k++] = *e;
  if (vb.len > header_len) new_env[k++] = var;
  new_env[k] = nullptr;
  h->envp = new_env;
}

void exec_release(ExecHandoff* h, bool started) {
  const int saved = errno;
  for (int i = 0; i < h->ndups; ++i) real().close(h->dups[i]);
  if (!started)
    for (int i = 0; i < h->nundo; ++i) h->undo[i].channel->exec_undo(h->kind, h->undo[i].token);
  if (h->mem) munmap(h->mem, h->mem_len);
  *h = ExecHandoff{};
  errno = saved;
}

// ---- the new image ----------------------------------------------------------

namespace {

struct SocketFd {
  int fd;
  uint64_t dev, ino;
};

// Every socket fd of this process (by /proc/self/fd, else by probing).
std::vector<SocketFd> socket_fds() {
  std::vector<SocketFd> out;
  auto probe = [&](int fd) {
    uint64_t dev, ino;
    if (socket_id(fd, &dev, &ino)) out.push_back({fd, dev, ino});
  };
  if (DIR* d = opendir("/proc/self/fd")) {
    const int self = dirfd(d);
    while (dirent* e = readdir(d)) {
      char* end = nullptr;
      long fd = strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0' || fd == self || fd < 0 || fd >= FdTable::kMaxFd)
        continue;
      probe(static_cast<int>(fd));
    }
    closedir(d);
    return out;
  }
  for (int fd = 0; fd < 4096; ++fd) probe(fd);
  return out;
}

// Splits s in place at sep into at most max fields; returns the count.
int split(char* s, char sep, char** out, int max) {
  int n = 0;
  while (s && n < max) {
    out[n++] = s;
    char* p = strchr(s, sep);
    if (!p) break;
    *p = '\0';
    s = p + 1;
  }
  return n;
}

void attach_to(const std::vector<int>& fds, ConnectionState* c) {
  for (int fd : fds) fd_table().set(fd, c);
  c->unref();  // the table holds it
}

// Calls on these fds fail from now on (see lost_channel.h).
int attach_lost(const std::vector<int>& fds, Path path, const char* why) {
  if (fds.empty()) return 0;
  int wait_fd = dup_high(fds[0]);
  auto* c = new ConnectionState(std::make_unique<LostChannel>(wait_fd), path, fds[0]);
  connection_options_from(fds[0], c);
  attach_to(fds, c);
  stats_reset_connection(Reset::kLostAtExec, kLogWarn,
                         "fd %d: accelerated connection inherited through exec cannot be used "
                         "in this program (%s); every call on it fails with ECONNRESET",
                         fds[0], why);
  return static_cast<int>(fds.size());
}

// The end an entry's transport took over, on the socket's fds in this image.
int attach_adopted(const std::vector<int>& fds, Adoption& a) {
  if (fds.empty()) return 0;  // (the transport released what was counted for them)
  if (a.lost || !a.channel)
    return attach_lost(fds, a.path, a.lost ? a.lost : "the old image could not hand it over");
  auto* c = new ConnectionState(std::move(a.channel), a.path, fds[0]);
  if (a.resume &&
      !c->stream().resume(a.at.tx_sent, a.at.tx_credited, a.at.rx_consumed, a.at.fin_sent)) {
    c->unref();
    return attach_lost(fds, a.path, "its shared state holds impossible positions");
  }
  connection_options_from(fds[0], c);
  c->published().describe(fds[0], fds[0], a.path == Path::kRdma, pub::kAccelerated);
  if (a.counted) stats_connection(a.path);
  // One descriptor per connection: a socket under one number here is
  // reached through it (no thread of this image knows it yet).
  if (SocketNumber* n = c->stream().channel().socket_number(); n && fds.size() == 1)
    (void)n->use(fds[0]);
  attach_to(fds, c);
  LOG_INFO("fd %d: %s", fds[0], a.how);
  return static_cast<int>(fds.size());
}

}  // namespace

int exec_adopt() {
  const char* v = getenv(kHandoffVar);
  if (!v) return 0;
  std::string value(v, strnlen(v, kVarCap + 64));
  unsetenv(kHandoffVar);
  if (getauxval(AT_SECURE)) {
    LOG_WARN("%s ignored in a privileged (secure-mode) program", kHandoffVar);
    return 0;
  }
  std::vector<char> buf(value.begin(), value.end());
  buf.push_back('\0');
  std::vector<char*> entries(4096);
  int n = split(buf.data(), ';', entries.data(), static_cast<int>(entries.size()));
  char* head[3];
  uint64_t pid = 0;
  if (n < 1 || split(entries[0], ':', head, 3) != 3 || strcmp(head[0], "2") != 0 ||
      (strcmp(head[1], "x") != 0 && strcmp(head[1], "s") != 0) || !parse_u64(head[2], 10, &pid)) {
    LOG_WARN("%s ignored: not a hand-off this version understands", kHandoffVar);
    return 0;
  }
  const bool spawned = head[1][0] == 's';
  const uint64_t expect =
      spawned ? static_cast<uint64_t>(getppid()) : static_cast<uint64_t>(getpid());
  if (pid != expect) {
    // Left over from another process's exec: it describes nothing of ours.
    LOG_INFO("%s ignored: it was made for another process", kHandoffVar);
    return 0;
  }
  const std::vector<SocketFd> socks = socket_fds();
  auto fds_of = [&](const char* dev_s, const char* ino_s) {
    std::vector<int> out;
    uint64_t dev, ino;
    if (!parse_u64(dev_s, 10, &dev) || !parse_u64(ino_s, 10, &ino)) return out;
    for (const SocketFd& s : socks)
      if (s.dev == dev && s.ino == ino && !fd_table().has(s.fd)) out.push_back(s.fd);
    return out;
  };
  int attached = 0;
  for (int i = 1; i < n; ++i) {
    char* f[12];
    int nf = split(entries[i], ',', f, 12);
    if (nf == 4 && strcmp(f[0], "L") == 0) {
      const bool held = strcmp(f[3], "held") == 0 || strcmp(f[3], "held_rdma") == 0;
      const bool rdma = strcmp(f[3], "rdma") == 0 || strcmp(f[3], "held_rdma") == 0;
      attached +=
          attach_lost(fds_of(f[1], f[2]), rdma ? Path::kRdma : Path::kShm,
                      held   ? "the old image held bytes of it that the program had not read yet"
                      : rdma ? "an RDMA queue pair cannot cross exec"
                      : strcmp(f[3], "pairing") == 0 ? "its pairing was still running at exec"
                                                     : "the old image could not hand it over");
      continue;
    }
    const ExecEntryKind* k = exec_entry_kind(f[0], nf);
    if (!k || (spawned && !k->in_spawn)) {
      LOG_WARN("%s: ignored a malformed entry", kHandoffVar);
      continue;
    }
    Adoption a;
    const std::vector<int> fds = k->with_socket ? fds_of(f[1], f[2]) : std::vector<int>{};
    k->adopt(f, fds, spawned, &a);
    attached += attach_adopted(fds, a);
  }
  return attached;
}

}  // namespace rsock
