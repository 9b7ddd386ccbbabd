// Background pairing of nonblocking connects (see pending.h).
#include "socket/pending.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <new>
#include <vector>

#include "common/log.h"
#include "common/own_fd.h"
#include "common/real.h"
#include "config/config.h"
#include "lifecycle/runtime.h"
#include "progress/readiness.h"
#include "socket/socket.h"
#include "transport/pairing.h"
#include "transport/setup.h"

namespace rsock {
namespace {

// Pairings in flight (queued or running), for fork, and the pool of worker
// threads that run them. A worker that finished a pairing waits up to
// kIdleMs for the next one before it exits, so that a burst of connections
// does not pay a thread creation per pairing. The workers are detached, so
// one may still use the condition variables while the process exits and
// runs the static destructors: they are built in static storage on first
// use and never destroyed. (std::mutex is constant-initialised and
// trivially destructible: nothing to fear at exit.)
struct Work;
std::mutex g_flight_mu;
int g_in_flight = 0;           // under g_flight_mu
int g_idle = 0;                // workers waiting for a job; under g_flight_mu
std::vector<Work*>* g_queue;   // jobs no worker has taken yet; under g_flight_mu
constexpr int kIdleMs = 2000;  // how long an idle worker stays
constexpr int kMaxIdle = 4;    // idle workers kept at most

std::condition_variable& flight_cv() {
  alignas(std::condition_variable) static unsigned char storage[sizeof(std::condition_variable)];
  static auto* cv = new (storage) std::condition_variable;
  return *cv;
}

std::condition_variable& work_cv() {
  alignas(std::condition_variable) static unsigned char storage[sizeof(std::condition_variable)];
  static auto* cv = new (storage) std::condition_variable;
  return *cv;
}

struct Work {
  PendingState* pending;  // one reference, released at the end
  PairJob job;
  const Config* cfg;
  int sock;  // a private dup of the application's socket
};

std::atomic<int> g_handovers{0};  // hand_over calls between resolve and the epoll conversion

// Publishes the outcome (c: one reference, taken over; nullptr: plain TCP),
// converts the epoll members, then hands every fd over.
void hand_over(Work& w, ConnectionState* c) {
  PendingState* p = w.pending;
  g_handovers.fetch_add(1, std::memory_order_seq_cst);
  p->resolve(c);
  epoll_pending_resolved(p->fd(), p, c);
  g_handovers.fetch_sub(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  std::vector<int> fds;
  fd_table().for_each([&](int fd, FdState* s) {
    if (s == p) fds.push_back(fd);
  });
  for (int fd : fds) fd_table().replace(fd, p, c);
  if (c) {
    // Options the application set while we paired (F_SETFL, SO_RCVTIMEO).
    connection_options_from(w.sock, c);
    c->unref();  // the PendingState and the fds hold it
  }
}

// Sends nothing, keeps nothing: a pairing finished for an fd the
// application has closed. The peer sees the channel close.
void discard(std::unique_ptr<Channel> ch) {
  if (!ch) return;
  Stream s(std::move(ch));
  s.close();
}

// accept(): the rest of the server side's pairing, then the same hand-over.
void run_server(Work& w) {
  PendingState* p = w.pending;
  Pairing& pairing = *w.job.pairing;
  pairing.rebind(w.sock);  // the application may close its fd meanwhile
  Fallback why = Fallback::kPairFailed;
  std::unique_ptr<Channel> ch;
  if (!p->cancelled()) {
    pairing.run(INT64_MAX);
    ch = ListenSetup::result(pairing, w.sock, w.job.path, &why);
  }
  w.job.pairing.reset();
  const bool counted = !p->cancelled();
  ConnectionState* c = nullptr;
  if (ch && counted)
    c = new_connection(w.sock, std::move(ch), w.job.path);
  else
    discard(std::move(ch));
  // Counted before the hand-over: from then on the application may finish
  // with the connection and exit, writing its stats, before this thread
  // runs again.
  if (counted) record_server_outcome(p->fd(), c != nullptr, w.job.path, why);
  hand_over(w, c);
  p->finish();
}

// connect(): the TCP handshake, the client side's pairing, the hand-over.
void run_client(Work& w) {
  PendingState* p = w.pending;
  PairJob& job = w.job;
  const sockaddr* addr = reinterpret_cast<const sockaddr*>(&job.addr);
  // The TCP handshake first, bounded like the pairing.
  pollfd pf = {w.sock, POLLOUT, 0};
  int pr;
  do {
    pr = real().poll(&pf, 1, static_cast<int>(w.cfg->connect_timeout_ms));
  } while (pr < 0 && errno == EINTR);
  const bool tcp_up = pr == 1 && pf.revents == POLLOUT;

  std::unique_ptr<Channel> ch;
  Fallback why = Fallback::kPairFailed;
  bool counted = true;  // stats: this stream counts as a connection
  if (!tcp_up) {
    job.client.reset();
    // Still connecting: the stream stays on TCP. Failed: the application
    // reads the error from SO_ERROR, and there is no connection to count.
    if (pr == 0)
      why = Fallback::kPairTimeout;
    else
      counted = false;
  } else if (p->cancelled()) {
    job.client.reset();
    counted = false;
  } else {
    std::unique_ptr<Pairing> pairing = job.client->pairing(w.sock, *w.cfg);
    pairing->run(INT64_MAX);
    ch = pairing->take_channel();
    why = pairing->why();
  }

  ConnectionState* c = nullptr;
  if (ch && !p->cancelled()) {
    c = new_connection(w.sock, std::move(ch), job.path);
  } else if (ch) {
    discard(std::move(ch));
    counted = false;
  }
  // Before the hand-over, as in run_server.
  if (counted) record_client_outcome(p->fd(), addr, c != nullptr, job.path, why);
  hand_over(w, c);
  p->finish();
}

void run_job(Work* w) {
  if (w->job.server)
    run_server(*w);
  else
    run_client(*w);
  real().close(w->sock);
  w->pending->unref();
  delete w;
}

// Takes the next queued job, waiting up to kIdleMs for one (unless kMaxIdle
// workers wait already). nullptr: the worker exits. Under lock.
Work* next_job(std::unique_lock<std::mutex>& lock) {
  if (g_queue->empty() && g_idle < kMaxIdle) {
    ++g_idle;
    work_cv().wait_for(lock, std::chrono::milliseconds(kIdleMs), [] { return !g_queue->empty(); });
    --g_idle;
  }
  if (g_queue->empty()) return nullptr;
  Work* w = g_queue->back();
  g_queue->pop_back();
  return w;
}

void* worker_main(void* arg) {
  // Named here, not by the creator: the thread is detached and may be gone
  // (its descriptor freed with its stack) by the time pthread_create()
  // returns, and naming it through that pthread_t crashed the program.
  pthread_setname_np(pthread_self(), "rsock-pair");
  auto* w = static_cast<Work*>(arg);
  std::unique_lock<std::mutex> lock(g_flight_mu);
  while (w != nullptr) {
    lock.unlock();
    run_job(w);
    lock.lock();
    --g_in_flight;
    flight_cv().notify_all();
    w = next_job(lock);
  }
  return nullptr;
}

}  // namespace

PendingState::PendingState(int fd, int event_fd)
    : FdState(Kind::kPending), fd_(fd), event_fd_(event_fd) {}

PendingState::~PendingState() {
  if (outcome_) outcome_->unref();
  real().close(event_fd_);
}

void PendingState::on_last_close() {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_ = true;
}

bool PendingState::cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

FdRef PendingState::outcome() {
  std::lock_guard<std::mutex> lock(mu_);
  if (outcome_) outcome_->ref();
  return FdRef(outcome_);
}

int PendingState::wait(OnSignal on_signal, FdRef* out) {
  // The eventfd turns readable at finish() and stays so (nobody reads it).
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) break;
    }
    // -ERESTART: the call starts over, which here means waiting on.
    if (sleep_on_fd(event_fd_, -1, on_signal) == -EINTR) return -EINTR;
  }
  *out = outcome();
  return 0;
}

void PendingState::resolve(FdState* outcome) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (outcome) outcome->ref();
    outcome_ = outcome;
  }
  resolved_.store(true, std::memory_order_seq_cst);
}

void PendingState::finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  uint64_t one = 1;
  (void)!real().write(event_fd_, &one, sizeof one);
}

int pending_start(PairJob& job, const Config& cfg) {
  const int fd = job.fd;
  int efd = lift_fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (efd < 0) return -errno;
  int sock = dup_high(fd);
  if (sock < 0) {
    int err = errno;
    real().close(efd);
    return -err;
  }
  auto* p = new PendingState(fd, efd);
  auto* w = new Work{p, std::move(job), &cfg, sock};
  p->ref();  // the worker's
  fd_table().set(fd, p);
  {
    // An idle worker takes it.
    std::lock_guard<std::mutex> lock(g_flight_mu);
    if (g_queue == nullptr) g_queue = new std::vector<Work*>;  // never freed, as the cvs
    if (g_idle > static_cast<int>(g_queue->size())) {
      g_queue->push_back(w);
      ++g_in_flight;
      work_cv().notify_one();
      p->unref();  // the table's reference remains
      return 0;
    }
  }

  // A new worker. It takes no signal of the application's, and needs no
  // joining.
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  {
    std::lock_guard<std::mutex> lock(g_flight_mu);
    ++g_in_flight;
  }
  pthread_t t;
  int rc = pthread_create(&t, &attr, worker_main, w);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  pthread_attr_destroy(&attr);
  if (rc == 0) {
    p->unref();  // the table's reference remains
    return 0;
  }
  {
    std::lock_guard<std::mutex> lock(g_flight_mu);
    --g_in_flight;
  }
  fd_table().replace(fd, p, nullptr);
  p->unref();  // the worker's
  p->unref();  // ours
  real().close(sock);
  job = std::move(w->job);  // back to the caller, untouched
  delete w;
  LOG_WARN("connect fd %d: no pairing thread (%s); pairing in connect()", fd, strerror(rc));
  return -rc;
}

bool pending_handover_in_flight() { return g_handovers.load(std::memory_order_seq_cst) != 0; }

FdRef pending_settle(int fd, FdRef r) {
  if (!r || r.get()->kind() != FdState::Kind::kPending) return r;
  auto* p = r.as<PendingState>();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!p->resolved()) return r;
  FdRef out = p->outcome();
  fd_table().replace(fd, p, out.get());
  return out;
}

namespace {

// Waits (bounded) until no pairing is in flight; lock holds g_flight_mu.
void wait_in_flight(std::unique_lock<std::mutex>& lock) {
  const Runtime* rt = runtime();
  if (!rt) return;
  // The TCP handshake is bounded by the timeout, a pairing by a few
  // timeouts plus twice kPeerDecisionMs and a few seconds (past its
  // deadline it waits for a peer that may be committing: docs/protocol.md
  // section 7, commit points); only a broken peer or an impostor makes it
  // take that long.
  const auto bound =
      std::chrono::milliseconds(4 * rt->config.connect_timeout_ms + 2 * kPeerDecisionMs + 10000);
  if (!flight_cv().wait_for(lock, bound, [] { return g_in_flight == 0; }))
    LOG_WARN("fork: %d pairing(s) still in flight; the child sees them as plain TCP", g_in_flight);
}

}  // namespace

void pending_before_fork() {
  std::unique_lock<std::mutex> lock(g_flight_mu);
  wait_in_flight(lock);
}

// For a fork, g_flight_mu stays held from the wait until the fork is done,
// in both processes: no pairing can start between the wait and the fork
// (another thread's connect()), and the child's copy of the mutex is never
// one that a thread which does not exist there had locked (it would stay
// locked, and the child's next nonblocking connect would hang).
void pending_fork_prepare() {
  std::unique_lock<std::mutex> lock(g_flight_mu);
  wait_in_flight(lock);
  lock.release();  // unlocked by pending_after_fork_parent / _child
}

void pending_after_fork_parent() { g_flight_mu.unlock(); }

void pending_after_fork_child() {
  // No worker exists in the child: what was in flight stays plain TCP here.
  // (The queue is empty: the fork waited for every job to finish.)
  // The condition variables are made anew: the parent's waiters (idle
  // workers) do not exist here, and must not take a notification.
  g_in_flight = 0;
  g_idle = 0;
  new (&flight_cv()) std::condition_variable;
  new (&work_cv()) std::condition_variable;
  g_flight_mu.unlock();
  std::vector<std::pair<int, FdState*>> stuck;
  fd_table().for_each([&](int fd, FdState* s) {
    if (s->kind() == FdState::Kind::kPending && !static_cast<PendingState*>(s)->resolved())
      stuck.emplace_back(fd, s);
  });
  for (auto& [fd, s] : stuck) {
    auto* p = static_cast<PendingState*>(s);
    p->resolve(nullptr);
    fd_table().replace(fd, p, nullptr);
  }
}

}  // namespace rsock
