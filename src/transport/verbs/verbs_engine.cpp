// VerbsEngine (see verbs_engine.h).
#include "transport/verbs/verbs_engine.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <new>

#include "common/clock.h"
#include "common/log.h"
#include "common/own_fd.h"
#include "common/quiet_thread.h"
#include "common/real.h"
#include "stats/stats.h"
#include "transport/verbs/verbs_qp.h"

namespace rsock {

struct VerbsEngine::Cq {
  ibv_cq* cq = nullptr;
  int members = 0;
  int capacity = 0;       // queue pairs it has room for
  int armed = 0;          // sleepers of its members
  bool notified = false;  // a notification is requested and its event not yet taken
  int kicked = 0;         // run(): sleepers of the members it just kicked
};

namespace {

// Room is made for this many queue pairs at a time (a new CQ, or a resize
// of the last one), up to the device's limit.
constexpr int kQpsPerStep = 4;
constexpr int kBatch = 32;  // completions per ibv_poll_cq
// While queue pairs linger, the thread also looks this often (their
// verdicts come as completions; the look bounds a device that stays mute).
constexpr int kLingerLookMs = 100;

// Every engine of this process. The list is never destroyed (an engine's
// thread may run while the process exits; std::mutex has nothing to destroy).
std::mutex g_mu;
std::atomic<size_t> g_kept_limit{16};  // RSOCK_REGION_CACHE
std::vector<VerbsEngine*>& engines() {
  static auto* list = new std::vector<VerbsEngine*>();
  return *list;
}

}  // namespace

ibv_cq* VerbsEngine::Member::cq() const { return cq_ ? cq_->cq : nullptr; }

void VerbsEngine::Member::forget() {
  engine_ = nullptr;
  cq_ = nullptr;
  id_ = nullptr;
  cm_inbox_.clear();
  has_qpn_ = kick_due_ = false;
  armed_ = 0;
  inbox_.clear();
}

VerbsEngine* VerbsEngine::make(ibv_context* ctx, bool own_ctx, int* err) {
  // (Under g_mu.) A context rdma_cm opened gets an event channel for its
  // connections' ids too.
  ibv_device_attr da = {};
  if (ibv_query_device(ctx, &da) != 0) {
    *err = errno ? -errno : -ENODEV;
    return nullptr;
  }
  ibv_comp_channel* comp = verbs_comp_channel(ctx);
  if (!comp) {
    *err = errno ? -errno : -ENOMEM;
    return nullptr;
  }
  if (const int rc = set_nonblock(comp->fd); rc < 0) {
    *err = rc;
    ibv_destroy_comp_channel(comp);
    return nullptr;
  }
  rdma_event_channel* cm = nullptr;
  if (!own_ctx) {
    cm = verbs_event_channel();
    const int rc = cm ? set_nonblock(cm->fd) : errno ? -errno : -ENOMEM;
    if (rc < 0) {
      *err = rc;
      if (cm) rdma_destroy_event_channel(cm);
      ibv_destroy_comp_channel(comp);
      return nullptr;
    }
  }
  auto* e = new (std::nothrow) VerbsEngine();
  if (!e) {
    *err = -ENOMEM;
    if (cm) rdma_destroy_event_channel(cm);
    ibv_destroy_comp_channel(comp);
    return nullptr;
  }
  e->cm_ = cm;
  e->ctx_ = ctx;
  e->own_ctx_ = own_ctx;
  e->comp_ = comp;
  e->max_cqe_ = da.max_cqe;
  engines().push_back(e);
  *err = 0;
  return e;
}

VerbsEngine* VerbsEngine::of_context(ibv_context* ctx, int* err) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (VerbsEngine* e : engines())
    if (e->ctx_ == ctx) {
      *err = 0;
      return e;
    }
  return make(ctx, false, err);
}

VerbsEngine* VerbsEngine::of_opened(ibv_context* opened, int* err) {
  std::lock_guard<std::mutex> lock(g_mu);
  const char* name = ibv_get_device_name(opened->device);
  for (VerbsEngine* e : engines())
    if (name && strcmp(ibv_get_device_name(e->ctx_->device), name) == 0) {
      ibv_close_device(opened);
      *err = 0;
      return e;
    }
  VerbsEngine* e = make(opened, true, err);
  if (!e) ibv_close_device(opened);
  return e;
}

// ------------------------------------------------------------- members --

int VerbsEngine::grow_locked(int cqe_per_qp) {
  // The last CQ grows while the device allows; then a new one.
  if (!cqs_.empty()) {
    Cq* last = cqs_.back();
    const int want = (last->capacity + kQpsPerStep) * cqe_per_qp;
    if (want <= max_cqe_ && ibv_resize_cq(last->cq, want) == 0) {
      last->capacity = last->cq->cqe / cqe_per_qp;
      return 0;
    }
  }
  int qps = kQpsPerStep;
  while (qps > 1 && qps * cqe_per_qp > max_cqe_) --qps;
  if (qps * cqe_per_qp > max_cqe_) return -ENOMEM;  // one queue pair's work does not fit
  auto* c = new (std::nothrow) Cq();
  if (!c) return -ENOMEM;
  c->cq = ibv_create_cq(ctx_, qps * cqe_per_qp, c, comp_, 0);
  if (!c->cq) {
    const int e = errno ? -errno : -ENOMEM;
    delete c;
    return e;
  }
  c->capacity = c->cq->cqe / cqe_per_qp;
  cqs_.push_back(c);
  return 0;
}

int VerbsEngine::join(Member* m, int cqe_per_qp, KickFn kick, void* kick_arg, int armed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!thread_started_) {
    // The thread that wakes sleepers: without it an armed member would
    // sleep through its completions, so no member joins. It sleeps
    // without a timeout while nothing lingers, so the first queue pair
    // that lingers wakes it (wake_fd_) to look at its deadline, which is
    // the only bound on a device that retries without end (soft-RoCE
    // takes a retry count of 7 as infinite). Without the eventfd, closes
    // wait for their verdict themselves.
    if (wake_fd_ < 0) wake_fd_ = lift_fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (int rc = spawn_quiet_thread(&VerbsEngine::thread_main, this); rc != 0) return -rc;
    thread_started_ = true;
  }
  Cq* room = nullptr;
  for (Cq* c : cqs_)
    if (c->members < c->capacity) room = c;
  if (!room) {
    if (int rc = grow_locked(cqe_per_qp); rc < 0) return rc;
    for (Cq* c : cqs_)
      if (c->members < c->capacity) room = c;
    if (!room) return -ENOMEM;
  }
  ++room->members;
  ++members_;
  m->engine_ = this;
  m->cq_ = room;
  m->has_qpn_ = false;
  m->kick_due_ = false;
  m->armed_ = armed;
  m->kick_ = kick;
  m->kick_arg_ = kick_arg;
  m->inbox_.clear();
  room->armed += armed;
  if (armed > 0) notify_locked(room);
  return 0;
}

void VerbsEngine::set_qp(Member* m, uint32_t qpn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (m->has_qpn_) {
    auto it = by_qpn_.find(m->qpn_);
    if (it != by_qpn_.end() && it->second == m) by_qpn_.erase(it);
  }
  m->qpn_ = qpn;
  m->has_qpn_ = true;
  by_qpn_[qpn] = m;
}

void VerbsEngine::set_kick(Member* m, KickFn kick, void* kick_arg) {
  std::lock_guard<std::mutex> lock(mu_);
  m->kick_ = kick;
  m->kick_arg_ = kick_arg;
}

int VerbsEngine::adopt_id(Member* m, rdma_cm_id* id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!cm_) return -ENOTSUP;
  // (Under our lock: an event of the id that comes at once waits for the
  // map to name m.)
  if (rdma_migrate_id(id, cm_) != 0) return errno ? -errno : -EINVAL;
  m->id_ = id;
  by_id_[id] = m;
  return 0;
}

void VerbsEngine::leave(Member* m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (m->has_qpn_) {
    auto it = by_qpn_.find(m->qpn_);
    if (it != by_qpn_.end() && it->second == m) by_qpn_.erase(it);
  }
  if (m->id_) by_id_.erase(m->id_);
  m->id_ = nullptr;
  m->cm_inbox_.clear();
  if (m->kick_due_) {
    for (auto& d : due_)
      if (d == m) d = nullptr;
  }
  m->cq_->armed -= m->armed_;
  --m->cq_->members;
  --members_;
  m->engine_ = nullptr;
  m->cq_ = nullptr;
  m->has_qpn_ = false;
  m->kick_due_ = false;
  m->armed_ = 0;
  m->inbox_.clear();
  m->inbox_.shrink_to_fit();
}

bool VerbsEngine::linger(Linger* l, Member* from) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!from->cq_ || static_cast<int>(lingering_.size()) >= kMaxLingering) return false;
  if (wake_fd_ < 0) return false;
  Member& to = l->member;
  to.engine_ = this;
  to.cq_ = from->cq_;
  to.qpn_ = from->qpn_;
  to.has_qpn_ = from->has_qpn_;
  to.id_ = from->id_;
  to.kick_ = nullptr;  // nobody sleeps on it: the thread looks
  to.kick_arg_ = nullptr;
  to.kick_due_ = false;
  to.inbox_ = static_cast<std::vector<ibv_wc>&&>(from->inbox_);
  to.cm_inbox_ = static_cast<std::vector<rdma_cm_event_type>&&>(from->cm_inbox_);
  if (to.has_qpn_) by_qpn_[to.qpn_] = &to;
  if (to.id_) by_id_[to.id_] = &to;
  for (auto& d : due_)
    if (d == from) d = nullptr;
  // Armed, so that its CQ stays notified and the thread wakes for it.
  to.cq_->armed += 1 - from->armed_;
  to.armed_ = 1;
  notify_locked(to.cq_);
  from->engine_ = nullptr;
  from->cq_ = nullptr;
  from->has_qpn_ = false;
  from->id_ = nullptr;
  from->armed_ = 0;
  from->kick_due_ = false;
  lingering_.push_back(l);
  if (lingering_.size() == 1) {
    const uint64_t one = 1;
    (void)!real().write(wake_fd_, &one, sizeof one);
  }
  return true;
}

// The lingering queue pairs whose verdict came (a completion of the last
// signaled work request or of an error, a disconnect or another event of
// their id) or whose deadline passed move to *over.
void VerbsEngine::end_lingering_locked(std::vector<Linger*>* over) {
  const int64_t now = monotonic_ms();
  for (size_t i = 0; i < lingering_.size();) {
    Linger* l = lingering_[i];
    bool done = !l->member.cm_inbox_.empty() || now >= l->deadline_ms || broken_;
    for (const ibv_wc& wc : l->member.inbox_) {
      const bool target =
          wc.status == IBV_WC_SUCCESS && !(wc.opcode & IBV_WC_RECV) && wc.wr_id >= l->target;
      l->delivered |= target;
      done |= target || wc.status != IBV_WC_SUCCESS;
    }
    l->member.inbox_.clear();
    l->member.cm_inbox_.clear();
    if (!done) {
      ++i;
      continue;
    }
    over->push_back(l);
    ++finishing_;
    lingering_[i] = lingering_.back();
    lingering_.pop_back();
  }
}

int VerbsEngine::lingering() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(lingering_.size()) + finishing_;
}

void VerbsEngine::settle_lingering(int64_t deadline_ms) {
  std::vector<VerbsEngine*> all;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    all = engines();
  }
  for (VerbsEngine* e : all)
    while (e->lingering() > 0 && monotonic_ms() < deadline_ms) usleep(2000);
}

// ---------------------------------------------------------- completions --

void VerbsEngine::dispatch_locked(Cq* c) {
  ibv_wc wc[kBatch];
  for (;;) {
    const int n = ibv_poll_cq(c->cq, kBatch, wc);
    if (n < 0) {
      broken_ = true;
      return;
    }
    for (int i = 0; i < n; ++i) {
      auto it = by_qpn_.find(wc[i].qp_num);
      if (it == by_qpn_.end()) continue;  // a queue pair that is gone
      Member* m = it->second;
      m->inbox_.push_back(wc[i]);
      due_locked(m);
    }
    if (n < kBatch) return;
  }
}

void VerbsEngine::due_locked(Member* m) {
  if (m->armed_ > 0 && m->kick_ && !m->kick_due_) {
    m->kick_due_ = true;
    due_.push_back(m);
  }
}

void VerbsEngine::take_cm_events_locked() {
  if (!cm_) return;
  rdma_cm_event* ev = nullptr;
  while (rdma_get_cm_event(cm_, &ev) == 0) {
    const rdma_cm_event_type type = ev->event;
    rdma_cm_id* id = ev->id;
    rdma_ack_cm_event(ev);  // (an id's destruction waits for its events' acks)
    auto it = by_id_.find(id);
    if (it == by_id_.end()) continue;  // an id that left
    it->second->cm_inbox_.push_back(type);
    due_locked(it->second);
  }
}

void VerbsEngine::kick_due_locked() {
  for (Member* m : due_) {
    if (!m) continue;  // left meanwhile
    m->kick_due_ = false;
    m->kick_(m->kick_arg_);
  }
  due_.clear();
}

void VerbsEngine::notify_locked(Cq* c) {
  if (c->notified) return;
  if (ibv_req_notify_cq(c->cq, 0) == 0) c->notified = true;
}

int VerbsEngine::take(Member* m, std::vector<ibv_wc>* out, std::vector<rdma_cm_event_type>* cm) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!m->cq_) return 0;
  // The CQ after the events: completions that precede an event (the
  // peer's last immediates before its disconnect) are taken with it.
  if (!m->cm_inbox_.empty()) {
    cm->insert(cm->end(), m->cm_inbox_.begin(), m->cm_inbox_.end());
    m->cm_inbox_.clear();
  }
  dispatch_locked(m->cq_);
  kick_due_locked();
  if (broken_) return -1;
  const int n = static_cast<int>(m->inbox_.size());
  out->insert(out->end(), m->inbox_.begin(), m->inbox_.end());
  m->inbox_.clear();
  return n;
}

void VerbsEngine::arm(Member* m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!m->cq_) return;
  ++m->armed_;
  ++m->cq_->armed;
  notify_locked(m->cq_);
}

void VerbsEngine::disarm(Member* m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!m->cq_ || m->armed_ == 0) return;
  --m->armed_;
  --m->cq_->armed;
}

void* VerbsEngine::thread_main(void* self) {
  static_cast<VerbsEngine*>(self)->run();
  return nullptr;
}

// The engine's thread: asleep until a CQ with an armed member has new
// completions; then it hands them out and kicks the armed members that got
// some. The next notification (about 50 us on soft-RoCE) is requested after
// the kicks, and only for members still asleep: a member kicked now
// requests it itself when a sleeper of its arms again, before it sleeps,
// off its reply's path.
void VerbsEngine::run() {
  std::vector<Linger*> over;
  for (;;) {
    for (Linger* l : over) l->finish();  // (leaves: takes our lock)
    if (!over.empty()) {
      std::lock_guard<std::mutex> lock(mu_);
      finishing_ -= static_cast<int>(over.size());
    }
    over.clear();
    int timeout = -1, wake_fd = -1;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!lingering_.empty()) timeout = kLingerLookMs;
      wake_fd = wake_fd_;
    }
    pollfd p[3] = {{comp_->fd, POLLIN, 0}, {cm_ ? cm_->fd : -1, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (real().poll(p, 3, timeout) < 0 && errno != EINTR) {
      // Nothing to wait on: never happens with a valid descriptor. Stop
      // rather than spin; sleepers then wake only on their own sources.
      LOG_WARN("rdma: the completion channel cannot be waited on (%s)", strerror(errno));
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (p[2].revents & POLLIN) {
      uint64_t n;
      (void)!real().read(wake_fd, &n, sizeof n);
    }
    ibv_cq* cq = nullptr;
    void* cq_ctx = nullptr;
    while (ibv_get_cq_event(comp_, &cq, &cq_ctx) == 0) {
      ibv_ack_cq_events(cq, 1);
      static_cast<Cq*>(cq_ctx)->notified = false;
    }
    take_cm_events_locked();
    for (Cq* c : cqs_) dispatch_locked(c);
    for (Cq* c : cqs_) c->kicked = 0;
    for (Member* m : due_)
      if (m) m->cq_->kicked += m->armed_;
    kick_due_locked();
    for (Cq* c : cqs_) {
      if (c->notified || c->armed <= c->kicked) continue;
      notify_locked(c);
      dispatch_locked(c);  // what completed before the request
      kick_due_locked();
    }
    end_lingering_locked(&over);
  }
}

// ----------------------------------------------------------- processes --

int VerbsEngine::cqs() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(cqs_.size());
}

int VerbsEngine::members() {
  std::lock_guard<std::mutex> lock(mu_);
  return members_;
}

// ------------------------------------------------------- registered rings --

void VerbsEngine::set_kept_limit(size_t n) { g_kept_limit.store(n, std::memory_order_relaxed); }

int VerbsEngine::kept_rings() {
  std::lock_guard<std::mutex> lock(rings_mu_);
  return static_cast<int>(kept_.size());
}

namespace {
void release_all(const std::vector<VerbsRings*>& rings) {
  for (VerbsRings* r : rings) {
    verbs_release_registrations(r);
    delete r;
  }
}
}  // namespace

void VerbsEngine::release_kept_rings() {
  std::vector<VerbsRings*> drop;  // released outside the lock
  {
    std::lock_guard<std::mutex> lock(rings_mu_);
    drop.swap(kept_);
  }
  release_all(drop);
}

int VerbsEngine::take_rings(size_t ring_bytes, VerbsRings* out) {
  std::vector<VerbsRings*> drop;  // released outside the lock
  VerbsRings* found = nullptr;
  {
    std::lock_guard<std::mutex> lock(rings_mu_);
    for (size_t i = 0; i < kept_.size(); ++i) {
      if (kept_[i]->end.ring_bytes() != ring_bytes) continue;
      found = kept_[i];
      kept_.erase(kept_.begin() + static_cast<ptrdiff_t>(i));
      break;
    }
    // Room for a new one: kept rings of other sizes go first.
    if (!found && verbs_pinned_bytes() + 2 * ring_bytes > verbs_pinned_limit()) drop.swap(kept_);
  }
  release_all(drop);
  if (found) {
    found->end.renew();
    *out = static_cast<VerbsRings&&>(*found);
    delete found;
    stats_rdma_rings(true);
    return 0;
  }
  if (!verbs_reserve_pinned(2 * ring_bytes)) return -ENOBUFS;
  VerbsRings r;
  const WireAddr none = {};
  int rc = 0;
  r.pd = ibv_alloc_pd(ctx_);
  if (!r.pd)
    rc = errno ? -errno : -ENOMEM;
  else if ((rc = VerbsEnd::create(ring_bytes, none, none, &r.end)) == 0)
    rc = verbs_register_rings(&r, true);
  if (rc < 0) {
    verbs_unreserve_pinned(2 * ring_bytes);
    if (r.pd) ibv_dealloc_pd(r.pd);
    return rc;
  }
  *out = static_cast<VerbsRings&&>(r);
  stats_rdma_rings(false);
  return 0;
}

void VerbsEngine::give_rings(VerbsRings* r, bool keep) {
  if (keep && r->pd && r->rx_mr && r->tx_mr && r->end.rx_ring()) {
    auto* k = new (std::nothrow) VerbsRings(static_cast<VerbsRings&&>(*r));
    if (k) {
      std::unique_lock<std::mutex> lock(rings_mu_);
      if (kept_.size() < g_kept_limit.load(std::memory_order_relaxed)) {
        kept_.push_back(k);
        return;
      }
      lock.unlock();
      *r = static_cast<VerbsRings&&>(*k);
      delete k;
    }
  }
  verbs_release_registrations(r);
  r->end = VerbsEnd();
}

void VerbsEngine::own_fds(std::vector<int>* out) {
  std::lock_guard<std::mutex> lock(g_mu);
  for (VerbsEngine* e : engines()) {
    out->push_back(e->comp_->fd);
    if (e->cm_) out->push_back(e->cm_->fd);
    if (e->own_ctx_) {
      out->push_back(e->ctx_->cmd_fd);
      out->push_back(e->ctx_->async_fd);
    }
    std::lock_guard<std::mutex> elock(e->mu_);
    if (e->wake_fd_ >= 0) out->push_back(e->wake_fd_);
    for (Linger* l : e->lingering_) l->fds(out);
    std::lock_guard<std::mutex> rlock(e->rings_mu_);
    for (VerbsRings* r : e->kept_) out->push_back(r->end.memfd());
  }
}

void VerbsEngine::fork_prepare() {
  // The child reads the engines' lists (after_fork_child): not halfway
  // through a change. Engine locks nest in g_mu (as in own_fds).
  g_mu.lock();
  for (VerbsEngine* e : engines()) {
    e->mu_.lock();
    e->rings_mu_.lock();
  }
}

void VerbsEngine::after_fork_parent() {
  for (VerbsEngine* e : engines()) {
    e->rings_mu_.unlock();
    e->mu_.unlock();
  }
  g_mu.unlock();
}

void VerbsEngine::after_fork_child() {
  // This thread holds every lock (fork_prepare); the parent's other
  // threads are not here.
  for (VerbsEngine* e : engines()) {
    e->rings_mu_.unlock();
    e->mu_.unlock();
    real().close(e->comp_->fd);
    if (e->cm_) real().close(e->cm_->fd);
    if (e->own_ctx_) {
      real().close(e->ctx_->cmd_fd);
      real().close(e->ctx_->async_fd);
    }
    if (e->wake_fd_ >= 0) real().close(e->wake_fd_);
    // The parent's closed connections: their FIN must not wait for us.
    std::vector<int> fds;
    for (Linger* l : e->lingering_) l->fds(&fds);
    // Kept rings: their registrations are the parent's (left alone).
    for (VerbsRings* r : e->kept_) fds.push_back(r->end.memfd());
    for (int fd : fds) real().close(fd);
  }
  verbs_pinned_after_fork_child();
  engines().clear();  // (the engines themselves are left: the parent's memory)
  g_mu.unlock();
}

}  // namespace rsock
