// Waker: the eventfd that wakes one sleeping context of this process, so
// that WakeHub (wake_hub.h) needs no descriptor per connection.
//
// A context is a thread asleep in a blocking call or in poll/select (the
// thread's own waker, kept for its later sleeps), or the threads asleep in
// epoll_wait on one set (the set's waker, registered in the set). A WakeHub
// kick writes the waker of each context joined to the connection; the
// context reads it back before its next sleep. Descriptors then follow
// threads and epoll sets, not connections.
//
// Wakers are never freed: a ticket that is never left (its thread was
// cancelled in its sleep, or a signal handler longjmp'd out of it) names a
// waker that another context may use later, which costs that context a
// spurious wakeup, never a write to a freed object or a closed number.
//
// Cost: a sleep's clear() makes a system call only when the waker was
// poked since the last one; a thread's first sleep takes a waker from the
// pool (a mutex, and an eventfd the first time). Thread-safety: poke() from
// any thread; clear() and the fd's lifetime belong to the owning context.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace rsock {

class Waker {
 public:
  // The eventfd, or -1 when none could be made (out of fds): the context
  // then sleeps blind (WakeHub::kBlindSliceNs).
  int fd() const { return fd_.load(std::memory_order_acquire); }
  // Makes the eventfd if there is none; whether there is one now.
  bool open_fd();

  // Makes the fd readable. counted: a WakeHub kick, which pokes() counts
  // (an epoll set tells them from its own wakeups for epoll_ctl, kick_set).
  void poke(bool counted = true);
  // Makes the fd unreadable again, if a poke of this process made it
  // readable (no system call otherwise).
  void clear();
  // Reads the fd whatever the pokes said: an epoll set's waker, which a
  // fork's other process may poke too (level-triggered, it would report
  // that poke until read).
  void drain();
  // Counted pokes so far.
  uint64_t pokes() const { return pokes_.load(std::memory_order_acquire); }

 private:
  friend struct WakerPool;
  friend class SleepWaker;
  friend Waker* take_set_waker();
  friend void wakers_after_fork_child();
  std::atomic<int> fd_{-1};
  // Raised after a poke's write: clear() reads only when it is set. A write
  // whose flag is not raised yet leaves the fd readable for one sleep (a
  // spurious wakeup, then cleared), never for good.
  std::atomic<bool> poked_{false};
  std::atomic<uint64_t> pokes_{0};
  // The pool's bookkeeping (waker.cpp), under its mutex.
  enum class Use : uint8_t { kFree, kThread, kSet } use_ = Use::kFree;
  unsigned long owner_ = 0;  // kThread: the pthread_t that took it
  Waker* next_free_ = nullptr;
};

// The waker of one sleep of the calling thread, cleared, from construction
// to destruction: the thread's own, or, when that one is in use already (a
// signal handler sleeping while the sleep it interrupted is not over), one
// lent from the pool for this sleep. get() is nullptr without an fd.
class SleepWaker {
 public:
  SleepWaker();
  ~SleepWaker();
  SleepWaker(const SleepWaker&) = delete;
  SleepWaker& operator=(const SleepWaker&) = delete;
  Waker* get() const { return w_ && w_->fd() >= 0 ? w_ : nullptr; }

 private:
  Waker* w_ = nullptr;
  bool lent_ = false;
};

// An epoll set's waker, from the pool; given back when the set goes. Its
// fd stays open for the next taker: a wait still asleep on the set when it
// went may still be joined to hubs that poke it.
Waker* take_set_waker();
void give_set_waker(Waker* w);

// Every waker's fd, for close_range's list of our own descriptors.
void wakers_own_fds(std::vector<int>* out);
// In a fork's child: the wakers of the parent's other threads are free
// again and their fds closed; the forking thread's keep their numbers with
// a new eventfd each (the old ones are the parent's too: a clear here would
// eat its wakeups). Sets' wakers stay, as the sets they are registered in.
void wakers_after_fork_child();
// Wakers the pool holds (unit tests).
int wakers_made();

}  // namespace rsock
