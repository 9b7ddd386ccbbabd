// rs_attack: a hostile local process for the attack tests (test/preload/
// attack_test.cpp), run as another user than its victims. It never runs
// with librsock and knows librsock's pairing names and messages
// (docs/protocol.md section 2). It reports everything it receives: a
// successful attack is one that receives anything.
//
//   rs_attack hijack --prefix P --stop FILE [--silent N]
//       watches /proc/net/unix for abstract names starting with P (a
//       client's rendezvous "rsock/C/..."). For each new one it opens a
//       connection that sends a forged Hello carrying an O_PATH proof of a
//       TCP socket of its own (a valid proof, of another connection), then N
//       silent ones (to stall or flood it), trying the name again at its
//       next scan until a forged Hello went out. Prints "ATTACKED <name>" once.
//   rs_attack squat --name NAME --stop FILE [--dgram]
//       binds NAME first (a SEQPACKET listener, or a DGRAM socket like a
//       server's advertisement), prints READY, accepts whatever connects,
//       reads what it is sent and keeps every connection open, silent.
// Both run until FILE exists (bounded: 60 s), then print
//   RESULT connects=C forged=F received_bytes=B received_fds=D
//          fd_sockets=S fd_io_ok=I fd_mappable=M
// where for each received descriptor it tries to use it: read, write,
// recv, getsockopt, reopen through /proc (fd_io_ok counts successes) and
// mmap (fd_mappable).
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "progs.h"

namespace {

constexpr int kMaxRunMs = 60000;

struct Tally {
  int connects = 0;
  int forged = 0;
  long received_bytes = 0;
  int received_fds = 0;
  int fd_sockets = 0;
  int fd_io_ok = 0;
  int fd_mappable = 0;
};

socklen_t abstract_addr(const std::string& name, sockaddr_un* un) {
  memset(un, 0, sizeof *un);
  un->sun_family = AF_UNIX;
  memcpy(un->sun_path + 1, name.data(), std::min(name.size(), sizeof un->sun_path - 2));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
}

// Tries everything a descriptor might allow.
void probe_fd(int fd, Tally* t) {
  ++t->received_fds;

  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode)) ++t->fd_sockets;
  char b[16];
  if (read(fd, b, 0) >= 0) ++t->fd_io_ok;
  if (write(fd, b, 1) >= 0) ++t->fd_io_ok;
  if (recv(fd, b, sizeof b, MSG_DONTWAIT) >= 0 || errno == EAGAIN) ++t->fd_io_ok;
  int v = 0;
  socklen_t len = sizeof v;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len) == 0) ++t->fd_io_ok;
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int re = open(path, O_RDWR);
  if (re >= 0) {
    ++t->fd_io_ok;
    close(re);
  }
  void* m = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 0);
  if (m != MAP_FAILED) {
    ++t->fd_mappable;
    munmap(m, 4096);
  }
  close(fd);
}

// Reads whatever is there on c, without waiting.
void drain(int c, Tally* t) {
  for (;;) {
    char buf[512];
    alignas(cmsghdr) char ctl[CMSG_SPACE(8 * sizeof(int))];
    iovec iov = {buf, sizeof buf};
    msghdr mh = {};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    ssize_t n = recvmsg(c, &mh, MSG_DONTWAIT);
    if (n <= 0) return;
    t->received_bytes += n;

    for (cmsghdr* h = CMSG_FIRSTHDR(&mh); h; h = CMSG_NXTHDR(&mh, h)) {
      if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
      int count = static_cast<int>((h->cmsg_len - CMSG_LEN(0)) / sizeof(int));
      for (int i = 0; i < count; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
        probe_fd(fd, t);
      }
    }
  }
}

bool stopped(const std::string& stop, int64_t end) {
  struct stat st;
  return stat(stop.c_str(), &st) == 0 || now_ms() > end;
}

// Abstract names in this network namespace, from /proc/net/unix.
std::vector<std::string> abstract_names(const std::string& prefix) {
  std::vector<std::string> out;
  std::ifstream in("/proc/net/unix");
  std::string line;
  while (std::getline(in, line)) {
    size_t at = line.find(" @" + prefix);
    if (at != std::string::npos) out.push_back(line.substr(at + 2));
  }
  return out;
}

// A loopback TCP connection of our own: its socket is what we "prove".
int own_tcp_socket() {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 1) != 0 ||
      getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) return -1;
  return c;  // (the listener and the accepted end stay open until exit)
}

int send_forged_hello(int c, int tcp) {
  char path[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", tcp);
  int proof = open(path, O_PATH | O_CLOEXEC);
  // MsgType::kHello, kHandshakeVersion, then the 64-bit token (0 in a Hello)
  const uint32_t hello[4] = {1, 3, 0, 0};
  iovec iov = {const_cast<uint32_t*>(hello), sizeof hello};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr mh = {};
  mh.msg_iov = &iov;
  mh.msg_iovlen = 1;
  if (proof >= 0) {
    mh.msg_control = ctl;
    mh.msg_controllen = sizeof ctl;
    cmsghdr* h = CMSG_FIRSTHDR(&mh);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &proof, sizeof proof);
  }
  ssize_t n = sendmsg(c, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (proof >= 0) close(proof);
  return n == static_cast<ssize_t>(sizeof hello) ? 0 : -1;
}

int hijack(const std::string& prefix, const std::string& stop, int silent) {
  Tally t;
  std::set<std::string> seen;
  std::vector<int> conns;
  const int tcp = own_tcp_socket();
  const int64_t end = now_ms() + kMaxRunMs;
  bool announced = false;
  while (!stopped(stop, end)) {
    for (const std::string& name : abstract_names(prefix)) {
      if (seen.count(name)) continue;
      sockaddr_un un;
      socklen_t len = abstract_addr(name, &un);
      bool forged = false;
      for (int i = 0; i <= silent; ++i) {
        int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (connect(c, reinterpret_cast<sockaddr*>(&un), len) != 0) {
          close(c);
          continue;
        }
        ++t.connects;
        if (!forged && send_forged_hello(c, tcp) == 0) {
          ++t.forged;
          forged = true;
        }
        conns.push_back(c);
      }
      // Bound but not listening yet (a slow victim between its bind and
      // its listen): the next scan tries the name again.
      if (!forged) continue;
      seen.insert(name);
      if (!announced) {
        printf("ATTACKED %s\n", name.c_str());
        fflush(stdout);
        announced = true;
      }
    }
    for (int c : conns) drain(c, &t);
    usleep(1000);
  }
  for (int c : conns) drain(c, &t);
  printf("RESULT connects=%d forged=%d received_bytes=%ld received_fds=%d fd_sockets=%d "
         "fd_io_ok=%d fd_mappable=%d\n",
         t.connects, t.forged, t.received_bytes, t.received_fds, t.fd_sockets, t.fd_io_ok,
         t.fd_mappable);
  return 0;
}

int squat(const std::string& name, const std::string& stop, bool dgram) {
  Tally t;
  int s = socket(AF_UNIX, (dgram ? SOCK_DGRAM : SOCK_SEQPACKET) | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un un;
  socklen_t len = abstract_addr(name, &un);
  if (bind(s, reinterpret_cast<sockaddr*>(&un), len) != 0 || (!dgram && listen(s, 64) != 0)) {
    fprintf(stderr, "squat: bind %s: %s\n", name.c_str(), strerror(errno));
    return 1;
  }
  printf("READY\n");
  fflush(stdout);
  std::vector<int> conns;
  const int64_t end = now_ms() + kMaxRunMs;
  while (!stopped(stop, end)) {
    if (dgram) {
      drain(s, &t);
    } else {
      for (;;) {
        int c = accept4(s, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (c < 0) break;
        ++t.connects;
        conns.push_back(c);  // kept open and silent: a stall
      }
      for (int c : conns) drain(c, &t);
    }
    usleep(1000);
  }
  for (int c : conns) drain(c, &t);
  printf("RESULT connects=%d forged=0 received_bytes=%ld received_fds=%d fd_sockets=%d "
         "fd_io_ok=%d fd_mappable=%d\n",
         t.connects, t.received_bytes, t.received_fds, t.fd_sockets, t.fd_io_ok, t.fd_mappable);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string mode = argv[1];
  std::string prefix, name, stop;
  int silent = 0;
  bool dgram = false;
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (k == "--dgram") {
      dgram = true;
      continue;
    }
    if (i + 1 >= argc) return 2;
    std::string v = argv[++i];
    if (k == "--prefix")
      prefix = v;
    else if (k == "--name")
      name = v;
    else if (k == "--stop")
      stop = v;
    else if (k == "--silent")
      silent = atoi(v.c_str());
    else
      return 2;
  }
  if (stop.empty()) return 2;
  if (mode == "hijack" && !prefix.empty()) return hijack(prefix, stop, silent);
  if (mode == "squat" && !name.empty()) return squat(name, stop, dgram);
  fprintf(stderr, "usage: see the comment at the top of rs_attack.cpp\n");
  return 2;
}
