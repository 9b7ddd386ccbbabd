// Background pairing of nonblocking connects (see pending.h).
#include "socket/pending.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
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

#include "common/clock.h"
#include "common/log.h"
#include "common/own_fd.h"
#include "common/quiet_thread.h"
#include "common/real.h"
#include "config/config.h"
#include "lifecycle/runtime.h"
#include "progress/readiness.h"
#include "socket/socket.h"
#include "transport/pairing.h"
#include "transport/prefix/prefix_channel.h"
#include "transport/setup.h"
#include "transport/socket_number.h"

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
// A fork or exec waits for the pairings in flight: the delay of
// RSOCK_TCP_FIRST is waived meanwhile.
std::atomic<bool> g_hurry{false};
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
  PendingState* pending = nullptr;  // one reference, released at the end
  PairJob job;
  const Config* cfg = nullptr;
  int sock = -1;  // a private dup of the application's socket (a live one's: from its start)
  // Driven jobs (the driver thread, below): the client's pairing, made once
  // its TCP handshake is done, and that handshake's wait.
  std::unique_ptr<Pairing> pairing;
  bool started = false;
  bool tcp_waiting = false;
  int64_t tcp_deadline_ms = 0;
  // RSOCK_TCP_FIRST: the pairing starts no earlier (a connection that ends
  // first is never paired, and costs the driver nothing but this job).
  int64_t not_before_ms = 0;
  // Not begun, and not to begin yet.
  bool delayed(int64_t now) const { return !started && now < not_before_ms && !g_hurry.load(); }
};

std::atomic<int> g_handovers{0};  // hand_over calls between the seal and the epoll conversion
// Outcomes between their hand-over and close_if_closed, which may end one
// whose fd the application closed meanwhile (pending_finish_at_exit).
std::atomic<int> g_finishing{0};

// Hands every fd that holds p over to next (nullptr: the kernel); known:
// one of them, when p has no other (no scan of the table then). All at
// once (FdTable::replace_all): the application may close one that has
// changed hands, which must not be next's last close while another of its
// numbers still holds p.
void move_fds(PendingState* p, FdState* next, int known = -1) {
  if (known >= 0 && p->fds() == 1) {
    fd_table().replace(known, p, next);
    return;
  }
  std::vector<int> fds;
  fd_table().for_each([&](int fd, FdState* s) {
    if (s == p) fds.push_back(fd);
  });
  fd_table().replace_all(fds, p, next);
}

// Publishes the outcome (c: one reference, taken over; nullptr: plain TCP),
// converts the epoll members, then hands every fd over.
void hand_over(Work& w, ConnectionState* c) {
  PendingState* p = w.pending;
  ConnectionState* live = p->live();
  // From the seal on, a close of the fd finds c as the live connection
  // (pending_live), whose epoll members are not converted yet: the count
  // makes that close drop the fd's members whatever they hold.
  g_handovers.fetch_add(1, std::memory_order_seq_cst);
  if (c) p->lend_number(c);  // before any other thread can see c
  if (c && live) {
    // The bytes so far went on the socket: c goes on from them, and a call
    // that meets the old stream goes on with c.
    c->ref();
    live->seal_to(c);
  }
  if (live) live->published().hide();  // c is shown, or the connection is plain TCP
  epoll_pending_resolved(live ? static_cast<FdState*>(live) : p, c, [&] { p->resolve(c); });
  // A pairing that ends on plain TCP leaves the fd to the kernel. A call
  // inside the stream it used meanwhile (a thread blocked in its recv)
  // goes on there, with the socket under the application's number, which
  // the application may now close and reuse unseen: that stream takes its
  // own dup first. (Calls from now on find the outcome: the kernel. The
  // pairing's PendingState holds the stream's one other reference.)
  if (!c && live && !p->closed() && live->refs() > 1) {
    if (const int rc = live->own_prefix_socket(); rc < 0)
      LOG_WARN("fd %d: no descriptor for a call still inside its stream (%s)", p->fd(),
               strerror(-rc));
  }
  // Nor does the pairing need its dup of the socket any more: it goes
  // before the fd does (set_converted), so that a registration the
  // application makes from then on, straight in the kernel's set, goes
  // with the socket's file at the application's close, as on kernel TCP.
  // (Kept until the job's end, it kept such a registration reporting the
  // closed fd meanwhile.)
  if (!c && w.sock >= 0) {
    real().close(w.sock);
    w.sock = -1;
  }
  const uint32_t pause_us = w.cfg->test_handover_pause_us;  // tests only (Config)
  if (pause_us) usleep(pause_us);
  p->set_converted();
  g_handovers.fetch_sub(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (pause_us) usleep(pause_us);  // an fd's own call may hand them over meanwhile
  // Every fd that holds p goes on with c. None does once p's last fd was
  // closed (no fd can take p from then on): a connection that ended before
  // its pairing, the usual job of a burst, skips the scan of the table.
  if (!p->closed()) move_fds(p, c);
  // Threads asleep on the stream used meanwhile (a blocking call waiting on
  // its socket, a poll, an epoll set) look again, and go on with c: the
  // peer's wakeups now come through c's channel, which they do not watch.
  if (c && live) live->wake.kick(false);
  if (c) {
    // Options the application set while we paired (F_SETFL, SO_RCVTIMEO)
    // are the kernel socket's, where c reads them at their first use.
    c->stream().attach();  // our receive path reads the region: the peer may switch
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

// RSOCK_TCP_FIRST: the peer has shut its sending side (its FIN is in): a
// connection on its way out, not worth a pairing.
bool peer_finished(int sock) {
  pollfd p = {sock, POLLRDHUP, 0};
  return real().poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// A connection that runs on TCP until its pairing (RSOCK_TCP_FIRST) and has
// ended by the time its pairing does without a channel: the pairing was
// cut short by the connection's end (the peer's application closed its fd,
// and so dropped its side of the pairing mid-way), not by a peer that is
// slow or has no librsock. Counted as closed_before_pairing, which puts the
// peer in no negative cache. The peer's FIN may trail its side of the
// pairing by a moment (loopback delivers it from a softirq, which the
// kernel may defer), so a pairing the peer left (`why` pair_timeout: it
// left mid-way, or at its deadline) waits up to kEndGraceMs for it.
constexpr int kEndGraceMs = 20;
bool ended_while_pairing(const Work& w, Fallback why) {
  if (!w.pending->live() || w.sock < 0) return false;
  pollfd p = {w.sock, POLLRDHUP, 0};
  const int wait_ms = why == Fallback::kPairTimeout ? kEndGraceMs : 0;
  return real().poll(&p, 1, wait_ms) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// The application's close of the outcome c, which no fd holds (one that
// does, a dup the outcome was handed to, ends it at its own close).
void end_outcome(ConnectionState* c) {
  if (c->fds() == 0) c->on_last_close();
}

// A pairing that made its channel after the application closed the fd of a
// connection running on TCP meanwhile (RSOCK_TCP_FIRST): the peer has
// committed to it, and what went on the socket is counted by the stream the
// fd used. So the connection is made as for an open fd (hand_over seals that
// stream into it: the counts carry over), and then closed as the
// application's close would have closed it, which tells the peer where our
// bytes end. (Dropped instead, its bytes would be read past a count of 0,
// as bytes behind librsock: a reset.)
//
// The same for any outcome whose fd the application closed while it still
// held p: an fd may use the outcome before hand_over replaces its state
// (pending_settle), so the exchange may be over and the fd closed before
// this thread gets here. Exactly one side ends c: this one when the close
// came first, else the close (PendingState::on_last_close), decided under
// p's lock.
void close_if_closed(PendingState* p, ConnectionState* c) {
  if (p->handed_over() && c) end_outcome(c);
}

// Either side's last step: the hand-over of the outcome c (or nullptr),
// the close of one whose fd is gone, then the job's end. Counted in
// g_finishing throughout, which an exit waits for.
void conclude(Work& w, ConnectionState* c) {
  g_finishing.fetch_add(1, std::memory_order_seq_cst);
  hand_over(w, c);
  close_if_closed(w.pending, c);
  g_finishing.fetch_sub(1, std::memory_order_seq_cst);
  w.pending->finish();
}

// accept(): the server side's pairing is over (ran: it finished; else the
// application closed the fd first): the hand-over.
void server_done(Work& w, bool ran, bool ended_early = false) {
  PendingState* p = w.pending;
  Fallback why = Fallback::kPairFailed;
  std::unique_ptr<Channel> ch;
  if (ran) ch = ListenSetup::result(*w.job.pairing, w.sock, w.job.path, &why);
  w.job.pairing.reset();
  // A connection that carried its bytes on TCP and ended (the peer's FIN
  // or the fd's close) before its pairing: counted, with its reason.
  const bool early =
      p->live() && !ch && (ended_early || p->cancelled() || ended_while_pairing(w, why));
  if (early) why = Fallback::kClosedEarly;
  // Counted once, by whoever claims it first: this outcome, or a close of
  // the fd (a live one's counts it as ended before its pairing), also one
  // that comes while the connection is being made here. And before the
  // hand-over: from then on the application may finish with the connection
  // and exit, writing its stats, before this thread runs again.
  const bool claimed = (!p->cancelled() || early) && p->claim_count();
  ConnectionState* c = nullptr;
  if (ch && (!p->cancelled() || p->live()))
    c = new_connection(w.sock, std::move(ch), w.job.path, claimed, p->fd());
  else
    discard(std::move(ch));
  if (claimed) record_server_outcome(p->fd(), c != nullptr, w.job.path, why);
  conclude(w, c);
}

// accept(), on a thread of its own: the rest of the server side's pairing.
void run_server(Work& w) {
  w.job.pairing->rebind(w.sock);  // the application may close its fd meanwhile
  const bool run = !w.pending->cancelled();
  if (run) w.job.pairing->run(INT64_MAX);
  server_done(w, run);
}

// connect(): the client side's outcome (ch: the channel, or nullptr and
// why; counted: the stream counts as a connection in the stats), then the
// hand-over.
void client_done(Work& w, std::unique_ptr<Channel> ch, Fallback why, bool counted) {
  PendingState* p = w.pending;
  PairJob& job = w.job;
  const sockaddr* addr = reinterpret_cast<const sockaddr*>(&job.addr);
  const bool keep = ch && (!p->cancelled() || p->live());
  if (ch && !keep) {
    discard(std::move(ch));
    counted = false;
  }
  if (!keep && p->live() && (p->cancelled() || ended_while_pairing(w, why))) {
    // Its bytes went on TCP, and it ended before the pairing did.
    why = Fallback::kClosedEarly;
    counted = true;
  }
  // Claimed first, and before the hand-over, as in server_done.
  const bool claimed = counted && p->claim_count();
  ConnectionState* c =
      keep ? new_connection(w.sock, std::move(ch), job.path, claimed, p->fd()) : nullptr;
  if (claimed) record_client_outcome(p->fd(), addr, c != nullptr, job.path, why);
  conclude(w, c);
}

// Whether sock's TCP handshake is over (established, or the peer's FIN in
// already). POLLOUT tells it too, but not once the application has filled
// the send buffer: a connection on TCP while it pairs (RSOCK_TCP_FIRST) may
// have, before the pairing's first look, and is connected all the same.
bool tcp_connected(int sock) {
  tcp_info ti = {};
  socklen_t len = sizeof ti;
  return real().getsockopt(sock, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
         (ti.tcpi_state == TCP_ESTABLISHED || ti.tcpi_state == TCP_CLOSE_WAIT);
}

// connect(): whether the TCP handshake is over, from a poll for POLLOUT that
// returned pr with revents. false: it is not, or it failed; then the job is
// done (client_done ran).
bool tcp_handshake_done(Work& w, int pr, short revents) {
  if (pr == 1 && revents == POLLOUT && !w.pending->cancelled()) return true;
  w.job.client.reset();
  if (pr == 1 && revents == POLLOUT)
    client_done(w, nullptr, Fallback::kPairFailed, false);  // the application closed the fd
  else if (pr == 0)
    client_done(w, nullptr, Fallback::kPairTimeout, true);  // still connecting: stays on TCP
  else
    // Failed: the application reads the error from SO_ERROR, and there is
    // no connection to count.
    client_done(w, nullptr, Fallback::kPairFailed, false);
  return false;
}

// connect(), on a thread of its own: the TCP handshake, the client side's
// pairing, the hand-over.
void run_client(Work& w) {
  // The TCP handshake first, bounded like the pairing.
  pollfd pf = {w.sock, POLLOUT, 0};
  int pr;
  if (tcp_connected(w.sock)) {
    pr = 1;
    pf.revents = POLLOUT;
  } else {
    do {
      pr = real().poll(&pf, 1, static_cast<int>(w.cfg->connect_timeout_ms));
    } while (pr < 0 && errno == EINTR);
  }
  if (!tcp_handshake_done(w, pr, pf.revents)) return;
  std::unique_ptr<Pairing> pairing = w.job.client->pairing(w.sock, *w.cfg);
  pairing->run(INT64_MAX);
  client_done(w, pairing->take_channel(), pairing->why(), true);
}

void end_job(Work* w) {
  if (w->sock >= 0) real().close(w->sock);
  w->pending->unref();
  delete w;
}

void run_job(Work* w) {
  if (w->job.server)
    run_server(*w);
  else
    run_client(*w);
  end_job(w);
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

// ---- the driver: one thread for every driven pairing ----------------------
//
// A thread per pairing blocks in each handshake step; with a burst of
// connections, each pairing then costs a thread's wakeups and a share of
// the cores. Driven pairings (Pairing::driven(): shm) are advanced instead
// by one thread from one poll(): the TCP handshakes of nonblocking
// connects, then every pairing's wait_fds(), until its wake_at_ms(). It
// exits after kIdleMs without a job; the next job starts it again.
// g_driver_efd (made once per process) wakes it for a new job.
std::vector<Work*>* g_driver_queue;  // jobs it has not taken yet; under g_flight_mu
bool g_driver_running = false;       // under g_flight_mu
int g_driver_efd = -1;               // under g_flight_mu
// When the driver looks at its queue next: a job that may wait until then
// does not wake it (0: it is awake, and looks only after its next poll).
int64_t g_driver_next_ms = 0;  // under g_flight_mu

// RSOCK_TCP_FIRST: a live job ends with its fd on TCP, its pairing dropped:
// the client's reason is `why`; the server's follows from how its
// connection went (server_done).
void end_on_tcp(Work& w, Fallback why) {
  if (w.pending->closed()) {
    // The application closed the fd: the socket's file goes first (the
    // live stream's dup and ours were its last holders), so that its FIN
    // is on the peer's socket before our side of the pairing leaves: a
    // peer that finds us gone then finds the connection ended too
    // (ended_while_pairing), not a pairing that timed out.
    if (ConnectionState* live = w.pending->live()) live->retire_prefix_socket();
    if (w.sock >= 0) real().close(w.sock);
    w.sock = -1;
  }
  if (w.job.server) {
    w.job.pairing.reset();  // closes its rendezvous connection, if any
    server_done(w, false, why == Fallback::kClosedEarly);
  } else {
    w.pairing.reset();
    w.job.client.reset();
    client_done(w, nullptr, why, true);
  }
}

// RSOCK_TCP_FIRST: a job whose connection ended (the fd closed, or the
// peer's FIN) before its pairing finished is dropped, the fd left on TCP,
// which it never left: true when it was (the hand-over ran).
bool abandon(Work& w) {
  if (!w.pending->live()) return false;
  if (!w.pending->cancelled() && (w.sock < 0 || !peer_finished(w.sock))) return false;
  // A server whose offer is out: the client may have committed, and its
  // answer decides (both ends then agree).
  if (w.job.server && w.started && w.job.pairing && w.job.pairing->settle()) {
    server_done(w, true, true);
    return true;
  }
  end_on_tcp(w, Fallback::kClosedEarly);
  return true;
}

// Advances a driven job without waiting: true when it is done (the
// hand-over ran).
bool advance(Work& w, int64_t now) {
  if (w.delayed(now) && !w.pending->cancelled()) return false;
  if (w.sock < 0) {
    // A live job begins: the socket, unless the fd was closed first.
    const int sock = w.pending->take_socket();
    if (sock == -ECANCELED) return abandon(w);
    if (sock < 0) {
      LOG_WARN("fd %d: no descriptor to pair with (%s): it stays on TCP", w.pending->fd(),
               strerror(-sock));
      end_on_tcp(w, Fallback::kResources);
      return true;
    }
    w.sock = sock;
    // Shown by rsockstat from now on (new_prefix_connection).
    if (ConnectionState* live = w.pending->live())
      live->published().describe(sock, w.pending->fd(), live->path() == Path::kRdma, pub::kPairing);
  }
  if (abandon(w)) return true;
  if (w.job.server) {
    if (!w.started) {
      w.started = true;
      w.job.pairing->rebind(w.sock);  // the application may close its fd meanwhile
      if (w.pending->cancelled()) {
        server_done(w, false);
        return true;
      }
    }
    if (!w.job.pairing->step()) return false;
    server_done(w, true);
    return true;
  }
  if (!w.started) {
    w.started = true;
    w.tcp_waiting = true;
    w.tcp_deadline_ms = now + w.cfg->connect_timeout_ms;
  }
  if (w.tcp_waiting) {
    pollfd pf = {w.sock, POLLOUT, 0};
    int pr = real().poll(&pf, 1, 0);
    if (pr == 0 && tcp_connected(w.sock)) {
      pr = 1;
      pf.revents = POLLOUT;
    }
    if (pr == 0 && now < w.tcp_deadline_ms) return false;
    w.tcp_waiting = false;
    if (!tcp_handshake_done(w, pr, pf.revents)) return true;
    w.pairing = w.job.client->pairing(w.sock, *w.cfg);
  }
  if (!w.pairing->step()) return false;
  client_done(w, w.pairing->take_channel(), w.pairing->why(), true);
  return true;
}

void* driver_main(void*) {
  pthread_setname_np(pthread_self(), "rsock-pairing");  // as worker_main
  // The driver's lists live in static storage, not on its stack: a fork's
  // child has no driver thread, and what its stack held would be a leak
  // there. One driver runs at a time (g_driver_running), and a leaving one
  // touches them no more once it has cleared that flag.
  static std::vector<Work*>* jobs_p = new std::vector<Work*>;     // never freed
  static std::vector<pollfd>* pfds_p = new std::vector<pollfd>;   // never freed
  static std::vector<size_t>* first_p = new std::vector<size_t>;  // never freed
  std::vector<Work*>& jobs = *jobs_p;
  std::vector<pollfd>& pfds = *pfds_p;
  std::vector<size_t>& first = *first_p;  // jobs[i]'s entries in pfds start here
  int64_t idle_since = monotonic_ms();
  for (;;) {
    int efd;
    {
      std::lock_guard<std::mutex> lock(g_flight_mu);
      jobs.insert(jobs.end(), g_driver_queue->begin(), g_driver_queue->end());
      g_driver_queue->clear();
      g_driver_next_ms = 0;  // awake: a new job must wake the coming poll
      if (jobs.empty() && monotonic_ms() - idle_since >= kIdleMs) {
        g_driver_running = false;
        return nullptr;
      }
      efd = g_driver_efd;
    }
    int64_t now = monotonic_ms();
    // What every job waits for. A job just taken is advanced at once (its
    // first step may need no wait at all).
    pfds.assign(1, {efd, POLLIN, 0});
    first.assign(jobs.size() + 1, 0);
    int64_t wake = jobs.empty() ? idle_since + kIdleMs : INT64_MAX;
    for (size_t i = 0; i < jobs.size(); ++i) {
      first[i] = pfds.size();
      Work& w = *jobs[i];
      const bool delayed = w.delayed(now);
      // A connection on TCP meanwhile: its end (the peer's FIN) drops the
      // job. One still delayed is looked at when its time comes (or at any
      // wakeup, once its fd is closed), with no wakeup of its own.
      if (w.pending->live() && !delayed) pfds.push_back({w.sock, POLLRDHUP, 0});
      if (delayed) {
        wake = std::min(wake, w.not_before_ms);
      } else if (!w.started) {
        wake = now;
      } else if (w.tcp_waiting) {
        pfds.push_back({w.sock, POLLOUT, 0});
        wake = std::min(wake, w.tcp_deadline_ms);
      } else {
        Pairing& p = w.job.server ? *w.job.pairing : *w.pairing;
        pollfd tmp[Pairing::kMaxWaitFds];
        const int n = p.wait_fds(tmp);
        pfds.insert(pfds.end(), tmp, tmp + n);
        wake = std::min(wake, p.wake_at_ms());
      }
    }
    first[jobs.size()] = pfds.size();
    // (Every job's wake is finite: a delay's end, a deadline.)
    const int64_t left = wake <= now ? 0 : std::min<int64_t>(wake - now, INT32_MAX);
    {
      std::lock_guard<std::mutex> lock(g_flight_mu);
      g_driver_next_ms = now + left;
    }
    const int rc = real().poll(pfds.data(), pfds.size(), static_cast<int>(left));
    if (rc > 0 && pfds[0].revents) {
      uint64_t v;
      (void)!real().read(efd, &v, sizeof v);
    }
    now = monotonic_ms();
    size_t kept = 0;
    int done = 0;
    for (size_t i = 0; i < jobs.size(); ++i) {
      Work& w = *jobs[i];
      bool fired = !w.started && !w.delayed(now);
      for (size_t k = first[i]; k < first[i + 1] && !fired; ++k) fired = pfds[k].revents != 0;
      // A live job whose fd was closed (PendingState::on_last_close wakes us).
      if (!fired) fired = w.pending->live() && w.pending->cancelled();
      if (!fired && w.started) {
        Pairing* p = w.job.server ? w.job.pairing.get() : w.pairing.get();
        fired = now >= (w.tcp_waiting || !p ? w.tcp_deadline_ms : p->wake_at_ms());
      }
      if (fired && advance(w, now)) {
        end_job(&w);
        ++done;
        continue;
      }
      jobs[kept++] = &w;
    }
    jobs.resize(kept);
    if (done > 0) {
      std::lock_guard<std::mutex> lock(g_flight_mu);
      g_in_flight -= done;
      flight_cv().notify_all();
    }
    if (!jobs.empty()) idle_since = now;
  }
}

// Gives a driven job to the driver, started if it is not running. Returns
// 0 (the job is the driver's, and counted in flight) or a positive errno.
int drive(Work* w) {
  std::lock_guard<std::mutex> lock(g_flight_mu);
  if (g_driver_queue == nullptr) g_driver_queue = new std::vector<Work*>;  // never freed
  if (g_driver_efd < 0) {
    g_driver_efd = lift_fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (g_driver_efd < 0) return errno;
  }
  g_driver_queue->push_back(w);
  if (g_driver_running) {
    // A delayed job (RSOCK_TCP_FIRST) waits for the driver's next look
    // when that comes soon enough: a burst of short connections then costs
    // the driver one wakeup per delay, not one per connection.
    if (w->not_before_ms == 0 || w->not_before_ms < g_driver_next_ms) {
      const uint64_t one = 1;
      (void)!real().write(g_driver_efd, &one, sizeof one);
    }
  } else if (const int rc = spawn_quiet_thread(driver_main, nullptr); rc != 0) {
    g_driver_queue->pop_back();
    return rc;
  } else {
    g_driver_running = true;
  }
  ++g_in_flight;
  return 0;
}

}  // namespace

PendingState::PendingState(int fd, int event_fd, ConnectionState* live, uint64_t children)
    : FdState(Kind::kPending), fd_(fd), event_fd_(event_fd), live_(live), children_(children) {}

PendingState::~PendingState() {
  if (outcome_) outcome_->unref();
  if (numbered_) numbered_->unref();
  if (live_) live_->unref();
  if (event_fd_ >= 0) real().close(event_fd_);
}

void PendingState::on_last_close() {
  bool started, handed;
  FdRef outcome;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    closed_ = true;
    started = started_;
    handed = handed_;
    if (handed && outcome_) {
      outcome_->ref();
      outcome = FdRef(outcome_);
    }
  }
  // The hand-over is over, and this fd had not changed hands: the
  // application ends the outcome (close_if_closed).
  if (outcome && outcome.get()->kind() == FdState::Kind::kConnection) {
    end_outcome(outcome.as<ConnectionState>());
    return;
  }
  if (!live_) return;
  // The application's number is no longer the stream's socket.
  if (!live_->prefix_socket_owned()) live_->retire_prefix_socket();
  // The connection ran on TCP and ends before its outcome: counted now,
  // before the process may exit (and write its stats) ahead of the
  // driver.
  if (!resolved() && claim_count()) {
    stats_fallback(Fallback::kClosedEarly);
    stats_connection(Path::kTcp);
  }
  if (!started) {
    // No pairing holds the socket: it ends now, as the application's close
    // would have ended it (the live stream's dup was the last holder), and
    // the driver drops the job at its next look, without a wakeup.
    live_->retire_prefix_socket();
    return;
  }
  // Its pairing is dropped at once (the driver holds a dup of the socket,
  // whose FIN waits for it).
  std::lock_guard<std::mutex> lock(g_flight_mu);
  if (g_driver_efd >= 0) {
    const uint64_t one = 1;
    (void)!real().write(g_driver_efd, &one, sizeof one);
  }
}

bool PendingState::shut_before_pairing() {
  if (!live_) return false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (started_ || cancelled_) return false;
    cancelled_ = true;  // take_socket refuses from now on
  }
  // The driver drops the job now rather than at the end of its delay, so
  // the fd turns plain TCP and the connection is counted.
  std::lock_guard<std::mutex> lock(g_flight_mu);
  if (g_driver_efd >= 0) {
    const uint64_t one = 1;
    (void)!real().write(g_driver_efd, &one, sizeof one);
  }
  return true;
}

bool PendingState::socket_unshared() {
  if (live_ == nullptr || children_ != children_made()) return false;
  std::lock_guard<std::mutex> lock(mu_);
  return !started_ && !handed_ && !live_->prefix_socket_owned();
}

int PendingState::take_socket() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancelled_) return -ECANCELED;
  const int sock = dup_high(live_->stream().channel().kernel_socket());
  if (sock < 0) return -errno;
  started_ = true;
  return sock;
}

FdRef pending_live(FdRef r) {
  if (!r || r.get()->kind() != FdState::Kind::kPending) return r;
  ConnectionState* live = r.as<PendingState>()->live();
  if (!live) return r;
  // Sealed already (the outcome is on its way to the fd): its successor.
  if (ConnectionState* next = live->next()) live = next;
  live->ref();
  return FdRef(live);
}

bool PendingState::cancelled() {
  std::lock_guard<std::mutex> lock(mu_);
  return cancelled_;
}

bool PendingState::closed() {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

bool PendingState::handed_over() {
  std::lock_guard<std::mutex> lock(mu_);
  handed_ = true;
  return closed_;
}

void PendingState::lend_number(ConnectionState* c) {
  SocketNumber* n = c->stream().channel().socket_number();
  if (!n) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || numbered_ || fds() != 1 || fd_table().peek(fd_) != this) return;
  std::lock_guard<std::mutex> l2(n->mutex());
  if (!n->use_locked(fd_)) return;
  c->ref();
  numbered_ = c;
}

FdRef PendingState::numbered() {
  std::lock_guard<std::mutex> lock(mu_);
  if (numbered_) numbered_->ref();
  return FdRef(numbered_);
}

FdRef PendingState::outcome() {
  std::lock_guard<std::mutex> lock(mu_);
  if (outcome_) outcome_->ref();
  return FdRef(outcome_);
}

int PendingState::wait(OnSignal on_signal, FdRef* out) {
  // The eventfd turns readable at finish() and stays so (nobody reads it).
  for (;;) {
    int efd;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (done_) break;
      if (event_fd_ < 0) {
        event_fd_ = lift_fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        if (event_fd_ < 0) {
          // No eventfd: the condition variable, without a signal's end.
          cv_.wait(lock, [this] { return done_; });
          break;
        }
      }
      efd = event_fd_;
    }
    // -ERESTART: the call starts over, which here means waiting on.
    if (sleep_on_fd(efd, -1, on_signal) == -EINTR) return -EINTR;
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
  int efd;
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    efd = event_fd_;
  }
  cv_.notify_all();
  uint64_t one = 1;
  if (efd >= 0) (void)!real().write(efd, &one, sizeof one);
}

int pending_start(PairJob& job, const Config& cfg) {
  const int fd = job.fd;
  const bool driven = job.server ? job.pairing->driven() : job.client->driven();
  // RSOCK_TCP_FIRST: the fd carries its bytes on TCP until the outcome,
  // and its pairing takes the socket only when it begins (take_socket).
  ConnectionState* live = job.live && driven ? new_prefix_connection(fd, job.path) : nullptr;
  if (live && job.nonblocking) live->set_nonblocking(true);
  int efd = -1;
  int sock = -1;
  if (!live) {
    efd = lift_fd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (efd < 0) return -errno;
    sock = dup_high(fd);
    if (sock < 0) {
      int err = errno;
      real().close(efd);
      return -err;
    }
  }
  auto* p = new PendingState(fd, efd, live, job.children);
  auto* w = new Work;
  w->pending = p;
  w->job = std::move(job);
  w->cfg = &cfg;
  w->sock = sock;
  if (live) w->not_before_ms = monotonic_ms() + cfg.pair_delay_ms;
  p->ref();  // the worker's
  fd_table().set(fd, p);
  if (driven) {
    const int rc = drive(w);
    if (rc == 0) {
      p->unref();  // the table's reference remains
      return 0;
    }
    LOG_WARN("pairing thread: %s; a thread of its own for fd %d", strerror(rc), fd);
  }
  int rc = 0;
  if (w->sock < 0 && (w->sock = p->take_socket()) < 0) {
    rc = -w->sock;  // a live job on a thread of its own begins at once
  } else {
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
    {
      std::lock_guard<std::mutex> lock(g_flight_mu);
      ++g_in_flight;
    }
    rc = spawn_quiet_thread(worker_main, w);
    if (rc == 0) {
      p->unref();  // the table's reference remains
      return 0;
    }
    std::lock_guard<std::mutex> lock(g_flight_mu);
    --g_in_flight;
  }
  fd_table().replace(fd, p, nullptr);
  p->unref();  // the worker's
  p->unref();  // ours
  if (w->sock >= 0) real().close(w->sock);
  job = std::move(w->job);  // back to the caller, untouched
  delete w;
  LOG_WARN("connect fd %d: no pairing thread (%s); pairing in connect()", fd, strerror(rc));
  return -rc;
}

void pending_count_at_exit() {
  // Through a reference: the driver may end the pairing meanwhile, replace
  // the fd's state and free this one.
  fd_table().for_each_ref([](int, FdRef& r) {
    if (r.get()->kind() != FdState::Kind::kPending) return;
    auto* p = r.as<PendingState>();
    if (p->live() && !p->resolved() && p->claim_count()) {
      stats_fallback(Fallback::kClosedEarly);
      stats_connection(Path::kTcp);
    }
  });
}

void pending_own_fds(std::vector<int>* out) {
  {
    std::lock_guard<std::mutex> lock(g_flight_mu);
    if (g_driver_efd >= 0) out->push_back(g_driver_efd);
  }
  if (const int dead = prefix_dead_socket(false); dead >= 0) out->push_back(dead);
}

void pending_finish_at_exit() {
  // Bounded: the hand-over takes no lock an exiting thread could hold, but
  // its thread may be slow to run (a loaded machine).
  for (int i = 0; i < 500 && g_finishing.load(std::memory_order_seq_cst) > 0; ++i) usleep(1000);
}

bool pending_handover_in_flight() { return g_handovers.load(std::memory_order_seq_cst) != 0; }

FdRef pending_settle(int fd, FdRef r) {
  if (!r || r.get()->kind() != FdState::Kind::kPending) return r;
  auto* p = r.as<PendingState>();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!p->resolved()) return r;
  FdRef out = p->outcome();
  // The fd keeps p until its epoll members are converted (rs_epoll_ctl
  // waits for that on p); the calls go on with the outcome meanwhile. Then
  // every fd of p goes over with this one: the application may close this
  // one next, which must not be the outcome's last close while another of
  // its numbers still holds p.
  if (p->converted()) move_fds(p, out.get(), fd);
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
  // Delayed pairings (RSOCK_TCP_FIRST) start now.
  g_hurry.store(true);
  if (g_driver_efd >= 0) {
    const uint64_t one = 1;
    (void)!real().write(g_driver_efd, &one, sizeof one);
  }
  if (!flight_cv().wait_for(lock, bound, [] { return g_in_flight == 0; }))
    LOG_WARN("fork: %d pairing(s) still in flight; the child sees them as plain TCP", g_in_flight);
  g_hurry.store(false);
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
  g_finishing.store(0);
  // Nor a driver: its eventfd is the parent's too (a read here would eat a
  // wakeup of the parent's driver).
  g_driver_running = false;
  if (g_driver_efd >= 0) real().close(g_driver_efd);
  g_driver_efd = -1;
  new (&flight_cv()) std::condition_variable;
  new (&work_cv()) std::condition_variable;
  g_flight_mu.unlock();
  std::vector<std::pair<int, FdState*>> stuck;
  fd_table().for_each([&](int fd, FdState* s) {
    if (s->kind() == FdState::Kind::kPending) {
      auto* p = static_cast<PendingState*>(s);
      // One whose hand-over the fork cut short is converted as far as it
      // will ever be here: an epoll_ctl on it must not wait for the rest.
      p->set_converted();
      if (!p->resolved()) stuck.emplace_back(fd, s);
    }
  });
  for (auto& [fd, s] : stuck) {
    auto* p = static_cast<PendingState*>(s);
    p->resolve(nullptr);
    fd_table().replace(fd, p, nullptr);
  }
}

}  // namespace rsock
