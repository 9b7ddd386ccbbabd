// rs_stream: one verifying endpoint of a TCP byte stream, driven by the
// preload tests (test/preload). It uses only plain POSIX socket calls, so it
// behaves the same with or without librsock preloaded; the tests compare what
// it reports with the stats librsock writes.
//
// Each direction carries a deterministic pseudo-random stream: byte i of the
// stream with seed S is a pure function of (S, i), so the reader regenerates
// it and compares byte by byte whatever the chunking was on either side. Both
// sides also hash what they moved (64-bit FNV-1a over little-endian words)
// and print it, so writer and reader can be cross-checked by the harness.
//
// Usage (all options are "--name value"; flags take no value):
//   --role server|client   server: bind addr:port, listen, print READY, accept one;
//                          both print CONNECTED once the connection is up
//   --addr A --port P      127.0.0.1 by default; "::1" for IPv6
//   --send N               bytes to send; -1: until a write fails (peer gone)
//   --expect M             bytes to read; -1: until EOF or a read error
//   --expect-eof           after M bytes the next read must return 0 (EOF)
//   --tx-seed S --rx-seed S  stream seeds of the sending/receiving direction
//   --max-write B --max-read B  largest single write/read (default 256 KiB)
//   --write-api write|mixed     mixed: write/send/writev/sendmsg/sendto
//   --read-api plain|mixed      mixed: read/recv/readv/recvmsg/MSG_WAITALL/MSG_PEEK
//   --order duplex|send-first|recv-first  duplex: a writer thread runs beside the reader
//   --send-wait blocking|poll|epoll  send-first: how the writer waits for room.
//                          poll/epoll: O_NONBLOCK while sending, and on EAGAIN a
//                          wait for POLLOUT / level-triggered EPOLLOUT alone (no
//                          POLLIN: as Python's sendall with a timeout, or an
//                          event loop that paused reading while it drains)
//   --shut-wr              shutdown(SHUT_WR) after the last byte was sent
//   --nodelay              set TCP_NODELAY on the connection
//   --nonblocking-connect  client: connect an O_NONBLOCK socket, wait for EPOLLOUT
//                          (edge-triggered epoll), check SO_ERROR, then go on
//                          blocking; prints "CONNECT einprogress" (or "CONNECT
//                          immediate" when connect() returned 0)
//   --progress B           print "PROGRESS tx" / "PROGRESS rx" once B bytes moved
//   --pause-ms T           sleep T ms once connected, before any read or write
//   --read-after-ms T      sleep T ms before the first read (after any sending
//                          that comes first)
//   --linger-ms T          sleep T ms before close()
//   --stay-ms T            sleep T ms after close(), before exit
//   --no-close             exit with the connection open (no close())
//   --exec-after PATH      after the close (and --stay-ms), exec PATH (no
//                          arguments) instead of exiting; nothing printed after
//   --protocol N           client: socket()'s protocol (262: IPPROTO_MPTCP);
//                          exit 3 when the kernel refuses it
// Output: one line "RESULT sent=.. received=.. tx_hash=.. rx_hash=.. tx_end=..
// rx_end=.. tx_errors=.. cpu_ms=.." on stdout (cpu_ms: the process's user and
// system time so far). tx_end is "done" or the errno name that
// ended sending; rx_end is "count" (M bytes read), "eof" or an errno name.
// Exit status: 0 when every byte read matched and nothing unexpected
// happened, 1 on a mismatch or unexpected error (details on stderr), 2 on
// bad usage. SIGPIPE is ignored: write errors are reported, not fatal.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace {

// ---- deterministic data -----------------------------------------------------

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Word k of the stream with this seed (splitmix64 of a counter).
uint64_t stream_word(uint64_t seed, uint64_t k) {
  return mix64(seed * 0xD1B54A32D192ED03ull + (k + 1) * 0x9E3779B97F4A7C15ull);
}

// Writes bytes [pos, pos + n) of stream `seed` into out.
void stream_fill(uint64_t seed, uint64_t pos, uint8_t* out, size_t n) {
  while (n > 0 && (pos & 7) != 0) {
    uint64_t w = stream_word(seed, pos >> 3);
    *out++ = static_cast<uint8_t>(w >> (8 * (pos & 7)));
    ++pos;
    --n;
  }
  while (n >= 8) {
    uint64_t w = stream_word(seed, pos >> 3);
    memcpy(out, &w, 8);  // little-endian: byte j of the word is byte pos + j
    out += 8;
    pos += 8;
    n -= 8;
  }
  if (n > 0) {
    uint64_t w = stream_word(seed, pos >> 3);
    for (size_t j = 0; j < n; ++j) out[j] = static_cast<uint8_t>(w >> (8 * j));
  }
}

// A small PRNG for chunk sizes and API choices (xorshift64*).
struct Rng {
  explicit Rng(uint64_t seed) : s(mix64(seed) | 1) {}
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 0x2545F4914F6CDD1Dull;
  }
  // 1..max, a quarter tiny, a quarter small, half anywhere up to max.
  size_t size(size_t max) {
    uint64_t r = next();
    size_t cap = max;
    switch (r & 3) {
      case 0:
        cap = std::min<size_t>(max, 64);
        break;
      case 1:
        cap = std::min<size_t>(max, 4096);
        break;
      default:
        break;
    }
    return 1 + static_cast<size_t>((r >> 8) % cap);
  }
  uint64_t s;
};

// FNV-1a over 64-bit little-endian words, independent of how the bytes were
// chunked; the tail (fewer than 8 bytes) and the length are folded in at the end.
struct StreamHash {
  void update(const uint8_t* p, size_t n) {
    total += n;
    while (n > 0 && nc > 0 && nc < 8) {
      carry[nc++] = *p++;
      --n;
    }
    if (nc == 8) {
      word(carry);
      nc = 0;
    }
    while (n >= 8) {
      word(p);
      p += 8;
      n -= 8;
    }
    while (n > 0) {
      carry[nc++] = *p++;
      --n;
    }
  }
  uint64_t final() const {
    uint64_t x = h;
    for (int i = 0; i < nc; ++i) x = (x ^ carry[i]) * 0x100000001b3ull;
    return (x ^ total) * 0x100000001b3ull;
  }
  void word(const uint8_t* p) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = (h ^ w) * 0x100000001b3ull;
    h ^= h >> 32;
  }
  uint64_t h = 0xcbf29ce484222325ull;
  uint64_t total = 0;
  uint8_t carry[8] = {};
  int nc = 0;
};

// ---- options ------------------------------------------------------------------

struct Options {
  std::string role;
  std::string addr = "127.0.0.1";
  int port = 0;
  int64_t send = 0;
  int64_t expect = 0;
  bool expect_eof = false;
  uint64_t tx_seed = 1;
  uint64_t rx_seed = 2;
  size_t max_write = 256 << 10;
  size_t max_read = 256 << 10;
  std::string write_api = "mixed";
  std::string read_api = "plain";
  std::string order = "duplex";
  std::string send_wait = "blocking";
  bool shut_wr = false;
  bool nodelay = false;
  bool nonblocking_connect = false;
  int64_t progress = 0;
  int pause_ms = 0;
  int read_after_ms = 0;
  int linger_ms = 0;
  int stay_ms = 0;
  bool no_close = false;
  std::string exec_after;
  int protocol = 0;
};

Options g_opt;
std::atomic<bool> g_failed{false};

void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char* fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "rs_stream[%s]: %s\n", g_opt.role.c_str(), msg);
  g_failed.store(true);
}

void say(const char* line) {
  // Unbuffered: the harness polls the file while we run.
  std::string s = std::string(line) + "\n";
  ssize_t r = ::write(1, s.data(), s.size());
  (void)r;
}

const char* errno_name(int e) {
  switch (e) {
    case EPIPE:
      return "EPIPE";
    case ECONNRESET:
      return "ECONNRESET";
    case EAGAIN:
      return "EAGAIN";
    case EINTR:
      return "EINTR";
    case EBADF:
      return "EBADF";
    case ENOTCONN:
      return "ENOTCONN";
    case ETIMEDOUT:
      return "ETIMEDOUT";
    case EINVAL:
      return "EINVAL";
    case EFAULT:
      return "EFAULT";
    default:
      return "EOTHER";
  }
}

bool parse_args(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "rs_stream: %s needs a value\n", k.c_str());
        exit(2);
      }
      return argv[++i];
    };
    if (k == "--role")
      g_opt.role = val();
    else if (k == "--addr")
      g_opt.addr = val();
    else if (k == "--port")
      g_opt.port = atoi(val());
    else if (k == "--send")
      g_opt.send = strtoll(val(), nullptr, 10);
    else if (k == "--expect")
      g_opt.expect = strtoll(val(), nullptr, 10);
    else if (k == "--expect-eof")
      g_opt.expect_eof = true;
    else if (k == "--tx-seed")
      g_opt.tx_seed = strtoull(val(), nullptr, 10);
    else if (k == "--rx-seed")
      g_opt.rx_seed = strtoull(val(), nullptr, 10);
    else if (k == "--max-write")
      g_opt.max_write = strtoull(val(), nullptr, 10);
    else if (k == "--max-read")
      g_opt.max_read = strtoull(val(), nullptr, 10);
    else if (k == "--write-api")
      g_opt.write_api = val();
    else if (k == "--read-api")
      g_opt.read_api = val();
    else if (k == "--order")
      g_opt.order = val();
    else if (k == "--shut-wr")
      g_opt.shut_wr = true;
    else if (k == "--nodelay")
      g_opt.nodelay = true;
    else if (k == "--nonblocking-connect")
      g_opt.nonblocking_connect = true;
    else if (k == "--progress")
      g_opt.progress = strtoll(val(), nullptr, 10);
    else if (k == "--pause-ms")
      g_opt.pause_ms = atoi(val());
    else if (k == "--read-after-ms")
      g_opt.read_after_ms = atoi(val());
    else if (k == "--linger-ms")
      g_opt.linger_ms = atoi(val());
    else if (k == "--send-wait")
      g_opt.send_wait = val();
    else if (k == "--stay-ms")
      g_opt.stay_ms = atoi(val());
    else if (k == "--no-close")
      g_opt.no_close = true;
    else if (k == "--exec-after")
      g_opt.exec_after = val();
    else if (k == "--protocol")
      g_opt.protocol = atoi(val());
    else {
      fprintf(stderr, "rs_stream: unknown option %s\n", k.c_str());
      return false;
    }
  }
  if (g_opt.role != "server" && g_opt.role != "client") return false;
  if (g_opt.port <= 0 || g_opt.max_write == 0 || g_opt.max_read == 0) return false;
  if (g_opt.order != "duplex" && g_opt.order != "send-first" && g_opt.order != "recv-first")
    return false;
  if (g_opt.send_wait != "blocking" && g_opt.send_wait != "poll" && g_opt.send_wait != "epoll")
    return false;
  if (g_opt.send_wait != "blocking" && g_opt.order != "send-first") return false;
  return true;
}

// ---- connection -----------------------------------------------------------------

socklen_t make_addr(sockaddr_storage* ss) {
  memset(ss, 0, sizeof *ss);
  if (g_opt.addr.find(':') != std::string::npos) {
    auto* a = reinterpret_cast<sockaddr_in6*>(ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(g_opt.port));
    if (inet_pton(AF_INET6, g_opt.addr.c_str(), &a->sin6_addr) != 1) return 0;
    return sizeof *a;
  }
  auto* a = reinterpret_cast<sockaddr_in*>(ss);
  a->sin_family = AF_INET;
  a->sin_port = htons(static_cast<uint16_t>(g_opt.port));
  if (inet_pton(AF_INET, g_opt.addr.c_str(), &a->sin_addr) != 1) return 0;
  return sizeof *a;
}

// The event-loop way: O_NONBLOCK, connect, EPOLLOUT (edge-triggered), SO_ERROR.
bool connect_nonblocking(int s, const sockaddr* sa, socklen_t len) {
  int fl = fcntl(s, F_GETFL);
  if (fl < 0 || fcntl(s, F_SETFL, fl | O_NONBLOCK) != 0) {
    fail("F_SETFL: %s", strerror(errno));
    return false;
  }
  if (connect(s, sa, len) == 0) {
    say("CONNECT immediate");
  } else if (errno != EINPROGRESS) {
    fail("nonblocking connect: %s", strerror(errno));
    return false;
  } else {
    say("CONNECT einprogress");
    int ep = epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev = {};
    ev.events = EPOLLOUT | EPOLLIN | EPOLLET;
    ev.data.u32 = 42;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) != 0) {
      fail("epoll: %s", strerror(errno));
      return false;
    }
    int n;
    do {
      n = epoll_wait(ep, &ev, 1, 120000);
    } while (n < 0 && errno == EINTR);
    close(ep);
    if (n != 1 || ev.data.u32 != 42 || !(ev.events & EPOLLOUT)) {
      fail("no EPOLLOUT after a nonblocking connect (n=%d events=0x%x)", n, ev.events);
      return false;
    }
    int err = -1;
    socklen_t elen = sizeof err;
    if (getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err != 0) {
      fail("SO_ERROR after EPOLLOUT: %s", strerror(err));
      return false;
    }
  }
  if (fcntl(s, F_SETFL, fl) != 0) {
    fail("F_SETFL: %s", strerror(errno));
    return false;
  }
  return true;
}

int open_connection() {
  sockaddr_storage ss;
  socklen_t len = make_addr(&ss);
  if (len == 0) {
    fail("bad address %s", g_opt.addr.c_str());
    return -1;
  }
  int s = socket(ss.ss_family, SOCK_STREAM, g_opt.role == "client" ? g_opt.protocol : 0);
  if (s < 0 && g_opt.protocol != 0) {
    fprintf(stderr, "rs_stream: socket protocol %d: %s\n", g_opt.protocol, strerror(errno));
    exit(3);
  }
  if (s < 0) {
    fail("socket: %s", strerror(errno));
    return -1;
  }
  if (g_opt.role == "client" && g_opt.nonblocking_connect) {
    if (!connect_nonblocking(s, reinterpret_cast<sockaddr*>(&ss), len)) {
      close(s);
      return -1;
    }
    return s;
  }
  if (g_opt.role == "client") {
    if (connect(s, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
      fail("connect: %s", strerror(errno));
      close(s);
      return -1;
    }
    return s;
  }
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(s, reinterpret_cast<sockaddr*>(&ss), len) != 0 || listen(s, 16) != 0) {
    fail("bind/listen %s:%d: %s", g_opt.addr.c_str(), g_opt.port, strerror(errno));
    close(s);
    return -1;
  }
  say("READY");
  int c;
  do {
    c = accept(s, nullptr, nullptr);
  } while (c < 0 && errno == EINTR);
  if (c < 0) fail("accept: %s", strerror(errno));
  close(s);
  return c;
}

// ---- sending --------------------------------------------------------------------

struct TxResult {
  uint64_t sent = 0;
  StreamHash hash;
  std::string end = "done";
  std::string errors;  // errno names of the failing writes, comma-separated
};

// One write through an API picked by rng; returns the libc result.
ssize_t do_write(int fd, const uint8_t* p, size_t n, Rng& rng) {
  if (g_opt.write_api == "write") return write(fd, p, n);
  switch (rng.next() % 5) {
    case 0:
      return write(fd, p, n);
    case 1:
      return send(fd, p, n, 0);
    case 2:
      return sendto(fd, p, n, MSG_NOSIGNAL, nullptr, 0);
    case 3: {
      iovec iov[4];
      int cnt = 0;
      size_t left = n, off = 0;
      while (left > 0 && cnt < 4) {
        size_t k = cnt == 3 ? left : 1 + rng.next() % left;
        iov[cnt++] = {const_cast<uint8_t*>(p + off), k};
        off += k;
        left -= k;
      }
      return writev(fd, iov, cnt);
    }
    default: {
      size_t k = n / 2;
      iovec iov[3] = {
          {const_cast<uint8_t*>(p), k}, {nullptr, 0}, {const_cast<uint8_t*>(p + k), n - k}};
      msghdr mh = {};
      mh.msg_iov = iov;
      mh.msg_iovlen = 3;
      return sendmsg(fd, &mh, 0);
    }
  }
}

// --send-wait poll|epoll: waits until fd takes bytes again (POLLOUT alone).
bool wait_writable(int fd, int ep) {
  for (;;) {
    int n;
    if (ep >= 0) {
      epoll_event ev;
      n = epoll_wait(ep, &ev, 1, 60000);
    } else {
      pollfd p = {fd, POLLOUT, 0};
      n = poll(&p, 1, 60000);
    }
    if (n > 0) return true;
    if (n < 0 && errno == EINTR) continue;
    fail("waiting for room (%s): %s", g_opt.send_wait.c_str(),
         n == 0 ? "60 s passed" : strerror(errno));
    return false;
  }
}

void run_writer(int fd, TxResult* out) {
  Rng rng(g_opt.tx_seed ^ 0xC0FFEEull);
  int ep = -1;
  const int fl = fcntl(fd, F_GETFL);
  if (g_opt.send_wait != "blocking") {
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) fail("O_NONBLOCK: %s", strerror(errno));
    if (g_opt.send_wait == "epoll") {
      ep = epoll_create1(EPOLL_CLOEXEC);
      epoll_event ev = {};
      ev.events = EPOLLOUT;
      if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) fail("epoll: %s", strerror(errno));
    }
  }
  struct Restore {
    int fd, fl, ep;
    ~Restore() {
      if (g_opt.send_wait == "blocking") return;
      fcntl(fd, F_SETFL, fl);
      if (ep >= 0) close(ep);
    }
  } const restore{fd, fl, ep};
  std::vector<uint8_t> buf(g_opt.max_write);
  bool announced = false;
  const bool forever = g_opt.send < 0;
  while (forever || out->sent < static_cast<uint64_t>(g_opt.send)) {
    size_t n = rng.size(g_opt.max_write);
    if (!forever) n = std::min<uint64_t>(n, static_cast<uint64_t>(g_opt.send) - out->sent);
    stream_fill(g_opt.tx_seed, out->sent, buf.data(), n);
    size_t off = 0;
    while (off < n) {
      ssize_t r = do_write(fd, buf.data() + off, n - off, rng);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0 && errno == EAGAIN && g_opt.send_wait != "blocking") {
        if (!wait_writable(fd, ep)) return;
        continue;
      }
      if (r <= 0) {
        int e = r < 0 ? errno : EINVAL;
        out->end = errno_name(e);
        out->errors = errno_name(e);
        // A few more attempts show what later writes report (Linux TCP: the
        // first failure may be ECONNRESET, later ones EPIPE).
        for (int k = 0; k < 3; ++k) {
          ssize_t again = write(fd, buf.data(), 1);
          out->errors += ",";
          out->errors += again < 0 ? errno_name(errno) : "ok";
        }
        if (!forever)
          fail("write failed after %llu bytes: %s", (unsigned long long)out->sent, strerror(e));
        return;
      }
      out->hash.update(buf.data() + off, static_cast<size_t>(r));
      off += static_cast<size_t>(r);
      out->sent += static_cast<uint64_t>(r);
      if (g_opt.progress > 0 && !announced && out->sent >= static_cast<uint64_t>(g_opt.progress)) {
        announced = true;
        say("PROGRESS tx");
      }
    }
  }
  if (g_opt.shut_wr && shutdown(fd, SHUT_WR) != 0) fail("shutdown(SHUT_WR): %s", strerror(errno));
}

// ---- receiving ------------------------------------------------------------------

struct RxResult {
  uint64_t received = 0;
  StreamHash hash;
  std::string end = "count";
};

std::vector<uint8_t> g_expected;

// Checks that p[0..n) is bytes [pos, pos + n) of the receive stream.
bool verify(const uint8_t* p, size_t n, uint64_t pos) {
  if (g_expected.size() < n) g_expected.resize(n);
  stream_fill(g_opt.rx_seed, pos, g_expected.data(), n);
  if (memcmp(p, g_expected.data(), n) == 0) return true;
  size_t i = 0;
  while (i < n && p[i] == g_expected[i]) ++i;
  fail("data mismatch at stream offset %llu: got 0x%02x, want 0x%02x (chunk of %zu at %llu)",
       (unsigned long long)(pos + i), p[i], g_expected[i], n, (unsigned long long)pos);
  return false;
}

// One read through an API picked by rng. Returns the bytes consumed into
// buf (>= 0) or -1 with errno. MSG_WAITALL and MSG_PEEK results are checked
// against what POSIX promises on a stream socket.
ssize_t do_read(int fd, uint8_t* buf, size_t n, uint64_t remaining, Rng& rng) {
  if (g_opt.read_api == "plain") return read(fd, buf, n);
  switch (rng.next() % 7) {
    case 0:
      return read(fd, buf, n);
    case 1:
      return recv(fd, buf, n, 0);
    case 2: {
      iovec iov[4];
      int cnt = 0;
      size_t left = n, off = 0;
      while (left > 0 && cnt < 4) {
        size_t k = cnt == 3 ? left : 1 + rng.next() % left;
        iov[cnt++] = {buf + off, k};
        off += k;
        left -= k;
      }
      return readv(fd, iov, cnt);
    }
    case 3: {
      iovec iov[2] = {{buf, n / 3}, {buf + n / 3, n - n / 3}};
      msghdr mh = {};
      mh.msg_iov = iov;
      mh.msg_iovlen = 2;
      return recvmsg(fd, &mh, 0);
    }
    case 4: {
      // MSG_WAITALL for no more than the bytes still to come: all of them
      // must arrive in this one call.
      size_t k = n;
      if (remaining != UINT64_MAX) k = std::min<uint64_t>(k, remaining);
      ssize_t r = recv(fd, buf, k, MSG_WAITALL);
      if (r >= 0 && static_cast<size_t>(r) != k && remaining != UINT64_MAX)
        fail("recv(MSG_WAITALL, %zu) returned %zd", k, r);
      return r;
    }
    default: {
      // MSG_PEEK, then consume exactly what was peeked: same bytes.
      ssize_t p = recv(fd, buf, n, MSG_PEEK);
      if (p <= 0) return p;
      static std::vector<uint8_t> again;
      again.resize(static_cast<size_t>(p));
      ssize_t r = recv(fd, again.data(), static_cast<size_t>(p), MSG_WAITALL);
      if (r != p) {
        fail("read after MSG_PEEK of %zd returned %zd", p, r);
        return r < 0 ? r : 0;
      }
      if (memcmp(again.data(), buf, static_cast<size_t>(p)) != 0)
        fail("MSG_PEEK showed other bytes than the read that followed (%zd bytes)", p);
      return r;
    }
  }
}

long long cpu_ms() {
  rusage u = {};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1000LL +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1000;
}

void run_reader(int fd, RxResult* out) {
  if (g_opt.read_after_ms > 0) usleep(static_cast<useconds_t>(g_opt.read_after_ms) * 1000);
  Rng rng(g_opt.rx_seed ^ 0xBEEFull);
  std::vector<uint8_t> buf(g_opt.max_read);
  bool announced = false;
  const bool until_eof = g_opt.expect < 0;
  const uint64_t want = until_eof ? UINT64_MAX : static_cast<uint64_t>(g_opt.expect);
  while (out->received < want) {
    size_t n = g_opt.read_api == "plain" ? g_opt.max_read : rng.size(g_opt.max_read);
    n = std::min<uint64_t>(n, want - out->received);
    ssize_t r = do_read(fd, buf.data(), n, until_eof ? UINT64_MAX : want - out->received, rng);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      out->end = errno_name(errno);
      if (!until_eof)
        fail("read failed after %llu of %llu bytes: %s", (unsigned long long)out->received,
             (unsigned long long)want, strerror(errno));
      return;
    }
    if (r == 0) {
      out->end = "eof";
      if (!until_eof)
        fail("EOF after %llu of %llu bytes", (unsigned long long)out->received,
             (unsigned long long)want);
      return;
    }
    if (!verify(buf.data(), static_cast<size_t>(r), out->received)) {
      out->end = "mismatch";
      return;
    }
    out->hash.update(buf.data(), static_cast<size_t>(r));
    out->received += static_cast<uint64_t>(r);
    if (g_opt.progress > 0 && !announced &&
        out->received >= static_cast<uint64_t>(g_opt.progress)) {
      announced = true;
      say("PROGRESS rx");
    }
  }
  if (g_opt.expect_eof) {
    uint8_t extra[64];
    ssize_t r;
    do {
      r = read(fd, extra, sizeof extra);
    } while (r < 0 && errno == EINTR);
    if (r == 0) {
      out->end = "eof";
    } else if (r > 0) {
      fail("%zd bytes after the expected %llu where EOF was due", r, (unsigned long long)want);
    } else {
      out->end = errno_name(errno);
      fail("read where EOF was due failed: %s", strerror(errno));
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!parse_args(argc, argv)) {
    fprintf(stderr, "usage: rs_stream --role server|client --port P [options] (see source)\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  int fd = open_connection();
  if (fd < 0) return 1;
  say("CONNECTED");
  if (g_opt.nodelay) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0)
      fail("TCP_NODELAY: %s", strerror(errno));
  }

  if (g_opt.pause_ms > 0) usleep(static_cast<useconds_t>(g_opt.pause_ms) * 1000);
  TxResult tx;
  RxResult rx;
  const bool reads = g_opt.expect != 0 || g_opt.expect_eof;
  if (g_opt.order == "duplex") {
    std::thread writer([&] { run_writer(fd, &tx); });
    if (reads) run_reader(fd, &rx);
    writer.join();
  } else if (g_opt.order == "send-first") {
    run_writer(fd, &tx);
    if (reads) run_reader(fd, &rx);
  } else {
    if (reads) run_reader(fd, &rx);
    run_writer(fd, &tx);
  }
  if (g_opt.linger_ms > 0) usleep(static_cast<useconds_t>(g_opt.linger_ms) * 1000);

  char line[512];
  snprintf(line, sizeof line,
           "RESULT sent=%llu received=%llu tx_hash=%016llx rx_hash=%016llx tx_end=%s rx_end=%s "
           "tx_errors=%s cpu_ms=%lld",
           (unsigned long long)tx.sent, (unsigned long long)rx.received,
           (unsigned long long)tx.hash.final(), (unsigned long long)rx.hash.final(), tx.end.c_str(),
           rx.end.c_str(), tx.errors.empty() ? "-" : tx.errors.c_str(), cpu_ms());
  say(line);
  if (!g_opt.no_close && close(fd) != 0) fail("close: %s", strerror(errno));
  if (g_opt.stay_ms > 0) usleep(static_cast<useconds_t>(g_opt.stay_ms) * 1000);
  if (!g_opt.exec_after.empty() && !g_failed.load()) {
    fflush(stdout);
    execl(g_opt.exec_after.c_str(), g_opt.exec_after.c_str(), static_cast<char*>(nullptr));
    fail("exec %s: %s", g_opt.exec_after.c_str(), strerror(errno));
  }
  return g_failed.load() ? 1 : 0;
}
