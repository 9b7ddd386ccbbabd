// poll/select/epoll over mixed kernel and accelerated fds (see readiness.h).
#include "progress/readiness.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "common/clock.h"
#include "common/own_fd.h"
#include "common/real.h"
#include "common/sleep_token.h"
#include "fdtable/fdtable.h"
#include "lifecycle/runtime.h"
#include "socket/pending.h"
#include "socket/socket.h"

namespace rsock {
namespace {

// Kernel epoll data for an accelerated member: our tag in the high word, the
// fd in the low word. Such an event is a doorbell (kTag) or a kick of the
// member's WakeHub (kKickTag), never shown to the app.
constexpr uint64_t kTag = 0x72736f6300000000ull;      // "rsoc"
constexpr uint64_t kKickTag = 0x72736f6b00000000ull;  // "rsok"
constexpr uint64_t kTagMask = 0xffffffff00000000ull;
// Below kTag, a member's registration carries its fd (under
// FdTable::kMaxFd) and a generation: the set counts its ADDs. The kernel
// keeps a registration as long as its file, which may outlive the close of
// the fd when another process holds the socket too (a close skips the
// EPOLL_CTL_DEL where nothing else should: epoll_forget's file_ends): the
// reports of such a registration name a number that a later member of the
// set may have, whose generation is another, and filter_kernel drops them.
constexpr int kTagFdBits = 20;
static_assert(FdTable::kMaxFd <= (1 << kTagFdBits));
constexpr uint32_t kTagFdMask = (1u << kTagFdBits) - 1;
constexpr uint32_t kTagGenMask = (1u << (32 - kTagFdBits)) - 1;
uint64_t tag_of(int fd, uint32_t gen) {
  return kTag | (uint64_t{gen & kTagGenMask} << kTagFdBits) |
         (static_cast<uint32_t>(fd) & kTagFdMask);
}

int64_t spin_budget_ns() {
  const Runtime* rt = runtime();
  return static_cast<int64_t>(rt ? rt->config.spin_us : kDefaultSpinUs) * 1000;
}

// RSOCK_TEST_EPOLL_PAUSE_US (Config): tests only.
uint32_t test_epoll_pause_us() {
  const Runtime* rt = runtime();
  return rt ? rt->config.test_epoll_pause_us : 0;
}

// Remaining time for a blocking kernel wait; -1 = infinite.
bool remaining(int64_t deadline, timespec* ts, int* ms) {
  if (deadline < 0) {
    *ms = -1;
    return true;
  }
  int64_t left = deadline - monotonic_ns();
  if (left < 0) left = 0;
  ts->tv_sec = left / 1000000000;
  ts->tv_nsec = left % 1000000000;
  *ms = static_cast<int>((left + 999999) / 1000000);
  return left > 0;
}

short poll_events_of(const StreamEvents& ev, short want) {
  short r = 0;
  if (ev.readable) r |= want & (POLLIN | POLLRDNORM);
  if (ev.writable) r |= want & (POLLOUT | POLLWRNORM);
  if (ev.rdhup) r |= want & POLLRDHUP;
  if (ev.hup) r |= POLLHUP;
  if (ev.error) r |= POLLERR;
  return r;
}

uint32_t want_of_poll(short ev) {
  uint32_t w = 0;
  if (ev & (POLLIN | POLLRDNORM | POLLRDHUP)) w |= kWantData;
  if (ev & (POLLOUT | POLLWRNORM)) w |= kWantSpace;
  return w;
}

ConnectionState* as_conn(const FdRef& r) {
  return r && r.get()->kind() == FdState::Kind::kConnection ? r.as<ConnectionState>() : nullptr;
}

// ---- epoll shadow ---------------------------------------------------------

// A member is a ConnectionState, or a PendingState until its pairing is
// resolved (then converted: see epoll_pending_resolved).
struct EpollMember {
  FdRef st;
  ConnectionState* conn() const {
    return st.get()->kind() == FdState::Kind::kConnection ? st.as<ConnectionState>() : nullptr;
  }
  // The kernel fd registered for this member (tagged): the channel's wait_fd
  // or the pairing's eventfd.
  int wait_fd() const {
    ConnectionState* c = conn();
    return c ? c->stream().channel().wait_fd() : st.as<PendingState>()->event_fd();
  }
  // The number its registration was made under: wait_fd then, which may
  // have changed since (a stream on TCP that took its own dup of the
  // application's socket, PrefixChannel::own_socket). The kernel keys a
  // registration by number and file, so a MOD or DEL must name this one.
  int reg_fd = -1;
  // How the kernel watches wait_fd for it (kernel_events).
  uint32_t kernel_mask = EPOLLIN;
  // The generation in its registration's tag (tag_of).
  uint32_t tag_gen = 0;
  // A converted member's former pairing, whose eventfd stays registered
  // until a wait has seen it fire (it wakes a waiter that slept through
  // the conversion).
  FdRef stale;
  uint32_t events = 0;
  epoll_data_t data{};
  bool disabled = false;  // EPOLLONESHOT fired
  int armed_data = 0;     // arm() calls not yet undone (waits in progress)
  int armed_space = 0;
  // Bumped whenever those counts are cleared at once (disarm_member; going
  // dormant): a wait's arms from before are gone, not its to undo.
  uint32_t arm_gen = 0;
  uint32_t last_mask = 0;
  uint64_t last_rx = ~0ull;
  uint64_t last_tx = ~0ull;
  // A member on kernel TCP in both directions (RSOCK_TCP_FIRST, before its
  // switch) learns news only through the kernel: its socket's registration
  // fired (filter_kernel sets tcp_news), or it was added or changed. Looked
  // at (two system calls) only then, or while a level-triggered event of
  // its holds (tcp_level), or when its connection is not the one last
  // looked at (tcp_conn: a conversion).
  bool tcp_news = true;
  bool tcp_level = false;
  const ConnectionState* tcp_conn = nullptr;
  // What the kernel last reported of that registration (filter_kernel)
  // since the last look: the socket's readiness when the kernel woke us,
  // which that look takes instead of a poll (Stream::events).
  uint32_t tcp_kev = 0;
  // Another member of the set is the same connection (dup'd fds): they
  // share one kernel registration of the wakeup fd, tagged with one's fd.
  bool wait_shared = false;
  // Removed by EPOLL_CTL_DEL, but its kernel registration stays for a
  // re-ADD of the same connection (see park()). Gone for the application.
  bool parked = false;
  // Dormant: reported nothing for kQuietSleeps sleeps in a row, so it stays
  // armed (with a token of its own) and joined to its hub between waits and
  // the passes leave it out, until its doorbell or a kick of its hub (see
  // wake_member). `fresh` (and on the list) until the wait that made it so,
  // the one whose sleep token is `fresh_sleep`, has looked at it once after
  // arming it and is over.
  bool dormant = false;
  bool fresh = false;
  uint64_t fresh_sleep = 0;
  bool dorm_data = false;
  bool dorm_space = false;
  WakeHub::Ticket dorm_ticket;
  // Woken from dormancy while other threads of ours slept on the set: they
  // went to sleep without arming it, so it keeps an arm of its own for
  // them (tokenless, see wake_member) until no thread sleeps on the set.
  bool lent = false;
  uint8_t quiet = 0;      // sleeps in a row in which it reported nothing
  bool reported = false;  // reported an event since the last sleep
  // Giving an idle connection's ring pages back (take_due_trims): when it
  // last reported an event or was added or changed (ms, monotonic; -1: at
  // the next sleep), and whether it has been trimmed since.
  int64_t active_ms = -1;
  bool trimmed = false;
  // The set's list of members that are not dormant, which the passes walk
  // (a dormant member is off it). fd: the member's key in the set.
  int fd = -1;
  class EpollState* owner = nullptr;
  EpollMember* prev = nullptr;
  EpollMember* next = nullptr;
  bool linked = false;
};

// The kernel registration of a member's wakeup fd: level-triggered EPOLLIN,
// drained by us. While a direction of the connection still moves its bytes
// on the kernel socket (Stream::rx_on_tcp, tx_on_tcp), the socket's own
// readiness is the member's, and an application that leaves those bytes
// unread (or a socket that stays writable) would keep a level-triggered
// registration firing: edge-triggered then, until both directions have
// switched (collect() changes it back); with EPOLLOUT when the application
// watches it (`events`: the member's), or twins share the registration:
// room to send is no news to a member that does not watch it, and a new
// socket, which has room, would be reported at once for nothing.
constexpr uint32_t kTcpWatch = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
uint32_t kernel_events(const EpollMember& m, uint32_t events) {
  ConnectionState* c = m.conn();
  if (!c || !(c->stream().rx_on_tcp() || c->stream().tx_on_tcp())) return EPOLLIN;
  const bool out = (events & EPOLLOUT) || m.wait_shared;
  return (out ? kTcpWatch : kTcpWatch & ~EPOLLOUT) | EPOLLET;
}

// Sleeps without an event after which a member goes dormant.
constexpr uint8_t kQuietSleeps = 4;
// A member that reported nothing for this long has its connection's idle
// ring pages given back (Stream::trim), once until it reports again; a set
// looks for such members at most every kTrimSweepMs.
constexpr int64_t kTrimIdleMs = kTrimIdleNs / 1000000;
constexpr int64_t kTrimSweepMs = 250;

std::mutex g_sets_mu;
// How many registrations a pairing's conversion gave the kernel as plain
// TCP (EpollState::plain_handed), which a close of their fd must drop.
std::atomic<int> g_plain_handed{0};
class EpollState;
bool wake_member(EpollMember& m, bool others_asleep);
void drop_own_arm(EpollMember& m);

// Every live shadow, for epoll_forget and epoll_pending_resolved; under
// g_sets_mu. Built in static storage on first use and never destroyed: a
// detached pairing thread (socket/pending.h) may walk it while the process
// exits and runs the static destructors.
std::vector<EpollState*>& live_sets() {
  alignas(std::vector<EpollState*>) static unsigned char storage[sizeof(std::vector<EpollState*>)];
  static auto* sets = new (storage) std::vector<EpollState*>;
  return *sets;
}

class EpollState final : public FdState {
 public:
  explicit EpollState(int epfd) : FdState(Kind::kEpoll), epfd(epfd) {}
  void on_last_close() override {
    {
      std::lock_guard<std::mutex> lock(g_sets_mu);
      std::vector<EpollState*>& sets = live_sets();
      sets.erase(std::remove(sets.begin(), sets.end(), this), sets.end());
      g_plain_handed.fetch_sub(static_cast<int>(plain_handed.size()));
      plain_handed.clear();
    }
    std::lock_guard<std::mutex> lock(mu);
    for (auto& [fd, m] : members) {
      wake_member(m, false);
      drop_own_arm(m);
      m.st.get()->epoll_refs.fetch_sub(1);
    }
    awake = nullptr;
    members.clear();
    parked = 0;
    give_set_waker(kick);  // no ticket names it any more (wake_member left them)
    kick = nullptr;
  }
  const int epfd;
  std::atomic<int64_t> kernel_look{0};  // see look_at_kernel
  // Whether the first pass of the last epoll_wait found a member with a
  // direction on a transport (collect's *ring): see rs_epoll_wait.
  std::atomic<bool> ring_seen{true};
  uint32_t adds = 0;                      // members added: their tags' generations (tag_of)
  SpinGovernor spin;                      // epoll_wait's spin length
  std::mutex mu;
  std::map<int, EpollMember> members;  // accelerated members by fd
  // The fds a pairing's conversion registered in the kernel's set as plain
  // TCP (epoll_pending_resolved). The kernel drops a registration when the
  // socket's file closes, not the fd: the dups librsock may still hold of
  // it (the pairing's, the stream the fd used meanwhile) would keep it
  // reporting under the fd's data after the application closed the fd, so
  // that close drops it (epoll_forget). Under g_sets_mu.
  std::vector<int> plain_handed;
  EpollMember* awake = nullptr;        // the members not dormant (a list)
  int parked = 0;                      // members parked (see park())
  int lent = 0;                        // members lent (see EpollMember::lent)
  // Threads of this process asleep in the kernel on this set (under mu), and
  // the set's waker (waker.h), registered level-triggered under kSetKick:
  // WakeHub kicks of its members' connections and kick_set (another thread
  // added or changed an accelerated member) poke it. hub_pokes: its counted
  // pokes when a wait last looked at the dormant members. nullptr and
  // unregistered until first needed.
  int waiting = 0;
  Waker* kick = nullptr;
  bool kick_registered = false;
  uint64_t hub_pokes = 0;
  // When a member will have been idle for kTrimIdleMs (ms, monotonic; 0:
  // none is waiting to be trimmed). Written under mu; a sleep ends by then.
  std::atomic<int64_t> trim_due_ms{0};
};

void link_awake(EpollMember& m) {
  if (m.linked || !m.owner) return;
  EpollMember*& head = m.owner->awake;
  m.prev = nullptr;
  m.next = head;
  if (head) head->prev = &m;
  head = &m;
  m.linked = true;
}

void unlink_awake(EpollMember& m) {
  if (!m.linked) return;
  if (m.prev)
    m.prev->next = m.next;
  else
    m.owner->awake = m.next;
  if (m.next) m.next->prev = m.prev;
  m.prev = m.next = nullptr;
  m.linked = false;
}

// Calls f(o) for each other member of the set on m's connection (dup'd
// fds, see wait_shared). Under s.mu.
template <class F>
void for_each_twin(EpollState& s, const EpollMember& m, F f) {
  if (!m.wait_shared) return;
  for (auto& [fd, o] : s.members)
    if (&o != &m && o.st.get() == m.st.get() && o.reg_fd == m.reg_fd) f(o);
}

// Undoes a member's own arm (dormant or lent) and leaves its hub.
void drop_own_arm(EpollMember& m) {
  if (ConnectionState* c = m.conn()) {
    Channel& ch = c->stream().channel();
    if (m.dorm_data) ch.disarm(kWantData);
    if (m.dorm_space) ch.disarm(kWantSpace);
    c->wake.leave(m.dorm_ticket);  // none (kNone) when it has not joined
  }
  m.dorm_data = m.dorm_space = false;
  m.dorm_ticket = WakeHub::Ticket{};
  if (m.lent && m.owner) --m.owner->lent;
  m.lent = false;
}

// Ends a member's dormancy: it is on the passes again. others_asleep:
// other threads of ours sleep on the set, having skipped it while it was
// dormant; its own arm then stays for them (lent) until no thread sleeps
// on the set, else a doorbell for it would wake none of them while this
// thread is busy (the kernel wakes any thread waiting on a set for any
// member). Tokenless from now on: the peer may have rung its own token and
// would spare the next doorbell (ring/sleepers.h), which no look of ours
// would follow. Armed before the old arm goes, so the count never drops to
// zero. Returns whether it was dormant. Under the set's mutex (the hub's is
// taken inside it, never the other way round).
bool wake_member(EpollMember& m, bool others_asleep) {
  if (!m.dormant) return false;
  ConnectionState* c = m.conn();
  if (c && others_asleep && m.owner) {
    Channel& ch = c->stream().channel();
    if (m.dorm_data) {
      if (ch.arm(kWantData, 0)) c->wake.kick(true);
      ch.disarm(kWantData);
    }
    if (m.dorm_space) {
      if (ch.arm(kWantSpace, 0)) c->wake.kick(true);
      ch.disarm(kWantSpace);
    }
    m.lent = true;
    ++m.owner->lent;
  } else {
    drop_own_arm(m);
  }
  m.dormant = m.fresh = false;
  m.quiet = 0;
  link_awake(m);
  return true;
}

// Whether threads of ours other than the caller sleep on the set (joined:
// the caller's, when it is one of them). Under s.mu.
bool others_asleep(const EpollState& s, const std::vector<struct Joined>* joined) {
  return s.waiting > (joined ? 1 : 0);
}

// Whether a wait loop also asks the kernel about its kernel members (one
// system call). When accelerated members are ready, once kKernelLookNs has
// passed since the last look: kernel fds are never starved (they wait at
// most that long behind a busy accelerated stream), and a ping-pong pays no
// system call per message (one every 8th call cost an epoll ping-pong 13%
// of its round trip here). While waiting, every 16th spin pass and the last
// pass look. *last_look: when the kernel was last asked (CLOCK_MONOTONIC ns).
constexpr int64_t kKernelLookNs = 100000;
bool look_at_kernel(bool accel_ready, bool last_pass, int iter, int64_t now,
                    std::atomic<int64_t>* last_look) {
  if (accel_ready ? now - last_look->load(std::memory_order_relaxed) < kKernelLookNs
                  : !last_pass && iter % 16 != 0)
    return false;
  last_look->store(now, std::memory_order_relaxed);
  return true;
}

uint32_t epoll_mask_of(const StreamEvents& ev) {
  uint32_t m = 0;
  if (ev.readable) m |= EPOLLIN | EPOLLRDNORM;
  if (ev.writable) m |= EPOLLOUT | EPOLLWRNORM;
  if (ev.rdhup) m |= EPOLLRDHUP;
  if (ev.hup) m |= EPOLLHUP;
  if (ev.error) m |= EPOLLERR;
  return m;
}

// The fd field of the set's own kick event (no application fd has it).
constexpr uint32_t kSetKick = 0xffffffffu;

// Threads asleep in the kernel on a set that has no shadow at all (the
// wrappers' path: rs_epoll_wait_unshadowed). An ADD that makes a set's
// shadow cannot tell whether one of them sleeps on that set; with none
// anywhere it need not wake anybody.
std::atomic<int> g_unshadowed_waiters{0};

// Another thread added or changed an accelerated member: a thread asleep in
// the kernel on this set would not look at it (the kernel wakes epoll
// sleepers for a ready fd that is added; our registration of the member's
// wakeup fd is not ready), so it is woken to look. `fresh`: the shadow was
// made by this call, so a thread may sleep on the set uncounted. Under s.mu.
// Makes sure the set has its waker and watches it; false when it cannot (no
// fd). Under s.mu.
bool ensure_kick(EpollState& s) {
  if (!s.kick) s.kick = take_set_waker();
  if (s.kick_registered) return true;
  if (!s.kick->open_fd()) return false;
  epoll_event kev = {};
  kev.events = EPOLLIN;  // level: a poke stays until a wait drains it
  kev.data.u64 = kKickTag | kSetKick;
  if (real().epoll_ctl(s.epfd, EPOLL_CTL_ADD, s.kick->fd(), &kev) != 0 && errno != EEXIST)
    return false;
  s.kick_registered = true;
  return true;
}

void kick_set(EpollState& s, bool fresh) {
  if (s.waiting == 0) {
    if (!fresh) return;
    // Dekker with rs_epoll_wait_unshadowed: the shadow was published
    // before this load; a sleeper counts itself before it looks for one.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (g_unshadowed_waiters.load(std::memory_order_seq_cst) == 0) return;
  }
  // Out of fds: that sleeper wakes at the next doorbell.
  if (ensure_kick(s)) s.kick->poke(false);
}

// Collects ready accelerated members into out[0..max). Level-triggered
// members report while ready; edge-triggered ones when something new
// happened since their last report; one-shot ones once until EPOLL_CTL_MOD.
// Members on kernel TCP in both directions (RSOCK_TCP_FIRST, before their
// switch) cost two system calls to look at, and learn nothing new but
// through the kernel, whose registration of their socket the passes that
// ask the kernel drain: the other spin passes leave them out (kSkip), and
// the rest look only at those with news (EpollMember::tcp_news).
enum class OnTcp { kLook, kSkip };
// *ring (when given) is set when a member looked at has a direction on a
// transport: one worth a spin. Under s.mu.
int collect_locked(EpollState& s, epoll_event* out, int max, OnTcp on_tcp = OnTcp::kLook,
                   bool* ring = nullptr) {
  int n = 0;
  // Members that are one connection (dup'd fds, wait_shared) report from
  // one look at it per pass, as the kernel's wakeup queues all of a file's
  // registrations at once: a byte that lands between two looks would have
  // one report and its twin not (kTwinLooks: connections with twins whose
  // looks are kept; more are looked at member by member).
  constexpr int kTwinLooks = 4;
  struct TwinLook {
    const ConnectionState* conn;
    StreamEvents ev;
    ConnectionState* live;
  } twin_looks[kTwinLooks];
  int twin_count = 0;
  for (EpollMember *p = s.awake, *nx = nullptr; p; p = nx) {
    nx = p->next;
    EpollMember& m = *p;
    if (n >= max) break;
    if (m.disabled || m.parked || !m.conn() || (m.dormant && !m.fresh)) continue;
    // No probe where the set's kernel registration of the member's wakeup
    // fd tells of a peer's death (rs_epoll_wait drains it before it calls
    // collect): probing each member once per clock tick cost a busy loop
    // two system calls per member and tick, all of its time with thousands
    // of idle members.
    // A member whose stream was sealed a moment ago (RSOCK_TCP_FIRST: its
    // pairing just ended, and its conversion comes next) reports its
    // successor's readiness: the sealed stream's own says "call again" to
    // every call, which would be a spurious event here (live_events: also
    // when the seal comes while we look).
    ConnectionState* mc = m.conn();
    if (ConnectionState* next = mc->next()) mc = next;
    Stream& st = mc->stream();
    const bool on_kernel_tcp = st.rx_on_tcp() && st.tx_on_tcp();
    if (!on_kernel_tcp && ring) *ring = true;
    if (on_kernel_tcp) {
      if (on_tcp == OnTcp::kSkip) continue;
      if (!m.tcp_news && !m.tcp_level && m.tcp_conn == mc) continue;  // nothing new
    }
    const ConnectionState* looked = mc;
    TwinLook* kept = nullptr;
    if (m.wait_shared)
      for (int i = 0; i < twin_count && !kept; ++i)
        if (twin_looks[i].conn == looked) kept = &twin_looks[i];
    StreamEvents ev;
    if (kept) {
      ev = kept->ev;
      mc = kept->live;
    } else {
      // The kernel's report stands for a poll of a socket that carries
      // nothing but the application's bytes.
      const uint32_t kev = on_kernel_tcp && st.peer_sends_on_tcp() ? m.tcp_kev : 0;
      // Arrivals are counted (a FIONREAD of a socket still carrying them)
      // only for an edge-triggered member, whose report depends on them,
      // and for a look its twins may share.
      const bool edges = (m.events & EPOLLET) || m.wait_shared;
      ev = mc->live_events(!st.channel().wait_fd_shows_carrier(), &mc, kev, edges);
      if (m.wait_shared && twin_count < kTwinLooks) twin_looks[twin_count++] = {looked, ev, mc};
    }
    if (m.kernel_mask != EPOLLIN && !m.wait_shared) {
      // Both directions switched since: back to the level-triggered watch.
      // (A watch wider than the member's needs no change: a MOD that drops
      // EPOLLOUT leaves it.)
      const uint32_t k = kernel_events(m, m.events);
      if (k != m.kernel_mask && ((k & ~m.kernel_mask) != 0 || k == EPOLLIN)) {
        epoll_event kev = {};
        kev.events = m.kernel_mask = k;
        kev.data.u64 = tag_of(m.fd, m.tag_gen);
        real().epoll_ctl(s.epfd, EPOLL_CTL_MOD, m.reg_fd, &kev);
      }
    }
    uint32_t mask = epoll_mask_of(ev) & (m.events | EPOLLERR | EPOLLHUP);
    m.tcp_news = false;
    m.tcp_kev = 0;
    m.tcp_level = mask != 0 && !(m.events & EPOLLET);
    m.tcp_conn = on_kernel_tcp ? mc : nullptr;
    if (m.events & EPOLLET) {
      bool fresh = (mask & ~m.last_mask) != 0 || ((mask & EPOLLIN) && ev.rx_gen != m.last_rx) ||
                   ((mask & EPOLLOUT) && ev.tx_gen != m.last_tx);
      m.last_mask = mask;
      m.last_rx = ev.rx_gen;
      m.last_tx = ev.tx_gen;
      if (!fresh) continue;
    }
    if (mask == 0) continue;
    out[n].events = mask;
    out[n].data = m.data;
    ++n;
    m.reported = true;
    wake_member(m, s.waiting > 0);  // a fresh dormant member that had something after all
    if (m.events & EPOLLONESHOT) m.disabled = true;
  }
  return n;
}

int collect(EpollState& s, epoll_event* out, int max, OnTcp on_tcp = OnTcp::kLook,
            bool* ring = nullptr) {
  std::lock_guard<std::mutex> lock(s.mu);
  return collect_locked(s, out, max, on_tcp, ring);
}

// A connection this epoll_wait sleeps on: held (with its hub) until the
// wait has left the hub.
struct Joined {
  FdRef conn;
  WakeHub::Ticket ticket;
  // The member this wait armed, and how: disarm_all undoes exactly that.
  int fd = -1;
  const FdState* st = nullptr;
  uint32_t gen = 0;
  bool data = false;
  bool space = false;
};

// A member watched for EPOLLOUT alone may be a sender waiting for a peer
// that waits to send too (an event loop that paused reading while it
// drains its writes, as asyncio's streams do): it is armed for the peer's
// bytes as well, and its connection takes them out of a full ring once
// armed (Stream::relieve, as conn_wait does).
bool wants_relief(const EpollMember& m, ConnectionState* c) {
  uint32_t want = 0;
  if (m.events & (EPOLLIN | EPOLLRDHUP)) want |= kWantData;
  if (m.events & EPOLLOUT) want |= kWantSpace;
  return c->stream().sleep_wants(want) != want;
}

// Before a kernel wait: joins the hubs of the members' connections with
// the set's waker and arms their channels; *blind when a hub could not name
// the waker (or the set has none: out of fds). *relieve: the connections to
// relieve once the set's lock is released (wants_relief).
// Returns this sleep's token, for disarm_all.
uint64_t arm_all(EpollState& s, std::vector<Joined>* joined, bool* blind, int64_t now_ms,
                 std::vector<FdRef>* relieve) {
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.waiting;  // until disarm_all: an ADD or MOD meanwhile wakes us (kick_set)
  *blind = false;
  const uint64_t sleep = new_sleep_token();  // one sleep: every member
  int64_t due = s.trim_due_ms.load(std::memory_order_relaxed);
  Waker* const waker = ensure_kick(s) ? s.kick : nullptr;
  for (EpollMember *p = s.awake, *nx = nullptr; p; p = nx) {
    nx = p->next;
    EpollMember& m = *p;
    const int fd = m.fd;
    ConnectionState* c = m.conn();
    if (!c || m.disabled || m.parked || m.dormant) continue;
    if (m.reported || m.active_ms < 0) {
      // Traffic: its pages go back once it has been idle long enough, if
      // it touched enough of them (else no sleep is cut for it).
      m.active_ms = now_ms;
      m.trimmed = !c->stream().trimmable();
      if (!m.trimmed && (due == 0 || due > now_ms + kTrimIdleMs)) due = now_ms + kTrimIdleMs;
    }
    if (m.reported)
      m.quiet = 0;
    else if (m.quiet < kQuietSleeps)
      ++m.quiet;
    m.reported = false;
    // Never a connection whose peer has ended it: a send of ours then resets
    // it, which no doorbell would report.
    WakeHub::Ticket ticket = c->wake.join(waker);
    const bool relief = wants_relief(m, c);
    if (relief) {
      c->ref();
      relieve->push_back(FdRef(c));
    }
    if (ticket.waker && m.quiet >= kQuietSleeps && !c->stream().ending()) {
      // Armed with a token of its own, not this sleep's: a peer spares a
      // sleep's other doorbells once it has rung one (ring/sleepers.h),
      // and this sleep ends before the member's dormancy does. Its own
      // token still spares repeats (a burst while we are busy rings once a
      // millisecond, not once a write), since the member is looked at after
      // the disarm that ends its dormancy, as a sleep looks at its members.
      const uint64_t own = new_sleep_token();
      Channel& ch = c->stream().channel();
      drop_own_arm(m);  // a lent arm, if any: replaced by this one
      m.dorm_ticket = ticket;
      if ((m.events & (EPOLLIN | EPOLLRDHUP)) || relief) {
        if (ch.arm(kWantData, own)) c->wake.kick(true);
        m.dorm_data = true;
      }
      if (m.events & EPOLLOUT) {
        if (ch.arm(kWantSpace, own)) c->wake.kick(true);
        m.dorm_space = true;
      }
      m.dormant = m.fresh = true;  // off the list once this wait is over
      m.fresh_sleep = sleep;
      continue;
    }
    Joined j;
    c->ref();
    j.conn = FdRef(c);
    j.ticket = ticket;
    if (!ticket.waker) *blind = true;
    j.fd = fd;
    j.st = m.st.get();
    j.gen = m.arm_gen;
    Channel& ch = c->stream().channel();
    if ((m.events & (EPOLLIN | EPOLLRDHUP)) || relief) {
      if (ch.arm(kWantData, sleep)) c->wake.kick(true);
      ++m.armed_data;
      j.data = true;
    }
    if (m.events & EPOLLOUT) {
      if (ch.arm(kWantSpace, sleep)) c->wake.kick(true);
      ++m.armed_space;
      j.space = true;
    }
    joined->push_back(std::move(j));
  }
  s.trim_due_ms.store(due, std::memory_order_relaxed);
  return sleep;
}

// The connections of members idle for kTrimIdleMs and not trimmed since,
// once their time has come (at most every kTrimSweepMs): the caller gives
// their rings' pages back (Stream::trim) outside the set's lock. A walk of
// every member, dormant ones too, but only when one is due.
void take_due_trims(EpollState& s, int64_t now_ms, std::vector<FdRef>* out) {
  const int64_t due = s.trim_due_ms.load(std::memory_order_relaxed);
  if (due == 0 || now_ms < due) return;
  std::lock_guard<std::mutex> lock(s.mu);
  int64_t next = 0;
  for (auto& [fd, m] : s.members) {
    ConnectionState* c = m.conn();
    if (!c || m.parked || m.trimmed || m.active_ms < 0) continue;
    if (now_ms - m.active_ms >= kTrimIdleMs) {
      m.trimmed = true;
      c->ref();
      out->push_back(FdRef(c));
    } else if (next == 0 || m.active_ms + kTrimIdleMs < next) {
      next = m.active_ms + kTrimIdleMs;
    }
  }
  s.trim_due_ms.store(next == 0 ? 0 : std::max(next, now_ms + kTrimSweepMs),
                      std::memory_order_relaxed);
}

// Undoes every arm waits have put on m (their counts), at once: those
// waits will not undo theirs (arm_gen). Under s.mu.
void clear_arms(EpollMember& m) {
  if (ConnectionState* c = m.conn()) {
    for (; m.armed_data > 0; --m.armed_data) c->stream().channel().disarm(kWantData);
    for (; m.armed_space > 0; --m.armed_space) c->stream().channel().disarm(kWantSpace);
  }
  m.armed_data = m.armed_space = 0;
  ++m.arm_gen;
}

// After the wait: undoes exactly the arms this wait put on members that
// still hold them (another thread may have removed a member, or a wait
// made it dormant, meanwhile), takes the members it made dormant off the
// list, and leaves the hubs joined.
void disarm_all(EpollState& s, std::vector<Joined>* joined, uint64_t sleep) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    --s.waiting;
    // No thread sleeps on the set any more: nobody needs the lent arms.
    if (s.waiting == 0 && s.lent > 0)
      for (auto& [fd, m] : s.members)
        if (m.lent) drop_own_arm(m);
    for (const Joined& j : *joined) {
      auto it = s.members.find(j.fd);
      if (it == s.members.end()) continue;
      EpollMember& m = it->second;
      if (m.st.get() != j.st || m.arm_gen != j.gen) continue;
      Channel& ch = m.conn()->stream().channel();
      if (j.data && m.armed_data > 0) {
        ch.disarm(kWantData);
        --m.armed_data;
      }
      if (j.space && m.armed_space > 0) {
        ch.disarm(kWantSpace);
        --m.armed_space;
      }
    }
    // Dormant from now on: other waits still asleep will not visit it
    // again, so their arms go too (its own arm covers it).
    for (EpollMember *p = s.awake, *nx = nullptr; p; p = nx) {
      nx = p->next;
      EpollMember& m = *p;
      if (!m.dormant || m.fresh_sleep != sleep) continue;
      clear_arms(m);
      m.fresh = false;
      unlink_awake(m);
    }
  }
  for (Joined& j : *joined) j.conn.as<ConnectionState>()->wake.leave(j.ticket);
  joined->clear();
}

// Whether this wait joined c's hub.
bool has_joined(const std::vector<Joined>* joined, const ConnectionState* c) {
  if (joined)
    for (const Joined& j : *joined)
      if (j.conn.get() == c) return true;
  return false;
}

// Moves kernel events into place, draining doorbells of accelerated members
// (and passing on what a drain consumed: joined, the connections this wait
// sleeps on, or nullptr while spinning). A kick needs nothing here: the
// caller looks at every member next. Under s.mu.
int filter_kernel_locked(EpollState& s, epoll_event* ev, int n, const std::vector<Joined>* joined) {
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    if ((ev[i].data.u64 & kTagMask) == kKickTag) {  // the set's waker (kSetKick)
      if (!s.kick) continue;
      s.kick->drain();
      // A WakeHub kick among the pokes: another thread consumed a wakeup
      // of a connection whose dormant members then look again.
      const uint64_t pokes = s.kick->pokes();
      if (pokes == s.hub_pokes) continue;
      s.hub_pokes = pokes;
      for (auto& [mfd, m] : s.members)
        if (m.dormant && m.conn() && m.conn()->wake.kicked_since(m.dorm_ticket))
          wake_member(m, others_asleep(s, joined));
      continue;
    }
    if ((ev[i].data.u64 & kTagMask) == kTag) {
      const auto low = static_cast<uint32_t>(ev[i].data.u64);
      const int fd = static_cast<int>(low & kTagFdMask);
      auto it = s.members.find(fd);
      if (it == s.members.end()) continue;
      EpollMember& m = it->second;
      if (m.tag_gen != low >> kTagFdBits) continue;  // an earlier member's, its file held elsewhere
      if (m.stale) {
        real().epoll_ctl(s.epfd, EPOLL_CTL_DEL, m.stale.as<PendingState>()->event_fd(), nullptr);
        m.stale.reset();
      }
      // Drained while still joined (a dormant member's ticket counts as
      // ours), then out of dormancy: the passes look at it from now on.
      if (ConnectionState* c = m.conn())
        if (c->stream().channel().drain_wakeups()) c->wake.kick(m.dormant || has_joined(joined, c));
      m.tcp_news = true;
      m.tcp_kev = ev[i].events;
      wake_member(m, others_asleep(s, joined));
      for_each_twin(s, m, [&](EpollMember& o) {
        o.tcp_news = true;
        wake_member(o, others_asleep(s, joined));
      });
      continue;
    }
    ev[kept++] = ev[i];
  }
  return kept;
}

int filter_kernel(EpollState& s, epoll_event* ev, int n, const std::vector<Joined>* joined) {
  std::lock_guard<std::mutex> lock(s.mu);
  return filter_kernel_locked(s, ev, n, joined);
}

}  // namespace

// ---- poll -----------------------------------------------------------------

namespace {

// poll_core's answer when a member is still pairing (pending.h).
constexpr int kHasPending = INT_MIN;

int poll_core(pollfd* fds, nfds_t n, int64_t timeout_ns, const sigset_t* mask) {
  bool any = false;
  for (nfds_t i = 0; i < n; ++i)
    if (fds[i].fd >= 0 && fd_table().has(fds[i].fd)) any = true;
  // Small sets (the usual case) live on the stack: a poll loop allocates
  // nothing per call.
  // kfds: the kernel's view of the set, and when it sleeps, one entry more:
  // this thread's waker (waker.h), which WakeHub kicks poke.
  constexpr nfds_t kInline = 16;
  FdRef refs_inline[kInline];
  pollfd kfds_inline[kInline + 1];
  std::vector<FdRef> refs_heap;
  std::vector<pollfd> kfds_heap;
  FdRef* refs = refs_inline;
  pollfd* kfds = kfds_inline;
  if (any && n > kInline) {
    refs_heap.resize(n);
    kfds_heap.resize(n + 1);
    refs = refs_heap.data();
    kfds = kfds_heap.data();
  }
  if (any) {
    any = false;
    for (nfds_t i = 0; i < n; ++i) {
      if (fds[i].fd < 0) continue;
      // A socket pairing with its bytes on TCP meanwhile (RSOCK_TCP_FIRST)
      // shows that connection's readiness.
      FdRef r = pending_live(pending_settle(fds[i].fd, fd_table().get(fds[i].fd)));
      if (as_conn(r)) {
        refs[i] = std::move(r);
        any = true;
      } else if (r && r.get()->kind() == FdState::Kind::kPending) {
        return kHasPending;
      }
    }
  }
  if (!any) {
    timespec ts = {static_cast<time_t>(timeout_ns / 1000000000),
                   static_cast<long>(timeout_ns % 1000000000)};
    int r = real().ppoll(fds, n, timeout_ns < 0 ? nullptr : &ts, mask);
    return r < 0 ? -errno : r;
  }
  const int64_t start = monotonic_ns();
  const int64_t deadline = timeout_ns < 0 ? -1 : start + timeout_ns;
  static thread_local SpinGovernor spin;
  const int64_t spin_end = start + spin.budget(spin_budget_ns());
  bool spinning = true;  // no sleep yet in this call
  std::copy(fds, fds + n, kfds);
  bool has_kernel = false;
  for (nfds_t i = 0; i < n; ++i)
    if (!refs[i] && fds[i].fd >= 0) has_kernel = true;
  static thread_local std::atomic<int64_t> poll_kernel_look{0};
  // A sleep of a second or more on members that stay quiet gives their
  // rings' pages back (Stream::trim), once per call, as conn_wait does.
  bool trim_due = true;
  for (int iter = 1;; ++iter) {
    int ready = 0;
    // A connection that paired while we looked (RSOCK_TCP_FIRST): its
    // successor's readiness from now on, not the sealed stream's.
    for (nfds_t i = 0; i < n; ++i)
      if (ConnectionState* c = as_conn(refs[i]); c && c->next()) {
        c->next()->ref();
        refs[i] = FdRef(c->next());
      }
    for (nfds_t i = 0; i < n; ++i) {
      fds[i].revents = 0;
      if (ConnectionState* c = as_conn(refs[i])) {
        fds[i].revents = poll_events_of(c->live_events(true), fds[i].events);
        if (fds[i].revents) ++ready;
      }
    }
    const int64_t now = monotonic_ns();
    const bool last = deadline >= 0 && now >= deadline;
    if (has_kernel && look_at_kernel(ready > 0, last, iter, now, &poll_kernel_look)) {
      for (nfds_t i = 0; i < n; ++i) kfds[i].fd = refs[i] ? -1 : fds[i].fd;
      int k = real().poll(kfds, n, 0);
      if (k > 0)
        for (nfds_t i = 0; i < n; ++i)
          if (!refs[i] && kfds[i].revents) {
            fds[i].revents = kfds[i].revents;
            ++ready;
          }
    }
    if (ready > 0) {
      if (spinning && iter > 1) spin.caught();
      return ready;
    }
    if (last) return 0;
    if (now < spin_end) {
      continue;
    }
    if (spinning) spin.missed();
    spinning = false;
    // Block: join each accelerated member's WakeHub (so that a doorbell
    // another thread of ours drains reaches us too), arm it, re-check, then
    // sleep in the kernel on their doorbells, this thread's waker and the
    // kernel members together.
    WakeHub::Ticket tickets_inline[kInline];
    std::vector<WakeHub::Ticket> tickets_heap;
    WakeHub::Ticket* tickets = tickets_inline;
    uint32_t armed_inline[kInline];
    std::vector<uint32_t> armed_heap;
    uint32_t* armed = armed_inline;
    if (n > kInline) {
      tickets_heap.resize(n);
      tickets = tickets_heap.data();
      armed_heap.resize(n);
      armed = armed_heap.data();
    }
    SleepWaker waker;
    bool blind = false;
    const uint64_t sleep = new_sleep_token();  // one sleep: every member
    for (nfds_t i = 0; i < n; ++i)
      if (ConnectionState* c = as_conn(refs[i])) {
        tickets[i] = c->wake.join(waker.get());
        // A member watched for POLLOUT alone may be a sender that waits for
        // a peer blocked in a send too (Python's sendall with a timeout
        // polls so): it also wakes for the peer's bytes, and moves them out
        // of a full ring after arming (Stream::relieve, as conn_wait).
        const uint32_t want = want_of_poll(fds[i].events);
        armed[i] = c->stream().sleep_wants(want);
        const bool relief = armed[i] != want;
        if (c->stream().channel().arm(armed[i], sleep)) c->wake.kick(true);
        if (relief) (void)c->stream().relieve();
        if (!tickets[i].waker) blind = true;
      }
    // The re-check. A member whose stream was sealed into its successor
    // since the top of this pass (RSOCK_TCP_FIRST) counts as ready: what
    // we joined and armed is the old stream's, whose kick came before our
    // join, and the successor's peer would ring no doorbell for us. The
    // next pass moves to the successor.
    bool now_ready = false;
    for (nfds_t i = 0; i < n && !now_ready; ++i)
      if (ConnectionState* c = as_conn(refs[i]))
        now_ready =
            c->next() != nullptr || poll_events_of(c->live_events(true), fds[i].events) != 0;
    int rc = 0, err = 0;
    if (!now_ready) {
      nfds_t k = n;
      for (nfds_t i = 0; i < n; ++i) {
        if (ConnectionState* c = as_conn(refs[i])) {
          // A sending side still on the kernel socket waits for its POLLOUT.
          const bool out = (fds[i].events & POLLOUT) && c->stream().tx_on_tcp();
          kfds[i] = {c->stream().channel().wait_fd(),
                     static_cast<short>(POLLIN | (out ? POLLOUT : 0)), 0};
        } else {
          kfds[i] = {fds[i].fd, fds[i].events, 0};
        }
      }
      if (Waker* w = waker.get()) kfds[k++] = {w->fd(), POLLIN, 0};
      timespec ts;
      int ms;
      int64_t until = deadline;
      // Without a ticket fd (out of fds), another thread's drain could not
      // wake us: sleep in slices (WakeHub::kBlindSliceNs) and look again.
      if (blind && (until < 0 || until > monotonic_ns() + WakeHub::kBlindSliceNs))
        until = monotonic_ns() + WakeHub::kBlindSliceNs;
      bool trim_cut = false;
      if (trim_due && (until < 0 || until > monotonic_ns() + kTrimIdleNs))
        for (nfds_t i = 0; i < n && !trim_cut; ++i)
          if (ConnectionState* c = as_conn(refs[i])) trim_cut = c->stream().trimmable();
      if (trim_cut) until = monotonic_ns() + kTrimIdleNs;
      remaining(until, &ts, &ms);
      rc = real().ppoll(kfds, k, until < 0 ? nullptr : &ts, mask);
      err = errno;
      if (rc == 0 && trim_cut) {
        trim_due = false;
        for (nfds_t i = 0; i < n; ++i)
          if (ConnectionState* c = as_conn(refs[i])) (void)c->stream().trim();
      }
    }
    for (nfds_t i = 0; i < n; ++i)
      if (ConnectionState* c = as_conn(refs[i])) {
        Channel& ch = c->stream().channel();
        if (!now_ready && kfds[i].revents && ch.drain_wakeups()) c->wake.kick(true);
        ch.disarm(armed[i]);
        c->wake.leave(tickets[i]);
      }
    if (rc < 0 && err == EINTR) return -EINTR;
    if (rc < 0) return -err;
    iter = -1;  // the next pass (0) looks at everything, kernel members included
  }
}

// Polls a set in which some sockets are still pairing: each of those waits
// on its pairing's eventfd and shows no event; when one resolves, the poll
// starts over with what it became.
int poll_with_pending(pollfd* fds, nfds_t n, int64_t timeout_ns, const sigset_t* mask) {
  const int64_t deadline = timeout_ns < 0 ? -1 : monotonic_ns() + timeout_ns;
  std::vector<pollfd> v(fds, fds + n);
  std::vector<char> swapped(n);
  std::vector<FdRef> held(n);  // keeps each swapped-in eventfd open
  for (;;) {
    bool any = false;
    for (nfds_t i = 0; i < n; ++i) {
      v[i] = fds[i];
      swapped[i] = 0;
      held[i].reset();
      if (fds[i].fd < 0 || !fd_table().has(fds[i].fd)) continue;
      FdRef r = pending_settle(fds[i].fd, fd_table().get(fds[i].fd));
      if (r && r.get()->kind() == FdState::Kind::kPending && !r.as<PendingState>()->live()) {
        v[i] = {r.as<PendingState>()->event_fd(), POLLIN, 0};
        swapped[i] = any = true;
        held[i] = std::move(r);
      }
    }
    int64_t left = deadline < 0 ? -1 : std::max<int64_t>(0, deadline - monotonic_ns());
    int rc = poll_core(v.data(), n, left, mask);
    if (rc == kHasPending) continue;  // another connect began meanwhile
    if (rc < 0) return rc;
    int ready = 0;
    bool resolved = false;
    for (nfds_t i = 0; i < n; ++i) {
      fds[i].revents = swapped[i] ? 0 : v[i].revents;
      if (swapped[i] && v[i].revents) resolved = true;
      if (fds[i].revents) ++ready;
    }
    if (ready > 0 || (!resolved && rc == 0) || !any) return ready;
  }
}

}  // namespace

int rs_poll(pollfd* fds, nfds_t n, int64_t timeout_ns, const sigset_t* mask) {
  int rc = poll_core(fds, n, timeout_ns, mask);
  return rc == kHasPending ? poll_with_pending(fds, n, timeout_ns, mask) : rc;
}

// ---- select ---------------------------------------------------------------

int rs_select(int nfds, fd_set* r, fd_set* w, fd_set* e, int64_t timeout_ns, const sigset_t* mask) {
  std::vector<pollfd> p;
  for (int fd = 0; fd < nfds; ++fd) {
    short ev = 0;
    if (r && FD_ISSET(fd, r)) ev |= POLLIN;
    if (w && FD_ISSET(fd, w)) ev |= POLLOUT;
    if (e && FD_ISSET(fd, e)) ev |= POLLPRI;
    if (ev) p.push_back({fd, ev, 0});
  }
  int rc = rs_poll(p.data(), p.size(), timeout_ns, mask);
  if (rc < 0) return rc;
  int count = 0;
  for (auto& q : p) {
    if (q.revents & POLLNVAL) return -EBADF;
    bool rd = q.revents & (POLLIN | POLLHUP | POLLERR);
    bool wr = q.revents & (POLLOUT | POLLERR);
    bool ex = q.revents & POLLPRI;
    if (r && FD_ISSET(q.fd, r)) {
      if (rd && (q.events & POLLIN))
        ++count;
      else
        FD_CLR(q.fd, r);
    }
    if (w && FD_ISSET(q.fd, w)) {
      if (wr && (q.events & POLLOUT))
        ++count;
      else
        FD_CLR(q.fd, w);
    }
    if (e && FD_ISSET(q.fd, e)) {
      if (ex)
        ++count;
      else
        FD_CLR(q.fd, e);
    }
  }
  return count;
}

// ---- epoll ----------------------------------------------------------------

int rs_epoll_create(int flags) {
  int fd = real().epoll_create1(flags);
  return fd < 0 ? -errno : fd;
}

namespace {

// Undoes a connection member's arms.
void disarm_member(EpollMember& m) {
  wake_member(m, false);
  drop_own_arm(m);
  clear_arms(m);
}

// Sets a member's events and data (ADD, MOD): reported afresh.
void set_events(EpollMember& m, const epoll_event& ev) {
  wake_member(m, m.owner && m.owner->waiting > 0);
  m.reported = false;
  m.active_ms = -1;  // active: stamped at the next sleep
  m.events = ev.events;
  m.data = ev.data;
  m.disabled = false;
  m.last_mask = 0;
  m.last_rx = m.last_tx = ~0ull;
  m.tcp_news = true;
  m.tcp_kev = 0;  // a report from before the change: a look polls afresh
}

// Drops a member's kernel registrations and its reference count.
// file_ends: epoll_forget's (the close of m's fd ends the file m's
// registration was made on, if made under that fd).
void unregister(EpollState& s, EpollMember& m, bool file_ends = false) {
  if (m.parked) --s.parked;
  disarm_member(m);
  // The registration of the wakeup fd goes with the last member on it;
  // until then it names one that stays.
  EpollMember* heir = nullptr;
  int twins = 0;
  for_each_twin(s, m, [&](EpollMember& o) {
    if (!heir) heir = &o;
    ++twins;
  });
  if (heir) {
    epoll_event kev = {};
    kev.events = heir->kernel_mask;
    kev.data.u64 = tag_of(heir->fd, heir->tag_gen);
    real().epoll_ctl(s.epfd, EPOLL_CTL_MOD, m.reg_fd, &kev);
    if (twins == 1) heir->wait_shared = false;
  } else if (!(file_ends && m.reg_fd == m.fd)) {
    // (Else the kernel drops it with the file, as it does on kernel TCP.)
    real().epoll_ctl(s.epfd, EPOLL_CTL_DEL, m.reg_fd, nullptr);
  }
  if (m.stale)
    real().epoll_ctl(s.epfd, EPOLL_CTL_DEL, m.stale.as<PendingState>()->event_fd(), nullptr);
  m.st.get()->epoll_refs.fetch_sub(1);
}

// EPOLL_CTL_DEL of a connection: everything of unregister() but the
// kernel's registration of its wakeup fd (level-triggered, and still
// drained by filter_kernel), which stays until the same connection is added again under
// the same fd, its fd is closed, or a wait finds no other member. Event
// loops that remove and re-add a connection around every request (hiredis,
// redis-benchmark) then pay no epoll_ctl for it. Under s.mu.
void park(EpollState& s, EpollMember& m) {
  disarm_member(m);
  m.parked = true;
  ++s.parked;
}

// Unregisters every parked member. Under s.mu.
void purge_parked(EpollState& s) {
  for (auto it = s.members.begin(); s.parked > 0 && it != s.members.end();) {
    if (!it->second.parked) {
      ++it;
      continue;
    }
    unregister(s, it->second);
    unlink_awake(it->second);
    it = s.members.erase(it);
  }
}

// A reference to an epoll set's shadow for the length of one call. Each
// thread keeps a counted reference to the set it used last; while epfd
// still holds that set, a call borrows it and touches no shared word. A
// lookup is otherwise a slot lock, a ref and an unref (three atomic
// operations): event loops that remove and re-add a connection around
// every request (hiredis, redis-benchmark) make about seven per request.
// The kept reference only delays the free of a closed set's memory (its
// members went at its close) until the thread uses another set or exits.
struct LastSet {
  FdState* st;    // holds one reference; nullptr: none
  int borrowers;  // this thread's SetRefs of st, or 1 while st changes: a
                  // signal handler's call may nest, and then takes its own
};
constinit thread_local LastSet t_last_set = {nullptr, 0};
pthread_key_t g_last_set_key;  // its destructor drops the reference at thread exit
bool g_last_set_key_made = false;  // without a key, no thread keeps a set

void drop_last_set(void*) {
  FdState* st = t_last_set.st;
  t_last_set.st = nullptr;
  if (st) st->unref();
}

class SetRef {
 public:
  explicit SetRef(int epfd) {
    LastSet& t = t_last_set;
    // Counted before the look: a handler that runs in between then leaves
    // t.st alone.
    ++t.borrowers;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    FdState* now = fd_table().peek(epfd);
    if (now && now == t.st) {
      borrowed_ = true;
      s_ = static_cast<EpollState*>(now);
      return;
    }
    std::atomic_signal_fence(std::memory_order_seq_cst);
    --t.borrowers;
    owned_ = fd_table().get(epfd);
    if (!owned_ || owned_.get()->kind() != FdState::Kind::kEpoll) return;
    s_ = owned_.as<EpollState>();
    if (t.borrowers == 0) keep(t);
  }
  ~SetRef() {
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (borrowed_) --t_last_set.borrowers;
  }
  SetRef(const SetRef&) = delete;
  SetRef& operator=(const SetRef&) = delete;
  EpollState* get() const { return s_; }

 private:
  void keep(LastSet& t) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, [] {
      g_last_set_key_made = pthread_key_create(&g_last_set_key, drop_last_set) == 0;
    });
    // Without a key (or the key's slot) the reference would outlive the
    // thread: keep nothing then.
    if (!g_last_set_key_made) return;
    ++t.borrowers;  // a nested call leaves t alone meanwhile
    std::atomic_signal_fence(std::memory_order_seq_cst);
    if (pthread_setspecific(g_last_set_key, &t) != 0) {  // non-null: the destructor runs
      --t.borrowers;
      return;
    }
    FdState* old = t.st;
    owned_.get()->ref();
    t.st = owned_.get();
    std::atomic_signal_fence(std::memory_order_seq_cst);
    --t.borrowers;
    if (old) old->unref();
  }
  FdRef owned_;
  EpollState* s_ = nullptr;
  bool borrowed_ = false;
};

// Member m joins o's kernel registration (same connection, same wakeup fd:
// twins). Shared, it watches every direction (kernel_events). Under s.mu.
void share_registration(EpollState& s, EpollMember& o, EpollMember& m) {
  o.wait_shared = m.wait_shared = true;
  if (const uint32_t k = kernel_events(o, o.events); k != o.kernel_mask) {
    epoll_event kev = {};
    kev.events = o.kernel_mask = k;
    kev.data.u64 = tag_of(o.fd, o.tag_gen);
    real().epoll_ctl(s.epfd, EPOLL_CTL_MOD, o.reg_fd, &kev);
  }
  m.kernel_mask = o.kernel_mask;
}

// Creates epfd's shadow (with the set's first shadowed member) unless it
// has one. Returns 0 or -errno.
int make_shadow(int epfd, bool* made) {
  *made = false;
  if (fd_table().has(epfd)) return 0;
  if (real().fcntl(epfd, F_GETFD) < 0) return -EBADF;
  *made = true;
  auto* s = new EpollState(epfd);
  fd_table().set(epfd, s);
  s->unref();
  std::lock_guard<std::mutex> lock(g_sets_mu);
  live_sets().push_back(s);
  return 0;
}

// ADD, MOD or DEL of fd in s, where fd has a member (parked or not) at
// `it`; `same`: fd still names the member's state. Returns the result, or
// kAddAfresh when an ADD is to register fd's state as a new member (the
// parked member of another state it replaces has gone). Under s.mu.
constexpr int kAddAfresh = 1;
int ctl_member(EpollState& s, std::map<int, EpollMember>::iterator it, int op,
               const epoll_event* ev, bool same) {
  EpollMember& m = it->second;
  if (m.parked) {
    // Gone for the application; an ADD of the same connection takes it back.
    if (op != EPOLL_CTL_ADD) return -ENOENT;
    if (!same) {
      unregister(s, m);
      unlink_awake(it->second);
      s.members.erase(it);
      return kAddAfresh;
    }
    m.parked = false;
    --s.parked;
    set_events(m, *ev);
    return 0;
  }
  switch (op) {
    case EPOLL_CTL_ADD:
      return -EEXIST;
    case EPOLL_CTL_MOD:
      set_events(m, *ev);
      return 0;
    case EPOLL_CTL_DEL:
      if (m.conn() && !m.stale) {
        park(s, m);
      } else {
        unregister(s, m);
        unlink_awake(it->second);
        s.members.erase(it);
      }
      return 0;
    default:
      return -EINVAL;
  }
}

// epoll_ctl where fd still names the connection of a member (or a parked
// one) of epfd's set: the common case of an event loop, which needs no
// reference to fd's state (the member holds one). Returns false when the
// general path must decide; else *r is the result.
bool ctl_known_member(int epfd, int op, int fd, const epoll_event* ev, int* r) {
  if (op != EPOLL_CTL_DEL && ev == nullptr) return false;
  FdState* now = fd_table().peek(fd);
  if (now == nullptr) return false;  // a kernel fd: the set is not looked at
  SetRef set(epfd);
  EpollState* s = set.get();
  if (!s) return false;
  std::lock_guard<std::mutex> lock(s->mu);
  auto it = s->members.find(fd);
  if (it == s->members.end() || it->second.st.get() != now || !it->second.conn()) return false;
  *r = ctl_member(*s, it, op, ev, true);
  if (*r == 0 && op != EPOLL_CTL_DEL) kick_set(*s, false);
  return true;
}

}  // namespace

int rs_epoll_ctl(int epfd, int op, int fd, epoll_event* ev) {
  if (int r; ctl_known_member(epfd, op, fd, ev, &r)) return r;
  FdRef st = fd_table().get(fd);
  if (st && st.get()->kind() == FdState::Kind::kPending && st.as<PendingState>()->resolved()) {
    // An outcome whose members may still be being converted: the set's
    // registrations are the pairing's until then. A DEL of a connection
    // left on TCP would reach the kernel before the conversion's
    // registration (ENOENT; ab aborts on it). A pairing not resolved yet
    // stays pending here: the branch below decides under g_sets_mu.
    auto* p = st.as<PendingState>();
    while (!p->converted()) sched_yield();
    st = pending_settle(fd, std::move(st));
  }
  const bool pending = st && st.get()->kind() == FdState::Kind::kPending;
  if (!as_conn(st) && !pending) {
    int r = real().epoll_ctl(epfd, op, fd, ev);
    return r < 0 ? -errno : 0;
  }
  if (op != EPOLL_CTL_DEL && ev == nullptr) return -EFAULT;
  bool made = false;
  if (int err = make_shadow(epfd, &made)) return err;
  SetRef set(epfd);
  EpollState* s = set.get();
  if (!s) return -EINVAL;
  // A pending member is added under g_sets_mu, which its resolution takes
  // too: it is either converted by it or sees it done. One whose bytes go
  // on TCP meanwhile (RSOCK_TCP_FIRST) is that connection's member.
  std::unique_lock<std::mutex> sets_lock(g_sets_mu, std::defer_lock);
  if (pending) {
    sets_lock.lock();
    if (st.as<PendingState>()->resolved()) {
      sets_lock.unlock();
      return rs_epoll_ctl(epfd, op, fd, ev);  // now the outcome's
    }
    st = pending_live(std::move(st));
  }
  std::lock_guard<std::mutex> lock(s->mu);
  auto it = s->members.find(fd);
  if (it != s->members.end()) {
    const int r = ctl_member(*s, it, op, ev, it->second.st.get() == st.get());
    if (r != kAddAfresh) {
      if (r == 0 && op != EPOLL_CTL_DEL) kick_set(*s, made);
      return r;
    }
  } else if (op != EPOLL_CTL_ADD) {
    return -ENOENT;
  }
  // An ADD: the kernel watches the member's wakeup fd (level-triggered,
  // drained by us), tagged with the application's fd.
  EpollMember m;
  m.st = std::move(st);
  epoll_event kev = {};
  kev.events = m.kernel_mask = kernel_events(m, ev->events);
  m.tag_gen = s->adds++ & kTagGenMask;
  kev.data.u64 = tag_of(fd, m.tag_gen);
  m.reg_fd = m.wait_fd();
  if (real().epoll_ctl(epfd, EPOLL_CTL_ADD, m.reg_fd, &kev) < 0) {
    if (errno != EEXIST) return -errno;
    // Another fd of the same connection holds the registration. A parked
    // one goes, and the ADD is tried once more; a member stays, and the
    // two share it (the kernel keys a registration by fd and file, and
    // reports each).
    if (s->parked > 0) purge_parked(*s);
    if (real().epoll_ctl(epfd, EPOLL_CTL_ADD, m.reg_fd, &kev) < 0) {
      if (errno != EEXIST || !m.conn()) return -errno;
      EpollMember* twin = nullptr;
      for (auto& [ofd, o] : s->members)
        if (o.st.get() == m.st.get() && o.reg_fd == m.reg_fd) twin = &o;
      if (!twin) return -EEXIST;
      share_registration(*s, *twin, m);
    }
  }
  set_events(m, *ev);
  // A member on kernel TCP whose socket the kernel has just begun to watch
  // (alone: no twin) needs no look now: the kernel reports the new
  // registration at once if the socket is ready for what the member
  // watches, and at every change after, and the look that report brings
  // takes the kernel's events instead of a poll.
  if (ConnectionState* c = m.conn(); c && !m.wait_shared && !c->next()) {
    Stream& st = c->stream();
    if (m.kernel_mask != EPOLLIN && st.rx_on_tcp() && st.tx_on_tcp() && st.peer_sends_on_tcp()) {
      m.tcp_news = false;
      m.tcp_conn = c;
    }
  }
  m.st.get()->epoll_refs.fetch_add(1);
  EpollMember& added = s->members.emplace(fd, std::move(m)).first->second;
  added.fd = fd;
  added.owner = s;
  link_awake(added);
  kick_set(*s, made);
  return 0;
}

// Registers outcome's wakeup fd for member m (key fd) in the kernel's set.
// A dup'd fd of the same connection converted before it holds that
// registration already (EEXIST): the two share it, as an ADD would have
// them (rs_epoll_ctl).
void register_converted(EpollState& s, EpollMember& m, int fd) {
  epoll_event kev = {};
  kev.data.u64 = tag_of(fd, m.tag_gen);
  kev.events = m.kernel_mask = kernel_events(m, m.events);
  m.reg_fd = m.wait_fd();
  if (real().epoll_ctl(s.epfd, EPOLL_CTL_ADD, m.reg_fd, &kev) == 0 || errno != EEXIST) return;
  for (auto& [ofd, o] : s.members) {
    if (&o != &m && o.st.get() == m.st.get() && o.reg_fd == m.reg_fd) share_registration(s, o, m);
  }
}

// The kernel takes the application's registration of fd over (a pairing
// that ended on plain TCP); under g_sets_mu.
static void hand_plain(EpollState& s, int fd, epoll_event& kev) {
  if (real().epoll_ctl(s.epfd, EPOLL_CTL_ADD, fd, &kev) != 0) return;
  s.plain_handed.push_back(fd);
  g_plain_handed.fetch_add(1);
}

void epoll_pending_resolved(FdState* pending, FdState* outcome,
                            const std::function<void()>& publish) {
  std::lock_guard<std::mutex> lock(g_sets_mu);
  publish();
  for (EpollState* s : live_sets()) {
    std::lock_guard<std::mutex> l2(s->mu);
    // Every member on the pairing: its fd, and the dup'd fds of it that the
    // set holds too, each keyed by its own number.
    for (auto it = s->members.begin(); it != s->members.end();) {
      EpollMember& m = it->second;
      const int fd = it->first;
      if (m.st.get() != pending) {
        ++it;
        continue;
      }
      bool erase = false;
      if (m.conn()) {
        // The connection the fd used meanwhile (RSOCK_TCP_FIRST): its arms
        // go, and its wakeup fd (a dup of the socket, whose file stays open)
        // leaves the kernel's set (ENOENT for a twin that shared it).
        disarm_member(m);
        real().epoll_ctl(s->epfd, EPOLL_CTL_DEL, m.reg_fd, nullptr);
        m.wait_shared = false;
        if (outcome) {
          outcome->ref();
          m.st = FdRef(outcome);
          m.tcp_kev = 0;  // the pairing's report: the outcome looks anew
          outcome->epoll_refs.fetch_add(1);
          register_converted(*s, m, fd);
          // The successor goes on from the same counts (Stream::continue_from,
          // and the generations count from the stream's first byte): an
          // edge-triggered member reports what is new since its last report,
          // not the switch.
        } else if (m.parked) {
          // The application deleted it (parked: kept for an ADD to take
          // back): it stays out of the kernel's set, where an ADD of it
          // would then fail with EEXIST.
          --s->parked;
          erase = true;
        } else {
          epoll_event kev = {};
          kev.events = m.disabled ? 0 : m.events;
          kev.data = m.data;
          hand_plain(*s, fd, kev);
          erase = true;
        }
      } else if (outcome) {
        // Watch the channel from now on; the pairing's eventfd stays until a
        // wait sees it fire, so that a thread asleep in epoll_wait wakes up.
        outcome->ref();
        m.stale = std::move(m.st);
        m.st = FdRef(outcome);
        m.tcp_kev = 0;
        outcome->epoll_refs.fetch_add(1);
        register_converted(*s, m, fd);
        m.last_mask = 0;
        m.last_rx = m.last_tx = ~0ull;
      } else {
        // Plain TCP: the kernel takes the application's registration over.
        epoll_event kev = {};
        kev.events = m.disabled ? 0 : m.events;
        kev.data = m.data;
        real().epoll_ctl(s->epfd, EPOLL_CTL_DEL, m.reg_fd, nullptr);
        hand_plain(*s, fd, kev);
        erase = true;
      }
      if (erase) {
        unlink_awake(m);
        it = s->members.erase(it);
      } else {
        ++it;
      }
      // Only now: a close() of fd that sees no reference left skips
      // epoll_forget (and our lock) and closes at once, so it must not see
      // that before the epoll_ctl on fd above is done, or the number could
      // name another file by then.
      pending->epoll_refs.fetch_sub(1);
    }
  }
}

int rs_epoll_wait_unshadowed(int epfd, epoll_event* events, int maxevents, int timeout_ms,
                             const timespec* ts, bool use_ts, const sigset_t* mask) {
  g_unshadowed_waiters.fetch_add(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (fd_table().has(epfd)) {  // a shadow came meanwhile: the full wait
    g_unshadowed_waiters.fetch_sub(1, std::memory_order_relaxed);
    return rs_epoll_wait(epfd, events, maxevents, timeout_ms, mask);
  }
  const int64_t entered = monotonic_ns();
  const int r = use_ts ? real().epoll_pwait2(epfd, events, maxevents, ts, mask)
                       : real().epoll_pwait(epfd, events, maxevents, timeout_ms, mask);
  const int err = errno;
  g_unshadowed_waiters.fetch_sub(1, std::memory_order_relaxed);
  if (r < 0) return -err;
  if (r == 0 || !epoll_events_internal(events, r)) return r;
  return rs_epoll_after_kernel_wait(epfd, events, maxevents, r, timeout_ms, mask, entered);
}

bool epoll_events_internal(const epoll_event* ev, int n) {
  for (int i = 0; i < n; ++i) {
    const uint64_t tag = ev[i].data.u64 & kTagMask;
    if (tag == kTag || tag == kKickTag) return true;
  }
  return false;
}

int rs_epoll_after_kernel_wait(int epfd, epoll_event* events, int maxevents, int r, int timeout_ms,
                               const sigset_t* mask, int64_t entered_ns) {
  // Another thread added an accelerated member while this one slept in the
  // kernel, and the member's wakeup fd fired: the event is ours (its data
  // is our tag, which the application must never see). It goes through the
  // set's shadow as in any wait; with nothing left for the application the
  // wait goes on for what is left of its timeout, now with the shadow.
  int n = 0;
  {
    SetRef set(epfd);
    if (EpollState* s = set.get()) {
      n = filter_kernel(*s, events, r, nullptr);
      n += collect(*s, events + n, maxevents - n);
    } else {
      // No shadow: none of ours is registered (they go with it), so these
      // are the application's own, whatever their data looks like.
      n = r;
    }
  }
  if (n > 0) return n;
  int left = timeout_ms;
  if (timeout_ms > 0) {
    const int64_t spent_ms = (monotonic_ns() - entered_ns) / 1000000;
    left = spent_ms >= timeout_ms ? 0 : timeout_ms - static_cast<int>(spent_ms);
  }
  return rs_epoll_wait(epfd, events, maxevents, left, mask);
}

int rs_epoll_wait(int epfd, epoll_event* events, int maxevents, int timeout_ms,
                  const sigset_t* mask) {
  if (maxevents <= 0) return -EINVAL;
  SetRef set(epfd);
  EpollState* s = set.get();
  bool empty = true;
  if (s) {
    std::lock_guard<std::mutex> lock(s->mu);
    // Parked members alone: they go, and the kernel does the wait.
    if (s->parked > 0 && s->members.size() == static_cast<size_t>(s->parked)) purge_parked(*s);
    empty = s->members.empty();
    if (empty) ++s->waiting;  // an ADD meanwhile wakes us (kick_set)
  }
  if (empty) {
    const int64_t entered = monotonic_ns();
    int r = real().epoll_pwait(epfd, events, maxevents, timeout_ms, mask);
    const int err = errno;
    if (s) {
      std::lock_guard<std::mutex> lock(s->mu);
      --s->waiting;
    }
    errno = err;
    if (r <= 0 || !epoll_events_internal(events, r)) return r < 0 ? -errno : r;
    return rs_epoll_after_kernel_wait(epfd, events, maxevents, r, timeout_ms, mask, entered);
  }
  const int64_t start = monotonic_ns();
  const int64_t deadline = timeout_ms < 0 ? -1 : start + int64_t{timeout_ms} * 1000000;
  int64_t spin_end = start + s->spin.budget(spin_budget_ns());
  bool spinning = true;  // no sleep yet in this call
  for (int iter = 1;; ++iter) {
    const int64_t now = iter == 1 ? start : monotonic_ns();  // one clock read per pass
    const bool last = deadline >= 0 && now >= deadline;
    // The kernel first: draining a member's wakeup fd may learn that its
    // peer is gone (a FIN or a reset on the kernel socket), which the
    // members' look below then reports, in this very call. Shared-memory
    // members are not probed one by one (see collect). The first pass
    // looks as if members were ready (by time), later ones as a waiter.
    auto ask_kernel = [&](epoll_event* out, int max) {
      int k = max > 0 ? real().epoll_wait(epfd, out, max, 0) : 0;
      return k > 0 ? filter_kernel(*s, out, k, nullptr) : 0;
    };
    int n = 0;
    bool ring = false;
    bool looked = false;
    if (iter == 1 && !s->ring_seen.load(std::memory_order_relaxed)) {
      // The last wait's members were all on kernel TCP, whose news only the
      // kernel tells: the kernel wait below asks it (and returns at once
      // when it has any), so this pass does not ask first (one system call
      // less per wait), unless the members' look finds something after
      // all: one that switched to a transport meanwhile, or one
      // level-triggered and still ready (kernel fds must not starve).
      // One look under the set's lock: a pairing that ends on plain TCP
      // meanwhile (epoll_pending_resolved, under the lock too) would else
      // have its member reported here and the kernel's registration it
      // hands over reported again below, one fd twice in one answer (which
      // a loop that closes the fd at the first takes for a closed fd's, or
      // a freed object's, at the second).
      std::lock_guard<std::mutex> lock(s->mu);
      n = collect_locked(*s, events, maxevents, OnTcp::kLook, &ring);
      if ((n > 0 || ring) && look_at_kernel(true, last, iter, now, &s->kernel_look)) {
        looked = true;
        if (const uint32_t us = test_epoll_pause_us()) usleep(us);  // tests only
        int k = maxevents > n ? real().epoll_wait(epfd, events + n, maxevents - n, 0) : 0;
        k = k > 0 ? filter_kernel_locked(*s, events + n, k, nullptr) : 0;
        // With nothing of ours yet, the kernel's news of members counts too.
        n = n > 0 ? n + k : k + collect_locked(*s, events + k, maxevents - k);
      }
    } else {
      looked = look_at_kernel(iter == 1, last, iter, now, &s->kernel_look);
      if (looked) n = ask_kernel(events, maxevents);
      n += collect(*s, events + n, maxevents - n, looked || iter == 1 ? OnTcp::kLook : OnTcp::kSkip,
                   &ring);
    }
    if (iter == 1) s->ring_seen.store(ring, std::memory_order_relaxed);
    // Members all on kernel TCP: only the kernel can tell news, and it
    // tells a sleeper. No spin.
    if (iter == 1 && !ring) {
      spin_end = start;
      spinning = false;
    }
    // A first pass that is also the last (timeout 0) and found nothing
    // asks the kernel before it answers so.
    if (n == 0 && last && !looked) {
      s->kernel_look.store(now, std::memory_order_relaxed);
      n = ask_kernel(events, maxevents);
      n += collect(*s, events + n, maxevents - n);
    }
    if (n > 0) {
      if (spinning && iter > 1) s->spin.caught();
      return n;
    }
    if (last) return 0;
    if (now < spin_end) {
      continue;
    }
    if (spinning) s->spin.missed();
    spinning = false;
    // Block: join the members' hubs (so that a doorbell another thread of
    // ours drains reaches us too) and arm them, re-check, then sleep.
    std::vector<Joined> joined;
    bool blind = false;
    {
      // Members idle for a while first give their rings' pages back.
      std::vector<FdRef> idle;
      take_due_trims(*s, now / 1000000, &idle);
      for (FdRef& r : idle) r.as<ConnectionState>()->stream().trim();
    }
    std::vector<FdRef> relieve;
    const uint64_t sleep = arm_all(*s, &joined, &blind, now / 1000000, &relieve);
    for (FdRef& r : relieve) (void)r.as<ConnectionState>()->stream().relieve();
    n = collect(*s, events, maxevents);
    int k = 0, err = 0;
    if (n == 0) {
      timespec ts;
      int ms;
      int64_t until = deadline;
      // A hub the set cannot watch (out of fds): sleep in slices.
      if (blind && (until < 0 || until > monotonic_ns() + WakeHub::kBlindSliceNs))
        until = monotonic_ns() + WakeHub::kBlindSliceNs;
      // Up to the time a member will have been idle long enough to trim.
      if (const int64_t due = s->trim_due_ms.load(std::memory_order_relaxed);
          due != 0 && (until < 0 || until > due * 1000000))
        until = due * 1000000;
      remaining(until, &ts, &ms);
      k = real().epoll_pwait(epfd, events, maxevents, ms, mask);
      err = errno;
      if (k > 0) n = filter_kernel(*s, events, k, &joined);
    }
    disarm_all(*s, &joined, sleep);
    if (k < 0 && err == EINTR) return -EINTR;
    if (k < 0) return -err;
    // Kernel members woke us: add whatever accelerated ones are ready too
    // (not when n came from the re-check above: those are collected). The
    // wait drained the kernel's news of our members (filter_kernel): they
    // are looked at now, with no second ask of the kernel.
    if (k > 0) n += collect(*s, events + n, maxevents - n);
    if (n > 0) return n;
    iter = -1;  // the next pass (0) looks at the kernel members too
  }
}

void epoll_after_fork_child() {
  // Only the forking thread runs here: whoever the parent counted as asleep
  // is not (the sets' locks are not taken: their holders are gone too).
  // Dormant members' arms and hub tickets are the parent's (its sets sleep
  // on them): forgotten, not undone.
  g_unshadowed_waiters.store(0, std::memory_order_relaxed);
  for (EpollState* s : live_sets()) {
    s->waiting = 0;
    s->lent = 0;
    for (auto& [fd, m] : s->members) {
      // The parent's waits' arms are theirs to undo, not ours.
      m.armed_data = m.armed_space = 0;
      ++m.arm_gen;
      if (m.dormant || m.lent) {
        m.dormant = m.fresh = m.lent = m.dorm_data = m.dorm_space = false;
        m.dorm_ticket = WakeHub::Ticket{};
        m.quiet = 0;
        link_awake(m);
      }
    }
  }
}

bool epoll_plain_handed() { return g_plain_handed.load() != 0; }

void epoll_forget(int fd, bool file_ends) {
  std::lock_guard<std::mutex> lock(g_sets_mu);
  for (EpollState* s : live_sets()) {
    std::lock_guard<std::mutex> l2(s->mu);
    if (auto h = std::find(s->plain_handed.begin(), s->plain_handed.end(), fd);
        h != s->plain_handed.end()) {
      real().epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, nullptr);
      s->plain_handed.erase(h);
      g_plain_handed.fetch_sub(1);
    }
    auto it = s->members.find(fd);
    if (it == s->members.end()) continue;
    unregister(*s, it->second, file_ends);
    unlink_awake(it->second);
    s->members.erase(it);
  }
}

}  // namespace rsock
