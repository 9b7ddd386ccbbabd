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
// channel's wait fd and its waker's fd, or on the hub's word), drain and
// kick if that consumed anything, disarm, leave. A wakeup consumed after
// the re-check is then always followed by a kick that finds the sleeper
// joined (it joined before the re-check and leaves only after its sleep),
// and the kick ends its sleep: no lost wakeup, whatever the mix of calls.
//
// How a kick reaches each kind of sleeper:
//  * poll, ppoll, select and epoll_wait sleep on their context's waker
//    (waker.h: the thread's own eventfd, or the epoll set's, which the set
//    holds level-triggered) beside the doorbells; a kick pokes the waker of
//    every joined ticket. The hub names at most kMaxWakers distinct wakers
//    at once; a sleeper beyond that gets no waker (blind, below). So the
//    hub itself holds no descriptor: they follow threads and epoll sets.
//  * blocking calls (conn_wait): the first one sleeps on the doorbell and
//    its waker like a poll sleeper (it "owns" the doorbell); the others
//    sleep on the hub's word (a futex), which kicks bump, and so does the
//    owner when it leaves, so that one of them takes its place. So only
//    one thread per connection sleeps in sleep_on_fd, whose handling of a
//    process-directed signal cannot tell which thread's handler ran; the
//    kernel ends or restarts a futex sleep itself (interruptible.h).
//    A blocking call whose direction is still on the kernel socket
//    (tcp_wait) joins as a poll sleeper does, never as the owner: it
//    watches the socket for its own direction only (a sender: POLLOUT),
//    not for the doorbell the others would then sleep through.
// A sleeper that never leaves (its thread was cancelled, or a signal
// handler longjmp'd out of its sleep) keeps its waker named: later kicks
// poke it for nothing, and it takes one of the kMaxWakers places.
//
// Cost: join, kick and leave take the mutex; a kick writes each named
// waker and wakes the word's sleepers, and only when a sleeper other than
// the caller is joined (two or more threads sleep on the connection, or a
// thread drained a doorbell while another slept). Nothing here runs on a
// path that does not sleep, except the kick of an epoll_wait that drained
// a doorbell while spinning. Thread-safety: everything is under one mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "socket/waker.h"

namespace rsock {

class WakeHub {
 public:
  // A sleeper without a waker (none could be made: out of fds; or the hub
  // names kMaxWakers already) sleeps at most this long at a time, then
  // looks again: slower, never lost.
  static constexpr int64_t kBlindSliceNs = 10 * 1000 * 1000;
  // Distinct wakers one connection's hub names at once.
  static constexpr int kMaxWakers = 8;

  // A sleeper's registration, from its join to leave().
  struct Ticket {
    enum Kind : uint8_t { kNone, kWaker, kWord };
    Kind kind = kNone;
    bool owner = false;      // a blocking call that sleeps on the doorbell
    Waker* waker = nullptr;  // kWaker: poked by kicks; nullptr: blind
    uint32_t word = 0;       // kWord: sleep while word() holds this value
    uint32_t epoch = 0;      // the hub's, at join: a ticket from before a fork is void
    uint64_t gen = 0;        // the hub's kicks, at join
  };

  WakeHub() = default;
  WakeHub(const WakeHub&) = delete;
  WakeHub& operator=(const WakeHub&) = delete;

  // A sleeper that sleeps on w (poll, ppoll, select, epoll_wait); w may be
  // nullptr (no fd): the ticket is then blind.
  Ticket join(Waker* w);
  // A blocking call (conn_wait): the doorbell's owner if it has none (a
  // ticket as join()'s, owner set), else a kWord ticket.
  Ticket join_blocking(Waker* w);
  void leave(const Ticket& t);

  // The futex kWord sleepers sleep on.
  std::atomic<uint32_t>* word() { return &word_; }

  // The caller consumed a transport wakeup (a drain or an arm said so):
  // every other joined sleeper must look again. caller_joined: the caller
  // is one of the joined sleepers (it needs no wakeup itself).
  void kick(bool caller_joined);
  // Whether a kick came after t joined (an epoll set asks it of its
  // dormant members when its waker was poked).
  bool kicked_since(const Ticket& t);

  // In a fork's child, before anything else: the parent's sleepers are not
  // here, and a lock one of them held is not either: start over.
  void after_fork_child();

  // Sleepers joined now, and distinct wakers named (unit tests).
  uint32_t sleepers();
  int wakers();

 private:
  Ticket join_waker_locked(Waker* w);

  struct Named {
    Waker* waker;
    uint32_t tickets;
  };

  std::mutex mu_;
  uint64_t gen_ = 0;    // kicks that found another sleeper
  uint32_t epoch_ = 0;  // forks this hub went through (after_fork_child)
  uint32_t sleepers_ = 0;
  uint32_t words_ = 0;  // kWord sleepers
  bool owned_ = false;  // a blocking call owns the doorbell
  Named named_[kMaxWakers];
  int nnamed_ = 0;
  std::atomic<uint32_t> word_{0};
};

}  // namespace rsock
