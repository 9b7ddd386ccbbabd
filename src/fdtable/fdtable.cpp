// fd -> state table (see fdtable.h).
#include "fdtable/fdtable.h"

#include <sched.h>
#include <sys/mman.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

namespace rsock {

// Constant-initialised and trivially destructible: usable before any
// constructor runs and still valid while exit handlers call our wrappers.
constinit static FdTable g_table;
FdTable& fd_table() { return g_table; }

FdTable::Slot* FdTable::slot(int fd, bool create) const {
  if (fd < 0 || fd >= kMaxFd) return nullptr;
  const int c = fd >> kChunkBits;
  Slot* chunk = chunks_[c].load(std::memory_order_acquire);
  if (!chunk) {
    if (!create) return nullptr;
    // mmap gives zeroed memory and needs no allocator (we may run inside
    // malloc-sensitive contexts such as a fork handler).
    void* p = mmap(nullptr, sizeof(Slot) * kChunkSlots, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    Slot* fresh = static_cast<Slot*>(p);
    if (!chunks_[c].compare_exchange_strong(chunk, fresh, std::memory_order_acq_rel)) {
      munmap(p, sizeof(Slot) * kChunkSlots);
    } else {
      chunk = fresh;
#if defined(__SANITIZE_ADDRESS__)
      // LeakSanitizer does not scan mmap'd memory: without this, every
      // state that only the table holds (any socket open at exit) would be
      // reported as leaked.
      __lsan_register_root_region(fresh, sizeof(Slot) * kChunkSlots);
#endif
    }
  }
  return &chunk[fd & (kChunkSlots - 1)];
}

// The slot lock is bit 0 of the slot itself. Memory orders: taking it is an
// acquire CAS and every release of it is a release store of the slot's new
// value, so whatever a holder did (a ref(), the construction of a state it
// publishes) happens before the next holder looks: ThreadSanitizer sees the
// lock as this acquire/release pair on one atomic and needs no annotation.
// The relaxed peeks outside the lock (has(), the empty-slot and "not the
// expected state" shortcuts) only compare the value, never dereference it.
uintptr_t FdTable::lock_slot(Slot* s) {
  for (;;) {
    uintptr_t v = s->load(std::memory_order_relaxed) & ~uintptr_t{1};
    if (s->compare_exchange_weak(v, v | 1, std::memory_order_acquire)) return v;
    sched_yield();
  }
}

void FdTable::after_fork_child() {
  // Only the forking thread exists in the child; a thread that held a slot
  // lock at the moment of the fork is not there to release it. A holder
  // changes the slot's value only in the store that unlocks it, so a stale
  // lock bit sits on the value from before that holder's operation: the
  // child sees the slot as if the operation never happened (a reference it
  // had taken is, at worst, never released).
  for (int c = 0; c < kMaxChunks; ++c) {
    Slot* chunk = chunks_[c].load(std::memory_order_acquire);
    if (!chunk) continue;
    for (int i = 0; i < kChunkSlots; ++i)
      chunk[i].fetch_and(~uintptr_t{1}, std::memory_order_relaxed);
  }
}

// Acquire, not relaxed: a slot found empty must order the caller after
// whatever its last writer did first (a pairing thread that hands an fd
// back to the kernel calls epoll_ctl on it before it empties the slot; a
// close() that finds the slot empty closes the number at once).
bool FdTable::has(int fd) const {
  Slot* s = slot(fd, false);
  return s && s->load(std::memory_order_acquire) != 0;
}

FdRef FdTable::get(int fd) const {
  Slot* s = slot(fd, false);
  if (!s || s->load(std::memory_order_acquire) == 0) return FdRef();
  uintptr_t v = lock_slot(s);
  FdState* st = reinterpret_cast<FdState*>(v);
  if (st) st->ref();
  s->store(v, std::memory_order_release);
  return FdRef(st);
}

FdState* FdTable::peek(int fd) const {
  Slot* s = slot(fd, false);
  return s ? reinterpret_cast<FdState*>(s->load(std::memory_order_acquire) & ~uintptr_t{1})
           : nullptr;
}

bool FdTable::set(int fd, FdState* state) {
  Slot* s = slot(fd, true);
  if (!s) return false;
  state->ref();
  state->fds_.fetch_add(1, std::memory_order_relaxed);
  uintptr_t old = lock_slot(s);
  s->store(reinterpret_cast<uintptr_t>(state), std::memory_order_release);
  if (old) {
    FdState* prev = reinterpret_cast<FdState*>(old);
    if (prev->fds_.fetch_sub(1, std::memory_order_acq_rel) == 1) prev->on_last_close();
    prev->unref();
  }
  return true;
}

bool FdTable::clear(int fd) {
  Slot* s = slot(fd, false);
  if (!s || s->load(std::memory_order_relaxed) == 0) return false;
  uintptr_t v = lock_slot(s);
  s->store(0, std::memory_order_release);
  if (!v) return false;
  FdState* st = reinterpret_cast<FdState*>(v);
  bool last = st->fds_.fetch_sub(1, std::memory_order_acq_rel) == 1;
  if (last) st->on_last_close();
  st->unref();
  return last;
}

bool FdTable::replace(int fd, FdState* expected, FdState* next) {
  Slot* s = slot(fd, false);
  // The lock bit aside: a slot another thread holds for a moment (a get)
  // still holds `expected`, and must change hands.
  if (!s ||
      (s->load(std::memory_order_relaxed) & ~uintptr_t{1}) != reinterpret_cast<uintptr_t>(expected))
    return false;
  uintptr_t v = lock_slot(s);
  if (v != reinterpret_cast<uintptr_t>(expected)) {
    s->store(v, std::memory_order_release);
    return false;
  }
  if (next) {
    next->ref();
    next->fds_.fetch_add(1, std::memory_order_relaxed);
  }
  s->store(reinterpret_cast<uintptr_t>(next), std::memory_order_release);
  expected->fds_.fetch_sub(1, std::memory_order_acq_rel);
  expected->unref();
  return true;
}

int FdTable::replace_all(const std::vector<int>& fds, FdState* expected, FdState* next) {
  // Slots are locked in ascending order, and no other holder of a slot lock
  // takes a second one: no deadlock.
  const auto want = reinterpret_cast<uintptr_t>(expected);
  std::vector<Slot*> held;
  held.reserve(fds.size());
  for (int fd : fds) {
    Slot* s = slot(fd, false);
    if (!s || (s->load(std::memory_order_relaxed) & ~uintptr_t{1}) != want) continue;
    const uintptr_t v = lock_slot(s);
    if (v != want) {
      s->store(v, std::memory_order_release);
      continue;
    }
    held.push_back(s);
  }
  const int n = static_cast<int>(held.size());
  if (n == 0) return 0;
  if (next) {
    for (int i = 0; i < n; ++i) next->ref();
    next->fds_.fetch_add(n, std::memory_order_relaxed);
  }
  for (Slot* s : held) s->store(reinterpret_cast<uintptr_t>(next), std::memory_order_release);
  expected->fds_.fetch_sub(n, std::memory_order_acq_rel);
  for (int i = 0; i < n; ++i) expected->unref();
  return n;
}

// ---- fresh TCP sockets ------------------------------------------------------

constinit static FreshTcp g_fresh;
FreshTcp& fresh_tcp() { return g_fresh; }

void FreshTcp::mark(int fd) {
  if (fd < 0 || fd >= FdTable::kMaxFd) return;
  const int w = fd / 64;
  bits_[w].fetch_or(uint64_t{1} << (fd % 64), std::memory_order_relaxed);
  int used = words_used_.load(std::memory_order_relaxed);
  while (used <= w && !words_used_.compare_exchange_weak(used, w + 1, std::memory_order_relaxed)) {
  }
}

void FreshTcp::clear(int fd) {
  if (fd < 0 || fd >= FdTable::kMaxFd) return;
  const uint64_t bit = uint64_t{1} << (fd % 64);
  std::atomic<uint64_t>& word = bits_[fd / 64];
  if (word.load(std::memory_order_relaxed) & bit) word.fetch_and(~bit, std::memory_order_relaxed);
}

bool FreshTcp::take(int fd) {
  if (fd < 0 || fd >= FdTable::kMaxFd) return false;
  const uint64_t bit = uint64_t{1} << (fd % 64);
  std::atomic<uint64_t>& word = bits_[fd / 64];
  return (word.load(std::memory_order_relaxed) & bit) &&
         (word.fetch_and(~bit, std::memory_order_relaxed) & bit);
}

void FreshTcp::clear_range(unsigned first, unsigned last) {
  const unsigned end = static_cast<unsigned>(words_used_.load(std::memory_order_relaxed)) * 64;
  if (last >= end) last = end - 1;  // end > 0 whenever a bit is set
  for (unsigned fd = first; end > 0 && fd <= last; ++fd) clear(static_cast<int>(fd));
}

void FreshTcp::clear_all() {
  const int used = words_used_.load(std::memory_order_relaxed);
  for (int w = 0; w < used; ++w) bits_[w].store(0, std::memory_order_relaxed);
}

}  // namespace rsock
