// Cross-host pairing over rdma_cm (see verbs_setup.h, docs/protocol.md
// "Verbs transport"). Owns the connection private data formats, the
// process-local table of connect requests waiting for their accept(), the
// fork-safety decision and every bounded wait of connection setup.
#include "transport/verbs/verbs_setup.h"

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "common/log.h"
#include "common/real.h"
#include "ring/ring.h"
#include "transport/addr.h"
#include "transport/verbs/verbs_channel.h"

namespace rsock {
namespace {

// ------------------------------------------------------------ private data --
// Multi-byte fields are big-endian. The connect request's private data must
// fit the 56 bytes rdma_cm leaves on InfiniBand/RoCE (IB CM REQ).
constexpr uint32_t kPrivMagic = 0x72737631;  // "rsv1"
constexpr uint8_t kPrivVersion = 1;

struct __attribute__((packed)) ConnectPriv {  // client -> server (REQ)
  uint32_t magic;
  uint8_t version;
  uint8_t ring_log2;        // both rings have 2^ring_log2 bytes
  uint16_t client_port;     // the TCP connection as the client sees it:
  uint16_t server_port;     //   local port, peer port,
  uint8_t client_addr[16];  // local address, peer address
  uint8_t server_addr[16];  //   (IPv6, IPv4 as v4-mapped)
  uint32_t ring_rkey;       // the sender's receive ring
  uint64_t ring_addr;
  uint8_t flags;  // kPrivReverse*
};
static_assert(sizeof(ConnectPriv) == 55);

// ConnectPriv.flags. A client that listens on rdma_cm at its own TCP
// address and port while it pairs says so (kPrivClientListens); a server
// process that cannot read its listener (a fork's child) then connects to
// it instead, with the same layout, the 4-tuple still named as the client
// sees it, and kPrivReverse; the client answers with AcceptPriv.
constexpr uint8_t kPrivClientListens = 1u << 0;
constexpr uint8_t kPrivReverse = 1u << 1;

struct __attribute__((packed)) AcceptPriv {  // server -> client (REP)
  uint32_t magic;
  uint8_t version;
  uint8_t ring_log2;     // echo of the client's
  uint16_t client_port;  // echo
  uint32_t ring_rkey;    // the server's receive ring
  uint64_t ring_addr;
};
static_assert(sizeof(AcceptPriv) == 20);

// IB CM reject reason "invalid service ID": no listener on that port (and,
// with soft-RoCE, sometimes a listener that is not ready yet). iWARP reports
// ECONNREFUSED instead.
constexpr int kRejectNoListener = 8;
constexpr int kNoListenerRetries = 3;  // after the first attempt
constexpr int kRetryDelayMs[kNoListenerRetries] = {20, 60, 150};

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ms_left(int64_t deadline) {
  int64_t left = deadline - now_ms();
  return left < 0 ? 0 : static_cast<int>(left);
}

int log2_of(size_t v) {
  int n = 0;
  while ((size_t{1} << n) < v) ++n;
  return n;
}

bool ring_log2_ok(int log2) {
  return log2 >= log2_of(kMinRingBytes) && log2 <= log2_of(kMaxRingBytes) && log2 <= 28;
}

// ---------------------------------------------------------- process state --

// This process opened an RDMA device (through an rdma_cm id bound to one);
// a fork's child of such a process cannot use RDMA (verbs_usable_here).
std::atomic<bool> g_device_opened{false};
std::atomic<bool> g_inherited_device{false};

void note_device(const rdma_cm_id* id) {
  if (id && id->verbs) g_device_opened.store(true, std::memory_order_relaxed);
}

// Fork safety, settled once before the first registration: a kernel with
// copy-on-fork for pinned pages (Linux >= 5.13) needs nothing
// (IBV_FORK_UNNEEDED); otherwise ibv_fork_init() marks registered memory
// MADV_DONTFORK so that a fork() cannot move pages under the device.
void global_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (ibv_is_fork_initialized() == IBV_FORK_UNNEEDED) {
      LOG_DEBUG("rdma: kernel makes ibv_fork_init unnecessary");
      return;
    }
    int rc = ibv_fork_init();
    if (rc != 0) LOG_WARN("rdma: ibv_fork_init: %s", strerror(rc));
  });
}

// Waits for the next event on ch until deadline. Returns the event (to be
// acked by the caller) or nullptr on timeout/error.
rdma_cm_event* next_event(rdma_event_channel* ch, int64_t deadline) {
  for (;;) {
    rdma_cm_event* ev = nullptr;
    pollfd p = {ch->fd, POLLIN, 0};
    int rc = real().poll(&p, 1, ms_left(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return nullptr;
    if (rdma_get_cm_event(ch, &ev) == 0) return ev;
    if (errno != EAGAIN && errno != EINTR) return nullptr;
  }
}

// Waits for `want` on a connection's own channel. Returns 0, or the failing
// event type (negated status in *status) / -1 on timeout. Copies the
// event's private data into priv (up to len bytes, *priv_len = its length).
int wait_for(rdma_event_channel* ch, rdma_cm_event_type want, int64_t deadline, int* status,
             void* priv = nullptr, size_t len = 0, size_t* priv_len = nullptr) {
  rdma_cm_event* ev = next_event(ch, deadline);
  if (!ev) return -1;
  const rdma_cm_event_type type = ev->event;
  *status = ev->status;
  if (type == want && priv) {
    const size_t n = ev->param.conn.private_data_len;
    if (priv_len) *priv_len = n;
    if (ev->param.conn.private_data) memcpy(priv, ev->param.conn.private_data, n < len ? n : len);
  }
  rdma_ack_cm_event(ev);
  return type == want ? 0 : static_cast<int>(type) + 1;
}

// The 4-tuple of a ConnectPriv is the TCP connection (local, peer as the
// client sees it)?
bool names_connection(const ConnectPriv& p, const WireAddr& client, const WireAddr& server) {
  return be16toh(p.client_port) == client.port && be16toh(p.server_port) == server.port &&
         memcmp(p.client_addr, client.addr, 16) == 0 && memcmp(p.server_addr, server.addr, 16) == 0;
}

// One connection attempt's rdma_cm objects until a VerbsChannel owns them.
struct CmPair {
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  ~CmPair() {
    if (id) rdma_destroy_id(id);
    if (ch) rdma_destroy_event_channel(ch);
  }
};

// Fills the connect request's private data: the TCP 4-tuple as the client
// sees it, the sender's ring.
ConnectPriv make_connect_priv(const WireAddr& client, const WireAddr& server, int ring_log2,
                              const VerbsChannel& ch, uint8_t flags) {
  ConnectPriv req = {};
  req.magic = htobe32(kPrivMagic);
  req.version = kPrivVersion;
  req.ring_log2 = static_cast<uint8_t>(ring_log2);
  req.client_port = htobe16(client.port);
  req.server_port = htobe16(server.port);
  memcpy(req.client_addr, client.addr, 16);
  memcpy(req.server_addr, server.addr, 16);
  req.ring_rkey = htobe32(ch.rx_rkey());
  req.ring_addr = htobe64(ch.rx_addr());
  req.flags = flags;
  return req;
}

rdma_conn_param conn_param(const void* priv, size_t len) {
  rdma_conn_param cp = {};
  cp.private_data = priv;
  cp.private_data_len = static_cast<uint8_t>(len);
  cp.retry_count = 7;
  cp.rnr_retry_count = 7;  // infinite: see verbs_channel.cpp, message credits
  return cp;
}

// The active side of one attempt: an rdma_cm id of its own, resolved from
// local's address to peer, and a channel (queue pair, ring) on it. nullptr
// with *why: kNotSameHost (no RDMA route), kPairTimeout, kResources.
std::unique_ptr<VerbsChannel> open_active(const WireAddr& local, const WireAddr& peer,
                                          int ring_log2, int64_t deadline, Fallback* why) {
  sockaddr_storage src, dst;
  WireAddr src16 = local;
  src16.port = 0;  // rdma_cm picks its own port (its port space is separate)
  to_sockaddr(src16, &src);
  to_sockaddr(peer, &dst);
  CmPair cm;
  cm.ch = rdma_create_event_channel();
  if (!cm.ch || rdma_create_id(cm.ch, &cm.id, nullptr, RDMA_PS_TCP) != 0) {
    *why = Fallback::kNotSameHost;  // no rdma_cm device node
    return nullptr;
  }
  int status = 0;
  const int step_ms = std::max(1, std::min(ms_left(deadline), 2000));
  if (rdma_resolve_addr(cm.id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&dst),
                        step_ms) != 0 ||
      wait_for(cm.ch, RDMA_CM_EVENT_ADDR_RESOLVED, deadline, &status) != 0 ||
      rdma_resolve_route(cm.id, step_ms) != 0 ||
      wait_for(cm.ch, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, &status) != 0) {
    // No RDMA device can reach the peer's address (or too slow to say).
    *why = now_ms() >= deadline ? Fallback::kPairTimeout : Fallback::kNotSameHost;
    LOG_DEBUG("rdma: no route to the peer (status %d)", status);
    return nullptr;
  }
  note_device(cm.id);
  int err = 0;
  std::unique_ptr<VerbsChannel> ch =
      VerbsChannel::create(cm.id, cm.ch, size_t{1} << ring_log2, &err);
  if (!ch) {
    LOG_INFO("rdma: queue pair/registration failed: %s", strerror(-err));
    *why = Fallback::kResources;
    return nullptr;
  }
  cm.id = nullptr;  // owned by the channel now
  cm.ch = nullptr;
  return ch;
}

// The active side after ESTABLISHED (the commit point): checks the peer's
// AcceptPriv and starts the channel.
std::unique_ptr<Channel> start_active(std::unique_ptr<VerbsChannel> ch, const AcceptPriv& rep,
                                      size_t rep_len, int ring_log2, uint16_t client_port,
                                      int tcp_fd, Fallback* why) {
  if (rep_len < sizeof rep || be32toh(rep.magic) != kPrivMagic || rep.version != kPrivVersion ||
      rep.ring_log2 != ring_log2 || be16toh(rep.client_port) != client_port) {
    // Both ends are connected; the peer will use the QP. Fail loudly.
    LOG_WARN("rdma: bad accept private data: failing the connection");
    real().shutdown(tcp_fd, SHUT_RDWR);
    return nullptr;
  }
  if (ch->start(be64toh(rep.ring_addr), be32toh(rep.ring_rkey), tcp_fd) != 0) {
    real().shutdown(tcp_fd, SHUT_RDWR);
    *why = Fallback::kResources;
    return nullptr;
  }
  return ch;
}

// The passive side: accepts the connect request req_id (whose private data
// is priv) on an event channel of its own, with a ring of priv's size, and
// waits for the commit point. lock: held while destroying an id still on
// a shared channel (the listener's), or nullptr.
std::unique_ptr<Channel> accept_request(rdma_cm_id* req_id, const ConnectPriv& priv, int tcp_fd,
                                        const Config& cfg, std::mutex* lock, Fallback* why) {
  CmPair cm;
  cm.id = req_id;
  cm.ch = rdma_create_event_channel();
  if (!cm.ch || rdma_migrate_id(cm.id, cm.ch) != 0) {
    rdma_reject(cm.id, nullptr, 0);
    if (!cm.ch) {  // still on the shared channel
      if (lock) lock->lock();
      rdma_destroy_id(cm.id);
      if (lock) lock->unlock();
      cm.id = nullptr;
    }
    *why = Fallback::kResources;
    return nullptr;
  }
  note_device(cm.id);
  int err = 0;
  std::unique_ptr<VerbsChannel> ch =
      VerbsChannel::create(cm.id, cm.ch, size_t{1} << priv.ring_log2, &err);
  if (!ch) {
    LOG_INFO("rdma: queue pair/registration failed: %s", strerror(-err));
    rdma_reject(cm.id, nullptr, 0);
    *why = Fallback::kResources;
    return nullptr;
  }
  rdma_event_channel* own = cm.ch;
  cm.id = nullptr;
  cm.ch = nullptr;
  AcceptPriv rep = {};
  rep.magic = htobe32(kPrivMagic);
  rep.version = kPrivVersion;
  rep.ring_log2 = priv.ring_log2;
  rep.client_port = priv.client_port;
  rep.ring_rkey = htobe32(ch->rx_rkey());
  rep.ring_addr = htobe64(ch->rx_addr());
  rdma_conn_param cp = conn_param(&rep, sizeof rep);
  if (rdma_accept(ch->id(), &cp) != 0) {
    LOG_INFO("rdma: rdma_accept: %s", strerror(errno));
    *why = Fallback::kPairFailed;
    return nullptr;  // the peer sees a reject or times out: both stay on TCP
  }
  // Commit point: ESTABLISHED (the peer's RTU, or its first packet). A
  // fresh budget: the peer may have used part of its own on retries.
  const int64_t est_deadline = now_ms() + cfg.connect_timeout_ms;
  int status = 0;
  int r = wait_for(own, RDMA_CM_EVENT_ESTABLISHED, est_deadline, &status);
  if (r == 0) {
    if (ch->start(be64toh(priv.ring_addr), be32toh(priv.ring_rkey), tcp_fd) != 0) {
      real().shutdown(tcp_fd, SHUT_RDWR);
      *why = Fallback::kResources;
      return nullptr;
    }
    return ch;
  }
  if (r < 0) {
    // The peer may have seen ESTABLISHED already (our RTU view is late):
    // we cannot know, so the connection fails loudly on both paths.
    real().shutdown(tcp_fd, SHUT_RDWR);
    *why = Fallback::kPairTimeout;
  } else {
    // REJECTED/CONNECT_ERROR/UNREACHABLE/DISCONNECTED before ESTABLISHED:
    // the peer gave up before committing; both stay on TCP.
    LOG_DEBUG("rdma: accept failed: %s", rdma_event_str(static_cast<rdma_cm_event_type>(r - 1)));
    *why = Fallback::kPairFailed;
  }
  return nullptr;
}

}  // namespace

bool verbs_usable_here() { return !g_inherited_device.load(std::memory_order_relaxed); }

void verbs_after_fork_child() {
  if (g_device_opened.load(std::memory_order_relaxed))
    g_inherited_device.store(true, std::memory_order_relaxed);
}

bool verbs_available() {
  static std::atomic<int> cached{-1};
  int v = cached.load(std::memory_order_relaxed);
  if (v < 0) {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list) ibv_free_device_list(list);
    v = (list && n > 0) ? 1 : 0;
    cached.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

// ------------------------------------------------------------------ client --

// The client's own rdma_cm listener while it pairs (see ConnectPriv.flags).
class VerbsRendezvous {
 public:
  ~VerbsRendezvous() {
    if (id) rdma_destroy_id(id);
    if (ch) rdma_destroy_event_channel(ch);
  }
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
};

VerbsRendezvous* verbs_client_prepare(int tcp_fd, const sockaddr* dst) {
  if (!verbs_available()) return nullptr;
  sockaddr_storage ss;
  socklen_t len = sizeof ss;
  WireAddr bound, dst_w;
  if (getsockname(tcp_fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      !to_wire(reinterpret_cast<sockaddr*>(&ss), &bound) || !to_wire(dst, &dst_w))
    return nullptr;
  const int family = ss.ss_family;
  const bool unbound = bound.port == 0;
  WireAddr src = bound;
  if (unbound) {
    // The source address the kernel will pick for dst: a UDP socket says.
    sockaddr_storage d;
    socklen_t dlen = to_sockaddr(dst_w, &d);
    int u = real().socket(d.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (u < 0) return nullptr;
    sockaddr_storage us;
    socklen_t ulen = sizeof us;
    bool ok = real().connect(u, reinterpret_cast<sockaddr*>(&d), dlen) == 0 &&
              getsockname(u, reinterpret_cast<sockaddr*>(&us), &ulen) == 0 &&
              to_wire(reinterpret_cast<sockaddr*>(&us), &src);
    real().close(u);
    if (!ok) return nullptr;
  }
  global_init();
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::unique_ptr<VerbsRendezvous> r(new VerbsRendezvous);
    r->ch = rdma_create_event_channel();
    if (!r->ch || rdma_create_id(r->ch, &r->id, nullptr, RDMA_PS_TCP) != 0) return nullptr;
    WireAddr at = src;
    at.port = unbound ? 0 : bound.port;
    sockaddr_storage b;
    to_sockaddr(at, &b);
    // No RDMA device for this address, or the port is taken in rdma_cm's
    // port space: pair without a rendezvous.
    if (rdma_bind_addr(r->id, reinterpret_cast<sockaddr*>(&b)) != 0) return nullptr;
    note_device(r->id);
    if (unbound) {
      // The TCP socket takes the same port number (TCP's port space).
      WireAddr t = src;
      t.port = be16toh(rdma_get_src_port(r->id));
      sockaddr_storage tb;
      socklen_t tlen = to_sockaddr(t, &tb);
      if (tb.ss_family != family) return nullptr;  // (a v4 peer on a v6 socket: none)
      if (real().bind(tcp_fd, reinterpret_cast<sockaddr*>(&tb), tlen) != 0) {
        if (errno == EADDRINUSE) continue;
        return nullptr;
      }
    }
    if (rdma_listen(r->id, 4) != 0) return nullptr;
    int fl = real().fcntl(r->ch->fd, F_GETFL, 0);
    real().fcntl(r->ch->fd, F_SETFL, fl | O_NONBLOCK);
    return r.release();
  }
  return nullptr;
}

void verbs_rendezvous_close(VerbsRendezvous* r) { delete r; }

namespace {

// Reads the rendezvous: a valid reverse request for this connection, or
// nullptr (anything else is refused or dropped).
rdma_cm_id* take_reverse_request(VerbsRendezvous* rdv, const WireAddr& local, const WireAddr& peer,
                                 ConnectPriv* priv) {
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(rdv->ch, &ev) == 0) {
    if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_ack_cm_event(ev);
      continue;
    }
    rdma_cm_id* req_id = ev->id;
    const size_t n = ev->param.conn.private_data_len;
    bool ok = n >= sizeof *priv && ev->param.conn.private_data;
    if (ok) memcpy(priv, ev->param.conn.private_data, sizeof *priv);
    ok = ok && be32toh(priv->magic) == kPrivMagic && priv->version == kPrivVersion &&
         (priv->flags & kPrivReverse) && ring_log2_ok(priv->ring_log2) &&
         names_connection(*priv, local, peer);
    WireAddr cm_peer;
    const sockaddr* pa = rdma_get_peer_addr(req_id);
    ok = ok && pa && to_wire(pa, &cm_peer) && memcmp(cm_peer.addr, peer.addr, 16) == 0;
    rdma_ack_cm_event(ev);
    if (ok) return req_id;
    rdma_reject(req_id, nullptr, 0);
    rdma_destroy_id(req_id);
  }
  return nullptr;
}

}  // namespace

std::unique_ptr<Channel> verbs_client_pair(int tcp_fd, VerbsRendezvous* rdv_in, const Config& cfg,
                                           Fallback* why) {
  std::unique_ptr<VerbsRendezvous> rdv(rdv_in);
  *why = Fallback::kPairFailed;
  WireAddr local, peer;
  if (!fd_addrs(tcp_fd, &local, &peer)) return nullptr;
  const int ring_log2 = log2_of(cfg.ring_bytes);
  if (!verbs_available()) {
    *why = Fallback::kNotSameHost;
    return nullptr;
  }
  if (!ring_log2_ok(ring_log2)) return nullptr;
  global_init();
  const int64_t deadline = now_ms() + cfg.connect_timeout_ms;
  for (int attempt = 0;; ++attempt) {
    std::unique_ptr<VerbsChannel> ch = open_active(local, peer, ring_log2, deadline, why);
    if (!ch) return nullptr;
    ConnectPriv req = make_connect_priv(local, peer, ring_log2, *ch, rdv ? kPrivClientListens : 0);
    rdma_conn_param cp = conn_param(&req, sizeof req);
    if (rdma_connect(ch->id(), &cp) != 0) {
      LOG_INFO("rdma: rdma_connect: %s", strerror(errno));
      return nullptr;
    }
    int status = 0;
    AcceptPriv rep = {};
    size_t rep_len = 0;
    rdma_event_channel* own = ch->id()->channel;  // owned by the channel now
    // The answer comes on our request (a server that reads its listener),
    // or as the server's own request at our rendezvous (a forked worker).
    int r = -1;
    for (;;) {
      pollfd p[2] = {{own->fd, POLLIN, 0}, {rdv ? rdv->ch->fd : -1, POLLIN, 0}};
      int pr = real().poll(p, 2, ms_left(deadline));
      if (pr < 0 && errno == EINTR) continue;
      if (pr <= 0) break;
      if (p[1].revents) {
        ConnectPriv rev;
        if (rdma_cm_id* req_id = take_reverse_request(rdv.get(), local, peer, &rev)) {
          ch.reset();  // our request goes unanswered: withdraw it
          LOG_DEBUG("rdma: the server connects to us (reverse)");
          return accept_request(req_id, rev, tcp_fd, cfg, nullptr, why);
        }
      }
      if (p[0].revents) {
        r = wait_for(own, RDMA_CM_EVENT_ESTABLISHED, deadline, &status, &rep, sizeof rep, &rep_len);
        break;
      }
    }
    if (r == 0)  // committed: the server commits when it sees the same ESTABLISHED
      return start_active(std::move(ch), rep, rep_len, ring_log2, local.port, tcp_fd, why);
    const rdma_cm_event_type type = static_cast<rdma_cm_event_type>(r - 1);
    if (r > 0 && type == RDMA_CM_EVENT_REJECTED &&
        (status == kRejectNoListener || status == -ECONNREFUSED)) {
      // No listener, or (soft-RoCE) a listener that is not ready yet.
      if (attempt < kNoListenerRetries && ms_left(deadline) > kRetryDelayMs[attempt]) {
        LOG_DEBUG("rdma: connect rejected (no listener), retrying");
        ch.reset();
        usleep(kRetryDelayMs[attempt] * 1000);
        continue;
      }
      *why = Fallback::kPeerNotAccelerated;
      return nullptr;
    }
    if (r < 0) {
      *why = Fallback::kPairTimeout;
      // ch's destruction tears the attempt down: a server that completed it
      // at this very moment sees the disconnect and fails its stream.
    } else {
      LOG_DEBUG("rdma: connect failed: %s (status %d)", rdma_event_str(type), status);
      *why = type == RDMA_CM_EVENT_UNREACHABLE ? Fallback::kPairTimeout : Fallback::kPairFailed;
    }
    return nullptr;
  }
}

// ------------------------------------------------------------------ server --

class VerbsListener {
 public:
  struct Pending {
    rdma_cm_id* id;
    ConnectPriv priv;
    int64_t since_ms;
  };

  std::mutex mu;
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  std::vector<Pending> pending;
  bool inherited = false;  // a fork's child: the parent's listener, unusable here

  ~VerbsListener() {
    if (inherited) {
      // The parent's: our copy of the descriptor goes, nothing else (the
      // ids' few bytes of user memory stay, once per listener).
      if (ch) real().close(ch->fd);
      return;
    }
    for (auto& p : pending) {
      rdma_reject(p.id, nullptr, 0);
      rdma_destroy_id(p.id);
    }
    if (id) rdma_destroy_id(id);
    if (ch) rdma_destroy_event_channel(ch);
  }

  // Reads the events that are there (waiting up to wait_ms for the first).
  void pump_locked(int wait_ms) {
    pollfd p = {ch->fd, POLLIN, 0};
    if (real().poll(&p, 1, wait_ms) <= 0) return;
    for (;;) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(ch, &ev) != 0) return;  // EAGAIN: drained
      if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        rdma_ack_cm_event(ev);  // nothing else concerns a listener
        continue;
      }
      rdma_cm_id* req_id = ev->id;
      ConnectPriv priv = {};
      const size_t n = ev->param.conn.private_data_len;
      bool ok = n >= sizeof priv && ev->param.conn.private_data;
      if (ok) memcpy(&priv, ev->param.conn.private_data, sizeof priv);
      ok = ok && be32toh(priv.magic) == kPrivMagic && priv.version == kPrivVersion &&
           ring_log2_ok(priv.ring_log2);
      // The request must come from the address it names as the client's.
      WireAddr cm_peer;
      const sockaddr* pa = rdma_get_peer_addr(req_id);
      if (ok && pa && to_wire(pa, &cm_peer) && memcmp(cm_peer.addr, priv.client_addr, 16) != 0) {
        LOG_INFO("rdma: connect request from another address than it names: rejected");
        ok = false;
      }
      rdma_ack_cm_event(ev);
      if (!ok) {
        rdma_reject(req_id, nullptr, 0);
        rdma_destroy_id(req_id);
        continue;
      }
      pending.push_back({req_id, priv, now_ms()});
    }
  }

  // Requests nobody accepted in time will never match: refuse them.
  void expire_locked(int64_t max_age_ms) {
    const int64_t now = now_ms();
    for (size_t i = 0; i < pending.size();) {
      if (now - pending[i].since_ms > max_age_ms) {
        rdma_reject(pending[i].id, nullptr, 0);
        rdma_destroy_id(pending[i].id);
        pending[i] = pending.back();
        pending.pop_back();
      } else {
        ++i;
      }
    }
  }
};

VerbsListener* verbs_listen(int tcp_listen_fd, Fallback* why) {
  *why = Fallback::kResources;
  sockaddr_storage ss;
  socklen_t len = sizeof ss;
  WireAddr local;
  if (getsockname(tcp_listen_fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 ||
      !to_wire(reinterpret_cast<sockaddr*>(&ss), &local))
    return nullptr;
  if (!verbs_available()) {
    *why = Fallback::kNotSameHost;
    return nullptr;
  }
  global_init();
  auto* l = new VerbsListener();
  l->ch = rdma_create_event_channel();
  if (!l->ch || rdma_create_id(l->ch, &l->id, nullptr, RDMA_PS_TCP) != 0) {
    *why = Fallback::kNotSameHost;
    delete l;
    return nullptr;
  }
  int fl = real().fcntl(l->ch->fd, F_GETFL, 0);
  real().fcntl(l->ch->fd, F_SETFL, fl | O_NONBLOCK);
  // Bind exactly as the TCP listener: a wildcard listens on every RDMA
  // device; an IPv6 wildcard also takes IPv4 unless the socket is v6-only.
  sockaddr_storage bind_ss;
  if (ss.ss_family == AF_INET6 && !is_mapped_v4(local.addr)) {
    bind_ss = ss;
    int v6only = 0;
    socklen_t olen = sizeof v6only;
    if (getsockopt(tcp_listen_fd, IPPROTO_IPV6, IPV6_V6ONLY, &v6only, &olen) == 0 && v6only) {
      int afonly = 1;
      rdma_set_option(l->id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &afonly, sizeof afonly);
    }
  } else {
    to_sockaddr(local, &bind_ss);
  }
  if (rdma_bind_addr(l->id, reinterpret_cast<sockaddr*>(&bind_ss)) != 0 ||
      rdma_listen(l->id, 128) != 0) {
    // EADDRNOTAVAIL/ENODEV: the address has no RDMA device.
    LOG_DEBUG("rdma: no rdma_cm listener on this address: %s", strerror(errno));
    *why =
        (errno == EADDRNOTAVAIL || errno == ENODEV) ? Fallback::kNotSameHost : Fallback::kResources;
    delete l;
    return nullptr;
  }
  note_device(l->id);  // bound to one address: its device is open now
  return l;
}

void verbs_listener_close(VerbsListener* listener) { delete listener; }

void verbs_listener_forked_child(VerbsListener* listener) {
  listener->inherited = true;
  // Requests the parent had read are the parent's to answer.
  listener->pending.clear();
}

bool verbs_listener_usable(const VerbsListener* listener) { return !listener->inherited; }

std::unique_ptr<Channel> verbs_server_pair(VerbsListener* l, int tcp_fd, const Config& cfg,
                                           Fallback* why) {
  *why = Fallback::kPairFailed;
  WireAddr local, peer;
  if (!l || !fd_addrs(tcp_fd, &local, &peer)) return nullptr;
  const int64_t deadline = now_ms() + cfg.connect_timeout_ms;
  // A request older than this can no longer belong to a waiting client.
  const int64_t max_age = 2 * static_cast<int64_t>(cfg.connect_timeout_ms) + 1000;
  VerbsListener::Pending got = {};
  bool found = false;
  for (;;) {
    std::lock_guard<std::mutex> lock(l->mu);
    l->expire_locked(max_age);
    for (size_t i = 0; i < l->pending.size(); ++i) {
      const ConnectPriv& p = l->pending[i].priv;
      if (be16toh(p.client_port) == peer.port && be16toh(p.server_port) == local.port &&
          memcmp(p.client_addr, peer.addr, 16) == 0 && memcmp(p.server_addr, local.addr, 16) == 0) {
        got = l->pending[i];
        l->pending[i] = l->pending.back();
        l->pending.pop_back();
        found = true;
        break;
      }
    }
    if (found) break;
    const int left = ms_left(deadline);
    if (left == 0) break;
    // Short slices: other accepting threads check the table in between.
    l->pump_locked(left < 20 ? left : 20);
  }
  if (!found) {
    *why = Fallback::kPeerNotAccelerated;
    return nullptr;
  }

  return accept_request(got.id, got.priv, tcp_fd, cfg, &l->mu, why);
}

std::unique_ptr<Channel> verbs_server_connect(int tcp_fd, const Config& cfg, Fallback* why) {
  *why = Fallback::kPairFailed;
  WireAddr local, peer;
  if (!fd_addrs(tcp_fd, &local, &peer)) return nullptr;
  const int ring_log2 = log2_of(cfg.ring_bytes);
  if (!ring_log2_ok(ring_log2)) return nullptr;
  global_init();
  const int64_t deadline = now_ms() + cfg.connect_timeout_ms;
  // The client's rendezvous is its TCP address and port.
  std::unique_ptr<VerbsChannel> ch = open_active(local, peer, ring_log2, deadline, why);
  if (!ch) return nullptr;
  // The 4-tuple as the client sees it: we are its server.
  ConnectPriv req = make_connect_priv(peer, local, ring_log2, *ch, kPrivReverse);
  rdma_conn_param cp = conn_param(&req, sizeof req);
  if (rdma_connect(ch->id(), &cp) != 0) {
    LOG_INFO("rdma: rdma_connect (reverse): %s", strerror(errno));
    return nullptr;
  }
  AcceptPriv rep = {};
  size_t rep_len = 0;
  int status = 0;
  int r = wait_for(ch->id()->channel, RDMA_CM_EVENT_ESTABLISHED, deadline, &status, &rep,
                   sizeof rep, &rep_len);
  if (r == 0) return start_active(std::move(ch), rep, rep_len, ring_log2, peer.port, tcp_fd, why);
  const rdma_cm_event_type type = static_cast<rdma_cm_event_type>(r - 1);
  if (r > 0 && type == RDMA_CM_EVENT_REJECTED &&
      (status == kRejectNoListener || status == -ECONNREFUSED)) {
    *why = Fallback::kPeerNotAccelerated;  // no rendezvous: a plain client
  } else {
    *why = r < 0 ? Fallback::kPairTimeout : Fallback::kPairFailed;
  }
  return nullptr;
}

}  // namespace rsock
