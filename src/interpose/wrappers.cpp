// The exported libc entry points. Each wrapper asks FdTable whether its fd
// carries librsock state; a plain fd goes straight to the real call. Only
// these wrappers set errno, and only when they fail; internal calls return
// negative errno values. Nothing here throws or exits.
#include <aio.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/close_range.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/real.h"
#include "fdtable/fdtable.h"
#include "lifecycle/exec_handoff.h"
#include "lifecycle/runtime.h"
#include "progress/readiness.h"
#include "socket/pending.h"
#include "socket/socket.h"
#include "socket/transfer.h"
#include "stats/publish.h"
#include "stats/stats.h"
#include "transport/channel.h"
#include "transport/setup.h"

using namespace rsock;

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace {

template <class T>
T finish(T r) {
  if (r < 0) {
    errno = static_cast<int>(-r);
    return -1;
  }
  return r;
}

ConnectionState* conn_of(const FdRef& r) {
  return r && r.get()->kind() == FdState::Kind::kConnection ? r.as<ConnectionState>() : nullptr;
}

// The state of fd if it is an accelerated connection (fast: one load for a
// plain fd). A socket still pairing (pending.h) counts as plain here: its
// options and flags are the kernel socket's, copied when the pairing ends.
FdRef conn_ref(int fd) {
  if (!fd_table().has(fd)) return FdRef();
  FdRef r = pending_settle(fd, fd_table().get(fd));
  return conn_of(r) ? std::move(r) : FdRef();
}

// conn_ref, or the connection a socket still pairing uses meanwhile
// (RSOCK_TCP_FIRST): for the options it keeps a copy of (O_NONBLOCK, the
// timeouts), which the kernel socket has as well, and for the calls
// refused on a connection (POSIX AIO), whose bytes it could not count.
FdRef opt_ref(int fd) {
  if (!fd_table().has(fd)) return FdRef();
  FdRef r = pending_live(pending_settle(fd, fd_table().get(fd)));
  return conn_of(r) ? std::move(r) : FdRef();
}

// Which of the socket's timeouts governs a call that waits: it decides how
// the call answers a signal handler (socket/interruptible.h).
enum class Waits { kReceive, kSend, kNever };

// How a call blocked on a socket still pairing answers a signal handler: a
// data call as it would on a socket still connecting (restartable unless
// SO_RCVTIMEO/SO_SNDTIMEO is set), shutdown never.
OnSignal pending_on_signal(int fd, Waits waits) {
  if (waits == Waits::kNever) return OnSignal::kContinue;
  timeval tv = {};
  socklen_t len = sizeof tv;
  const int opt = waits == Waits::kReceive ? SO_RCVTIMEO : SO_SNDTIMEO;
  if (real().getsockopt(fd, SOL_SOCKET, opt, &tv, &len) == 0 && (tv.tv_sec || tv.tv_usec))
    return OnSignal::kInterrupt;
  return OnSignal::kRestartable;
}

// The connection behind fd for a data call (or shutdown: kNever). On a
// socket still pairing, a nonblocking data call (O_NONBLOCK or
// MSG_DONTWAIT) sets *err = -EAGAIN, as on a socket still connecting; a
// blocking one waits for the outcome, and *err = -EINTR when a signal
// handler ends that wait. A socket pairing while its bytes go on TCP
// (RSOCK_TCP_FIRST) gives that connection to a data call, which goes on
// with the paired one should the pairing end midway (send and receive
// calls, sendfile and splice: Stream::kForwarded); shutdown waits as
// above.
FdRef io_ref(int fd, int flags, int* err, Waits waits) {
  if (!fd_table().has(fd)) return FdRef();
  FdRef r = pending_settle(fd, fd_table().get(fd));
  if (waits != Waits::kNever && r && r.get()->kind() == FdState::Kind::kPending &&
      r.as<PendingState>()->live())
    return pending_live(std::move(r));
  if (r && r.get()->kind() == FdState::Kind::kPending) {
    int fl = real().fcntl(fd, F_GETFL);
    if (waits != Waits::kNever && ((flags & MSG_DONTWAIT) || (fl >= 0 && (fl & O_NONBLOCK)))) {
      *err = -EAGAIN;
      return FdRef();
    }
    FdRef outcome;
    if (int rc = r.as<PendingState>()->wait(pending_on_signal(fd, waits), &outcome); rc < 0) {
      *err = rc;
      return FdRef();
    }
    r = std::move(outcome);
  }
  return conn_of(r) ? std::move(r) : FdRef();
}

ssize_t send_result(ssize_t r, int flags) {
  if (r == -EPIPE && !(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
  return finish(r);
}

ssize_t do_recv(ConnectionState* c, void* buf, size_t len, int flags) {
  iovec iov = {buf, len};
  return finish(conn_recv(*c, &iov, 1, flags));
}

ssize_t do_send(ConnectionState* c, const void* buf, size_t len, int flags) {
  iovec iov = {const_cast<void*>(buf), len};
  return send_result(conn_send(*c, &iov, 1, flags), flags);
}

// Detaches librsock state from fd before the kernel fd goes away.
void forget_fd(int fd) {
  fresh_tcp().clear(fd);
  // A pairing thread converting fd's epoll members (its outcome may already
  // have handed fd over, leaving it no state): drop them here, before the
  // number can name another file. So too a registration a pairing handed
  // to the kernel as plain TCP, which outlives the fd while we hold a dup
  // of its socket.
  if (!fd_table().has(fd)) {
    if (pending_handover_in_flight() || epoll_plain_handed()) epoll_forget(fd);
    return;
  }
  {
    FdRef r = fd_table().get(fd);
    // A pairing's members change hands when its thread converts them (the
    // stream the fd used meanwhile, RSOCK_TCP_FIRST, seals into the outcome
    // first), so what they hold at this moment does not tell whether there
    // are any: they go under the lock the conversion holds, whatever they
    // hold by then. (pending_settle hands the fd over once the conversion
    // is done.)
    const bool pairing = r && r.get()->kind() == FdState::Kind::kPending;
    if (pairing) (void)pending_settle(fd, fd_table().get(fd));
    const bool watched = r && r.get()->epoll_refs.load() > 0;
    // The last number of a socket nothing else holds: the close ends its
    // file, and the kernel's registrations of it go with it.
    const bool file_ends =
        pairing && r.get()->fds() == 1 && r.as<PendingState>()->socket_unshared();
    if (pairing || watched || epoll_plain_handed()) epoll_forget(fd, file_ends);
  }
  // A channel that uses the number for its socket keeps the socket past it
  // (socket_number_leaving): unless this close ends the connection, before
  // the number goes.
  FdRef gone = fd_table().get(fd);
  fd_table().clear(fd);
  if (gone) socket_number_leaving(fd, gone.get(), gone.get()->refs() == 1);
}

// Before oldfd gets a second number (dup, F_DUPFD, dup2 and dup3 from it):
// a stream that uses oldfd's number for its socket takes a dup of its own
// (a connection on TCP until its pairing: PrefixChannel::own_socket; a
// paired one: socket_number_shared), since either number may be closed
// first, and an epoll set keys its registrations by number. -errno when it
// cannot (no descriptor left: the call fails, as the kernel's would with
// none).
int before_share(int oldfd) {
  fresh_tcp().clear(oldfd);  // its socket will have two numbers
  if (!fd_table().has(oldfd)) return 0;
  FdRef r = fd_table().get(oldfd);
  if (!r) return 0;
  if (const int rc = socket_number_shared(r.get()); rc < 0) return rc;
  if (r.get()->kind() != FdState::Kind::kPending) return 0;
  ConnectionState* live = r.as<PendingState>()->live();
  // A sealed stream (paired) never touches its socket again.
  return live && !live->next() ? live->own_prefix_socket() : 0;
}

// newfd now names the same open file as oldfd: share its state.
void share_state(int oldfd, int newfd) {
  FdRef r = fd_table().get(oldfd);
  if (!r) return;
  fd_table().set(newfd, r.get());
  // A pairing's outcome that took oldfd's number after before_share looked
  // (PendingState::lend_number) gives it up now that there are two.
  if (const int rc = socket_number_shared(r.get()); rc < 0)
    LOG_WARN("fd %d: no descriptor to keep its connection's socket apart from fd %d (%s)", oldfd,
             newfd, strerror(-rc));
  // A pairing that ended meanwhile may have handed the fds over before
  // newfd had its state: hand newfd over too.
  pending_settle(newfd, std::move(r));
}

int64_t ms_to_ns(int timeout_ms) { return timeout_ms < 0 ? -1 : int64_t{timeout_ms} * 1000000; }
int64_t ts_to_ns(const timespec* ts) {
  return ts ? int64_t{ts->tv_sec} * 1000000000 + ts->tv_nsec : -1;
}

bool any_accelerated(int nfds, fd_set* r, fd_set* w, fd_set* e) {
  for (int fd = 0; fd < nfds && fd < FD_SETSIZE; ++fd)
    if (((r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) || (e && FD_ISSET(fd, e))) &&
        fd_table().has(fd))
      return true;
  return false;
}

}  // namespace

// ---- connection setup ------------------------------------------------------

EXPORT int socket(int domain, int type, int protocol) {
  const int fd = real().socket(domain, type, protocol);
  if (fd >= 0) {
    const int kind = type & ~(SOCK_NONBLOCK | SOCK_CLOEXEC);
    const bool inet_stream = (domain == AF_INET || domain == AF_INET6) && kind == SOCK_STREAM;
    if (inet_stream) stats_socket_made();  // this process writes a stats line
    if (inet_stream && (protocol == 0 || protocol == IPPROTO_TCP))
      fresh_tcp().mark(fd);
    else
      fresh_tcp().clear(fd);
  }
  return fd;
}

EXPORT int bind(int fd, const struct sockaddr* addr, socklen_t len) {
  return real().bind(fd, addr, len);
}

EXPORT int listen(int fd, int backlog) {
  fresh_tcp().clear(fd);
  const Runtime* rt = runtime();
  if (!rt || !rt->accelerate) return real().listen(fd, backlog);
  return finish(setup_listen(*rt, fd, backlog));
}

static int accept_common(int fd, struct sockaddr* addr, socklen_t* len, int flags, bool four) {
  // The peer's address comes with the accept (ours when the application
  // asks for none): a candidate's pairing needs it.
  sockaddr_storage own;
  socklen_t own_len = sizeof own;
  sockaddr* a = addr ? addr : reinterpret_cast<sockaddr*>(&own);
  socklen_t* alen = addr ? len : &own_len;
  const socklen_t room = addr && len ? *len : own_len;
  const uint64_t children = children_made();  // before the socket exists
  int r = four ? real().accept4(fd, a, alen, flags) : real().accept(fd, a, alen);
  if (r < 0) return r;
  fresh_tcp().clear(r);
  const Runtime* rt = runtime();
  if (rt) {
    const int saved = errno;
    FdRef l = fd_table().has(fd) ? fd_table().get(fd) : FdRef();
    const bool whole = alen && *alen <= room;  // not cut short by a small buffer
    setup_accepted(*rt, l.get(), r, Accepted{fd, four ? flags : 0, whole ? a : nullptr, children});
    errno = saved;
  }
  return r;
}

EXPORT int accept(int fd, struct sockaddr* addr, socklen_t* len) {
  return accept_common(fd, addr, len, 0, false);
}

EXPORT int accept4(int fd, struct sockaddr* addr, socklen_t* len, int flags) {
  return accept_common(fd, addr, len, flags, true);
}

EXPORT int connect(int fd, const struct sockaddr* addr, socklen_t len) {
  const bool fresh = fresh_tcp().take(fd);
  const Runtime* rt = runtime();
  if (!rt || addr == nullptr) return real().connect(fd, addr, len);
  if (fd_table().has(fd)) {
    FdRef r = pending_settle(fd, fd_table().get(fd));
    if (r && r.get()->kind() == FdState::Kind::kPending) {
      // A connection whose bytes go on TCP until its pairing
      // (RSOCK_TCP_FIRST) is the kernel's socket to every connect():
      // EALREADY while its handshake runs, then 0 and EISCONN, as APR (ab)
      // asks. One whose data calls wait for the pairing is still connecting.
      if (r.as<PendingState>()->live()) return real().connect(fd, addr, len);
      return finish(-EALREADY);
    }
    if (conn_of(r)) return finish(-EISCONN);
    if (r) return real().connect(fd, addr, len);  // a listener: the kernel says why not
  }
  return finish(setup_connect(*rt, fd, addr, len, fresh));
}

EXPORT int shutdown(int fd, int how) {
  // A connection still on TCP whose pairing has not begun (RSOCK_TCP_FIRST)
  // is shut down as kernel TCP, and never pairs (a shutdown of either side
  // is a connection on its way out, or a thread that stops a reader); one
  // whose pairing has begun waits for the outcome (io_ref).
  if ((how == SHUT_RD || how == SHUT_WR || how == SHUT_RDWR) && fd_table().has(fd)) {
    FdRef r = pending_settle(fd, fd_table().get(fd));
    if (r && r.get()->kind() == FdState::Kind::kPending &&
        r.as<PendingState>()->shut_before_pairing()) {
      // Until the pairing's end turns the fd plain TCP its calls still go
      // to the stream (poll right after: HUP once both FINs went). The
      // stream knows first: the kernel's shutdown wakes a thread asleep on
      // the socket, whose look must find the stream shut as the socket is
      // (the kernel marks the socket shut whatever it answers, for a valid
      // `how`).
      r.as<PendingState>()->live()->stream().shut_on_tcp(how != SHUT_WR, how != SHUT_RD);
      return real().shutdown(fd, how);
    }
  }
  int err = 0;
  if (FdRef r = io_ref(fd, 0, &err, Waits::kNever)) return finish(conn_shutdown(*conn_of(r), how));
  return real().shutdown(fd, how);
}

EXPORT int close(int fd) {
  forget_fd(fd);
  return real().close(fd);
}

// close_range and closefrom close the application's fds in a range: their
// state goes as for close(). librsock's own fds in the range (a surviving
// connection's doorbell dup and region memfd, the wakers of threads and
// epoll sets) are kept open, since the program never knew of them: a daemon's closefrom(3) must not
// break the accelerated stdin it keeps.
namespace {
int close_span(unsigned first, unsigned last, int flags) {
  if (flags & CLOSE_RANGE_CLOEXEC) return real().close_range(first, last, flags);
  // The application's fds in the range leave the table first.
  std::vector<int> gone;
  fd_table().for_each([&](int fd, FdState*) {
    if (static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last) gone.push_back(fd);
  });
  for (int fd : gone) forget_fd(fd);
  fresh_tcp().clear_range(first, last);
  // Ours, of the connections that stay, are skipped.
  std::vector<int> keep;
  for (const FdRef& r : connection_refs()) {
    Channel& ch = r.as<ConnectionState>()->stream().channel();
    keep.push_back(ch.wait_fd());
    ch.own_fds(&keep);
  }
  wakers_own_fds(&keep);  // threads' and epoll sets'
  pending_own_fds(&keep);
  transports_own_fds(&keep);
  std::sort(keep.begin(), keep.end());
  unsigned from = first;
  for (int k : keep) {
    if (k < 0 || static_cast<unsigned>(k) < from || static_cast<unsigned>(k) > last) continue;
    if (static_cast<unsigned>(k) > from && real().close_range(from, k - 1, flags) != 0) return -1;
    from = static_cast<unsigned>(k) + 1;
    if (from == 0) return 0;  // wrapped past UINT_MAX
  }
  if (from <= last) return real().close_range(from, last, flags);
  return 0;
}
}  // namespace

EXPORT int close_range(unsigned int first, unsigned int last, int flags) {
  if (first > last || !real().close_range) return real().close_range(first, last, flags);
  return close_span(first, last, flags);
}

EXPORT void closefrom(int lowfd) {
  if (lowfd < 0) lowfd = 0;
  if (close_span(static_cast<unsigned>(lowfd), ~0u, 0) != 0 && real().closefrom)
    real().closefrom(lowfd);  // no close_range (old kernel): glibc's own fallback
}

EXPORT int __close(int fd) { return close(fd); }

// ---- data ------------------------------------------------------------------

EXPORT ssize_t read(int fd, void* buf, size_t len) {
  int err = 0;
  if (FdRef r = io_ref(fd, 0, &err, Waits::kReceive)) return do_recv(conn_of(r), buf, len, 0);
  if (err) return finish<ssize_t>(err);
  return real().read(fd, buf, len);
}

EXPORT ssize_t write(int fd, const void* buf, size_t len) {
  int err = 0;
  if (FdRef r = io_ref(fd, 0, &err, Waits::kSend)) return do_send(conn_of(r), buf, len, 0);
  if (err) return finish<ssize_t>(err);
  return real().write(fd, buf, len);
}

EXPORT ssize_t readv(int fd, const struct iovec* iov, int iovcnt) {
  int err = 0;
  if (FdRef r = io_ref(fd, 0, &err, Waits::kReceive)) {
    if (iovcnt < 0 || iovcnt > IOV_MAX) return finish<ssize_t>(-EINVAL);
    return finish(conn_recv(*conn_of(r), iov, iovcnt, 0));
  }
  if (err) return finish<ssize_t>(err);
  return real().readv(fd, iov, iovcnt);
}

EXPORT ssize_t writev(int fd, const struct iovec* iov, int iovcnt) {
  int err = 0;
  if (FdRef r = io_ref(fd, 0, &err, Waits::kSend)) {
    if (iovcnt < 0 || iovcnt > IOV_MAX) return finish<ssize_t>(-EINVAL);
    return send_result(conn_send(*conn_of(r), iov, iovcnt, 0), 0);
  }
  if (err) return finish<ssize_t>(err);
  return real().writev(fd, iov, iovcnt);
}

EXPORT ssize_t recv(int fd, void* buf, size_t len, int flags) {
  int err = 0;
  if (FdRef r = io_ref(fd, flags, &err, Waits::kReceive))
    return do_recv(conn_of(r), buf, len, flags);
  if (err) return finish<ssize_t>(err);
  return real().recv(fd, buf, len, flags);
}

EXPORT ssize_t recvfrom(int fd, void* buf, size_t len, int flags, struct sockaddr* addr,
                        socklen_t* addrlen) {
  int err = 0;
  if (FdRef r = io_ref(fd, flags, &err, Waits::kReceive)) {
    ssize_t n = do_recv(conn_of(r), buf, len, flags);
    if (n >= 0 && addr && addrlen) *addrlen = 0;  // as Linux TCP: no source address
    return n;
  }
  if (err) return finish<ssize_t>(err);
  return real().recvfrom(fd, buf, len, flags, addr, addrlen);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr* msg, int flags) {
  int err = 0;
  if (FdRef r = io_ref(fd, flags, &err, Waits::kReceive)) {
    if (msg->msg_iovlen > IOV_MAX) return finish<ssize_t>(-EMSGSIZE);
    ssize_t n = conn_recv(*conn_of(r), msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags);
    if (n >= 0) {
      msg->msg_namelen = 0;
      msg->msg_controllen = 0;
      msg->msg_flags = 0;
    }
    return finish(n);
  }
  if (err) return finish<ssize_t>(err);
  return real().recvmsg(fd, msg, flags);
}

EXPORT ssize_t send(int fd, const void* buf, size_t len, int flags) {
  int err = 0;
  if (FdRef r = io_ref(fd, flags, &err, Waits::kSend)) return do_send(conn_of(r), buf, len, flags);
  if (err) return finish<ssize_t>(err);
  return real().send(fd, buf, len, flags);
}

// A destination address on a connected stream socket is ignored, as Linux
// TCP ignores it (rsocket returns EISCONN here and breaks sockperf).
EXPORT ssize_t sendto(int fd, const void* buf, size_t len, int flags, const struct sockaddr* addr,
                      socklen_t addrlen) {
  int err = 0;
  if (FdRef r = io_ref(fd, flags, &err, Waits::kSend)) return do_send(conn_of(r), buf, len, flags);
  if (err) return finish<ssize_t>(err);
  return real().sendto(fd, buf, len, flags, addr, addrlen);
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr* msg, int flags) {
  int err = 0;
  if (FdRef r = io_ref(fd, flags, &err, Waits::kSend)) {
    if (msg->msg_iovlen > IOV_MAX) return finish<ssize_t>(-EMSGSIZE);
    return send_result(
        conn_send(*conn_of(r), msg->msg_iov, static_cast<int>(msg->msg_iovlen), flags), flags);
  }
  if (err) return finish<ssize_t>(err);
  return real().sendmsg(fd, msg, flags);
}

// The batch forms, as the kernel runs them on a TCP socket: one sendmsg or
// recvmsg per entry; an error is returned only when no entry completed.
EXPORT int sendmmsg(int fd, struct mmsghdr* vec, unsigned int vlen, int flags) {
  int again = 0;
  FdRef r = io_ref(fd, flags, &again, Waits::kSend);
  if (!r) {
    if (again) return finish(again);
    return real().sendmmsg(fd, vec, vlen, flags);
  }
  if (vlen > UIO_MAXIOV) vlen = UIO_MAXIOV;
  ssize_t err = 0;
  unsigned int n = 0;
  for (; n < vlen; ++n) {
    msghdr* m = &vec[n].msg_hdr;
    if (m->msg_iovlen > IOV_MAX) {
      err = -EMSGSIZE;
      break;
    }
    const ssize_t k = conn_send(*conn_of(r), m->msg_iov, static_cast<int>(m->msg_iovlen), flags);
    if (k < 0) {
      err = k;
      break;
    }
    vec[n].msg_len = static_cast<unsigned int>(k);
    if (static_cast<size_t>(k) < [&] {
          size_t t = 0;
          for (size_t i = 0; i < m->msg_iovlen; ++i) t += m->msg_iov[i].iov_len;
          return t;
        }()) {
      ++n;  // a partial send ends the batch
      break;
    }
  }
  if (err == -EPIPE && !(flags & MSG_NOSIGNAL)) raise(SIGPIPE);
  if (n > 0) return static_cast<int>(n);
  return static_cast<int>(finish(err));
}

EXPORT int recvmmsg(int fd, struct mmsghdr* vec, unsigned int vlen, int flags,
                    struct timespec* timeout) {
  int again = 0;
  FdRef r = io_ref(fd, flags, &again, Waits::kReceive);
  if (!r) {
    if (again) return finish(again);
    return real().recvmmsg(fd, vec, vlen, flags, timeout);
  }
  if (flags & INT_MIN) return finish(-EINVAL);  // the kernel's internal MSG_CMSG_COMPAT
  int64_t end = -1;
  if (timeout) {
    if (timeout->tv_sec < 0 || timeout->tv_nsec < 0 || timeout->tv_nsec >= 1000000000)
      return finish(-EINVAL);
    end = monotonic_ns() + ts_to_ns(timeout);
  }
  if (vlen > UIO_MAXIOV) vlen = UIO_MAXIOV;
  ssize_t err = 0;
  unsigned int n = 0;
  int f = flags & ~MSG_WAITFORONE;
  while (n < vlen) {
    msghdr* m = &vec[n].msg_hdr;
    if (m->msg_iovlen > IOV_MAX) {
      err = -EMSGSIZE;
      break;
    }
    const ssize_t k = conn_recv(*conn_of(r), m->msg_iov, static_cast<int>(m->msg_iovlen), f);
    if (k < 0) {
      err = k;
      break;
    }
    m->msg_namelen = 0;
    m->msg_controllen = 0;
    m->msg_flags = 0;
    vec[n].msg_len = static_cast<unsigned int>(k);
    ++n;
    if (flags & MSG_WAITFORONE) f |= MSG_DONTWAIT;
    if (timeout) {
      // Checked only after each message, as the kernel does.
      int64_t left = end - monotonic_ns();
      if (left < 0) left = 0;
      timeout->tv_sec = left / 1000000000;
      timeout->tv_nsec = left % 1000000000;
      if (left == 0) break;
    }
  }
  if (n > 0) return static_cast<int>(n);
  return static_cast<int>(finish(err));
}

// preadv2/pwritev2 with offset -1 are readv/writev with per-call flags
// (RWF_NOWAIT: MSG_DONTWAIT); any other offset is refused by the kernel on
// a socket (ESPIPE, EINVAL) without touching the stream, so it goes there.
// preadv/pwritev never reach a socket's data (offset -1 is EINVAL there).
namespace {
constexpr int kRwfKnown = 0x3f;  // RWF_HIPRI DSYNC SYNC NOWAIT APPEND NOAPPEND
constexpr int kRwfNowait = 0x08;

ssize_t rwv2(bool write, int fd, const struct iovec* iov, int iovcnt, int flags,
             ssize_t (*real_fn)(int, const struct iovec*, int, off_t, int)) {
  int again = 0;
  FdRef r = io_ref(fd, (flags & kRwfNowait) ? MSG_DONTWAIT : 0, &again,
                   write ? Waits::kSend : Waits::kReceive);
  if (!r) {
    if (again) return finish<ssize_t>(again);
    return real_fn(fd, iov, iovcnt, -1, flags);
  }
  if (iovcnt < 0 || iovcnt > IOV_MAX) return finish<ssize_t>(-EINVAL);
  size_t total = 0;
  for (int i = 0; i < iovcnt; ++i) total += iov[i].iov_len;
  if (total == 0) return 0;
  if (flags & ~kRwfKnown) return finish<ssize_t>(-EOPNOTSUPP);
  const int mf = (flags & kRwfNowait) ? MSG_DONTWAIT : 0;
  if (write) return send_result(conn_send(*conn_of(r), iov, iovcnt, mf), mf);
  return finish(conn_recv(*conn_of(r), iov, iovcnt, mf));
}
}  // namespace

EXPORT ssize_t preadv2(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags) {
  if (offset != -1 || !fd_table().has(fd)) return real().preadv2(fd, iov, iovcnt, offset, flags);
  return rwv2(false, fd, iov, iovcnt, flags, real().preadv2);
}

EXPORT ssize_t pwritev2(int fd, const struct iovec* iov, int iovcnt, off_t offset, int flags) {
  if (offset != -1 || !fd_table().has(fd)) return real().pwritev2(fd, iov, iovcnt, offset, flags);
  return rwv2(true, fd, iov, iovcnt, flags, real().pwritev2);
}

EXPORT ssize_t preadv64v2(int fd, const struct iovec* iov, int iovcnt, off64_t offset, int flags) {
  return preadv2(fd, iov, iovcnt, offset, flags);
}

EXPORT ssize_t pwritev64v2(int fd, const struct iovec* iov, int iovcnt, off64_t offset, int flags) {
  return pwritev2(fd, iov, iovcnt, offset, flags);
}

// ---- kernel-side copies: sendfile and splice (socket/transfer.h) -------------

EXPORT ssize_t sendfile(int out_fd, int in_fd, off_t* offset, size_t count) {
  int again = 0;
  FdRef r = io_ref(out_fd, 0, &again, Waits::kSend);
  if (!r) {
    if (again) return finish<ssize_t>(again);
    return real().sendfile(out_fd, in_fd, offset, count);
  }
  bool sigpipe = false;
  ssize_t n = conn_sendfile(*conn_of(r), in_fd, offset, count, &sigpipe);
  if (sigpipe) raise(SIGPIPE);
  return finish(n);
}

EXPORT ssize_t sendfile64(int out_fd, int in_fd, off64_t* offset, size_t count) {
  static_assert(sizeof(off64_t) == sizeof(off_t), "LP64: sendfile64 is sendfile");
  return sendfile(out_fd, in_fd, reinterpret_cast<off_t*>(offset), count);
}

// splice between a pipe and an accelerated socket goes through the stream;
// every other pairing is the kernel's (it refuses socket-to-socket and
// socket-to-file with EINVAL before touching either end).
EXPORT ssize_t splice(int fd_in, loff_t* off_in, int fd_out, loff_t* off_out, size_t len,
                      unsigned int flags) {
  const bool in_acc = fd_table().has(fd_in), out_acc = fd_table().has(fd_out);
  if (!in_acc && !out_acc) return real().splice(fd_in, off_in, fd_out, off_out, len, flags);
  struct stat st;
  const bool in_pipe = fstat(fd_in, &st) == 0 && S_ISFIFO(st.st_mode);
  const bool out_pipe = fstat(fd_out, &st) == 0 && S_ISFIFO(st.st_mode);
  int again = 0;
  FdRef r;
  bool to_socket;
  if (in_pipe && out_acc) {
    to_socket = true;
  } else if (out_pipe && in_acc) {
    to_socket = false;
  } else {
    return real().splice(fd_in, off_in, fd_out, off_out, len, flags);
  }
  if (len == 0) return 0;
  if (flags &
      ~static_cast<unsigned>(SPLICE_F_MOVE | SPLICE_F_NONBLOCK | SPLICE_F_MORE | SPLICE_F_GIFT))
    return finish<ssize_t>(-EINVAL);
  // The pipe end cannot take an offset (ESPIPE); the socket has no
  // positioned I/O (EINVAL).
  if ((to_socket && off_in) || (!to_socket && off_out)) return finish<ssize_t>(-ESPIPE);
  if ((to_socket && off_out) || (!to_socket && off_in)) return finish<ssize_t>(-EINVAL);
  const int sock = to_socket ? fd_out : fd_in;
  r = io_ref(sock, 0, &again, to_socket ? Waits::kSend : Waits::kReceive);
  if (!r) {
    if (again) return finish<ssize_t>(again);
    return real().splice(fd_in, off_in, fd_out, off_out, len, flags);
  }
  bool sigpipe = false;
  ssize_t n = to_socket ? conn_splice_from_pipe(*conn_of(r), fd_in, len, flags, &sigpipe)
                        : conn_splice_to_pipe(*conn_of(r), fd_out, len, flags, &sigpipe);
  if (sigpipe) raise(SIGPIPE);
  return finish(n);
}

// ---- calls glibc serves with its internal read/write --------------------------
//
// stdio and POSIX AIO reach the fd through glibc's internal calls, which
// bypass these wrappers (README, "What librsock intercepts"). fclose of a
// stream on an accelerated fd closes the fd the same way: drop its state,
// or a later fd that reuses the number would inherit it. POSIX AIO on an
// accelerated fd is refused (EOPNOTSUPP) instead of running on the kernel
// socket, where its reads would return doorbell bytes; so is POSIX AIO on
// one still pairing on TCP (RSOCK_TCP_FIRST), where its writes would be
// bytes the switch does not count (the peer would read past our count and
// reset).

EXPORT int fclose(FILE* f) {
  const int fd = f ? fileno(f) : -1;
  const int r = real().fclose(f);
  if (fd >= 0 && fd_table().has(fd) && real().fcntl(fd, F_GETFD) < 0) {
    const int saved = errno;
    forget_fd(fd);
    errno = saved;
  }
  return r;
}

static bool aio_on_connection(const struct aiocb* cb) {
  return cb && fd_table().has(cb->aio_fildes) && opt_ref(cb->aio_fildes);
}

static int aio_refused(int fd) {
  LOG_WARN("fd %d: POSIX AIO on an accelerated socket is not supported (EOPNOTSUPP)", fd);
  return finish(-EOPNOTSUPP);
}

EXPORT int aio_read(struct aiocb* cb) {
  if (aio_on_connection(cb)) return aio_refused(cb->aio_fildes);
  return real().aio_read(cb);
}

EXPORT int aio_write(struct aiocb* cb) {
  if (aio_on_connection(cb)) return aio_refused(cb->aio_fildes);
  return real().aio_write(cb);
}

EXPORT int aio_read64(struct aiocb64* cb) { return aio_read(reinterpret_cast<struct aiocb*>(cb)); }
EXPORT int aio_write64(struct aiocb64* cb) {
  return aio_write(reinterpret_cast<struct aiocb*>(cb));
}

EXPORT int lio_listio(int mode, struct aiocb* const list[], int n, struct sigevent* sev) {
  for (int i = 0; i < n; ++i)
    if (list[i] && list[i]->aio_lio_opcode != LIO_NOP && aio_on_connection(list[i]))
      return aio_refused(list[i]->aio_fildes);
  return real().lio_listio(mode, list, n, sev);
}

EXPORT int lio_listio64(int mode, struct aiocb64* const list[], int n, struct sigevent* sev) {
  return lio_listio(mode, reinterpret_cast<struct aiocb* const*>(list), n, sev);
}

// ---- formatted output to an fd: glibc writes it through stdio internals -------

EXPORT int vdprintf(int fd, const char* fmt, va_list ap) {
  if (!fd_table().has(fd)) return real().vdprintf(fd, fmt, ap);
  int again = 0;
  FdRef r = io_ref(fd, 0, &again, Waits::kSend);
  if (!r) {
    if (again) return finish(again);
    return real().vdprintf(fd, fmt, ap);
  }
  char small[1024];
  va_list ap2;
  va_copy(ap2, ap);
  int len = vsnprintf(small, sizeof small, fmt, ap2);
  va_end(ap2);
  if (len < 0) return len;
  char* buf = small;
  if (static_cast<size_t>(len) >= sizeof small) {
    buf = static_cast<char*>(malloc(static_cast<size_t>(len) + 1));
    if (!buf) return finish(-ENOMEM);
    vsnprintf(buf, static_cast<size_t>(len) + 1, fmt, ap);
  }
  // As stdio does: write until everything went, or fail.
  ssize_t done = 0, k = 0;
  while (done < len) {
    iovec iov = {buf + done, static_cast<size_t>(len - done)};
    k = conn_send(*conn_of(r), &iov, 1, 0);
    if (k <= 0) break;
    done += k;
  }
  if (buf != small) free(buf);
  if (done < len) return static_cast<int>(send_result(k < 0 ? k : -EIO, 0));
  return len;
}

EXPORT int dprintf(int fd, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = vdprintf(fd, fmt, ap);
  va_end(ap);
  return r;
}

EXPORT int __vdprintf_chk(int fd, int flag, const char* fmt, va_list ap) {
  if (!fd_table().has(fd)) return real().__vdprintf_chk(fd, flag, fmt, ap);
  return vdprintf(fd, fmt, ap);
}

EXPORT int __dprintf_chk(int fd, int flag, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int r = __vdprintf_chk(fd, flag, fmt, ap);
  va_end(ap);
  return r;
}

// ---- readiness ---------------------------------------------------------------

EXPORT int poll(struct pollfd* fds, nfds_t n, int timeout) {
  if (!runtime()) return real().poll(fds, n, timeout);
  return finish(rs_poll(fds, n, ms_to_ns(timeout), nullptr));
}

EXPORT int ppoll(struct pollfd* fds, nfds_t n, const struct timespec* ts, const sigset_t* mask) {
  if (!runtime()) return real().ppoll(fds, n, ts, mask);
  return finish(rs_poll(fds, n, ts_to_ns(ts), mask));
}

EXPORT int select(int nfds, fd_set* r, fd_set* w, fd_set* e, struct timeval* tv) {
  if (!runtime() || !any_accelerated(nfds, r, w, e)) return real().select(nfds, r, w, e, tv);
  int64_t ns = tv ? int64_t{tv->tv_sec} * 1000000000 + int64_t{tv->tv_usec} * 1000 : -1;
  return finish(rs_select(nfds, r, w, e, ns, nullptr));
}

EXPORT int pselect(int nfds, fd_set* r, fd_set* w, fd_set* e, const struct timespec* ts,
                   const sigset_t* mask) {
  if (!runtime() || !any_accelerated(nfds, r, w, e)) return real().pselect(nfds, r, w, e, ts, mask);
  return finish(rs_select(nfds, r, w, e, ts_to_ns(ts), mask));
}

EXPORT int epoll_create(int size) { return real().epoll_create(size); }
EXPORT int epoll_create1(int flags) { return real().epoll_create1(flags); }

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event* ev) {
  if (!runtime()) return real().epoll_ctl(epfd, op, fd, ev);
  return finish(rs_epoll_ctl(epfd, op, fd, ev));
}

// A set without a shadow waits in the kernel; an event of ours in its answer
// (another thread added an accelerated member meanwhile) is not the
// application's (readiness.h).
EXPORT int epoll_wait(int epfd, struct epoll_event* ev, int maxevents, int timeout) {
  if (!runtime()) return real().epoll_wait(epfd, ev, maxevents, timeout);
  if (!fd_table().has(epfd))
    return finish(rs_epoll_wait_unshadowed(epfd, ev, maxevents, timeout, nullptr, false, nullptr));
  return finish(rs_epoll_wait(epfd, ev, maxevents, timeout, nullptr));
}

EXPORT int epoll_pwait(int epfd, struct epoll_event* ev, int maxevents, int timeout,
                       const sigset_t* mask) {
  if (!runtime()) return real().epoll_pwait(epfd, ev, maxevents, timeout, mask);
  if (!fd_table().has(epfd))
    return finish(rs_epoll_wait_unshadowed(epfd, ev, maxevents, timeout, nullptr, false, mask));
  return finish(rs_epoll_wait(epfd, ev, maxevents, timeout, mask));
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event* ev, int maxevents, const struct timespec* ts,
                        const sigset_t* mask) {
  // Milliseconds, rounded up (never a shorter wait than asked).
  auto timeout_ms = [ts] {
    if (!ts) return -1;
    const int64_t ms = int64_t{ts->tv_sec} * 1000 + (ts->tv_nsec + 999999) / 1000000;
    return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
  };
  if (!runtime() || !fd_table().has(epfd)) {
    if (!real().epoll_pwait2) return finish(-ENOSYS);
    if (!runtime()) return real().epoll_pwait2(epfd, ev, maxevents, ts, mask);
    return finish(rs_epoll_wait_unshadowed(epfd, ev, maxevents, timeout_ms(), ts, true, mask));
  }
  if (ts && (ts->tv_sec < 0 || ts->tv_nsec < 0 || ts->tv_nsec >= 1000000000))
    return finish(-EINVAL);
  return finish(rs_epoll_wait(epfd, ev, maxevents, timeout_ms(), mask));
}

// ---- descriptors and options -------------------------------------------------

static int fcntl_common(bool is64, int fd, int cmd, long arg) {
  auto fn = is64 && real().fcntl64 ? real().fcntl64 : real().fcntl;
  if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)
    if (const int rc = before_share(fd); rc < 0) return finish(rc);
  int r = fn(fd, cmd, arg);
  if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC)) fresh_tcp().clear(r);
  if (r < 0 || !fd_table().has(fd)) return r;
  if (cmd == F_SETFL) {
    if (FdRef c = opt_ref(fd)) conn_of(c)->set_nonblocking((arg & O_NONBLOCK) != 0);
  } else if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) {
    share_state(fd, r);
  }
  return r;
}

EXPORT int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  long arg = va_arg(ap, long);
  va_end(ap);
  return fcntl_common(false, fd, cmd, arg);
}

EXPORT int fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  long arg = va_arg(ap, long);
  va_end(ap);
  return fcntl_common(true, fd, cmd, arg);
}

EXPORT int ioctl(int fd, unsigned long req, ...) {
  va_list ap;
  va_start(ap, req);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  if (req == FIONBIO) {
    if (FdRef r = opt_ref(fd); r && conn_of(r)->prefix_only()) {
      const int rc = real().ioctl(fd, req, arg);
      if (rc == 0 && arg) conn_of(r)->set_nonblocking(*static_cast<int*>(arg) != 0);
      return rc;
    }
  }
  if (FdRef r = conn_ref(fd)) {
    ConnectionState* c = conn_of(r);
    if (req == FIONREAD) {
      if (!arg) return finish(-EFAULT);
      *static_cast<int*>(arg) = static_cast<int>(c->stream().readable_bytes());
      return 0;
    }
    if (req == FIONBIO) {
      int rc = real().ioctl(fd, req, arg);
      if (rc == 0 && arg) c->set_nonblocking(*static_cast<int*>(arg) != 0);
      return rc;
    }
  }
  return real().ioctl(fd, req, arg);
}

EXPORT int getsockopt(int fd, int level, int name, void* val, socklen_t* len) {
  if (level == SOL_SOCKET && name == SO_ERROR && val && len && *len >= sizeof(int)) {
    // The stream's pending error, reported once as the kernel's sk_err is;
    // never the kernel socket's own, which only says what the doorbells
    // met.
    if (FdRef r = conn_ref(fd)) {
      *static_cast<int*>(val) = conn_of(r)->stream().take_error();
      *len = sizeof(int);
      return 0;
    }
  }
  return real().getsockopt(fd, level, name, val, len);
}

// The kernel answers ENOTCONN once a TCP socket is in TCP_CLOSE (after a
// reset, or once both FINs were exchanged), which an accelerated stream
// reaches without its kernel socket (whose state only follows the
// doorbells): both the error and the address come from the stream.
EXPORT int getpeername(int fd, struct sockaddr* addr, socklen_t* len) {
  if (FdRef r = conn_ref(fd)) {
    ConnectionState* c = conn_of(r);
    if (c->peer_len > 0) {
      if (c->stream().closed()) return finish(-ENOTCONN);
      if (!addr || !len) return finish(-EFAULT);
      memcpy(addr, &c->peer_addr, std::min<socklen_t>(*len, c->peer_len));
      *len = c->peer_len;
      return 0;
    }
  }
  return real().getpeername(fd, addr, len);
}

EXPORT int setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  // After the switch the kernel socket carries only doorbells, which Nagle
  // or a cork would hold back for milliseconds (stalling both ends): those
  // two options are accepted and not applied.
  if (level == IPPROTO_TCP && (name == TCP_NODELAY || name == TCP_CORK) && conn_ref(fd)) return 0;
  int r = real().setsockopt(fd, level, name, val, len);
  if (r == 0 && level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO) && val &&
      len >= sizeof(timeval)) {
    if (FdRef c = opt_ref(fd)) {
      auto* tv = static_cast<const timeval*>(val);
      int64_t us = int64_t{tv->tv_sec} * 1000000 + tv->tv_usec;
      conn_of(c)->set_timeout_us(name, us);
    }
  }
  return r;
}

EXPORT int dup(int fd) {
  if (const int rc = before_share(fd); rc < 0) return finish(rc);
  int r = real().dup(fd);
  if (r >= 0) fresh_tcp().clear(r);
  if (r >= 0 && fd_table().has(fd)) share_state(fd, r);
  return r;
}

static int dup_onto(int oldfd, int newfd, int flags, bool three) {
  if (oldfd == newfd) return three ? (errno = EINVAL, -1) : real().dup2(oldfd, newfd);
  if (const int rc = before_share(oldfd); rc < 0) return finish(rc);
  if (fd_table().has(newfd)) {
    // What newfd carries goes first, as its close would drop it, while the
    // number still names its file: a stream may use the number for its
    // socket, and an epoll set may hold a registration under it, which the
    // kernel would keep for the file once the number names another.
    // Past these checks the kernel's dup cannot fail (newfd is open).
    if (three && (flags & ~O_CLOEXEC) != 0) return finish(-EINVAL);
    if (real().fcntl(oldfd, F_GETFD) < 0) return -1;  // EBADF
    forget_fd(newfd);
  }
  int r = three ? real().dup3(oldfd, newfd, flags) : real().dup2(oldfd, newfd);
  if (r < 0) return r;
  // newfd was closed by the kernel: drop what it carried, then share.
  forget_fd(newfd);
  if (fd_table().has(oldfd)) share_state(oldfd, newfd);
  return r;
}

EXPORT int dup2(int oldfd, int newfd) { return dup_onto(oldfd, newfd, 0, false); }
EXPORT int dup3(int oldfd, int newfd, int flags) { return dup_onto(oldfd, newfd, flags, true); }

// ---- fortify entries ---------------------------------------------------------

extern "C" void __chk_fail(void) __attribute__((noreturn));

EXPORT ssize_t __read_chk(int fd, void* buf, size_t len, size_t buflen) {
  if (len > buflen) __chk_fail();
  return read(fd, buf, len);
}

EXPORT ssize_t __recv_chk(int fd, void* buf, size_t len, size_t buflen, int flags) {
  if (len > buflen) __chk_fail();
  return recv(fd, buf, len, flags);
}

EXPORT ssize_t __recvfrom_chk(int fd, void* buf, size_t len, size_t buflen, int flags,
                              struct sockaddr* addr, socklen_t* addrlen) {
  if (len > buflen) __chk_fail();
  return recvfrom(fd, buf, len, flags, addr, addrlen);
}

EXPORT int __poll_chk(struct pollfd* fds, nfds_t n, int timeout, size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) __chk_fail();
  return poll(fds, n, timeout);
}

EXPORT int __ppoll_chk(struct pollfd* fds, nfds_t n, const struct timespec* ts,
                       const sigset_t* mask, size_t fdslen) {
  if (fdslen / sizeof(*fds) < n) __chk_fail();
  return ppoll(fds, n, ts, mask);
}

// Old public aliases of glibc's (programs and libraries may bind to them).
EXPORT ssize_t __read(int fd, void* buf, size_t len) { return read(fd, buf, len); }
EXPORT ssize_t __write(int fd, const void* buf, size_t len) { return write(fd, buf, len); }
EXPORT ssize_t __send(int fd, const void* buf, size_t len, int flags) {
  return send(fd, buf, len, flags);
}
EXPORT int __poll(struct pollfd* fds, nfds_t n, int timeout) { return poll(fds, n, timeout); }
EXPORT int __select(int nfds, fd_set* r, fd_set* w, fd_set* e, struct timeval* tv) {
  return select(nfds, r, w, e, tv);
}

// ---- exec: accelerated fds that survive it are handed over -------------------
//
// Each wrapper builds the new image's environment with exec_prepare (the
// hand-off variable, lifecycle/exec_handoff.h), writes this image's stats,
// and undoes the hand-off if the real call returns (the exec failed). The
// varargs forms and execv/execvp reach the real execve/execvpe through these
// wrappers, since glibc's own forms call execve internally, not through the
// PLT, and so could not carry the variable.

extern char** environ;

static int exec_env(char* const envp[], int (*fn)(void*, char* const*), void* arg) {
  ExecHandoff h;
  exec_prepare(envp, ExecKind::kReplace, &h);
  if (!in_vfork_child()) flush_stats(FlushAt::kExec);  // a vfork child's are its parent's
  publish_before_exec();
  int r = fn(arg, h.envp);
  publish_exec_failed();
  exec_release(&h, false);  // still here: the exec failed
  return r;
}

namespace {
struct ExecArgs {
  const char* path;
  char* const* argv;
  int dirfd;
  int flags;
};
}  // namespace

EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  ExecArgs a = {path, argv, -1, 0};
  return exec_env(
      envp,
      [](void* p, char* const* env) {
        auto* x = static_cast<ExecArgs*>(p);
        return real().execve(x->path, x->argv, env);
      },
      &a);
}

EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  ExecArgs a = {file, argv, -1, 0};
  return exec_env(
      envp,
      [](void* p, char* const* env) {
        auto* x = static_cast<ExecArgs*>(p);
        return real().execvpe(x->path, x->argv, env);
      },
      &a);
}

EXPORT int execv(const char* path, char* const argv[]) { return execve(path, argv, environ); }
EXPORT int execvp(const char* file, char* const argv[]) { return execvpe(file, argv, environ); }

EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
  ExecArgs a = {nullptr, argv, fd, 0};
  return exec_env(
      envp,
      [](void* p, char* const* env) {
        auto* x = static_cast<ExecArgs*>(p);
        return real().fexecve(x->dirfd, x->argv, env);
      },
      &a);
}

EXPORT int execveat(int dirfd, const char* path, char* const argv[], char* const envp[],
                    int flags) {
  if (!real().execveat) return finish(-ENOSYS);
  ExecArgs a = {path, argv, dirfd, flags};
  return exec_env(
      envp,
      [](void* p, char* const* env) {
        auto* x = static_cast<ExecArgs*>(p);
        return real().execveat(x->dirfd, x->path, x->argv, env, x->flags);
      },
      &a);
}

// The varargs forms collect their arguments on the stack (as glibc does: no
// malloc, they may run in a vfork child). Returns the count, or -1 past
// INT_MAX arguments (E2BIG).
#define RSOCK_COLLECT_ARGS(arg0, ap, argv)                                \
  ptrdiff_t argc_ = 1;                                                    \
  {                                                                       \
    va_list cnt_;                                                         \
    va_copy(cnt_, ap);                                                    \
    while (va_arg(cnt_, char*) != nullptr && argc_ < INT_MAX) ++argc_;    \
    va_end(cnt_);                                                         \
  }                                                                       \
  char** argv = static_cast<char**>(alloca((argc_ + 1) * sizeof(char*))); \
  argv[0] = const_cast<char*>(arg0);                                      \
  for (ptrdiff_t i_ = 1; i_ <= argc_; ++i_) argv[i_] = va_arg(ap, char*);

EXPORT int execl(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  RSOCK_COLLECT_ARGS(arg, ap, argv);
  va_end(ap);
  return execve(path, argv, environ);
}

EXPORT int execlp(const char* file, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  RSOCK_COLLECT_ARGS(arg, ap, argv);
  va_end(ap);
  return execvpe(file, argv, environ);
}

EXPORT int execle(const char* path, const char* arg, ...) {
  va_list ap;
  va_start(ap, arg);
  RSOCK_COLLECT_ARGS(arg, ap, argv);
  char* const* envp = va_arg(ap, char* const*);
  va_end(ap);
  return execve(path, argv, envp);
}

// posix_spawn: the child is a new process that execs. It inherits what is
// not close-on-exec (after the file actions) and becomes one more holder of
// each connection it takes over; this process keeps its own. glibc's
// posix_spawn returns once the child has exec'd or failed (CLONE_VFORK), so
// the memfd dups can be closed here right after.
static int spawn_common(bool search, pid_t* pid, const char* path,
                        const posix_spawn_file_actions_t* fa, const posix_spawnattr_t* attr,
                        char* const argv[], char* const envp[]) {
  ExecHandoff h;
  exec_prepare(envp, ExecKind::kSpawn, &h);
  int r = search ? real().posix_spawnp(pid, path, fa, attr, argv, h.envp)
                 : real().posix_spawn(pid, path, fa, attr, argv, h.envp);
  exec_release(&h, r == 0);
  return r;
}

EXPORT int posix_spawn(pid_t* pid, const char* path, const posix_spawn_file_actions_t* fa,
                       const posix_spawnattr_t* attr, char* const argv[], char* const envp[]) {
  return spawn_common(false, pid, path, fa, attr, argv, envp);
}

EXPORT int posix_spawnp(pid_t* pid, const char* file, const posix_spawn_file_actions_t* fa,
                        const posix_spawnattr_t* attr, char* const argv[], char* const envp[]) {
  return spawn_common(true, pid, file, fa, attr, argv, envp);
}

// ---- _exit: a program that leaves without exit handlers still reports -------

EXPORT void _exit(int status) {
  // Before the stats line (see rsock_destructor). A vfork child shares our
  // memory: what it would write is its parent's line, and marking it
  // written would cost the parent its own (release_at_exit does nothing
  // there either).
  release_at_exit();
  if (!in_vfork_child()) flush_stats();
  publish_at_exit();  // (nothing in a vfork child)
  using ExitFn = void (*)(int);
  static ExitFn real_exit = reinterpret_cast<ExitFn>(dlsym(RTLD_NEXT, "_exit"));
  if (real_exit) real_exit(status);
  syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

EXPORT void _Exit(int status) { _exit(status); }
