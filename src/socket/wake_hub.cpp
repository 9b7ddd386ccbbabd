// Process-local wakeups of one connection's sleepers (see wake_hub.h).
#include "socket/wake_hub.h"

#include <new>

#include "socket/interruptible.h"

namespace rsock {

WakeHub::Ticket WakeHub::join_waker_locked(Waker* w) {
  Ticket t;
  t.kind = Ticket::kWaker;
  t.gen = gen_;
  t.epoch = epoch_;
  ++sleepers_;
  if (!w) return t;  // blind
  for (int i = 0; i < nnamed_; ++i)
    if (named_[i].waker == w) {
      ++named_[i].tickets;
      t.waker = w;
      return t;
    }
  if (nnamed_ < kMaxWakers) {
    named_[nnamed_++] = {w, 1};
    t.waker = w;
  }
  return t;
}

WakeHub::Ticket WakeHub::join(Waker* w) {
  std::lock_guard<std::mutex> lock(mu_);
  return join_waker_locked(w);
}

WakeHub::Ticket WakeHub::join_blocking(Waker* w) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!owned_) {
    owned_ = true;
    Ticket t = join_waker_locked(w);
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
  if (t.kind == Ticket::kWord) --words_;
  if (t.waker)
    for (int i = 0; i < nnamed_; ++i)
      if (named_[i].waker == t.waker) {
        if (--named_[i].tickets == 0) named_[i] = named_[--nnamed_];
        break;
      }
  // Nobody sleeps on the doorbell for the blocking calls any more: one of
  // those on the word takes over.
  if (t.owner) {
    owned_ = false;
    if (words_ > 0) {
      word_.fetch_add(1, std::memory_order_relaxed);
      wake_word(&word_);
    }
  }
}

void WakeHub::kick(bool caller_joined) {
  std::lock_guard<std::mutex> lock(mu_);
  if (sleepers_ <= (caller_joined ? 1u : 0u)) return;  // nobody else to wake
  ++gen_;
  for (int i = 0; i < nnamed_; ++i) named_[i].waker->poke();
  if (words_ > 0) {
    word_.fetch_add(1, std::memory_order_relaxed);
    wake_word(&word_);
  }
}

bool WakeHub::kicked_since(const Ticket& t) {
  std::lock_guard<std::mutex> lock(mu_);
  return t.epoch == epoch_ && t.gen != gen_;
}

void WakeHub::after_fork_child() {
  // Only the forking thread exists in the child: whatever a thread of the
  // parent was doing under the lock is void here.
  new (&mu_) std::mutex;
  ++epoch_;
  sleepers_ = words_ = 0;
  nnamed_ = 0;
  owned_ = false;
}

uint32_t WakeHub::sleepers() {
  std::lock_guard<std::mutex> lock(mu_);
  return sleepers_;
}

int WakeHub::wakers() {
  std::lock_guard<std::mutex> lock(mu_);
  return nnamed_;
}

}  // namespace rsock
