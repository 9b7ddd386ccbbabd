// rs_pairstress: many connections between server workers and client
// processes, each connection checked end to end, for the pairing stress
// tests (test/preload/pairing_stress_test.cpp, the rdma tier's
// pairing-stress cases). Plain POSIX socket calls only: it behaves the same
// with or without librsock preloaded.
//
// Every connection carries ROUNDS exchanges, then a path report:
//   client -> server  Frame{type data, round r, up, down} + `up` bytes
//   server -> client  `down` bytes
//   ... (HOLD ms between rounds)
//   client -> server  Frame{type report, path: the client's own view}
//   server -> client  Frame{type report, path: the server's own view}
//   client closes; the server reads EOF and closes.
// Payload bytes are a pure function of (connection, round, direction,
// offset) and every byte is checked on arrival. Each side works out which
// path ITS bytes took from the kernel alone (TCP_INFO tcpi_bytes_received):
// a kernel socket that received at least the bytes the program read carried
// them (tcp); one that received less than half of them did not (accel: a
// ring or a queue pair; the kernel socket then carries only doorbells and
// pairing proofs, a few bytes). Both views travel in band, so each side
// prints both, and a connection whose two ends took different paths cannot
// pass: its bytes could not have arrived intact.
//
//   rs_pairstress --role server --port P [--addr A] [--workers N]
//       [--share fork|reuseport] [--io block|epoll|mixed] --stop FILE
//     fork: the parent listens, then forks N workers that accept from the
//     one inherited listener (nginx); reuseport: N workers each listen on
//     their own SO_REUSEPORT socket. block: accept() with a 50 ms
//     SO_RCVTIMEO, a thread per connection; epoll: one edge-triggered loop,
//     accept4(SOCK_NONBLOCK); mixed: even workers block, odd ones epoll.
//     Prints READY once every worker listens; a worker ends when FILE
//     exists and its connections are done.
//   rs_pairstress --role client --port P [--addr A] --id ID [--conns K]
//       [--parallel T] [--io block|epoll] [--rounds R] [--hold-ms H]
//       [--bytes B]
//     K connections, T at a time (block: T threads; epoll: one loop with T
//     nonblocking connects in flight); up to B bytes each way per round.
//
// Output, one line per connection (both roles):
//   CONN id=ID.SEQ me=tcp|accel peer=tcp|accel ...      (ok)
//   FAIL id=ID.SEQ why=...                              (anything else)
// then per process "RESULT role=.. conns=N ok=N failed=N tcp=N accel=N
// mismatched=N" (mismatched: the two views differ). Exit 0 iff every
// connection was ok (client: all K; server workers: every one accepted);
// 1 otherwise; 2 on bad usage. Every wait is bounded (kConnDeadlineMs per
// connection). SIGPIPE is ignored.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "progs.h"

namespace {

constexpr uint32_t kMagic = 0x72737054;  // "rspT"
constexpr int kConnDeadlineMs = 60000;   // a connection that takes longer failed
constexpr int kStopPollMs = 50;
constexpr int kDrainMs = 90000;  // a worker waits this long for its connections

enum FrameType : uint32_t { kData = 1, kReport = 2 };
enum PathView : uint32_t { kTcp = 1, kAccel = 2, kUnknown = 3 };

const char* path_name(uint32_t p) { return p == kTcp ? "tcp" : p == kAccel ? "accel" : "unknown"; }

struct Frame {
  uint32_t magic;
  uint32_t type;
  uint32_t id;
  uint32_t seq;
  uint32_t round;
  uint32_t up;    // bytes following this frame (data)
  uint32_t down;  // bytes the server answers with (data)
  uint32_t path;  // the sender's view (report)
};
static_assert(sizeof(Frame) == 32);

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Byte i of the payload of (id, seq, round, direction).
uint8_t payload_byte(uint32_t id, uint32_t seq, uint32_t round, int dir, uint64_t i) {
  uint64_t key = (uint64_t{id} << 40) ^ (uint64_t{seq} << 16) ^ (uint64_t{round} << 2) ^ dir;
  return static_cast<uint8_t>(mix64(mix64(key) + (i >> 3)) >> (8 * (i & 7)));
}

// Sizes of round r: 512..bytes each way, a function of the connection.
uint32_t round_bytes(uint32_t id, uint32_t seq, uint32_t round, int dir, uint32_t max) {
  uint32_t lo = std::min<uint32_t>(512, max);
  return lo + static_cast<uint32_t>(mix64((uint64_t{id} << 32) ^ (seq * 131u) ^ (round * 7u) ^
                                          static_cast<uint64_t>(dir)) %
                                    (max - lo + 1));
}

// Which path this side's bytes took, from the kernel's count of bytes its
// TCP socket received (see the header comment).
uint32_t own_path(int fd, uint64_t app_rx) {
  tcp_info ti = {};
  socklen_t len = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
      len < offsetof(tcp_info, tcpi_bytes_received) + sizeof ti.tcpi_bytes_received)
    return kUnknown;
  if (ti.tcpi_bytes_received >= app_rx) return kTcp;
  if (ti.tcpi_bytes_received * 2 < app_rx) return kAccel;
  return kUnknown;
}

void emit(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void emit(const char* fmt, ...) {
  // One write per line: workers share stdout (a regular file) and its offset.
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > static_cast<int>(sizeof line) - 2) n = sizeof line - 2;
  line[n++] = '\n';
  ssize_t w;
  do w = write(1, line, static_cast<size_t>(n));
  while (w < 0 && errno == EINTR);
}

struct Tally {
  std::atomic<int> conns{0}, ok{0}, failed{0}, tcp{0}, accel{0}, mismatched{0};
  void result(const char* role) {
    emit("RESULT role=%s pid=%d conns=%d ok=%d failed=%d tcp=%d accel=%d mismatched=%d", role,
         static_cast<int>(getpid()), conns.load(), ok.load(), failed.load(), tcp.load(),
         accel.load(), mismatched.load());
  }
};
Tally g_tally;

// ---- one connection, either side, as a resumable state machine ------------
//
// step() moves as far as the socket allows. On a blocking socket it runs to
// the end (each call blocks; SO_RCVTIMEO/SO_SNDTIMEO bound them); on a
// nonblocking one it returns at EAGAIN and is called again on the next event.

enum class Progress { kMore, kDone, kFailed };

class Conn {
 public:
  Conn(int fd, bool client, uint32_t id, uint32_t seq, int rounds, int hold_ms, uint32_t bytes)
      : fd_(fd),
        client_(client),
        id_(id),
        seq_(seq),
        rounds_(rounds),
        hold_ms_(hold_ms),
        bytes_(bytes),
        deadline_(now_ms() + kConnDeadlineMs) {
    if (client_)
      start_round();
    else
      expect(sizeof(Frame));
  }
  ~Conn() {
    if (fd_ >= 0) close(fd_);
  }

  int fd() const { return fd_; }
  int64_t deadline() const { return deadline_; }
  int64_t wake_at() const { return state_ == State::kHold ? hold_until_ : -1; }
  const std::string& why() const { return why_; }
  uint32_t id() const { return id_; }
  uint32_t seq() const { return seq_; }

  Progress step() {
    for (;;) {
      if (now_ms() > deadline_)
        return fail("deadline: no progress for %d ms in state %d", kConnDeadlineMs,
                    static_cast<int>(state_));
      switch (state_) {
        case State::kSend: {
          if (out_off_ == out_.size()) {
            after_send();
            continue;
          }
          ssize_t n = send(fd_, out_.data() + out_off_, out_.size() - out_off_, MSG_NOSIGNAL);
          if (n > 0) {
            out_off_ += static_cast<size_t>(n);
            continue;
          }
          if (n < 0 && errno == EINTR) continue;
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (blocking_) return fail("send timed out");
            return Progress::kMore;
          }
          return fail("send: %s", n < 0 ? strerror(errno) : "returned 0");
        }
        case State::kRecv: {
          if (in_off_ == in_want_) {
            Progress p = on_received();
            if (p != Progress::kMore) return p;
            continue;
          }
          size_t cap = std::min<size_t>(in_want_ - in_off_, sizeof buf_);
          ssize_t n = recv(fd_, buf_, cap, 0);
          if (n > 0) {
            if (!absorb(buf_, static_cast<size_t>(n))) return Progress::kFailed;
            continue;
          }
          if (n == 0) return fail("EOF after %zu of %zu bytes in %s", in_off_, in_want_, what());
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (blocking_) return fail("recv timed out in %s", what());
            return Progress::kMore;
          }
          return fail("recv: %s after %zu of %zu bytes in %s", strerror(errno), in_off_, in_want_,
                      what());
        }
        case State::kHold:
          if (blocking_) {
            int64_t left = hold_until_ - now_ms();
            if (left > 0) usleep(static_cast<useconds_t>(left) * 1000);
          } else if (now_ms() < hold_until_) {
            return Progress::kMore;
          }
          start_round();
          continue;
        case State::kEof: {
          ssize_t n = recv(fd_, buf_, sizeof buf_, 0);
          if (n == 0) return finish();
          if (n > 0) return fail("%zd bytes after the report", n);
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (blocking_) return fail("no EOF after the report");
            return Progress::kMore;
          }
          return fail("recv after the report: %s", strerror(errno));
        }
        case State::kDone:
          return Progress::kDone;
      }
    }
  }

  void set_blocking(bool b) { blocking_ = b; }

 private:
  enum class State { kSend, kRecv, kHold, kEof, kDone };
  enum class Await { kFrame, kPayload, kReport };

  Progress fail(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    why_ = msg;
    for (char& c : why_)
      if (c == ' ') c = '_';
    return Progress::kFailed;
  }

  const char* what() const {
    switch (await_) {
      case Await::kFrame:
        return "frame";
      case Await::kPayload:
        return "payload";
      case Await::kReport:
        return "report";
    }
    return "?";
  }

  void expect(size_t n, Await a = Await::kFrame) {
    state_ = State::kRecv;
    await_ = a;
    in_want_ = n;
    in_off_ = 0;
  }

  // Client: the next round's frame and payload, or the report after the last.
  void start_round() {
    out_.clear();
    out_off_ = 0;
    Frame f = {kMagic, kData, id_, seq_, round_, 0, 0, 0};
    if (round_ == static_cast<uint32_t>(rounds_)) {
      f.type = kReport;
      f.path = own_path(fd_, app_rx_);
      my_path_ = f.path;
    } else {
      f.up = round_bytes(id_, seq_, round_, 0, bytes_);
      f.down = round_bytes(id_, seq_, round_, 1, bytes_);
      down_ = f.down;
    }
    out_.resize(sizeof f + f.up);
    memcpy(out_.data(), &f, sizeof f);
    for (uint32_t i = 0; i < f.up; ++i) out_[sizeof f + i] = payload_byte(id_, seq_, round_, 0, i);
    state_ = State::kSend;
  }

  void after_send() {
    if (client_) {
      if (my_path_ != 0)
        expect(sizeof(Frame), Await::kReport);
      else
        expect(down_, Await::kPayload);
      return;
    }
    if (reported_) {
      state_ = State::kEof;
      return;
    }
    expect(sizeof(Frame));
  }

  // Takes received bytes; payload is checked byte by byte.
  bool absorb(const uint8_t* p, size_t n) {
    app_rx_ += n;
    if (await_ == Await::kPayload) {
      const int dir = client_ ? 1 : 0;
      for (size_t i = 0; i < n; ++i) {
        uint8_t want = payload_byte(id_, seq_, round_, dir, in_off_ + i);
        if (p[i] != want) {
          fail("wrong byte at offset %zu of round %u's payload: 0x%02x, want 0x%02x", in_off_ + i,
               round_, p[i], want);
          return false;
        }
      }
    } else {
      memcpy(reinterpret_cast<uint8_t*>(&frame_) + in_off_, p, n);
    }
    in_off_ += n;
    return true;
  }

  Progress on_received() {
    if (client_) {
      if (await_ == Await::kPayload) {
        ++round_;
        if (hold_ms_ > 0 && round_ < static_cast<uint32_t>(rounds_)) {
          state_ = State::kHold;
          hold_until_ = now_ms() + hold_ms_;
        } else {
          start_round();
        }
        return Progress::kMore;
      }
      // The server's report.
      if (frame_.magic != kMagic || frame_.type != kReport || frame_.id != id_ ||
          frame_.seq != seq_)
        return fail("bad report frame (magic 0x%08x type %u id %u.%u)", frame_.magic, frame_.type,
                    frame_.id, frame_.seq);
      peer_path_ = frame_.path;
      shutdown(fd_, SHUT_WR);
      return finish();
    }
    if (await_ == Await::kPayload) {
      // The answer to this round.
      out_.resize(frame_.down);
      for (uint32_t i = 0; i < frame_.down; ++i) out_[i] = payload_byte(id_, seq_, round_, 1, i);
      out_off_ = 0;
      state_ = State::kSend;
      return Progress::kMore;
    }
    const Frame& f = frame_;
    if (f.magic != kMagic)
      return fail("bad frame: first bytes 0x%08x, want magic 0x%08x", f.magic, kMagic);
    if (f.type == kData) {
      if (f.up > (64u << 20) || f.down > (64u << 20)) return fail("absurd frame sizes");
      id_ = f.id;
      seq_ = f.seq;
      round_ = f.round;
      if (f.up == 0) {
        expect(0, Await::kPayload);
      } else {
        expect(f.up, Await::kPayload);
      }
      return Progress::kMore;
    }
    if (f.type != kReport) return fail("bad frame type %u", f.type);
    id_ = f.id;
    seq_ = f.seq;
    peer_path_ = f.path;
    my_path_ = own_path(fd_, app_rx_);
    reported_ = true;
    Frame r = {kMagic, kReport, id_, seq_, round_, 0, 0, my_path_};
    out_.resize(sizeof r);
    memcpy(out_.data(), &r, sizeof r);
    out_off_ = 0;
    state_ = State::kSend;
    return Progress::kMore;
  }

  Progress finish() {
    state_ = State::kDone;
    if (my_path_ != peer_path_ || my_path_ == kUnknown)
      return fail("paths_differ:_me=%s_peer=%s", path_name(my_path_), path_name(peer_path_));
    return Progress::kDone;
  }

 public:
  uint32_t my_path() const { return my_path_; }
  uint32_t peer_path() const { return peer_path_; }

 private:
  int fd_;
  const bool client_;
  uint32_t id_, seq_;
  const int rounds_;
  const int hold_ms_;
  const uint32_t bytes_;
  const int64_t deadline_;
  bool blocking_ = false;
  State state_ = State::kSend;
  Await await_ = Await::kFrame;
  uint32_t round_ = 0;
  uint32_t down_ = 0;
  int64_t hold_until_ = 0;
  std::vector<uint8_t> out_;
  size_t out_off_ = 0;
  size_t in_want_ = 0, in_off_ = 0;
  Frame frame_ = {};
  uint8_t buf_[16384];
  uint64_t app_rx_ = 0;
  uint32_t my_path_ = 0, peer_path_ = 0;
  bool reported_ = false;
  std::string why_;
};

// Records a finished connection (either side) and prints its line.
void record(Conn& c, Progress p, const char* role) {
  ++g_tally.conns;
  if (p == Progress::kDone) {
    ++g_tally.ok;
    if (c.my_path() == kTcp) ++g_tally.tcp;
    if (c.my_path() == kAccel) ++g_tally.accel;
    emit("CONN id=%u.%u role=%s me=%s peer=%s pid=%d", c.id(), c.seq(), role,
         path_name(c.my_path()), path_name(c.peer_path()), static_cast<int>(getpid()));
    return;
  }
  ++g_tally.failed;
  if (c.my_path() != 0 && c.peer_path() != 0 && c.my_path() != c.peer_path()) ++g_tally.mismatched;
  emit("FAIL id=%u.%u role=%s why=%s me=%s peer=%s pid=%d", c.id(), c.seq(), role, c.why().c_str(),
       path_name(c.my_path()), path_name(c.peer_path()), static_cast<int>(getpid()));
}

void set_timeouts(int fd, int ms) {
  timeval tv = {ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// ---- options --------------------------------------------------------------

struct Options {
  std::string role, addr = "127.0.0.1", share = "fork", io = "block", stop;
  int port = 0, workers = 2, conns = 100, parallel = 4, rounds = 1, hold_ms = 0;
  uint32_t id = 0, bytes = 4096;
};
Options g_opt;

bool parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) return false;
    std::string v = argv[++i];
    if (k == "--role")
      g_opt.role = v;
    else if (k == "--addr")
      g_opt.addr = v;
    else if (k == "--port")
      g_opt.port = atoi(v.c_str());
    else if (k == "--workers")
      g_opt.workers = atoi(v.c_str());
    else if (k == "--share")
      g_opt.share = v;
    else if (k == "--io")
      g_opt.io = v;
    else if (k == "--stop")
      g_opt.stop = v;
    else if (k == "--id")
      g_opt.id = static_cast<uint32_t>(atoi(v.c_str()));
    else if (k == "--conns")
      g_opt.conns = atoi(v.c_str());
    else if (k == "--parallel")
      g_opt.parallel = atoi(v.c_str());
    else if (k == "--rounds")
      g_opt.rounds = atoi(v.c_str());
    else if (k == "--hold-ms")
      g_opt.hold_ms = atoi(v.c_str());
    else if (k == "--bytes")
      g_opt.bytes = static_cast<uint32_t>(atoi(v.c_str()));
    else
      return false;
  }
  return (g_opt.role == "server" || g_opt.role == "client") && g_opt.port > 0 &&
         g_opt.workers > 0 && g_opt.conns >= 0 && g_opt.parallel > 0 && g_opt.rounds > 0 &&
         g_opt.bytes >= 1 && (g_opt.share == "fork" || g_opt.share == "reuseport") &&
         (g_opt.io == "block" || g_opt.io == "epoll" || g_opt.io == "mixed") &&
         (g_opt.role == "client" || !g_opt.stop.empty());
}

bool make_addr(sockaddr_storage* ss, socklen_t* len) {
  memset(ss, 0, sizeof *ss);
  if (g_opt.addr.find(':') != std::string::npos) {
    auto* a = reinterpret_cast<sockaddr_in6*>(ss);
    a->sin6_family = AF_INET6;
    a->sin6_port = htons(static_cast<uint16_t>(g_opt.port));
    *len = sizeof *a;
    return inet_pton(AF_INET6, g_opt.addr.c_str(), &a->sin6_addr) == 1;
  }
  auto* a = reinterpret_cast<sockaddr_in*>(ss);
  a->sin_family = AF_INET;
  a->sin_port = htons(static_cast<uint16_t>(g_opt.port));
  *len = sizeof *a;
  return inet_pton(AF_INET, g_opt.addr.c_str(), &a->sin_addr) == 1;
}

// ---- server ---------------------------------------------------------------

bool stop_requested() {
  struct stat st;
  return stat(g_opt.stop.c_str(), &st) == 0;
}

int make_listener(bool reuseport) {
  sockaddr_storage ss;
  socklen_t len;
  if (!make_addr(&ss, &len)) return -1;
  int ls = socket(ss.ss_family, SOCK_STREAM, 0);
  if (ls < 0) return -1;
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (reuseport) setsockopt(ls, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
  if (bind(ls, reinterpret_cast<sockaddr*>(&ss), len) != 0 || listen(ls, 1024) != 0) {
    fprintf(stderr, "server: listen: %s\n", strerror(errno));
    close(ls);
    return -1;
  }
  return ls;
}

// Blocking worker: accept() with a short SO_RCVTIMEO so that it notices the
// stop file; a detached thread per connection.
// (Process-wide, so that a thread still running after a failed drain never
// touches a dead stack frame.)
std::mutex g_active_mu;
std::condition_variable g_active_cv;
int g_active = 0;

int serve_blocking(int ls) {
  timeval tv = {0, kStopPollMs * 1000};
  setsockopt(ls, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  for (;;) {
    int c = accept(ls, nullptr, nullptr);
    if (c < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        if (stop_requested()) break;
        continue;
      }
      fprintf(stderr, "server: accept: %s\n", strerror(errno));
      return 1;
    }
    set_timeouts(c, kConnDeadlineMs / 2);
    {
      std::lock_guard<std::mutex> lock(g_active_mu);
      ++g_active;
    }
    std::thread([c] {
      Conn conn(c, false, 0, 0, 1, 0, 0);
      conn.set_blocking(true);
      record(conn, conn.step(), "server");
      std::lock_guard<std::mutex> lock(g_active_mu);
      --g_active;
      g_active_cv.notify_all();
    }).detach();
  }
  std::unique_lock<std::mutex> lock(g_active_mu);
  if (!g_active_cv.wait_for(lock, std::chrono::milliseconds(kDrainMs),
                            [] { return g_active == 0; })) {
    fprintf(stderr, "server: %d connection(s) still running at the end\n", g_active);
    return 1;
  }
  return 0;
}

// Event-loop worker: a nonblocking listener and edge-triggered connections.
int serve_epoll(int ls) {
  set_nonblocking(ls);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev = {};
  ev.events = EPOLLIN;
  ev.data.ptr = nullptr;
  if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev) != 0) {
    fprintf(stderr, "server: epoll: %s\n", strerror(errno));
    return 1;
  }
  std::map<Conn*, std::unique_ptr<Conn>> conns;
  auto drive = [&](Conn* c) {
    Progress p = c->step();
    if (p == Progress::kMore) return;
    record(*c, p, "server");
    conns.erase(c);
  };
  epoll_event evs[64];
  int64_t drain_end = -1;
  for (;;) {
    if (stop_requested()) {
      if (conns.empty()) break;
      if (drain_end < 0) drain_end = now_ms() + kDrainMs;
      if (now_ms() > drain_end) {
        fprintf(stderr, "server: %zu connection(s) still running at the end\n", conns.size());
        return 1;
      }
    }
    int n = epoll_wait(ep, evs, 64, kStopPollMs);
    if (n < 0 && errno != EINTR) {
      fprintf(stderr, "server: epoll_wait: %s\n", strerror(errno));
      return 1;
    }
    for (int i = 0; i < n; ++i) {
      if (evs[i].data.ptr == nullptr) {
        for (;;) {
          int c = accept4(ls, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;  // EAGAIN: another worker took it, or none left
          auto conn = std::make_unique<Conn>(c, false, 0, 0, 1, 0, 0);
          Conn* raw = conn.get();
          conns[raw] = std::move(conn);
          epoll_event cev = {};
          cev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
          cev.data.ptr = raw;
          if (epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev) != 0) {
            fprintf(stderr, "server: epoll_ctl: %s\n", strerror(errno));
            return 1;
          }
          drive(raw);
        }
        continue;
      }
      Conn* c = static_cast<Conn*>(evs[i].data.ptr);
      if (conns.count(c)) drive(c);
    }
    // Deadlines of connections that get no event.
    std::vector<Conn*> late;
    for (auto& [raw, conn] : conns)
      if (now_ms() > raw->deadline()) late.push_back(raw);
    for (Conn* c : late) drive(c);
  }
  close(ep);
  return 0;
}

int run_worker(int ls, bool epoll_io) {
  int rc = epoll_io ? serve_epoll(ls) : serve_blocking(ls);
  g_tally.result("server");
  if (g_tally.failed.load() != 0) rc = 1;
  return rc;
}

int run_server() {
  const bool fork_share = g_opt.share == "fork";
  int ls = -1;
  if (fork_share && (ls = make_listener(false)) < 0) return 1;
  int ready[2];
  if (pipe(ready) != 0) return 1;
  std::vector<pid_t> kids;
  for (int w = 0; w < g_opt.workers; ++w) {
    const bool epoll_io = g_opt.io == "epoll" || (g_opt.io == "mixed" && w % 2 == 1);
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "server: fork: %s\n", strerror(errno));
      return 1;
    }
    if (pid == 0) {
      close(ready[0]);
      if (!fork_share && (ls = make_listener(true)) < 0) _exit(1);
      char one = 1;
      (void)!write(ready[1], &one, 1);
      close(ready[1]);
      exit(run_worker(ls, epoll_io));  // exit(): librsock writes this worker's stats
    }
    kids.push_back(pid);
  }
  close(ready[1]);
  for (int w = 0; w < g_opt.workers; ++w) {
    char one;
    pollfd p = {ready[0], POLLIN, 0};
    if (poll(&p, 1, 30000) != 1 || read(ready[0], &one, 1) != 1) {
      fprintf(stderr, "server: worker %d did not start listening\n", w);
      break;
    }
  }
  emit("READY");
  int failed = 0;
  for (pid_t pid : kids) {
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ++failed;
  }
  emit("RESULT role=parent workers=%d failed_workers=%d", g_opt.workers, failed);
  if (ls >= 0) close(ls);
  return failed == 0 ? 0 : 1;
}

// ---- client ---------------------------------------------------------------

void connect_failed(uint32_t seq, int err) {
  std::string why = std::string("connect:_") + strerror(err);
  for (char& c : why)
    if (c == ' ') c = '_';
  emit("FAIL id=%u.%u role=client why=%s", g_opt.id, seq, why.c_str());
  ++g_tally.conns;
  ++g_tally.failed;
}

// A blocking connect and the whole connection.
void client_blocking(uint32_t seq) {
  sockaddr_storage ss;
  socklen_t len;
  make_addr(&ss, &len);
  int fd = socket(ss.ss_family, SOCK_STREAM, 0);
  Conn conn(fd, true, g_opt.id, seq, g_opt.rounds, g_opt.hold_ms, g_opt.bytes);
  conn.set_blocking(true);
  set_timeouts(fd, kConnDeadlineMs / 2);
  if (connect(fd, reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    connect_failed(seq, errno);
    return;
  }
  record(conn, conn.step(), "client");
}

int run_client_blocking() {
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < g_opt.parallel; ++t)
    threads.emplace_back([&] {
      for (int s; (s = next.fetch_add(1)) < g_opt.conns;) client_blocking(static_cast<uint32_t>(s));
    });
  for (auto& t : threads) t.join();
  return 0;
}

// The event-loop way: nonblocking connects (EINPROGRESS, EPOLLOUT, SO_ERROR),
// parallel of them in flight, edge-triggered.
int run_client_epoll() {
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (ep < 0) return 1;
  struct Slot {
    std::unique_ptr<Conn> conn;
    bool connecting = true;
  };
  std::map<Conn*, Slot> live;
  int started = 0;
  auto start_one = [&] {
    const uint32_t seq = static_cast<uint32_t>(started++);
    sockaddr_storage ss;
    socklen_t len;
    make_addr(&ss, &len);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
    auto conn =
        std::make_unique<Conn>(fd, true, g_opt.id, seq, g_opt.rounds, g_opt.hold_ms, g_opt.bytes);
    int r = connect(fd, reinterpret_cast<sockaddr*>(&ss), len);
    if (r != 0 && errno != EINPROGRESS) {
      connect_failed(seq, errno);
      return;
    }
    Conn* raw = conn.get();
    epoll_event ev = {};
    ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
    ev.data.ptr = raw;
    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    live[raw] = Slot{std::move(conn), r != 0};
    if (r == 0) live[raw].connecting = false;
  };
  auto drive = [&](Conn* c, uint32_t events) {
    Slot& s = live[c];
    if (s.connecting) {
      if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        if (now_ms() <= c->deadline()) return;
        connect_failed(c->seq(), ETIMEDOUT);
        live.erase(c);
        return;
      }
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(c->fd(), SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        connect_failed(c->seq(), err);
        live.erase(c);
        return;
      }
      s.connecting = false;
    }
    Progress p = c->step();
    if (p == Progress::kMore) return;
    record(*c, p, "client");
    live.erase(c);
  };
  epoll_event evs[64];
  while (started < g_opt.conns || !live.empty()) {
    while (started < g_opt.conns && static_cast<int>(live.size()) < g_opt.parallel) start_one();
    int timeout = kStopPollMs;
    for (auto& [raw, slot] : live) {
      int64_t w = raw->wake_at();
      if (w >= 0) timeout = static_cast<int>(std::clamp<int64_t>(w - now_ms(), 0, timeout));
    }
    int n = epoll_wait(ep, evs, 64, timeout);
    if (n < 0 && errno != EINTR) return 1;
    for (int i = 0; i < n; ++i) {
      Conn* c = static_cast<Conn*>(evs[i].data.ptr);
      if (live.count(c)) drive(c, evs[i].events);
    }
    // Timers (hold between rounds) and deadlines.
    std::vector<Conn*> due;
    for (auto& [raw, slot] : live) {
      int64_t w = raw->wake_at();
      if ((w >= 0 && now_ms() >= w) || now_ms() > raw->deadline()) due.push_back(raw);
    }
    for (Conn* c : due)
      if (live.count(c)) drive(c, live[c].connecting ? 0 : EPOLLIN | EPOLLOUT);
  }
  close(ep);
  return 0;
}

int run_client() {
  if (g_opt.io == "epoll")
    run_client_epoll();
  else
    run_client_blocking();
  g_tally.result("client");
  return g_tally.failed.load() == 0 && g_tally.ok.load() == g_opt.conns ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  if (!parse(argc, argv)) {
    fprintf(stderr, "usage: see the header of rs_pairstress.cpp\n");
    return 2;
  }
  return g_opt.role == "server" ? run_server() : run_client();
}
