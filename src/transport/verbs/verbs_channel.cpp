// Verbs RC transport (see verbs_channel.h and docs/protocol.md, "Verbs
// transport").
//
// Message credits. Every immediate consumes one receive WQE at the peer.
// Each side posts R = kVerbsRecvDepth zero-length receives and re-posts one
// for every receive completion it polls (in batches: kRepostBatch below);
// it reports its re-posted total in an ACK immediate once T = kVerbsAckEvery
// re-posted receives are unreported.
// out = immediates we sent - the peer's last reported re-posted total is an
// upper bound of the peer's receives we may be using.
//  * DATA (a publication) may be sent only while out <= R - K - 1
//    (K = kVerbsCtrlReserve); otherwise poll() reports kTxBlocked and the
//    stream treats the ring as full: send() returns EAGAIN before copying
//    anything, so a publication never has to wait inside the channel.
//  * CREDIT, FLAGS and ACK (control) are never held back: they use the K
//    reserved receives. They are bounded by the peer's own traffic (a CREDIT
//    per half ring the peer sent, an ACK per T immediates, FLAGS once per
//    state change), so in practice K absorbs them; should the peer still run
//    out of receives (it stopped polling), the QP's RNR retry (rnr_retry 7 =
//    infinite) delivers them as soon as the peer re-posts, which it does on
//    its very next poll. Correctness never depends on K, only speed.
// Why it cannot deadlock: the only thing that waits for message credits is
// a sender blocked on kTxBlocked, and it waits like on a full ring (armed,
// CQ notification requested). It is blocked with out >= R - K > T, so once
// the peer has polled those receives (it polls on every recv, readiness
// check and before every sleep), at least T re-posted ones are unreported
// (see kRepostBatch) and the peer sends an ACK at once, unconditionally
// (control is never held back). The ACK's completion wakes the blocked
// sender. No wait depends on another wait: no cycle.
//
// Selective signaling: every kVerbsSignalEvery-th send WR is signaled (and
// any WR posted while the SQ is more than half full); a signaled completion
// retires every WR before it (wr_id = sequence number).
//
// The wakeup path. What a sleeper does between waking and its reply is on
// the round trip; what it does before it sleeps overlaps the peer's turn.
// Measured on soft-RoCE (rxe, TCG guests): ibv_req_notify_cq ~50 us,
// ibv_get_cq_event ~20 us, ibv_post_recv ~4 us, ibv_poll_cq < 1 us. The
// CQ and its completion channel are the engine's (verbs_engine.h): its
// thread reads the event and requests the next notification, off the
// sleeper's path; the sleeper is woken by the engine's kick, polls, and
// re-posts the receive WQEs it consumed in batches of kRepostBatch, or all
// of them in arm(), before it sleeps again.
//
// Moving the connection (docs/protocol.md section 7, "Moving a connection";
// docs/design.md, "RDMA connections that move"). The states (State in the
// header) of one end in one process:
//
//   kOwned --DETACH / queue pair lost--> kDetached --MOVE--> kAwaitHello
//     ^  |                                   ^                   |
//     |  +--MOVE (the other end moves)-------|-------------------+
//     +---------------- taker's first message -------------------+
//   kNotMine --first use: fence the owner, send MOVE--> kTaking
//     --MOVED (or the other end's own MOVE)--> kOwned
//   any owner state --another process took over--> kLost
//   a move that cannot complete --> kFailed (RESET frame to the other end)
//
// The taker fences the previous owner through the end's shared memory
// (verbs_end.h) before it announces itself, so the positions it continues
// from are exact: what the previous owner read is not read again, what it
// wrote is resent from the shared mirror if the other end's ring did not
// get it. The other end's owner answers with its own new queue pair and
// positions, and resends from its mirror what the taker has not read.
// Resending is harmless: ring and mirror are addressed by stream position.
#include "transport/verbs/verbs_channel.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <new>

#include "common/clock.h"
#include "common/log.h"
#include "common/own_fd.h"
#include "common/real.h"
#include "ring/ring.h"
#include "stats/stats.h"
#include "transport/addr.h"
#include "transport/carrier.h"
#include "transport/verbs/verbs_qp.h"
#include "transport/verbs/verbs_setup.h"

namespace rsock {
namespace {

constexpr uint64_t kRecvWrId = ~0ull;   // receive WQEs; send WRs carry their sequence number
// The completions one queue pair can have outstanding in its CQ (a failed
// one flushes every posted work request), which the engine makes room for.
constexpr int kCqePerQp = static_cast<int>(kVerbsSendDepth + kVerbsRecvDepth + 16);
constexpr int64_t kSqWaitMs = 2000;     // bound of a wait for send-queue room
// The final flush at close waits for the queue pair's verdict: this much
// beyond the longest its retries can take (for the completion to be seen).
constexpr int64_t kCloseSlackMs = 500;
// Receive WQEs consumed are re-posted once this many are due (and all of
// them before a sleep). The ACK reports re-posted WQEs only, so the peer's
// data window (R - K - 1 unacknowledged) still leaves K receives free.
// Blocked-sender argument (above): out >= R - K means >= R - K - kRepostBatch
// + 1 > T re-posted and unreported, so the ACK still goes out.
constexpr uint32_t kRepostBatch = 16;
static_assert(kVerbsRecvDepth - kVerbsCtrlReserve - kRepostBatch + 1 > kVerbsAckEvery);

int ms_left(int64_t deadline) {
  const int64_t left = deadline - monotonic_ms();
  return left < 0 ? 0 : left > 60000 ? 60000 : static_cast<int>(left);
}

int log2_of(size_t v) {
  int n = 0;
  while ((size_t{1} << n) < v) ++n;
  return n;
}

// The end's sticky flags in frame form (MoveFrame.flags, and the end's
// flags_sent / peer_flags), from verbs_imm::Flag bits, and back. CLOSED
// does not imply FIN: a close is a FIN or a reset by what was read
// (docs/protocol.md section 6).
uint32_t frame_flags(uint32_t imm_flags) {
  uint32_t f = 0;
  if (imm_flags & verbs_imm::kFin) f |= kMoveFin;
  if (imm_flags & verbs_imm::kClosed) f |= kMoveClosed;
  if (imm_flags & verbs_imm::kReset) f |= kMoveReset;
  if (imm_flags & verbs_imm::kKernelBytes) f |= kMoveKernelBytes;
  return f;
}
uint32_t imm_flags_of(uint32_t frame) {
  uint32_t f = 0;
  if (frame & kMoveFin) f |= verbs_imm::kFin;
  if (frame & kMoveClosed) f |= verbs_imm::kClosed;
  if (frame & kMoveReset) f |= verbs_imm::kReset;
  if (frame & kMoveKernelBytes) f |= verbs_imm::kKernelBytes;
  return f;
}
uint32_t peer_flags_of(uint32_t frame) {
  uint32_t f = 0;
  if (frame & kMoveFin) f |= kPeerFin;
  if (frame & kMoveClosed) f |= kPeerClosed;
  if (frame & kMoveReset) f |= kPeerReset;
  if (frame & kMoveKernelBytes) f |= kKernelBytes;
  return f;
}
// The sticky flags a new queue pair carries again after a move.
constexpr uint32_t kStickyFlags = verbs_imm::kFin | verbs_imm::kClosed | verbs_imm::kReset;

// Completion errors that mean the other end's queue pair went away (its
// process closed, exited, exec'd or died; or it moved) rather than a
// broken carrier here: the end waits for a taker, the kernel socket says
// whether one can still come.
bool remote_went_away(ibv_wc_status st) {
  return st == IBV_WC_RETRY_EXC_ERR || st == IBV_WC_RNR_RETRY_EXC_ERR || st == IBV_WC_WR_FLUSH_ERR;
}

}  // namespace

// ------------------------------------------------------------------ set-up --

std::unique_ptr<VerbsChannel> VerbsChannel::create(rdma_cm_id* id, rdma_event_channel* cm_channel,
                                                   size_t ring_bytes, int* err) {
  std::unique_ptr<VerbsChannel> ch(new VerbsChannel());
  ch->id_ = id;
  ch->cm_channel_ = cm_channel;
  int rc = ch->setup(ring_bytes);
  if (rc < 0) {
    ch->teardown(false);  // id and channel go back to the caller
    *err = rc;
    return nullptr;
  }
  *err = 0;
  return ch;
}

int VerbsChannel::setup(size_t ring_bytes) {
  if (!is_power_of_two(ring_bytes) || ring_bytes > (1u << 28)) return -EINVAL;
  ring_bytes_ = ring_bytes;
  ctx_ = id_->verbs;
  if (ctx_ == nullptr) return -ENODEV;
  port_ = id_->port_num;
  // Our ACK timeout, not rdma_cm's (verbs_qp.h); applied when rdma_cm
  // brings the queue pair to RTS, so set before the connect or accept.
  // Best effort: a kernel that lacks the option keeps its default.
  uint8_t ack_timeout = kVerbsAckTimeout;
  if (rdma_set_option(id_, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &ack_timeout,
                      sizeof ack_timeout) != 0)
    LOG_DEBUG("rdma: cannot set the ACK timeout: %s", strerror(errno));
  int err = 0;
  engine_ = VerbsEngine::of_context(ctx_, &err);
  if (!engine_) return err;
  if (int rc = engine_->join(&member_, kCqePerQp, kick_fn_, kick_arg_, armed_); rc < 0) return rc;
  // The end's memory (verbs_end.h, verbs_rings.h): ring and mirror in a
  // memfd that the processes holding this end share, registered in a
  // protection domain of its own; kept from an ended connection if the
  // engine has one. ibv_fork_init (or a kernel that makes it unnecessary)
  // was settled before the first registration (verbs_setup).
  if (int rc = engine_->take_rings(ring_bytes, &rings_); rc < 0) return rc;
  rx_ring_ = rings_.end.rx_ring();
  tx_buf_ = rings_.end.tx_mirror();

  ibv_qp_init_attr qa = verbs_qp_init_attr(member_.cq());
  if (rdma_create_qp(id_, rings_.pd, &qa) != 0) {
    // Some devices refuse large inline sizes: retry without inline data.
    qa.cap.max_inline_data = 0;
    if (rdma_create_qp(id_, rings_.pd, &qa) != 0) return errno ? -errno : -ENOMEM;
  }
  qp_ = id_->qp;
  qp_from_cm_ = true;
  max_inline_ = qa.cap.max_inline_data;
  engine_->set_qp(&member_, qp_->qp_num);
  epoch_ = rings_.end.hdr()->own.epoch.load(std::memory_order_relaxed);

  // The peer may write as soon as the connection is established: the
  // receives must be posted before connect/accept.
  return repost_locked(kVerbsRecvDepth);
}

uint64_t VerbsChannel::rx_addr() const { return reinterpret_cast<uintptr_t>(rx_ring_); }
uint32_t VerbsChannel::rx_rkey() const { return rings_.rx_mr->rkey; }
uint64_t VerbsChannel::nonce() const { return rings_.end.hdr() ? rings_.end.hdr()->nonce : 0; }

// The wait fd of this process: the epoll set (not the verbs ones, which
// come with a queue pair; the timer comes with a move, arm_deadline_locked).
int VerbsChannel::open_wait_fds() {
  epoll_fd_ = lift_fd(real().epoll_create1(EPOLL_CLOEXEC));
  if (epoll_fd_ < 0) return -errno;
  return 0;
}

void VerbsChannel::watch_fd_locked(int fd) {
  if (fd < 0 || epoll_fd_ < 0) return;
  epoll_event ev = {};
  ev.events = EPOLLIN | (fd == tcp_fd_ ? uint32_t{EPOLLRDHUP} : 0u);
  ev.data.fd = fd;
  real().epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  if (fd == tcp_fd_) tcp_watched_ = true;
}

void VerbsChannel::unwatch_tcp_locked() {
  // Level-triggered EOF, or a frame meant for another process, would keep
  // wait_fd readable for ever.
  if (tcp_watched_ && epoll_fd_ >= 0) real().epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, tcp_fd_, nullptr);
  tcp_watched_ = false;
}

// A sleeper wakes at at_ms (CLOCK_MONOTONIC; a move's bound, 0: none)
// through a timer in the epoll set, made for the move and closed after it
// (a connection that never moves holds none: one descriptor less each). A
// move whose timer cannot be made fails at once rather than wait unbounded.
void VerbsChannel::arm_deadline_locked(int64_t at_ms) {
  if (at_ms <= 0) {
    if (timer_fd_ >= 0) real().close(timer_fd_);  // (leaves the epoll set with its file)
    timer_fd_ = -1;
    return;
  }
  if (timer_fd_ < 0) {
    timer_fd_ = lift_fd(timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
    if (timer_fd_ < 0) {
      fail_move_locked("no descriptor for the move's timer", true);
      return;
    }
    watch_fd_locked(timer_fd_);
  }
  itimerspec its = {};
  its.it_value.tv_sec = at_ms / 1000;
  its.it_value.tv_nsec = (at_ms % 1000) * 1000000;
  timerfd_settime(timer_fd_, TFD_TIMER_ABSTIME, &its, nullptr);
}

int VerbsChannel::start(uint64_t remote_addr, uint32_t remote_rkey, int tcp_fd) {
  std::lock_guard<std::mutex> lock(mu_);
  remote_addr_ = remote_addr;
  remote_rkey_ = remote_rkey;
  tcp_fd_ = dup_high(tcp_fd);
  if (tcp_fd_ < 0) return -errno;
  // The connection this end belongs to (an exec'd image checks it), and
  // the GID of our address, for a queue pair made by hand if the other end
  // moves (none: such a move fails, loudly).
  WireAddr local = {}, peer = {};
  if (fd_addrs(tcp_fd_, &local, &peer)) {
    rings_.end.hdr()->local = local;
    rings_.end.hdr()->peer = peer;
    VerbsPort p;
    if (verbs_find_gid(ctx_, port_, local, &p) == 0) {
      gid_index_ = p.gid_index;
      memcpy(gid_, p.gid, sizeof gid_);
      mtu_ = p.mtu;
    }
  }
  if (int r = open_wait_fds(); r < 0) return r;
  // The id's events go to the engine's event channel from now on (ours
  // closes: one descriptor less); should it refuse, the id stays on ours.
  if (engine_->adopt_id(&member_, id_) == 0) {
    rdma_destroy_event_channel(cm_channel_);
    cm_channel_ = nullptr;
  } else if (int r = set_nonblock(cm_channel_->fd); r < 0) {
    return r;
  }
  // rdma_cm leaves the RNR NAK delay at its maximum (655 ms); an RNR only
  // happens when the peer stopped polling, and then it should retry soon
  // after the peer re-posts: 0.64 ms (encoding 12). Best effort.
  ibv_qp_attr qa = {};
  qa.min_rnr_timer = 12;
  if (ibv_modify_qp(qp_, &qa, IBV_QP_MIN_RNR_TIMER) != 0)
    LOG_DEBUG("rdma: cannot lower the RNR timer: %s", strerror(errno));
  if (cm_channel_) watch_fd_locked(cm_channel_->fd);
  watch_fd_locked(tcp_fd_);
  cm_connected_ = true;
  state_.store(kOwned, std::memory_order_release);
  return 0;
}

std::unique_ptr<VerbsChannel> VerbsChannel::adopt(VerbsEnd end, int tcp_fd, int* err) {
  std::unique_ptr<VerbsChannel> ch(new VerbsChannel());
  ch->rings_.end = static_cast<VerbsEnd&&>(end);
  ch->ring_bytes_ = ch->rings_.end.ring_bytes();
  ch->state_.store(kNotMine, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(ch->mu_);
  ch->tcp_fd_ = dup_high(tcp_fd);
  int rc = ch->tcp_fd_ < 0 ? -errno : ch->open_wait_fds();
  if (rc < 0) {
    *err = rc;
    return nullptr;
  }
  *err = 0;
  return ch;
}

VerbsChannel::~VerbsChannel() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!exited_) {
    check_owner_locked();
    hand_over_locked(lock, detach_close_, true);
  }
  if (tcp_fd_ >= 0 && !quiet_failure_ && state_.load(std::memory_order_relaxed) != kLost &&
      state_.load(std::memory_order_relaxed) != kNotMine &&
      (carrier_flags_.load(std::memory_order_relaxed) & kTransportError)) {
    // Bytes we accepted may have died with the queue pair. A reset on the
    // kernel socket (at its last close) makes the peer read ECONNRESET, not
    // a clean EOF that would hide the truncation.
    const linger reset = {1, 0};
    real().setsockopt(tcp_fd_, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  }
  const bool keep = rings_reusable_locked();
  lock.unlock();
  teardown(true, keep);
}

void VerbsChannel::destroy_qp_locked() {
  if (!qp_) return;
  if (qp_from_cm_ && id_)
    rdma_destroy_qp(id_);
  else
    ibv_destroy_qp(qp_);
  qp_ = nullptr;
  qp_from_cm_ = false;
}

// A protection domain of the connection's own (a takeover's: a new
// connection takes one with its rings): its receive ring's rkey works for
// its own queue pair only, not for another connection's peer
// (docs/security.md). A PD costs no descriptor; the CQs it needs are the
// engine's.
int VerbsChannel::alloc_pd_locked() {
  if (!rings_.pd) rings_.pd = ibv_alloc_pd(ctx_);
  return rings_.pd ? 0 : errno ? -errno : -ENOMEM;
}

// The queue pair and what it needs of ours (the engine's place, the
// registrations and protection domain; the CQ and completion channel are
// the engine's). keep_rings: the connection ended and no process holds its
// end any more: the engine keeps its rings, end and all, for the next
// connection (verbs_rings.h). Else the end stays in rings_.
void VerbsChannel::destroy_verbs_locked(bool keep_rings) {
  destroy_qp_locked();
  if (member_.engine()) member_.engine()->leave(&member_);
  if (keep_rings && engine_) {
    engine_->give_rings(&rings_, true);
    rx_ring_ = tx_buf_ = nullptr;
  } else {
    verbs_release_registrations(&rings_);
  }
}

// Whether this end's rings may serve another connection once its queue
// pair is gone: its last close was here and no process holds it any more,
// and everything it needs to be kept is still in place.
bool VerbsChannel::rings_reusable_locked() const {
  const VerbsEndHeader* h = rings_.end.hdr();
  return last_close_ && h && h->holders.load(std::memory_order_acquire) == 0 && rings_.pd &&
         rings_.rx_mr && rings_.tx_mr;
}

void VerbsChannel::teardown(bool destroy_id, bool keep_rings) {
  destroy_verbs_locked(keep_rings);
  rx_ring_ = tx_buf_ = nullptr;  // the end's mapping goes with rings_.end
  if (epoll_fd_ >= 0) real().close(epoll_fd_);
  if (tcp_fd_ >= 0) real().close(tcp_fd_);
  if (timer_fd_ >= 0) real().close(timer_fd_);
  epoll_fd_ = tcp_fd_ = timer_fd_ = -1;
  tcp_watched_ = false;
  if (destroy_id && id_) rdma_destroy_id(id_);
  id_ = nullptr;
  if (destroy_id && cm_channel_) rdma_destroy_event_channel(cm_channel_);
  cm_channel_ = nullptr;
  ctx_ = nullptr;
  engine_ = nullptr;
}

// In a fork's child: every verbs object (and librdmacm's) is the parent's.
// The kernel refuses their commands here (EACCES) and some providers map
// queues that the parent still uses, so none is touched: our copies of
// their descriptors are closed (the engine's by VerbsEngine::
// after_fork_child) and the user memory is left alone.
void VerbsChannel::forget_verbs_objects() {
  if (cm_channel_) real().close(cm_channel_->fd);
  cm_channel_ = nullptr;
  id_ = nullptr;
  ctx_ = nullptr;
  engine_ = nullptr;
  member_.forget();
  qp_ = nullptr;
  qp_from_cm_ = false;
  cm_connected_ = false;
  rings_.rx_mr = rings_.tx_mr = nullptr;
  rings_.pd = nullptr;
  rings_.end.unmap_rings();
  rx_ring_ = tx_buf_ = nullptr;
}

void VerbsChannel::reset_qp_counters_locked() {
  recv_done_ = recv_reposted_ = recv_reported_ = 0;
  msgs_sent_ = peer_acked_ = 0;
  wr_posted_ = wr_done_ = last_signaled_ = 0;
  stall_announced_ = false;
  peer_stalled_ = false;
  tx_was_blocked_ = false;
}

// ------------------------------------------------------------ completions --

void VerbsChannel::carrier_lost(uint32_t flags) {
  carrier_flags_.fetch_or(flags, std::memory_order_release);
}

void VerbsChannel::on_completion(const ibv_wc& wc) {
  // The stable side of a move keeps its CQ: what an earlier queue pair
  // left in it is history.
  if (!qp_ || wc.qp_num != qp_->qp_num) return;
  const bool is_recv = wc.wr_id == kRecvWrId;
  if (wc.status != IBV_WC_SUCCESS) {
    // A flush after the peer closed cleanly (it disconnects after CLOSED) is
    // the end of the stream. (So is any error after it: its queue pair may
    // be gone already; and after a kernel-bytes reset, which ends the
    // connection too.) Whether that end reads as a FIN or a reset is the
    // stream's decision.
    if (peer_flags_ & (kPeerClosed | kKernelBytes)) {
      carrier_lost(kPeerClosed);
      return;
    }
    // After a broken carrier, or a kernel-bytes reset of ours, what follows.
    if (carrier_flags_.load(std::memory_order_relaxed) & (kTransportError | kKernelBytes)) return;
    const int st = state_.load(std::memory_order_relaxed);
    if (st == kDetached) return;  // what the gone queue pair leaves behind
    if (remote_went_away(wc.status) && (st == kOwned || st == kAwaitHello)) {
      LOG_DEBUG("rdma: %s: the other end's queue pair went away", ibv_wc_status_str(wc.status));
      detach_locked();
      return;
    }
    // (A channel that was never started is a pairing candidate torn down:
    // the flush of its posted receives says nothing about a stream.)
    if (remote_rkey_ != 0)
      LOG_INFO("rdma: completion error: %s (%s)", ibv_wc_status_str(wc.status),
               is_recv ? "receive" : "send");
    carrier_lost(kTransportError | kPeerClosed);
    return;
  }
  if (!is_recv) {
    if (wc.wr_id > wr_done_) wr_done_ = wc.wr_id;
    return;
  }
  ++recv_done_;
  if (state_.load(std::memory_order_relaxed) == kAwaitHello) hello_seen_ = true;
  if (!(wc.wc_flags & IBV_WC_WITH_IMM)) {
    carrier_lost(kTransportError | kPeerClosed);  // not our protocol
    return;
  }
  const uint32_t imm = ntohl(wc.imm_data);
  const uint32_t v = verbs_imm::value_of(imm);
  switch (verbs_imm::type_of(imm)) {
    case verbs_imm::kData:
      peer_head_ = verbs_imm::extend(peer_head_, v);
      break;
    case verbs_imm::kCredit:
      peer_consumed_ = verbs_imm::extend(peer_consumed_, v);
      stall_announced_ = false;  // a new wait must tell the peer again
      break;
    case verbs_imm::kFlags:
      if (v & verbs_imm::kFin) peer_flags_ |= kPeerFin;
      if (v & verbs_imm::kClosed) peer_flags_ |= kPeerClosed;
      if (v & verbs_imm::kReset) peer_flags_ |= kPeerReset;
      if (v & verbs_imm::kStalled) peer_stalled_ = true;
      if (v & verbs_imm::kKernelBytes) kernel_bytes_from_peer_locked();
      // The other end's owner closed, exited or exec'd while other
      // processes of its host hold the end: wait for one to take it over.
      if ((v & verbs_imm::kDetach) && !(v & verbs_imm::kClosed)) detach_pending_ = true;
      break;
    case verbs_imm::kAck:
      peer_acked_ = verbs_imm::extend(peer_acked_, v);
      break;
  }
}

// Returns the number of completions taken.
int VerbsChannel::poll_cq_locked() {
  if (!member_.engine()) return 0;
  // Our completions: the engine's CQ holds those of other connections too
  // (verbs_engine.h). The batch is swapped out while it is read, should a
  // completion's handling poll again.
  std::vector<ibv_wc> batch;
  std::vector<rdma_cm_event_type> events;  // (rare: no allocation while empty)
  batch.swap(wcs_);
  batch.clear();
  int found = member_.engine()->take(&member_, &batch, &events);
  if (found < 0) {
    carrier_lost(kTransportError | kPeerClosed);
    found = 0;
  }
  for (const ibv_wc& wc : batch) on_completion(wc);
  batch.clear();
  wcs_.swap(batch);
  for (rdma_cm_event_type type : events) on_cm_event_locked(type);
  if (found > 0) record_rx_locked();
  if (detach_pending_) {
    detach_pending_ = false;
    detach_locked(false);
  }
  if (hello_seen_) {
    hello_seen_ = false;
    if (state_.load(std::memory_order_relaxed) == kAwaitHello) on_hello_locked();
  }
  if (state_.load(std::memory_order_relaxed) != kOwned) return found;
  if (recv_done_ - recv_reposted_ >= kRepostBatch) flush_reposts_locked();
  const bool blocked = !data_window_open_locked();
  if (tx_was_blocked_ && !blocked) ++tx_epoch_;
  tx_was_blocked_ = blocked;
  maybe_ack_locked();
  return found;
}

void VerbsChannel::flush_reposts_locked() {
  const uint64_t due = recv_done_ - recv_reposted_;
  if (due == 0 || !qp_ || (carrier_flags_.load(std::memory_order_relaxed) & kTransportError))
    return;
  if (repost_locked(static_cast<uint32_t>(due)) < 0) {
    carrier_lost(kTransportError | kPeerClosed);
    return;
  }
  recv_reposted_ = recv_done_;
}

int VerbsChannel::repost_locked(uint32_t n) {
  ibv_recv_wr wrs[32];
  while (n > 0) {
    const uint32_t k = n < 32 ? n : 32;
    for (uint32_t i = 0; i < k; ++i) {
      wrs[i] = {};
      wrs[i].wr_id = kRecvWrId;
      wrs[i].sg_list = nullptr;  // zero-length: the payload is RDMA-written
      wrs[i].num_sge = 0;
      wrs[i].next = i + 1 < k ? &wrs[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    int rc = ibv_post_recv(qp_, wrs, &bad);
    if (rc != 0) return -rc;
    n -= k;
  }
  return 0;
}

void VerbsChannel::maybe_ack_locked() {
  if (recv_reposted_ - recv_reported_ < kVerbsAckEvery) return;
  if (carrier_flags_.load(std::memory_order_relaxed) & kTransportError) return;
  // Never wait for send-queue room here (this runs inside that wait): with
  // the SQ full, the next poll retries.
  if (wr_posted_ - wr_done_ + 1 > kVerbsSendDepth) return;
  if (post_imm_locked(verbs_imm::kAck, recv_reposted_) == 0) recv_reported_ = recv_reposted_;
}

bool VerbsChannel::data_window_open_locked() const {
  return msgs_sent_ - peer_acked_ + 1 <= kVerbsRecvDepth - kVerbsCtrlReserve;
}

// ------------------------------------------------------------------ posting --

int VerbsChannel::reserve_sq_locked(int count) {
  if (wr_posted_ - wr_done_ + count <= kVerbsSendDepth) return 0;
  // Send completions need only the peer's HCA, not its CPU: they come within
  // network time unless the peer is out of receives (RNR); bounded anyway.
  const int64_t deadline = monotonic_ms() + kSqWaitMs;
  while (wr_posted_ - wr_done_ + count > kVerbsSendDepth) {
    if (carrier_flags_.load(std::memory_order_relaxed) & kTransportError) return -ECONNRESET;
    if (state_.load(std::memory_order_relaxed) != kOwned)
      return -EAGAIN;  // its queue pair went away
    if (monotonic_ms() > deadline) {
      LOG_WARN("rdma: send queue stuck for %lld ms: failing the connection",
               static_cast<long long>(kSqWaitMs));
      carrier_lost(kTransportError | kPeerClosed);
      return -ECONNRESET;
    }
    poll_cq_locked();
  }
  return 0;
}

// Posts a chain of `count` send WRs (ibv_send_wr*): numbers them and decides
// which are signaled.
int VerbsChannel::post_locked(void* first_wr, int count) {
  if (carrier_flags_.load(std::memory_order_relaxed) & kTransportError) return -ECONNRESET;
  if (!qp_) return -ECONNRESET;
  if (int r = reserve_sq_locked(count); r < 0) return r;
  auto* wr = static_cast<ibv_send_wr*>(first_wr);
  for (ibv_send_wr* w = wr; w; w = w->next) {
    w->wr_id = ++wr_posted_;
    if (wr_posted_ - last_signaled_ >= kVerbsSignalEvery ||
        wr_posted_ - wr_done_ > kVerbsSendDepth / 2) {
      w->send_flags |= IBV_SEND_SIGNALED;
      last_signaled_ = wr_posted_;
    }
  }
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(qp_, wr, &bad);
  if (rc != 0) {
    LOG_INFO("rdma: ibv_post_send: %s", strerror(rc));
    carrier_lost(kTransportError | kPeerClosed);
    return -ECONNRESET;
  }
  return 0;
}

// A zero-length WRITE_WITH_IMM: a control message.
int VerbsChannel::post_imm_locked(verbs_imm::Type type, uint64_t value) {
  ibv_send_wr wr = {};
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.imm_data = htonl(verbs_imm::encode(type, value));
  wr.wr.rdma.remote_addr = remote_addr_;
  wr.wr.rdma.rkey = remote_rkey_;
  wr.sg_list = nullptr;
  wr.num_sge = 0;
  int rc = post_locked(&wr, 1);
  if (rc == 0) ++msgs_sent_;
  return rc;
}

// RDMA-WRITEs the mirror's bytes [from, to) to the same offsets of the
// peer's ring; the last WR carries `to` as the new head.
int VerbsChannel::post_range_locked(uint64_t from, uint64_t to) {
  if (to <= from) return 0;
  if (to - from > ring_bytes_) return -EINVAL;
  RingSpan spans[2];
  const int n = ring_split(from, static_cast<size_t>(to - from), ring_bytes_, spans);
  ibv_sge sge[2];
  ibv_send_wr wr[2] = {};
  for (int i = 0; i < n; ++i) {
    sge[i].addr = reinterpret_cast<uintptr_t>(tx_buf_ + spans[i].offset);
    sge[i].length = static_cast<uint32_t>(spans[i].len);
    sge[i].lkey = rings_.tx_mr->lkey;
    wr[i].sg_list = &sge[i];
    wr[i].num_sge = 1;
    wr[i].opcode = IBV_WR_RDMA_WRITE;
    wr[i].wr.rdma.remote_addr = remote_addr_ + spans[i].offset;
    wr[i].wr.rdma.rkey = remote_rkey_;
    if (spans[i].len <= max_inline_) wr[i].send_flags = IBV_SEND_INLINE;
    if (i > 0) wr[i - 1].next = &wr[i];
  }
  // The last WR of the publication carries the new head: when its receive
  // completes at the peer, every byte before it is in place (RC ordering).
  wr[n - 1].opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr[n - 1].imm_data = htonl(verbs_imm::encode(verbs_imm::kData, to));
  int rc = post_locked(&wr[0], n);
  if (rc < 0) return rc;
  ++msgs_sent_;
  if (!data_window_open_locked()) tx_was_blocked_ = true;
  return 0;
}

int VerbsChannel::write(size_t offset, const void* src, size_t len) {
  // The bytes go to the mirror; publish() sends the whole new range. The
  // stream calls this inside its operation bracket (enter), so the end is
  // ours and mapped here.
  if (!tx_buf_) return -ECONNRESET;
  memcpy(tx_buf_ + offset, src, len);
  return 0;
}

int VerbsChannel::publish(uint64_t head) {
  std::lock_guard<std::mutex> lock(mu_);
  if (head <= posted_head_) return 0;
  if (head - posted_head_ > ring_bytes_) return -EINVAL;
  const int st = state_.load(std::memory_order_relaxed);
  if (st == kFailed || st == kNotMine || st == kTaking) return -ECONNRESET;
  if (st == kOwned) {
    // The stream checked kTxBlocked under its send lock before writing, and
    // only publish() spends data credits: the window is still open here.
    int rc = post_range_locked(posted_head_, head);
    if (rc == -EAGAIN) rc = 0;  // its queue pair just went away: resent after the move
    if (rc < 0) return rc;
  }
  // Otherwise the bytes wait in the mirror: whoever owns the end once the
  // connection has moved resends them. (kLost: inside the operation that
  // was going on when another process took over, which waits for it: the
  // taker resends these from the shared mirror.)
  posted_head_ = head;
  rings_.end.hdr()->tx_sent.store(head, std::memory_order_release);
  return 0;
}

int VerbsChannel::grant(uint64_t consumed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (consumed <= granted_) return 0;
  if (state_.load(std::memory_order_relaxed) != kOwned) return 0;  // the move reports it
  int rc = post_imm_locked(verbs_imm::kCredit, consumed);
  if (rc == 0) {
    granted_ = consumed;
    peer_stalled_ = false;  // answered; the peer announces a new wait again
  }
  return rc;
}

void VerbsChannel::signal(uint32_t flags) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t bits = 0;
  if (flags & kSendFin) bits |= verbs_imm::kFin;
  if (flags & kSendClosed) bits |= verbs_imm::kClosed;
  if (flags & kSendReset) bits |= verbs_imm::kReset;
  if (flags & kSendKernelBytes) bits |= verbs_imm::kKernelBytes;
  if ((bits & ~flags_sent_) == 0) return;
  flags_sent_ |= bits;
  // Not the end's owner yet (it moves here): sent once it has.
  if (!owner_state()) return;
  VerbsEndHeader* h = rings_.end.hdr();
  if (!end_enter(h, epoch_)) {
    become_lost_locked();
    return;
  }
  h->flags_sent.fetch_or(frame_flags(bits), std::memory_order_acq_rel);
  // Posted after every publication so far: the peer sees FIN after the
  // last head (RC order). While the connection moves, the replay carries it.
  if (state_.load(std::memory_order_relaxed) == kOwned) {
    // The peer tells a FIN from a reset by what we read: our exact total
    // goes before CLOSED (close() grants it, an exit does not).
    const uint64_t consumed = rx_consumed_.load(std::memory_order_relaxed);
    if ((bits & verbs_imm::kClosed) && consumed > granted_ &&
        post_imm_locked(verbs_imm::kCredit, consumed) == 0)
      granted_ = consumed;
    (void)post_imm_locked(verbs_imm::kFlags, flags_sent_);
  }
  end_leave(h);
}

PeerState VerbsChannel::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  PeerState s;
  check_owner_locked();
  const int st = state_.load(std::memory_order_relaxed);
  if (st == kNotMine || st == kTaking) {
    s.flags = kTxBlocked;  // nothing to report until the end is ours
    return s;
  }
  if (st == kLost) {
    report_lost_locked();
    s.flags = kTransportError | kPeerClosed;
    return s;
  }
  // Carrier flags before the CQ: the peer's last immediates complete here
  // before its TCP FIN or disconnect can be seen, so once we have loaded a
  // carrier loss, the CQ poll below still delivers the final head. (Every
  // carrier_lost() happens under mu_, after a CQ poll, so this is belt and
  // braces.)
  const uint32_t carrier = carrier_flags_.load(std::memory_order_acquire);
  // An end whose other side is moving looks at the kernel socket on every
  // call, so that a program that keeps busy without sleeping still answers
  // the taker's MOVE.
  if (st == kDetached) service_kernel_socket_locked();
  poll_cq_locked();
  check_deadline_locked();
  s.head = peer_head_;
  s.consumed = peer_consumed_;
  s.flags = peer_flags_ | carrier | carrier_flags_.load(std::memory_order_acquire);
  if (state_.load(std::memory_order_relaxed) == kLost) {
    report_lost_locked();
    s.flags |= kTransportError | kPeerClosed;
  }
  if (peer_stalled_) s.flags |= kPeerStalled;
  if (state_.load(std::memory_order_relaxed) == kOwned && !data_window_open_locked())
    s.flags |= kTxBlocked;
  s.tx_epoch = tx_epoch_;
  return s;
}

bool VerbsChannel::arm(uint32_t want, uint64_t /*sleep: every arm counts*/) {
  std::lock_guard<std::mutex> lock(mu_);
  ++armed_;
  if (!member_.engine())
    return false;  // nothing of ours to be notified of yet (the end moves here)
  // Work left over from the last wakeup, done now that the caller is about
  // to sleep (see "The wakeup path" above).
  if (state_.load(std::memory_order_relaxed) == kOwned) flush_reposts_locked();
  // Any completion from now on (data, credit, flags, ACK, error) kicks our
  // sleepers (the engine's thread or whoever polls it); the caller
  // re-checks after arm(), which polls, so nothing that completed before is
  // missed.
  member_.engine()->arm(&member_);
  if ((want & kWantSpace) && !stall_announced_ &&
      state_.load(std::memory_order_relaxed) == kOwned &&
      (carrier_flags_.load(std::memory_order_relaxed) & kTransportError) == 0) {
    // The peer grants as soon as it frees anything while we wait.
    if (post_imm_locked(verbs_imm::kFlags, flags_sent_ | verbs_imm::kStalled) == 0)
      stall_announced_ = true;
  }
  return false;  // the engine kicks; no wakeup was taken from another sleeper
}

void VerbsChannel::disarm(uint32_t /*want*/) {
  std::lock_guard<std::mutex> lock(mu_);
  if (armed_ > 0) --armed_;
  if (member_.engine()) member_.engine()->disarm(&member_);
}

void VerbsChannel::set_async_kick(void (*fn)(void*), void* arg) {
  std::lock_guard<std::mutex> lock(mu_);
  kick_fn_ = fn;
  kick_arg_ = arg;
  if (member_.engine()) member_.engine()->set_kick(&member_, fn, arg);
}

// Connection events: the peer disconnected (after CLOSED: a clean end;
// after DETACH, or without a word: its queue pair is gone, the end may
// move) or the device went away. They come through the engine (its event
// channel, poll_cq_locked), or on our own channel if the id could not move
// there (drain_cm_events_locked).
void VerbsChannel::on_cm_event_locked(rdma_cm_event_type type) {
  if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
    if (!cm_connected_) return;  // the queue pair before a move
    cm_connected_ = false;
    poll_cq_locked();  // the peer's last immediates precede its disconnect
    if ((peer_flags_ & (kPeerClosed | kKernelBytes)) ||
        (carrier_flags_.load(std::memory_order_relaxed) & kKernelBytes))
      carrier_lost(kPeerClosed);
    else
      detach_locked();
  } else if (type == RDMA_CM_EVENT_DEVICE_REMOVAL || type == RDMA_CM_EVENT_ADDR_CHANGE) {
    LOG_INFO("rdma: %s: failing the connection", rdma_event_str(type));
    carrier_lost(kTransportError | kPeerClosed);
  }
}

bool VerbsChannel::drain_cm_events_locked() {
  if (!cm_channel_) return false;
  bool took = false;
  for (;; took = true) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(cm_channel_, &ev) != 0) break;
    const rdma_cm_event_type type = ev->event;
    rdma_ack_cm_event(ev);
    on_cm_event_locked(type);
  }
  return took;
}

bool VerbsChannel::drain_wakeups() {
  std::lock_guard<std::mutex> lock(mu_);
  check_owner_locked();
  const int st = state_.load(std::memory_order_relaxed);
  // The usual wakeup is the engine's kick for new completions (no
  // descriptor of ours was made readable): take them and leave the other
  // sources alone. wait_fd is level-triggered, so anything that is pending
  // there wakes the next sleeper at once and is handled then.
  const int found = poll_cq_locked();
  bool took_other = false;
  if (found == 0) {
    uint64_t count;
    if (timer_fd_ >= 0 && real().read(timer_fd_, &count, sizeof count) == sizeof count)
      took_other = true;
    took_other |= drain_cm_events_locked();
    // The kernel TCP connection: EOF or an error (the peer's end is gone),
    // or frames of a move. A taker reads its answer in take_over().
    if (st == kOwned || st == kDetached || st == kAwaitHello)
      took_other |= service_kernel_socket_locked();
    check_deadline_locked();
    poll_cq_locked();
  }
  // Completions are no wakeup another sleeper could miss (the engine kicks
  // every armed one); what wait_fd held is.
  return took_other;
}

// -------------------------------------------------------- processes, holders --

bool VerbsChannel::owner_state() const {
  const int st = state_.load(std::memory_order_relaxed);
  return st == kOwned || st == kDetached || st == kAwaitHello;
}

// Whether this process still owns the end; notices a takeover by another.
bool VerbsChannel::check_owner_locked() {
  const int st = state_.load(std::memory_order_relaxed);
  if (st != kOwned && st != kDetached && st != kAwaitHello && st != kTaking) return false;
  if (!rings_.end.hdr() || end_owns(rings_.end.hdr(), epoch_)) return true;
  become_lost_locked();
  return false;
}

// Another process took the end over: this one stops (it sends nothing
// more, reads nothing more from the kernel socket, whose frames are the new
// owner's now).
void VerbsChannel::become_lost_locked() {
  if (state_.load(std::memory_order_relaxed) == kLost) return;
  poll_cq_locked();  // what arrived is a fact the taker may need (rx_head)
  state_.store(kLost, std::memory_order_release);
  unwatch_tcp_locked();
  arm_deadline_locked(0);
}

// A call on a lost end fails: the first one says why, once.
void VerbsChannel::report_lost_locked() {
  if (lost_reported_) return;
  lost_reported_ = true;
  stats_reset_connection(
      Reset::kTakenOver, kLogWarn,
      "rdma connection taken over by another process (a fork's child or an exec'd program "
      "that used it): calls on it in this process fail with ECONNRESET");
}

int VerbsChannel::enter() {
  const int st = state_.load(std::memory_order_acquire);
  if (st == kNotMine || st == kTaking) return -EAGAIN;  // take_over() comes first
  // Reset here (a move failed, or kernel bytes while moving): nothing moves,
  // and the stream reports the reset as it reports any.
  if (st == kFailed) return 1;
  // epoch_ changes only in take_over(), under both of the stream's locks,
  // one of which our caller holds.
  const bool owner = st == kOwned || st == kDetached || st == kAwaitHello;
  if (owner && end_enter(rings_.end.hdr(), epoch_)) return 0;
  std::lock_guard<std::mutex> lock(mu_);
  if (owner_state()) become_lost_locked();
  if (state_.load(std::memory_order_relaxed) == kLost) report_lost_locked();
  return -ECONNRESET;
}

void VerbsChannel::leave() { end_leave(rings_.end.hdr()); }

void VerbsChannel::note_read(uint64_t total) {
  rx_consumed_.store(total, std::memory_order_relaxed);
  rings_.end.hdr()->rx_consumed.store(total, std::memory_order_release);
}

void VerbsChannel::record_rx_locked() {
  VerbsEndHeader* h = rings_.end.hdr();
  if (!h) return;
  uint64_t cur = h->rx_head.load(std::memory_order_relaxed);
  while (peer_head_ > cur &&
         !h->rx_head.compare_exchange_weak(cur, peer_head_, std::memory_order_acq_rel)) {
  }
  // What the peer told us (its FLAGS; not what a carrier loss here made of
  // it), for the process that takes the end over next.
  uint32_t pf = 0;
  if (peer_flags_ & kPeerFin) pf |= kMoveFin;
  if (peer_flags_ & kPeerClosed) pf |= kMoveClosed;
  if (peer_flags_ & kPeerReset) pf |= kMoveReset;
  if (peer_flags_ & kKernelBytes) pf |= kMoveKernelBytes;
  if (pf) h->peer_flags.fetch_or(pf, std::memory_order_acq_rel);
}

void VerbsChannel::add_holder() {
  if (rings_.end.hdr()) rings_.end.hdr()->holders.fetch_add(1, std::memory_order_acq_rel);
}

void VerbsChannel::undo_add_holder() {
  if (rings_.end.hdr()) rings_.end.hdr()->holders.fetch_sub(1, std::memory_order_acq_rel);
}

bool VerbsChannel::drop_holder() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t before = rings_.end.hdr()->holders.fetch_sub(1, std::memory_order_acq_rel);
  check_owner_locked();
  const int st = state_.load(std::memory_order_relaxed);
  if (!owner_state() && st != kTaking) return false;  // not ours: nothing to say
  if (before <= 1) {
    last_close_ = true;  // the peer learns that the stream closed
    return true;
  }
  detach_close_ = true;  // others hold it: one of them may take it over
  return false;
}

void VerbsChannel::after_fork_child() {
  // Threads of the parent that held it at the fork do not exist here.
  new (&mu_) std::mutex();
  std::lock_guard<std::mutex> lock(mu_);
  forget_verbs_objects();
  // The epoll set and timer are shared with the parent (fork
  // copies descriptors, not the files): ours from now on.
  if (epoll_fd_ >= 0) real().close(epoll_fd_);
  if (timer_fd_ >= 0) real().close(timer_fd_);
  epoll_fd_ = timer_fd_ = -1;
  tcp_watched_ = false;
  (void)open_wait_fds();
  reset_qp_counters_locked();
  armed_ = 0;
  hello_seen_ = detach_pending_ = false;
  last_close_ = detach_close_ = exited_ = lost_reported_ = false;
  kernel_bytes_reported_ = false;  // this process counts its own resets
  partial_since_ms_ = 0;
  // This process never owned the end, whatever the parent did with it: its
  // first use takes it over (a reset connection stays reset).
  if (state_.load(std::memory_order_relaxed) != kFailed)
    state_.store(kNotMine, std::memory_order_release);
}

std::string VerbsChannel::describe() {
  static const char* const kStates[] = {"owned",  "detached", "await-hello", "not-mine",
                                        "taking", "lost",     "failed"};
  std::lock_guard<std::mutex> lock(mu_);
  const int st = state_.load(std::memory_order_relaxed);
  ibv_qp_attr attr = {};
  ibv_qp_init_attr init = {};
  const int qps = qp_ && ibv_query_qp(qp_, &attr, IBV_QP_STATE, &init) == 0 ? attr.qp_state : -1;
  const VerbsEndHeader* h = rings_.end.hdr();
  char buf[640];
  snprintf(
      buf, sizeof buf,
      "state %s epoch %llu (end: epoch %llu owner %d busy %d frame_lock %d holders %u) "
      "qp %u (state %d) | rx: peer_head %llu consumed %llu granted %llu | tx: posted %llu "
      "peer_consumed %llu | msgs %llu acked %llu recv done %llu reposted %llu | wr %llu "
      "done %llu | armed %d cq %p | carrier %#x peer_flags %#x sent %#x "
      "stall %d/%d deadline in %lld ms",
      st >= 0 && st <= kFailed ? kStates[st] : "?", static_cast<unsigned long long>(epoch_),
      h ? static_cast<unsigned long long>(h->own.epoch.load()) : 0ull,
      h ? h->own.owner_pid.load() : 0, h ? h->own.busy.load() : 0, h ? h->frame_lock.load() : 0,
      h ? h->holders.load() : 0u, qp_ ? qp_->qp_num : 0u, qps,
      static_cast<unsigned long long>(peer_head_),
      static_cast<unsigned long long>(rx_consumed_.load()),
      static_cast<unsigned long long>(granted_), static_cast<unsigned long long>(posted_head_),
      static_cast<unsigned long long>(peer_consumed_), static_cast<unsigned long long>(msgs_sent_),
      static_cast<unsigned long long>(peer_acked_), static_cast<unsigned long long>(recv_done_),
      static_cast<unsigned long long>(recv_reposted_), static_cast<unsigned long long>(wr_posted_),
      static_cast<unsigned long long>(wr_done_), armed_, static_cast<void*>(member_.cq()),
      carrier_flags_.load(), peer_flags_, flags_sent_, stall_announced_, peer_stalled_,
      deadline_ms_ ? static_cast<long long>(deadline_ms_ - monotonic_ms()) : -1ll);
  return buf;
}

// ---------------------------------------------------------------- the move --

// The other end's queue pair went away (DETACH, a disconnect, or a send
// that nobody acknowledges). Its owner's host may still hold the end, and
// one of its processes take it over: wait for its MOVE. Without a DETACH
// the wait is bounded (a process that vanished without a word leaves none
// that will take over, unless another holds the end and uses it soon).
void VerbsChannel::detach_locked(bool bounded) {
  const int st = state_.load(std::memory_order_relaxed);
  if (st != kOwned && st != kAwaitHello) return;
  // Reset for kernel bytes (either end): nobody takes a reset connection over.
  if ((carrier_flags_.load(std::memory_order_relaxed) | peer_flags_) & kKernelBytes) return;
  record_rx_locked();
  state_.store(kDetached, std::memory_order_release);
  deadline_ms_ = bounded ? monotonic_ms() + kVerbsMoveMs : 0;
  arm_deadline_locked(deadline_ms_);
  // A channel never started is a pairing candidate torn down: no stream
  // waits for anyone, so no line says so.
  if (remote_rkey_ != 0)
    LOG_DEBUG(
        "rdma: the other end's queue pair went away%s: waiting for a process that takes it "
        "over",
        bounded ? " without a word" : "");
}

void VerbsChannel::check_deadline_locked() {
  const int st = state_.load(std::memory_order_relaxed);
  if ((st != kAwaitHello && st != kDetached) || deadline_ms_ == 0 || monotonic_ms() < deadline_ms_)
    return;
  if (ended_locked()) return;
  fail_move_locked(st == kAwaitHello
                       ? "the process that took the other end over did not come up in time"
                       : "the other end's queue pair went away and no process took it over in "
                         "time",
                   true);
}

void VerbsChannel::fail_move_locked(const char* why, bool tell_peer) {
  if (state_.load(std::memory_order_relaxed) == kFailed) return;
  state_.store(kFailed, std::memory_order_release);
  carrier_lost(kTransportError | kPeerClosed);
  arm_deadline_locked(0);
  stats_reset_connection(Reset::kMoveFailed, kLogWarn,
                         "rdma: moving the connection to another process failed (%s): it is reset",
                         why);
  if (tell_peer) send_reset_frame_locked(0);
  unwatch_tcp_locked();
}

// A RESET frame to the other end (flags: kMoveKernelBytes or 0), for when
// no queue pair of ours reaches it. Best effort, bounded.
void VerbsChannel::send_reset_frame_locked(uint8_t flags) {
  if (tcp_fd_ < 0 || !rings_.end.hdr() || !end_lock_frames(rings_.end.hdr(), monotonic_ms() + 100))
    return;
  MoveFrame r;
  r.type = MoveType::kReset;
  r.flags = flags;
  (void)send_frame_locked(r);
  end_unlock_frames(rings_.end.hdr());
}

// The one reader of the connection's kernel socket. After the switch only
// move frames (MoveFrame) may arrive there; they are looked at (MSG_PEEK)
// and consumed only by the process they are for. Anything else (kForeign,
// or kBad: the magic with fields no librsock writes) is bytes that reached
// the socket behind librsock (README, "What librsock intercepts"): the
// callers reset the connection on both ends for them (kernel_bytes). The
// end of the socket: kEnd (the other end's last holder closed or died: a
// FIN from its kernel), kReset (a reset from its kernel: an abortive close,
// or a peer whose queue pair failed, ~VerbsChannel; never unread bytes of
// ours, since nothing is sent on it but frames, which are all read), kError
// (anything else). kPartial: a frame's first bytes, whose rest is still to
// come (at most kVerbsMoveMs). *len: the bytes looked at.
VerbsChannel::Kernel VerbsChannel::read_kernel_socket_locked(MoveFrame* frame, size_t* len) {
  uint8_t buf[kMoveFrameBytes];
  *len = 0;
  if (tcp_fd_ < 0) return Kernel::kNothing;
  const ssize_t n = real().recv(tcp_fd_, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return Kernel::kEnd;
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Kernel::kNothing;
    return (errno == ECONNRESET || errno == EPIPE) ? Kernel::kReset : Kernel::kError;
  }
  *len = static_cast<size_t>(n);
  const FrameScan scan = scan_move_frame(buf, static_cast<size_t>(n), frame);
  if (scan != FrameScan::kNeedMore) partial_since_ms_ = 0;
  switch (scan) {
    case FrameScan::kNeedMore: {
      // The rest of a frame is on its way: one send() wrote it, onto a
      // socket that carries nothing else, so it follows at once. Unless the
      // other end went away in the middle (then it never comes), or it
      // stays away: bytes behind librsock that start like a frame. Either
      // way they are no frame (the connection resets, then ends).
      pollfd p = {tcp_fd_, POLLRDHUP, 0};
      const int64_t now = monotonic_ms();
      if (partial_since_ms_ == 0) partial_since_ms_ = now;
      if ((real().poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) ||
          now - partial_since_ms_ > kVerbsMoveMs) {
        partial_since_ms_ = 0;
        return Kernel::kForeign;
      }
      return Kernel::kPartial;
    }
    case FrameScan::kNotFrame:
      return Kernel::kForeign;
    case FrameScan::kBad:
      return Kernel::kBad;
    case FrameScan::kFrame:
      return Kernel::kFrame;
  }
  return Kernel::kBad;
}

// Consumes len bytes that a look showed (a frame: counted in the end's
// frame_bytes_in; or bytes that are not librsock's).
void VerbsChannel::consume_kernel_locked(size_t len, bool frame) {
  uint8_t buf[kMoveFrameBytes];
  while (len > 0) {
    const ssize_t n = real().recv(tcp_fd_, buf, std::min(len, sizeof buf), MSG_DONTWAIT);
    if (n <= 0) return;
    len -= static_cast<size_t>(n);
    if (frame && rings_.end.hdr())
      rings_.end.hdr()->frame_bytes_in.fetch_add(static_cast<uint64_t>(n),
                                                 std::memory_order_acq_rel);
  }
}

int VerbsChannel::send_frame_locked(const MoveFrame& f) {
  uint8_t out[kMoveFrameBytes];
  encode_move_frame(f, out);
  const int64_t deadline = monotonic_ms() + kVerbsMoveMs;
  size_t done = 0;
  while (done < sizeof out) {
    const ssize_t n =
        real().send(tcp_fd_, out + done, sizeof out - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -errno;
    pollfd p = {tcp_fd_, POLLOUT, 0};
    if (real().poll(&p, 1, ms_left(deadline)) == 0) return -ETIMEDOUT;
  }
  return 0;
}

MoveFrame VerbsChannel::my_frame_locked(MoveType type, uint64_t nonce) {
  MoveFrame f;
  f.type = type;
  f.ring_log2 = static_cast<uint8_t>(log2_of(ring_bytes_));
  f.mtu = mtu_;
  f.flags = static_cast<uint8_t>(frame_flags(flags_sent_));
  f.qpn = qp_ ? qp_->qp_num : 0;
  f.psn = my_psn_;
  f.ring = {rings_.rx_mr ? rings_.rx_mr->rkey : 0, reinterpret_cast<uintptr_t>(rx_ring_)};
  f.nonce = nonce;
  f.rx_consumed = rx_consumed_.load(std::memory_order_relaxed);
  f.tx_sent = posted_head_;
  memcpy(f.gid, gid_, sizeof f.gid);
  return f;
}

// The owner looks at its kernel socket: the other end's liveness, and the
// frames of a move of the other end. Returns whether it consumed or learned
// anything (which other sleepers on wait_fd may have woken for).
bool VerbsChannel::service_kernel_socket_locked() {
  for (int i = 0; i < 4; ++i) {
    MoveFrame f;
    size_t len = 0;
    const Kernel k = read_kernel_socket_locked(&f, &len);
    switch (k) {
      case Kernel::kNothing:
      case Kernel::kPartial:
        return i > 0;
      case Kernel::kEnd:
      case Kernel::kReset:
      case Kernel::kError:
        // The other end's last holder closed (or died): what reached the
        // ring is delivered, then the stream decides between EOF and a
        // reset by what the other end read (a reset from its kernel is
        // one in any case).
        poll_cq_locked();
        carrier_lost(k == Kernel::kEnd     ? kPeerClosed
                     : k == Kernel::kReset ? kPeerClosed | kPeerReset
                                           : kTransportError | kPeerClosed);
        unwatch_tcp_locked();
        arm_deadline_locked(0);
        return true;
      case Kernel::kForeign:
      case Kernel::kBad:
        // Bytes behind librsock's back (a raw write, io_uring, stdio on the
        // peer's fd; a forged frame): they belong to no frame. They are
        // dropped, and the connection is reset on both ends.
        if (!end_owns(rings_.end.hdr(), epoch_)) {
          become_lost_locked();  // the new owner's to report
          return true;
        }
        consume_kernel_locked(len, false);
        kernel_bytes_seen_locked();
        continue;
      case Kernel::kFrame:
        break;
    }
    // Frames are consumed by the owner only, in order, under the frame
    // lock (a taker on this host fences us under it).
    VerbsEndHeader* h = rings_.end.hdr();
    if (!end_lock_frames(h, monotonic_ms() + kVerbsMoveMs)) return i > 0;
    if (!end_owns(h, epoch_)) {
      end_unlock_frames(h);
      become_lost_locked();
      return true;
    }
    consume_kernel_locked(kMoveFrameBytes, true);
    if ((carrier_flags_.load(std::memory_order_relaxed) | peer_flags_) & kKernelBytes) {
      // Reset for kernel bytes: a process of the other end that takes it
      // over learns so instead of a new queue pair.
      end_unlock_frames(h);
      if (f.type == MoveType::kMove) send_reset_frame_locked(kMoveKernelBytes);
      continue;
    }
    if (f.type == MoveType::kMove) {
      handle_move_locked(f);
    } else if (f.type == MoveType::kReset) {
      end_unlock_frames(h);
      poll_cq_locked();
      if (f.flags & kMoveKernelBytes)
        kernel_bytes_from_peer_locked();
      else
        fail_move_locked("the other end failed to move", false);
      return true;
    }  // kMoved: an answer to a takeover that another one superseded
    end_unlock_frames(h);
    if (state_.load(std::memory_order_relaxed) == kFailed) return true;
  }
  return true;
}

// The other end moved to another process (MOVE): a new queue pair of ours
// for its new one, our answer (MOVED), then wait for its first message
// before we resend what it has not read (it may not be up yet).
void VerbsChannel::handle_move_locked(const MoveFrame& f) {
  poll_cq_locked();  // what the old queue pair delivered
  // (Our read total may grow meanwhile, in another thread's recv: a smaller
  // one only makes the taker resend bytes we have, to the same place.)
  const uint64_t consumed = rx_consumed_.load(std::memory_order_relaxed);
  if (f.ring_log2 != log2_of(ring_bytes_) || f.rx_consumed > posted_head_ ||
      posted_head_ - f.rx_consumed > ring_bytes_ || f.tx_sent < consumed ||
      f.tx_sent < peer_head_ || f.tx_sent - consumed > ring_bytes_) {
    LOG_WARN(
        "rdma: a move frame with impossible positions (read %llu of our %llu, sent %llu, "
        "we read %llu)",
        static_cast<unsigned long long>(f.rx_consumed),
        static_cast<unsigned long long>(posted_head_), static_cast<unsigned long long>(f.tx_sent),
        static_cast<unsigned long long>(consumed));
    fail_move_locked("impossible positions", true);
    return;
  }
  if (gid_index_ < 0) {
    fail_move_locked("no RoCE GID for this end's address: the queue pair cannot be made by hand",
                     true);
    return;
  }
  VerbsPort port;
  port.ctx = ctx_;
  port.port = port_;
  port.gid_index = gid_index_;
  memcpy(port.gid, gid_, sizeof gid_);
  port.mtu = mtu_;
  uint32_t inline_bytes = 0;
  ibv_qp* qp = member_.engine() && rings_.pd
                   ? verbs_create_qp(rings_.pd, member_.cq(), port, &inline_bytes)
                   : nullptr;
  if (!qp) {
    fail_move_locked("cannot create a queue pair", true);
    return;
  }
  QpAddress peer;
  peer.qpn = f.qpn;
  peer.psn = f.psn;
  memcpy(peer.gid, f.gid, 16);
  peer.mtu = f.mtu;
  const uint32_t psn = verbs_random_psn();
  // The old queue pair stops (the other end's new one must never see a
  // write of it land late). The new one was created while the old one
  // still existed, so it has another number, which tells the old one's
  // leftovers in the shared CQ apart.
  ibv_qp* const old = qp_;
  const bool old_from_cm = qp_from_cm_;
  qp_ = qp;
  qp_from_cm_ = false;
  max_inline_ = inline_bytes;
  engine_->set_qp(&member_, qp->qp_num);  // the old one's completions are history
  reset_qp_counters_locked();
  if (old) {
    if (old_from_cm && cm_connected_ && id_) rdma_disconnect(id_);
    ibv_qp_attr err = {};
    err.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(old, &err, IBV_QP_STATE);
    poll_cq_locked();
    if (old_from_cm && id_)
      rdma_destroy_qp(id_);
    else
      ibv_destroy_qp(old);
  }
  cm_connected_ = false;
  int rc = repost_locked(kVerbsRecvDepth);
  if (rc == 0) rc = verbs_connect_qp(qp_, port, peer, psn);
  if (rc < 0) {
    fail_move_locked("cannot bring the new queue pair up", true);
    return;
  }
  my_psn_ = psn;
  remote_addr_ = f.ring.addr;
  remote_rkey_ = f.ring.rkey;
  if (f.rx_consumed > peer_consumed_) peer_consumed_ = f.rx_consumed;
  replay_from_ = f.rx_consumed;
  if (int r = send_frame_locked(my_frame_locked(MoveType::kMoved, f.nonce)); r < 0) {
    fail_move_locked("cannot answer on the kernel socket", false);
    return;
  }
  state_.store(kAwaitHello, std::memory_order_release);
  deadline_ms_ = monotonic_ms() + kVerbsMoveMs;
  arm_deadline_locked(deadline_ms_);
  LOG_INFO("rdma: the other end moved to another process: new queue pair");
}

// The taker's first message arrived on the new queue pair: it is up.
// Resend what it has not read, and our flags.
void VerbsChannel::on_hello_locked() {
  state_.store(kOwned, std::memory_order_release);
  deadline_ms_ = 0;
  arm_deadline_locked(0);
  // Our read total as of now (the MOVED frame had it as of then): a close
  // that comes with the flags below must find it exact at the taker.
  const uint64_t consumed = rx_consumed_.load(std::memory_order_relaxed);
  LOG_DEBUG("rdma: the taker is up: resending [%llu, %llu), we read %llu",
            static_cast<unsigned long long>(replay_from_),
            static_cast<unsigned long long>(posted_head_),
            static_cast<unsigned long long>(consumed));
  if (post_imm_locked(verbs_imm::kCredit, consumed) == 0) granted_ = consumed;
  if (post_range_locked(replay_from_, posted_head_) < 0) return;
  const uint32_t sticky = flags_sent_ & kStickyFlags;
  if (sticky) (void)post_imm_locked(verbs_imm::kFlags, sticky);
}

// A process that holds the end but not its queue pair makes its own (a
// device context of its own: the parent's descriptors are refused here),
// fences the owner, reads where it stopped, and announces itself (MOVE).
int VerbsChannel::prepare_take_over_locked() {
  VerbsEndHeader* h = rings_.end.hdr();
  verbs_global_init();
  VerbsPort port;
  if (int rc = verbs_open_port_for(h->local, &port); rc < 0) {
    LOG_WARN("rdma: no RoCE device has this connection's address: it cannot be taken over");
    return rc;
  }
  int err = 0;
  engine_ = VerbsEngine::of_opened(port.ctx, &err);  // (keeps or closes port.ctx)
  if (!engine_) return err;
  ctx_ = port.ctx = engine_->context();
  port_ = port.port;
  gid_index_ = port.gid_index;
  memcpy(gid_, port.gid, sizeof gid_);
  mtu_ = port.mtu;
  if (int rc = rings_.end.map_rings(); rc < 0) return rc;
  rx_ring_ = rings_.end.rx_ring();
  tx_buf_ = rings_.end.tx_mirror();
  if (member_.engine()) member_.engine()->leave(&member_);  // (never joined here, so far)
  if (int rc = engine_->join(&member_, kCqePerQp, kick_fn_, kick_arg_, armed_); rc < 0) return rc;
  if (int rc = alloc_pd_locked(); rc < 0) return rc;
  qp_ = verbs_create_qp(rings_.pd, member_.cq(), port, &max_inline_);
  if (!qp_) return errno ? -errno : -ENOMEM;
  engine_->set_qp(&member_, qp_->qp_num);
  // Counted, not bounded: a takeover has no TCP to fall back to.
  if (!rings_.rx_mr)
    if (int rc = verbs_register_rings(&rings_, false); rc < 0) return rc;
  reset_qp_counters_locked();
  if (int rc = repost_locked(kVerbsRecvDepth); rc < 0) return rc;
  return 0;
}

int VerbsChannel::continue_take_over_locked(EndPositions* at) {
  VerbsEndHeader* h = rings_.end.hdr();
  for (;;) {
    MoveFrame f;
    size_t len = 0;
    const Kernel r = read_kernel_socket_locked(&f, &len);
    switch (r) {
      case Kernel::kNothing:
      case Kernel::kPartial:
        return -EAGAIN;
      case Kernel::kForeign:
      case Kernel::kBad:
        // Not a frame: bytes behind librsock's back (or a forged frame).
        // The connection is reset on both ends.
        consume_kernel_locked(len, false);
        kernel_bytes_seen_locked();
        return -ECONNRESET;
      case Kernel::kEnd:
      case Kernel::kReset:
      case Kernel::kError: {
        // The other end is gone before it answered: what reached the ring
        // while the previous owner had the end is all there will be. It
        // recorded how far that is when it last looked at its queue (its
        // close, exit or exec looks once more).
        const int64_t deadline = monotonic_ms() + kVerbsMoveMs;
        while (!(h->peer_flags.load(std::memory_order_acquire) & kMoveClosed) &&
               prev_owner_ != static_cast<int>(getpid()) && !pid_gone(prev_owner_) &&
               monotonic_ms() < deadline)
          usleep(5000);
        const uint64_t consumed = rx_consumed_.load(std::memory_order_relaxed);
        const uint64_t head = std::max(h->rx_head.load(std::memory_order_acquire), consumed);
        if (head - consumed <= ring_bytes_) peer_head_ = head;
        peer_flags_ |= peer_flags_of(h->peer_flags.load(std::memory_order_acquire));
        // What the other end read of ours it told a process that is gone
        // (its credits): the end reads as its kernel reported it, a FIN as
        // EOF, a reset as a reset.
        peer_consumed_ = posted_head_;
        state_.store(kOwned, std::memory_order_release);
        carrier_lost(r == Kernel::kEnd     ? kPeerClosed
                     : r == Kernel::kReset ? kPeerClosed | kPeerReset
                                           : kTransportError | kPeerClosed);
        unwatch_tcp_locked();
        at->tx_sent = at->tx_credited = posted_head_;
        at->rx_consumed = consumed;
        at->fin_sent = (flags_sent_ & verbs_imm::kFin) != 0;
        stats_connection(Path::kRdma);
        return 0;
      }
      case Kernel::kFrame:
        break;
    }
    if (!end_lock_frames(h, monotonic_ms() + kVerbsMoveMs)) return -EAGAIN;
    if (!end_owns(h, epoch_)) {  // a later taker fenced us
      end_unlock_frames(h);
      become_lost_locked();
      return -ECONNRESET;
    }
    if (f.type == MoveType::kMoved && f.nonce != move_nonce_) {
      consume_kernel_locked(kMoveFrameBytes, true);  // for a takeover superseded by ours
      end_unlock_frames(h);
      continue;
    }
    consume_kernel_locked(kMoveFrameBytes, true);
    end_unlock_frames(h);
    if (f.type == MoveType::kReset) {
      if (f.flags & kMoveKernelBytes)
        kernel_bytes_from_peer_locked();
      else
        fail_move_locked("the other end failed to move", false);
      return -ECONNRESET;
    }
    // MOVED, our answer; or the other end's own MOVE (it moves at the same
    // time: each takes the other's MOVE as the answer).
    return connect_taker_locked(f, at);
  }
}

int VerbsChannel::connect_taker_locked(const MoveFrame& f, EndPositions* at) {
  const uint64_t consumed = rx_consumed_.load(std::memory_order_relaxed);
  if (f.ring_log2 != log2_of(ring_bytes_) || f.rx_consumed > posted_head_ ||
      posted_head_ - f.rx_consumed > ring_bytes_ || f.tx_sent < consumed ||
      f.tx_sent - consumed > ring_bytes_) {
    fail_move_locked("the other end answered with impossible positions", true);
    return -ECONNRESET;
  }
  VerbsPort port;
  port.ctx = ctx_;
  port.port = port_;
  port.gid_index = gid_index_;
  memcpy(port.gid, gid_, sizeof gid_);
  port.mtu = mtu_;
  QpAddress peer;
  peer.qpn = f.qpn;
  peer.psn = f.psn;
  memcpy(peer.gid, f.gid, 16);
  peer.mtu = f.mtu;
  if (verbs_connect_qp(qp_, port, peer, my_psn_) < 0) {
    fail_move_locked("cannot bring the new queue pair up", true);
    return -ECONNRESET;
  }
  LOG_DEBUG("rdma: MOVED: the other end read %llu of our %llu and sent %llu; we read %llu",
            static_cast<unsigned long long>(f.rx_consumed),
            static_cast<unsigned long long>(posted_head_),
            static_cast<unsigned long long>(f.tx_sent), static_cast<unsigned long long>(consumed));
  remote_addr_ = f.ring.addr;
  remote_rkey_ = f.ring.rkey;
  peer_consumed_ = f.rx_consumed;
  peer_head_ = consumed;
  state_.store(kOwned, std::memory_order_release);
  // Our first message tells the other end we are up (it waits for it
  // before it resends): our exact read total. Then what it has not read of
  // ours, and our flags.
  if (post_imm_locked(verbs_imm::kCredit, consumed) == 0) granted_ = consumed;
  (void)post_range_locked(f.rx_consumed, posted_head_);
  const uint32_t sticky = flags_sent_ & kStickyFlags;
  if (sticky) {
    rings_.end.hdr()->flags_sent.fetch_or(frame_flags(sticky), std::memory_order_acq_rel);
    (void)post_imm_locked(verbs_imm::kFlags, sticky);
  }
  at->tx_sent = posted_head_;
  at->tx_credited = f.rx_consumed;
  at->rx_consumed = consumed;
  at->fin_sent = (flags_sent_ & verbs_imm::kFin) != 0;
  stats_connection(Path::kRdma);
  LOG_INFO("rdma connection taken over by this process (pid %d)", static_cast<int>(getpid()));
  return 0;
}

bool VerbsChannel::needs_take_over() {
  const int st = state_.load(std::memory_order_acquire);
  return st == kNotMine || st == kTaking;
}

int VerbsChannel::take_over(EndPositions* at) {
  std::lock_guard<std::mutex> lock(mu_);
  int st = state_.load(std::memory_order_relaxed);
  if (st == kLost || st == kFailed) return -ECONNRESET;
  if (st != kNotMine && st != kTaking) return -ECONNRESET;  // (not called then)
  if (st == kNotMine) {
    if (reset_for_kernel_bytes_locked()) return -ECONNRESET;
    if (int rc = prepare_take_over_locked(); rc < 0) {
      // Nothing was changed for the other processes: the end stays with its
      // owner; here it is unusable (and our close must not reset it).
      quiet_failure_ = true;
      fail_move_locked(strerror(-rc), false);
      return -ECONNRESET;
    }
    VerbsEndHeader* h = rings_.end.hdr();
    const int64_t deadline = monotonic_ms() + kVerbsMoveMs;
    if (!end_lock_frames(h, deadline)) {
      fail_move_locked("the end's frame lock stayed taken", false);
      return -ECONNRESET;
    }
    prev_owner_ = h->own.owner_pid.load(std::memory_order_acquire);
    const int fenced = end_fence(h, deadline, &epoch_);
    // From here on the previous owner fails every call: a failure is the
    // connection's.
    if (fenced < 0) {
      end_unlock_frames(h);
      fail_move_locked("the previous owner stayed inside an operation", true);
      return -ECONNRESET;
    }
    if (reset_for_kernel_bytes_locked()) {  // since the look above
      end_unlock_frames(h);
      return -ECONNRESET;
    }
    posted_head_ = h->tx_sent.load(std::memory_order_acquire);
    rx_consumed_.store(h->rx_consumed.load(std::memory_order_acquire), std::memory_order_relaxed);
    flags_sent_ |= imm_flags_of(h->flags_sent.load(std::memory_order_acquire));
    // We continue from what the previous owner's application read: the
    // other end sends again what lies beyond, then its FIN or CLOSED (RC
    // order). Taken from the end's memory now, a FIN would come before
    // those bytes and end the stream short (only a taker that finds the
    // other end gone reads them there, with rx_head: continue_take_over).
    peer_flags_ = 0;
    peer_head_ = rx_consumed_.load(std::memory_order_relaxed);
    granted_ = 0;
    my_psn_ = verbs_random_psn();
    move_nonce_ = verbs_random_nonce();
    h->move_nonce.store(move_nonce_, std::memory_order_release);
    watch_fd_locked(tcp_fd_);
    const int sent = send_frame_locked(my_frame_locked(MoveType::kMove, move_nonce_));
    end_unlock_frames(h);
    if (sent < 0) {
      fail_move_locked("cannot write on the kernel socket", false);
      return -ECONNRESET;
    }
    state_.store(kTaking, std::memory_order_release);
    LOG_DEBUG("rdma: taking the connection over (sent MOVE)");
  }
  return continue_take_over_locked(at);
}

// ------------------------------------------------ close, exit, exec hand-off --

// Sends nothing new; waits until every WR posted so far has completed, so
// that nothing we published dies with the queue pair. The wait ends with
// the queue pair's own verdict: the ACK, or an error completion once its
// retries are spent (a lost packet is sent again after the ACK timeout; a
// busy or slow peer's device still acknowledges), and at deadline_ms at the
// latest.
bool VerbsChannel::flush_posted_locked(int64_t deadline_ms) {
  const int marked = post_marker_locked();
  if (marked != 0) return marked > 0;
  deadline_ms = std::min(deadline_ms, monotonic_ms() + verdict_bound_ms_locked());
  // Also over once the peer disconnects or detaches: nothing more can be
  // delivered (and its QP may be gone: no ACK would ever come).
  useconds_t nap = 50;
  while (wr_done_ < wr_posted_ &&
         (carrier_flags_.load(std::memory_order_relaxed) & (kTransportError | kPeerClosed)) == 0 &&
         state_.load(std::memory_order_relaxed) == kOwned && monotonic_ms() < deadline_ms) {
    poll_cq_locked();
    if (wr_done_ < wr_posted_) {
      drain_cm_events_locked();
      usleep(nap);
      nap = std::min<useconds_t>(2 * nap, 2000);  // a retry takes hundreds of ms
    }
  }
  if (wr_done_ < wr_posted_)
    LOG_INFO("rdma: letting the end go with work requests unacknowledged (done %llu of %llu)",
             static_cast<unsigned long long>(wr_done_),
             static_cast<unsigned long long>(wr_posted_));
  return wr_done_ >= wr_posted_;
}

// The marker of flush_posted_locked: a signaled zero-length write behind
// every WR posted so far. 1: nothing to wait for (all completed, or the
// peer closed or failed: it reads nothing more, and its queue pair may be
// gone, so a marker would only run into the deadline); 0: posted, its
// completion (wr_posted_) is the verdict; -1: no queue pair, or it refused.
int VerbsChannel::post_marker_locked() {
  if (!qp_ || remote_rkey_ == 0 || state_.load(std::memory_order_relaxed) != kOwned) return -1;
  poll_cq_locked();
  if ((carrier_flags_.load(std::memory_order_relaxed) & kTransportError) ||
      (peer_flags_ & kPeerClosed) || wr_done_ >= wr_posted_)
    return 1;
  ibv_send_wr wr = {};
  wr.opcode = IBV_WR_RDMA_WRITE;  // zero-length: a pure ordering marker
  wr.wr.rdma.remote_addr = remote_addr_;
  wr.wr.rdma.rkey = remote_rkey_;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (reserve_sq_locked(1) != 0) return -1;
  wr.wr_id = ++wr_posted_;
  last_signaled_ = wr_posted_;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp_, &wr, &bad) == 0 ? 0 : -1;
}

// How long the queue pair can take to complete or fail a posted WR: its
// ACK timeout and retry count (queried: rdma_cm's may differ from ours).
int64_t VerbsChannel::verdict_bound_ms_locked() {
  ibv_qp_attr qa = {};
  ibv_qp_init_attr ia = {};
  qa.timeout = kVerbsAckTimeout;
  qa.retry_cnt = kVerbsRetryCount;
  (void)ibv_query_qp(qp_, &qa, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT, &ia);
  return verbs_retry_bound_ms(qa.timeout, qa.retry_cnt) + kCloseSlackMs;
}

// A closed connection whose last WRs are still on their way: what its
// queue pair needs until its verdict (docs/design.md, "A close that
// lingers"). The engine's thread finishes it; the channel is gone.
struct VerbsChannel::Closing final : VerbsEngine::Linger {
  ibv_qp* qp = nullptr;
  bool qp_from_cm = false;
  rdma_cm_id* id = nullptr;
  bool disconnect = false;
  VerbsRings rings;         // the memory the queue pair reads and writes
  bool keep_rings = false;  // for the engine's next connection (rings_reusable_locked)
  int tcp_fd = -1;          // the connection's dup: closed last

  // Moves what the queue pair needs out of ch (and back: give_back).
  void take(VerbsChannel& ch) {
    std::swap(qp, ch.qp_);
    std::swap(qp_from_cm, ch.qp_from_cm_);
    std::swap(id, ch.id_);
    std::swap(disconnect, ch.cm_connected_);
    std::swap(rings, ch.rings_);
    std::swap(tcp_fd, ch.tcp_fd_);
  }
  void give_back(VerbsChannel& ch) { take(ch); }

  void fds(std::vector<int>* out) const override {
    if (tcp_fd >= 0) out->push_back(tcp_fd);
    if (rings.end.memfd() >= 0) out->push_back(rings.end.memfd());
  }

  void finish() override {
    LOG_DEBUG("rdma: a closed connection's queue pair goes (its last work request %s)",
              delivered ? "delivered" : "not acknowledged");
    if (disconnect && id) rdma_disconnect(id);
    if (qp_from_cm && id)
      rdma_destroy_qp(id);
    else if (qp)
      ibv_destroy_qp(qp);
    VerbsEngine* const e = member.engine();
    if (e) e->leave(&member);
    if (e)
      e->give_rings(&rings, keep_rings);
    else
      verbs_release_registrations(&rings);
    if (id) rdma_destroy_id(id);
    if (tcp_fd >= 0) real().close(tcp_fd);  // the FIN, after our bytes
    delete this;                            // (and the end's mapping)
  }
};

// The last close, with its marker posted: the engine's thread waits for the
// verdict instead of the caller, as the kernel lingers after a TCP close.
// Only a queue pair whose events reach the engine (its id adopted, or one
// made by hand) and a peer still there; false: the caller waits itself.
bool VerbsChannel::linger_locked() {
  VerbsEngine* e = member_.engine();
  if (!e || cm_channel_ || remote_rkey_ == 0) return false;
  auto* l = new (std::nothrow) Closing();
  if (!l) return false;
  l->target = wr_posted_;
  l->deadline_ms = monotonic_ms() + verdict_bound_ms_locked();
  l->keep_rings = rings_reusable_locked();
  l->take(*this);
  if (e->linger(l, &member_)) return true;  // (it may be finished already)
  l->give_back(*this);
  delete l;
  return false;
}

// Drives a move that is under way to its end, bounded: the process is
// about to let the end go (close, exit, exec) and whatever it still holds
// must reach the other end first. last_holder: nobody on this host can
// take over after us, so a detached end waits for the other end's taker.
void VerbsChannel::settle_locked(std::unique_lock<std::mutex>& lock, int64_t deadline_ms,
                                 bool last_holder) {
  for (;;) {
    const int st = state_.load(std::memory_order_relaxed);
    if (ended_locked()) return;
    if (st == kTaking) {
      EndPositions at;
      if (continue_take_over_locked(&at) != -EAGAIN) continue;
    } else if (st == kAwaitHello) {
      poll_cq_locked();
      check_deadline_locked();
      if (state_.load(std::memory_order_relaxed) != kAwaitHello) continue;
    } else if (st == kDetached && last_holder && posted_head_ > peer_consumed_) {
      // Bytes the other end may not have: only its next taker can get them.
      service_kernel_socket_locked();
      poll_cq_locked();
      check_deadline_locked();
      if (state_.load(std::memory_order_relaxed) != kDetached) continue;
    } else {
      return;
    }
    if (monotonic_ms() >= deadline_ms) {
      fail_move_locked("the connection was still moving when this process let it go", true);
      return;
    }
    lock.unlock();
    usleep(2000);
    lock.lock();
  }
}

// The owner lets the end go: close (detach: other processes hold it), exit
// or exec. Whatever a move under way still holds is delivered first; then
// everything posted; a detaching owner reports its exact read total and
// DETACH, so that the other end waits for the next owner instead of
// failing, and releases the end.
void VerbsChannel::hand_over_locked(std::unique_lock<std::mutex>& lock, bool detach,
                                    bool may_linger) {
  const int st0 = state_.load(std::memory_order_relaxed);
  if (st0 != kOwned && st0 != kDetached && st0 != kAwaitHello && st0 != kTaking) {
    if (st0 == kLost) poll_cq_locked();  // records what reached the ring (rx_head)
    return;
  }
  LOG_DEBUG("rdma: letting the end go (%s), state %d, posted %llu, read %llu",
            detach ? "others hold it" : "the last holder", st0,
            static_cast<unsigned long long>(posted_head_),
            static_cast<unsigned long long>(rx_consumed_.load(std::memory_order_relaxed)));
  const int64_t deadline = monotonic_ms() + kVerbsMoveMs;
  settle_locked(lock, deadline, !detach);
  if (state_.load(std::memory_order_relaxed) == kOwned) {
    if (detach && !(carrier_flags_.load(std::memory_order_relaxed) & kTransportError)) {
      const uint64_t consumed = rx_consumed_.load(std::memory_order_relaxed);
      if (consumed > granted_ && post_imm_locked(verbs_imm::kCredit, consumed) == 0)
        granted_ = consumed;
      (void)post_imm_locked(verbs_imm::kFlags, (flags_sent_ & kStickyFlags) | verbs_imm::kDetach);
    }
    if (may_linger && !detach && post_marker_locked() == 0) {
      record_rx_locked();
      if (linger_locked()) return;
    }
    flush_posted_locked(deadline);
  }
  poll_cq_locked();
  record_rx_locked();
  if (detach && rings_.end.hdr()) end_release(rings_.end.hdr(), epoch_);
  if (cm_connected_ && id_ && remote_rkey_ != 0) rdma_disconnect(id_);
  cm_connected_ = false;
}

void VerbsChannel::at_exit() {
  std::unique_lock<std::mutex> lock(mu_);
  if (exited_) return;
  exited_ = true;
  check_owner_locked();
  // The queue pair dies with the process: deliver what is posted; if other
  // processes hold the end, one of them may take it over. (Closed already,
  // with its state still referenced: as its close decided.)
  const bool others =
      rings_.end.hdr() && rings_.end.hdr()->holders.load(std::memory_order_acquire) > 1;
  hand_over_locked(lock, !last_close_ && (detach_close_ || others));
}

void VerbsChannel::own_fds(std::vector<int>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : {tcp_fd_, epoll_fd_, timer_fd_, rings_.end.memfd()})
    if (fd >= 0) out->push_back(fd);
  if (cm_channel_) out->push_back(cm_channel_->fd);
  // (The engine's: VerbsEngine::own_fds.)
}

void VerbsChannel::prepare_exec() {
  std::unique_lock<std::mutex> lock(mu_);
  check_owner_locked();
  // The queue pair dies with this image; the new one takes the end over.
  hand_over_locked(lock, true);
}

void VerbsChannel::exec_failed() {
  std::lock_guard<std::mutex> lock(mu_);
  const int st = state_.load(std::memory_order_relaxed);
  if (st != kOwned && st != kDetached && st != kAwaitHello) return;
  // The other end was told this queue pair goes away: this image takes the
  // end over again, like a new one, on its next use.
  unwatch_tcp_locked();
  if (cm_channel_ && epoll_fd_ >= 0)
    real().epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, cm_channel_->fd, nullptr);
  destroy_verbs_locked();
  if (id_) rdma_destroy_id(id_);
  id_ = nullptr;
  if (cm_channel_) rdma_destroy_event_channel(cm_channel_);
  cm_channel_ = nullptr;
  ctx_ = nullptr;
  engine_ = nullptr;
  rings_.end.unmap_rings();
  rx_ring_ = tx_buf_ = nullptr;
  state_.store(kNotMine, std::memory_order_release);
}

// ------------------------------------------- the end of the kernel socket --

// The connection has ended here: the other end is gone (kPeerClosed from
// the socket or the queue pair), the carrier broke, or bytes behind
// librsock reset it.
bool VerbsChannel::ended_locked() const {
  return (carrier_flags_.load(std::memory_order_relaxed) &
          (kPeerClosed | kTransportError | kKernelBytes)) != 0;
}

// Bytes reached our TCP socket behind librsock (no move frame: see
// read_kernel_socket_locked): the connection resets here (ECONNRESET), the
// other end is told, and the reset is reported once in this process. The
// other end hears it on the queue pair (FLAGS KERNEL_BYTES) when ours is
// connected to it, else (the connection moves) on the kernel socket, in a
// RESET frame that says KERNEL_BYTES, which whichever process of the other
// end takes it over reads first. The end's memory keeps it (flags_sent), so
// that another process holding this end that would take it over stays reset
// instead (reset_for_kernel_bytes_locked), and a MOVE that comes later is
// answered with that RESET frame (service_kernel_socket_locked).
void VerbsChannel::kernel_bytes_seen_locked() {
  if (carrier_flags_.load(std::memory_order_relaxed) & kKernelBytes) return;
  if (!kernel_bytes_reported_) report_kernel_bytes("rdma", true);
  kernel_bytes_reported_ = true;
  flags_sent_ |= verbs_imm::kKernelBytes;
  if (rings_.end.hdr())
    rings_.end.hdr()->flags_sent.fetch_or(kMoveKernelBytes, std::memory_order_acq_rel);
  if (state_.load(std::memory_order_relaxed) == kOwned && qp_ &&
      (carrier_flags_.load(std::memory_order_relaxed) & kTransportError) == 0 &&
      wr_posted_ - wr_done_ + 1 <= kVerbsSendDepth)
    (void)post_imm_locked(verbs_imm::kFlags, flags_sent_);
  else
    send_reset_frame_locked(kMoveKernelBytes);
  carrier_lost(kKernelBytes);
  stop_moving_locked();
}

// The other end reset the connection for bytes that reached its kernel
// socket behind librsock (FLAGS KERNEL_BYTES, or a RESET frame saying so).
void VerbsChannel::kernel_bytes_from_peer_locked() {
  if (peer_flags_ & kKernelBytes) return;
  peer_flags_ |= kKernelBytes;
  if (!kernel_bytes_reported_) report_kernel_bytes("rdma", false);
  kernel_bytes_reported_ = true;
  record_rx_locked();  // into the end's peer_flags, for another holder
  stop_moving_locked();
}

// A process about to take the end over: was the connection reset for
// kernel bytes while another process owned it (found on this end's socket,
// or told by the other end)? Then it is reset here too, with no move.
bool VerbsChannel::reset_for_kernel_bytes_locked() {
  VerbsEndHeader* h = rings_.end.hdr();
  const bool here = h->flags_sent.load(std::memory_order_acquire) & kMoveKernelBytes;
  const bool there = h->peer_flags.load(std::memory_order_acquire) & kMoveKernelBytes;
  if (!here && !there) return false;
  if (!kernel_bytes_reported_) report_kernel_bytes("rdma", here);
  kernel_bytes_reported_ = true;
  if (here) flags_sent_ |= verbs_imm::kKernelBytes;
  if (there) peer_flags_ |= kKernelBytes;
  carrier_lost(kKernelBytes);
  state_.store(kFailed, std::memory_order_release);
  return true;
}

// A reset ends a move under way: no deadline, no frame to wait for.
void VerbsChannel::stop_moving_locked() {
  const int st = state_.load(std::memory_order_relaxed);
  if (st != kDetached && st != kAwaitHello && st != kTaking) return;
  state_.store(kFailed, std::memory_order_release);
  deadline_ms_ = 0;
  arm_deadline_locked(0);
}

// One look at the kernel socket (a MSG_PEEK that finds nothing, as a rule):
// a peer that died without a word, bytes behind librsock, or a MOVE for a
// program that keeps busy without sleeping. Only the owner reads it: a
// taker reads its answer in take_over(), and a process that lost the end
// leaves it to the new owner.
void VerbsChannel::probe() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ended_locked()) return;
  if (!check_owner_locked() || state_.load(std::memory_order_relaxed) == kTaking) return;
  service_kernel_socket_locked();
}

uint64_t VerbsChannel::peer_read_total() {
  std::lock_guard<std::mutex> lock(mu_);
  return peer_consumed_;
}

}  // namespace rsock
