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
// ibv_get_cq_event ~20 us, ibv_post_recv ~4 us, ibv_poll_cq < 1 us. So a
// sleeper woken by new completions while the CQ was armed (the notification
// must have fired) leaves reading that event for arm(), which runs before
// the next sleep (event_owed_); and the receive WQEs it consumed are
// re-posted in batches of kRepostBatch, or all of them in arm(). A drain
// that finds an event still owed (its caller did not arm in between) reads
// it at once, so wait_fd never stays readable for more than one extra turn.
// Whichever thread reads an event (or a cm event, or the TCP socket's EOF)
// says so (arm and drain_wakeups return true), and the socket layer wakes
// the connection's other sleepers (socket/wake_hub.h): another thread of
// the process may have been woken by that very event and not yet looked.
#include "transport/verbs/verbs_channel.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/real.h"
#include "ring/ring.h"
#include "transport/carrier.h"

namespace rsock {
namespace {

constexpr uint64_t kRecvWrId = ~0ull;   // receive WQEs; send WRs carry their sequence number
constexpr int kAckEventsBatch = 16;     // ibv_ack_cq_events batching
constexpr int64_t kSqWaitMs = 2000;     // bound of a wait for send-queue room
constexpr int64_t kCloseWaitMs = 1000;  // bound of the final flush at close
// Receive WQEs consumed are re-posted once this many are due (and all of
// them before a sleep). The ACK reports re-posted WQEs only, so the peer's
// data window (R - K - 1 unacknowledged) still leaves K receives free.
// Blocked-sender argument (above): out >= R - K means >= R - K - kRepostBatch
// + 1 > T re-posted and unreported, so the ACK still goes out.
constexpr uint32_t kRepostBatch = 16;
static_assert(kVerbsRecvDepth - kVerbsCtrlReserve - kRepostBatch + 1 > kVerbsAckEvery);

int64_t now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void* map_pages(size_t len) {
  void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

int set_nonblock(int fd) {
  int fl = real().fcntl(fd, F_GETFL, 0);
  if (fl < 0) return -errno;
  return real().fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

}  // namespace

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
  ibv_context* ctx = id_->verbs;
  if (ctx == nullptr) return -ENODEV;
  pd_ = ibv_alloc_pd(ctx);
  if (!pd_) return errno ? -errno : -ENOMEM;
  comp_channel_ = ibv_create_comp_channel(ctx);
  if (!comp_channel_) return errno ? -errno : -ENOMEM;
  const int cqe = static_cast<int>(kVerbsSendDepth + kVerbsRecvDepth + 16);
  cq_ = ibv_create_cq(ctx, cqe, nullptr, comp_channel_, 0);
  if (!cq_) return errno ? -errno : -ENOMEM;
  if (int r = set_nonblock(comp_channel_->fd); r < 0) return r;

  ibv_qp_init_attr qa = {};
  qa.send_cq = cq_;
  qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.sq_sig_all = 0;
  qa.cap.max_send_wr = kVerbsSendDepth;
  qa.cap.max_recv_wr = kVerbsRecvDepth;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  qa.cap.max_inline_data = kVerbsMaxInline;
  if (rdma_create_qp(id_, pd_, &qa) != 0) {
    // Some devices refuse large inline sizes: retry without inline data.
    qa.cap.max_inline_data = 0;
    if (rdma_create_qp(id_, pd_, &qa) != 0) return errno ? -errno : -ENOMEM;
  }
  qp_created_ = true;
  max_inline_ = qa.cap.max_inline_data;

  // Page-aligned, registered once. ibv_fork_init (or a kernel that makes it
  // unnecessary) was settled before the first registration (verbs_setup).
  rx_ring_ = static_cast<uint8_t*>(map_pages(ring_bytes));
  tx_buf_ = static_cast<uint8_t*>(map_pages(ring_bytes));
  if (!rx_ring_ || !tx_buf_) return -ENOMEM;
  rx_mr_ = ibv_reg_mr(pd_, rx_ring_, ring_bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!rx_mr_) return errno ? -errno : -ENOMEM;
  tx_mr_ = ibv_reg_mr(pd_, tx_buf_, ring_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (!tx_mr_) return errno ? -errno : -ENOMEM;

  // The peer may write as soon as the connection is established: the
  // receives must be posted before connect/accept.
  return repost_locked(kVerbsRecvDepth);
}

uint64_t VerbsChannel::rx_addr() const { return reinterpret_cast<uintptr_t>(rx_ring_); }
uint32_t VerbsChannel::rx_rkey() const { return rx_mr_->rkey; }

int VerbsChannel::start(uint64_t remote_addr, uint32_t remote_rkey, int tcp_fd) {
  std::lock_guard<std::mutex> lock(mu_);
  remote_addr_ = remote_addr;
  remote_rkey_ = remote_rkey;
  tcp_fd_ = real().fcntl(tcp_fd, F_DUPFD_CLOEXEC, 0);
  if (tcp_fd_ < 0) return -errno;
  epoll_fd_ = real().epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) return -errno;
  if (int r = set_nonblock(cm_channel_->fd); r < 0) return r;
  // rdma_cm leaves the RNR NAK delay at its maximum (655 ms); an RNR only
  // happens when the peer stopped polling, and then it should retry soon
  // after the peer re-posts: 0.64 ms (encoding 12). Best effort.
  ibv_qp_attr qa = {};
  qa.min_rnr_timer = 12;
  if (ibv_modify_qp(id_->qp, &qa, IBV_QP_MIN_RNR_TIMER) != 0)
    LOG_DEBUG("rdma: cannot lower the RNR timer: %s", strerror(errno));
  const int fds[3] = {comp_channel_->fd, cm_channel_->fd, tcp_fd_};
  for (int fd : fds) {
    epoll_event ev = {};
    ev.events = EPOLLIN | (fd == tcp_fd_ ? uint32_t{EPOLLRDHUP} : 0u);
    ev.data.fd = fd;
    if (real().epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) return -errno;
  }
  return 0;
}

VerbsChannel::~VerbsChannel() {
  std::unique_lock<std::mutex> lock(mu_);
  // Everything we posted (the last publication, CLOSED) must reach the peer
  // before the QP goes away: wait, bounded, for a signaled marker WR. Not
  // when the peer has closed: it reads nothing more, and it may have torn
  // down its QP already, so the marker would only run into the deadline.
  if (qp_created_) poll_cq_locked();
  if (qp_created_ && remote_rkey_ != 0 &&
      (carrier_flags_.load(std::memory_order_relaxed) & kTransportError) == 0 &&
      (peer_flags_ & kPeerClosed) == 0 && wr_done_ < wr_posted_) {
    ibv_send_wr wr = {};
    wr.opcode = IBV_WR_RDMA_WRITE;  // zero-length: a pure ordering marker
    wr.wr.rdma.remote_addr = remote_addr_;
    wr.wr.rdma.rkey = remote_rkey_;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (reserve_sq_locked(1) == 0) {
      wr.wr_id = ++wr_posted_;
      last_signaled_ = wr_posted_;
      ibv_send_wr* bad = nullptr;
      if (ibv_post_send(id_->qp, &wr, &bad) == 0) {
        const int64_t deadline = now_ms() + kCloseWaitMs;
        // Also over once the peer disconnects: it closed, nothing more can
        // be delivered (and its QP may be gone: no ACK would ever come).
        while (wr_done_ < wr_posted_ &&
               (carrier_flags_.load(std::memory_order_relaxed) & (kTransportError | kPeerClosed)) ==
                   0 &&
               now_ms() < deadline) {
          poll_cq_locked();
          if (wr_done_ < wr_posted_) {
            drain_cm_events_locked();
            usleep(100);
          }
        }
      }
    }
  }
  if (id_ && remote_rkey_ != 0) rdma_disconnect(id_);
  if (tcp_fd_ >= 0 && (carrier_flags_.load(std::memory_order_relaxed) & kTransportError)) {
    // Bytes we accepted may have died with the queue pair. A reset on the
    // kernel socket (at its last close) makes the peer read ECONNRESET, not
    // a clean EOF that would hide the truncation.
    const linger reset = {1, 0};
    real().setsockopt(tcp_fd_, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  }
  lock.unlock();
  teardown(true);
}

void VerbsChannel::teardown(bool destroy_id) {
  if (qp_created_) {
    rdma_destroy_qp(id_);
    qp_created_ = false;
  }
  if (rx_mr_) ibv_dereg_mr(rx_mr_);
  if (tx_mr_) ibv_dereg_mr(tx_mr_);
  rx_mr_ = tx_mr_ = nullptr;
  if (rx_ring_) munmap(rx_ring_, ring_bytes_);
  if (tx_buf_) munmap(tx_buf_, ring_bytes_);
  rx_ring_ = tx_buf_ = nullptr;
  if (cq_) {
    if (unacked_cq_events_) ibv_ack_cq_events(cq_, unacked_cq_events_);
    unacked_cq_events_ = 0;
    ibv_destroy_cq(cq_);
    cq_ = nullptr;
  }
  if (comp_channel_) ibv_destroy_comp_channel(comp_channel_);
  comp_channel_ = nullptr;
  if (pd_) ibv_dealloc_pd(pd_);
  pd_ = nullptr;
  if (epoll_fd_ >= 0) real().close(epoll_fd_);
  if (tcp_fd_ >= 0) real().close(tcp_fd_);
  epoll_fd_ = tcp_fd_ = -1;
  if (destroy_id && id_) rdma_destroy_id(id_);
  id_ = nullptr;
  if (destroy_id && cm_channel_) rdma_destroy_event_channel(cm_channel_);
  cm_channel_ = nullptr;
}

// ------------------------------------------------------------ completions --

void VerbsChannel::carrier_lost(uint32_t flags) {
  carrier_flags_.fetch_or(flags, std::memory_order_release);
}

void VerbsChannel::on_completion(const ibv_wc& wc) {
  const bool is_recv = wc.wr_id == kRecvWrId;
  if (wc.status != IBV_WC_SUCCESS) {
    // A flush after the peer closed cleanly (it disconnects after CLOSED) is
    // the end of the stream, anything else a broken carrier.
    if (wc.status == IBV_WC_WR_FLUSH_ERR && (peer_flags_ & kPeerClosed)) {
      carrier_lost(kPeerClosed);
    } else {
      if ((carrier_flags_.load(std::memory_order_relaxed) & kTransportError) == 0)
        LOG_INFO("rdma: completion error: %s (%s)", ibv_wc_status_str(wc.status),
                 is_recv ? "receive" : "send");
      carrier_lost(kTransportError | kPeerClosed);
    }
    return;
  }
  if (!is_recv) {
    if (wc.wr_id > wr_done_) wr_done_ = wc.wr_id;
    return;
  }
  ++recv_done_;
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
      if ((v & verbs_imm::kKernelBytes) && !(peer_flags_ & kKernelBytes)) {
        peer_flags_ |= kKernelBytes;
        if (!kernel_bytes_reported_) report_kernel_bytes("rdma", false);
        kernel_bytes_reported_ = true;
      }
      break;
    case verbs_imm::kAck:
      peer_acked_ = verbs_imm::extend(peer_acked_, v);
      break;
  }
}

// Returns the number of completions taken.
int VerbsChannel::poll_cq_locked() {
  if (!cq_) return 0;
  ibv_wc wc[32];
  int found = 0;
  for (;;) {
    int n = ibv_poll_cq(cq_, 32, wc);
    if (n < 0) {
      carrier_lost(kTransportError | kPeerClosed);
      break;
    }
    for (int i = 0; i < n; ++i) on_completion(wc[i]);
    found += n;
    if (n < 32) break;
  }
  if (recv_done_ - recv_reposted_ >= kRepostBatch) flush_reposts_locked();
  const bool blocked = !data_window_open_locked();
  if (tx_was_blocked_ && !blocked) ++tx_epoch_;
  tx_was_blocked_ = blocked;
  maybe_ack_locked();
  return found;
}

void VerbsChannel::flush_reposts_locked() {
  const uint64_t due = recv_done_ - recv_reposted_;
  if (due == 0 || (carrier_flags_.load(std::memory_order_relaxed) & kTransportError)) return;
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
    int rc = ibv_post_recv(id_->qp, wrs, &bad);
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
  const int64_t deadline = now_ms() + kSqWaitMs;
  while (wr_posted_ - wr_done_ + count > kVerbsSendDepth) {
    if (carrier_flags_.load(std::memory_order_relaxed) & kTransportError) return -ECONNRESET;
    if (now_ms() > deadline) {
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
  int rc = ibv_post_send(id_->qp, wr, &bad);
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

int VerbsChannel::write(size_t offset, const void* src, size_t len) {
  // The bytes go to the mirror; publish() sends the whole new range.
  memcpy(tx_buf_ + offset, src, len);
  return 0;
}

int VerbsChannel::publish(uint64_t head) {
  std::lock_guard<std::mutex> lock(mu_);
  if (head <= posted_head_) return 0;
  if (head - posted_head_ > ring_bytes_) return -EINVAL;
  RingSpan spans[2];
  const int n =
      ring_split(posted_head_, static_cast<size_t>(head - posted_head_), ring_bytes_, spans);
  ibv_sge sge[2];
  ibv_send_wr wr[2] = {};
  for (int i = 0; i < n; ++i) {
    sge[i].addr = reinterpret_cast<uintptr_t>(tx_buf_ + spans[i].offset);
    sge[i].length = static_cast<uint32_t>(spans[i].len);
    sge[i].lkey = tx_mr_->lkey;
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
  wr[n - 1].imm_data = htonl(verbs_imm::encode(verbs_imm::kData, head));
  // The stream checked kTxBlocked under its send lock before writing, and
  // only publish() spends data credits: the window is still open here.
  int rc = post_locked(&wr[0], n);
  if (rc < 0) return rc;
  ++msgs_sent_;
  posted_head_ = head;
  if (!data_window_open_locked()) tx_was_blocked_ = true;
  return 0;
}

int VerbsChannel::grant(uint64_t consumed) {
  std::lock_guard<std::mutex> lock(mu_);
  if (consumed <= granted_) return 0;
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
  // Posted after every publication so far: the peer sees FIN after the
  // last head (RC order).
  (void)post_imm_locked(verbs_imm::kFlags, flags_sent_);
}

PeerState VerbsChannel::poll() {
  std::lock_guard<std::mutex> lock(mu_);
  // Carrier flags before the CQ: the peer's last immediates complete here
  // before its TCP FIN or disconnect can be seen, so once we have loaded a
  // carrier loss, the CQ poll below still delivers the final head. (Every
  // carrier_lost() happens under mu_, after a CQ poll, so this is belt and
  // braces.)
  const uint32_t carrier = carrier_flags_.load(std::memory_order_acquire);
  poll_cq_locked();
  PeerState s;
  s.head = peer_head_;
  s.consumed = peer_consumed_;
  s.flags = peer_flags_ | carrier;
  if (peer_stalled_) s.flags |= kPeerStalled;
  if (!data_window_open_locked()) s.flags |= kTxBlocked;
  s.tx_epoch = tx_epoch_;
  return s;
}

bool VerbsChannel::arm(uint32_t want) {
  std::lock_guard<std::mutex> lock(mu_);
  ++armed_;
  // Work left over from the last wakeup, done now that the caller is about
  // to sleep (see "The wakeup path" above). The event it reads may be one
  // another thread still sleeps on: the caller passes it on.
  flush_reposts_locked();
  bool took_event = false;
  if (event_owed_) {
    event_owed_ = false;
    took_event = take_cq_event_locked();
  }
  // Any completion from now on (data, credit, flags, ACK, error) makes the
  // completion channel readable; the caller re-checks after arm(), which
  // polls the CQ, so nothing that completed before is missed.
  if (cq_ && !cq_armed_) request_notify_locked();  // armed until its event is taken
  if ((want & kWantSpace) && !stall_announced_ &&
      (carrier_flags_.load(std::memory_order_relaxed) & kTransportError) == 0) {
    // The peer grants as soon as it frees anything while we wait.
    if (post_imm_locked(verbs_imm::kFlags, flags_sent_ | verbs_imm::kStalled) == 0)
      stall_announced_ = true;
  }
  return took_event;
}

void VerbsChannel::disarm(uint32_t /*want*/) {
  std::lock_guard<std::mutex> lock(mu_);
  if (armed_ > 0) --armed_;
}

bool VerbsChannel::drain_cm_events_locked() {
  // Connection events: the peer disconnected (after CLOSED: a clean end;
  // before: it vanished) or the device went away.
  bool took = false;
  for (;; took = true) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(cm_channel_, &ev) != 0) break;
    const rdma_cm_event_type type = ev->event;
    rdma_ack_cm_event(ev);
    if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
      poll_cq_locked();  // the peer's last immediates precede its disconnect
      carrier_lost((peer_flags_ & kPeerClosed) ? kPeerClosed : (kTransportError | kPeerClosed));
    } else if (type == RDMA_CM_EVENT_DEVICE_REMOVAL || type == RDMA_CM_EVENT_ADDR_CHANGE) {
      LOG_INFO("rdma: %s: failing the connection", rdma_event_str(type));
      carrier_lost(kTransportError | kPeerClosed);
    }
  }
  return took;
}

bool VerbsChannel::take_cq_event_locked() {
  ibv_cq* cq = nullptr;
  void* ctx = nullptr;
  if (!comp_channel_ || ibv_get_cq_event(comp_channel_, &cq, &ctx) != 0) return false;
  cq_armed_ = false;
  if (++unacked_cq_events_ >= kAckEventsBatch) {
    ibv_ack_cq_events(cq_, unacked_cq_events_);
    unacked_cq_events_ = 0;
  }
  return true;
}

void VerbsChannel::request_notify_locked() {
  ibv_req_notify_cq(cq_, 0);
  cq_armed_ = true;
}

bool VerbsChannel::drain_wakeups() {
  std::lock_guard<std::mutex> lock(mu_);
  // The usual wakeup is a completion event: take it and leave the other
  // sources alone. wait_fd is level-triggered, so anything else that is
  // pending wakes the next sleeper at once and is handled then.
  bool took_event = false;
  if (event_owed_) {  // no arm() since the last wakeup: read it now
    event_owed_ = false;
    took_event = take_cq_event_locked();
  }
  // New completions while the CQ was armed: the notification has fired
  // (every completion after ibv_req_notify_cq does; the caller polled after
  // arming, so these came after it). Its event is read before the next
  // sleep, not here on the way to the caller's reply, and meanwhile it
  // keeps wait_fd readable for any other sleeper. Only when at most one
  // thread is armed: with several, reading it at once and passing the
  // wakeup on (the caller kicks the others) beats having each of them wake
  // on it and look. Should the guess be wrong (say, another thread polled
  // them), the cost is one wasted read in arm() or one extra wakeup, as
  // with a stale event.
  const int found = poll_cq_locked();
  if (!took_event && found > 0 && cq_armed_ && armed_ <= 1) {
    cq_armed_ = false;
    event_owed_ = true;
    return false;
  }
  if (!took_event) took_event = take_cq_event_locked();
  bool took_other = false;
  if (!took_event) {
    took_other = drain_cm_events_locked();
    took_other |= look_at_tcp_locked(true);
  }
  poll_cq_locked();
  // No CQ notification is requested here for the other sleepers: the
  // caller's kick brings them back through arm(), which requests it before
  // they sleep again (a CQ armed for nobody turns the next completion into
  // a stale event and a wasted wakeup).
  return took_event || took_other;
}

// The kernel TCP connection: nothing is sent on it after the switch, so
// readable means EOF (the peer's end is gone), an error, or bytes that
// reached it behind librsock. drain: read it (after a wakeup); else only
// look (TCP_INFO), consuming nothing. No doorbell ever sits unread in the
// peer's socket here, so a reset from its kernel is meant: an abortive
// close (SO_LINGER 0), or a peer whose queue pair failed and whose bytes
// may have died with it (~VerbsChannel): a reset, never a quiet EOF.
bool VerbsChannel::look_at_tcp_locked(bool drain) {
  if (tcp_fd_ < 0) return false;
  uint32_t lost = 0;
  bool foreign = false;
  if (drain) {
    char buf[256];
    ssize_t n = real().recv(tcp_fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0)
      foreign = true;
    else if (n == 0)
      lost = kPeerClosed;
    else if (errno == ECONNRESET || errno == EPIPE)
      lost = kPeerClosed | kPeerReset;
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      lost = kTransportError | kPeerClosed;
  } else {
    CarrierInfo ci;
    if (carrier_info(tcp_fd_, &ci) != 0) return false;
    if (!ci.open) lost = ci.reset ? kPeerClosed | kPeerReset : kPeerClosed;
    // The pairing's own bytes were read before start(): any byte waiting
    // now is foreign.
    foreign = carrier_unread(tcp_fd_) > 0;
  }
  if (foreign) kernel_bytes_seen_locked();
  if (lost) {
    poll_cq_locked();  // the peer's last immediates precede its TCP FIN
    carrier_lost(lost);
  }
  if (lost || foreign) {
    // Level-triggered EOF (or bytes left unread) would keep wait_fd
    // readable for ever. (Which other sleepers may have slept on: the
    // caller passes it on.)
    real().epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, tcp_fd_, nullptr);
  }
  return lost || foreign;
}

// Bytes reached our TCP socket behind librsock: the connection resets here
// (ECONNRESET), the peer is told (FLAGS KERNEL_BYTES), and the reset is
// reported once in this process.
void VerbsChannel::kernel_bytes_seen_locked() {
  if (carrier_flags_.load(std::memory_order_relaxed) & kKernelBytes) return;
  if (!kernel_bytes_reported_) report_kernel_bytes("rdma", true);
  kernel_bytes_reported_ = true;
  if ((carrier_flags_.load(std::memory_order_relaxed) & kTransportError) == 0 &&
      wr_posted_ - wr_done_ + 1 <= kVerbsSendDepth) {
    flags_sent_ |= verbs_imm::kKernelBytes;
    (void)post_imm_locked(verbs_imm::kFlags, flags_sent_);
  }
  carrier_lost(kKernelBytes);
}

void VerbsChannel::probe() {
  std::lock_guard<std::mutex> lock(mu_);
  if (carrier_flags_.load(std::memory_order_relaxed) & (kPeerClosed | kTransportError)) return;
  look_at_tcp_locked(false);
}

uint64_t VerbsChannel::peer_read_total() {
  std::lock_guard<std::mutex> lock(mu_);
  return peer_consumed_;
}

}  // namespace rsock
