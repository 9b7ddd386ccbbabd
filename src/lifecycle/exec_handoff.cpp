// Exec hand-off (see exec_handoff.h).
//
// The variable (docs/protocol.md section 8):
//   RSOCK_EXEC_HANDOFF=1:<mode>:<pid>[;<entry>]...
// mode "x": this process execs, <pid> is its pid (the new image checks
// getpid()); mode "s": posix_spawn, <pid> is the spawning parent's (the new
// image checks getppid()). A variable left over in some later process's
// environment therefore matches nothing. Entries, fields separated by ',':
//   S,<sdev>,<sino>,<memfd>,<mdev>,<mino>,<role>,<nonce>,<armed_data>,<armed_space>
//       a shared-memory connection inherited by the new image: the socket
//       (device and inode of its sockfs file), a non-close-on-exec dup of the
//       region memfd (its fd, device and inode), role s (server end) or c,
//       the region nonce in hex, and the waiting counts that threads of the
//       old image left armed (exec killed them);
//   C,<memfd>,<mdev>,<mino>,<role>,<nonce>
//       a connection whose fds all close at this exec and whose last holder
//       this process was: the new image tells the peer it closed;
//   R,<sdev>,<sino>,<memfd>,<mdev>,<mino>,<nonce>
//       an RDMA connection inherited by the new image: the socket, a
//       non-close-on-exec dup of the end's memfd (verbs_end.h: its fd,
//       device and inode) and the end's nonce in hex. The new image takes
//       the end over on first use, with a queue pair of its own;
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
#include "ring/ring.h"
#include "ring/wire.h"
#include "socket/pending.h"
#include "socket/socket.h"
#include "stats/stats.h"
#include "transport/lost/lost_channel.h"
#include "transport/shm/shm_channel.h"
#include "transport/verbs/verbs_channel.h"
#include "transport/verbs/verbs_end.h"

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

ShmChannel* shm_of(ConnectionState* c) {
  Channel& ch = c->stream().channel();
  return strcmp(ch.name(), "shm") == 0 ? static_cast<ShmChannel*>(&ch) : nullptr;
}

VerbsChannel* verbs_of(ConnectionState* c) {
  Channel& ch = c->stream().channel();
  return strcmp(ch.name(), "rdma") == 0 ? static_cast<VerbsChannel*>(&ch) : nullptr;
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

}  // namespace

void exec_prepare(char* const envp[], ExecKind kind, ExecHandoff* h) {
  // A vfork child that execs is a new process, like a spawned one, though
  // it runs in its parent's memory (our tables are the parent's).
  const bool vforked = kind == ExecKind::kReplace && in_vfork_child();
  if (vforked) kind = ExecKind::kSpawn;
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
  const size_t list_bytes = (sizeof(int) + 3 * sizeof(void*)) * (nheld + 16);
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
  h->counted = reinterpret_cast<void**>(static_cast<char*>(mem) + held_bytes + env_bytes);
  h->handed = h->counted + (nheld + 16);
  h->vcounted = h->handed + (nheld + 16);
  h->dups = reinterpret_cast<int*>(h->vcounted + (nheld + 16));
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
  vb.add("1:%c:%d", kind == ExecKind::kReplace ? 'x' : 's',
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
    auto* c = s->kind() == FdState::Kind::kConnection ? static_cast<ConnectionState*>(s) : nullptr;
    ShmChannel* shm = c ? shm_of(c) : nullptr;
    if (VerbsChannel* v = c ? verbs_of(c) : nullptr) {
      // An RDMA end: its queue pair stays with this process (spawn) or
      // dies with this image (exec), which first hands it over.
      if (kind == ExecKind::kReplace) {
        v->prepare_exec();
        h->handed[h->nhanded++] = v;
      }
      if (!inherited) {
        // Its fds close at exec: this process stops holding it (the peer
        // learns of the close from the kernel socket).
        if (kind == ExecKind::kReplace) {
          v->undo_add_holder();
          h->vcounted[h->nvcounted++] = v;
        }
        continue;
      }
      const int dup = v->memfd() >= 0 ? dup_high(v->memfd(), false) : -1;
      struct stat mst;
      const size_t mark = vb.len;
      bool ok = false;
      if (dup >= 0 && fstat(dup, &mst) == 0) {
        ok = vb.add(";R,%" PRIu64 ",%" PRIu64 ",%d,%" PRIu64 ",%" PRIu64 ",%" PRIx64, sdev, sino,
                    dup, static_cast<uint64_t>(mst.st_dev), static_cast<uint64_t>(mst.st_ino),
                    v->nonce());
      } else {
        ok = vb.add(";L,%" PRIu64 ",%" PRIu64 ",resources", sdev, sino);
      }
      if (!ok) {
        vb.len = mark;
        var[kPrefixLen + mark] = '\0';
        if (dup >= 0) real().close(dup);
        ++undescribed;
        continue;
      }
      if (dup >= 0) h->dups[h->ndups++] = dup;
      // The spawned child holds the end from the moment it runs.
      if (kind == ExecKind::kSpawn) {
        v->add_holder();
        h->vcounted[h->nvcounted++] = v;
      }
      continue;
    }
    if (!inherited) {
      // Every fd of this connection closes at exec: this process stops
      // holding it. Another holder left: only the count changes (taken back
      // if the exec fails). We were the last: the new image says goodbye.
      if (kind != ExecKind::kReplace || !shm) continue;
      if (shm->drop_holder_unless_last()) {
        h->counted[h->ncounted++] = shm;
        continue;
      }
      int dup = shm->memfd() >= 0 ? dup_high(shm->memfd(), false) : -1;
      uint64_t mdev = 0, mino = 0;
      struct stat st;
      if (dup < 0 || fstat(dup, &st) != 0) {
        if (dup >= 0) real().close(dup);
        continue;  // the peer learns of the close from the TCP connection
      }
      mdev = st.st_dev;
      mino = st.st_ino;
      const size_t mark = vb.len;
      if (!vb.add(";C,%d,%" PRIu64 ",%" PRIu64 ",%c,%" PRIx64, dup, mdev, mino,
                  shm->is_server() ? 's' : 'c', shm->nonce())) {
        vb.len = mark;
        var[kPrefixLen + mark] = '\0';
        real().close(dup);
        continue;
      }
      h->dups[h->ndups++] = dup;
      continue;
    }
    const char* lost = nullptr;
    int dup = -1;
    struct stat st;
    if (!c) {
      lost = "pairing";
    } else if (!shm) {
      lost = "resources";
    } else if (shm->memfd() < 0 || (dup = dup_high(shm->memfd(), false)) < 0 ||
               fstat(dup, &st) != 0) {
      lost = "resources";
    }
    const size_t mark = vb.len;
    bool ok;
    if (lost) {
      ok = vb.add(";L,%" PRIu64 ",%" PRIu64 ",%s", sdev, sino, lost);
    } else {
      // Every byte read so far is reported consumed: the new image starts
      // reading exactly after it.
      c->stream().report_consumed();
      uint32_t armed_data = 0, armed_space = 0;
      if (kind == ExecKind::kReplace) shm->local_armed(&armed_data, &armed_space);
      // The spawned child holds the connection from the moment it runs,
      // which may be before it takes it over (this process could close its
      // own copy meanwhile): count it now.
      if (kind == ExecKind::kSpawn) {
        shm->add_holder();
        c->stream().quiesce();
        h->counted[h->ncounted++] = shm;
      }
      ok =
          vb.add(";S,%" PRIu64 ",%" PRIu64 ",%d,%" PRIu64 ",%" PRIu64 ",%c,%" PRIx64 ",%u,%u", sdev,
                 sino, dup, static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                 shm->is_server() ? 's' : 'c', shm->nonce(), armed_data, armed_space);
    }
    if (!ok) {
      vb.len = mark;
      var[kPrefixLen + mark] = '\0';
      if (dup >= 0) real().close(dup);
      ++undescribed;
      continue;
    }
    if (dup >= 0) h->dups[h->ndups++] = dup;
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
  if (!started) {
    // RDMA ends: this image takes back what it handed over (on its next
    // use, with a queue pair of its own), and the holder counts go back.
    for (int i = 0; i < h->nhanded; ++i) static_cast<VerbsChannel*>(h->handed[i])->exec_failed();
    for (int i = 0; i < h->nvcounted; ++i) {
      auto* v = static_cast<VerbsChannel*>(h->vcounted[i]);
      if (h->kind == ExecKind::kReplace)
        v->add_holder();
      else
        v->undo_add_holder();
    }
    for (int i = 0; i < h->ncounted; ++i) {
      auto* shm = static_cast<ShmChannel*>(h->counted[i]);
      // The exec failed: this image still holds what it let go. The spawn
      // failed: no child holds what it was counted for.
      if (h->kind == ExecKind::kReplace)
        shm->add_holder();
      else
        (void)shm->drop_holder_unless_last();
    }
  }
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

bool parse_u64(const char* s, int base, uint64_t* out) {
  if (!s || !*s) return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(s, &end, base);
  if (errno != 0 || *end != '\0' || *s == '-') return false;
  *out = v;
  return true;
}

bool parse_fd(const char* s, int* fd) {
  uint64_t v;
  if (!parse_u64(s, 10, &v) || v >= static_cast<uint64_t>(FdTable::kMaxFd)) return false;
  *fd = static_cast<int>(v);
  return true;
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

// The memfd named by an entry, if that fd really is the file the old image
// dup'd (same device and inode); -1 otherwise (then it is not ours to touch).
int owned_memfd(const char* fd_s, const char* dev_s, const char* ino_s) {
  int fd;
  uint64_t dev, ino;
  struct stat st;
  if (!parse_fd(fd_s, &fd) || !parse_u64(dev_s, 10, &dev) || !parse_u64(ino_s, 10, &ino) ||
      fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_dev != dev || st.st_ino != ino)
    return -1;
  return fd;
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
  stats_reset_connection(Reset::kLostAtExec);
  LOG_WARN(
      "fd %d: accelerated connection inherited through exec cannot be used in this "
      "program (%s); every call on it fails with ECONNRESET",
      fds[0], why);
  return static_cast<int>(fds.size());
}

void release_holder(int memfd, bool is_server, const char* nonce_s);

int adopt_shm(char** f, const std::vector<int>& fds, bool spawned) {
  // f: S,sdev,sino,memfd,mdev,mino,role,nonce,armed_data,armed_space
  int memfd = owned_memfd(f[3], f[4], f[5]);
  uint64_t nonce = 0, armed_data = 0, armed_space = 0;
  const bool roles_ok = (f[6][0] == 's' || f[6][0] == 'c') && f[6][1] == '\0';
  const bool is_server = f[6][0] == 's';
  if (fds.empty()) {
    // The socket did not reach this image (posix_spawn file actions closed
    // it, or exec raced a close): this process does not hold it.
    if (memfd >= 0) release_holder(memfd, roles_ok && is_server, f[7]);
    return 0;
  }
  if (memfd < 0 || !roles_ok || !parse_u64(f[7], 16, &nonce) || !parse_u64(f[8], 10, &armed_data) ||
      !parse_u64(f[9], 10, &armed_space) || armed_data > UINT32_MAX || armed_space > UINT32_MAX) {
    if (memfd >= 0) real().close(memfd);
    return attach_lost(fds, Path::kShm, "its hand-off entry is invalid");
  }
  void* map = nullptr;
  size_t map_len = 0;
  int rc = shm_region_validate(memfd, fds[0], is_server, nonce, &map, &map_len);
  int doorbell = rc == 0 ? dup_high(fds[0]) : -1;
  if (rc != 0 || doorbell < 0) {
    if (map) munmap(map, map_len);
    real().close(memfd);
    return attach_lost(fds, Path::kShm,
                       rc != 0 ? "its shared region failed validation" : "no fd for the doorbell");
  }
  real().fcntl(memfd, F_SETFD, FD_CLOEXEC);
  auto ch =
      std::make_unique<ShmChannel>(ShmChannel::Resume{}, map, map_len, is_server, doorbell, memfd);
  ShmChannel* shm = ch.get();
  const ShmPositions pos = shm->positions();
  // A spawned child was counted as a holder by its parent; an exec'd image
  // inherits its old image's count, and the waiters its threads left.
  if (!spawned)
    shm->forget_waiters(static_cast<uint32_t>(armed_data), static_cast<uint32_t>(armed_space));
  auto* c = new ConnectionState(std::move(ch), Path::kShm, fds[0]);
  if (!c->stream().resume(pos.tx_head, pos.tx_credited, pos.rx_granted, pos.fin_sent)) {
    c->unref();
    return attach_lost(fds, Path::kShm, "its shared region holds impossible positions");
  }
  connection_options_from(fds[0], c);
  stats_connection(Path::kShm);
  attach_to(fds, c);
  LOG_INFO("fd %d: accelerated connection (shm) taken over after exec", fds[0]);
  return static_cast<int>(fds.size());
}

// This process no longer holds a connection it was counted for: drop it
// as a holder and, when it was the last, tell the peer (as close() would).
// Closes memfd.
void release_holder(int memfd, bool is_server, const char* nonce_s) {
  uint64_t nonce = 0;
  RegionHeader h;
  void* map = nullptr;
  if (parse_u64(nonce_s, 16, &nonce) &&
      pread(memfd, &h, sizeof h, 0) == static_cast<ssize_t>(sizeof h) &&
      is_power_of_two(h.ring_bytes) && h.ring_bytes >= 4096 && h.ring_bytes <= (size_t{1} << 28) &&
      shm_region_attach(memfd, region_bytes_for(h.ring_bytes), nonce, h.ring_bytes, &map) == 0) {
    ShmChannel ch(ShmChannel::Resume{}, map, region_bytes_for(h.ring_bytes), is_server, -1, -1);
    if (ch.drop_holder()) ch.signal(kSendClosed);
  }  // the channel unmaps the region
  real().close(memfd);
}

// An RDMA end (R entry): the new image holds it and takes it over with a
// queue pair of its own on first use (VerbsChannel::adopt).
int adopt_rdma(char** f, const std::vector<int>& fds, bool spawned) {
  // f: R,sdev,sino,memfd,mdev,mino,nonce
  const int memfd = owned_memfd(f[3], f[4], f[5]);
  uint64_t nonce = 0;
  if (fds.empty()) {
    // The socket did not reach this image: the parent counted a holder
    // that never was.
    if (memfd >= 0 && spawned && parse_u64(f[6], 16, &nonce)) verbs_end_drop_holder(memfd, nonce);
    if (memfd >= 0) real().close(memfd);
    return 0;
  }
  VerbsEnd end;
  if (memfd < 0 || !parse_u64(f[6], 16, &nonce) ||
      VerbsEnd::validate(memfd, fds[0], nonce, &end) != 0) {
    if (memfd >= 0) real().close(memfd);
    return attach_lost(fds, Path::kRdma, "its RDMA end failed validation");
  }
  int err = 0;
  std::unique_ptr<VerbsChannel> ch = VerbsChannel::adopt(std::move(end), fds[0], &err);
  if (!ch) return attach_lost(fds, Path::kRdma, "no descriptors to take its RDMA end over");
  auto* c = new ConnectionState(std::move(ch), Path::kRdma, fds[0]);
  connection_options_from(fds[0], c);
  attach_to(fds, c);
  LOG_INFO("fd %d: RDMA connection inherited through exec: taken over on first use", fds[0]);
  return static_cast<int>(fds.size());
}

// A connection the old image was the last holder of, and which it closed by
// exec.
void say_goodbye(char** f) {
  // f: C,memfd,mdev,mino,role,nonce
  int memfd = owned_memfd(f[1], f[2], f[3]);
  if (memfd < 0) return;
  if ((f[4][0] != 's' && f[4][0] != 'c') || f[4][1] != '\0') {
    real().close(memfd);
    return;
  }
  release_holder(memfd, f[4][0] == 's', f[5]);
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
  if (n < 1 || split(entries[0], ':', head, 3) != 3 || strcmp(head[0], "1") != 0 ||
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
    char* f[10];
    int nf = split(entries[i], ',', f, 10);
    if (nf == 10 && strcmp(f[0], "S") == 0) {
      attached += adopt_shm(f, fds_of(f[1], f[2]), spawned);
    } else if (nf == 7 && strcmp(f[0], "R") == 0) {
      attached += adopt_rdma(f, fds_of(f[1], f[2]), spawned);
    } else if (nf == 6 && strcmp(f[0], "C") == 0 && !spawned) {
      say_goodbye(f);
    } else if (nf == 4 && strcmp(f[0], "L") == 0) {
      const bool rdma = strcmp(f[3], "rdma") == 0;
      attached +=
          attach_lost(fds_of(f[1], f[2]), rdma ? Path::kRdma : Path::kShm,
                      rdma                           ? "an RDMA queue pair cannot cross exec"
                      : strcmp(f[3], "pairing") == 0 ? "its pairing was still running at exec"
                                                     : "the old image could not hand it over");
    } else {
      LOG_WARN("%s: ignored a malformed entry", kHandoffVar);
    }
  }
  return attached;
}

}  // namespace rsock
