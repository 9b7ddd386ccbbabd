// Same-host shared-memory transport (see shm_channel.h).
#include "transport/shm/shm_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#include "common/barrier.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/own_fd.h"
#include "common/real.h"
#include "ring/region.h"
#include "ring/ring.h"
#include "ring/sleepers.h"
#include "stats/stats.h"
#include "transport/addr.h"
#include "transport/carrier.h"
#include "transport/end_owner.h"
#include "transport/shm/region_cache.h"

namespace rsock {

int shm_region_create(size_t ring_bytes, uint64_t nonce, void** map, size_t* map_len) {
  const size_t len = region_bytes_for(ring_bytes);
  int fd = lift_fd(memfd_create("rsock-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (fd < 0) return -errno;
  if (ftruncate(fd, static_cast<off_t>(len)) != 0) {
    int err = -errno;
    real().close(fd);
    return err;
  }
  // The size is final: sealing it means a peer can never shrink the region
  // under our mapping (which would SIGBUS the host program).
  fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = -errno;
    real().close(fd);
    return err;
  }
  shm_region_init_header(p, ring_bytes, nonce);
  stats_region(false);
  *map = p;
  *map_len = len;
  return fd;
}

int shm_region_place(const RegionPeer& peer, size_t ring_bytes, uint64_t nonce, RegionRef* out,
                     void** map, size_t* map_len) {
  const size_t len = region_bytes_for(ring_bytes);
  RegionRef r;
  if (const int rc = arena_place(peer, len, &r); rc < 0) return rc;
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, arena_fd(r.arena),
                 static_cast<off_t>(r.offset));
  if (p == MAP_FAILED) {
    const int err = -errno;
    arena_release(r, len, nullptr, true);
    return err;
  }
  shm_region_init_header(p, ring_bytes, nonce);
  stats_region(false);
  *out = r;
  *map = p;
  *map_len = len;
  return 0;
}

void shm_region_init_header(void* map, size_t ring_bytes, uint64_t nonce) {
  // A kept region's header still holds its last connection's words: every
  // one starts from zero again (the rings' old bytes lie beyond every
  // position and are never read).
  memset(map, 0, region_header_bytes());
  auto* h = new (map) RegionHeader{};
  h->magic = kRegionMagic;
  h->version = kProtocolVersion;
  h->header_bytes = static_cast<uint32_t>(region_header_bytes());
  h->nonce = nonce;
  h->ring_bytes = ring_bytes;
  h->ring_offset[kServerToClient] = region_header_bytes();
  h->ring_offset[kClientToServer] = region_header_bytes() + ring_bytes;
  h->region_bytes = region_bytes_for(ring_bytes);
  for (EndpointControl& e : h->end) e.switch_at.store(kNotSwitched, std::memory_order_relaxed);
}

void shm_region_start_on_ring(void* map) {
  shm_region_end_on_ring(map, true);
  shm_region_end_on_ring(map, false);
}

void shm_region_end_on_ring(void* map, bool server) {
  EndpointControl& e = static_cast<RegionHeader*>(map)->end[server ? 0 : 1];
  e.switch_at.store(0, std::memory_order_relaxed);
  e.attached.store(1, std::memory_order_release);
}

int shm_region_attach(int memfd, uint64_t offset, size_t region_bytes, uint64_t nonce,
                      size_t ring_bytes, void** map, RegionFile* file, bool* reused) {
  // The header is checked twice over: the sizes before anything is mapped,
  // the whole header (region_header_check, pure) once it is.
  if (!region_params_valid(region_bytes, ring_bytes) || offset % kPageBytes != 0 ||
      offset > (uint64_t{1} << 62))
    return -EPROTO;
  struct stat st;
  if (fstat(memfd, &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) < offset + region_bytes)
    return -EPROTO;
  // A place this process mapped before (a region its creator kept for us)
  // passed the seal check then, and seals never come off.
  void* p = region_cache_find_mapping(st.st_dev, st.st_ino, offset, region_bytes);
  const bool kept = p != nullptr;
  if (!kept) {
    // The seal proves nobody can shrink the file under the mapping.
    int seals = fcntl(memfd, F_GET_SEALS);
    if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) return -EPROTO;
    p = mmap(nullptr, region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, memfd,
             static_cast<off_t>(offset));
    if (p == MAP_FAILED) return -errno;
  }
  if (region_header_check(p, region_bytes, region_bytes, nonce, ring_bytes) != 0) {
    munmap(p, region_bytes);
    return -EPROTO;
  }
  stats_region(kept);
  if (file != nullptr) *file = {st.st_dev, st.st_ino, offset};
  if (reused != nullptr) *reused = kept;
  *map = p;
  return 0;
}

int shm_region_validate(int memfd, uint64_t offset, int socket_fd, bool is_server, uint64_t nonce,
                        void** map, size_t* map_len) {
  // Everything but the file's own word is untrusted here: read the layout
  // from a private copy of the header page, check it, then map the region
  // (shm_region_attach checks the seal and the size).
  if (offset % kPageBytes != 0 || offset > (uint64_t{1} << 62)) return -EPROTO;
  RegionHeader h;
  if (pread(memfd, &h, sizeof h, static_cast<off_t>(offset)) != static_cast<ssize_t>(sizeof h))
    return -EPROTO;
  const size_t ring_bytes = h.ring_bytes;
  if (h.magic != kRegionMagic || h.version != kProtocolVersion || h.nonce != nonce ||
      !is_power_of_two(ring_bytes) || ring_bytes < 4096 || ring_bytes > (size_t{1} << 28) ||
      h.region_bytes != region_bytes_for(ring_bytes))
    return -EPROTO;
  WireAddr local, peer;
  if (!fd_addrs(socket_fd, &local, &peer)) return -ENOTCONN;
  const int side = is_server ? 0 : 1;
  if (!same_wire(h.endpoint[side][0], local) || !same_wire(h.endpoint[side][1], peer))
    return -EPROTO;
  void* p = nullptr;
  int rc = shm_region_attach(memfd, offset, h.region_bytes, nonce, ring_bytes, &p);
  if (rc < 0) return rc;
  *map = p;
  *map_len = h.region_bytes;
  return 0;
}

ShmChannel::ShmChannel(void* map, size_t map_len, bool is_server, int doorbell_fd, RegionRef region,
                       const WireAddr* ends, bool rx_read_only)
    : map_(map), map_len_(map_len), socket_(doorbell_fd, true), region_(region) {
  init(map, is_server, rx_read_only);
  holders_->store(1, std::memory_order_relaxed);
  epoch_ = owner_init(own_);
  // Our own view of the connection, for a program that inherits this end
  // through exec (shm_region_validate). Only this side writes its slot.
  auto* h = static_cast<RegionHeader*>(map);
  WireAddr local = {}, peer = {};
  if (ends != nullptr) {
    local = ends[0];
    peer = ends[1];
  } else if (!fd_addrs(socket_.fd(), &local, &peer)) {
    return;
  }
  h->endpoint[is_server ? 0 : 1][0] = local;
  h->endpoint[is_server ? 0 : 1][1] = peer;
}

ShmChannel::ShmChannel(Resume, void* map, size_t map_len, bool is_server, int doorbell_fd,
                       RegionRef region)
    : map_(map), map_len_(map_len), socket_(doorbell_fd, true), region_(region) {
  sole_ = false;  // an image before this one held it too
  init(map, is_server);
  // The image before exec owned the end: it still does (its threads, and
  // any operation they had begun, ended with exec). Else the first use here
  // takes it over.
  if (own_->owner_pid.load(std::memory_order_acquire) == static_cast<int32_t>(getpid())) {
    own_->busy.store(0, std::memory_order_seq_cst);
    epoch_ = own_->epoch.load(std::memory_order_acquire);
    release_stale_trims();  // exec ended whatever the old image was doing
  }
}

void ShmChannel::init(void* map, bool is_server, bool rx_read_only) {
  is_server_ = is_server;
  auto* h = static_cast<RegionHeader*>(map);
  auto* base = static_cast<uint8_t*>(map);
  // The layout comes from the mapping's length, which was checked, never
  // from the shared header again: the peer can rewrite the header at any
  // time, and a ring size or offset read now could point outside the map.
  ring_bytes_ = (map_len_ - region_header_bytes()) / 2;
  const int tx_dir = is_server ? kServerToClient : kClientToServer;
  const int rx_dir = 1 - tx_dir;
  holders_ = &h->holders[is_server ? 0 : 1];
  tx_ = &h->dir[tx_dir];
  rx_ = &h->dir[rx_dir];
  tx_ring_offset_ = region_header_bytes() + static_cast<size_t>(tx_dir) * ring_bytes_;
  rx_ring_offset_ = region_header_bytes() + static_cast<size_t>(rx_dir) * ring_bytes_;
  tx_ring_ = base + tx_ring_offset_;
  rx_ring_ = base + rx_ring_offset_;
  me_ = &h->end[is_server ? 0 : 1];
  own_ = &h->owner[is_server ? 0 : 1].o;
  peer_ = &h->end[is_server ? 1 : 0];
  // Only the peer writes our receive ring: in this process it is read-only.
  if (!rx_read_only) mprotect(const_cast<uint8_t*>(rx_ring_), ring_bytes_, PROT_READ);
  prefix_ = {&me_->tcp_sent,    &me_->tcp_read,   &me_->switch_at,
             &peer_->switch_at, &peer_->attached, &peer_->tcp_read};
  // Where the end stands (a fresh one: nothing switched; an exec'd image
  // or a fork's child: where its holders left it).
  if (tx_open()) doorbells_only();
  (void)rx_open();
}

void ShmChannel::doorbells_only() {
  // The kernel socket now carries only our doorbells. A doorbell held back
  // by Nagle (until the ACK of the previous one, which the peer's
  // delayed-ACK timer sends milliseconds later) or by a cork stalls both
  // ends: a streaming sender sleeps on credits while the receiver sleeps on
  // data. (Before the switch the socket is the application's, as it set it.)
  const int on = 1, off = 0;
  SocketNumber::Use sock(socket_);
  real().setsockopt(sock.fd(), IPPROTO_TCP, TCP_CORK, &off, sizeof off);
  real().setsockopt(sock.fd(), IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
}

void ShmChannel::attach() { me_->attached.store(1, std::memory_order_seq_cst); }

bool ShmChannel::tx_open() {
  if (tx_switched_.load(std::memory_order_acquire)) return true;
  // Another holder of the end (a fork's parent or child) may have switched.
  if (me_->switch_at.load(std::memory_order_acquire) == kNotSwitched) return false;
  tx_switched_.store(true, std::memory_order_release);
  return true;
}

bool ShmChannel::rx_open() {
  if (rx_switched_.load(std::memory_order_acquire)) return true;
  const uint64_t at = peer_->switch_at.load(std::memory_order_acquire);
  if (at == kNotSwitched || me_->tcp_read.load(std::memory_order_acquire) != at) return false;
  rx_switched_.store(true, std::memory_order_release);
  return true;
}

void ShmChannel::switch_tx(uint64_t at) {
  // The count first, then the doorbell: a receiver that reads the doorbell
  // from its socket loads the count after, and finds it (the kernel's
  // socket orders our store before the byte it delivers). Once only, for
  // every holder of the end.
  uint64_t none = kNotSwitched;
  const bool first = me_->switch_at.compare_exchange_strong(none, at, std::memory_order_seq_cst);
  tx_switched_.store(true, std::memory_order_release);
  if (!first && !owed_.load(std::memory_order_acquire)) return;
  if (first) doorbells_only();
  owed_.store(false, std::memory_order_relaxed);
  (void)ring_doorbell();
}

void ShmChannel::switch_rx(uint64_t taken) {
  if (taken > 0) {
    const uint64_t drained = me_->drained.fetch_add(taken, std::memory_order_acq_rel) + taken;
    if (drained > peer_->doorbells.load(std::memory_order_acquire)) {
      rx_switched_.store(true, std::memory_order_release);
      kernel_bytes_seen();
      return;
    }
  }
  rx_switched_.store(true, std::memory_order_release);
}

ShmChannel::~ShmChannel() {
  // On the application's number, the channel ends before that number goes
  // (forget_fd in the wrappers): a lingering close needs a dup of its own.
  if (socket_.fd() >= 0 && must_linger()) {
    if (const int rc = socket_.own(); rc == 0) {
      (void)socket_.release();  // the lingering end's from now on
      // The lingering end still reads the header: its place is never given
      // to another region (it goes with the file).
      arena_release(region_, map_len_, nullptr, false);
      shm_linger(linger_end(true));  // it closes the socket and unmaps
      return;
    } else {
      LOG_WARN("shm: no descriptor to linger with (%s): the close goes at once", strerror(-rc));
    }
  }
  // A doorbell left on the socket would make its close a reset. Another
  // process that holds the socket may sleep on it: its doorbells are its own.
  if (socket_.fd() >= 0 && sole_ && wakeups_left_.load(std::memory_order_relaxed))
    (void)drain_wakeups();
  socket_.close();  // an owned dup; the application closes its number
  // No thread of ours touches the region any more: kept for the next
  // connection with the same peer process, once the peer is done too.
  if (sole_ && dropped_last_ && (keep_peer_.token != 0 || keep_mapping_)) {
    auto* h = static_cast<RegionHeader*>(map_);
    h->released[is_server_ ? 0 : 1].store(1, std::memory_order_release);
    if (keep_peer_.token != 0 && region_.arena != nullptr) {
      if (h->released[1].load(std::memory_order_acquire) == 1) shed_cold_pages();
      region_cache_keep(keep_peer_, region_, map_, map_len_);
    } else {
      arena_release(region_, map_len_, nullptr, false);
      region_cache_keep_mapping(keep_file_.dev, keep_file_.ino, keep_file_.offset, map_, map_len_);
    }
    return;
  }
  // The creator's place serves again once the peer is done, if no other
  // process held this end (a fork's child may still use it).
  arena_release(region_, map_len_, map_, sole_ && dropped_last_ && is_server_);
  munmap(map_, map_len_);
}

bool ShmChannel::punch(size_t offset, size_t len) {
  return fallocate(arena_fd(region_.arena), FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                   static_cast<off_t>(region_.offset + offset), static_cast<off_t>(len)) == 0;
}

void ShmChannel::shed_cold_pages() {
  // Both ends are done: nobody reads or writes the rings until the region
  // serves the next connection, which only this process gives out. The
  // first kKeptWarmBytes of each ring stay (a short connection's bytes
  // land there); a ring that went further gives the rest of its pages back.
  if (ring_bytes_ <= kKeptWarmBytes) return;
  for (const auto& [d, offset] :
       {std::pair{tx_, tx_ring_offset_}, std::pair{rx_, rx_ring_offset_}}) {
    if (d->head.load(std::memory_order_acquire) <= kKeptWarmBytes) continue;
    (void)punch(offset + kKeptWarmBytes, ring_bytes_ - kKeptWarmBytes);
  }
}

bool ShmChannel::must_linger() {
  if (!closed_clean_.load(std::memory_order_acquire)) return false;
  if (!shm_linger_needed(me_->tcp_sent.load(std::memory_order_acquire),
                         peer_->tcp_read.load(std::memory_order_acquire)))
    return false;
  // A peer whose end is gone reads no more.
  if ((rx_->producer_flags.load(std::memory_order_acquire) & kSendClosed) ||
      (carrier_flags_.load(std::memory_order_acquire) & kPeerClosed))
    return false;
  // The peer's data left unread: kernel TCP resets at once, and so do we.
  return rx_open() || carrier_unread(socket_.fd()) == 0;
}

ShmLinger ShmChannel::linger_end(bool owned) const {
  ShmLinger l;
  l.socket_fd = socket_.fd();
  l.map = map_;
  l.map_len = map_len_;
  l.owned = owned;
  l.sent = me_->tcp_sent.load(std::memory_order_acquire);
  l.peer_read = &peer_->tcp_read;
  l.peer_flags = &rx_->producer_flags;
  l.peer_switch_at = &peer_->switch_at;
  l.read = &me_->tcp_read;
  return l;
}

void ShmChannel::at_exit() {
  if (socket_.fd() >= 0 && must_linger()) shm_linger(linger_end(false));
}

int ShmChannel::write(size_t offset, const void* src, size_t len) {
  memcpy(tx_ring_ + offset, src, len);
  return 0;
}

// ---------------------------------------------------- giving pages back --
//
// trim_seq (ring/wire.h): bit 0 held, bit 1 held by the producer's end, the
// rest counts the holds. The producer's `writing` and the consumer's hold
// are a Dekker pair: the producer raises `writing`, then looks at
// trim_seq; the consumer takes trim_seq, then looks at `writing`. Either
// the producer sees the hold and writes nothing, or the consumer sees it
// writing and gives nothing back. The producer's side of the pair is on the
// data path, so its fence is the light half of an asymmetric one
// (common/barrier.h).

namespace {
constexpr uint64_t kTrimHeld = 1, kTrimByProducer = 2;
// Less than this touched since the last time stays: a connection that
// carried a few messages keeps its pages (giving back a page costs its
// next writer about 20 us, docs/design.md "Ring size").
constexpr uint64_t kTrimMinBytes = 16 * 1024;
uint64_t trim_released(uint64_t v) { return ((v >> 2) + 1) << 2; }
}  // namespace

bool ShmChannel::begin_tx() {
  tx_->writing.store(1, std::memory_order_relaxed);
  light_fence();
  if (__builtin_expect((tx_->trim_seq.load(std::memory_order_relaxed) & kTrimHeld) == 0, 1))
    return true;
  tx_->writing.store(0, std::memory_order_release);
  return false;
}

void ShmChannel::end_tx() { tx_->writing.store(0, std::memory_order_release); }

size_t ShmChannel::trim(uint64_t rx_consumed) {
  if (region_.arena == nullptr) return 0;  // nothing to punch the pages out of
  return trim_ring(tx_, tx_ring_offset_, true, peer_read_total()) +
         trim_ring(rx_, rx_ring_offset_, false, rx_consumed);
}

bool ShmChannel::trimmable() const {
  if (region_.arena == nullptr) return false;
  for (const DirectionControl* d : {tx_, rx_})
    if (d->head.load(std::memory_order_relaxed) - d->trimmed.load(std::memory_order_relaxed) >=
        kTrimMinBytes)
      return true;
  return false;
}

size_t ShmChannel::trim_ring(DirectionControl* d, size_t ring_offset, bool ours,
                             uint64_t consumed) {
  // A look before anything is taken: most calls end here.
  uint64_t seq = d->trim_seq.load(std::memory_order_relaxed);
  if ((seq & kTrimHeld) || d->head.load(std::memory_order_acquire) != consumed ||
      consumed - d->trimmed.load(std::memory_order_relaxed) < kTrimMinBytes)
    return 0;
  const uint64_t held = (seq & ~uint64_t{3}) | kTrimHeld | (ours ? kTrimByProducer : 0);
  if (!d->trim_seq.compare_exchange_strong(seq, held, std::memory_order_seq_cst)) return 0;
  size_t freed = 0;
  // The producer is this process, under the stream's send lock (ours), or
  // it is the peer: then only if it is not writing, and will see our hold
  // before it does.
  const bool quiet = ours || (heavy_fence() && d->writing.load(std::memory_order_acquire) == 0);
  const uint64_t head = d->head.load(std::memory_order_acquire);
  const uint64_t from = d->trimmed.load(std::memory_order_relaxed);
  if (quiet && head == consumed && head - from >= kTrimMinBytes) {
    // The pages from the one holding `from` to the one holding `head`,
    // the whole ring at most, in one or two spans of the ring.
    const uint64_t first = from & ~uint64_t{kPageBytes - 1};
    const uint64_t len = std::min<uint64_t>(
        (head - first + kPageBytes - 1) & ~uint64_t{kPageBytes - 1}, ring_bytes_);
    RingSpan spans[2];
    const int n = ring_split(first, len, ring_bytes_, spans);
    bool ok = true;
    for (int k = 0; k < n && ok; ++k) ok = punch(ring_offset + spans[k].offset, spans[k].len);
    if (ok) {
      d->trimmed.store(head, std::memory_order_relaxed);
      freed = len;
    }
  }
  d->trim_seq.store(trim_released(held), std::memory_order_release);
  // A producer that found the ring held waits as for credits: wake it, as
  // a grant would (the fence pairs with the one in arm()).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!ours) wake(d->producer_sleepers.load(std::memory_order_relaxed));
  if (freed) stats_trimmed(freed);
  return freed;
}

void ShmChannel::release_stale_trims() {
  // Nor is our end writing: a `writing` left raised (a process killed
  // inside a send) would keep the peer from ever trimming our ring.
  tx_->writing.store(0, std::memory_order_release);
  for (auto [d, producer] : {std::pair{tx_, true}, std::pair{rx_, false}}) {
    uint64_t v = d->trim_seq.load(std::memory_order_acquire);
    if ((v & kTrimHeld) && ((v & kTrimByProducer) != 0) == producer)
      d->trim_seq.compare_exchange_strong(v, trim_released(v), std::memory_order_acq_rel);
  }
}

bool ShmChannel::ring_doorbell() {
  // No peer to wake once its end is gone; a byte now would only make its
  // kernel answer with a reset.
  if (carrier_flags_.load(std::memory_order_relaxed) & kPeerClosed) return false;
  // Before our sender switched, a byte on the socket is data to the peer:
  // owed, rung by the switch (Stream).
  if (!tx_open()) {
    owed_.store(true, std::memory_order_release);
    return true;
  }
  // One byte on the kernel socket wakes a peer asleep in poll/epoll on it.
  // Counted before it is sent (the peer must never drain an uncounted
  // doorbell), taken back if the send fails. A full socket buffer means
  // wakeups are already pending: EAGAIN is fine.
  static const char kByte = 1;
  me_->doorbells.fetch_add(1, std::memory_order_seq_cst);
  int err;
  {
    SocketNumber::Use sock(socket_);
    if (real().send(sock.fd(), &kByte, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1) {
      stats_wakeup(true);
      count_wakeup();
      return true;
    }
    err = errno;
  }
  me_->doorbells.fetch_sub(1, std::memory_order_relaxed);
  if (err == EAGAIN || err == EWOULDBLOCK) return true;  // pending ones will do
  // The peer's kernel reset the connection: its end is gone.
  if (err == EPIPE || err == ECONNRESET) peer_gone(kPeerClosed);
  return false;
}

namespace {

// The last sleep this thread rang (ring/sleepers.h), and when. A token is
// trusted for a millisecond only: past that the sleep it named may have
// ended long ago, and skipping on it would rest on tokens never repeating
// alone. Atomics: a signal handler that rings in between leaves a token
// that was rung, whichever the interrupted code then reads.
struct WakeupMemo {
  std::atomic<uint64_t> token{0};
  std::atomic<int64_t> at_ns{0};
};
constinit thread_local WakeupMemo t_rung;
constexpr int64_t kMemoNs = 1000000;

}  // namespace

void ShmChannel::wake(uint64_t sleepers_word) {
  if (sleepers::count(sleepers_word) == 0) return;
  const uint64_t tok = sleepers::token(sleepers_word);
  // A word that names no sleep (several sleepers, or an arm without a
  // token) is always rung: no memo, no clock.
  if (tok == 0) {
    ring_doorbell();
    return;
  }
  WakeupMemo& m = t_rung;
  const int64_t now = monotonic_ns();
  if (m.token.load(std::memory_order_relaxed) == tok &&
      now - m.at_ns.load(std::memory_order_relaxed) < kMemoNs) {
    // That sleep was rung on another of its connections (or on this one):
    // it disarms this one before it looks, and then sees our store.
    stats_wakeup(false);
    return;
  }
  if (!ring_doorbell()) return;
  m.token.store(tok, std::memory_order_relaxed);
  m.at_ns.store(now, std::memory_order_relaxed);
}

void ShmChannel::peer_gone(uint32_t flags) {
  carrier_flags_.fetch_or(flags, std::memory_order_release);
}

// Bytes reached our kernel socket behind librsock: the stream resets
// (ECONNRESET), the peer is told (kSendKernelBytes, with a doorbell for a
// sleeper), and the reset is reported once in this process.
void ShmChannel::kernel_bytes_seen() {
  if (carrier_flags_.fetch_or(kKernelBytes, std::memory_order_acq_rel) & kKernelBytes) return;
  tx_->producer_flags.fetch_or(kSendKernelBytes, std::memory_order_seq_cst);
  if (!kernel_bytes_reported_.exchange(true)) report_kernel_bytes("shm", true);
  if (!tx_open()) {
    owed_.store(true, std::memory_order_release);  // the flag waits in the region
    return;
  }
  static const char kByte = 1;
  me_->doorbells.fetch_add(1, std::memory_order_seq_cst);
  SocketNumber::Use sock(socket_);
  if (real().send(sock.fd(), &kByte, 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1)
    me_->doorbells.fetch_sub(1, std::memory_order_relaxed);
}

// The seq_cst fence between our store and the load of the peer's waiting
// count pairs with the fence in arm(): either the sleeper sees our store on
// its re-check, or we see its waiting count and ring. No lost wakeup.
int ShmChannel::publish(uint64_t head) {
  tx_->head.store(head, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  wake(tx_->consumer_sleepers.load(std::memory_order_relaxed));
  return 0;
}

int ShmChannel::grant(uint64_t consumed) {
  // A process that no longer owns the end read what it read before the
  // owner took over: its count is stale, and credits never go back.
  if (!owns()) return 0;
  rx_->consumed.store(consumed, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  wake(rx_->producer_sleepers.load(std::memory_order_relaxed));
  return 0;
}

void ShmChannel::signal(uint32_t flags) {
  if ((flags & kSendClosed) && !(flags & kSendReset))
    closed_clean_.store(true, std::memory_order_release);
  tx_->producer_flags.fetch_or(flags, std::memory_order_seq_cst);
  if (flags & kSendClosed) rx_->consumer_flags.fetch_or(kSendClosed, std::memory_order_seq_cst);
  ring_doorbell();
}

bool ShmChannel::peer_told_close() const {
  return ((rx_->producer_flags.load(std::memory_order_acquire) |
           tx_->consumer_flags.load(std::memory_order_acquire)) &
          kSendClosed) != 0;
}

PeerState ShmChannel::poll() {
  PeerState s;
  // Flags before totals: the peer stores its last head before it sets FIN
  // (or closes the socket), so loading FIN first (acquire) guarantees the
  // head loaded after it is final. The other order could pair a stale head
  // with FIN and report EOF with bytes still unread.
  const uint32_t carrier = carrier_flags_.load(std::memory_order_acquire);
  const uint32_t producer = rx_->producer_flags.load(std::memory_order_acquire);
  const uint32_t consumer = tx_->consumer_flags.load(std::memory_order_acquire);
  s.head = rx_->head.load(std::memory_order_acquire);
  // Bytes to read: their first line starts on its way from the peer's cpu
  // now, while the caller returns from its wait and calls recv, instead of
  // when the copy asks for it (one cache-line transfer less on the path of
  // a ping-pong). Only then: a waiter that fetched the line while the
  // peer still writes it would take it from under the peer's stores.
  const uint64_t at = me_->read.load(std::memory_order_relaxed);
  if (s.head != at) __builtin_prefetch(rx_ring_ + (at & (ring_bytes_ - 1)));
  s.consumed = tx_->consumed.load(std::memory_order_acquire);
  // The peer is giving our ring's pages back: a send waits until it is done
  // (begin_tx); each hold that ends is a new EPOLLOUT edge.
  const uint64_t trim = tx_->trim_seq.load(std::memory_order_acquire);
  if ((trim & (kTrimHeld | kTrimByProducer)) == kTrimHeld) s.flags |= kTxBlocked;
  s.tx_epoch = trim >> 2;
  if (producer & kSendFin) s.flags |= kPeerFin;
  if ((producer | consumer) & kSendClosed) s.flags |= kPeerClosed;
  if (producer & kSendReset) s.flags |= kPeerReset;
  if (sleepers::count(rx_->producer_sleepers.load(std::memory_order_relaxed)) != 0)
    s.flags |= kPeerStalled;
  if (__builtin_expect((producer & kSendKernelBytes) != 0, 0)) {
    s.flags |= kKernelBytes;
    if (!kernel_bytes_reported_.exchange(true)) report_kernel_bytes("shm", false);
  }
  s.flags |= carrier;
  return s;
}

bool ShmChannel::arm(uint32_t want, uint64_t sleep) {
  const uint64_t tok = sleepers::fit_token(sleep);
  if (want & kWantData) {
    armed_data_.fetch_add(1, std::memory_order_relaxed);
    sleepers::arm(rx_->consumer_sleepers, tok);
  }
  if (want & kWantSpace) {
    armed_space_.fetch_add(1, std::memory_order_relaxed);
    sleepers::arm(tx_->producer_sleepers, tok);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return false;  // consumes nothing
}

void ShmChannel::disarm(uint32_t want) {
  // Stopping at zero: a fork's child starts at zero (after_fork_child) and
  // may still disarm a sleep of its forking thread that began before.
  auto count_down = [](std::atomic<uint32_t>& a) {
    uint32_t v = a.load(std::memory_order_relaxed);
    while (v > 0 && !a.compare_exchange_weak(v, v - 1, std::memory_order_relaxed)) {
    }
  };
  if (want & kWantData) {
    sleepers::disarm(rx_->consumer_sleepers);
    count_down(armed_data_);
  }
  if (want & kWantSpace) {
    sleepers::disarm(tx_->producer_sleepers);
    count_down(armed_space_);
  }
  // Pairs with the fence in publish()/grant(): a waker that still read our
  // token (and skipped its doorbell, ring/sleepers.h) stored before it, so
  // the caller's look after this sees that store.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

uint64_t ShmChannel::nonce() const { return static_cast<const RegionHeader*>(map_)->nonce; }

ShmPositions ShmChannel::positions() const {
  ShmPositions p;
  p.tx_head = tx_->head.load(std::memory_order_acquire);
  p.tx_credited = tx_->consumed.load(std::memory_order_acquire);
  // What the application read, exactly (credits may lag, and the owner
  // may be another process).
  p.rx_granted = std::max(rx_->consumed.load(std::memory_order_acquire),
                          me_->read.load(std::memory_order_acquire));
  p.fin_sent = (tx_->producer_flags.load(std::memory_order_acquire) & kSendFin) != 0;
  return p;
}

void ShmChannel::local_armed(uint32_t* data, uint32_t* space) const {
  *data = armed_data_.load(std::memory_order_relaxed);
  *space = armed_space_.load(std::memory_order_relaxed);
}

// Stopping at zero (sleepers::disarm): a count too high costs the peer a
// spare doorbell, one too low could cost another holder its wakeup.
void ShmChannel::forget_waiters(uint32_t data, uint32_t space) {
  sleepers::disarm(rx_->consumer_sleepers, data);
  sleepers::disarm(tx_->producer_sleepers, space);
}

void ShmChannel::add_holder() {
  sole_ = false;
  holders_->fetch_add(1, std::memory_order_relaxed);
}

bool ShmChannel::drop_holder() {
  // Another holder need not wait for us to take the end over.
  if (epoch_ != 0) owner_release(own_, epoch_);
  const bool last = holders_->fetch_sub(1, std::memory_order_acq_rel) == 1;
  dropped_last_ = last;
  return last;
}

bool ShmChannel::drop_holder_unless_last() {
  uint32_t cur = holders_->load(std::memory_order_acquire);
  while (cur > 1)
    if (holders_->compare_exchange_weak(cur, cur - 1, std::memory_order_acq_rel)) {
      if (epoch_ != 0) owner_release(own_, epoch_);
      return true;
    }
  return false;
}

// ------------------------------------------------------------ ownership --

bool ShmChannel::owns() const { return epoch_ != 0 && owner_owns(own_, epoch_); }

bool ShmChannel::needs_take_over() {
  if (epoch_ == 0) return true;  // never ours in this process (a fork's child)
  if (owner_owns(own_, epoch_)) return false;
  // Taken over by another process: ours again once that one let go of it
  // (closed its copy, exited, or died), else our calls fail (enter).
  return owner_free(own_);
}

int ShmChannel::take_over(EndPositions* at) {
  // The previous owner's operations are a copy and a store each: it leaves
  // them at once unless it is stopped (SIGSTOP, a debugger).
  uint64_t e = 0;
  if (owner_fence(own_, monotonic_ms() + 10000, &e) != 0) {
    LOG_WARN("shm connection: the process that used it last is stuck inside a call on it; "
             "resetting the connection");
    return -ECONNRESET;
  }
  epoch_ = e;
  // The previous owner's operations are over (owner_fence): a hold it left
  // on trim_seq is stale.
  release_stale_trims();
  lost_reported_.store(false, std::memory_order_relaxed);
  if (!counted_) {
    stats_connection(Path::kShm);
    counted_ = true;
  }
  // Exact positions: the previous owner published and recorded them inside
  // its bracket. Credits for what it read but did not grant yet go out
  // now, or a sender waiting for them would wait for ever.
  at->tx_sent = tx_->head.load(std::memory_order_acquire);
  at->tx_credited = tx_->consumed.load(std::memory_order_acquire);
  at->rx_consumed = std::max(rx_->consumed.load(std::memory_order_acquire),
                             me_->read.load(std::memory_order_acquire));
  at->fin_sent = (tx_->producer_flags.load(std::memory_order_acquire) & kSendFin) != 0;
  if (at->rx_consumed > rx_->consumed.load(std::memory_order_relaxed)) grant(at->rx_consumed);
  return 0;
}

int ShmChannel::enter() {
  // Alone (no other process holds the end, and the fork that would make one
  // waits for this call: Stream::quiesce), there is nobody to fence out:
  // two loads instead of two atomic read-modify-writes.
  if (epoch_ != 0 && holders_->load(std::memory_order_acquire) == 1 &&
      owner_owns(own_, epoch_))
    return 1;
  if (epoch_ != 0 && owner_enter(own_, epoch_)) return 0;
  if (epoch_ == 0) return -EAGAIN;  // take_over() comes first
  if (!lost_reported_.exchange(true)) {
    stats_reset_connection(
        Reset::kTakenOver, kLogWarn,
        "shm connection taken over by another process that holds it (a fork's child or an "
        "exec'd program that used it): calls on it in this process fail with ECONNRESET "
        "until that process lets go of it");
  }
  return -ECONNRESET;
}

void ShmChannel::leave() { owner_leave(own_); }

void ShmChannel::after_fork_child() {
  // The end stays the parent's: the child's first operation takes it over.
  epoch_ = 0;
  lost_reported_.store(false, std::memory_order_relaxed);
  counted_ = false;
  // The arms counted here are the parent's sleeping threads': none of them
  // is in this process, and an exec here would hand them to the new image,
  // which takes its old image's sleepers back (exec_handoff.cpp), so the
  // parent's would sleep through their doorbells.
  armed_data_.store(0, std::memory_order_relaxed);
  armed_space_.store(0, std::memory_order_relaxed);
}

bool ShmChannel::leave_wakeups() {
  wakeups_left_.store(true, std::memory_order_relaxed);
  return true;
}

bool ShmChannel::drain_left_wakeups() {
  return wakeups_left_.load(std::memory_order_relaxed) && drain_wakeups();
}

bool ShmChannel::drain_wakeups() {
  // The peer's prefix is the stream's to read.
  if (!rx_open()) return false;
  wakeups_left_.store(false, std::memory_order_relaxed);
  char buf[1024];
  uint64_t took = 0;
  int err = 0;
  bool eof = false;
  {
    SocketNumber::Use sock(socket_);
    for (;;) {
      ssize_t n = real().recv(sock.fd(), buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        took += static_cast<uint64_t>(n);
        // A peer that keeps ringing must not hold the caller here: what is
        // left keeps the socket readable, and the next drain takes it.
        if (took >= kDrainMaxBytes) {
          wakeups_left_.store(true, std::memory_order_relaxed);
          break;
        }
        continue;
      }
      if (n == 0)
        eof = true;
      else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        err = errno;
      break;
    }
  }
  if (took > 0) {
    // Every doorbell was counted before it was sent, so a total drained
    // above the peer's count (loaded after our recv) is foreign.
    const uint64_t drained = me_->drained.fetch_add(took, std::memory_order_acq_rel) + took;
    if (drained > peer_->doorbells.load(std::memory_order_acquire)) kernel_bytes_seen();
  }
  // The peer's kernel socket closed (EOF), or reset us: its doorbell bytes
  // or ours sat unread there, or it asked for a reset, or it died. Which of
  // those the application sees (a FIN or a reset) the stream decides from
  // the peer's flags and its unread bytes; any other error breaks the
  // carrier.
  if (eof || err == ECONNRESET || err == EPIPE)
    peer_gone(kPeerClosed);
  else if (err != 0)
    peer_gone(kPeerClosed | kTransportError);
  // Doorbells taken (and an error, which recv() reports once) were other
  // sleepers' wakeups too; an EOF stays readable for them.
  return took > 0 || err != 0;
}

void ShmChannel::probe() {
  // Before the peer's prefix is read, the stream reads the socket itself,
  // and learns of its end from it.
  if (!rx_open()) return;
  // One system call in the usual case: a quiet socket (nothing queued, no
  // FIN, no error) is an open carrier with no foreign byte on it.
  SocketNumber::Use sock(socket_);
  pollfd pfd = {sock.fd(), POLLIN | POLLRDHUP, 0};
  if (real().poll(&pfd, 1, 0) == 0) return;
  CarrierInfo ci;
  if (carrier_info(sock.fd(), &ci) != 0) return;
  if (!ci.open) peer_gone(kPeerClosed);
  // What was drained and what still waits, against the doorbells the peer
  // counted before sending them. Loaded in this order, a concurrent drain
  // can only make the sum smaller (never a false alarm), and every doorbell
  // among the bytes is in the count loaded last. (tcpi_bytes_received
  // would do without SIOCINQ, but TCP_INFO reads the state before the
  // counters, so a FIN processed in between looks like a foreign byte.)
  const uint64_t drained = me_->drained.load(std::memory_order_acquire);
  const uint64_t queued = carrier_unread(sock.fd());
  if (drained + queued > peer_->doorbells.load(std::memory_order_acquire)) kernel_bytes_seen();
}

uint64_t ShmChannel::peer_read_total() {
  return std::max(peer_->read.load(std::memory_order_acquire),
                  tx_->consumed.load(std::memory_order_acquire));
}

void ShmChannel::note_read(uint64_t total) { me_->read.store(total, std::memory_order_release); }

}  // namespace rsock
