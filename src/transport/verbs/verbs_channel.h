// Verbs transport: one RDMA RC queue pair per stream (docs/protocol.md,
// "Verbs transport"). Each side registers its receive ring once for remote
// write; the sender copies into a registered mirror of the peer's ring and
// RDMA-WRITEs the new bytes to the same offsets; the last WR of a
// publication is a WRITE_WITH_IMM whose 32-bit immediate carries the new
// head. Credits, flags and message-credit acknowledgements are immediates
// too (zero-length WRITE_WITH_IMM): there is no other control traffic.
// The protection domain, the CQ and the completion channel are the
// process's, shared with its other connections on the device
// (verbs_engine.h), and so is the event channel of the connection's
// rdma_cm id once it is up: completions and rdma_cm events reach a
// sleeper through the engine's kick of the connection's WakeHub. A
// sleeper waits on an epoll fd holding a private dup of the kernel TCP
// socket (liveness, the frames of a move) and, while a move is bounded,
// its timer.
//
// Several processes may hold the end (fork, exec); the queue pair belongs to
// the one that made it. The end's rings, its send mirror and the owner's
// positions live in memory those processes share (verbs_end.h). A process
// that uses the end without owning it takes it over (take_over): it opens
// the device itself, makes a queue pair, and moves the connection onto it
// with the other end's owner through frames on the kernel TCP socket
// (MoveFrame, src/ring/handshake.h); the previous owner fails every call
// from then on. Every read of that socket goes through one function
// (read_kernel_socket_locked): after the switch only those frames may be
// there, and any other byte reached the socket behind librsock: the
// connection is reset on both ends (kernel_bytes). docs/protocol.md
// section 7 ("Moving a connection") has the wire side, docs/design.md
// ("RDMA connections that move") the why.
// Thread-safety: as Channel; all verbs state is under one internal mutex
// (poll may be called from any thread).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ring/handshake.h"
#include "transport/channel.h"
#include "transport/handoff.h"
#include "transport/verbs/verbs_end.h"
#include "transport/verbs/verbs_engine.h"
#include "transport/verbs/verbs_rings.h"

struct rdma_cm_id;
struct rdma_event_channel;
struct ibv_mr;

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
//                  librsock), bit 8 DETACH (not sticky: this queue pair goes
//                  away, the end stays with another process of the sender's
//                  host); the other bits zero.
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
  kDetach = 1u << 8,
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
// Bound of each step of a move that waits for another process: the other
// end's first message on the new queue pair, a previous owner that is
// inside an operation, a close or exit that must deliver what a moving
// connection still holds.
inline constexpr int64_t kVerbsMoveMs = 10000;

// The exec hand-off's entry of this transport (transport/handoff.h): R, an
// end the new image holds and takes over on first use.
void verbs_exec_adopt(char** f, const std::vector<int>& fds, bool spawned, Adoption* out);

class VerbsChannel final : public Channel {
 public:
  // Phase 1 (setup, before the rdma_cm connect/accept): joins the engine of
  // `id`'s device (its device is known: route resolved or connect request
  // received), creates the QP in a PD of its own on a CQ of the engine's, the end's
  // shared memory (verbs_end.h) and registers its ring and mirror. Takes ownership of id and of
  // cm_channel (the id's own event channel). Returns nullptr with *err = negative errno on failure;
  // then the caller still owns both.
  static std::unique_ptr<VerbsChannel> create(rdma_cm_id* id, rdma_event_channel* cm_channel,
                                              size_t ring_bytes, int* err);
  // An end inherited through exec (the exec hand-off validated `end`): this
  // image does not own it; its first use takes it over. tcp_fd: the
  // connection's socket (a private dup is made). nullptr with *err.
  static std::unique_ptr<VerbsChannel> adopt(VerbsEnd end, int tcp_fd, int* err);
  ~VerbsChannel() override;
  VerbsChannel(const VerbsChannel&) = delete;
  VerbsChannel& operator=(const VerbsChannel&) = delete;

  // What the peer needs to write into our ring (connection private data).
  uint64_t rx_addr() const;
  uint32_t rx_rkey() const;
  rdma_cm_id* id() const { return id_; }
  // This process's engine on the connection's device (nullptr: none yet).
  VerbsEngine* engine() const { return engine_; }

  // Phase 2 (after ESTABLISHED): the peer's ring, and the TCP socket whose
  // private dup carries liveness (and, later, the frames of a move).
  // Returns 0 or a negative errno.
  int start(uint64_t remote_addr, uint32_t remote_rkey, int tcp_fd);

  const char* name() const override { return "rdma"; }
  size_t ring_bytes() const override { return ring_bytes_; }
  const uint8_t* rx_ring() const override { return rx_ring_; }
  int write(size_t offset, const void* src, size_t len) override;
  int publish(uint64_t head) override;
  int grant(uint64_t consumed) override;
  void signal(uint32_t flags) override;
  PeerState poll() override;
  bool arm(uint32_t want, uint64_t sleep) override;
  void disarm(uint32_t want) override;
  int wait_fd() const override { return epoll_fd_; }
  bool drain_wakeups() override;
  void set_async_kick(void (*fn)(void*), void* arg) override;
  void probe() override;
  uint64_t peer_read_total() override;
  int kernel_socket() const override { return tcp_fd_; }
  void add_holder() override;
  bool drop_holder() override;
  bool sole_holder() const override {
    return !rings_.end.hdr() || rings_.end.hdr()->holders.load(std::memory_order_acquire) == 1;
  }
  bool needs_take_over() override;
  int take_over(EndPositions* at) override;
  int enter() override;
  void leave() override;
  void note_read(uint64_t total) override;
  void after_fork_child() override;
  void at_exit() override;
  // Exec hand-off: verbs_handoff.cpp.
  void exec_prepare(ExecKind kind, bool inherited, ExecSink& sink) override;
  void exec_undo(ExecKind kind, uint32_t token) override;

  // Exec hand-off (transport/handoff.h). The region the new image
  // validates and maps; before the exec, the owner hands the end over
  // (delivers what it posted, tells the peer its queue pair goes away,
  // releases the end); should the exec fail, this image takes it over
  // again on its next use (exec_failed). undo_add_holder: a spawn that
  // was counted as a holder did not happen.
  int memfd() const { return rings_.end.memfd(); }
  // The descriptors this channel opened in this process, which a
  // close_range/closefrom of the application must leave open.
  void own_fds(std::vector<int>* out) override;
  uint64_t nonce() const;
  void prepare_exec();
  void exec_failed();
  void undo_add_holder();
  // One line of this end's state in this process (move state, queue pair,
  // positions, credits, wakeups) for a test that reports a stuck stream.
  std::string describe();

 private:
  // Where this process stands with the end (state_).
  enum State : int {
    kOwned,       // ours, on a connected queue pair
    kDetached,    // ours, but the other end's queue pair went away: wait for its taker's MOVE
    kAwaitHello,  // ours, answered a MOVE: wait for the taker's first message
    kNotMine,     // held here (fork, exec), owned by another process: the first use takes it
    kTaking,      // fenced the previous owner, sent MOVE: wait for the answer
    kLost,        // was ours; another process took it over: every call fails
    kFailed       // a move failed: the connection is reset
  };

  VerbsChannel() = default;
  int setup(size_t ring_bytes);
  int open_wait_fds();
  // All below: with mu_ held.
  int poll_cq_locked();
  void on_completion(const ibv_wc& wc);
  int repost_locked(uint32_t n);
  void flush_reposts_locked();
  void maybe_ack_locked();
  int post_imm_locked(verbs_imm::Type type, uint64_t value);
  int post_locked(void* first_wr, int count);
  int post_range_locked(uint64_t from, uint64_t to);
  int reserve_sq_locked(int count);
  bool data_window_open_locked() const;
  void carrier_lost(uint32_t flags);
  void on_cm_event_locked(rdma_cm_event_type type);
  bool drain_cm_events_locked();  // whether it took any (our own channel's)
  bool ended_locked() const;
  void kernel_bytes_seen_locked();
  void kernel_bytes_from_peer_locked();
  bool reset_for_kernel_bytes_locked();
  void stop_moving_locked();
  int alloc_pd_locked();
  // Queue pair, the engine's place, registrations and PD (or the rings
  // given back to the engine, keep_rings).
  void destroy_verbs_locked(bool keep_rings = false);
  bool rings_reusable_locked() const;
  void teardown(bool destroy_id, bool keep_rings = false);
  void forget_verbs_objects();
  void destroy_qp_locked();
  void reset_qp_counters_locked();
  bool flush_posted_locked(int64_t deadline_ms);
  int post_marker_locked();
  int64_t verdict_bound_ms_locked();
  struct Closing;
  bool linger_locked();

  // The move (docs/protocol.md section 7, "Moving a connection").
  bool owner_state() const;
  bool check_owner_locked();
  void become_lost_locked();
  void report_lost_locked();
  void detach_locked(bool bounded = true);
  void record_rx_locked();
  enum class Kernel { kNothing, kPartial, kFrame, kForeign, kBad, kEnd, kReset, kError };
  Kernel read_kernel_socket_locked(MoveFrame* frame, size_t* len);
  void consume_kernel_locked(size_t len, bool frame);
  bool service_kernel_socket_locked();  // whether it consumed or learned anything
  void unwatch_tcp_locked();
  void watch_fd_locked(int fd);
  int send_frame_locked(const MoveFrame& f);
  MoveFrame my_frame_locked(MoveType type, uint64_t nonce);
  int prepare_take_over_locked();
  int continue_take_over_locked(EndPositions* at);
  int connect_taker_locked(const MoveFrame& f, EndPositions* at);
  void handle_move_locked(const MoveFrame& f);
  void on_hello_locked();
  void check_deadline_locked();
  void arm_deadline_locked(int64_t at_ms);
  void fail_move_locked(const char* why, bool tell_peer);
  void send_reset_frame_locked(uint8_t flags);
  void settle_locked(std::unique_lock<std::mutex>& lock, int64_t deadline_ms, bool last_holder);
  // may_linger: a close (not an exit or exec) may leave the queue pair to
  // the engine until its verdict (linger_locked).
  void hand_over_locked(std::unique_lock<std::mutex>& lock, bool detach, bool may_linger = false);

  std::mutex mu_;
  std::atomic<int> state_{kOwned};
  // The shared memory of this end (rings_.end) and its registrations in
  // this process, in a protection domain of the connection's own: its
  // receive ring's rkey works through its own queue pair only, not for
  // another connection's peer (docs/security.md). verbs_rings.h.
  VerbsRings rings_;
  uint64_t epoch_ = 0;  // the epoch this process owns (owner states)
  rdma_event_channel* cm_channel_ = nullptr;  // until start() moves the id to the engine
  rdma_cm_id* id_ = nullptr;
  bool cm_connected_ = false;  // the queue pair is rdma_cm's, connected through id_
  ibv_context* ctx_ = nullptr;        // rdma_cm's, or the engine's (a taker)
  VerbsEngine* engine_ = nullptr;     // this process's on ctx_ (PD, CQs, completion channel)
  VerbsEngine::Member member_;        // our queue pair's place in it (joined while we have one)
  std::vector<ibv_wc> wcs_;           // poll_cq_locked's batch (kept: no allocation per poll)
  void (*kick_fn_)(void*) = nullptr;  // set_async_kick
  void* kick_arg_ = nullptr;
  uint8_t port_ = 0;
  int gid_index_ = -1;  // of our TCP address on port_ (-1: unknown, a move fails)
  uint8_t gid_[16] = {};
  uint8_t mtu_ = 0;
  ibv_qp* qp_ = nullptr;
  bool qp_from_cm_ = false;
  uint8_t* rx_ring_ = nullptr;  // the peer writes here (the end's ring, mapped here)
  uint8_t* tx_buf_ = nullptr;   // mirror of the peer's ring, source of our writes
  size_t ring_bytes_ = 0;
  uint32_t max_inline_ = 0;
  uint64_t remote_addr_ = 0;
  uint32_t remote_rkey_ = 0;
  int tcp_fd_ = -1;    // private dup of the kernel TCP socket
  int epoll_fd_ = -1;  // wait_fd(): tcp_fd_ (+ timer, + cm_channel_ if it stayed ours)
  int timer_fd_ = -1;  // wakes a sleeper at a move's deadline (only while one is set)
  bool tcp_watched_ = false;

  // Receive side: what the peer told us.
  uint64_t peer_head_ = 0;
  uint64_t peer_consumed_ = 0;
  uint32_t peer_flags_ = 0;  // kPeerFin / kPeerClosed / kPeerReset / kKernelBytes from FLAGS
  bool peer_stalled_ = false;
  uint64_t recv_done_ = 0;      // receive completions polled
  uint64_t recv_reposted_ = 0;  // their WQEs re-posted (<= recv_done_, see kRepostBatch)
  uint64_t recv_reported_ = 0;  // recv_reposted_ as of our last ACK
  std::atomic<uint64_t> rx_consumed_{0};  // what our application has read (note_read)

  // Send side.
  uint64_t posted_head_ = 0;  // bytes we have published (RDMA-written and announced,
                              // or held in the mirror while the connection moves)
  uint64_t granted_ = 0;      // consumed total of our last CREDIT
  uint32_t flags_sent_ = 0;   // sticky verbs_imm::Flag bits already sent (or to send)
  bool stall_announced_ = false;
  uint64_t msgs_sent_ = 0;   // immediates posted on this queue pair
  uint64_t peer_acked_ = 0;  // the peer's re-posted total (its last ACK)
  uint64_t wr_posted_ = 0;   // send WRs posted (wr_id = sequence number, from 1)
  uint64_t wr_done_ = 0;     // highest sequence known complete
  uint64_t last_signaled_ = 0;
  uint64_t tx_epoch_ = 0;
  bool tx_was_blocked_ = false;

  // A move in progress.
  uint64_t move_nonce_ = 0;  // our MOVE's (taker)
  uint32_t my_psn_ = 0;
  uint64_t replay_from_ = 0;     // the taker has read up to here: resend from it
  int64_t deadline_ms_ = 0;      // kAwaitHello: the taker's first message by then
  bool lost_reported_ = false;   // the one log line and count of a lost end
  bool last_close_ = false;      // drop_holder: the last holder closes (CLOSED)
  bool detach_close_ = false;    // drop_holder: the owner closes, others hold the end
  bool exited_ = false;          // at_exit ran: nothing more to deliver at teardown
  bool hello_seen_ = false;      // kAwaitHello: a message arrived on the new queue pair
  bool detach_pending_ = false;  // a DETACH arrived (handled after the CQ poll)
  int prev_owner_ = 0;           // the owner a takeover fenced (its pid)
  bool quiet_failure_ = false;   // this process could not take over; the connection is fine

  int armed_ = 0;  // sleepers (the engine's member counts them too, while joined)
  std::atomic<uint32_t> carrier_flags_{0};  // from TCP, rdma_cm or a failed completion
  bool kernel_bytes_reported_ = false;      // the one log line and count of kernel_bytes
  int64_t partial_since_ms_ = 0;            // a frame's prefix waits on the kernel socket since
};

}  // namespace rsock
