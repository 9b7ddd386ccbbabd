// The shared memory of one end of a verbs connection (see verbs_end.h).
#include "transport/verbs/verbs_end.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/own_fd.h"
#include "common/real.h"
#include "ring/ring.h"
#include "transport/addr.h"

namespace rsock {
namespace {

size_t region_for(size_t ring_bytes) { return kPageBytes + 2 * ring_bytes; }

bool ring_size_ok(uint64_t ring_bytes) {
  return is_power_of_two(ring_bytes) && ring_bytes >= kPageBytes &&
         ring_bytes <= (uint64_t{1} << 28);
}

// Waits a little without burning the CPU: the other side is a process
// that needs the CPU to get out of our way.
void pause_briefly() { usleep(50); }

}  // namespace

VerbsEnd::~VerbsEnd() { release(); }

VerbsEnd& VerbsEnd::operator=(VerbsEnd&& o) noexcept {
  if (this != &o) {
    release();
    hdr_ = o.hdr_;
    memfd_ = o.memfd_;
    ring_bytes_ = o.ring_bytes_;
    rings_ = o.rings_;
    o.hdr_ = nullptr;
    o.memfd_ = -1;
    o.rings_ = nullptr;
  }
  return *this;
}

void VerbsEnd::release() {
  unmap_rings();
  if (hdr_) munmap(hdr_, kPageBytes);
  hdr_ = nullptr;
  if (memfd_ >= 0) real().close(memfd_);
  memfd_ = -1;
}

uint64_t verbs_random_nonce() {
  uint64_t nonce = 0;
  while (nonce == 0)
    if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) nonce = 0;
  return nonce;
}

int VerbsEnd::create(size_t ring_bytes, const WireAddr& local, const WireAddr& peer,
                     VerbsEnd* out) {
  if (!ring_size_ok(ring_bytes)) return -EINVAL;
  VerbsEnd e;
  e.memfd_ = lift_fd(memfd_create("rsock-rdma-end", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (e.memfd_ < 0) return -errno;
  e.ring_bytes_ = ring_bytes;
  const size_t len = region_for(ring_bytes);
  // Sealed: its size is final, so that no holder can truncate it under
  // another's mapping (or under a registration).
  if (ftruncate(e.memfd_, static_cast<off_t>(len)) != 0 ||
      fcntl(e.memfd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return -errno;
  void* h = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, e.memfd_, 0);
  if (h == MAP_FAILED) return -errno;
  e.hdr_ = static_cast<VerbsEndHeader*>(h);
  VerbsEndHeader* hd = e.hdr_;  // fresh zero pages: the atomics start at 0
  hd->magic = kVerbsEndMagic;
  hd->version = kVerbsEndVersion;
  hd->header_bytes = kPageBytes;
  hd->ring_bytes = ring_bytes;
  hd->region_bytes = len;
  hd->nonce = verbs_random_nonce();
  hd->local = local;
  hd->peer = peer;
  (void)owner_init(&hd->own);
  hd->holders.store(1, std::memory_order_release);
  if (int rc = e.map_rings(); rc < 0) return rc;
  *out = static_cast<VerbsEnd&&>(e);
  return 0;
}

void VerbsEnd::renew() {
  VerbsEndHeader* hd = hdr_;
  hd->nonce = verbs_random_nonce();
  hd->local = WireAddr{};
  hd->peer = WireAddr{};
  hd->frame_lock.store(0, std::memory_order_relaxed);
  hd->move_nonce.store(0, std::memory_order_relaxed);
  hd->tx_sent.store(0, std::memory_order_relaxed);
  hd->rx_consumed.store(0, std::memory_order_relaxed);
  hd->rx_head.store(0, std::memory_order_relaxed);
  hd->flags_sent.store(0, std::memory_order_relaxed);
  hd->peer_flags.store(0, std::memory_order_relaxed);
  hd->frame_bytes_in.store(0, std::memory_order_relaxed);
  (void)owner_renew(&hd->own);
  hd->holders.store(1, std::memory_order_release);
}

int VerbsEnd::validate(int memfd, int socket_fd, uint64_t nonce, VerbsEnd* out) {
  // Everything but the memfd itself is untrusted until checked: the layout
  // is read from a private copy of the header.
  const int seals = fcntl(memfd, F_GET_SEALS);
  struct stat st;
  if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW) ||
      fstat(memfd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<size_t>(st.st_size) < kPageBytes)
    return -EPROTO;
  VerbsEndHeader h;
  if (pread(memfd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) return -EPROTO;
  if (h.magic != kVerbsEndMagic || h.version != kVerbsEndVersion || h.header_bytes != kPageBytes ||
      h.nonce != nonce || !ring_size_ok(h.ring_bytes) ||
      h.region_bytes != region_for(h.ring_bytes) ||
      static_cast<uint64_t>(st.st_size) != h.region_bytes)
    return -EPROTO;
  WireAddr local, peer;
  if (!fd_addrs(socket_fd, &local, &peer)) return -ENOTCONN;
  if (!same_wire(h.local, local) || !same_wire(h.peer, peer)) return -EPROTO;
  void* p = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) return -errno;
  VerbsEnd e;
  e.hdr_ = static_cast<VerbsEndHeader*>(p);
  e.ring_bytes_ = h.ring_bytes;  // from the checked size, never re-read
  e.memfd_ = memfd;
  real().fcntl(memfd, F_SETFD, FD_CLOEXEC);
  *out = static_cast<VerbsEnd&&>(e);
  return 0;
}

int VerbsEnd::map_rings() {
  if (rings_) return 0;
  void* p = mmap(nullptr, 2 * ring_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_,
                 static_cast<off_t>(kPageBytes));
  if (p == MAP_FAILED) return -errno;
  rings_ = static_cast<uint8_t*>(p);
  return 0;
}

void VerbsEnd::unmap_rings() {
  if (rings_) munmap(rings_, 2 * ring_bytes_);
  rings_ = nullptr;
}

void verbs_end_drop_holder(int memfd, uint64_t nonce) {
  VerbsEndHeader h;
  struct stat st;
  if (fstat(memfd, &st) != 0 || !S_ISREG(st.st_mode) ||
      pread(memfd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h) ||
      h.magic != kVerbsEndMagic || h.version != kVerbsEndVersion || h.nonce != nonce ||
      static_cast<uint64_t>(st.st_size) != h.region_bytes)
    return;
  void* p = mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
  if (p == MAP_FAILED) return;
  auto* hdr = static_cast<VerbsEndHeader*>(p);
  uint32_t cur = hdr->holders.load(std::memory_order_acquire);
  while (cur > 0 && !hdr->holders.compare_exchange_weak(cur, cur - 1, std::memory_order_acq_rel)) {
  }
  munmap(p, kPageBytes);
}

// ---- the owner protocol ------------------------------------------------------

bool end_enter(VerbsEndHeader* h, uint64_t epoch) { return owner_enter(&h->own, epoch); }
void end_leave(VerbsEndHeader* h) { owner_leave(&h->own); }
bool end_owns(const VerbsEndHeader* h, uint64_t epoch) { return owner_owns(&h->own, epoch); }

bool end_lock_frames(VerbsEndHeader* h, int64_t deadline_ms) {
  const int32_t me = static_cast<int32_t>(getpid());
  for (;;) {
    int32_t cur = 0;
    if (h->frame_lock.compare_exchange_strong(cur, me, std::memory_order_acq_rel)) return true;
    // A process that died holding it never gives it back. (Our own pid: an
    // image before exec that held it; exec ended that.)
    if ((cur == me || pid_gone(cur)) &&
        h->frame_lock.compare_exchange_strong(cur, me, std::memory_order_acq_rel))
      return true;
    if (monotonic_ms() >= deadline_ms) return false;
    pause_briefly();
  }
}

void end_unlock_frames(VerbsEndHeader* h) { h->frame_lock.store(0, std::memory_order_release); }

int end_fence(VerbsEndHeader* h, int64_t deadline_ms, uint64_t* epoch) {
  return owner_fence(&h->own, deadline_ms, epoch);
}
void end_release(VerbsEndHeader* h, uint64_t epoch) { owner_release(&h->own, epoch); }
bool end_reclaim(VerbsEndHeader* h, uint64_t epoch) { return owner_reclaim(&h->own, epoch); }

}  // namespace rsock
