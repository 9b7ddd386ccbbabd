// The wakers of sleeping contexts and their pool (see waker.h).
#include "socket/waker.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <mutex>
#include <new>

#include "common/own_fd.h"
#include "common/real.h"

namespace rsock {

bool Waker::open_fd() {
  if (fd() >= 0) return true;
  const int fd = lift_fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (fd < 0) return false;
  poked_.store(false, std::memory_order_relaxed);
  fd_.store(fd, std::memory_order_release);
  return true;
}

void Waker::poke(bool counted) {
  const int fd = this->fd();
  if (fd < 0) return;
  if (counted) pokes_.fetch_add(1, std::memory_order_acq_rel);
  // Fails only when the count would overflow (it is then readable anyway).
  const uint64_t one = 1;
  (void)!real().write(fd, &one, sizeof one);
  poked_.store(true, std::memory_order_release);
}

void Waker::clear() {
  if (!poked_.exchange(false, std::memory_order_acq_rel)) return;
  uint64_t v;
  (void)!real().read(fd(), &v, sizeof v);
}

void Waker::drain() {
  poked_.store(false, std::memory_order_release);
  uint64_t v;
  (void)!real().read(fd(), &v, sizeof v);
}

// Every waker ever made (never freed, see waker.h) and the free ones. Built
// in static storage on first use and never destroyed: threads may sleep
// while the process exits and runs the static destructors.
struct WakerPool {
  std::mutex mu;
  std::vector<Waker*> all;
  Waker* free_list = nullptr;
  pthread_key_t key;  // a thread's own waker, given back when it exits

  static WakerPool& get() {
    alignas(WakerPool) static unsigned char storage[sizeof(WakerPool)];
    static WakerPool* pool = [] {
      auto* p = new (storage) WakerPool;
      pthread_key_create(&p->key, [](void* w) { give_thread_waker(static_cast<Waker*>(w)); });
      return p;
    }();
    return *pool;
  }

  Waker* take(Waker::Use use) {
    std::lock_guard<std::mutex> lock(mu);
    Waker* w = free_list;
    if (w) {
      free_list = w->next_free_;
    } else {
      w = new Waker;
      all.push_back(w);
    }
    w->next_free_ = nullptr;
    w->use_ = use;
    w->owner_ = use == Waker::Use::kThread ? static_cast<unsigned long>(pthread_self()) : 0;
    return w;
  }

  void give(Waker* w) {
    std::lock_guard<std::mutex> lock(mu);
    give_locked(w);
  }

  void give_locked(Waker* w) {
    w->use_ = Waker::Use::kFree;
    w->owner_ = 0;
    w->next_free_ = free_list;
    free_list = w;
  }

  static void give_thread_waker(Waker* w);
};

namespace {

thread_local Waker* t_waker = nullptr;  // this thread's own
thread_local bool t_busy = false;       // a sleep of this thread uses it now

}  // namespace

void WakerPool::give_thread_waker(Waker* w) {
  if (!w) return;
  if (t_waker == w) t_waker = nullptr;
  get().give(w);
}

SleepWaker::SleepWaker() {
  WakerPool& pool = WakerPool::get();
  if (!t_busy) {
    if (!t_waker) {
      t_waker = pool.take(Waker::Use::kThread);
      pthread_setspecific(pool.key, t_waker);
    }
    w_ = t_waker;
    t_busy = true;
  } else {
    w_ = pool.take(Waker::Use::kThread);
    lent_ = true;
  }
  if (w_->open_fd()) w_->clear();
}

SleepWaker::~SleepWaker() {
  if (lent_)
    WakerPool::get().give(w_);
  else
    t_busy = false;
}

Waker* take_set_waker() { return WakerPool::get().take(Waker::Use::kSet); }

void give_set_waker(Waker* w) {
  if (w) WakerPool::get().give(w);
}

void wakers_own_fds(std::vector<int>* out) {
  WakerPool& pool = WakerPool::get();
  std::lock_guard<std::mutex> lock(pool.mu);
  for (Waker* w : pool.all)
    if (w->fd() >= 0) out->push_back(w->fd());
}

void wakers_after_fork_child() {
  WakerPool& pool = WakerPool::get();
  // Only the forking thread exists here: a lock another thread held is void.
  new (&pool.mu) std::mutex;
  const auto self = static_cast<unsigned long>(pthread_self());
  pool.free_list = nullptr;
  for (Waker* w : pool.all) {
    const int fd = w->fd();
    if (w->use_ == Waker::Use::kSet) continue;  // registered in its (shared) set
    if (w->use_ == Waker::Use::kThread && w->owner_ == self) {
      // Ours: the same number, a new eventfd (a sleep interrupted by the
      // handler that forked still polls that number when it returns there).
      const int nfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (fd >= 0 && nfd >= 0 && real().dup3(nfd, fd, O_CLOEXEC) == fd) {
        w->poked_.store(false, std::memory_order_relaxed);
      } else if (fd >= 0) {
        real().close(fd);
        w->fd_.store(-1, std::memory_order_relaxed);
      }
      if (nfd >= 0) real().close(nfd);
      continue;
    }
    if (fd >= 0) real().close(fd);
    w->fd_.store(-1, std::memory_order_relaxed);
    pool.give_locked(w);
  }
}

int wakers_made() {
  WakerPool& pool = WakerPool::get();
  std::lock_guard<std::mutex> lock(pool.mu);
  return static_cast<int>(pool.all.size());
}

}  // namespace rsock
