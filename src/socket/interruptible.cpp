// Blocking sleeps with the kernel's signal semantics (see interruptible.h).
#include "socket/interruptible.h"

#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/own_fd.h"
#include "common/real.h"
#include "fdtable/fdtable.h"

namespace rsock {
namespace {

// Each thread keeps the signalfd of its sleeps (making one and closing it
// cost about 2.6 us of cpu per sleep, much of it after the wakeup, on the
// way to the reply). The application owns the fd numbers: a loop of
// close() over them, a dup2 onto ours or a close_range may close it, and
// the number may then name another file. So the fd is entered in the fd
// table under a state of its own; the close and close_range wrappers clear
// the entry before the kernel's call, dup2 and dup3 right after it, and a
// thread uses its fd only while the entry is still its state. Its mask is
// the one it was made with: a thread whose unblocked signals changed since
// replaces it.
class KeptSignalFd final : public FdState {
 public:
  KeptSignalFd() : FdState(Kind::kInternal) {}
};

struct ThreadSignalFd {
  int fd = -1;
  KeptSignalFd* st = nullptr;  // holds a reference; nullptr: none
  sigset_t mask = {};
};
constinit thread_local ThreadSignalFd t_signalfd;
pthread_key_t g_signalfd_key;  // its destructor closes the thread's at thread exit
bool g_signalfd_key_made = false;  // without a key, no thread keeps one

// Forgets the thread's signalfd, closing it while the number is still ours.
void drop_signalfd(ThreadSignalFd& t) {
  if (!t.st) return;
  if (fd_table().replace(t.fd, t.st, nullptr)) real().close(t.fd);
  t.st->unref();
  t.st = nullptr;
  t.fd = -1;
}

void drop_at_thread_exit(void*) { drop_signalfd(t_signalfd); }

// (Not memcmp: sigemptyset clears only the words the kernel uses.)
bool same_signals(const sigset_t& a, const sigset_t& b) {
  for (int sig = 1; sig < NSIG; ++sig)
    if (sigismember(&a, sig) != sigismember(&b, sig)) return false;
  return true;
}

// A signalfd of `watch` lifted above the application's numbers, as
// librsock's other fds are; -1 when none can be made.
int new_signalfd(const sigset_t& watch) {
  return lift_fd(signalfd(-1, &watch, SFD_NONBLOCK | SFD_CLOEXEC));
}

// The thread's signalfd for `watch`: its kept one, or a new one, kept when
// possible (it replaces a kept one of other signals: a thread that changes
// its mask for good pays one signalfd, not one per sleep). *fresh: not
// kept, the caller closes it after the sleep. -1 when none can be made.
// Called with every signal blocked: no handler of this thread runs in
// between.
int signalfd_for(const sigset_t& watch, bool* fresh) {
  ThreadSignalFd& t = t_signalfd;
  *fresh = false;
  if (t.st && fd_table().peek(t.fd) == t.st && same_signals(t.mask, watch)) return t.fd;
  // Closed by the application (its entry went first), or of other signals.
  drop_signalfd(t);
  const int fd = new_signalfd(watch);
  if (fd < 0) return -1;
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, [] {
    g_signalfd_key_made = pthread_key_create(&g_signalfd_key, drop_at_thread_exit) == 0;
  });
  // Without a key (or the key's slot) the fd would outlive the thread.
  if (!g_signalfd_key_made || pthread_setspecific(g_signalfd_key, &t) != 0) {
    *fresh = true;
    return fd;
  }
  auto* st = new KeptSignalFd;  // our reference
  if (!fd_table().set(fd, st)) {
    st->unref();
    *fresh = true;
    return fd;
  }
  t.fd = fd;
  t.st = st;
  t.mask = watch;
  return fd;
}

// poll(2)'s timeout until deadline_ns: -1 for none, rounded up to a whole ms.
int poll_ms(int64_t deadline_ns) {
  if (deadline_ns < 0) return -1;
  const int64_t left = deadline_ns - monotonic_ns();
  if (left <= 0) return 0;
  const int64_t ms = (left + 999999) / 1000000;
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

bool runs_handler(int sig, struct sigaction* sa) {
  if (sigaction(sig, nullptr, sa) != 0) return false;
  // SIG_DFL either ignores the signal, stops the process (a stop and a
  // continue restart the call without a word) or ends the process.
  return sa->sa_handler != SIG_DFL && sa->sa_handler != SIG_IGN;
}

// Of the signals in `set` (pending and now to be delivered), the first one
// whose handler the kernel would run decides the call's fate, as it does in
// the kernel: the signal frames of any others are set up after the system
// call's return value is settled. The kernel takes synchronous signals first
// (next_signal()), then the lowest number. Returns false when none of them
// runs a handler.
bool first_handler(const sigset_t& set, struct sigaction* sa) {
  static const int kSynchronous[] = {SIGSEGV, SIGBUS, SIGILL, SIGTRAP, SIGFPE, SIGSYS};
  for (int sig : kSynchronous)
    if (sigismember(&set, sig) == 1 && runs_handler(sig, sa)) return true;
  for (int sig = 1; sig < NSIG; ++sig)
    if (sigismember(&set, sig) == 1 && runs_handler(sig, sa)) return true;
  return false;
}

// The fallback when no signalfd can be made: any handler ends the sleep.
int plain_sleep(int fd, int also_fd, int64_t deadline_ns, OnSignal on_signal, short events) {
  for (;;) {
    pollfd p[2] = {{fd, events, 0}, {also_fd, POLLIN, 0}};
    const int ms = poll_ms(deadline_ns);
    if (ms == 0 && deadline_ns >= 0) return 0;
    int rc = real().poll(p, 2, ms);
    if (rc > 0) return 1;
    if (rc == 0) continue;  // the deadline is checked above
    if (errno == EINTR && on_signal == OnSignal::kContinue) continue;
    return -errno;
  }
}

}  // namespace

int sleep_on_fd(int fd, int64_t deadline_ns, OnSignal on_signal, int also_fd, short events) {
  // Every signal blocked while we sleep: one that arrives stays pending, and
  // the signalfd of the signals this thread had unblocked turns readable
  // (a process-directed signal that another thread can take goes there
  // instead, as it may under the kernel too). sigfillset() leaves out
  // glibc's own signals (thread cancellation and setxid), which therefore
  // stay deliverable: cancellation still works here, a setxid handler just
  // makes poll() return EINTR.
  sigset_t all, old;
  sigfillset(&all);
  if (pthread_sigmask(SIG_BLOCK, &all, &old) != 0)
    return plain_sleep(fd, also_fd, deadline_ns, on_signal, events);
  sigset_t watch;
  sigemptyset(&watch);
  for (int sig = 1; sig < NSIG; ++sig)
    if (sigismember(&all, sig) == 1 && sigismember(&old, sig) == 0) sigaddset(&watch, sig);
  bool fresh = false;
  int sfd = signalfd_for(watch, &fresh);
  if (sfd < 0) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return plain_sleep(fd, also_fd, deadline_ns, on_signal, events);
  }
  int result = 0;
  for (;;) {
    const int ms = poll_ms(deadline_ns);
    if (ms == 0 && deadline_ns >= 0) {
      result = 0;
      break;
    }
    // A negative fd is ignored by poll.
    pollfd p[3] = {{fd, events, 0}, {sfd, POLLIN, 0}, {also_fd, POLLIN, 0}};
    const int rc = real().poll(p, 3, ms);
    if (rc < 0) {
      if (errno == EINTR) continue;  // glibc's setxid handler ran (SA_RESTART)
      result = -errno;
      break;
    }
    if (rc > 0 && p[1].revents && !fresh && fd_table().peek(sfd) != t_signalfd.st) {
      // The application closed our kept fd meanwhile (or put another file
      // at its number): this sleep goes on with one of its own.
      sfd = new_signalfd(watch);
      if (sfd < 0) {
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
        return plain_sleep(fd, also_fd, deadline_ns, on_signal, events);
      }
      fresh = true;
      continue;
    }
    // A signal first, even when fd is ready too: its handler runs when we
    // unblock it, and a call that went on after it would have swallowed
    // the EINTR the kernel gives (the fd may be ready for another waiter).
    if (rc > 0 && p[1].revents) {
      sigset_t pending;
      sigpending(&pending);
      sigandset(&pending, &pending, &watch);
      struct sigaction sa;
      const bool handler = first_handler(pending, &sa);
      pthread_sigmask(SIG_SETMASK, &old, nullptr);  // the handlers run here
      if (handler && on_signal != OnSignal::kContinue) {
        const bool restart = on_signal == OnSignal::kRestartable && (sa.sa_flags & SA_RESTART);
        if (fresh) real().close(sfd);
        return restart ? -ERESTART : -EINTR;
      }
      // Ignored, default-ignored (queued only because we blocked it), a
      // stop and continue, or taken by another thread: the kernel would
      // have slept on.
      pthread_sigmask(SIG_BLOCK, &all, nullptr);
      continue;
    }
    if (rc > 0) {
      result = 1;
      break;
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (fresh) real().close(sfd);
  return result;
}

int sleep_on_word(std::atomic<uint32_t>* word, uint32_t expected, int64_t deadline_ns,
                  OnSignal on_signal) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  auto* addr = reinterpret_cast<uint32_t*>(word);
  for (;;) {
    long rc;
    if (deadline_ns < 0 && on_signal != OnSignal::kInterrupt) {
      // No timeout: the kernel returns ERESTARTSYS on a signal, which it
      // restarts after an SA_RESTART handler and turns into EINTR after any
      // other, exactly as it does for recv(2) on a socket without one.
      rc = syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
    } else {
      // With a timeout every handler means EINTR (ERESTART_RESTARTBLOCK),
      // as for a socket with SO_RCVTIMEO; kInterrupt without a deadline
      // gets a far one for that reason.
      const int64_t at =
          deadline_ns >= 0 ? deadline_ns : monotonic_ns() + 3600 * int64_t{1000000000};
      timespec ts = {static_cast<time_t>(at / 1000000000), static_cast<long>(at % 1000000000)};
      rc = syscall(SYS_futex, addr, FUTEX_WAIT_BITSET_PRIVATE, expected, &ts, nullptr,
                   FUTEX_BITSET_MATCH_ANY);
    }
    if (rc == 0) return 0;
    if (errno == EAGAIN) return 0;  // the word had changed
    if (errno == ETIMEDOUT) {
      if (deadline_ns >= 0) return -ETIMEDOUT;
      continue;  // the far deadline of kInterrupt
    }
    if (errno == EINTR) {
      if (on_signal == OnSignal::kContinue) continue;
      return -EINTR;
    }
    return -errno;
  }
}

void interruptible_after_fork_child() {
  // The signalfds the parent's other threads kept: those threads do not
  // exist here. The forking thread's stays (a signalfd reports the signals
  // of the process that polls it).
  // No other thread runs here: the table's bare pointers will do.
  std::vector<std::pair<int, FdState*>> theirs;
  fd_table().for_each([&](int fd, FdState* s) {
    if (s->kind() == FdState::Kind::kInternal && s != t_signalfd.st) theirs.emplace_back(fd, s);
  });
  for (auto [fd, st] : theirs)
    if (fd_table().replace(fd, st, nullptr)) real().close(fd);
}

void wake_word(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

}  // namespace rsock
