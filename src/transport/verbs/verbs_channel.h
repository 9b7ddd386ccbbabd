// Verbs transport: one RDMA RC queue pair per stream (docs/protocol.md,
// "Verbs transport"). Each side registers its receive ring once for remote
// write; the sender copies into a registered mirror of the peer's ring and
// RDMA-WRITEs the new bytes to the same offsets; the last WR of a
// publication is a WRITE_WITH_IMM whose 32-bit immediate carries the new
// head. Credits, flags and message-credit acknowledgements are immediates
// too (zero-length WRITE_WITH_IMM): there is no other control traffic.
// A sleeper waits on an epoll fd holding the completion channel, the
// connection's rdma_cm event channel and a private dup of the kernel TCP
// socket (liveness). Thread-safety: as Channel; all verbs state is under one
// internal mutex (poll may be called from any thread).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "transport/channel.h"

struct rdma_cm_id;
struct rdma_event_channel;
struct ibv_pd;
struct ibv_cq;
struct ibv_comp_channel;
struct ibv_mr;
struct ibv_wc;

namespace rsock {

// The 32-bit immediate of every WRITE_WITH_IMM (sent in network byte order):
//
//   bits 31..30  type
//   bits 29..0   value
//
//   type 0 DATA    value = sender's published head (bytes written into our
//                  ring, a 64-bit total) mod 2^30. The bytes of this
//                  publication are placed before the completion (RC order).
//   type 1 CREDIT  value = bytes the sender has consumed from its receive
//                  ring (a 64-bit total: our byte credits) mod 2^30.
//   type 2 FLAGS   value = bit 0 FIN, bit 1 CLOSED (sticky), bit 2 STALLED
//                  (the sender waits for byte credits: grant as soon as
//                  anything is freed), bit 3 RESET (with CLOSED: an abortive
//                  close, SO_LINGER 0), bit 4 KERNEL_BYTES (the sender reset
//                  the connection: bytes reached its TCP socket behind
//                  librsock); bits 5..29 zero.
//   type 3 ACK     value = receive WQEs the sender has re-posted in total
//                  (= our immediates it has consumed) mod 2^30: message
//                  credits.
//
// A receiver rebuilds 64-bit totals from the last known total t and a value
// v: t + ((v - t) mod 2^30). This is exact because a total never moves by
// 2^30 or more between two messages of its type: head and consumed move by
// at most a ring (<= 256 MiB = 2^28), the re-posted count by at most the
// receive queue depth. Immediates arrive in order (RC), so totals only grow.
namespace verbs_imm {
inline constexpr int kTypeShift = 30;
inline constexpr uint32_t kValueMask = (1u << kTypeShift) - 1;
enum Type : uint32_t { kData = 0, kCredit = 1, kFlags = 2, kAck = 3 };
enum Flag : uint32_t {
  kFin = 1u << 0,
  kClosed = 1u << 1,
  kStalled = 1u << 2,
  kReset = 1u << 3,
  kKernelBytes = 1u << 4,
};
inline constexpr uint32_t encode(Type t, uint64_t value) {
  return (static_cast<uint32_t>(t) << kTypeShift) | (static_cast<uint32_t>(value) & kValueMask);
}
inline constexpr Type type_of(uint32_t imm) { return static_cast<Type>(imm >> kTypeShift); }
inline constexpr uint32_t value_of(uint32_t imm) { return imm & kValueMask; }
inline constexpr uint64_t extend(uint64_t last, uint32_t value) {
  return last + ((value - static_cast<uint32_t>(last)) & kValueMask);
}
}  // namespace verbs_imm

// Queue sizes (per connection). Receives are zero-length WQEs (the data is
// RDMA-written into the ring), so a deep receive queue costs little.
inline constexpr uint32_t kVerbsRecvDepth = 256;   // R: receive WQEs posted by each side
inline constexpr uint32_t kVerbsAckEvery = 128;    // T = R/2: ACK after this many receives
inline constexpr uint32_t kVerbsCtrlReserve = 16;  // K: message credits DATA may not use
inline constexpr uint32_t kVerbsSendDepth = 4 * kVerbsRecvDepth;
inline constexpr uint32_t kVerbsSignalEvery = 32;  // selective signaling period
inline constexpr uint32_t kVerbsMaxInline = 256;   // asked for; the device may give less

class VerbsChannel final : public Channel {
 public:
  // Phase 1 (setup, before the rdma_cm connect/accept): creates the PD, CQ,
  // completion channel and QP on `id` (its device is known: route resolved
  // or connect request received) and registers the rings. Takes ownership of
  // id and of cm_channel (the id's own event channel). Returns nullptr with
  // *err = negative errno on failure; then the caller still owns both.
  static std::unique_ptr<VerbsChannel> create(rdma_cm_id* id, rdma_event_channel* cm_channel,
                                              size_t ring_bytes, int* err);
  ~VerbsChannel() override;
  VerbsChannel(const VerbsChannel&) = delete;
  VerbsChannel& operator=(const VerbsChannel&) = delete;

  // What the peer needs to write into our ring (connection private data).
  uint64_t rx_addr() const;
  uint32_t rx_rkey() const;
  rdma_cm_id* id() const { return id_; }

  // Phase 2 (after ESTABLISHED): the peer's ring, and the TCP socket whose
  // private dup carries liveness. Returns 0 or a negative errno.
  int start(uint64_t remote_addr, uint32_t remote_rkey, int tcp_fd);

  const char* name() const override { return "rdma"; }
  size_t ring_bytes() const override { return ring_bytes_; }
  const uint8_t* rx_ring() const override { return rx_ring_; }
  int write(size_t offset, const void* src, size_t len) override;
  int publish(uint64_t head) override;
  int grant(uint64_t consumed) override;
  void signal(uint32_t flags) override;
  PeerState poll() override;
  bool arm(uint32_t want) override;
  void disarm(uint32_t want) override;
  int wait_fd() const override { return epoll_fd_; }
  bool drain_wakeups() override;
  void probe() override;
  uint64_t peer_read_total() override;
  int kernel_socket() const override { return tcp_fd_; }

 private:
  VerbsChannel() = default;
  int setup(size_t ring_bytes);
  // All below: with mu_ held.
  int poll_cq_locked();
  void on_completion(const ibv_wc& wc);
  int repost_locked(uint32_t n);
  void flush_reposts_locked();
  bool take_cq_event_locked();
  void request_notify_locked();
  void maybe_ack_locked();
  int post_imm_locked(verbs_imm::Type type, uint64_t value);
  int post_locked(void* first_wr, int count);
  int reserve_sq_locked(int count);
  bool data_window_open_locked() const;
  void carrier_lost(uint32_t flags);
  bool drain_cm_events_locked();        // whether it took any
  bool look_at_tcp_locked(bool drain);  // whether wait_fd's TCP part changed
  void kernel_bytes_seen_locked();
  void teardown(bool destroy_id);

  std::mutex mu_;
  rdma_event_channel* cm_channel_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* comp_channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  bool qp_created_ = false;
  ibv_mr* rx_mr_ = nullptr;
  ibv_mr* tx_mr_ = nullptr;
  uint8_t* rx_ring_ = nullptr;  // the peer writes here
  uint8_t* tx_buf_ = nullptr;   // mirror of the peer's ring, source of our writes
  size_t ring_bytes_ = 0;
  uint32_t max_inline_ = 0;
  uint64_t remote_addr_ = 0;
  uint32_t remote_rkey_ = 0;
  int tcp_fd_ = -1;    // private dup of the kernel TCP socket
  int epoll_fd_ = -1;  // wait_fd(): completion channel + cm channel + tcp_fd_

  // Receive side: what the peer told us.
  uint64_t peer_head_ = 0;
  uint64_t peer_consumed_ = 0;
  uint32_t peer_flags_ = 0;  // kPeerFin / kPeerClosed / kPeerReset / kKernelBytes from FLAGS
  bool peer_stalled_ = false;
  uint64_t recv_done_ = 0;      // receive completions polled
  uint64_t recv_reposted_ = 0;  // their WQEs re-posted (<= recv_done_, see kRepostBatch)
  uint64_t recv_reported_ = 0;  // recv_reposted_ as of our last ACK

  // Send side.
  uint64_t posted_head_ = 0;  // bytes we have RDMA-written and announced
  uint64_t granted_ = 0;      // consumed total of our last CREDIT
  uint32_t flags_sent_ = 0;   // sticky verbs_imm::Flag bits already sent
  bool stall_announced_ = false;
  uint64_t msgs_sent_ = 0;   // immediates posted
  uint64_t peer_acked_ = 0;  // the peer's re-posted total (its last ACK)
  uint64_t wr_posted_ = 0;   // send WRs posted (wr_id = sequence number, from 1)
  uint64_t wr_done_ = 0;     // highest sequence known complete
  uint64_t last_signaled_ = 0;
  uint64_t tx_epoch_ = 0;
  bool tx_was_blocked_ = false;

  int armed_ = 0;
  uint32_t unacked_cq_events_ = 0;
  bool cq_armed_ = false;  // notification requested, its event not yet taken
  // The notification fired (a sleeper woke to new completions) but its event
  // is still unread in the completion channel: read before the next sleep.
  bool event_owed_ = false;
  std::atomic<uint32_t> carrier_flags_{0};  // from TCP, rdma_cm or a failed completion
  bool kernel_bytes_reported_ = false;  // under mu_
};

}  // namespace rsock
