// Which transport carries a candidate stream, and how its pairing starts
// (see setup.h): the one place that names the transports.
#include "transport/setup.h"

#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "common/real.h"
#include "transport/shm/arena.h"
#include "transport/shm/region_cache.h"
#include "transport/shm/rendezvous.h"
#include "transport/shm/shm_linger.h"
#include "transport/verbs/verbs_channel.h"
#include "transport/verbs/verbs_engine.h"
#include "transport/verbs/verbs_setup.h"

namespace rsock {

namespace {

// A pairing decided before it began: it finishes at once, on TCP, with why.
class DecidedPairing final : public Pairing {
 public:
  explicit DecidedPairing(Fallback why) : why_(why) {}
  bool run(int64_t) override { return true; }
  bool driven() const override { return true; }
  bool step() override { return true; }
  void rebind(int) override {}
  std::unique_ptr<Channel> take_channel() override { return nullptr; }
  Fallback why() const override { return why_; }

 private:
  const Fallback why_;
};

// The rendezvous socket of a same-host client, or -1 with *why.
int shm_rendezvous(int fd, const sockaddr* addr, Fallback* why) {
  if (!shm_server_advertised(addr)) {
    *why = Fallback::kPeerNotAccelerated;
    return -1;
  }
  const int rfd = shm_client_prepare(fd, addr);
  if (rfd >= 0) return rfd;
  if (rfd == -EADDRINUSE) {
    // Another process holds our rendezvous name: whoever it is, it gets
    // nothing; this connection stays on TCP.
    LOG_INFO("connect fd %d: the rendezvous name is taken by another process", fd);
    *why = Fallback::kRendezvousTaken;
  } else {
    LOG_DEBUG("connect fd %d: rendezvous failed (%s)", fd, strerror(-rfd));
    *why = Fallback::kResources;
  }
  return -1;
}

// The client's rendezvous is made before its connect(), or (lazy, for a
// connection that runs on TCP until its pairing) only when the pairing
// begins: a connection that ends first costs no rendezvous at all, and the
// server looks for it until its deadline (docs/protocol.md section 2).
class ShmClientSetup final : public ClientSetup {
 public:
  explicit ShmClientSetup(int rendezvous_fd) : fd_(rendezvous_fd) {}
  explicit ShmClientSetup(const sockaddr* addr) : lazy_(true) {
    memcpy(&addr_, addr, addr->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  }
  ~ShmClientSetup() override {
    if (fd_ >= 0) real().close(fd_);
  }
  Path path() const override { return Path::kShm; }
  bool driven() const override { return true; }
  std::unique_ptr<Pairing> pairing(int sock, const Config& cfg) override {
    if (lazy_) {
      Fallback why;
      const int rfd = shm_rendezvous(sock, reinterpret_cast<const sockaddr*>(&addr_), &why);
      if (rfd < 0) return std::make_unique<DecidedPairing>(why);
      return shm_client_pairing(sock, rfd, cfg);
    }
    const int fd = fd_;
    fd_ = -1;  // the pairing's now
    return shm_client_pairing(sock, fd, cfg);
  }

 private:
  int fd_ = -1;
  bool lazy_ = false;
  sockaddr_storage addr_ = {};
};

class RdmaClientSetup final : public ClientSetup {
 public:
  explicit RdmaClientSetup(VerbsRendezvous* rdv) : rdv_(rdv) {}
  ~RdmaClientSetup() override { verbs_rendezvous_close(rdv_); }
  Path path() const override { return Path::kRdma; }
  std::unique_ptr<Pairing> pairing(int sock, const Config& cfg) override {
    VerbsRendezvous* r = rdv_;
    rdv_ = nullptr;
    return verbs_client_pairing(sock, r, cfg);
  }

 private:
  VerbsRendezvous* rdv_;
};

// A peer address with port 0: the key of the server side's negative cache,
// which remembers hosts (a client's source port changes every time).
sockaddr_storage host_key(const sockaddr* peer) {
  sockaddr_storage k = {};
  memcpy(&k, peer, peer->sa_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
  if (k.ss_family == AF_INET)
    reinterpret_cast<sockaddr_in*>(&k)->sin_port = 0;
  else
    reinterpret_cast<sockaddr_in6*>(&k)->sin6_port = 0;
  return k;
}

}  // namespace

std::unique_ptr<ClientSetup> client_setup(int fd, const sockaddr* addr, TransportKind kind,
                                          bool lazy, Fallback* why) {
  // Same host: shared memory, unless the rule forces RDMA. Another host:
  // RDMA, unless the rule forces shared memory.
  const bool local = is_local_address(addr);
  const bool use_shm = kind == TransportKind::kShm || (kind == TransportKind::kAuto && local);
  if (negative_cache_hit(addr)) {
    *why = Fallback::kNegativeCache;
  } else if (use_shm) {
    if (!local) {
      *why = Fallback::kNotSameHost;
    } else if (lazy) {
      return std::make_unique<ShmClientSetup>(addr);
    } else if (const int rfd = shm_rendezvous(fd, addr, why); rfd >= 0) {
      return std::make_unique<ShmClientSetup>(rfd);
    }
  } else if (!verbs_available()) {
    *why = Fallback::kNoRdmaDevice;
  } else if (!verbs_usable_here()) {
    *why = Fallback::kRdmaAfterFork;
  } else {
    return std::make_unique<RdmaClientSetup>(verbs_client_prepare(fd, addr));
  }
  return nullptr;
}

void client_fell_back(const sockaddr* addr, Fallback why) {
  if (why == Fallback::kPairTimeout || why == Fallback::kPeerNotAccelerated)
    negative_cache_add(addr);
}

void transports_after_fork_child() {
  verbs_after_fork_child();
  VerbsEngine::after_fork_child();
  shm_linger_after_fork_child();
  arena_after_fork_child();  // (before the kept regions' places are given up)
  region_cache_after_fork_child();
}

void transports_fork_prepare() {
  shm_linger_fork_prepare();
  region_cache_fork_prepare();
  arena_fork_prepare();
}

void transports_after_fork_parent() {
  arena_after_fork_parent();
  region_cache_after_fork_parent();
  shm_linger_after_fork_parent();
}

void transports_fork_prepare_last() { VerbsEngine::fork_prepare(); }

void transports_after_fork_parent_first() { VerbsEngine::after_fork_parent(); }

void transports_own_fds(std::vector<int>* out) {
  VerbsEngine::own_fds(out);
  shm_linger_own_fds(out);
  arena_own_fds(out);
}

void transports_at_exit() {
  shm_linger_settle();
  VerbsEngine::settle_lingering(monotonic_ms() + kVerbsMoveMs);
}

void transports_before_exec() { transports_at_exit(); }

struct ListenSetup::Impl {
  int marker_fd = -1;              // the same-host advertisement (-1: none, or another
                                   // process holds it)
  VerbsListener* verbs = nullptr;  // the rdma_cm listener, or nullptr
  bool shm_allowed = false;
};

ListenSetup::ListenSetup(int fd, TransportKind kind) : impl_(std::make_unique<Impl>()) {
  impl_->shm_allowed = kind != TransportKind::kRdma;
  if (impl_->shm_allowed) {
    impl_->marker_fd = shm_advertise_listener(fd);
    if (impl_->marker_fd < 0 && impl_->marker_fd != -EADDRINUSE)
      LOG_WARN("listen fd %d: cannot advertise (%s); same-host clients will use TCP", fd,
               strerror(-impl_->marker_fd));
  }
  if (kind != TransportKind::kShm && verbs_available() && verbs_usable_here()) {
    Fallback why;
    impl_->verbs = verbs_listen(fd, &why);
    if (!impl_->verbs) LOG_INFO("listen fd %d: no rdma_cm listener (%s)", fd, fallback_name(why));
  }
}

ListenSetup::~ListenSetup() {
  if (impl_->marker_fd >= 0) real().close(impl_->marker_fd);
  if (impl_->verbs) verbs_listener_close(impl_->verbs);
}

bool ListenSetup::has(Path path) const {
  return path == Path::kShm ? impl_->shm_allowed : impl_->verbs != nullptr;
}

void ListenSetup::forked_child() {
  if (impl_->verbs) verbs_listener_forked_child(impl_->verbs);
}

std::unique_ptr<Pairing> ListenSetup::accept(int sock, const sockaddr* peer, const Config& cfg,
                                             Path* path, Fallback* why) {
  *path = Path::kShm;
  *why = Fallback::kPairFailed;
  sockaddr_storage asked;
  if (peer == nullptr) {
    socklen_t plen = sizeof asked;
    if (getpeername(sock, reinterpret_cast<sockaddr*>(&asked), &plen) != 0) return nullptr;
    peer = reinterpret_cast<const sockaddr*>(&asked);
  }
  const sockaddr* pa = peer;
  const sockaddr_storage key = host_key(pa);
  const sockaddr* host = reinterpret_cast<const sockaddr*>(&key);
  if (impl_->shm_allowed && is_local_address(pa)) return shm_server_pairing(sock, cfg);
  if (impl_->verbs == nullptr) {
    *why = !verbs_available()   ? Fallback::kNoRdmaDevice
           : impl_->shm_allowed ? Fallback::kNotSameHost
                                : Fallback::kPeerNotAccelerated;
    return nullptr;
  }
  if (!verbs_usable_here()) {
    *why = Fallback::kRdmaAfterFork;
    return nullptr;
  }
  *path = Path::kRdma;
  if (!verbs_listener_usable(impl_->verbs)) {
    // A fork's child (the parent's listener cannot be read here), or an
    // SO_REUSEPORT sibling of the process that holds the rdma_cm port: we
    // connect to the client's rendezvous ourselves (a plain client has
    // none: peer_not_accelerated).
    return verbs_reverse_pairing(sock, cfg);
  }
  if (negative_cache_hit(host)) {
    // A host that did not pair recently (a plain client, or no RDMA): no
    // new wait.
    *why = Fallback::kNegativeCache;
    return nullptr;
  }
  return verbs_server_pairing(impl_->verbs, sock, cfg);
}

std::unique_ptr<Channel> ListenSetup::result(Pairing& p, int sock, Path path, Fallback* why) {
  std::unique_ptr<Channel> ch = p.take_channel();
  *why = p.why();
  if (!ch && path == Path::kRdma && *why == Fallback::kPeerNotAccelerated) {
    sockaddr_storage peer;
    socklen_t plen = sizeof peer;
    if (getpeername(sock, reinterpret_cast<sockaddr*>(&peer), &plen) == 0) {
      const sockaddr_storage key = host_key(reinterpret_cast<const sockaddr*>(&peer));
      negative_cache_add(reinterpret_cast<const sockaddr*>(&key));
    }
  }
  return ch;
}

}  // namespace rsock
