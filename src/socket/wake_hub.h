// WakeHub: the wakeup that reaches every thread of this process asleep on
// one connection, whichever call it sleeps in (a blocking recv or send in
// conn_wait, poll/select, epoll_wait).
//
// Why it exists: the transport's wakeups (shm: a doorbell byte on the kernel
// socket; verbs: a completion event) are consumed by whoever drains them,
// and every local sleeper of a connection watches the same ones. The kernel
// wakes all of them when a doorbell arrives, but a sleeper looks again
// before it returns, and if another thread drained the byte meanwhile (or
// drained it between this sleeper's last look at the ring and its sleep),
// it finds nothing and sleeps on, with its data in the ring. So whoever
// consumes a transport wakeup (Channel::arm and Channel::drain_wakeups say
// when they did) kicks the hub, and the kick reaches every sleeper that
// joined before it.
//
// A sleeper: join, arm the channel, re-check its condition, sleep (on the
// channel's wait fd and the ticket's fd, or on the hub's word), drain and
// kick if that consumed anything, disarm, leave. A wakeup consumed after
// the re-check is then always followed by a kick that finds the sleeper
// joined (it joined before the re-check and leaves only after its sleep),
// and the kick ends its sleep: no lost wakeup, whatever the mix of calls.
//
// How a kick reaches each kind of sleeper:
//  * level (poll, ppoll: the fd is polled level-triggered): one eventfd per
//    connection, the shared fd (made at the first sleep; a connection that
//    never sleeps has none). A kick writes it; it is read back (cleared)
//    only once every sleeper on it that joined before the last kick has
//    left. A level sleeper that joins while it is still readable would wake
//    at once and spin until then, so it gets an eventfd of its own for that
//    sleep (PrivateFd), which kicks write too;
//  * edge (epoll: the set holds the shared fd edge-triggered): every kick is
//    a new event whatever the fd's level, so they always use the shared fd
//    (they count for clearing it: epoll drops an edge whose fd is no longer
//    readable when it gets to report it);
//  * blocking calls (conn_wait): the first one sleeps on the doorbell and
//    a ticket fd like a level sleeper (it "owns" the doorbell); the others
//    sleep on the hub's word (a futex), which kicks bump, and so does the
//    owner when it leaves, so that one of them takes its place. So only
//    one thread per connection sleeps in sleep_on_fd, whose handling of a
//    process-directed signal cannot tell which thread's handler ran; the
//    kernel ends or restarts a futex sleep itself (interruptible.h).
// A sleeper that never leaves (its thread was cancelled, or a signal
// handler longjmp'd out of its sleep) keeps the shared fd readable for good:
// later level sleepers pay for an eventfd of their own, nothing worse.
//
// Cost: a lone sleeper's join, kick and leave take the mutex and make no
// system call (after the first sleep made the shared fd); the writes, the
// futex wakes and the clearing read happen only while two or more threads
// sleep on the connection. Nothing here runs on a path that does not
// sleep, except the kick of an epoll_wait that drained a doorbell while
// spinning. Thread-safety: everything is under one mutex; Tickets and
// PrivateFds belong to the sleeping call that made them.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace rsock {

class WakeHub {
 public:
  // A sleeper without any fd (no eventfd could be made: out of fds) sleeps
  // at most this long at a time, then looks again: slower, never lost.
  static constexpr int64_t kBlindSliceNs = 10 * 1000 * 1000;

  // A sleeper's registration, from its join to leave().
  struct Ticket {
    enum Kind : uint8_t { kNone, kLevel, kEdge, kPrivate, kWord };
    Kind kind = kNone;
    bool owner = false;  // a blocking call that sleeps on the doorbell
    // kLevel, kEdge, kPrivate: watch for POLLIN beside the channel's wait
    // fd (-1: blind, see kBlindSliceNs). kWord: -1.
    int fd = -1;
    uint32_t word = 0;   // kWord: sleep while word() holds this value
    uint32_t epoch = 0;  // the hub's, at join: a ticket from before a fork is void
    uint64_t gen = 0;
  };

  // An eventfd of one sleep of one call, made when a join needs it and
  // closed when the sleep is over; one serves every connection the call
  // sleeps on. Not reused across sleeps: a kick may have left it readable.
  class PrivateFd {
   public:
    PrivateFd() = default;
    ~PrivateFd();
    PrivateFd(const PrivateFd&) = delete;
    PrivateFd& operator=(const PrivateFd&) = delete;
    int get();  // makes it on first use; -1 when it cannot

   private:
    int fd_ = -1;
  };

  WakeHub() = default;
  ~WakeHub();  // closes the shared fd
  WakeHub(const WakeHub&) = delete;
  WakeHub& operator=(const WakeHub&) = delete;

  // A sleeper that polls its ticket's fd level-triggered (poll, ppoll):
  // the shared fd, or own's when the shared one is readable already.
  Ticket join(PrivateFd* own);
  // A sleeper whose epoll set holds the shared fd edge-triggered
  // (shared_fd()); the ticket's fd is that fd.
  Ticket join_edge();
  // A blocking call (conn_wait): the doorbell's owner if it has none (a
  // ticket as join()'s, owner set), else a kWord ticket.
  Ticket join_blocking(PrivateFd* own);
  void leave(const Ticket& t);

  // The futex kWord sleepers sleep on.
  std::atomic<uint32_t>* word() { return &word_; }

  // The caller consumed a transport wakeup (a drain or an arm said so):
  // every other joined sleeper must look again. caller_joined: the caller
  // is one of the joined sleepers (it needs no wakeup itself).
  void kick(bool caller_joined);

  // The shared fd, made on first use (-1 when it cannot be), and an id that
  // changes whenever the fd does (a fork's child gets a new one): an epoll
  // set registers the fd again when the id it registered is not current.
  int shared_fd(uint64_t* id);
  // The shared fd if there is one, for close_range's list of our own fds.
  int shared_fd_if_any();

  // In a fork's child, before anything else: the parent's sleepers are not
  // here, a lock one of them held is not either, and the shared fd is the
  // parent's eventfd too (a read here would clear its wakeups): start over.
  void after_fork_child();

  // Sleepers joined now (unit tests).
  uint32_t sleepers();

 private:
  Ticket join_fd_locked(PrivateFd* own);
  int ensure_fd_locked();
  void wake_words_locked();

  // Private fds of joined sleepers; more of them at once than this (more
  // concurrent sleepers on one connection, each joining while the shared fd
  // is readable) sleep blind.
  static constexpr int kMaxPrivate = 32;

  std::mutex mu_;
  int fd_ = -1;
  uint64_t fd_id_ = 0;  // of fd_; 0 = none yet
  uint64_t gen_ = 0;    // kicks that found another sleeper
  uint32_t epoch_ = 0;  // forks this hub went through (after_fork_child)
  uint32_t sleepers_ = 0;
  uint32_t level_ = 0;  // level sleepers on fd_
  uint32_t edge_ = 0;   // edge sleepers on fd_
  uint32_t words_ = 0;  // kWord sleepers
  uint32_t owed_ = 0;   // sleepers on fd_ that joined before the last kick
  bool dirty_ = false;  // fd_ written and not yet cleared
  bool owned_ = false;  // a blocking call owns the doorbell
  int private_[kMaxPrivate];
  int nprivate_ = 0;
  std::atomic<uint32_t> word_{0};
};

}  // namespace rsock
