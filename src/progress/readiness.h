// Readiness for poll, select and epoll over sets that mix kernel fds and
// accelerated fds. Accelerated readiness is computed from the rings, not
// from the kernel socket (which, after the switch, only carries doorbells).
// Waiting spins briefly, then arms every accelerated member and blocks in
// the kernel on the doorbells together with the kernel members.
// Thread-safety: an epoll set's shadow is under its own mutex; poll and
// select hold references to the states they examine.
#pragma once

#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <time.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace rsock {

// poll/ppoll. timeout_ns < 0 = infinite. Returns the libc result or -errno.
int rs_poll(struct pollfd* fds, nfds_t n, int64_t timeout_ns, const sigset_t* mask);

// select/pselect. timeout_ns < 0 = infinite. Returns the libc result or -errno.
int rs_select(int nfds, fd_set* r, fd_set* w, fd_set* e, int64_t timeout_ns,
              const sigset_t* mask);

// epoll: a shadow of each epoll set records its accelerated members with
// the events and data the application asked for (level, edge, one-shot).
int rs_epoll_create(int flags);  // creates the set and its shadow
int rs_epoll_ctl(int epfd, int op, int fd, struct epoll_event* ev);
int rs_epoll_wait(int epfd, struct epoll_event* events, int maxevents, int timeout_ms,
                  const sigset_t* mask);

// A wait that went to the kernel alone (the set had no accelerated member
// when it began) must not hand the application an event of ours: another
// thread may have added an accelerated member meanwhile. Whether ev[0..n)
// holds one; then rs_epoll_after_kernel_wait() turns the kernel's r events
// into the application's (or waits on for the rest of timeout_ms, counted
// from entered_ns, CLOCK_MONOTONIC). Returns a count or -errno.
bool epoll_events_internal(const struct epoll_event* ev, int n);
// The wait of a set without a shadow (the wrappers' path): in the kernel,
// then as above. use_ts: epoll_pwait2 with ts (timeout_ms is ts rounded up,
// for what follows), else epoll_pwait with timeout_ms. Returns a count or
// -errno.
int rs_epoll_wait_unshadowed(int epfd, struct epoll_event* events, int maxevents, int timeout_ms,
                             const struct timespec* ts, bool use_ts, const sigset_t* mask);
int rs_epoll_after_kernel_wait(int epfd, struct epoll_event* events, int maxevents, int r,
                               int timeout_ms, const sigset_t* mask, int64_t entered_ns);

// In a fork's child: no thread of it sleeps on any set, and the parent's
// dormant epoll members stay the parent's.
void epoll_after_fork_child();

// Drops fd from every epoll shadow (called on its last close), and the
// registrations a pairing handed to the kernel as plain TCP under fd's
// number (which would outlive the close while librsock holds a dup of the
// socket). file_ends: the caller's close ends fd's file as far as
// librsock can tell (the socket of a connection still on TCP that nothing
// else of ours holds, PendingState::socket_unshared), which takes the
// kernel's registrations of it along: a member registered under fd itself
// then needs no EPOLL_CTL_DEL.
void epoll_forget(int fd, bool file_ends = false);
// Whether any such plain registration is there to drop.
bool epoll_plain_handed();

// A pairing has its outcome (nullptr: plain TCP): every epoll member for
// it (its fd and any dup of it a set holds) becomes the connection's, or
// goes to the kernel with the application's events and data. pending: what
// the members hold, the PendingState or the stream it lent the fd
// meanwhile (RSOCK_TCP_FIRST). Called before any fd changes hands (see
// socket/pending.h). publish makes the outcome known (PendingState::resolve)
// under the lock the conversion holds, before it converts.
class FdState;
void epoll_pending_resolved(FdState* pending, FdState* outcome,
                            const std::function<void()>& publish);

}  // namespace rsock
