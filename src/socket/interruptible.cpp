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

#include "common/real.h"

namespace rsock {
namespace {

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// poll(2)'s timeout until deadline_ns: -1 for none, rounded up to a whole ms.
int poll_ms(int64_t deadline_ns) {
  if (deadline_ns < 0) return -1;
  const int64_t left = deadline_ns - now_ns();
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
int plain_sleep(int fd, int also_fd, int64_t deadline_ns, OnSignal on_signal) {
  for (;;) {
    pollfd p[2] = {{fd, POLLIN, 0}, {also_fd, POLLIN, 0}};
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

int sleep_on_fd(int fd, int64_t deadline_ns, OnSignal on_signal, int also_fd) {
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
    return plain_sleep(fd, also_fd, deadline_ns, on_signal);
  sigset_t watch;
  sigemptyset(&watch);
  for (int sig = 1; sig < NSIG; ++sig)
    if (sigismember(&all, sig) == 1 && sigismember(&old, sig) == 0) sigaddset(&watch, sig);
  // A fresh signalfd per sleep: the application owns the fd numbers (a
  // close-everything loop, a dup2 over ours), and a cached one could name
  // another file by now. It costs ~0.5 us on a path that sleeps anyway.
  const int sfd = signalfd(-1, &watch, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sfd < 0) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return plain_sleep(fd, also_fd, deadline_ns, on_signal);
  }
  int result = 0;
  for (;;) {
    const int ms = poll_ms(deadline_ns);
    if (ms == 0 && deadline_ns >= 0) {
      result = 0;
      break;
    }
    // A negative fd is ignored by poll.
    pollfd p[3] = {{fd, POLLIN, 0}, {sfd, POLLIN, 0}, {also_fd, POLLIN, 0}};
    const int rc = real().poll(p, 3, ms);
    if (rc < 0) {
      if (errno == EINTR) continue;  // glibc's setxid handler ran (SA_RESTART)
      result = -errno;
      break;
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
        real().close(sfd);
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
  real().close(sfd);
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
      const int64_t at = deadline_ns >= 0 ? deadline_ns : now_ns() + 3600 * int64_t{1000000000};
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

void wake_word(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

}  // namespace rsock
