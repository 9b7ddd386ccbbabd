// Same-host discovery and pairing (see rendezvous.h, docs/protocol.md).
#include "transport/shm/rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/own_fd.h"
#include "common/real.h"
#include "ring/handshake.h"
#include "stats/stats.h"
#include "transport/addr.h"
#include "transport/shm/possession.h"
#include "transport/shm/region_cache.h"
#include "transport/shm/shm_channel.h"

namespace rsock {
namespace {

void hex_addr(const WireAddr& a, char out[33]) {
  for (int i = 0; i < 16; ++i) snprintf(out + 2 * i, 3, "%02x", a.addr[i]);
}

socklen_t abstract_addr(const char* name, sockaddr_un* un) {
  memset(un, 0, sizeof *un);
  un->sun_family = AF_UNIX;
  size_t n = strnlen(name, sizeof un->sun_path - 2);
  memcpy(un->sun_path + 1, name, n);  // sun_path[0] == 0: abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

void listener_name(const WireAddr* addr, uint16_t port, char* out, size_t cap) {
  if (addr == nullptr) {
    snprintf(out, cap, "rsock/L/*/%u", port);
    return;
  }
  char hex[33];
  hex_addr(*addr, hex);
  snprintf(out, cap, "rsock/L/%s/%u", hex, port);
}

void client_name(const WireAddr& dst, uint16_t src_port, char* out, size_t cap) {
  char hex[33];
  hex_addr(dst, hex);
  snprintf(out, cap, "rsock/C/%s/%u/%u", hex, dst.port, src_port);
}

bool is_wildcard(const WireAddr& a) {
  static const uint8_t kZero[16] = {};
  static const uint8_t kMappedZero[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0, 0, 0};
  return memcmp(a.addr, kZero, 16) == 0 || memcmp(a.addr, kMappedZero, 16) == 0;
}

// Waits until fd is readable; returns 1, 0 on timeout, or a negative errno.
int wait_readable(int fd, int64_t deadline_ms) {
  for (;;) {
    int64_t left = deadline_ms - monotonic_ms();
    if (left < 0) left = 0;
    pollfd p = {fd, POLLIN, 0};
    int rc = real().poll(&p, 1, static_cast<int>(left));
    if (rc > 0) return 1;
    if (rc == 0) return 0;
    if (errno != EINTR) return -errno;
  }
}

int send_msg(int fd, const void* msg, size_t len, const int* fds, int nfds) {
  iovec iov = {const_cast<void*>(msg), len};
  alignas(cmsghdr) char ctl[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr mh = {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (nfds > 0) {
    mh.msg_control = ctl;
    mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  ssize_t n = real().sendmsg(fd, &mh, MSG_NOSIGNAL);
  return n == static_cast<ssize_t>(len) ? 0 : (n < 0 ? -errno : -EPROTO);
}

// Receives one message (at most cap bytes) with up to max_fds fds, without
// waiting. Returns its length (0: the peer closed), -EAGAIN when none is
// there, or another negative errno; *nfds receives the number of fds taken.
// Every fd beyond max_fds, and every fd of a truncated message, is closed.
// The fds are lifted above the application's (own_fd.h) only when `keep`:
// a proof lives for an fstat and its close, and lifting it would cost two
// system calls more than its whole life.
ssize_t recv_msg(int fd, void* msg, size_t cap, int* fds, int max_fds, int* nfds,
                 bool keep = false) {
  *nfds = 0;
  iovec iov = {msg, cap};
  alignas(cmsghdr) char ctl[CMSG_SPACE(4 * sizeof(int))];
  msghdr mh = {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  ssize_t n = real().recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  int got = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < count; ++i) {
      int f;
      memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
      if (got < max_fds)
        fds[got++] = keep ? lift_fd(f) : f;
      else
        real().close(f);
    }
  }
  if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    for (int i = 0; i < got; ++i) real().close(fds[i]);
    return -EPROTO;
  }
  *nfds = got;
  return n;
}

void close_fds(int* fds, int n) {
  for (int i = 0; i < n; ++i) real().close(fds[i]);
}

// The peer closed its end of the pairing connection (EOF, or a failed send
// or receive because it is gone)?
bool peer_gone(ssize_t rc) { return rc == 0 || rc == -ECONNRESET || rc == -EPIPE; }

// Why a pairing ends when its peer leaves before it finished. A librsock
// peer leaves in the middle only when its own deadline passed (a check
// that fails on its side ends with a decline or its own logged reason), so
// this side records that as a timeout too: the pairing did not complete in
// time. Anything else that breaks the exchange is a failure.
Fallback when_peer_left(ssize_t rc) {
  return peer_gone(rc) ? Fallback::kPairTimeout : Fallback::kPairFailed;
}

// A private, close-on-exec dup of the connection's socket: the doorbell fd
// outlives the application's own fd numbering (dup2, close of one of two).
int private_dup(int fd) { return dup_high(fd); }

// How long either side gives a pairing: the server's side of one that runs
// on TCP meanwhile (RSOCK_TCP_FIRST) starts pair_delay_ms after accept().
int64_t pairing_bound_ms(const Config& cfg) {
  return int64_t{cfg.connect_timeout_ms} + (cfg.tcp_first ? cfg.pair_delay_ms : 0);
}

std::mutex g_cache_mu;
struct CacheEntry {
  WireAddr addr;
  int64_t until_ms;
};
CacheEntry g_cache[64];
constexpr int64_t kNegativeCacheMs = 60000;

}  // namespace

int shm_advertise_listener(int listen_fd) {
  sockaddr_storage ss;
  socklen_t len = sizeof ss;
  WireAddr local;
  if (getsockname(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -errno;
  if (!to_wire(reinterpret_cast<sockaddr*>(&ss), &local)) return -EAFNOSUPPORT;
  char name[96];
  listener_name(is_wildcard(local) ? nullptr : &local, local.port, name, sizeof name);
  int fd = lift_fd(real().socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd < 0) return -errno;
  sockaddr_un un;
  socklen_t ulen = abstract_addr(name, &un);
  if (real().bind(fd, reinterpret_cast<sockaddr*>(&un), ulen) != 0) {
    int err = -errno;
    real().close(fd);
    // Another librsock process already advertises this port (SO_REUSEPORT
    // siblings, or a forked worker): its marker serves us too.
    return err;
  }
  return fd;
}

bool is_local_address(const sockaddr* dst) {
  WireAddr w;
  if (!to_wire(dst, &w)) return false;
  static const uint8_t kLoop6[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  const bool mapped = memcmp(w.addr, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0;
  if ((mapped && w.addr[12] == 127) || memcmp(w.addr, kLoop6, 16) == 0) return true;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* i = list; i && !found; i = i->ifa_next) {
    WireAddr a;
    if (i->ifa_addr && to_wire(i->ifa_addr, &a) && memcmp(a.addr, w.addr, 16) == 0) found = true;
  }
  freeifaddrs(list);
  return found;
}

bool shm_server_advertised(const sockaddr* dst) {
  WireAddr w;
  if (!to_wire(dst, &w)) return false;
  // Closed before we return: not worth lifting (own_fd.h).
  int fd = real().socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool found = false;
  for (int pass = 0; pass < 2 && !found; ++pass) {
    char name[96];
    listener_name(pass == 0 ? &w : nullptr, w.port, name, sizeof name);
    sockaddr_un un;
    socklen_t len = abstract_addr(name, &un);
    // connect() on a datagram socket only checks that the name is bound.
    found = real().connect(fd, reinterpret_cast<sockaddr*>(&un), len) == 0;
  }
  real().close(fd);
  return found;
}

int shm_client_prepare(int tcp_fd, const sockaddr* dst) {
  WireAddr d;
  if (!to_wire(dst, &d)) return -EAFNOSUPPORT;
  sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(tcp_fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -errno;
  WireAddr local;
  if (!to_wire(reinterpret_cast<sockaddr*>(&ss), &local)) return -EAFNOSUPPORT;
  if (local.port == 0) {
    // The rendezvous is named after our source port, which the server will
    // see; it must exist before the server can accept, so bind first.
    sockaddr_storage any = {};
    any.ss_family = ss.ss_family;
    socklen_t alen = ss.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (real().bind(tcp_fd, reinterpret_cast<sockaddr*>(&any), alen) != 0) return -errno;
    len = sizeof ss;
    if (getsockname(tcp_fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -errno;
    to_wire(reinterpret_cast<sockaddr*>(&ss), &local);
  }
  char name[96];
  client_name(d, local.port, name, sizeof name);
  int fd = lift_fd(real().socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (fd < 0) return -errno;
  sockaddr_un un;
  socklen_t ulen = abstract_addr(name, &un);
  if (real().bind(fd, reinterpret_cast<sockaddr*>(&un), ulen) != 0 || real().listen(fd, 16) != 0) {
    int err = -errno;
    real().close(fd);
    return err;
  }
  return fd;
}

namespace {

// ---------------------------------------------------------------- server --

// The server side (docs/protocol.md section 2): connect to the client's
// rendezvous, speak first with our proof, and send the region only after
// the client's proof. Stages wait only for the peer's next message.
class ShmServerPairing final : public Pairing {
 public:
  ShmServerPairing(int tcp_fd, const Config& cfg)
      : tcp_fd_(tcp_fd),
        ring_bytes_(cfg.ring_bytes),
        tcp_first_(cfg.tcp_first),
        own_file_(cfg.region_file_per_connection),
        deadline_(monotonic_ms() + pairing_bound_ms(cfg)) {
    region_cache_set_limit(cfg.region_cache);
  }
  ~ShmServerPairing() override {
    // The doorbell dup may be the connection's last holder (RSOCK_TCP_FIRST:
    // the application closed its fd meanwhile): its FIN goes before the
    // client finds the pairing connection closed, so that the client tells
    // a connection that ended from a pairing that timed out.
    if (doorbell_ >= 0) real().close(doorbell_);
    if (conn_ >= 0) real().close(conn_);
    // A place the client never heard of serves again at once; one it was
    // offered, once its end says it is done.
    if (map_) {
      arena_release(region_, map_len_, offered_ ? map_ : nullptr, true);
      munmap(map_, map_len_);
    }
  }

  bool run(int64_t limit_ms) override {
    while (stage_ != Stage::kDone) {
      const int64_t now = monotonic_ms();
      if (stage_ == Stage::kConnect && now >= deadline_) {
        // Too late to pair, but one look at the rendezvous still tells a
        // plain client (none: peer_not_accelerated) from one that is
        // waiting for us (pair_timeout); nothing is sent.
        connect_step(now, true);
        return true;
      }
      if (now >= deadline_) return timed_out();
      if (now >= limit_ms) return false;
      if (stage_ == Stage::kConnect) {
        connect_step(std::min(limit_ms, deadline_), false);
        continue;
      }
      int w = wait_readable(conn_, std::min(limit_ms, deadline_));
      if (w < 0) return finish(Fallback::kPairFailed);
      if (w == 0) continue;  // the limit or the deadline: decided above
      if (stage_ == Stage::kAwaitProof)
        on_proof();
      else
        on_answer();
    }
    return true;
  }

  bool driven() const override { return true; }
  int wait_fds(pollfd* out) override {
    if (stage_ != Stage::kAwaitProof && stage_ != Stage::kAwaitAnswer) return 0;
    out[0] = {conn_, POLLIN, 0};
    return 1;
  }
  int64_t wake_at_ms() const override {
    return stage_ == Stage::kConnect ? std::min(retry_at_, deadline_) : deadline_;
  }
  bool step() override {
    // A few passes at most: each either finishes, moves to the next stage
    // or finds nothing to do.
    for (int pass = 0; pass < 8 && stage_ != Stage::kDone; ++pass) {
      const int64_t now = monotonic_ms();
      if (stage_ == Stage::kConnect && now >= deadline_) {
        connect_step(now, true);
        return true;
      }
      if (now >= deadline_) return timed_out();
      if (stage_ == Stage::kConnect) {
        if (now < retry_at_) return false;
        if (!connect_step(now, false)) {
          retry_at_ = std::max(retry_at_, now + 1);  // a full backlog, or no rendezvous yet
          return false;
        }
        continue;
      }
      int w = wait_readable(conn_, 0);
      if (w < 0) return finish(Fallback::kPairFailed);
      if (w == 0) return false;
      if (stage_ == Stage::kAwaitProof)
        on_proof();
      else
        on_answer();
    }
    return stage_ == Stage::kDone;
  }
  void rebind(int tcp_fd) override { tcp_fd_ = tcp_fd; }
  std::unique_ptr<Channel> take_channel() override { return std::move(channel_); }
  Fallback why() const override { return why_; }

 private:
  enum class Stage { kConnect, kAwaitProof, kAwaitAnswer, kDone };
  static constexpr int64_t kMaxRefusedPauseMs = 64;

  bool finish(Fallback why) {
    why_ = why;
    stage_ = Stage::kDone;
    if (conn_ >= 0) real().close(conn_);
    conn_ = -1;
    return true;
  }

  // Once the offer is out the client may commit (its answer sent) at any
  // moment: what it answered decides, as at our deadline.
  bool settle() override {
    if (stage_ != Stage::kAwaitAnswer) return false;
    timed_out();
    return true;
  }

  bool timed_out() {
    if (stage_ == Stage::kAwaitAnswer) {
      // The client commits once its answer is sent, and a sent answer is
      // already in our socket (AF_UNIX delivers at send time). Shutting our
      // reading side first makes any later answer fail in the client's
      // send (EPIPE), so it cannot commit after we look: what we read now
      // decides for both ends, and no connection has to be failed.
      real().shutdown(conn_, SHUT_RD);
      on_answer();
      if (channel_) return true;
    }
    return finish(Fallback::kPairTimeout);
  }

  // late: the deadline has passed; only find out whether the client waits.
  // false: the rendezvous's backlog is full, or (RSOCK_TCP_FIRST) it is not
  // there yet: try again (after a pause before `until`; retry_at_ says when).
  bool connect_step(int64_t until, bool late) {
    if (!have_ends_ && !(have_ends_ = fd_addrs(tcp_fd_, &ends_[0], &ends_[1]))) {
      finish(Fallback::kPairFailed);
      return true;
    }
    const WireAddr& local = ends_[0];
    const WireAddr& peer = ends_[1];
    if (conn_ < 0)
      conn_ = lift_fd(real().socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (conn_ < 0) {
      finish(Fallback::kResources);
      return true;
    }
    char name[96];
    client_name(local, peer.port, name, sizeof name);
    sockaddr_un un;
    socklen_t ulen = abstract_addr(name, &un);
    if (real().connect(conn_, reinterpret_cast<sockaddr*>(&un), ulen) != 0) {
      if (errno == EAGAIN && late) {
        finish(Fallback::kPairTimeout);
        return true;
      }
      if (errno == EAGAIN) {
        // The rendezvous's backlog is full (a flood): its owner drains it.
        const int64_t left = until - monotonic_ms();
        if (left > 0) usleep(static_cast<useconds_t>(std::min<int64_t>(left, 1) * 1000));
        return false;
      }
      // A client whose connection runs on TCP meanwhile makes its
      // rendezvous only when its own delay has passed (it began before
      // ours, but its driver may be late): looked for again, less and less
      // often, until the deadline decides.
      if (tcp_first_ && !late && (errno == ECONNREFUSED || errno == ENOENT)) {
        refused_pause_ms_ = std::clamp<int64_t>(2 * refused_pause_ms_, 1, kMaxRefusedPauseMs);
        retry_at_ = monotonic_ms() + refused_pause_ms_;
        const int64_t pause = std::min(retry_at_, until) - monotonic_ms();
        if (pause > 0) usleep(static_cast<useconds_t>(pause * 1000));
        return false;
      }
      // No rendezvous: a client without librsock (or one that gave up).
      finish(errno == ECONNREFUSED || errno == ENOENT ? Fallback::kPeerNotAccelerated
                                                      : Fallback::kPairFailed);
      return true;
    }
    if (late) {
      finish(Fallback::kPairTimeout);
      return true;
    }
    // Whoever holds the name must be the user who owns the client's socket:
    // a squatter of another user is turned away before it can stall us.
    ucred cred = {};
    socklen_t clen = sizeof cred;
    int rc = peer_socket_of(local, peer, &client_);
    if (rc != 0 || real().getsockopt(conn_, SOL_SOCKET, SO_PEERCRED, &cred, &clen) != 0) {
      finish(Fallback::kPairFailed);
      return true;
    }
    peer_.pid = cred.pid;
    if (cred.uid != client_.uid) {
      stats_reject(Reject::kUnproven, kLogInfo,
                   "shm pairing: the client's rendezvous is held by uid %u (pid %d), its "
                   "connection by uid %u: not pairing",
                   cred.uid, static_cast<int>(cred.pid), client_.uid);
      finish(Fallback::kPeerUnproven);
      return true;
    }
    int proof = possession_proof(tcp_fd_);
    if (proof < 0) {
      finish(Fallback::kResources);
      return true;
    }
    HelloMsg hello = {static_cast<uint32_t>(MsgType::kHello), kHandshakeVersion, 0};
    rc = send_msg(conn_, &hello, sizeof hello, &proof, 1);
    real().close(proof);
    if (rc != 0) {
      finish(when_peer_left(rc));  // (the client closes its rendezvous at its deadline)
      return true;
    }
    stage_ = Stage::kAwaitProof;
    return true;
  }

  void on_proof() {
    HelloMsg m;
    int fd = -1, nfds = 0;
    ssize_t n = recv_msg(conn_, &m, sizeof m, &fd, 1, &nfds);
    if (n == -EAGAIN) return;
    const bool proven = n > 0 && decode_hello(&m, static_cast<size_t>(n), MsgType::kProof) &&
                        nfds == 1 && proof_names(fd, client_.inode, tcp_fd_);
    close_fds(&fd, nfds);
    if (n <= 0) {
      finish(when_peer_left(n));  // the client went away
      return;
    }
    if (!proven) {
      stats_reject(Reject::kUnproven, kLogInfo,
                   "shm pairing: the client's rendezvous did not prove it holds the connection");
      finish(Fallback::kPeerUnproven);
      return;
    }
    while (getrandom(&nonce_, sizeof nonce_, 0) != sizeof nonce_) {
    }
    // The process that proved itself: the pid the kernel gave for the
    // rendezvous's owner and its token. A region kept from our last
    // connection with it serves, else a new one. A region asked to be in a
    // file of its own (RSOCK_REGION_FILE=connection here, or a client that
    // proved itself without a token) is placed and kept for nobody.
    peer_.token = own_file_ ? 0 : m.token;
    reused_ = region_cache_take(peer_, ring_bytes_, nonce_, &region_, &map_, &map_len_);
    int rc = 0;
    if (reused_)
      stats_region(true);
    else
      rc = shm_region_place(peer_, ring_bytes_, nonce_, &region_, &map_, &map_len_);
    if (rc < 0 || (doorbell_ = private_dup(tcp_fd_)) < 0) {
      finish(Fallback::kResources);
      return;
    }
    // Unless the connection runs on TCP meanwhile (RSOCK_TCP_FIRST), no
    // byte of ours has passed yet: the fd's data calls wait for this
    // pairing, and our end starts on the ring. The client marks its own.
    if (!tcp_first_) shm_region_end_on_ring(map_, true);
    OfferMsg offer = {};
    offer.type = static_cast<uint32_t>(MsgType::kOffer);
    offer.version = kHandshakeVersion;
    offer.nonce = nonce_;
    offer.ring_bytes = ring_bytes_;
    offer.region_bytes = map_len_;
    offer.region_offset = region_.offset;
    offer.server = ends_[0];
    offer.client = ends_[1];
    offered_ = true;
    int file = arena_fd(region_.arena);
    if (rc = send_msg(conn_, &offer, sizeof offer, &file, 1); rc != 0) {
      finish(when_peer_left(rc));
      return;
    }
    stage_ = Stage::kAwaitAnswer;
  }

  void on_answer() {
    AnswerMsg a;
    int nfds = 0;
    ssize_t n = recv_msg(conn_, &a, sizeof a, nullptr, 0, &nfds);
    if (n == -EAGAIN) return;
    if (n > 0 && decode_answer_accepts(&a, static_cast<size_t>(n), nonce_)) {
      auto ch =
          std::make_unique<ShmChannel>(map_, map_len_, true, doorbell_, region_, ends_, reused_);
      ch->keep_region_for(peer_);
      channel_ = std::move(ch);
      map_ = nullptr;  // the channel holds the place and the mapping
      doorbell_ = -1;
      finish(Fallback::kPairFailed);  // (not a fallback: the channel is taken)
      return;
    }
    // Declined (the offer failed the client's checks), or the client went
    // away before committing (its deadline passed; after our SHUT_RD at
    // ours, an empty queue reads as EOF): both on TCP.
    finish(n > 0 ? Fallback::kPairFailed : when_peer_left(n));
  }

  int tcp_fd_;
  const size_t ring_bytes_;
  const bool tcp_first_;
  const bool own_file_;  // RSOCK_REGION_FILE=connection
  const int64_t deadline_;
  WireAddr ends_[2] = {};  // the connection's local and peer address
  bool have_ends_ = false;
  Stage stage_ = Stage::kConnect;
  int64_t retry_at_ = 0;          // step(): when the rendezvous is tried again
  int64_t refused_pause_ms_ = 0;  // RSOCK_TCP_FIRST: the last pause after a refusal
  int conn_ = -1;
  PeerSocket client_;  // the client's TCP socket, from sock_diag
  RegionPeer peer_;    // the client's process
  uint64_t nonce_ = 0;
  RegionRef region_;  // the region's place, while map_ is set
  bool offered_ = false;
  void* map_ = nullptr;
  size_t map_len_ = 0;
  bool reused_ = false;  // a region kept from our last connection with this process
  int doorbell_ = -1;
  std::unique_ptr<Channel> channel_;
  Fallback why_ = Fallback::kPairFailed;
};

// ---------------------------------------------------------------- client --

// The client side: among the processes that connect to our rendezvous,
// answer only the one that proves it holds the other end of our TCP
// connection (anyone can connect to an abstract name). Unproven connectors
// neither learn anything nor hold up the real server: each is read without
// waiting, and at most kMaxCandidates are kept (the oldest silent one goes
// first when more arrive).
class ShmClientPairing final : public Pairing {
 public:
  ShmClientPairing(int tcp_fd, int rendezvous_fd, const Config& cfg)
      : tcp_fd_(tcp_fd),
        listener_(rendezvous_fd),
        tcp_first_(cfg.tcp_first),
        own_file_(cfg.region_file_per_connection),
        deadline_(monotonic_ms() + pairing_bound_ms(cfg)) {
    region_cache_set_limit(cfg.region_cache);
  }
  ~ShmClientPairing() override {
    close_listener();
    release_all();
    if (server_ >= 0) real().close(server_);
  }

  bool run(int64_t limit_ms) override {
    while (!done_) {
      const int64_t now = monotonic_ms();
      if (now >= deadline_) return finish(Fallback::kPairTimeout);
      if (now >= limit_ms) return false;
      const int64_t until = std::min(limit_ms, deadline_);
      if (server_ < 0) {
        Fallback why;
        bool idle = false;
        if (!look_for_server(until, &why, &idle)) return finish(why);
        continue;
      }
      int w = wait_readable(server_, until);
      if (w < 0) return finish(Fallback::kPairFailed);
      if (w > 0) on_offer();
    }
    return true;
  }

  bool driven() const override { return true; }
  int wait_fds(pollfd* out) override {
    if (done_) return 0;
    if (server_ >= 0) {
      out[0] = {server_, POLLIN, 0};
      return 1;
    }
    int n = 0;
    if (candidates_.size() < kMaxCandidates) out[n++] = {listener_, POLLIN, 0};
    for (const Candidate& c : candidates_) out[n++] = {c.fd, POLLIN, 0};
    return n;
  }
  int64_t wake_at_ms() const override {
    // A full house frees a slot once its oldest connector has been silent
    // for kSilentGraceMs.
    if (server_ < 0 && candidates_.size() == kMaxCandidates)
      return std::min(deadline_, candidates_[0].since_ms + kSilentGraceMs + 1);
    return deadline_;
  }
  bool step() override {
    for (int pass = 0; pass < 8 && !done_; ++pass) {
      const int64_t now = monotonic_ms();
      if (now >= deadline_) return finish(Fallback::kPairTimeout);
      if (server_ < 0) {
        Fallback why;
        bool idle = false;
        if (!look_for_server(now, &why, &idle)) return finish(why);
        if (idle) return false;
        continue;
      }
      int w = wait_readable(server_, 0);
      if (w < 0) return finish(Fallback::kPairFailed);
      if (w == 0) return false;
      on_offer();
    }
    return done_;
  }
  void rebind(int tcp_fd) override { tcp_fd_ = tcp_fd; }
  std::unique_ptr<Channel> take_channel() override { return std::move(channel_); }
  Fallback why() const override { return why_; }

 private:
  static constexpr size_t kMaxCandidates = 8;
  static constexpr int64_t kSilentGraceMs = 50;

  struct Candidate {
    int fd;
    int64_t since_ms;  // accepted at
  };

  bool finish(Fallback why) {
    why_ = why;
    done_ = true;
    // Closing the rendezvous now means a server that is late gets
    // ECONNREFUSED (or its connection reset) and falls back too: both ends
    // always agree. A connector not heard from yet may be that server:
    // it is not counted as an intruder.
    close_listener();
    release_all();
    return true;
  }

  void close_listener() {
    if (listener_ >= 0) real().close(listener_);
    listener_ = -1;
  }

  // Only the server has a reason to connect to our rendezvous: every other
  // connector we accepted counts as turned away, whatever it sent.
  void drop(size_t i) {
    real().close(candidates_[i].fd);
    candidates_.erase(candidates_.begin() + static_cast<ptrdiff_t>(i));
    stats_reject(Reject::kUnproven, kLogDebug,
                 "shm pairing: a connector to our rendezvous that is not the server dropped");
  }
  void drop_all() {
    while (!candidates_.empty()) drop(candidates_.size() - 1);
  }
  // Closes the connectors without judging them.
  void release_all() {
    for (const Candidate& c : candidates_) real().close(c.fd);
    candidates_.clear();
  }

  // Waits for connectors and their hellos until `until` (not at all when it
  // has passed). false: the pairing ends (*why). *idle: nothing came.
  bool look_for_server(int64_t until, Fallback* why, bool* idle) {
    // A full house leaves further connectors in the kernel's backlog (a
    // server there retries); a slot frees when a connector that has been
    // silent for kSilentGraceMs is dropped. A real server sends its hello
    // right after it connects, so only intruders are dropped that way.
    const int64_t now = monotonic_ms();
    while (candidates_.size() == kMaxCandidates && now - candidates_[0].since_ms > kSilentGraceMs)
      drop(0);
    const bool room = candidates_.size() < kMaxCandidates;
    pollfd p[1 + kMaxCandidates];
    size_t n = 0;
    p[n++] = {room ? listener_ : -1, POLLIN, 0};
    for (const Candidate& c : candidates_) p[n++] = {c.fd, POLLIN, 0};
    int64_t left = until - now;
    if (!room) left = std::min(left, candidates_[0].since_ms + kSilentGraceMs + 1 - now);
    int rc = real().poll(p, static_cast<nfds_t>(n), static_cast<int>(left < 0 ? 0 : left));
    if (rc < 0) {
      *why = Fallback::kPairFailed;
      *idle = true;
      return errno == EINTR;
    }
    *idle = rc == 0;
    for (size_t i = n - 1; i >= 1; --i) {
      if (!p[i].revents) continue;
      switch (check_hello(candidates_[i - 1].fd)) {
        case Hello::kNone:
          break;
        case Hello::kGone:
          // Closed without a word: a server that gave up, or anyone.
          real().close(candidates_[i - 1].fd);
          candidates_.erase(candidates_.begin() + static_cast<ptrdiff_t>(i - 1));
          break;
        case Hello::kUnproven:
          LOG_INFO("shm pairing: a process that does not hold the connection tried to pair");
          drop(i - 1);
          break;
        case Hello::kProven:
          server_ = candidates_[i - 1].fd;
          candidates_.erase(candidates_.begin() + static_cast<ptrdiff_t>(i - 1));
          return answer_server(why);
      }
    }
    if (p[0].revents) {
      while (candidates_.size() < kMaxCandidates) {
        int c = lift_fd(real().accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (c < 0) break;
        candidates_.push_back({c, monotonic_ms()});
      }
    }
    return true;
  }

  enum class Hello { kNone, kGone, kUnproven, kProven };

  Hello check_hello(int c) {
    HelloMsg m;
    int fd = -1, nfds = 0;
    ssize_t n = recv_msg(c, &m, sizeof m, &fd, 1, &nfds);
    if (n == -EAGAIN) return Hello::kNone;
    if (n == 0 || (n < 0 && n != -EPROTO)) return Hello::kGone;
    // The server's accepted socket: the other end of our connection. Right
    // after connect() it may not exist yet (the server's kernel is still
    // turning the handshake into a socket): then this hello cannot be the
    // server's (it accepts before it connects here), and we look again for
    // the next one.
    if (server_sock_.inode == 0 &&
        (!ends() || peer_socket_of(ends_[0], ends_[1], &server_sock_) != 0)) {
      server_sock_.inode = 0;
      // Or it is gone already: the server accepted, spoke and closed the
      // connection (its application did, while the pairing ran in the
      // background). That hello can no longer be checked, but it was no
      // intruder's: it is not counted.
      pollfd p = {tcp_fd_, POLLRDHUP, 0};
      if (real().poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
        close_fds(&fd, nfds);
        return Hello::kGone;
      }
    }
    const bool proven = n > 0 && decode_hello(&m, static_cast<size_t>(n), MsgType::kHello) &&
                        nfds == 1 && proof_names(fd, server_sock_.inode, tcp_fd_);
    close_fds(&fd, nfds);
    return proven ? Hello::kProven : Hello::kUnproven;
  }

  // The server proved itself: the others go (whoever they are, they are
  // not our server), and we prove ourselves.
  bool answer_server(Fallback* why) {
    drop_all();
    close_listener();
    int proof = possession_proof(tcp_fd_);
    if (proof < 0) {
      *why = Fallback::kResources;
      return false;
    }
    // Without a token (RSOCK_REGION_FILE=connection, or a server process
    // we cannot name) the server places our region in a file of its own.
    // A token is this server's alone (region_token_for).
    uint64_t token = 0;
    ucred cred = {};
    socklen_t clen = sizeof cred;
    if (!own_file_ && real().getsockopt(server_, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0)
      token = region_token_for(cred.pid);
    HelloMsg m = {static_cast<uint32_t>(MsgType::kProof), kHandshakeVersion, token};
    int rc = send_msg(server_, &m, sizeof m, &proof, 1);
    real().close(proof);
    *why = when_peer_left(rc);  // (the server closes its end at its deadline)
    return rc == 0;
  }

  void on_offer() {
    OfferMsg offer;
    int memfd = -1, nfds = 0;
    ssize_t n = recv_msg(server_, &offer, sizeof offer, &memfd, 1, &nfds, true);
    if (n == -EAGAIN) return;
    void* map = nullptr;
    RegionFile file;
    bool reused = false;
    const bool ok = n > 0 && decode_offer(&offer, static_cast<size_t>(n), &offer) && nfds == 1 &&
                    ends() && same_wire(offer.client, ends_[0]) &&
                    same_wire(offer.server, ends_[1]) &&
                    shm_region_attach(memfd, offer.region_offset, offer.region_bytes, offer.nonce,
                                      offer.ring_bytes, &map, &file, &reused) == 0;
    if (!ok) {
      close_fds(&memfd, nfds);
      if (n <= 0) {
        finish(when_peer_left(n));  // the server gave up
        return;
      }
      LOG_WARN("shm pairing: rejected an offer that failed verification");
      AnswerMsg decline = {static_cast<uint32_t>(MsgType::kAnswer),
                           static_cast<uint32_t>(AnswerCode::kDecline), offer.nonce};
      send_msg(server_, &decline, sizeof decline, nullptr, 0);  // best effort
      finish(Fallback::kPairFailed);
      return;
    }
    int doorbell = private_dup(tcp_fd_);
    // As the server's (on_proof): our end starts on the ring unless the
    // connection runs on TCP meanwhile.
    if (!tcp_first_) shm_region_end_on_ring(map, false);
    AnswerMsg ans = {static_cast<uint32_t>(MsgType::kAnswer),
                     static_cast<uint32_t>(AnswerCode::kAccept), offer.nonce};
    if (doorbell >= 0 && send_msg(server_, &ans, sizeof ans, nullptr, 0) == 0) {
      // Committed: the server switches when it reads this answer. The
      // channel holds the file (exec hand-off, pages given back): one
      // descriptor for every region this process maps from it.
      const RegionRef region = arena_adopt(memfd, offer.region_offset);
      auto ch = std::make_unique<ShmChannel>(map, offer.region_bytes, false, doorbell, region,
                                             ends_, reused);
      ch->keep_mapping_of(file);
      channel_ = std::move(ch);
      finish(Fallback::kPairFailed);  // (not a fallback: the channel is taken)
      return;
    }
    // No doorbell, or the server stopped reading (it timed out): not
    // committed, both ends on TCP.
    real().close(memfd);
    munmap(map, offer.region_bytes);
    if (doorbell < 0) {
      finish(Fallback::kResources);
      return;
    }
    real().close(doorbell);
    finish(Fallback::kPairTimeout);
  }

  int tcp_fd_;
  int listener_;
  const bool tcp_first_;
  const bool own_file_;  // RSOCK_REGION_FILE=connection
  const int64_t deadline_;
  WireAddr ends_[2] = {};  // the connection's local and peer address
  bool have_ends_ = false;

  // The connection's addresses, asked of the kernel once.
  bool ends() { return have_ends_ || (have_ends_ = fd_addrs(tcp_fd_, &ends_[0], &ends_[1])); }
  std::vector<Candidate> candidates_;  // connectors not yet proven, oldest first
  int server_ = -1;              // the proven server
  PeerSocket server_sock_;
  bool done_ = false;
  std::unique_ptr<Channel> channel_;
  Fallback why_ = Fallback::kPairFailed;
};

}  // namespace

std::unique_ptr<Pairing> shm_client_pairing(int tcp_fd, int rendezvous_fd, const Config& cfg) {
  return std::make_unique<ShmClientPairing>(tcp_fd, rendezvous_fd, cfg);
}

std::unique_ptr<Pairing> shm_server_pairing(int tcp_fd, const Config& cfg) {
  return std::make_unique<ShmServerPairing>(tcp_fd, cfg);
}

bool negative_cache_hit(const sockaddr* dst) {
  WireAddr w;
  if (!to_wire(dst, &w)) return false;
  const int64_t now = monotonic_ms();
  std::lock_guard<std::mutex> lock(g_cache_mu);
  for (auto& e : g_cache)
    if (e.until_ms > now && same_wire(e.addr, w)) return true;
  return false;
}

void negative_cache_add(const sockaddr* dst) {
  WireAddr w;
  if (!to_wire(dst, &w)) return;
  const int64_t now = monotonic_ms();
  std::lock_guard<std::mutex> lock(g_cache_mu);
  CacheEntry* slot = &g_cache[0];
  for (auto& e : g_cache) {
    if (same_wire(e.addr, w) || e.until_ms < slot->until_ms) slot = &e;
    if (same_wire(e.addr, w)) break;
  }
  slot->addr = w;
  slot->until_ms = now + kNegativeCacheMs;
}

}  // namespace rsock
