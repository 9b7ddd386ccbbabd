// rs_xfer: the calls that move socket bytes without read/write/send/recv:
// sendfile, splice (pipe -> socket and socket -> pipe), sendmmsg/recvmmsg,
// preadv2/pwritev2, dprintf. Driven by test/preload/intercept_test.cpp,
// which runs every case twice, on plain TCP and with librsock preloaded on
// both ends, and compares what the client prints.
//
// One TCP connection joins a client and a server on 127.0.0.1:PORT. The
// server's part depends on the case:
//   sink      read to EOF; print "SERVER total=N fnv=H" (FNV-1a 64 of the bytes)
//   source    write N bytes of stream SEED, shut down writing, read to EOF;
//             print "SERVER total=N fnv=H" for what it wrote
//   slowsink  as sink, but start reading only after 600 ms
//   closer    close the connection at once
// The client runs the case and prints:
//   PROBE name=value   results that must be the same on plain TCP and
//                      under librsock (return values, errnos, offsets,
//                      file positions)
//   OK what            an invariant that held
//   CLIENT total=N fnv=H   the bytes it sent (sink cases) or received
// and "DONE". A failed check prints FAIL on stderr and exits 1.
//
// Usage: rs_xfer --role server --port P --case NAME
//        rs_xfer --role client --port P --case NAME --dir SCRATCH [--pause-ms MS]
//   --pause-ms: aio_fclose sleeps this long before its shutdown, so that a
//   pairing due meanwhile (RSOCK_TCP_FIRST) begins before it
//   cases: sendfile sendfile_errors sendfile_errors_nonblock sendfile_nonblock sendfile_epipe
//          splice_in splice_out mmsg rwv2 aio_fclose pwait2
#include <aio.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "progs.h"

namespace {

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint8_t stream_byte(uint64_t seed, uint64_t pos) {
  uint64_t w = mix64(seed * 0xD1B54A32D192ED03ull + ((pos >> 3) + 1) * 0x9E3779B97F4A7C15ull);
  return static_cast<uint8_t>(w >> (8 * (pos & 7)));
}

struct Fnv {
  uint64_t h = 0xcbf29ce484222325ull;
  uint64_t total = 0;
  void add(const void* p, size_t n) {
    auto* b = static_cast<const uint8_t*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    total += n;
  }
};

std::string g_role, g_case;
int g_pause_ms = 0;

void say(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void say(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof buf - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > static_cast<int>(sizeof buf) - 2) n = sizeof buf - 2;
  buf[n++] = '\n';
  ssize_t r = ::write(1, buf, static_cast<size_t>(n));
  (void)r;
}

[[noreturn]] void die(int line, const char* what, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
[[noreturn]] void die(int line, const char* what, const char* fmt, ...) {
  const int saved = errno;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "FAIL rs_xfer[%s/%s] line %d: %s: %s (errno %d %s)\n", g_role.c_str(),
          g_case.c_str(), line, what, msg, saved, strerror(saved));
  fflush(stderr);
  _exit(1);
}

#define CHECK(cond, ...)                            \
  do {                                              \
    if (!(cond)) die(__LINE__, #cond, __VA_ARGS__); \
  } while (0)

void sleep_ms(int ms) { usleep(static_cast<useconds_t>(ms) * 1000); }

// "ret" or "-1/ENAME" for a probe line.
std::string outcome(long r, int err) {
  if (r >= 0) return std::to_string(r);
  const char* n = err == EBADF        ? "EBADF"
                  : err == EINVAL     ? "EINVAL"
                  : err == ESPIPE     ? "ESPIPE"
                  : err == EAGAIN     ? "EAGAIN"
                  : err == EPIPE      ? "EPIPE"
                  : err == ECONNRESET ? "ECONNRESET"
                  : err == EOPNOTSUPP ? "EOPNOTSUPP"
                  : err == EOVERFLOW  ? "EOVERFLOW"
                  : err == EFAULT     ? "EFAULT"
                  : err == EMSGSIZE   ? "EMSGSIZE"
                                      : nullptr;
  return n ? std::string("-1/") + n : "-1/errno" + std::to_string(err);
}

std::atomic<int> g_sigpipes{0};

// ---- server -------------------------------------------------------------------

int run_server(int port) {
  int l = listen_loopback(port, 4);
  CHECK(l >= 0, "listen");
  say("READY");
  int s = accept(l, nullptr, nullptr);
  CHECK(s >= 0, "accept");
  close(l);
  const std::string mode = g_case == "splice_out"          ? "source"
                           : g_case == "sendfile_nonblock" ? "slowsink"
                           : g_case == "sendfile_epipe"    ? "closer"
                                                           : "sink";
  if (mode == "closer") {
    close(s);
    say("SERVER closed");
    return 0;
  }
  Fnv f;
  std::vector<uint8_t> buf(1 << 16);
  if (mode == "source") {
    const uint64_t n = 3 * 1024 * 1024 + 77;
    for (uint64_t pos = 0; pos < n;) {
      size_t k = std::min<uint64_t>(buf.size(), n - pos);
      for (size_t i = 0; i < k; ++i) buf[i] = stream_byte(11, pos + i);
      ssize_t w = write(s, buf.data(), k);
      if (w < 0 && errno == EINTR) continue;
      CHECK(w > 0, "write");
      f.add(buf.data(), static_cast<size_t>(w));
      pos += static_cast<uint64_t>(w);
    }
    CHECK(shutdown(s, SHUT_WR) == 0, "shutdown");
    for (;;) {
      ssize_t r = read(s, buf.data(), buf.size());
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
    }
  } else {
    if (mode == "slowsink") sleep_ms(600);
    for (;;) {
      ssize_t r = read(s, buf.data(), buf.size());
      if (r < 0 && errno == EINTR) continue;
      CHECK(r >= 0, "read");
      if (r == 0) break;
      f.add(buf.data(), static_cast<size_t>(r));
    }
  }
  say("SERVER total=%llu fnv=%016llx", static_cast<unsigned long long>(f.total),
      static_cast<unsigned long long>(f.h));
  close(s);
  return 0;
}

// ---- client helpers ---------------------------------------------------------

constexpr uint64_t kFileSeed = 7;
constexpr size_t kFileBytes = 3 * 1024 * 1024 + 123;

// A scratch file of kFileBytes of stream kFileSeed.
int make_file(const std::string& dir, const char* name, int flags = O_RDONLY) {
  std::string path = dir + "/" + name;
  int w = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK(w >= 0, "create %s", path.c_str());
  std::vector<uint8_t> buf(1 << 16);
  for (size_t pos = 0; pos < kFileBytes;) {
    size_t k = std::min(buf.size(), kFileBytes - pos);
    for (size_t i = 0; i < k; ++i) buf[i] = stream_byte(kFileSeed, pos + i);
    CHECK(write(w, buf.data(), k) == static_cast<ssize_t>(k), "write file");
    pos += k;
  }
  close(w);
  int fd = open(path.c_str(), flags);
  CHECK(fd >= 0, "open %s", path.c_str());
  return fd;
}

void add_file_range(Fnv* f, uint64_t from, uint64_t n) {
  uint8_t b[4096];
  while (n > 0) {
    size_t k = std::min<uint64_t>(sizeof b, n);
    for (size_t i = 0; i < k; ++i) b[i] = stream_byte(kFileSeed, from + i);
    f->add(b, k);
    from += k;
    n -= k;
  }
}

void print_sent(const Fnv& f) {
  say("CLIENT total=%llu fnv=%016llx", static_cast<unsigned long long>(f.total),
      static_cast<unsigned long long>(f.h));
}

int connect_to(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(s >= 0, "socket");
  sockaddr_in a = loopback(port);
  CHECK(connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0, "connect");
  return s;
}

off_t pos_of(int fd) { return lseek(fd, 0, SEEK_CUR); }

// ---- cases ------------------------------------------------------------------

// Offsets, counts and file positions on a blocking socket.
void case_sendfile(int s, const std::string& dir) {
  int fd = make_file(dir, "data");
  Fnv f;
  CHECK(lseek(fd, 5000, SEEK_SET) == 5000, "lseek");
  off_t off = 100;
  ssize_t r = sendfile(s, fd, &off, 0);
  say("PROBE count0=%s off=%lld pos=%lld", outcome(r, errno).c_str(), (long long)off,
      (long long)pos_of(fd));
  r = sendfile(s, fd, &off, 1);
  say("PROBE count1=%s off=%lld pos=%lld", outcome(r, errno).c_str(), (long long)off,
      (long long)pos_of(fd));
  if (r > 0) add_file_range(&f, 100, static_cast<uint64_t>(r));
  r = sendfile(s, fd, &off, 4097);
  say("PROBE count4097=%s off=%lld pos=%lld", outcome(r, errno).c_str(), (long long)off,
      (long long)pos_of(fd));
  if (r > 0) add_file_range(&f, 101, static_cast<uint64_t>(r));
  // A big count on a blocking socket: all of it in one call.
  off_t start = off;
  r = sendfile(s, fd, &off, 1024 * 1024 + 3);
  say("PROBE count1M=%s off=%lld pos=%lld", outcome(r, errno).c_str(), (long long)off,
      (long long)pos_of(fd));
  if (r > 0) add_file_range(&f, static_cast<uint64_t>(start), static_cast<uint64_t>(r));
  // Past the end: the rest, then 0.
  start = off;
  r = sendfile(s, fd, &off, kFileBytes);
  say("PROBE rest=%s off=%lld pos=%lld", outcome(r, errno).c_str(), (long long)off,
      (long long)pos_of(fd));
  if (r > 0) add_file_range(&f, static_cast<uint64_t>(start), static_cast<uint64_t>(r));
  r = sendfile(s, fd, &off, 10);
  say("PROBE at_eof=%s off=%lld", outcome(r, errno).c_str(), (long long)off);
  off = kFileBytes + 10;
  r = sendfile(s, fd, &off, 10);
  say("PROBE past_eof=%s off=%lld", outcome(r, errno).c_str(), (long long)off);
  // Without an offset: from the file position, which advances.
  CHECK(lseek(fd, 2000000, SEEK_SET) == 2000000, "lseek");
  r = sendfile(s, fd, nullptr, 700000);
  say("PROBE nooff=%s pos=%lld", outcome(r, errno).c_str(), (long long)pos_of(fd));
  if (r > 0) add_file_range(&f, 2000000, static_cast<uint64_t>(r));
  r = sendfile(s, fd, nullptr, kFileBytes);
  say("PROBE nooff_rest=%s pos=%lld", outcome(r, errno).c_str(), (long long)pos_of(fd));
  if (r > 0) add_file_range(&f, 2700000, static_cast<uint64_t>(r));
  r = sendfile64(s, fd, nullptr, 5);
  say("PROBE nooff_eof=%s pos=%lld", outcome(r, errno).c_str(), (long long)pos_of(fd));
  off64_t off64 = 7;
  r = sendfile64(s, fd, &off64, 9);
  say("PROBE sendfile64=%s off=%lld pos=%lld", outcome(r, errno).c_str(), (long long)off64,
      (long long)pos_of(fd));
  if (r > 0) add_file_range(&f, 7, static_cast<uint64_t>(r));
  close(fd);
  shutdown(s, SHUT_WR);
  print_sent(f);
}

// Bad arguments: the kernel's errno, in the kernel's order.
// nonblock: the same on an O_NONBLOCK socket (a connection still on TCP
// then makes the kernel's own sendfile), less the whole-file send, whose
// count would be what the send buffer took at that moment.
void case_sendfile_errors(int s, const std::string& dir, bool nonblock = false) {
  if (nonblock) CHECK(fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK) == 0, "O_NONBLOCK");
  int fd = make_file(dir, "data");
  int wfd = open((dir + "/data").c_str(), O_WRONLY);
  int pfd[2];
  CHECK(pipe(pfd) == 0, "pipe");
  CHECK(write(pfd[1], "abc", 3) == 3, "pipe write");
  int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  int pathfd = open((dir + "/data").c_str(), O_PATH);
  off_t off;
  auto probe = [&](const char* name, ssize_t r, off_t* o) {
    const int e = errno;
    if (o)
      say("PROBE %s=%s off=%lld", name, outcome(r, e).c_str(), (long long)*o);
    else
      say("PROBE %s=%s", name, outcome(r, e).c_str());
  };
  off = 0;
  probe("badfd", sendfile(s, 12345, &off, 10), &off);
  probe("wronly", sendfile(s, wfd, &off, 10), &off);
  probe("opath", sendfile(s, pathfd, &off, 10), &off);
  probe("pipe_off", sendfile(s, pfd[0], &off, 10), &off);
  probe("pipe_nooff", sendfile(s, pfd[0], nullptr, 10), nullptr);
  probe("dir", sendfile(s, dfd, nullptr, 10), nullptr);
  off = -1;
  probe("negoff", sendfile(s, fd, &off, 10), &off);
  off = 0;
  if (!nonblock) probe("hugecount", sendfile(s, fd, &off, static_cast<size_t>(-1)), &off);
  off = 0x7fffffffffff0000ll;
  probe("offwrap", sendfile(s, fd, &off, 1 << 20), &off);
  probe("sock_in", sendfile(s, s, nullptr, 10), nullptr);
  off = 0;
  probe("ok", sendfile(s, fd, &off, 10), &off);
  Fnv f;
  add_file_range(&f, 0, 10);
  shutdown(s, SHUT_WR);
  print_sent(f);
}

// O_NONBLOCK: partial counts, then EAGAIN; the offset or the file position
// advances by exactly what was sent. The server starts reading late.
void case_sendfile_nonblock(int s, const std::string& dir) {
  int fd = make_file(dir, "data");
  int fl = fcntl(s, F_GETFL);
  CHECK(fcntl(s, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
  // A small kernel send buffer, so that plain TCP fills up too.
  int sndbuf = 65536;
  setsockopt(s, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
  Fnv f;
  off_t off = 0;
  CHECK(lseek(fd, 4242, SEEK_SET) == 4242, "lseek");
  uint64_t sent = 0;
  int eagain = 0, calls = 0;
  while (static_cast<size_t>(off) < kFileBytes) {
    ssize_t r = sendfile(s, fd, &off, 256 * 1024);
    ++calls;
    if (r < 0) {
      CHECK(errno == EAGAIN, "sendfile nonblocking: only EAGAIN");
      ++eagain;
      pollfd p = {s, POLLOUT, 0};
      CHECK(poll(&p, 1, 20000) == 1, "POLLOUT after EAGAIN");
      continue;
    }
    CHECK(r > 0 && static_cast<uint64_t>(off) == sent + static_cast<uint64_t>(r),
          "offset advanced by the count (r=%zd off=%lld sent=%llu)", r, (long long)off,
          (unsigned long long)sent);
    sent += static_cast<uint64_t>(r);
  }
  CHECK(eagain > 0, "a nonblocking sendfile met a full socket (calls %d)", calls);
  CHECK(pos_of(fd) == 4242, "the file position did not move with an offset pointer");
  say("OK offset: %d calls, %d EAGAIN", calls, eagain);
  add_file_range(&f, 0, sent);
  // Again without an offset pointer: the file position is the cursor.
  CHECK(lseek(fd, 0, SEEK_SET) == 0, "lseek");
  uint64_t sent2 = 0;
  while (sent2 < kFileBytes) {
    ssize_t r = sendfile(s, fd, nullptr, 300000);
    if (r < 0) {
      CHECK(errno == EAGAIN, "only EAGAIN");
      pollfd p = {s, POLLOUT, 0};
      CHECK(poll(&p, 1, 20000) == 1, "POLLOUT");
      continue;
    }
    CHECK(r > 0, "progress");
    sent2 += static_cast<uint64_t>(r);
    CHECK(static_cast<uint64_t>(pos_of(fd)) == sent2, "position advanced by the count");
  }
  say("OK position");
  add_file_range(&f, 0, sent2);
  CHECK(fcntl(s, F_SETFL, fl) == 0, "blocking again");
  shutdown(s, SHUT_WR);
  print_sent(f);
}

// A peer that closed: EPIPE and SIGPIPE, or ECONNRESET.
void case_sendfile_epipe(int s, const std::string& dir) {
  int fd = make_file(dir, "data");
  sleep_ms(300);
  off_t off = 0;
  ssize_t r = 0;
  int e = 0;
  for (int i = 0; i < 200; ++i) {
    r = sendfile(s, fd, &off, 65536);
    e = errno;
    if (r < 0) break;
    if (static_cast<size_t>(off) >= kFileBytes) off = 0;
    sleep_ms(5);
  }
  CHECK(r < 0 && (e == EPIPE || e == ECONNRESET), "sendfile to a closed peer fails (%zd)", r);
  if (e == EPIPE) CHECK(g_sigpipes.load() > 0, "SIGPIPE with EPIPE");
  // MSG_NOSIGNAL does not exist for sendfile: the next one signals again.
  const int before = g_sigpipes.load();
  r = sendfile(s, fd, &off, 100);
  e = errno;
  CHECK(r < 0, "still failing");
  if (e == EPIPE) CHECK(g_sigpipes.load() > before, "SIGPIPE again");
  say("OK closed peer: %s", outcome(r, e).c_str());
  print_sent(Fnv{});
}

// pipe -> socket: a writer thread fills the pipe; splice until the pipe ends.
void case_splice_in(int s) {
  int p[2];
  CHECK(pipe(p) == 0, "pipe");
  loff_t off = 0;
  auto probe = [&](const char* name, ssize_t r) {
    say("PROBE %s=%s", name, outcome(r, errno).c_str());
  };
  probe("len0", splice(p[0], nullptr, s, nullptr, 0, 0));
  probe("badflags", splice(p[0], nullptr, s, nullptr, 10, 0x100));
  probe("off_in", splice(p[0], &off, s, nullptr, 10, 0));
  probe("off_out", splice(p[0], nullptr, s, &off, 10, 0));
  probe("empty_nonblock", splice(p[0], nullptr, s, nullptr, 10, SPLICE_F_NONBLOCK));
  probe("wrong_end", splice(p[1], nullptr, s, nullptr, 10, 0));
  Fnv want;
  std::thread writer([&] {
    std::vector<uint8_t> buf(70000);
    uint64_t pos = 0;
    for (int i = 0; i < 120; ++i) {
      size_t k = 1 + (mix64(i) % buf.size());
      for (size_t j = 0; j < k; ++j) buf[j] = stream_byte(3, pos + j);
      size_t done = 0;
      while (done < k) {
        ssize_t w = write(p[1], buf.data() + done, k - done);
        if (w < 0 && errno == EINTR) continue;
        CHECK(w > 0, "pipe write");
        done += static_cast<size_t>(w);
      }
      want.add(buf.data(), k);
      pos += k;
    }
    close(p[1]);
  });
  uint64_t total = 0;
  for (int i = 0;; ++i) {
    size_t len = i % 3 == 0 ? 1 << 20 : 1 + (mix64(i + 1000) % 100000);
    ssize_t r = splice(p[0], nullptr, s, nullptr, len, SPLICE_F_MOVE | (i % 2 ? SPLICE_F_MORE : 0));
    if (r < 0 && errno == EINTR) continue;
    CHECK(r >= 0, "splice pipe -> socket");
    if (r == 0) break;
    CHECK(static_cast<size_t>(r) <= len, "no more than asked");
    total += static_cast<uint64_t>(r);
  }
  writer.join();
  CHECK(total == want.total, "spliced %llu of %llu", (unsigned long long)total,
        (unsigned long long)want.total);
  probe("eof", splice(p[0], nullptr, s, nullptr, 10, 0));
  say("OK pipe drained");
  close(p[0]);
  shutdown(s, SHUT_WR);
  print_sent(want);
}

// socket -> pipe: the server's bytes (already in flight) through a pipe that
// a reader thread checksums.
void case_splice_out(int s) {
  int p[2];
  CHECK(pipe(p) == 0, "pipe");
  loff_t off = 0;
  auto probe = [&](const char* name, ssize_t r) {
    say("PROBE %s=%s", name, outcome(r, errno).c_str());
  };
  probe("off_in", splice(s, &off, p[1], nullptr, 10, 0));
  probe("off_out", splice(s, nullptr, p[1], &off, 10, 0));
  probe("wrong_end", splice(s, nullptr, p[0], nullptr, 10, 0));
  sleep_ms(200);  // the server's first bytes are waiting in the socket
  Fnv got;
  std::thread reader([&] {
    std::vector<uint8_t> buf(50000);
    for (;;) {
      ssize_t r = read(p[0], buf.data(), buf.size());
      if (r < 0 && errno == EINTR) continue;
      CHECK(r >= 0, "pipe read");
      if (r == 0) break;
      got.add(buf.data(), static_cast<size_t>(r));
    }
  });
  uint64_t total = 0;
  for (int i = 0;; ++i) {
    size_t len = i % 4 == 0 ? 1 << 20 : 1 + (mix64(i) % 90000);
    ssize_t r = splice(s, nullptr, p[1], nullptr, len, SPLICE_F_MOVE);
    if (r < 0 && errno == EINTR) continue;
    CHECK(r >= 0, "splice socket -> pipe");
    if (r == 0) break;
    CHECK(static_cast<size_t>(r) <= len, "no more than asked");
    total += static_cast<uint64_t>(r);
  }
  close(p[1]);
  reader.join();
  CHECK(got.total == total, "the pipe got what splice reported");
  // At EOF: 0 again; a pipe without readers: EPIPE and SIGPIPE.
  int q[2];
  CHECK(pipe(q) == 0, "pipe");
  close(q[0]);
  const int before = g_sigpipes.load();
  ssize_t r = splice(s, nullptr, q[1], nullptr, 10, 0);
  say("PROBE no_reader=%s sigpipe=%d", outcome(r, errno).c_str(), g_sigpipes.load() > before);
  close(q[1]);
  say("OK pipe got %llu", (unsigned long long)got.total);
  close(p[0]);
  shutdown(s, SHUT_WR);
  print_sent(got);
}

// sendmmsg/recvmmsg on a stream: totals, not message boundaries, are the
// kernel's promise; return values that do not depend on timing are probed.
void case_mmsg(int s) {
  Fnv f;
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<iovec> iov;
  std::vector<mmsghdr> msgs(5);
  uint64_t pos = 0;
  const size_t sizes[] = {1, 100, 70000, 4096, 333};
  bufs.reserve(8);
  iov.reserve(8);
  for (int m = 0; m < 5; ++m) {
    memset(&msgs[m], 0, sizeof msgs[m]);
    const int parts = m == 2 ? 3 : 1;
    const size_t first = iov.size();
    for (int k = 0; k < parts; ++k) {
      size_t n = sizes[m] / parts + (k == parts - 1 ? sizes[m] % parts : 0);
      bufs.emplace_back(n);
      for (size_t i = 0; i < n; ++i) bufs.back()[i] = stream_byte(5, pos + i);
      f.add(bufs.back().data(), n);
      pos += n;
      iov.push_back({bufs.back().data(), n});
    }
    msgs[m].msg_hdr.msg_iov = &iov[first];
    msgs[m].msg_hdr.msg_iovlen = parts;
  }
  int r = sendmmsg(s, msgs.data(), 5, 0);
  std::string lens;
  for (int m = 0; m < 5; ++m) lens += std::to_string(msgs[m].msg_len) + (m < 4 ? "," : "");
  say("PROBE sendmmsg=%s lens=%s", outcome(r, errno).c_str(), lens.c_str());
  r = sendmmsg(s, msgs.data(), 0, 0);
  say("PROBE sendmmsg_vlen0=%s", outcome(r, errno).c_str());
  // recvmmsg on our side: nothing will come (the server only reads).
  std::vector<uint8_t> rb(4096);
  iovec riov = {rb.data(), rb.size()};
  mmsghdr rm = {};
  rm.msg_hdr.msg_iov = &riov;
  rm.msg_hdr.msg_iovlen = 1;
  r = recvmmsg(s, &rm, 1, MSG_DONTWAIT, nullptr);
  say("PROBE recvmmsg_empty=%s", outcome(r, errno).c_str());
  timespec bad = {0, 2000000000};
  r = recvmmsg(s, &rm, 1, MSG_DONTWAIT, &bad);
  say("PROBE recvmmsg_badtimeout=%s", outcome(r, errno).c_str());
  shutdown(s, SHUT_WR);
  print_sent(f);
}

// The server side of mmsg reads with recvmmsg (see run_mmsg_server).

// preadv2/pwritev2 (offset -1 and not), preadv/pwritev, dprintf.
void case_rwv2(int s) {
  Fnv f;
  char a[] = "hello ", b[] = "world\n";
  iovec v[2] = {{a, 6}, {b, 6}};
  auto probe = [&](const char* name, ssize_t r) {
    say("PROBE %s=%s", name, outcome(r, errno).c_str());
  };
  ssize_t r = pwritev2(s, v, 2, -1, 0);
  probe("pwritev2", r);
  if (r > 0) f.add("hello world\n", static_cast<size_t>(r));
  r = pwritev2(s, v, 2, -1, RWF_NOWAIT);
  probe("pwritev2_nowait", r);
  if (r > 0) f.add("hello world\n", static_cast<size_t>(r));
  probe("pwritev2_off0", pwritev2(s, v, 2, 0, 0));
  probe("pwritev2_badflag", pwritev2(s, v, 2, -1, 0x10000));
  probe("pwritev_m1", pwritev(s, v, 2, -1));
  probe("pwritev_off0", pwritev(s, v, 2, 0));
  char rbuf[16];
  iovec rv = {rbuf, sizeof rbuf};
  probe("preadv2_nowait", preadv2(s, &rv, 1, -1, RWF_NOWAIT));
  probe("preadv2_off0", preadv2(s, &rv, 1, 0, 0));
  probe("preadv_m1", preadv(s, &rv, 1, -1));
  probe("preadv_off0", preadv(s, &rv, 1, 0));
  probe("pread", pread(s, rbuf, sizeof rbuf, 0));
  probe("pwrite", pwrite(s, rbuf, 1, 0));
  iovec empty = {rbuf, 0};
  probe("preadv2_empty", preadv2(s, &empty, 1, -1, 0));
  int n = dprintf(s, "dprintf %d %s\n", 42, "x");
  probe("dprintf", n);
  if (n > 0) f.add("dprintf 42 x\n", static_cast<size_t>(n));
  std::string big(5000, 'q');
  n = dprintf(s, "%s", big.c_str());
  probe("dprintf_big", n);
  if (n > 0) f.add(big.data(), static_cast<size_t>(n));
  shutdown(s, SHUT_WR);
  print_sent(f);
}

// POSIX AIO runs on glibc's internal calls: on an accelerated socket it is
// refused (EOPNOTSUPP) rather than run on the kernel socket; on plain TCP it
// completes. fclose of a stream on a dup of the socket closes that fd: a new
// fd that reuses the number must be an ordinary fd again.
void case_aio_fclose(int s) {
  Fnv f;
  static char msg[100];
  memset(msg, 'a', sizeof msg);
  aiocb cb = {};
  cb.aio_fildes = s;
  cb.aio_buf = msg;
  cb.aio_nbytes = sizeof msg;
  if (aio_write(&cb) == 0) {
    const aiocb* list[1] = {&cb};
    while (aio_error(&cb) == EINPROGRESS) aio_suspend(list, 1, nullptr);
    CHECK(aio_return(&cb) == static_cast<ssize_t>(sizeof msg), "aio_write completed");
    f.add(msg, sizeof msg);
    say("NOTE aio done");
  } else {
    CHECK(errno == EOPNOTSUPP, "aio_write refused with EOPNOTSUPP");
    say("NOTE aio refused");
  }
  say("OK aio");
  int d = dup(s);
  CHECK(d >= 0, "dup");
  FILE* file = fdopen(d, "w");
  CHECK(file != nullptr, "fdopen");
  CHECK(fclose(file) == 0, "fclose");
  int p[2];
  CHECK(pipe(p) == 0, "pipe");
  say("PROBE reused=%d", p[0] == d || p[1] == d);
  CHECK(fcntl(p[0], F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
  CHECK(write(p[1], "xyz", 3) == 3, "pipe write");
  char buf[8] = {};
  ssize_t r = read(p[0], buf, sizeof buf);
  say("PROBE pipe_read=%s", outcome(r, errno).c_str());
  close(p[0]);
  close(p[1]);
  const char tail[] = "after fclose\n";
  CHECK(write(s, tail, sizeof tail - 1) == static_cast<ssize_t>(sizeof tail - 1), "write");
  f.add(tail, sizeof tail - 1);
  if (g_pause_ms > 0) sleep_ms(g_pause_ms);
  shutdown(s, SHUT_WR);
  print_sent(f);
}

// epoll_pwait2: the socket's readiness as epoll_wait reports it.
void case_pwait2(int s) {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  CHECK(ep >= 0, "epoll_create1");
  epoll_event ev = {};
  ev.events = EPOLLOUT;
  ev.data.u64 = 7;
  CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0, "epoll_ctl");
  epoll_event got[4] = {};
  timespec ts = {5, 0};
  int n = epoll_pwait2(ep, got, 4, &ts, nullptr);
  say("PROBE pwait2_out=%s data=%llu events=%x", outcome(n, errno).c_str(),
      n > 0 ? (unsigned long long)got[0].data.u64 : 0ull, n > 0 ? got[0].events : 0u);
  // Nothing to read: the timeout (50 ms) expires.
  ev.events = EPOLLIN;
  CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev) == 0, "epoll_ctl MOD");
  ts = {0, 50000000};
  n = epoll_pwait2(ep, got, 4, &ts, nullptr);
  say("PROBE pwait2_in=%s", outcome(n, errno).c_str());
  ts = {0, 2000000000};
  n = epoll_pwait2(ep, got, 4, &ts, nullptr);
  say("PROBE pwait2_badts=%s", outcome(n, errno).c_str());
  close(ep);
  Fnv f;
  shutdown(s, SHUT_WR);
  print_sent(f);
}

int run_mmsg_server_side(int s) {
  // Reads with recvmmsg and MSG_WAITFORONE until EOF.
  Fnv f;
  std::vector<std::vector<uint8_t>> bufs(8, std::vector<uint8_t>(3000));
  std::vector<iovec> iov(8);
  std::vector<mmsghdr> m(8);
  int calls = 0;
  for (;;) {
    for (int i = 0; i < 8; ++i) {
      iov[i] = {bufs[i].data(), bufs[i].size()};
      memset(&m[i], 0, sizeof m[i]);
      m[i].msg_hdr.msg_iov = &iov[i];
      m[i].msg_hdr.msg_iovlen = 1;
    }
    int r = recvmmsg(s, m.data(), 8, MSG_WAITFORONE, nullptr);
    if (r < 0 && errno == EINTR) continue;
    CHECK(r > 0, "recvmmsg");
    ++calls;
    bool eof = false;
    for (int i = 0; i < r; ++i) {
      if (m[i].msg_len == 0) eof = true;
      f.add(bufs[i].data(), m[i].msg_len);
    }
    if (eof) break;
  }
  say("SERVER total=%llu fnv=%016llx", static_cast<unsigned long long>(f.total),
      static_cast<unsigned long long>(f.h));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--role") g_role = argv[i + 1];
    if (k == "--port") port = atoi(argv[i + 1]);
    if (k == "--case") g_case = argv[i + 1];
    if (k == "--dir") dir = argv[i + 1];
    if (k == "--pause-ms") g_pause_ms = atoi(argv[i + 1]);
  }
  if (port <= 0 || (g_role != "server" && g_role != "client") || g_case.empty()) {
    fprintf(stderr,
            "usage: rs_xfer --role server|client --port P --case NAME [--dir D] [--pause-ms MS]\n");
    return 2;
  }
  struct sigaction sa = {};
  sa.sa_handler = [](int) { g_sigpipes.fetch_add(1); };
  sigaction(SIGPIPE, &sa, nullptr);
  if (g_role == "server") {
    if (g_case != "mmsg") return run_server(port);
    int l = listen_loopback(port, 4);
    CHECK(l >= 0, "listen");
    say("READY");
    int s = accept(l, nullptr, nullptr);
    CHECK(s >= 0, "accept");
    return run_mmsg_server_side(s);
  }
  int s = connect_to(port);
  if (g_case == "sendfile")
    case_sendfile(s, dir);
  else if (g_case == "sendfile_errors")
    case_sendfile_errors(s, dir);
  else if (g_case == "sendfile_errors_nonblock")
    case_sendfile_errors(s, dir, true);
  else if (g_case == "sendfile_nonblock")
    case_sendfile_nonblock(s, dir);
  else if (g_case == "sendfile_epipe")
    case_sendfile_epipe(s, dir);
  else if (g_case == "splice_in")
    case_splice_in(s);
  else if (g_case == "splice_out")
    case_splice_out(s);
  else if (g_case == "mmsg")
    case_mmsg(s);
  else if (g_case == "rwv2")
    case_rwv2(s);
  else if (g_case == "aio_fclose")
    case_aio_fclose(s);
  else if (g_case == "pwait2")
    case_pwait2(s);
  else
    die(__LINE__, "case", "unknown case %s", g_case.c_str());
  // Wait for the server to finish reading (it closes after EOF).
  char c;
  while (read(s, &c, 1) > 0) {
  }
  close(s);
  say("DONE");
  return 0;
}
