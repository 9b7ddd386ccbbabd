// The exported libc entry points. Each wrapper asks FdTable whether its fd
// carries librsock state; a plain fd goes straight to the real call. Only
// these wrappers set errno, and only when they fail; internal calls return
// negative errno values. Nothing here throws or exits.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>

#include "common/real.h"
#include "fdtable/fdtable.h"
#include "lifecycle/runtime.h"
#include "progress/readiness.h"
#include "socket/pending.h"
#include "socket/socket.h"

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
// handler ends that wait.
FdRef io_ref(int fd, int flags, int* err, Waits waits) {
  if (!fd_table().has(fd)) return FdRef();
  FdRef r = pending_settle(fd, fd_table().get(fd));
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
  if (!fd_table().has(fd)) return;
  {
    FdRef r = fd_table().get(fd);
    if (r && r.get()->epoll_refs.load() > 0) epoll_forget(fd);
  }
  fd_table().clear(fd);
}

// newfd now names the same open file as oldfd: share its state.
void share_state(int oldfd, int newfd) {
  FdRef r = fd_table().get(oldfd);
  if (!r) return;
  fd_table().set(newfd, r.get());
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
  return real().socket(domain, type, protocol);
}

EXPORT int bind(int fd, const struct sockaddr* addr, socklen_t len) {
  return real().bind(fd, addr, len);
}

EXPORT int listen(int fd, int backlog) {
  const Runtime* rt = runtime();
  if (!rt || !rt->accelerate) return real().listen(fd, backlog);
  return finish(setup_listen(*rt, fd, backlog));
}

static int accept_common(int fd, struct sockaddr* addr, socklen_t* len, int flags, bool four) {
  int r = four ? real().accept4(fd, addr, len, flags) : real().accept(fd, addr, len);
  if (r < 0) return r;
  const Runtime* rt = runtime();
  if (rt) {
    const int saved = errno;
    FdRef l = fd_table().has(fd) ? fd_table().get(fd) : FdRef();
    // An event loop (nonblocking listener or new socket) pairs in the
    // background; a blocking accept() pairs before it returns.
    bool nonblocking = four && (flags & SOCK_NONBLOCK);
    if (!nonblocking && l && l.get()->kind() == FdState::Kind::kListener) {
      int fl = real().fcntl(fd, F_GETFL);
      nonblocking = fl >= 0 && (fl & O_NONBLOCK);
    }
    setup_accepted(*rt, l.get(), r, nonblocking);
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
  const Runtime* rt = runtime();
  if (!rt || addr == nullptr) return real().connect(fd, addr, len);
  if (fd_table().has(fd)) {
    FdRef r = pending_settle(fd, fd_table().get(fd));
    if (r && r.get()->kind() == FdState::Kind::kPending) return finish(-EALREADY);
    if (conn_of(r)) return finish(-EISCONN);
    if (r) return real().connect(fd, addr, len);  // a listener: the kernel says why not
  }
  return finish(setup_connect(*rt, fd, addr, len));
}

EXPORT int shutdown(int fd, int how) {
  int err = 0;
  if (FdRef r = io_ref(fd, 0, &err, Waits::kNever)) return finish(conn_shutdown(*conn_of(r), how));
  return real().shutdown(fd, how);
}

EXPORT int close(int fd) {
  forget_fd(fd);
  return real().close(fd);
}

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

EXPORT int epoll_wait(int epfd, struct epoll_event* ev, int maxevents, int timeout) {
  if (!runtime() || !fd_table().has(epfd)) return real().epoll_wait(epfd, ev, maxevents, timeout);
  return finish(rs_epoll_wait(epfd, ev, maxevents, timeout, nullptr));
}

EXPORT int epoll_pwait(int epfd, struct epoll_event* ev, int maxevents, int timeout,
                       const sigset_t* mask) {
  if (!runtime() || !fd_table().has(epfd))
    return real().epoll_pwait(epfd, ev, maxevents, timeout, mask);
  return finish(rs_epoll_wait(epfd, ev, maxevents, timeout, mask));
}

// ---- descriptors and options -------------------------------------------------

static int fcntl_common(bool is64, int fd, int cmd, long arg) {
  auto fn = is64 && real().fcntl64 ? real().fcntl64 : real().fcntl;
  int r = fn(fd, cmd, arg);
  if (r < 0 || !fd_table().has(fd)) return r;
  if (cmd == F_SETFL) {
    if (FdRef c = conn_ref(fd)) conn_of(c)->nonblocking.store((arg & O_NONBLOCK) != 0);
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
  if (FdRef r = conn_ref(fd)) {
    ConnectionState* c = conn_of(r);
    if (req == FIONREAD) {
      if (!arg) return finish(-EFAULT);
      *static_cast<int*>(arg) = static_cast<int>(c->stream().readable_bytes());
      return 0;
    }
    if (req == FIONBIO) {
      int rc = real().ioctl(fd, req, arg);
      if (rc == 0 && arg) c->nonblocking.store(*static_cast<int*>(arg) != 0);
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
    if (FdRef c = conn_ref(fd)) {
      auto* tv = static_cast<const timeval*>(val);
      int64_t us = int64_t{tv->tv_sec} * 1000000 + tv->tv_usec;
      (name == SO_RCVTIMEO ? conn_of(c)->rcv_timeout_us : conn_of(c)->snd_timeout_us).store(us);
    }
  }
  return r;
}

EXPORT int dup(int fd) {
  int r = real().dup(fd);
  if (r >= 0 && fd_table().has(fd)) share_state(fd, r);
  return r;
}

static int dup_onto(int oldfd, int newfd, int flags, bool three) {
  if (oldfd == newfd) return three ? (errno = EINVAL, -1) : real().dup2(oldfd, newfd);
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

// ---- exec: the stats of this image are written before it is replaced ---------

EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  flush_stats(FlushAt::kExec);
  return real().execve(path, argv, envp);
}

EXPORT int execv(const char* path, char* const argv[]) {
  flush_stats(FlushAt::kExec);
  return real().execv(path, argv);
}

EXPORT int execvp(const char* file, char* const argv[]) {
  flush_stats(FlushAt::kExec);
  return real().execvp(file, argv);
}

EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  flush_stats(FlushAt::kExec);
  return real().execvpe(file, argv, envp);
}

// ---- _exit: a program that leaves without exit handlers still reports -------

EXPORT void _exit(int status) {
  flush_stats();
  using ExitFn = void (*)(int);
  static ExitFn real_exit = reinterpret_cast<ExitFn>(dlsym(RTLD_NEXT, "_exit"));
  if (real_exit) real_exit(status);
  syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

EXPORT void _Exit(int status) { _exit(status); }
