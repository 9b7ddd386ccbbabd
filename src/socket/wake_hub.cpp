// Process-local wakeups of one connection's sleepers (see wake_hub.h).
#include "socket/wake_hub.h"

#include <sys/eventfd.h>

#include <new>

#include "common/own_fd.h"
#include "common/real.h"
#include "socket/interruptible.h"

namespace rsock {
namespace {

int make_eventfd() { return lift_fd(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)); }

void poke(int fd) {
  // Fails only when the count would overflow (it is then readable anyway).
  const uint64_t one = 1;
  (void)!real().write(fd, &one, sizeof one);
}

}  // namespace

WakeHub::PrivateFd::~PrivateFd() {
  if (fd_ >= 0) real().close(fd_);
}

int WakeHub::PrivateFd::get() {
  if (fd_ < 0) fd_ = make_eventfd();
  return fd_;
}

WakeHub::~WakeHub() {
  if (fd_ >= 0) real().close(fd_);
}

int WakeHub::ensure_fd_locked() {
  if (fd_ < 0) {
    fd_ = make_eventfd();
    if (fd_ >= 0) {
      ++fd_id_;
      dirty_ = false;
    }
  }
  return fd_;
}

WakeHub::Ticket WakeHub::join_fd_locked(PrivateFd* own) {
  Ticket t;
  t.gen = gen_;
  t.epoch = epoch_;
  ++sleepers_;
  if (!dirty_ && ensure_fd_locked() >= 0) {
    t.fd = fd_;
    t.kind = Ticket::kLevel;
    ++level_;
    return t;
  }
  // The shared fd stays readable until the level sleepers owed the last
  // kick have left (or there is none): a fd of our own, which only kicks
  // write.
  t.kind = Ticket::kPrivate;
  if (nprivate_ < kMaxPrivate && own->get() >= 0) {
    t.fd = own->get();
    private_[nprivate_++] = t.fd;
  }
  return t;
}

WakeHub::Ticket WakeHub::join(PrivateFd* own) {
  std::lock_guard<std::mutex> lock(mu_);
  return join_fd_locked(own);
}

WakeHub::Ticket WakeHub::join_edge() {
  std::lock_guard<std::mutex> lock(mu_);
  Ticket t;
  t.gen = gen_;
  t.epoch = epoch_;
  t.kind = Ticket::kEdge;
  t.fd = ensure_fd_locked();
  ++sleepers_;
  ++edge_;
  return t;
}

WakeHub::Ticket WakeHub::join_blocking(PrivateFd* own) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!owned_) {
    owned_ = true;
    Ticket t = join_fd_locked(own);
    t.owner = true;
    return t;
  }
  Ticket t;
  t.gen = gen_;
  t.epoch = epoch_;
  t.kind = Ticket::kWord;
  t.word = word_.load(std::memory_order_relaxed);
  ++sleepers_;
  ++words_;
  return t;
}

void WakeHub::leave(const Ticket& t) {
  if (t.kind == Ticket::kNone) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (t.epoch != epoch_) return;  // joined in the parent (a fork from a signal handler)
  --sleepers_;
  switch (t.kind) {
    case Ticket::kLevel:
      --level_;
      if (t.gen != gen_ && owed_ > 0) --owed_;
      break;
    case Ticket::kEdge:
      --edge_;
      if (t.gen != gen_ && owed_ > 0) --owed_;
      break;
    case Ticket::kPrivate:
      for (int i = 0; i < nprivate_; ++i)
        if (private_[i] == t.fd) {
          private_[i] = private_[--nprivate_];
          break;
        }
      break;
    case Ticket::kWord:
      --words_;
      break;
    case Ticket::kNone:
      break;
  }
  // Nobody sleeps on the doorbell for the blocking calls any more: one of
  // those on the word takes over.
  if (t.owner) {
    owned_ = false;
    if (words_ > 0) wake_words_locked();
  }
  // Every sleeper on the shared fd the last kick was for has seen it.
  if (dirty_ && owed_ == 0) {
    uint64_t v;
    (void)!real().read(fd_, &v, sizeof v);
    dirty_ = false;
  }
}

void WakeHub::wake_words_locked() {
  word_.fetch_add(1, std::memory_order_relaxed);
  wake_word(&word_);
}

void WakeHub::kick(bool caller_joined) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sleepers_ <= (caller_joined ? 1u : 0u)) return;  // nobody else to wake
  ++gen_;
  // Every sleeper on the shared fd joined before this kick, so each must
  // have left before the fd may be cleared: epoll too looks at the fd's
  // level before it reports an edge.
  owed_ = level_ + edge_;
  if (fd_ >= 0 && level_ + edge_ > 0) {
    poke(fd_);
    dirty_ = true;
  }
  for (int i = 0; i < nprivate_; ++i) poke(private_[i]);
  if (words_ > 0) wake_words_locked();
}

int WakeHub::shared_fd(uint64_t* id) {
  std::lock_guard<std::mutex> lock(mu_);
  const int fd = ensure_fd_locked();
  *id = fd >= 0 ? fd_id_ : 0;
  return fd;
}

int WakeHub::shared_fd_if_any() {
  std::lock_guard<std::mutex> lock(mu_);
  return fd_;
}

void WakeHub::after_fork_child() {
  // Only the forking thread exists in the child: whatever a thread of the
  // parent was doing under the lock is void here.
  new (&mu_) std::mutex;
  if (fd_ >= 0) real().close(fd_);  // the child's copy of the parent's eventfd
  // The private fds of the parent's sleepers are left open: if the forking
  // thread forked from a signal handler that interrupted its own sleep, it
  // closes its own one when it returns there.
  fd_ = -1;
  ++epoch_;
  sleepers_ = level_ = edge_ = words_ = owed_ = 0;
  nprivate_ = 0;
  dirty_ = owned_ = false;
}

uint32_t WakeHub::sleepers() {
  std::lock_guard<std::mutex> lock(mu_);
  return sleepers_;
}

}  // namespace rsock
