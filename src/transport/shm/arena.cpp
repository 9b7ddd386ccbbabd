// One memory file per pair of processes (see arena.h).
#include "transport/shm/arena.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <mutex>

#include "common/own_fd.h"
#include "common/real.h"
#include "ring/wire.h"

namespace rsock {

struct Arena {
  int fd = -1;
  dev_t dev = 0;
  ino_t ino = 0;
  RegionPeer peer;      // the creator's: the process its regions are for
  bool places = false;  // the creator's, and no other process holds the file
  uint64_t end = 0;     // the creator's: how far its places reach
  size_t refs = 0;
  struct Place {
    uint64_t offset;
    size_t len;
  };
  std::vector<Place> free;  // given up by both ends: placed again first
  std::deque<Place> held;   // given up here, the peer's end not done yet (oldest first)
};

namespace {

std::mutex g_mu;
std::vector<Arena*>* g_arenas = nullptr;  // never freed

std::vector<Arena*>& arenas() {
  if (g_arenas == nullptr) g_arenas = new std::vector<Arena*>;
  return *g_arenas;
}

// The most places given up while the peer still held them that one
// placement looks at again (a read of each one's header): an end that
// never says it is done cannot make every placement slower.
constexpr size_t kHeldLooks = 8;

// The most places a file holds given up while the peer's end still held
// them.
constexpr size_t kMaxHeld = 64;

// The bound on a file's length: far past any count of regions, and well
// inside off_t even when a peer grew the file (its right) first.
constexpr uint64_t kMaxEnd = uint64_t{1} << 46;

void give_back(const Arena* a, const Arena::Place& p) {
  fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(p.offset),
            static_cast<off_t>(p.len));
}

bool peer_done(const Arena* a, const Arena::Place& p) {
  uint32_t v = 0;
  const off_t at = static_cast<off_t>(p.offset + offsetof(RegionHeader, released) +
                                      sizeof(std::atomic<uint32_t>));
  return pread(a->fd, &v, sizeof v, at) == static_cast<ssize_t>(sizeof v) && v == 1;
}

// A place of len bytes given up earlier, or false.
bool take_given_up(Arena* a, size_t len, uint64_t* offset) {
  for (auto it = a->free.begin(); it != a->free.end(); ++it) {
    if (it->len != len) continue;
    *offset = it->offset;
    a->free.erase(it);
    return true;
  }
  // The oldest of those whose peer end was not done: one that is done now
  // gives its pages back, and the first that fits serves. The others go to
  // the back of the line.
  bool found = false;
  for (size_t k = std::min(a->held.size(), kHeldLooks); k > 0; --k) {
    const Arena::Place p = a->held.front();
    a->held.pop_front();
    if (!peer_done(a, p)) {
      a->held.push_back(p);
      continue;
    }
    give_back(a, p);
    if (!found && p.len == len) {
      *offset = p.offset;
      found = true;
    } else {
      a->free.push_back(p);
    }
  }
  return found;
}

int grow(Arena* a, size_t len, uint64_t* offset) {
  // The peer may have made the file longer (only shrinking is sealed):
  // new places start past its end.
  struct stat st;
  if (fstat(a->fd, &st) != 0) return -errno;
  const uint64_t size = (static_cast<uint64_t>(st.st_size) + kPageBytes - 1) & ~(kPageBytes - 1);
  const uint64_t at = std::max(a->end, size);
  if (at > kMaxEnd) return -EFBIG;
  // A file longer than the program's RLIMIT_FSIZE: the kernel would
  // answer the ftruncate with SIGXFSZ, whose default action ends the
  // program. Never asked.
  rlimit lim;
  if (getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY &&
      at + len > static_cast<uint64_t>(lim.rlim_cur))
    return -EFBIG;
  if (ftruncate(a->fd, static_cast<off_t>(at + len)) != 0) return -errno;
  a->end = at + len;
  *offset = at;
  return 0;
}

void destroy(Arena* a) {
  real().close(a->fd);
  auto& all = arenas();
  all.erase(std::find(all.begin(), all.end(), a));
  delete a;
}

int make_arena(const RegionPeer& peer, Arena** out) {
  const int fd = lift_fd(memfd_create("rsock-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd < 0) return -errno;
  // A peer can never shrink the file under our mappings (which would SIGBUS
  // the host program), nor take that seal off, nor seal the growth we need.
  struct stat st;
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) != 0 || fstat(fd, &st) != 0) {
    const int err = -errno;
    real().close(fd);
    return err;
  }
  auto* a = new Arena;
  a->fd = fd;
  a->dev = st.st_dev;
  a->ino = st.st_ino;
  a->peer = peer;
  // A peer we cannot name again gets a file of its own.
  a->places = peer.token != 0;
  arenas().push_back(a);
  *out = a;
  return 0;
}

void stop_placing_all() {
  if (g_arenas == nullptr) return;
  for (Arena* a : *g_arenas) a->places = false;
}

}  // namespace

int arena_fd(const Arena* a) { return a->fd; }

bool arena_places(const Arena* a) {
  std::lock_guard<std::mutex> lock(g_mu);
  return a->places;
}

int arena_place(const RegionPeer& peer, size_t len, RegionRef* out) {
  if (len == 0 || len % kPageBytes != 0) return -EINVAL;
  std::lock_guard<std::mutex> lock(g_mu);
  Arena* a = nullptr;
  if (peer.token != 0)
    for (Arena* e : arenas())
      if (e->places && e->peer.pid == peer.pid && e->peer.token == peer.token) {
        a = e;
        break;
      }
  if (a == nullptr)
    if (const int rc = make_arena(peer, &a); rc < 0) return rc;
  uint64_t offset = 0;
  if (!take_given_up(a, len, &offset)) {
    int rc = grow(a, len, &offset);
    if (rc == -EFBIG && a->end > 0) {
      // A file as long as it may be: its regions stay, the next go into a
      // new one.
      a->places = false;
      if (a->refs == 0) destroy(a);
      rc = make_arena(peer, &a);
      if (rc == 0 && (rc = grow(a, len, &offset)) < 0) destroy(a);
    } else if (rc < 0 && a->refs == 0) {
      destroy(a);
    }
    if (rc < 0) return rc;
  }
  ++a->refs;
  *out = {a, offset};
  return 0;
}

RegionRef arena_adopt(int fd, uint64_t offset) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    real().close(fd);
    return {};
  }
  std::lock_guard<std::mutex> lock(g_mu);
  for (Arena* a : arenas()) {
    if (a->dev != st.st_dev || a->ino != st.st_ino) continue;
    if (a->fd != fd) real().close(fd);
    ++a->refs;
    return {a, offset};
  }
  auto* a = new Arena;
  a->fd = fd;
  a->dev = st.st_dev;
  a->ino = st.st_ino;
  a->refs = 1;
  arenas().push_back(a);
  return {a, offset};
}

void arena_release(const RegionRef& r, size_t len, const void* header, bool reusable) {
  Arena* a = r.arena;
  if (a == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mu);
  if (reusable && a->places) {
    // The peer (the client, side 1) done too: its pages go back now.
    const Arena::Place p = {r.offset, len};
    const auto* h = static_cast<const RegionHeader*>(header);
    if (h == nullptr || h->released[1].load(std::memory_order_acquire) == 1) {
      give_back(a, p);
      a->free.push_back(p);
    } else {
      a->held.push_back(p);
      // A peer that keeps one connection open and never says it is done
      // with the others would keep their pages here for as long as the
      // pair connects: past kMaxHeld, the file takes no more regions, and
      // goes (pages and all) with the last of those it has.
      if (a->held.size() > kMaxHeld) a->places = false;
    }
  }
  if (--a->refs == 0) destroy(a);
}

void arena_stop_placing(Arena* a) {
  if (a == nullptr) return;
  std::lock_guard<std::mutex> lock(g_mu);
  a->places = false;
}

void arena_own_fds(std::vector<int>* out) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (const Arena* a : arenas()) out->push_back(a->fd);
}

size_t arena_count() {
  std::lock_guard<std::mutex> lock(g_mu);
  return arenas().size();
}

void arena_fork_prepare() { g_mu.lock(); }

void arena_after_fork_parent() {
  stop_placing_all();
  g_mu.unlock();
}

void arena_after_fork_child() {
  stop_placing_all();
  g_mu.unlock();
}

}  // namespace rsock
