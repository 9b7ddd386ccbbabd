// FdTable: maps a file descriptor to the librsock state attached to it (a
// listening socket that advertises itself, an accelerated connection, an
// epoll set with accelerated members). An fd with no state is plain: every
// wrapper's first step is get(fd), which for a plain fd is one relaxed load
// of zero-initialised memory. Thread-safety: get/set/clear/replace are safe
// against each other; a slot's short spin-lock orders a racing close against
// the reference taken by an I/O call, so the state outlives every call using
// it. A fork's child calls after_fork_child() first (a lock held by a thread
// of the parent at the fork would otherwise stay held there).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rsock {

// Base of all per-fd state. `refs` keeps the object alive; `fds` counts the
// table slots (dup'd fds) that point at it, so that the last close() of a
// connection, not the first, tears it down.
class FdState {
 public:
  // kPending: a nonblocking connect whose pairing runs in the background.
  // kInternal: a descriptor librsock keeps for itself (a thread's signalfd,
  // socket/interruptible.cpp), entered only so that the application's
  // close, dup2 or close_range of its number is seen; to every call of the
  // application it is a kernel fd.
  enum class Kind : uint8_t { kListener, kConnection, kEpoll, kPending, kInternal };
  explicit FdState(Kind kind) : kind_(kind) {}
  virtual ~FdState() = default;
  Kind kind() const { return kind_; }

  void ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  // Called when the last fd referring to this state is closed.
  virtual void on_last_close() {}
  // How many fds of the table refer to this state now.
  int fds() const { return fds_.load(std::memory_order_acquire); }
  // How many references it has now (a snapshot).
  int refs() const { return refs_.load(std::memory_order_acquire); }

  std::atomic<int> epoll_refs{0};  // epoll shadows with this state as a member

 private:
  friend class FdTable;
  Kind kind_;
  std::atomic<int> refs_{1};
  std::atomic<int> fds_{0};
};

// A counted reference, released on scope exit.
class FdRef {
 public:
  FdRef() = default;
  explicit FdRef(FdState* s) : s_(s) {}
  FdRef(FdRef&& o) noexcept : s_(o.s_) { o.s_ = nullptr; }
  FdRef& operator=(FdRef&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = o.s_;
      o.s_ = nullptr;
    }
    return *this;
  }
  FdRef(const FdRef&) = delete;
  FdRef& operator=(const FdRef&) = delete;
  ~FdRef() { reset(); }
  void reset() {
    if (s_) s_->unref();
    s_ = nullptr;
  }
  FdState* get() const { return s_; }
  explicit operator bool() const { return s_ != nullptr; }
  template <class T>
  T* as() const {
    return static_cast<T*>(s_);
  }

 private:
  FdState* s_ = nullptr;
};

class FdTable {
 public:
  static constexpr int kChunkBits = 10;
  static constexpr int kChunkSlots = 1 << kChunkBits;
  static constexpr int kMaxChunks = 1 << 10;  // fds up to 2^20 are tracked
  static constexpr int kMaxFd = kChunkSlots * kMaxChunks;

  // True when fd has state; no reference taken (for cheap checks).
  bool has(int fd) const;
  // Returns a reference to fd's state, or an empty FdRef.
  FdRef get(int fd) const;
  // The state fd holds now, without a reference: only for comparing with a
  // state the caller holds a reference to (equal addresses are then the
  // same live object). Never dereferenced otherwise.
  FdState* peek(int fd) const;
  // Attaches state to fd (taking one reference); replaces and returns any
  // previous state's reference (dup2 over an accelerated fd).
  bool set(int fd, FdState* state);
  // Detaches fd's state. Returns true when this was the state's last fd,
  // in which case on_last_close() has been called.
  bool clear(int fd);
  // Hands fd over from `expected` to `next` (nullptr: no state) if fd still
  // holds `expected`; returns whether it did. A hand-over is not a close:
  // expected's on_last_close() is not called.
  bool replace(int fd, FdState* expected, FdState* next);
  // replace() for each of fds (ascending) at once: every slot that holds
  // `expected` is locked before any changes hands, so that no other
  // thread sees some of them hand over and not the others (the close of
  // one that has, while another still holds `expected`, would otherwise be
  // next's last). Returns how many changed hands.
  int replace_all(const std::vector<int>& fds, FdState* expected, FdState* next);
  // Calls fn(fd, state) for every slot, with the table's bare pointer: only
  // where no other thread can close an fd or hand it over meanwhile (a
  // fork's child before it runs any), or to compare addresses.
  template <class Fn>
  void for_each(Fn fn) const;
  // Calls fn(fd, ref) for every slot that holds a state, through a
  // reference taken as get() takes it: the state outlives fn whatever other
  // threads do to the fd meanwhile (close, dup2, a pairing's hand-over).
  template <class Fn>
  void for_each_ref(Fn fn) const;
  // In a fork's child, before any other use: releases the slot locks that
  // threads of the parent held at the moment of the fork (they would spin
  // forever otherwise).
  void after_fork_child();

 private:
  using Slot = std::atomic<uintptr_t>;  // FdState* | lock bit
  Slot* slot(int fd, bool create) const;
  static uintptr_t lock_slot(Slot* s);

  mutable std::atomic<Slot*> chunks_[kMaxChunks] = {};
};

FdTable& fd_table();

// The fds that the application made with socket() as TCP sockets (AF_INET
// or AF_INET6, SOCK_STREAM, protocol 0 or IPPROTO_TCP) and has not
// connected since: connect() then knows it has a new TCP socket without
// asking the kernel (one system call less per connection). One bit per fd
// below FdTable::kMaxFd. Set only by the socket() wrapper; cleared by the
// fd's connect(), wherever its number may come to name another file or
// the socket a second number (close, close_range, dup and its kin, an
// accept() that returns the number), and for every fd at fork (the child
// shares the sockets). A number closed behind our back (a raw system
// call) keeps its bit: a connect() on whatever it names next is then
// taken for a TCP socket's, and the kernel's answer to that connect stays
// the application's. Thread-safety: atomic bits.
class FreshTcp {
 public:
  void mark(int fd);
  void clear(int fd);
  // Whether fd was marked; clears it.
  bool take(int fd);
  // Clears fds first..last (close_range).
  void clear_range(unsigned first, unsigned last);
  void clear_all();

 private:
  static constexpr int kWords = FdTable::kMaxFd / 64;
  std::atomic<uint64_t> bits_[kWords] = {};
  std::atomic<int> words_used_{0};  // words at and past this one are zero
};

FreshTcp& fresh_tcp();

template <class Fn>
void FdTable::for_each(Fn fn) const {
  for (int c = 0; c < kMaxChunks; ++c) {
    Slot* chunk = chunks_[c].load(std::memory_order_acquire);
    if (!chunk) continue;
    for (int i = 0; i < kChunkSlots; ++i) {
      uintptr_t v = chunk[i].load(std::memory_order_acquire) & ~uintptr_t{1};
      if (v) fn(c * kChunkSlots + i, reinterpret_cast<FdState*>(v));
    }
  }
}

template <class Fn>
void FdTable::for_each_ref(Fn fn) const {
  for_each([&](int fd, FdState*) {
    FdRef r = get(fd);
    if (r) fn(fd, r);
  });
}

}  // namespace rsock
