// The file rsockstat reads (see publish.h).
#include "stats/publish.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>

#include "common/log.h"
#include "common/real.h"
#include "config/config.h"
#include "lifecycle/runtime.h"
#include "stats/stats.h"

namespace rsock {
namespace {

using pub::Header;
using pub::Slot;

enum State : int { kUnknown, kMaking, kOn, kOff };
std::atomic<int> g_state{kUnknown};
std::atomic<Header*> g_header{nullptr};
char g_dir[512];  // <RSOCK_PUBLISH_DIR>/rsock-<uid>
char g_name[32];  // <pid>

// Each kind of reason code has its own part of the table.
constexpr int kCodeBase[] = {0, 0, 24, 40, pub::kCodes};  // by CodeKind, and the end
static_assert(static_cast<int>(Fallback::kCount) <= kCodeBase[2]);
static_assert(static_cast<int>(Reset::kCount) <= kCodeBase[3] - kCodeBase[2]);
static_assert(static_cast<int>(Reject::kCount) <= kCodeBase[4] - kCodeBase[3]);

void name_codes(Header* h) {
  auto put = [h](pub::CodeKind kind, int i, const char* name) {
    pub::Code& c = h->codes[kCodeBase[kind] + i];
    strncpy(c.name, name, sizeof c.name - 1);
    c.kind = kind;
  };
  for (int i = 0; i < static_cast<int>(Fallback::kCount); ++i)
    put(pub::kCodeFallback, i, fallback_name(static_cast<Fallback>(i)));
  for (int i = 0; i < static_cast<int>(Reset::kCount); ++i)
    put(pub::kCodeReset, i, reset_name(static_cast<Reset>(i)));
  for (int i = 0; i < static_cast<int>(Reject::kCount); ++i)
    put(pub::kCodeReject, i, reject_name(static_cast<Reject>(i)));
}

Slot* slots(Header* h) {
  return reinterpret_cast<Slot*>(reinterpret_cast<char*>(h) + pub::kSlotsOffset);
}

uint64_t start_ticks(int pid) {
  char path[64], text[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = real().read(fd, text, sizeof text - 1);
  real().close(fd);
  if (n <= 0) return 0;
  text[n] = '\0';
  uint64_t v = 0;
  return pub::parse_start_ticks(text, &v) ? v : 0;
}

// Says once per process why nothing is published: a warning, or only at
// level info when there is nowhere to publish (no /dev/shm in a container).
void refuse(const char* what, bool quiet = false) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  if (quiet)
    LOG_INFO("rsockstat: %s (%s); this process is not shown", what, strerror(errno));
  else
    LOG_WARN("rsockstat: %s (%s); this process is not shown", what, strerror(errno));
}

// The directory of this user's files: made if missing, and used only if it
// is a directory (not a link) that this user owns and nobody else may enter.
int open_dir(const char* base) {
  snprintf(g_dir, sizeof g_dir, "%s/rsock-%u", base, static_cast<unsigned>(geteuid()));
  if (mkdir(g_dir, 0700) != 0 && errno != EEXIST) {
    refuse("cannot make its directory", errno == ENOENT);
    return -1;
  }
  const int dfd = open(g_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  if (dfd < 0 || fstat(dfd, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    if (dfd >= 0) real().close(dfd);
    errno = EPERM;
    refuse("its directory is not private to this user");
    return -1;
  }
  return dfd;
}

// A new file named after this process, holding `copy` bytes of `from` (a
// fork's child: its parent's header and slots) or a fresh header, mapped at
// `at` (nullptr: anywhere). Returns the mapping, or nullptr.
Header* make_file(const Header* from, size_t copy, void* at) {
  const Runtime* rt = runtime();
  if (!rt) return nullptr;
  const int dfd = open_dir(rt->config.publish_dir.c_str());
  if (dfd < 0) return nullptr;
  const int pid = static_cast<int>(getpid());
  snprintf(g_name, sizeof g_name, "%d", pid);
  // An earlier image of this process (an exec), or a process that had
  // this pid and was killed.
  char exec_name[48];
  snprintf(exec_name, sizeof exec_name, "%s.exec", g_name);
  unlinkat(dfd, g_name, 0);
  unlinkat(dfd, exec_name, 0);
  const int fd = openat(dfd, g_name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  real().close(dfd);
  if (fd < 0) {
    refuse("cannot make its file");
    return nullptr;
  }
  bool ok = ftruncate(fd, static_cast<off_t>(pub::kFileBytes)) == 0;
  for (size_t done = 0; ok && done < copy;) {
    const ssize_t n = pwrite(fd, reinterpret_cast<const char*>(from) + done, copy - done,
                             static_cast<off_t>(done));
    if (n <= 0) ok = false;
    done += n > 0 ? static_cast<size_t>(n) : 0;
  }
  void* m = MAP_FAILED;
  if (ok)
    m = mmap(at, pub::kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED | (at ? MAP_FIXED : 0), fd, 0);
  real().close(fd);
  if (m == MAP_FAILED) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", g_dir, g_name);
    unlink(path);
    refuse("cannot map its file");
    return nullptr;
  }
  auto* h = static_cast<Header*>(m);
  h->pid = pid;
  h->start_ticks = start_ticks(pid);
  if (!from) {
    h->version = pub::kVersion;
    h->header_bytes = sizeof(Header);
    h->slot_bytes = sizeof(Slot);
    h->slot_count = pub::kSlots;
    h->uid = static_cast<uint32_t>(geteuid());
    memcpy(h->program, rt->program,
           std::min(sizeof h->program - 1, strnlen(rt->program, sizeof rt->program)));
    name_codes(h);
    std::atomic_thread_fence(std::memory_order_release);
    memcpy(h->magic, pub::kMagic, sizeof h->magic);
  }
  return h;
}

Header* header() { return g_header.load(std::memory_order_acquire); }

}  // namespace

void publish_begin() {
  if (g_state.load(std::memory_order_acquire) != kUnknown) return;
  int expected = kUnknown;
  if (!g_state.compare_exchange_strong(expected, kMaking)) return;  // another thread makes it
  const Runtime* rt = runtime();
  Header* h = rt && rt->config.publish ? make_file(nullptr, 0, nullptr) : nullptr;
  g_header.store(h, std::memory_order_release);
  g_state.store(h ? kOn : kOff, std::memory_order_release);
}

PublishedConn::PublishedConn() {
  publish_begin();
  Header* h = header();
  if (!h) return;
  Slot* s = slots(h);
  // Look from the hint (the slot freed or taken last) for a free one, a
  // bounded number of places; then take one never used.
  constexpr uint32_t kProbes = 64;
  const uint32_t high = h->high.load(std::memory_order_acquire);
  uint32_t i = h->hint.load(std::memory_order_relaxed);
  for (uint32_t n = 0; n < kProbes && n < high; ++n, ++i) {
    if (i >= high) i = 0;
    uint32_t free = pub::kFree;
    if (s[i].state.load(std::memory_order_relaxed) == pub::kFree &&
        s[i].state.compare_exchange_strong(free, pub::kFilling, std::memory_order_acquire)) {
      slot_ = &s[i];
      h->hint.store(i + 1, std::memory_order_relaxed);
      break;
    }
  }
  for (uint32_t n = h->high.load(std::memory_order_relaxed); !slot_ && n < pub::kSlots;) {
    if (!h->high.compare_exchange_weak(n, n + 1, std::memory_order_acq_rel)) continue;
    uint32_t free = pub::kFree;
    if (s[n].state.compare_exchange_strong(free, pub::kFilling, std::memory_order_acquire)) {
      slot_ = &s[n];
      h->hint.store(n + 1, std::memory_order_relaxed);
    }
  }
  if (!slot_) {
    h->unlisted.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  slot_->gen.fetch_add(1, std::memory_order_relaxed);
  slot_->family = 0;
  slot_->transport = pub::kTransportNone;
  slot_->fd = -1;
  for (auto* c : {&slot_->c.sent, &slot_->c.received, &slot_->c.tcp_sent, &slot_->c.tcp_received,
                  &slot_->c.stalls, &slot_->c.wakeups})
    c->store(0, std::memory_order_relaxed);
}

PublishedConn::~PublishedConn() {
  if (!slot_) return;
  Header* h = header();
  slot_->state.store(pub::kFree, std::memory_order_release);
  if (h) h->hint.store(static_cast<uint32_t>(slot_ - slots(h)), std::memory_order_relaxed);
}

namespace {
void put_addr(const sockaddr* sa, socklen_t len, uint8_t* family, uint8_t* addr, uint16_t* port) {
  if (sa->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    memcpy(addr, &in->sin_addr, 4);
    *port = ntohs(in->sin_port);
    *family = AF_INET;
  } else if (sa->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    memcpy(addr, &in6->sin6_addr, 16);
    *port = ntohs(in6->sin6_port);
    *family = AF_INET6;
  }
}
}  // namespace

void PublishedConn::describe(int fd, int app_fd, bool rdma, pub::SlotState state,
                             const sockaddr* peer, socklen_t peer_len) {
  if (!slot_) return;
  slot_->fd = app_fd;
  slot_->transport = rdma ? pub::kTransportRdma : pub::kTransportShm;
  sockaddr_storage local = {}, remote = {};
  socklen_t llen = sizeof local;
  uint8_t lfam = 0, rfam = 0;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) == 0)
    put_addr(reinterpret_cast<sockaddr*>(&local), llen, &lfam, slot_->local_addr,
             &slot_->local_port);
  if (!peer || peer_len == 0) {
    peer_len = sizeof remote;
    if (real().getpeername(fd, reinterpret_cast<sockaddr*>(&remote), &peer_len) != 0) peer_len = 0;
    peer = reinterpret_cast<sockaddr*>(&remote);
  }
  if (peer_len > 0) put_addr(peer, peer_len, &rfam, slot_->remote_addr, &slot_->remote_port);
  slot_->family = lfam == rfam ? lfam : 0;
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  slot_->since = now.tv_sec;
  slot_->state.store(state, std::memory_order_release);
}

void PublishedConn::hide() {
  if (slot_) slot_->state.store(pub::kHidden, std::memory_order_release);
}

void publish_code(pub::CodeKind kind, int index) {
  Header* h = header();
  if (!h || kind == pub::kCodeNone) return;
  const int at = kCodeBase[kind] + index;
  if (index >= 0 && at < kCodeBase[kind + 1])
    h->codes[at].count.fetch_add(1, std::memory_order_relaxed);
}

void publish_connection(int path) {
  if (Header* h = header(); h && path >= 0 && path < 3)
    h->connections[path].fetch_add(1, std::memory_order_relaxed);
}

void publish_closed_bytes(uint64_t sent, uint64_t received) {
  if (Header* h = header()) {
    h->closed_sent.fetch_add(sent, std::memory_order_relaxed);
    h->closed_received.fetch_add(received, std::memory_order_relaxed);
  }
}

namespace {

// The header and the slots in use as they were at the fork: the child's
// file starts from them. Taken before the fork, since the parent's mapping
// is shared with the child, and the parent goes on changing it (closing
// what the child keeps) before the child can copy anything.
void* g_fork_copy = nullptr;
size_t g_fork_bytes = 0;

void drop_fork_copy() {
  if (g_fork_copy) munmap(g_fork_copy, g_fork_bytes);
  g_fork_copy = nullptr;
}

}  // namespace

void publish_fork_prepare() {
  Header* h = header();
  if (!h) return;
  g_fork_bytes = pub::kSlotsOffset + sizeof(Slot) * h->high.load(std::memory_order_acquire);
  void* m = mmap(nullptr, g_fork_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return;
  // Word by word, as the atomics they mostly are: other threads go on
  // counting meanwhile (the view may lag by what they add before the fork;
  // the streams' own counts are exact in the child).
  const auto* from = reinterpret_cast<const uint64_t*>(h);
  auto* to = static_cast<uint64_t*>(m);
  for (size_t i = 0; i < g_fork_bytes / sizeof(uint64_t); ++i)
    to[i] = __atomic_load_n(&from[i], __ATOMIC_RELAXED);
  g_fork_copy = m;
}

void publish_after_fork_parent() { drop_fork_copy(); }

void publish_after_fork_child() {
  Header* h = header();
  if (!h) {
    // A parent's thread was making it: this child makes its own, later.
    if (g_state.load(std::memory_order_relaxed) == kMaking) g_state.store(kUnknown);
    return;
  }
  // This process writes a file of its own from now on, at the same address
  // (the connections' counters point into it), starting from the copy.
  const auto* from = static_cast<const Header*>(g_fork_copy);
  if (!from || !make_file(from, g_fork_bytes, h)) {
    // No file: the same memory, private, so that the parent's is left
    // alone (and rsockstat does not show this process).
    mmap(h, pub::kFileBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1,
         0);
    if (from) memcpy(static_cast<void*>(h), from, g_fork_bytes);
    drop_fork_copy();
    g_header.store(nullptr, std::memory_order_release);
    g_state.store(kOff, std::memory_order_release);
    return;
  }
  drop_fork_copy();
  // The child reports what it does itself, as the stats (stats_reset).
  h->unlisted.store(0, std::memory_order_relaxed);
  for (auto& c : h->connections) c.store(0, std::memory_order_relaxed);
  for (auto& c : h->codes) c.count.store(0, std::memory_order_relaxed);
  h->closed_sent.store(0, std::memory_order_relaxed);
  h->closed_received.store(0, std::memory_order_relaxed);
}

namespace {

void rename_self(bool to_exec) {
  if (!header() || in_vfork_child()) return;
  char exec_name[48];
  snprintf(exec_name, sizeof exec_name, "%s.exec", g_name);
  const int dfd = open(g_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) return;
  if (to_exec)
    renameat(dfd, g_name, dfd, exec_name);
  else
    renameat(dfd, exec_name, dfd, g_name);
  real().close(dfd);
}
}  // namespace

void publish_before_exec() { rename_self(true); }
void publish_exec_failed() { rename_self(false); }

void publish_at_exit() {
  if (!header() || in_vfork_child()) return;
  char path[600];
  snprintf(path, sizeof path, "%s/%s", g_dir, g_name);
  unlink(path);
}

}  // namespace rsock
