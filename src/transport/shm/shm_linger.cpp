// Closed ends that wait for their peer to read their TCP prefix (see
// shm_linger.h).
#include "transport/shm/shm_linger.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>

#include <algorithm>
#include <mutex>

#include "common/clock.h"
#include "common/quiet_thread.h"
#include "common/real.h"
#include "ring/wire.h"
#include "transport/channel.h"

namespace rsock {
namespace {

constexpr int64_t kLingerMs = 60000;    // an end lingers this long at most
constexpr int64_t kExitWaitMs = 10000;  // and holds up its process's exit (or exec) this long
constexpr int kMaxPauseMs = 64;         // between two looks

struct Entry {
  ShmLinger end;
  int64_t deadline_ms;
};

// Static storage, never freed: the thread is detached and may still run
// while the process exits.
std::mutex g_mu;
std::vector<Entry>* g_ends;  // under g_mu
bool g_running = false;      // the thread runs; under g_mu

bool done(const Entry& e, int64_t now) {
  if (e.end.peer_read->load(std::memory_order_acquire) >= e.end.sent) return true;
  if (e.end.peer_flags->load(std::memory_order_acquire) & kSendClosed) return true;
  // The peer's socket closed (its process died, say): it reads no more.
  pollfd p = {e.end.socket_fd, POLLRDHUP, 0};
  if (real().poll(&p, 1, 0) == 1) return true;
  return now >= e.deadline_ms;
}

void finish(const ShmLinger& end) {
  if (!end.owned) return;
  // Every byte still on the socket is a doorbell when we had read the
  // peer's whole prefix: drained, the close is a FIN. Otherwise it holds
  // the peer's data, unread, and the close is the reset kernel TCP sends.
  const uint64_t at = end.peer_switch_at->load(std::memory_order_acquire);
  if (at != kNotSwitched && end.read->load(std::memory_order_acquire) == at) {
    char buf[256];
    while (real().recv(end.socket_fd, buf, sizeof buf, MSG_DONTWAIT) > 0) {
    }
  }
  real().close(end.socket_fd);
  munmap(end.map, end.map_len);
}

// Ends what is done; returns whether an end still lingers. Under g_mu.
bool sweep_locked(int64_t now) {
  auto& ends = *g_ends;
  size_t kept = 0;
  for (Entry& e : ends) {
    if (done(e, now))
      finish(e.end);
    else
      ends[kept++] = e;
  }
  ends.resize(kept);
  return kept > 0;
}

void pause_ms(int ms) {
  timespec ts = {0, static_cast<long>(ms) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

void* linger_main(void*) {
  pthread_setname_np(pthread_self(), "rsock-linger");
  int pause = 1;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (!sweep_locked(monotonic_ms())) {
        g_running = false;
        return nullptr;
      }
    }
    pause_ms(pause);
    pause = std::min(pause * 2, kMaxPauseMs);
  }
}

}  // namespace

void shm_linger(const ShmLinger& end) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_ends == nullptr) g_ends = new std::vector<Entry>;  // never freed
  // A peer that never reads would otherwise make us hold a socket and a
  // mapping per closed connection for a minute each: past the cap the
  // oldest end closes now, as kernel TCP's own close would have.
  if (g_ends->size() >= kShmLingerMaxEnds) {
    finish(g_ends->front().end);
    g_ends->erase(g_ends->begin());
  }
  g_ends->push_back({end, monotonic_ms() + kLingerMs});
  if (g_running || !end.owned) return;
  g_running = spawn_quiet_thread(linger_main, nullptr) == 0;
  // Without a thread the end is looked at by the next one's, or at exit:
  // it still holds the socket, which is all the peer needs.
}

void shm_linger_settle() {
  const int64_t until = monotonic_ms() + kExitWaitMs;
  int pause = 1;
  for (;;) {
    const int64_t now = monotonic_ms();
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_ends == nullptr || !sweep_locked(now) || now >= until) return;
    }
    pause_ms(pause);
    pause = std::min(pause * 2, kMaxPauseMs);
  }
}

void shm_linger_own_fds(std::vector<int>* out) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_ends == nullptr) return;
  for (const Entry& e : *g_ends) out->push_back(e.end.socket_fd);
}

void shm_linger_fork_prepare() { g_mu.lock(); }

void shm_linger_after_fork_parent() { g_mu.unlock(); }

void shm_linger_after_fork_child() {
  // The parent's ends: its thread watches them there. Our copies of their
  // sockets and mappings go, so that the parent's close is the last one.
  if (g_ends != nullptr) {
    for (const Entry& e : *g_ends) {
      if (!e.end.owned) continue;
      real().close(e.end.socket_fd);
      munmap(e.end.map, e.end.map_len);
    }
    g_ends->clear();
  }
  g_running = false;
  g_mu.unlock();
}

}  // namespace rsock
