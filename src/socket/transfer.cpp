// sendfile and splice on accelerated sockets (see transfer.h).
//
// The kernel's order of checks is kept, because a program (or our tests)
// can tell the errno apart: sendfile (fs/read_write.c do_sendfile, then
// splice_direct_to_actor) and splice (fs/splice.c). The data moves through
// a bounce buffer of at most kChunk bytes per step.
#include "socket/transfer.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "common/clock.h"
#include "common/real.h"
#include "socket/socket.h"

namespace rsock {
namespace {

constexpr size_t kChunk = 256 * 1024;
constexpr size_t kMaxRwCount = INT_MAX & ~size_t{4095};  // the kernel's MAX_RW_COUNT
constexpr size_t kPage = 4096;

struct Buffer {
  explicit Buffer(size_t n) : p(static_cast<char*>(malloc(n))), len(n) {}
  ~Buffer() { free(p); }
  char* p;
  size_t len;
};

// A connection still on TCP before its pairing (RSOCK_TCP_FIRST) may pair
// while a transfer runs: its stream is sealed then, a call on it returns
// Stream::kForwarded, and the transfer goes on with the successor, which
// continues from the same counts (as conn_send and conn_recv do). So the
// functions below take the connection by pointer and move it on.

// Free ring space, waiting for some as send() would (O_NONBLOCK: -EAGAIN;
// SO_SNDTIMEO: -EAGAIN after it). Errors are send()'s: -EPIPE, -ECONNRESET.
// A signal handler ends the wait as it ends send()'s: -EINTR once bytes
// moved (done) or with a timeout, else an SA_RESTART handler restarts it.
ssize_t wait_room(ConnectionState*& c, bool nonblock, int64_t deadline, size_t done) {
  for (;;) {
    const size_t room = c->stream().writable_bytes();
    if (room > 0) return static_cast<ssize_t>(room);
    const ssize_t e = c->stream().send(nullptr, 0);  // the error a send would report
    if (e == Stream::kForwarded) {
      c = c->next();
      continue;
    }
    if (e < 0) return e;
    if (nonblock) return -EAGAIN;
    const OnSignal on_signal =
        deadline >= 0 || done > 0 ? OnSignal::kInterrupt : OnSignal::kRestartable;
    const int w = conn_wait(*c, kWantSpace, deadline, on_signal);
    if (w == -ERESTART) continue;  // nothing moved yet: as the restarted call
    if (w < 0) return w;
  }
}

// Sends all n bytes, which were already taken from their source. The room
// for them was there a moment ago; a sender racing us may have taken it,
// and then we wait for it regardless of O_NONBLOCK rather than drop bytes.
ssize_t send_all(ConnectionState*& c, const char* p, size_t n) {
  size_t done = 0;
  while (done < n) {
    iovec iov = {const_cast<char*>(p) + done, n - done};
    const ssize_t k = c->stream().send(&iov, 1);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k == Stream::kForwarded) {
      c = c->next();
      continue;
    }
    if (k != -EAGAIN) return done ? static_cast<ssize_t>(done) : k;
    (void)conn_wait(*c, kWantSpace, -1, OnSignal::kContinue);  // the bytes must still go
  }
  return static_cast<ssize_t>(done);
}

// The fd's open mode, or -EBADF (invalid, O_PATH).
int open_mode(int fd) {
  const int fl = real().fcntl(fd, F_GETFL);
  if (fl < 0) return -EBADF;
  if (fl & O_PATH) return -EBADF;
  return fl;
}

// Waits until pipe_fd can be read (want POLLIN) or written (POLLOUT), as
// splice does: immediately -EAGAIN when nonblocking. Returns the revents.
int wait_pipe(int pipe_fd, short want, bool nonblock) {
  for (;;) {
    pollfd p = {pipe_fd, want, 0};
    const int rc = real().poll(&p, 1, nonblock ? 0 : -1);
    if (rc > 0) return p.revents;
    if (rc == 0) return -EAGAIN;
    if (errno != EINTR) return -errno;
    return -EINTR;
  }
}

}  // namespace

ssize_t conn_sendfile(ConnectionState& conn, int in_fd, off_t* offset, size_t count,
                      bool* sigpipe) {
  *sigpipe = false;
  ConnectionState* c = &conn;
  // A connection still on TCP (before its pairing, or before its sender
  // switched) whose socket does not block: the kernel's sendfile does it
  // all, checks, errors and SIGPIPE included, in one system call instead
  // of the copy's six (nginx answers each fresh connection so).
  while (c->nonblocking()) {
    const ssize_t k = c->stream().sendfile_tcp(in_fd, offset, count);
    if (k == Stream::kForwarded) {
      c = c->next();
      continue;
    }
    if (k != Stream::kNotOnTcp) return k;
    break;
  }
  const int mode = open_mode(in_fd);
  if (mode < 0) return mode;
  if ((mode & O_ACCMODE) == O_WRONLY) return -EBADF;
  off_t pos;
  if (offset) {
    pos = *offset;
    if (lseek(in_fd, 0, SEEK_CUR) < 0 && errno == ESPIPE) return -ESPIPE;
  } else {
    pos = lseek(in_fd, 0, SEEK_CUR);
    if (pos < 0) pos = 0;  // not seekable: the checks below refuse it
  }
  if (static_cast<ssize_t>(count) < 0 || pos < 0) return -EINVAL;
  // pos + count past the largest offset: EINVAL, as the kernel's. Checked
  // without computing the sum, whose overflow would be undefined.
  if (static_cast<off_t>(std::min(count, kMaxRwCount)) > std::numeric_limits<off_t>::max() - pos)
    return -EINVAL;
  count = std::min(count, kMaxRwCount);
  // Only a regular file or a block device can be the source (the kernel
  // will not drop bytes of a stream it cannot seek back in).
  struct stat st;
  if (fstat(in_fd, &st) != 0) return -EBADF;
  if (!S_ISREG(st.st_mode) && !S_ISBLK(st.st_mode)) return -EINVAL;
  if (count == 0) return 0;

  const bool nonblock = c->nonblocking();
  const int64_t deadline = deadline_after_us(c->snd_timeout_us());
  Buffer buf(std::min(count, kChunk));
  if (!buf.p) return -ENOMEM;
  size_t done = 0;
  ssize_t err = 0;
  while (done < count) {
    const ssize_t room = wait_room(c, nonblock, deadline, done);
    if (room < 0) {
      err = room;
      break;
    }
    const size_t want = std::min({count - done, static_cast<size_t>(room), buf.len});
    ssize_t got;
    do {
      got = pread(in_fd, buf.p, want, pos);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
      err = -errno;
      break;
    }
    if (got == 0) break;  // end of file
    const ssize_t sent = send_all(c, buf.p, static_cast<size_t>(got));
    if (sent < 0) {
      err = sent;
      break;
    }
    done += static_cast<size_t>(sent);
    pos += sent;
    if (sent < got || static_cast<size_t>(got) < want) break;
  }
  if (offset)
    *offset = pos;
  else
    lseek(in_fd, pos, SEEK_SET);
  if (done > 0) return static_cast<ssize_t>(done);
  if (err == -EPIPE) *sigpipe = true;
  return err;
}

ssize_t conn_splice_from_pipe(ConnectionState& conn, int pipe_fd, size_t len, unsigned flags,
                              bool* sigpipe) {
  *sigpipe = false;
  ConnectionState* c = &conn;
  const int mode = open_mode(pipe_fd);
  if (mode < 0 || (mode & O_ACCMODE) == O_WRONLY) return -EBADF;
  const bool pipe_nonblock = (flags & SPLICE_F_NONBLOCK) || (mode & O_NONBLOCK);
  const bool nonblock = c->nonblocking();
  const int64_t deadline = deadline_after_us(c->snd_timeout_us());
  len = std::min(len, kMaxRwCount);
  Buffer buf(std::min(len, kChunk));
  if (!buf.p) return -ENOMEM;
  size_t done = 0;
  ssize_t err = 0;
  while (done < len) {
    // Data in the pipe first (splice waits for it before it looks at the
    // socket); a pipe without writers is the end.
    int avail = 0;
    if (real().ioctl(pipe_fd, FIONREAD, &avail) != 0) avail = 0;
    if (avail == 0) {
      if (done > 0) break;
      const int ev = wait_pipe(pipe_fd, POLLIN, pipe_nonblock);
      if (ev < 0) {
        err = ev;
        break;
      }
      if (real().ioctl(pipe_fd, FIONREAD, &avail) != 0) avail = 0;
      if (avail == 0) {
        if (ev & POLLHUP) break;  // no writer left: 0
        continue;
      }
    }
    const ssize_t room = wait_room(c, nonblock, deadline, done);
    if (room < 0) {
      err = room;
      break;
    }
    const size_t want =
        std::min({len - done, static_cast<size_t>(room), static_cast<size_t>(avail), buf.len});
    ssize_t got;
    do {
      got = real().read(pipe_fd, buf.p, want);
    } while (got < 0 && errno == EINTR);
    if (got < 0) {
      err = -errno;
      break;
    }
    if (got == 0) break;
    const ssize_t sent = send_all(c, buf.p, static_cast<size_t>(got));
    if (sent < 0) {
      err = sent;
      break;
    }
    done += static_cast<size_t>(sent);
    if (sent < got) break;
  }
  if (done > 0) return static_cast<ssize_t>(done);
  if (err == -EPIPE) *sigpipe = true;
  return err;
}

ssize_t conn_splice_to_pipe(ConnectionState& c, int pipe_fd, size_t len, unsigned flags,
                            bool* sigpipe) {
  *sigpipe = false;
  const int mode = open_mode(pipe_fd);
  if (mode < 0 || (mode & O_ACCMODE) == O_RDONLY) return -EBADF;
  const bool pipe_nonblock = (flags & SPLICE_F_NONBLOCK) || (mode & O_NONBLOCK);
  len = std::min(len, kMaxRwCount);
  // Room in the pipe (a pipe without readers: EPIPE and SIGPIPE, before
  // anything is read, as the kernel does).
  const int ev = wait_pipe(pipe_fd, POLLOUT, pipe_nonblock);
  if (ev < 0) return ev;
  if (ev & POLLERR) {
    *sigpipe = true;
    return -EPIPE;
  }
  // How much the pipe takes without blocking: a write fills whole pages, so
  // count every byte already in it as a full page (at least one page is
  // free, since it polled writable).
  const int cap = real().fcntl(pipe_fd, F_GETPIPE_SZ);
  int used = 0;
  if (real().ioctl(pipe_fd, FIONREAD, &used) != 0) used = 0;
  size_t slots = cap > 0 ? static_cast<size_t>(cap) / kPage : 1;
  size_t busy = std::min(static_cast<size_t>(used), slots);
  if (used > 0 && busy == 0) busy = 1;
  const size_t space = std::max<size_t>(kPage, (slots - std::min(busy, slots)) * kPage);
  const size_t want = std::min({len, space, kChunk});
  Buffer buf(want);
  if (!buf.p) return -ENOMEM;
  // Peek, write to the pipe, then consume exactly what the pipe took: no
  // byte leaves the ring that did not reach the pipe.
  iovec iov = {buf.p, want};
  const ssize_t got = conn_recv(c, &iov, 1, MSG_PEEK);
  if (got <= 0) return got;
  ssize_t put;
  do {
    put = real().write(pipe_fd, buf.p, static_cast<size_t>(got));
  } while (put < 0 && errno == EINTR);
  if (put <= 0) return put < 0 ? -errno : 0;
  iovec take = {buf.p, static_cast<size_t>(put)};
  const ssize_t taken = conn_recv(c, &take, 1, MSG_DONTWAIT);
  return taken < 0 ? taken : put;
}

}  // namespace rsock
