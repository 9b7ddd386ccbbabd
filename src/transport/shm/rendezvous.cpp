// Same-host discovery and pairing (see rendezvous.h, docs/protocol.md).
#include "transport/shm/rendezvous.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <mutex>

#include "common/log.h"
#include "common/real.h"
#include "ring/wire.h"
#include "transport/addr.h"
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

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// Waits until fd is readable; returns 1, 0 on timeout, or a negative errno.
int wait_readable(int fd, int64_t deadline_ms) {
  for (;;) {
    int64_t left = deadline_ms - now_ms();
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

// Receives one message of exactly `len` bytes with up to `max_fds` fds.
// Returns the number of fds received or a negative errno; every received
// fd beyond max_fds, or any fd on failure, is closed.
int recv_msg(int fd, void* msg, size_t len, int* fds, int max_fds, int64_t deadline_ms) {
  int w = wait_readable(fd, deadline_ms);
  if (w <= 0) return w == 0 ? -ETIMEDOUT : w;
  iovec iov = {msg, len};
  alignas(cmsghdr) char ctl[CMSG_SPACE(4 * sizeof(int))];
  msghdr mh = {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  mh.msg_control = ctl;
  mh.msg_controllen = sizeof ctl;
  ssize_t n = real().recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) return -errno;
  int got = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    int count = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    for (int i = 0; i < count; ++i) {
      int f;
      memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
      if (got < max_fds)
        fds[got++] = f;
      else
        real().close(f);
    }
  }
  if (n != static_cast<ssize_t>(len) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
    for (int i = 0; i < got; ++i) real().close(fds[i]);
    return n == 0 ? -ECONNRESET : -EPROTO;
  }
  return got;
}

// The peer proves it holds the other end of our TCP connection by sending
// that socket: its local address must be our peer and its peer our local.
bool verify_proof(int our_fd, int their_fd) {
  WireAddr our_local, our_peer, their_local, their_peer;
  return fd_addrs(our_fd, &our_local, &our_peer) &&
         fd_addrs(their_fd, &their_local, &their_peer) && same_wire(our_local, their_peer) &&
         same_wire(our_peer, their_local);
}

// Who is on the other end of the rendezvous (SO_PEERCRED), for the log.
// Identity is established by the socket proof above, which also holds across
// users (a client and a server may legitimately run as different users).
void log_peer(int conn, const char* what) {
  ucred cred = {};
  socklen_t len = sizeof cred;
  if (real().getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
    LOG_DEBUG("shm pairing: %s is pid %d uid %u", what, static_cast<int>(cred.pid), cred.uid);
}

// A private, close-on-exec dup of the connection's socket: the doorbell fd
// outlives the application's own fd numbering (dup2, close of one of two).
int private_dup(int fd) { return real().fcntl(fd, F_DUPFD_CLOEXEC, 0); }

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
  int fd = real().socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
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
  int fd = real().socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  sockaddr_un un;
  socklen_t ulen = abstract_addr(name, &un);
  if (real().bind(fd, reinterpret_cast<sockaddr*>(&un), ulen) != 0 || real().listen(fd, 4) != 0) {
    int err = -errno;
    real().close(fd);
    return err;
  }
  return fd;
}

std::unique_ptr<Channel> shm_client_pair(int tcp_fd, int rendezvous_fd, const Config& cfg,
                                         Fallback* why) {
  const int64_t deadline = now_ms() + cfg.connect_timeout_ms;
  std::unique_ptr<Channel> result;
  int conn = -1;
  *why = Fallback::kPairFailed;
  for (;;) {
    int w = wait_readable(rendezvous_fd, deadline);
    if (w == 0) {
      *why = Fallback::kPairTimeout;
      break;
    }
    if (w < 0) break;
    conn = real().accept4(rendezvous_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn >= 0) break;
    if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) break;
  }
  // Closing the rendezvous now means a server that is late gets
  // ECONNREFUSED and falls back too: both ends always agree.
  real().close(rendezvous_fd);
  if (conn < 0) return nullptr;

  HelloMsg hello = {static_cast<uint32_t>(MsgType::kHello), kProtocolVersion};
  OfferMsg offer;
  int fds[2] = {-1, -1};
  int got = -1;
  if (send_msg(conn, &hello, sizeof hello, &tcp_fd, 1) == 0)
    got = recv_msg(conn, &offer, sizeof offer, fds, 2, deadline);
  if (got == -ETIMEDOUT) *why = Fallback::kPairTimeout;
  log_peer(conn, "server");
  void* map = nullptr;
  if (got == 2 && offer.type == static_cast<uint32_t>(MsgType::kOffer) &&
      offer.version == kProtocolVersion && verify_proof(tcp_fd, fds[1]) &&
      shm_region_attach(fds[0], offer.region_bytes, offer.nonce, offer.ring_bytes, &map) == 0) {
    int doorbell = private_dup(tcp_fd);
    AnswerMsg ans = {static_cast<uint32_t>(MsgType::kAnswer),
                     static_cast<uint32_t>(AnswerCode::kAccept), offer.nonce};
    if (doorbell >= 0 && send_msg(conn, &ans, sizeof ans, nullptr, 0) == 0) {
      // Committed: the server switches when it reads this answer.
      result = std::make_unique<ShmChannel>(map, offer.region_bytes, false, doorbell, fds[0]);
      fds[0] = -1;  // the channel keeps the memfd (exec hand-off)
    } else {
      if (doorbell >= 0) real().close(doorbell);
      munmap(map, offer.region_bytes);
    }
  } else if (got > 0) {
    LOG_WARN("shm pairing: rejected an offer that failed verification");
  }
  for (int f : fds)
    if (f >= 0) real().close(f);
  real().close(conn);
  return result;
}

std::unique_ptr<Channel> shm_server_pair(int tcp_fd, const Config& cfg, Fallback* why) {
  WireAddr local, peer;
  if (!fd_addrs(tcp_fd, &local, &peer)) {
    *why = Fallback::kPairFailed;
    return nullptr;
  }
  char name[96];
  client_name(local, peer.port, name, sizeof name);
  int conn = real().socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (conn < 0) {
    *why = Fallback::kResources;
    return nullptr;
  }
  sockaddr_un un;
  socklen_t ulen = abstract_addr(name, &un);
  if (real().connect(conn, reinterpret_cast<sockaddr*>(&un), ulen) != 0) {
    // No rendezvous: a client without librsock (or one that gave up).
    real().close(conn);
    *why = Fallback::kPeerNotAccelerated;
    return nullptr;
  }
  const int64_t deadline = now_ms() + cfg.connect_timeout_ms;
  std::unique_ptr<Channel> result;
  *why = Fallback::kPairFailed;
  HelloMsg hello;
  int client_fd = -1;
  int got = recv_msg(conn, &hello, sizeof hello, &client_fd, 1, deadline);
  if (got == -ETIMEDOUT) *why = Fallback::kPairTimeout;
  log_peer(conn, "client");
  bool proven = got == 1 && hello.type == static_cast<uint32_t>(MsgType::kHello) &&
                hello.version == kProtocolVersion && verify_proof(tcp_fd, client_fd);
  if (client_fd >= 0) real().close(client_fd);
  if (!proven) {
    real().close(conn);
    return nullptr;
  }
  uint64_t nonce = 0;
  while (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) {
  }
  void* map = nullptr;
  size_t map_len = 0;
  int memfd = shm_region_create(cfg.ring_bytes, nonce, &map, &map_len);
  if (memfd < 0) {
    *why = Fallback::kResources;
    real().close(conn);
    return nullptr;
  }
  OfferMsg offer = {};
  offer.type = static_cast<uint32_t>(MsgType::kOffer);
  offer.version = kProtocolVersion;
  offer.nonce = nonce;
  offer.ring_bytes = cfg.ring_bytes;
  offer.region_bytes = map_len;
  offer.server = local;
  offer.client = peer;
  int fds[2] = {memfd, tcp_fd};
  AnswerMsg ans;
  int doorbell = private_dup(tcp_fd);
  if (doorbell >= 0 && send_msg(conn, &offer, sizeof offer, fds, 2) == 0) {
    int r = recv_msg(conn, &ans, sizeof ans, nullptr, 0, deadline);
    if (r == 0 && ans.type == static_cast<uint32_t>(MsgType::kAnswer) &&
        ans.code == static_cast<uint32_t>(AnswerCode::kAccept) && ans.nonce == nonce) {
      result = std::make_unique<ShmChannel>(map, map_len, true, doorbell, memfd);
      doorbell = -1;
      memfd = -1;  // the channel keeps it (exec hand-off)
      map = nullptr;
    } else if (r == -ETIMEDOUT) {
      // The client may or may not have committed: neither end can tell, so
      // the connection is failed loudly rather than risking divergence.
      *why = Fallback::kPairTimeout;
      real().shutdown(tcp_fd, SHUT_RDWR);
    }
  }
  if (doorbell >= 0) real().close(doorbell);
  if (map) munmap(map, map_len);
  if (memfd >= 0) real().close(memfd);
  real().close(conn);
  return result;
}

bool negative_cache_hit(const sockaddr* dst) {
  WireAddr w;
  if (!to_wire(dst, &w)) return false;
  const int64_t now = now_ms();
  std::lock_guard<std::mutex> lock(g_cache_mu);
  for (auto& e : g_cache)
    if (e.until_ms > now && same_wire(e.addr, w)) return true;
  return false;
}

void negative_cache_add(const sockaddr* dst) {
  WireAddr w;
  if (!to_wire(dst, &w)) return;
  const int64_t now = now_ms();
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
