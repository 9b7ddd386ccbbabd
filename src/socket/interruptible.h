// The blocking sleeps of the application's socket calls on accelerated (and
// still pairing) sockets, with the kernel's signal semantics (signal(7)). A
// blocking recv/send on a kernel socket that a signal handler interrupts is
// restarted when the handler was installed with SA_RESTART and the socket has
// no timeout in that direction (SO_RCVTIMEO for receives, SO_SNDTIMEO for
// sends); otherwise it fails with EINTR, or returns the bytes it moved
// already. A signal that runs no handler (SIG_IGN, a default-ignored signal,
// a stop and continue) does not end it. poll/select/epoll are not here: the
// kernel never restarts them, and they sleep in the real ppoll/epoll_pwait,
// which behave so by themselves.
//
// Two sleeps: sleep_on_fd waits for fds with every signal blocked and a
// signalfd of the signals the thread had unblocked beside it, so that it
// learns which signal arrived and how its handler was installed before the
// handler runs, then unblocks them (the handlers run then) and decides as
// the kernel would. sleep_on_word waits on a futex, whose sleep the kernel
// itself ends or restarts exactly as it would a socket call's (ERESTARTSYS
// without a timeout, ERESTART_RESTARTBLOCK with one). Nothing here runs on a
// path that does not sleep. Thread-safety: everything is per calling thread.
#pragma once

#include <poll.h>

#include <atomic>
#include <cstdint>

namespace rsock {

// How a sleeping socket call answers a signal handler.
enum class OnSignal : uint8_t {
  // No timeout and no byte moved yet: a handler installed with SA_RESTART
  // restarts the call (-ERESTART), any other fails it (-EINTR).
  kRestartable,
  // A timeout is set, or the call moved bytes already: every handler ends
  // the call (-EINTR; the caller returns its count when it has one).
  kInterrupt,
  // A call the kernel never interrupts (shutdown waiting for a pairing): the
  // handlers run and the sleep goes on.
  kContinue,
};

// Sleeps until fd (or also_fd, unless it is -1) is readable (returns 1),
// deadline_ns passes (CLOCK_MONOTONIC nanoseconds, -1 for none; returns 0)
// or a signal handler ran (-EINTR, or -ERESTART under kRestartable when the
// handler had SA_RESTART). The handlers have run when it returns. Should
// the signalfd not be available (no fd left), it sleeps in a plain poll,
// where any handler means -EINTR.
int sleep_on_fd(int fd, int64_t deadline_ns, OnSignal on_signal, int also_fd = -1,
                short events = POLLIN);

// Sleeps while *word == expected: returns 0 when woken (or the value had
// changed), -ETIMEDOUT at deadline_ns, -EINTR when a handler ends the call.
// Under kRestartable the kernel restarts the sleep itself after an
// SA_RESTART handler; under kContinue a handler never ends it.
int sleep_on_word(std::atomic<uint32_t>* word, uint32_t expected, int64_t deadline_ns,
                  OnSignal on_signal);
// Wakes every thread in sleep_on_word on word.
void wake_word(std::atomic<uint32_t>* word);

// In a fork's child (after the fd table's own handler): closes the
// signalfds that the parent's other threads kept for their sleeps.
void interruptible_after_fork_child();

}  // namespace rsock
