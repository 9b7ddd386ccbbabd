// Cross-host pairing over rdma_cm (see verbs_setup.h, docs/protocol.md
// section 7, docs/security.md). Owns the process-local table of connect
// requests waiting for their accept(), the fork-safety decision, the in-band
// proofs and every bounded wait of connection setup. Message formats are in
// src/ring/handshake.h.
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
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/own_fd.h"
#include "common/real.h"
#include "ring/handshake.h"
#include "transport/addr.h"
#include "transport/verbs/verbs_channel.h"
#include "transport/verbs/verbs_qp.h"

namespace rsock {
namespace {

// IB CM reject reason "invalid service ID": no listener on that port (and,
// with soft-RoCE, sometimes a listener that is not ready yet). iWARP reports
// ECONNREFUSED instead.
constexpr int kRejectNoListener = 8;
constexpr int kNoListenerRetries = 3;  // after the first attempt
constexpr int kRetryDelayMs[kNoListenerRetries] = {20, 60, 150};
// Connect requests a server takes for one TCP connection (its own client's,
// and any that other processes sent naming it): only the one whose sender
// proves, in band, that it holds the connection is used.
constexpr size_t kMaxCandidates = 4;
// A server asleep in a pairing wakes at least this often to read the shared
// listener (other accepting threads may be waiting for its requests).
constexpr int kListenerSliceMs = 20;
// Past its deadline, a forked worker's request to the client's rendezvous
// waits this long beyond one timeout more for the client's accept or
// refusal (the client may be accepting it right now), then is withdrawn:
// the client cannot have committed before we read its accept, so that is
// never a guess (docs/protocol.md section 7, commit points).
constexpr int64_t kResolveGraceMs = 2000;
// A pairing whose peer may be committing waits for the peer's decision
// rather than guess, up to kPeerDecisionMs (pairing.h) beyond one timeout
// more; the client waits this much longer still, so that it is never the
// one to give up on a server that is answering.
constexpr int64_t kClientExtraMs = 4000;

int ms_left(int64_t deadline) {
  int64_t left = deadline - monotonic_ms();
  return left < 0 ? 0 : left > INT32_MAX ? INT32_MAX : static_cast<int>(left);
}

int log2_of(size_t v) {
  int n = 0;
  while ((size_t{1} << n) < v) ++n;
  return n;
}

// A nonzero random challenge, and random key bytes.
uint64_t random_challenge() {
  uint64_t v = 0;
  while (v == 0)
    if (getrandom(&v, sizeof v, 0) != sizeof v) v = 0;
  return v;
}
void random_key(uint8_t* key) {
  size_t got = 0;
  while (got < kProofKeyBytes) {
    ssize_t n = getrandom(key + got, kProofKeyBytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
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
void global_init() { verbs_global_init(); }

}  // namespace

void verbs_global_init() {
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

namespace {

// ------------------------------------------------------------ rdma_cm I/O --

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
// event type + 1 (its status in *status), or -1 on timeout. Copies the
// event's private data into priv (up to len bytes; *priv_len = its length).
int wait_for(rdma_event_channel* ch, rdma_cm_event_type want, int64_t deadline, int* status,
             void* priv = nullptr, size_t len = 0, size_t* priv_len = nullptr) {
  rdma_cm_event* ev = next_event(ch, deadline);
  if (!ev) return -1;
  const rdma_cm_event_type type = ev->event;
  *status = ev->status;
  if (type == want && priv) {
    const size_t n = ev->param.conn.private_data ? ev->param.conn.private_data_len : 0;
    if (priv_len) *priv_len = n;
    if (n) memcpy(priv, ev->param.conn.private_data, n < len ? n : len);
  }
  rdma_ack_cm_event(ev);
  return type == want ? 0 : static_cast<int>(type) + 1;
}

bool no_listener(int r, int status) {
  return r > 0 && static_cast<rdma_cm_event_type>(r - 1) == RDMA_CM_EVENT_REJECTED &&
         (status == kRejectNoListener || status == -ECONNREFUSED);
}

// The request names this TCP connection (as its client sees it)?
bool names_connection(const ConnectInfo& c, const WireAddr& client, const WireAddr& server) {
  return same_wire(c.client, client) && same_wire(c.server, server);
}

// The address an rdma_cm request came from is `addr` (ports aside)?
bool comes_from(rdma_cm_id* id, const WireAddr& addr) {
  WireAddr from;
  const sockaddr* pa = rdma_get_peer_addr(id);
  return pa && to_wire(pa, &from) && memcmp(from.addr, addr.addr, 16) == 0;
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

rdma_conn_param conn_param(const void* priv, size_t len) {
  rdma_conn_param cp = {};
  cp.private_data = priv;
  cp.private_data_len = static_cast<uint8_t>(len);
  cp.retry_count = kVerbsRetryCount;
  cp.rnr_retry_count = 7;  // infinite: see verbs_channel.cpp, message credits
  return cp;
}

// The bounds of registered rings (verbs_rings.h), from the configuration.
void verbs_rings_configure(const Config& cfg) {
  verbs_set_pinned_limit(cfg.rdma_pinned);
  VerbsEngine::set_kept_limit(cfg.region_cache);
}

// Why a channel could not be made (VerbsChannel::create's error), logged.
Fallback channel_failure(int err) {
  if (err == -ENOBUFS) {
    LOG_INFO(
        "rdma: this process's RDMA rings pin %llu bytes, its bound is %llu "
        "(RSOCK_RDMA_PINNED, or RLIMIT_MEMLOCK without CAP_IPC_LOCK): this connection "
        "stays on TCP",
        static_cast<unsigned long long>(verbs_pinned_bytes()),
        static_cast<unsigned long long>(verbs_pinned_limit()));
    return Fallback::kRdmaPinnedLimit;
  }
  LOG_INFO("rdma: queue pair/registration failed: %s", strerror(-err));
  return Fallback::kResources;
}

// Sends the connect request `req` on ch's id. false (logged) on failure.
bool send_request(VerbsChannel& ch, const ConnectInfo& req) {
  uint8_t priv[kConnectPrivBytes];
  encode_connect_priv(req, priv);
  rdma_conn_param cp = conn_param(priv, sizeof priv);
  if (rdma_connect(ch.id(), &cp) == 0) return true;
  LOG_INFO("rdma: rdma_connect: %s", strerror(errno));
  return false;
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
  cm.ch = verbs_event_channel();
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
    *why = monotonic_ms() >= deadline ? Fallback::kPairTimeout : Fallback::kNotSameHost;
    LOG_DEBUG("rdma: no route to the peer (status %d)", status);
    return nullptr;
  }
  note_device(cm.id);
  int err = 0;
  std::unique_ptr<VerbsChannel> ch =
      VerbsChannel::create(cm.id, cm.ch, size_t{1} << ring_log2, &err);
  if (!ch) {
    *why = channel_failure(err);
    return nullptr;
  }
  cm.id = nullptr;  // owned by the channel now
  cm.ch = nullptr;
  return ch;
}

// The passive side of one request: its own event channel, a channel of
// 2^ring_log2 bytes, and the accept carrying `accept`. nullptr with *why
// (the request is rejected; destroying an id that is still on a shared
// channel takes `lock`, or none).
std::unique_ptr<VerbsChannel> accept_one(rdma_cm_id* req_id, int ring_log2,
                                         const AcceptInfo& accept, std::mutex* lock,
                                         Fallback* why) {
  CmPair cm;
  cm.id = req_id;
  cm.ch = verbs_event_channel();
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
  // EINVAL from the queue pair's creation or from rdma_accept: the request
  // is no longer waiting for an answer (rdma_cm moved it on when its sender
  // withdrew it: a peer that gave up, as a forked worker does at its bound).
  int err = 0;
  std::unique_ptr<VerbsChannel> ch =
      VerbsChannel::create(cm.id, cm.ch, size_t{1} << ring_log2, &err);
  if (!ch) {
    if (err == -EINVAL) {
      LOG_INFO("rdma: the connect request was withdrawn before we could accept it");
      *why = Fallback::kPairTimeout;
    } else {
      *why = channel_failure(err);
    }
    rdma_reject(cm.id, nullptr, 0);
    return nullptr;
  }
  cm.id = nullptr;
  cm.ch = nullptr;
  uint8_t priv[kAcceptPrivBytes];
  encode_accept_priv(accept, priv);
  rdma_conn_param cp = conn_param(priv, sizeof priv);
  if (rdma_accept(ch->id(), &cp) != 0) {
    const int e = errno;
    LOG_INFO("rdma: rdma_accept: %s%s", strerror(e),
             e == EINVAL ? " (the connect request was withdrawn)" : "");
    *why = e == EINVAL ? Fallback::kPairTimeout : Fallback::kPairFailed;
    return nullptr;
  }
  return ch;
}

// ----------------------------------------------------------- in-band I/O --
// The proofs travel on the TCP connection itself. The socket may be
// nonblocking (the application's flags): every call here is MSG_DONTWAIT
// and waits with poll, bounded by the deadline.

int send_all(int fd, const uint8_t* buf, size_t len, int64_t deadline) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = real().send(fd, buf + done, len - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -errno;
    pollfd p = {fd, POLLOUT, 0};
    if (real().poll(&p, 1, ms_left(deadline)) == 0) return -ETIMEDOUT;
  }
  return 0;
}

// The bytes waiting at the head of the TCP stream, unread: their count
// (0: end of stream), -EAGAIN when none, or another negative errno.
ssize_t peek_stream(int fd, uint8_t* buf, size_t len) {
  ssize_t n = real().recv(fd, buf, len, MSG_PEEK | MSG_DONTWAIT);
  if (n < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  return n;
}

// Reads exactly len bytes that a peek showed to be there.
bool consume(int fd, size_t len) {
  uint8_t buf[64];
  while (len > 0) {
    ssize_t n = real().recv(fd, buf, std::min(len, sizeof buf), MSG_DONTWAIT);
    if (n <= 0) return false;
    len -= static_cast<size_t>(n);
  }
  return true;
}

// A pairing that cannot know whether its peer committed fails the
// connection loudly: both ends see it end, neither carries on alone.
void fail_connection(int tcp_fd) { real().shutdown(tcp_fd, SHUT_RDWR); }

// What the client's first bytes are (see scan_client_proof).
enum class FirstBytes { kNone, kProof, kData, kEnd };

// Looks at the head of a server's TCP stream without waiting: a complete
// client proof is consumed into *proof; application data is left unread.
FirstBytes client_first_bytes(int tcp_fd, ClientProof* proof) {
  uint8_t buf[kClientProofBytes];
  ssize_t n = peek_stream(tcp_fd, buf, sizeof buf);
  if (n == -EAGAIN) return FirstBytes::kNone;
  if (n <= 0) return FirstBytes::kEnd;
  switch (scan_client_proof(buf, static_cast<size_t>(n), proof)) {
    case ProofScan::kNeedMore:
      return FirstBytes::kNone;
    case ProofScan::kNotProof:
      return FirstBytes::kData;
    case ProofScan::kProof:
      return consume(tcp_fd, kClientProofBytes) ? FirstBytes::kProof : FirstBytes::kEnd;
  }
  return FirstBytes::kEnd;
}

}  // namespace

// ------------------------------------------------------------ fork, device --

void verbs_after_fork_child() {
  if (g_device_opened.load(std::memory_order_relaxed))
    g_inherited_device.store(true, std::memory_order_relaxed);
}

bool verbs_usable_here() { return !g_inherited_device.load(std::memory_order_relaxed); }

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

// The client's own rdma_cm listener while it pairs (ConnectInfo.flags).
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
    r->ch = verbs_event_channel();
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
    (void)set_nonblock(r->ch->fd);
    return r.release();
  }
  return nullptr;
}

void verbs_rendezvous_close(VerbsRendezvous* r) { delete r; }

namespace {

// Reads the rendezvous: a valid reverse request for this connection (from
// the server's address), or nullptr (anything else is refused).
rdma_cm_id* take_reverse_request(VerbsRendezvous* rdv, const WireAddr& local, const WireAddr& peer,
                                 ConnectInfo* info) {
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(rdv->ch, &ev) == 0) {
    if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
      rdma_ack_cm_event(ev);
      continue;
    }
    rdma_cm_id* req_id = ev->id;
    const bool ok =
        decode_connect_priv(ev->param.conn.private_data, ev->param.conn.private_data_len, info) &&
        (info->flags & kPrivReverse) && names_connection(*info, local, peer) &&
        comes_from(req_id, peer);
    rdma_ack_cm_event(ev);
    if (ok) return req_id;
    rdma_reject(req_id, nullptr, 0);
    rdma_destroy_id(req_id);
  }
  return nullptr;
}

// The client side (docs/protocol.md section 7): a connect request to the
// server's listener, or the server's own request at our rendezvous (a
// forked worker); once the rdma_cm connection is up, our proof in band and
// the server's answer in band decide. A client pairing runs to completion
// in one run() (connect() waits for it, or its background thread does).
class VerbsClientPairing final : public Pairing {
 public:
  VerbsClientPairing(int tcp_fd, VerbsRendezvous* rdv, const Config& cfg)
      : tcp_fd_(tcp_fd),
        rdv_(rdv),
        ring_log2_(log2_of(cfg.ring_bytes)),
        timeout_ms_(cfg.connect_timeout_ms),
        deadline_(monotonic_ms() + cfg.connect_timeout_ms) {
    verbs_rings_configure(cfg);
  }

  bool run(int64_t /*limit_ms*/) override {
    if (!done_) why_ = pair();
    done_ = true;
    rdv_.reset();
    return true;
  }
  void rebind(int tcp_fd) override { tcp_fd_ = tcp_fd; }
  std::unique_ptr<Channel> take_channel() override { return std::move(channel_); }
  Fallback why() const override { return why_; }

 private:
  Fallback pair() {
    if (!fd_addrs(tcp_fd_, &local_, &peer_)) return Fallback::kPairFailed;
    if (!verbs_available()) return Fallback::kNotSameHost;
    if (!ring_log2_ok(ring_log2_)) return Fallback::kPairFailed;
    global_init();
    for (int attempt = 0;; ++attempt) {
      Fallback why = Fallback::kPairFailed;
      std::unique_ptr<VerbsChannel> ch = open_active(local_, peer_, ring_log2_, deadline_, &why);
      if (!ch) return why;
      ConnectInfo req;
      req.ring_log2 = ring_log2_;
      req.flags = rdv_ ? kPrivClientListens : 0;
      req.client = local_;
      req.server = peer_;
      if (!send_request(*ch, req)) return Fallback::kPairFailed;
      // The answer comes on our request (a server that reads its listener),
      // or as the server's own request at our rendezvous (a forked worker).
      rdma_event_channel* own = ch->id()->channel;
      int r = -1, status = 0;
      uint8_t rep[kAcceptPrivBytes] = {};
      size_t rep_len = 0;
      for (;;) {
        pollfd p[2] = {{own->fd, POLLIN, 0}, {rdv_ ? rdv_->ch->fd : -1, POLLIN, 0}};
        int pr = real().poll(p, 2, ms_left(deadline_));
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) break;
        if (p[1].revents) {
          ConnectInfo rev;
          if (rdma_cm_id* req_id = take_reverse_request(rdv_.get(), local_, peer_, &rev)) {
            ch.reset();  // our request goes unanswered: withdraw it
            LOG_DEBUG("rdma: the server connects to us (reverse)");
            return accept_reverse(req_id, rev);
          }
        }
        if (p[0].revents) {
          r = wait_for(own, RDMA_CM_EVENT_ESTABLISHED, deadline_, &status, rep, sizeof rep,
                       &rep_len);
          break;
        }
      }
      if (r == 0) {
        AcceptInfo acc;
        if (!decode_accept_priv(rep, rep_len, &acc) || acc.ring_log2 != ring_log2_ ||
            acc.client_port != local_.port || acc.challenge == 0) {
          // Nothing was written in band: the server will see our data (or
          // none) and not a proof, so both stay on TCP.
          LOG_WARN("rdma: bad accept private data");
          return Fallback::kPairFailed;
        }
        return prove(std::move(ch), acc.challenge);
      }
      if (no_listener(r, status)) {
        // No listener, or (soft-RoCE) a listener that is not ready yet.
        if (attempt < kNoListenerRetries && ms_left(deadline_) > kRetryDelayMs[attempt]) {
          LOG_DEBUG("rdma: connect rejected (no listener), retrying");
          ch.reset();
          usleep(kRetryDelayMs[attempt] * 1000);
          continue;
        }
        return Fallback::kPeerNotAccelerated;
      }
      if (r < 0) return Fallback::kPairTimeout;  // nothing was written in band
      LOG_DEBUG("rdma: connect failed: %s (status %d)",
                rdma_event_str(static_cast<rdma_cm_event_type>(r - 1)), status);
      return static_cast<rdma_cm_event_type>(r - 1) == RDMA_CM_EVENT_UNREACHABLE
                 ? Fallback::kPairTimeout
                 : Fallback::kPairFailed;
    }
  }

  // A forked worker's request at our rendezvous: accept it, then prove.
  Fallback accept_reverse(rdma_cm_id* req_id, const ConnectInfo& info) {
    AcceptInfo acc;
    acc.ring_log2 = info.ring_log2;
    acc.client_port = local_.port;
    Fallback why = Fallback::kPairFailed;
    std::unique_ptr<VerbsChannel> ch = accept_one(req_id, info.ring_log2, acc, nullptr, &why);
    if (!ch) return why;
    // From our accept on, the server decides: it reads our accept (then
    // its side is up, our ESTABLISHED follows, and we prove, however late)
    // or withdraws its request (then rdma_cm refuses our side, and neither
    // of us wrote anything). Past our deadline we wait for that decision
    // rather than guess: had we torn our side down after the server's was
    // up, only a REJ, which nobody repeats, would tell it.
    int status = 0;
    const int64_t bound = decision_bound();
    int r = wait_for(ch->id()->channel, RDMA_CM_EVENT_ESTABLISHED, bound, &status);
    if (r != 0) {
      if (r > 0)
        LOG_INFO("rdma: the server's request ended before it was established: %s (status %d)",
                 rdma_event_str(static_cast<rdma_cm_event_type>(r - 1)), status);
      else
        LOG_WARN("rdma: the server neither completed nor withdrew its request");
      // Withdrawn (REJECTED, or CONNECT_ERROR: the server's side is gone):
      // it gave up. Nothing was written in band either way.
      const auto ev = static_cast<rdma_cm_event_type>(r - 1);
      return r < 0 || ev == RDMA_CM_EVENT_REJECTED || ev == RDMA_CM_EVENT_CONNECT_ERROR
                 ? Fallback::kPairTimeout
                 : Fallback::kPairFailed;
    }
    return prove(std::move(ch), info.challenge);
  }

  // The rdma_cm connection is up: our proof in band, then the server's
  // answer in band. From the moment our proof is written the server may
  // commit, so from then on only its answer decides: we wait for it past
  // our deadline (the server answers every proof it reads, and it reads
  // the first bytes of every connection it accepted a request for), and
  // keep our queue pair meanwhile (tearing it down would tell the server
  // that we gave up). Only a server that does not answer at all, or a
  // broken connection, fails it loudly.
  Fallback prove(std::unique_ptr<VerbsChannel> ch, uint64_t challenge) {
    ClientProof proof;
    proof.challenge = challenge;
    random_key(proof.key);
    proof.ring = {ch->rx_rkey(), ch->rx_addr()};
    uint8_t out[kClientProofBytes];
    encode_client_proof(proof, out);
    const int64_t answer_deadline = decision_bound() + kClientExtraMs;
    if (int rc = send_all(tcp_fd_, out, sizeof out, answer_deadline); rc < 0) {
      fail_connection(tcp_fd_);
      return rc == -ETIMEDOUT ? Fallback::kPairTimeout : Fallback::kPairFailed;
    }
    // The first bytes from the server are its answer: its application
    // cannot write before the server's pairing is over.
    uint8_t in[kServerProofBytes];
    ServerProof answer;
    for (;;) {
      ssize_t n = peek_stream(tcp_fd_, in, sizeof in);
      if (n == 0 || (n < 0 && n != -EAGAIN)) return Fallback::kPairFailed;  // the server is gone
      if (n > 0) {
        ProofScan s = scan_server_proof(in, static_cast<size_t>(n), &answer);
        if (s == ProofScan::kNotProof) {
          LOG_WARN("rdma: the server answered our proof with something else: failing the "
                   "connection");
          fail_connection(tcp_fd_);
          return Fallback::kPairFailed;
        }
        if (s == ProofScan::kProof) break;
      }
      pollfd p = {tcp_fd_, POLLIN, 0};
      if (real().poll(&p, 1, ms_left(answer_deadline)) == 0) {
        LOG_WARN("rdma: no answer to our proof from the server: failing the connection");
        fail_connection(tcp_fd_);
        return Fallback::kPairTimeout;
      }
    }
    consume(tcp_fd_, kServerProofBytes);
    if (!answer.accept) {
      // The server read our proof, but its rdma_cm peer was not us: whoever
      // answered our request does not hold this connection. Both on TCP.
      LOG_INFO("rdma: the server declined our proof: not pairing");
      return Fallback::kPeerUnproven;
    }
    if (memcmp(answer.key, proof.key, kProofKeyBytes) != 0) {
      fail_connection(tcp_fd_);
      return Fallback::kPeerUnproven;
    }
    if (ch->start(answer.ring.addr, answer.ring.rkey, tcp_fd_) != 0) {
      fail_connection(tcp_fd_);
      return Fallback::kResources;
    }
    channel_ = std::move(ch);  // committed, as the server is
    return Fallback::kPairFailed;  // (not a fallback: the channel is taken)
  }

  // How long we wait for a decision that is the server's: past our
  // deadline and one more timeout, by kPeerDecisionMs (a cooperating server
  // always decides well within it, however busy the hosts).
  int64_t decision_bound() const {
    return std::max(monotonic_ms(), deadline_) + timeout_ms_ + kPeerDecisionMs;
  }

  int tcp_fd_;
  std::unique_ptr<VerbsRendezvous> rdv_;
  const int ring_log2_;
  const int64_t timeout_ms_;
  const int64_t deadline_;  // for everything before the server's side is up
  WireAddr local_ = {}, peer_ = {};
  bool done_ = false;
  std::unique_ptr<Channel> channel_;
  Fallback why_ = Fallback::kPairFailed;
};

}  // namespace

std::unique_ptr<Pairing> verbs_client_pairing(int tcp_fd, VerbsRendezvous* rendezvous,
                                              const Config& cfg) {
  return std::make_unique<VerbsClientPairing>(tcp_fd, rendezvous, cfg);
}

// ------------------------------------------------------------------ server --

class VerbsListener {
 public:
  struct Pending {
    rdma_cm_id* id;
    ConnectInfo info;
    int64_t since_ms;
  };

  std::mutex mu;
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  std::vector<Pending> pending;
  bool inherited = false;  // a fork's child: the parent's listener, unusable here
  // Another process holds this rdma_cm port (an SO_REUSEPORT sibling, or
  // a squatter): no listener here (ch and id are null); like a fork's
  // child, this process pairs through each client's rendezvous.
  bool elsewhere = false;

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

  // Reads the events that are there, without waiting.
  void pump_locked() {
    for (;;) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(ch, &ev) != 0) return;  // EAGAIN: drained
      if (ev->event != RDMA_CM_EVENT_CONNECT_REQUEST) {
        rdma_ack_cm_event(ev);  // nothing else concerns a listener
        continue;
      }
      rdma_cm_id* req_id = ev->id;
      ConnectInfo info;
      bool ok =
          decode_connect_priv(ev->param.conn.private_data, ev->param.conn.private_data_len, &info) &&
          (info.flags & kPrivReverse) == 0;
      // The request must come from the address it names as the client's.
      if (ok && !comes_from(req_id, info.client)) {
        LOG_INFO("rdma: connect request from another address than it names: rejected");
        ok = false;
      }
      rdma_ack_cm_event(ev);
      if (!ok) {
        rdma_reject(req_id, nullptr, 0);
        rdma_destroy_id(req_id);
        continue;
      }
      pending.push_back({req_id, info, monotonic_ms()});
    }
  }

  // Requests nobody accepted in time will never match: refuse them.
  void expire_locked(int64_t max_age_ms) {
    const int64_t now = monotonic_ms();
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

namespace {

// An rdma_cm id binds to `ss` with port 0: the address has an RDMA device
// (a wildcard always binds).
bool address_has_device(const sockaddr_storage& ss) {
  sockaddr_storage any = ss;
  if (any.ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&any)->sin_port = 0;
  else
    reinterpret_cast<sockaddr_in6*>(&any)->sin6_port = 0;
  CmPair probe;
  probe.ch = verbs_event_channel();
  if (!probe.ch || rdma_create_id(probe.ch, &probe.id, nullptr, RDMA_PS_TCP) != 0) return false;
  if (rdma_bind_addr(probe.id, reinterpret_cast<sockaddr*>(&any)) != 0) return false;
  note_device(probe.id);  // librdmacm keeps the device open (fork: rdma_after_fork)
  return true;
}

}  // namespace

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
  l->ch = verbs_event_channel();
  if (!l->ch || rdma_create_id(l->ch, &l->id, nullptr, RDMA_PS_TCP) != 0) {
    *why = Fallback::kNotSameHost;
    delete l;
    return nullptr;
  }
  (void)set_nonblock(l->ch->fd);
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
    const int err = errno;
    // EADDRNOTAVAIL/ENODEV: the address has no RDMA device, or (rdma_cm
    // says EADDRNOTAVAIL for this too) the port is taken in rdma_cm's port
    // space: an SO_REUSEPORT sibling listens there. The same address with
    // any port tells the two apart.
    if ((err == EADDRNOTAVAIL || err == EADDRINUSE) && address_has_device(bind_ss)) {
      LOG_INFO(
          "rdma: another process holds this rdma_cm port: pairing through the clients' "
          "rendezvous");
      rdma_destroy_id(l->id);
      rdma_destroy_event_channel(l->ch);
      l->id = nullptr;
      l->ch = nullptr;
      l->elsewhere = true;
      return l;
    }
    LOG_DEBUG("rdma: no rdma_cm listener on this address: %s", strerror(err));
    *why = (err == EADDRNOTAVAIL || err == ENODEV) ? Fallback::kNotSameHost : Fallback::kResources;
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

bool verbs_listener_usable(const VerbsListener* listener) {
  return !listener->inherited && !listener->elsewhere;
}

namespace {

// What both server pairings share: the connect requests it accepted
// (candidates, each with its own challenge, queue pair and ring), and the
// decision on the client's first bytes. Stages wait only for the client's
// next step, and each can be resumed (Pairing::run).
//
// Commit rule: once a candidate's rdma_cm connection may be up at the
// client's end, the client may write its proof (it writes as soon as its
// side is established, however late), so falling back silently is allowed
// only when the client's first bytes are application data (it did not
// pair) or when every such candidate has ended from the client's side (a
// client tears its rdma_cm connection down only when it gives up before
// proving; once it proved, it keeps it until our answer). Past our deadline
// we therefore keep waiting for one of the two, up to decision_deadline_;
// a cooperating client always ends that wait, and only a candidate that is
// still there then (an impostor's, or a broken client) fails the connection
// loudly. A reverse request that the client has not accepted yet is
// different: the client's side cannot come up before we read its accept,
// so we may withdraw it at any time (at withdraw_deadline_) and fall back.
class ServerSide : public Pairing {
 public:
  ServerSide(int tcp_fd, const Config& cfg)
      : tcp_fd_(tcp_fd),
        deadline_(monotonic_ms() + cfg.connect_timeout_ms),
        withdraw_deadline_(deadline_ + cfg.connect_timeout_ms + kResolveGraceMs),
        decision_deadline_(deadline_ + cfg.connect_timeout_ms + kPeerDecisionMs) {
    verbs_rings_configure(cfg);
  }

  void rebind(int tcp_fd) override { tcp_fd_ = tcp_fd; }
  std::unique_ptr<Channel> take_channel() override { return std::move(channel_); }
  Fallback why() const override { return why_; }

 protected:
  struct Candidate {
    std::unique_ptr<VerbsChannel> ch;
    uint64_t challenge = 0;
    bool established = false;
  };

  bool finish(Fallback why) {
    why_ = why;
    done_ = true;
    candidates_.clear();  // their queue pairs and rings go (the peers see a disconnect)
    return true;
  }

  // The client proved itself for another request: those that remain were
  // sent by processes that do not hold the connection.
  void reject_remaining() {
    for (size_t i = 0; i < candidates_.size(); ++i)
      stats_reject(Reject::kUnproven, kLogDebug,
                   "rdma pairing: a request that did not prove it holds the connection dropped");
    candidates_.clear();
  }

  // decision_deadline_ passed and a client whose side may be up has neither
  // proved nor given up: a broken peer or an impostor (a cooperating client
  // decides long before). Neither end can know what the other does, so the
  // connection ends, loudly.
  bool unresolved() {
    LOG_WARN(
        "rdma pairing: the client neither proved nor gave up in time: failing the "
        "connection");
    fail_connection(tcp_fd_);
    return finish(Fallback::kPairTimeout);
  }

  // Reads each candidate's rdma_cm events without waiting: ESTABLISHED, or
  // the end of that candidate.
  void poll_candidates() {
    for (size_t i = 0; i < candidates_.size();) {
      Candidate& c = candidates_[i];
      rdma_event_channel* own = c.ch->id()->channel;
      pollfd p = {own->fd, POLLIN, 0};
      bool gone = false;
      while (real().poll(&p, 1, 0) == 1) {
        rdma_cm_event* ev = nullptr;
        if (rdma_get_cm_event(own, &ev) != 0) break;
        if (ev->event == RDMA_CM_EVENT_ESTABLISHED)
          c.established = true;
        else
          gone = true;  // rejected, failed or disconnected before any proof
        rdma_ack_cm_event(ev);
        if (gone) break;
      }
      if (gone)
        candidates_.erase(candidates_.begin() + static_cast<ptrdiff_t>(i));
      else
        ++i;
    }
  }

  // The client's first bytes. Returns true when the pairing finished.
  bool on_first_bytes() {
    ClientProof proof;
    switch (client_first_bytes(tcp_fd_, &proof)) {
      case FirstBytes::kNone:
        return false;
      case FirstBytes::kEnd:
        return finish(Fallback::kPairFailed);
      case FirstBytes::kData:
        // The client did not pair (a plain client, or one that gave up
        // before its side was established): its data stays for the
        // application.
        return finish(Fallback::kPeerNotAccelerated);
      case FirstBytes::kProof:
        return on_proof(proof);
    }
    return false;
  }

  bool on_proof(const ClientProof& proof) {
    ServerProof answer;
    memcpy(answer.key, proof.key, kProofKeyBytes);
    size_t chosen = candidates_.size();
    for (size_t i = 0; i < candidates_.size(); ++i)
      if (proof.challenge == candidates_[i].challenge) chosen = i;
    if (chosen == candidates_.size()) {
      // The TCP peer proved it holds the connection, but for a challenge
      // none of our candidates has: whoever our rdma_cm peers are, they are
      // not it. Decline in band (the client runs librsock: it wrote a proof).
      LOG_INFO("rdma pairing: the client's proof matches none of our requests: declining");
      decline(answer);
      reject_remaining();
      return finish(Fallback::kPeerUnproven);
    }
    Candidate c = std::move(candidates_[chosen]);
    candidates_.erase(candidates_.begin() + static_cast<ptrdiff_t>(chosen));
    if (!candidates_.empty())
      LOG_INFO("rdma pairing: %zu connect request(s) for this connection came from processes "
               "that do not hold it",
               candidates_.size());
    reject_remaining();
    // Its ESTABLISHED follows the client's (the client wrote after its own).
    rdma_event_channel* own = c.ch->id()->channel;
    while (!c.established) {
      int status = 0;
      int r = wait_for(own, RDMA_CM_EVENT_ESTABLISHED, decision_deadline_, &status);
      if (r != 0) {
        decline(answer);
        return finish(r < 0 ? Fallback::kPairTimeout : Fallback::kPairFailed);
      }
      c.established = true;
    }
    if (c.ch->start(proof.ring.addr, proof.ring.rkey, tcp_fd_) != 0) {
      decline(answer);
      return finish(Fallback::kResources);
    }
    answer.accept = true;
    answer.ring = {c.ch->rx_rkey(), c.ch->rx_addr()};
    uint8_t out[kServerProofBytes];
    encode_server_proof(answer, out);
    if (send_all(tcp_fd_, out, sizeof out, decision_deadline_) != 0) {
      fail_connection(tcp_fd_);
      return finish(Fallback::kPairFailed);
    }
    channel_ = std::move(c.ch);  // committed: the client commits on our answer
    return finish(Fallback::kPairFailed);  // (not a fallback: the channel is taken)
  }

  void decline(ServerProof answer) {
    answer.accept = false;
    uint8_t out[kServerProofBytes];
    encode_server_proof(answer, out);
    if (send_all(tcp_fd_, out, sizeof out, decision_deadline_) != 0) fail_connection(tcp_fd_);
  }

  int tcp_fd_;
  const int64_t deadline_;           // no new request is taken after it
  const int64_t withdraw_deadline_;  // see the commit rule above
  const int64_t decision_deadline_;  // see the commit rule above
  std::vector<Candidate> candidates_;
  bool accepted_any_ = false;  // an accept went out: the client may be proving
  bool done_ = false;
  std::unique_ptr<Channel> channel_;
  Fallback why_ = Fallback::kPairFailed;
};

// A server that reads its listener: takes the requests naming its TCP
// connection from the listener's table, accepts each (with its own
// challenge) and waits for the client's first bytes.
class VerbsServerPairing final : public ServerSide {
 public:
  VerbsServerPairing(VerbsListener* l, int tcp_fd, const Config& cfg)
      : ServerSide(tcp_fd, cfg),
        listener_(l),
        max_age_(2 * static_cast<int64_t>(cfg.connect_timeout_ms) + 1000) {}

  bool run(int64_t limit_ms) override {
    if (!done_ && !started_) {
      started_ = true;
      if (!fd_addrs(tcp_fd_, &local_, &peer_)) return finish(Fallback::kPairFailed);
    }
    while (!done_) {
      const int64_t now = monotonic_ms();
      const bool late = now >= deadline_;
      // No request accepted in time: a plain client, or one without RDMA
      // (or one whose request came too late: it never gets an accept, so
      // it writes nothing).
      if (late && !accepted_any_) return finish(Fallback::kPeerNotAccelerated);
      if (now >= limit_ms) return false;
      if (!late) take_requests();
      poll_candidates();
      if (on_first_bytes()) break;
      // Every client we accepted has torn its side down without proving:
      // it gave up (a late one among them would have proved by now only if
      // it had not). Before our deadline the real client's request may
      // still come.
      if (late && candidates_.empty()) return finish(Fallback::kPairTimeout);
      // Only after a last look: a thread that slept past the bound (a busy
      // host) may find the decision waiting.
      if (now >= decision_deadline_) return unresolved();
      // Sleep until the client writes, a candidate moves, or the listener
      // has news; in slices, since other accepting threads share it.
      std::vector<pollfd> p;
      p.push_back({tcp_fd_, POLLIN, 0});
      p.push_back({late ? -1 : listener_->ch->fd, POLLIN, 0});
      for (auto& c : candidates_) p.push_back({c.ch->id()->channel->fd, POLLIN, 0});
      const int wait = std::min(
          {ms_left(late ? decision_deadline_ : deadline_), ms_left(limit_ms), kListenerSliceMs});
      real().poll(p.data(), p.size(), wait);
    }
    return true;
  }

 private:
  // Moves the requests naming our connection out of the listener's table
  // and accepts them, each with a fresh challenge.
  void take_requests() {
    std::vector<VerbsListener::Pending> mine;
    {
      std::lock_guard<std::mutex> lock(listener_->mu);
      listener_->pump_locked();
      listener_->expire_locked(max_age_);
      auto& all = listener_->pending;
      for (size_t i = 0; i < all.size();) {
        if (names_connection(all[i].info, peer_, local_)) {
          mine.push_back(all[i]);
          all[i] = all.back();
          all.pop_back();
        } else {
          ++i;
        }
      }
    }
    for (auto& req : mine) {
      if (taken_ >= kMaxCandidates) {
        std::lock_guard<std::mutex> lock(listener_->mu);
        rdma_reject(req.id, nullptr, 0);
        rdma_destroy_id(req.id);
        stats_reject(Reject::kUnproven, kLogDebug,
                     "rdma pairing: a request beyond the candidates kept rejected");
        continue;
      }
      ++taken_;
      Candidate c;
      c.challenge = random_challenge();
      AcceptInfo acc;
      acc.ring_log2 = req.info.ring_log2;
      acc.client_port = req.info.client.port;
      acc.challenge = c.challenge;
      Fallback why;
      c.ch = accept_one(req.id, req.info.ring_log2, acc, &listener_->mu, &why);
      if (!c.ch) continue;
      accepted_any_ = true;
      candidates_.push_back(std::move(c));
    }
  }

  VerbsListener* listener_;
  const int64_t max_age_;  // a request older than this cannot belong to a waiting client
  bool started_ = false;
  WireAddr local_ = {}, peer_ = {};
  size_t taken_ = 0;
};

// A server process that cannot read its listener (a fork's child): it
// sends its own request, carrying its challenge, to the client's rendezvous
// (its TCP address and port), then waits for the client's first bytes.
class VerbsReversePairing final : public ServerSide {
 public:
  VerbsReversePairing(int tcp_fd, const Config& cfg)
      : ServerSide(tcp_fd, cfg), ring_log2_(log2_of(cfg.ring_bytes)) {}

  bool run(int64_t limit_ms) override {
    if (!done_ && !started_) {
      started_ = true;
      if (!fd_addrs(tcp_fd_, &local_, &peer_) || !ring_log2_ok(ring_log2_))
        return finish(Fallback::kPairFailed);
      global_init();
      if (!send_reverse_request()) return true;
    }
    while (!done_) {
      const int64_t now = monotonic_ms();
      if (now >= limit_ms) return false;
      // Past a bound only after a last look (below): a thread that slept
      // past it (a busy host) may find the decision waiting.
      const bool withdraw = now >= withdraw_deadline_;
      const bool last_look = now >= decision_deadline_;
      if (retry_at_ > 0) {
        // Waiting to ask again. A plain client that speaks meanwhile ends
        // the wait (a librsock client writes nothing before its pairing
        // ended, and it cannot end in a pairing with us before we ask).
        uint8_t b;
        ssize_t n = peek_stream(tcp_fd_, &b, 1);
        if (n > 0) return finish(Fallback::kPeerNotAccelerated);
        if (n != -EAGAIN) return finish(Fallback::kPairFailed);  // EOF or an error
        if (now >= retry_at_) {
          retry_at_ = 0;
          if (!send_reverse_request()) return true;
          continue;
        }
        pollfd p = {tcp_fd_, POLLIN, 0};
        real().poll(&p, 1, std::min(ms_left(retry_at_), ms_left(limit_ms)));
        continue;
      }
      if (!accepted_any_) {
        // Waiting for the client's accept: ESTABLISHED (we are the active
        // side, so ours comes first), or its refusal. Past our deadline
        // too, up to withdraw_deadline_: the client may be accepting our
        // request right now. Its side comes up only after we read its
        // accept here (librdmacm sends our RTU then), so until then we may
        // withdraw the request at any time and fall back without a guess:
        // a client that accepted it then sees it end and writes nothing.
        // Once we read its accept, its side comes up and it proves, however
        // late (it waits for our decision from its accept on).
        // Meanwhile the client's first bytes may tell: application data
        // means that it did not pair (its pairing is over: our request can
        // no longer be accepted), so there is nothing to wait for. (A proof
        // cannot come before our side is established; its event is then
        // on its way.)
        uint8_t head[kClientProofBytes];
        ClientProof seen;
        ssize_t n = peek_stream(tcp_fd_, head, sizeof head);
        if (n == 0 || (n < 0 && n != -EAGAIN)) return finish(Fallback::kPairFailed);  // gone
        const ProofScan scan =
            n > 0 ? scan_client_proof(head, static_cast<size_t>(n), &seen) : ProofScan::kNeedMore;
        if (scan == ProofScan::kNotProof) return finish(Fallback::kPeerNotAccelerated);
        if (scan == ProofScan::kProof && seen.challenge != challenge_) {
          // The client proved an rdma_cm connection that is not ours: its
          // own request reached whoever else holds the port (an impostor,
          // when another process listens there). Declined in band: both on
          // TCP, and the proof never reaches our application.
          LOG_INFO("rdma pairing: the client proved a request that is not ours: declining");
          consume(tcp_fd_, kClientProofBytes);
          ServerProof answer;
          memcpy(answer.key, seen.key, kProofKeyBytes);
          decline(answer);
          return finish(Fallback::kPeerUnproven);
        }
        rdma_event_channel* own = active_->id()->channel;
        // (Bytes that may still become a proof are looked at again soon.)
        pollfd p[2] = {{own->fd, POLLIN, 0}, {n > 0 ? -1 : tcp_fd_, POLLIN, 0}};
        int wait = withdraw ? 0 : std::min(ms_left(withdraw_deadline_), ms_left(limit_ms));
        real().poll(p, 2, n > 0 ? std::min(wait, 10) : wait);
        int status = 0;
        int r = (p[0].revents & POLLIN) ? wait_for(own, RDMA_CM_EVENT_ESTABLISHED, monotonic_ms(),
                                                   &status, rep_, sizeof rep_, &rep_len_)
                                        : -1;
        if (r < 0 && withdraw) {
          // No answer to our request in time: withdrawn (rdma_cm rejects
          // it, so a client that is accepting it now fails to and stays on
          // TCP). Any proof in front of the data cannot be for a side of
          // ours that was never up: declined, so that it never reaches the
          // application.
          LOG_INFO("rdma pairing: the client did not answer our request in time: withdrawing it");
          active_.reset();
          if (scan == ProofScan::kProof) {
            consume(tcp_fd_, kClientProofBytes);
            ServerProof answer;
            memcpy(answer.key, seen.key, kProofKeyBytes);
            decline(answer);
          }
          return finish(Fallback::kPairTimeout);
        }
        if (r < 0) continue;  // bytes, the limit or the bound: looked at above
        if (no_listener(r, status)) {
          // No rendezvous: a plain client, or one that has given up. Or
          // soft-RoCE, which sometimes refuses the first request to a
          // listener just made (and a rendezvous always is): ask again a
          // few times within our deadline, as a client does (section 7).
          if (attempt_ < kNoListenerRetries && ms_left(deadline_) > kRetryDelayMs[attempt_]) {
            LOG_INFO("rdma pairing: our request was refused as \"no listener\": asking again");
            retry_at_ = monotonic_ms() + kRetryDelayMs[attempt_++];
            active_.reset();
            continue;
          }
          return finish(Fallback::kPeerNotAccelerated);
        }
        if (r > 0) {
          const auto ev = static_cast<rdma_cm_event_type>(r - 1);
          LOG_INFO("rdma pairing: the client did not accept our request: %s (status %d)",
                   rdma_event_str(ev), status);
          // A client refuses a request that names its connection, or
          // withdraws after accepting it (CONNECT_ERROR: our RTU found its
          // side gone), only when it gives up: its deadline passed. Other
          // ends of a request are errors. Nothing was written either way.
          return finish(ev == RDMA_CM_EVENT_REJECTED || ev == RDMA_CM_EVENT_CONNECT_ERROR
                            ? Fallback::kPairTimeout
                            : Fallback::kPairFailed);
        }
        AcceptInfo acc;
        const bool good = decode_accept_priv(rep_, rep_len_, &acc) && acc.ring_log2 == ring_log2_ &&
                          acc.client_port == peer_.port;
        // A bad accept is still an accept: the client's side comes up now
        // and it may prove. Kept with a challenge that no proof matches
        // (ours are never 0), so that a proof is declined in band.
        if (!good) LOG_WARN("rdma pairing: bad accept private data on our request");
        accepted_any_ = true;
        Candidate c;
        c.ch = std::move(active_);
        c.challenge = good ? challenge_ : 0;
        c.established = true;
        candidates_.push_back(std::move(c));
        continue;
      }
      poll_candidates();
      if (on_first_bytes()) break;
      // The client tore its side down without proving: it gave up.
      if (candidates_.empty()) return finish(Fallback::kPairTimeout);
      if (last_look) return unresolved();
      pollfd p[2] = {{tcp_fd_, POLLIN, 0}, {candidates_[0].ch->id()->channel->fd, POLLIN, 0}};
      real().poll(p, 2, std::min(ms_left(decision_deadline_), ms_left(limit_ms)));
    }
    return true;
  }

 private:
  // Our request (again, after a refusal as "no listener"), with a fresh
  // challenge. false: finished.
  bool send_reverse_request() {
    Fallback why = Fallback::kPairFailed;
    // The client's rendezvous is its TCP address and port.
    active_ = open_active(local_, peer_, ring_log2_, deadline_, &why);
    if (!active_) return finish(why), false;
    challenge_ = random_challenge();
    ConnectInfo req;
    req.ring_log2 = ring_log2_;
    req.flags = kPrivReverse;
    req.client = peer_;  // the 4-tuple as the client sees it: we are its server
    req.server = local_;
    req.challenge = challenge_;
    if (!send_request(*active_, req)) return finish(Fallback::kPairFailed), false;
    return true;
  }

  const int ring_log2_;
  bool started_ = false;
  int attempt_ = 0;       // requests refused as "no listener" so far
  int64_t retry_at_ = 0;  // > 0: ask again at this time
  WireAddr local_ = {}, peer_ = {};
  std::unique_ptr<VerbsChannel> active_;  // until the client accepts
  uint64_t challenge_ = 0;
  uint8_t rep_[kAcceptPrivBytes] = {};
  size_t rep_len_ = 0;
};

}  // namespace

std::unique_ptr<Pairing> verbs_server_pairing(VerbsListener* listener, int tcp_fd,
                                              const Config& cfg) {
  return std::make_unique<VerbsServerPairing>(listener, tcp_fd, cfg);
}

std::unique_ptr<Pairing> verbs_reverse_pairing(int tcp_fd, const Config& cfg) {
  return std::make_unique<VerbsReversePairing>(tcp_fd, cfg);
}

}  // namespace rsock
