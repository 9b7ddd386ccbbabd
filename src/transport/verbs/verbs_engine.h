// VerbsEngine: what the RDMA connections of one process share on one
// device context: one completion channel and the completion queues, each of
// which serves many queue pairs (docs/design.md, "One engine per device").
// A connection holds its queue pair, its protection domain (its own: an
// rkey must work for its queue pair only), its two registrations and a
// Member, not a CQ or a descriptor of its own.
//
// rdma_cm events. A connection's rdma_cm id moves onto the engine's event
// channel once the connection is up (adopt_id); the engine's thread takes
// its events (a disconnect, the device going away) and hands them to the
// member as it does completions.
// Completions. A CQ holds the completions of all its queue pairs; whoever
// polls it (a channel's poll, under the engine's lock) hands each one to
// the member its queue pair number names (its inbox) and keeps its own.
// Wakeups. A member with sleepers is armed: its CQ has a notification
// requested, and the engine's thread (one per engine, asleep in poll(2) on
// the completion channel; it never spins) takes the event, polls the CQ
// and kicks every armed member that got completions, through the kick the
// connection gave it (its WakeHub: the sleepers wake on their wakers, no
// descriptor per connection). A kick also comes from any poller that hands
// an armed member a completion. So a sleeper that armed, looked, and slept
// is woken by any completion after its look, whoever polled it.
//
// CQ size: a CQ has room for every completion its queue pairs can have
// outstanding (a queue pair that fails flushes all of its work requests),
// cqe_per_qp each; it grows (ibv_resize_cq) as queue pairs join, and a new
// CQ is made on the same completion channel when the device's limit is
// reached. CQs are kept for the engine's life, for the next queue pairs.
//
// Lifetime. Engines are made on first use and never freed (a library
// thread may use one until the process ends). In a fork's child they are
// forgotten: their objects are the parent's (after_fork_child).
// Thread-safety: everything is under the engine's mutex; a kick runs under
// it, so it must not call back into the engine or a channel.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "transport/verbs/verbs_rings.h"

namespace rsock {

class VerbsEngine {
  struct Cq;  // verbs_engine.cpp

 public:
  using KickFn = void (*)(void* arg);

  // One queue pair's place, inside its channel: the channel joins before
  // it makes the queue pair and leaves after it destroyed it.
  class Member {
   public:
    Member() = default;
    Member(const Member&) = delete;
    Member& operator=(const Member&) = delete;
    VerbsEngine* engine() const { return engine_; }
    ibv_cq* cq() const;
    // In a fork's child: the engine is the parent's; the member is not in it.
    void forget();

   private:
    friend class VerbsEngine;
    VerbsEngine* engine_ = nullptr;
    Cq* cq_ = nullptr;
    uint32_t qpn_ = 0;
    bool has_qpn_ = false;
    bool kick_due_ = false;
    int armed_ = 0;  // sleepers (arm minus disarm)
    KickFn kick_ = nullptr;
    void* kick_arg_ = nullptr;
    rdma_cm_id* id_ = nullptr;  // adopt_id
    std::vector<ibv_wc> inbox_;
    std::vector<rdma_cm_event_type> cm_inbox_;
  };

  // The engine of ctx, a device context rdma_cm opened (made on first
  // use). nullptr with *err = negative errno.
  static VerbsEngine* of_context(ibv_context* ctx, int* err);
  // For a queue pair made by hand (a taker): the engine of the device of
  // `opened`, a context the caller opened for it. If this process has one
  // for that device, `opened` is closed and that engine's context is
  // used; otherwise a new engine keeps `opened`. nullptr with *err (then
  // `opened` is closed).
  static VerbsEngine* of_opened(ibv_context* opened, int* err);

  ibv_context* context() const { return ctx_; }

  // A closed connection's queue pair that still has work requests on their
  // way (verbs_channel.cpp makes it): the engine's thread watches its
  // completions and rdma_cm events and ends it at its verdict, so that a
  // close does not wait for it (docs/design.md, "A close that lingers").
  class Linger {
   public:
    Linger() = default;
    Linger(const Linger&) = delete;
    Linger& operator=(const Linger&) = delete;
    virtual ~Linger() = default;
    // Destroys what it holds (the queue pair, its memory, the socket dup
    // last, whose FIN then follows our bytes) and itself; the engine's
    // thread calls it without the engine's lock, as the member leaves.
    virtual void finish() = 0;
    // The descriptors it holds (a closefrom leaves them; a fork's child
    // closes its copies: the FIN must not wait for the child).
    virtual void fds(std::vector<int>* out) const = 0;

    Member member;            // its place (taken over from the channel's)
    uint64_t target = 0;      // the wr_id whose completion is the verdict
    int64_t deadline_ms = 0;  // past it, finished whatever came
    bool delivered = false;   // the verdict was the target's completion
  };
  // The most queue pairs that linger at once per engine; a close beyond
  // them waits for its verdict itself.
  static constexpr int kMaxLingering = 256;

  // A place on a CQ with room for cqe_per_qp more completions; kick (may
  // be null) wakes the member's sleepers, `armed` of which sleep already.
  // 0 or a negative errno.
  int join(Member* m, int cqe_per_qp, KickFn kick, void* kick_arg, int armed);
  // The member's queue pair is qpn from now on: completions of another
  // number (an earlier queue pair's) are dropped.
  void set_qp(Member* m, uint32_t qpn);
  void set_kick(Member* m, KickFn kick, void* kick_arg);
  // The member's connection is up on `id` (rdma_cm's): its events come to
  // the engine's event channel from now on (rdma_migrate_id) and go to m.
  // 0, or a negative errno (then the id stays where it was). An engine of
  // a context opened by hand (of_opened) has no event channel: -ENOTSUP.
  int adopt_id(Member* m, rdma_cm_id* id);
  // The queue pair is gone: its completions and the id's events from now
  // on are dropped (before the id is destroyed) and its place is free.
  void leave(Member* m);
  // l's queue pair lingers: l->member takes over `from`'s place (its queue
  // pair, id and inboxes), armed, and the engine's thread finishes l at
  // its verdict. false (nothing changed): kMaxLingering linger already.
  bool linger(Linger* l, Member* from);
  // The process exits or execs: the queue pairs die with it, so wait (until
  // deadline_ms) for every lingering one's verdict.
  static void settle_lingering(int64_t deadline_ms);
  // Queue pairs that linger or are being finished.
  int lingering();
  // Appends m's completions to *out and its rdma_cm events to *cm: what
  // others handed it and what its CQ holds now (others' go to their
  // inboxes, and armed ones are kicked). Returns how many completions, or
  // -1 when the CQ cannot be polled (broken device).
  int take(Member* m, std::vector<ibv_wc>* out, std::vector<rdma_cm_event_type>* cm);
  // A sleeper of m is about to sleep: completions from now on kick m.
  void arm(Member* m);
  void disarm(Member* m);

  // Every engine's descriptors (a close_range of the application must
  // leave them open).
  static void own_fds(std::vector<int>* out);
  // In a fork's child: every engine is the parent's. Their descriptors are
  // closed here, the objects left alone; the next use makes new engines.
  static void after_fork_child();
  // Around fork(): every engine's lock is held across it.
  static void fork_prepare();
  static void after_fork_parent();

  // Registered rings (verbs_rings.h): a kept set of ring_bytes, renewed,
  // or else a new one if the process's pinned memory allows (kept ones of
  // another size are released to make room). 0, -ENOBUFS (the bound), or
  // a negative errno.
  int take_rings(size_t ring_bytes, VerbsRings* out);
  // The rings of a connection that ended, its queue pair destroyed: kept
  // for the next one if `keep` (no process holds the end any more) and
  // fewer than the limit are kept, else released. *r is empty after.
  void give_rings(VerbsRings* r, bool keep);
  // How many kept rings an engine holds at most (RSOCK_REGION_CACHE).
  static void set_kept_limit(size_t n);
  int kept_rings();
  // Releases every kept ring (their pinned memory with them).
  void release_kept_rings();

  // Completion queues and members (tests, describe()).
  int cqs();
  int members();

 private:
  VerbsEngine() = default;
  static VerbsEngine* make(ibv_context* ctx, bool own_ctx, int* err);
  static void* thread_main(void* self);
  void run();
  int grow_locked(int cqe_per_qp);
  void notify_locked(Cq* c);
  void dispatch_locked(Cq* c);
  void take_cm_events_locked();
  void end_lingering_locked(std::vector<Linger*>* over);
  void due_locked(Member* m);
  void kick_due_locked();

  std::mutex mu_;
  ibv_context* ctx_ = nullptr;
  bool own_ctx_ = false;
  ibv_comp_channel* comp_ = nullptr;
  rdma_event_channel* cm_ = nullptr;  // rdma_cm's contexts only (of_context)
  int max_cqe_ = 0;
  bool thread_started_ = false;
  bool broken_ = false;  // a CQ poll failed: every member's carrier is lost
  std::vector<Cq*> cqs_;
  std::unordered_map<uint32_t, Member*> by_qpn_;
  std::unordered_map<rdma_cm_id*, Member*> by_id_;
  std::vector<Member*> due_;  // members to kick after a dispatch
  std::vector<Linger*> lingering_;
  // Lingerers whose verdict came, which the thread is finishing outside
  // the lock (lingering() counts them: their rings and socket are not
  // given back yet).
  int finishing_ = 0;
  int wake_fd_ = -1;  // an eventfd: the thread looks again (made with the thread)
  int members_ = 0;
  // Kept rings, under their own lock (registering is slow; the thread
  // never needs it). Nests inside mu_ (own_fds, fork).
  std::mutex rings_mu_;
  std::vector<VerbsRings*> kept_;
};

}  // namespace rsock
