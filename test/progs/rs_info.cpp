// rs_info: asks librsock about its descriptors through include/rsock.h,
// with or without librsock preloaded (the header's wrappers answer ENOSYS
// without it). The process forks: the child listens on 127.0.0.1:PORT and
// accepts one connection, the parent connects to it; each end sends BYTES
// and reads the other's, then both describe their descriptors, and the
// parent a pipe, a closed fd and a call with a bad size too.
//
//   rs_info --port P --bytes N
//
// Output, one line each: "VERSION v=.. api=..", then "FD who=.. name=..
// rc=.. errno=.. state=.. transport=.. sent=.. received=.. tcp_sent=..
// tcp_received=.." for the listener (child), the accepted connection
// (child), the connection (parent), a pipe, a closed fd and a bad size
// (parent). Exit 0 unless a socket call or the child failed.
#include <rsock.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <string>
#include <vector>

#include "progs.h"

namespace {

void describe(const char* who, const char* name, int fd, uint32_t size = sizeof(rsock_fd_info)) {
  rsock_fd_info info;
  memset(&info, 0xab, sizeof info);
  info.size = size;
  errno = 0;
  const int rc = rsock_query_fd(fd, &info);
  const int err = rc == 0 ? 0 : errno;
  if (rc != 0) memset(&info, 0, sizeof info);
  printf("FD who=%s name=%s rc=%d errno=%s state=%u transport=%u sent=%llu received=%llu "
         "tcp_sent=%llu tcp_received=%llu\n",
         who, name, rc, err ? strerrorname_np(err) : "0", info.state, info.transport,
         (unsigned long long)info.bytes_sent, (unsigned long long)info.bytes_received,
         (unsigned long long)info.tcp_bytes_sent, (unsigned long long)info.tcp_bytes_received);
  fflush(stdout);
}

bool send_all(int fd, size_t n) {
  std::vector<char> buf(n, 'x');
  size_t off = 0;
  while (off < n) {
    const ssize_t r = write(fd, buf.data() + off, n - off);
    if (r <= 0) return false;
    off += static_cast<size_t>(r);
  }
  return true;
}

bool recv_all(int fd, size_t n) {
  std::vector<char> buf(65536);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = read(fd, buf.data(), std::min(buf.size(), n - got));
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  size_t bytes = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--port")
      port = atoi(argv[i + 1]);
    else if (k == "--bytes")
      bytes = strtoull(argv[i + 1], nullptr, 10);
  }
  if (port <= 0) {
    fprintf(stderr, "usage: rs_info --port P --bytes N\n");
    return 2;
  }
  const char* v = rsock_query_version();
  printf("VERSION v=%s api=%u\n", v ? v : "none", rsock_query_api_version());
  fflush(stdout);
  const int lfd = listen_loopback(port, 4);
  if (lfd < 0) {
    perror("listen");
    return 1;
  }
  const pid_t child = fork();
  if (child == 0) {
    const int c = accept(lfd, nullptr, nullptr);
    if (c < 0 || !send_all(c, bytes) || !recv_all(c, bytes)) _exit(1);
    describe("child", "listener", lfd);
    describe("child", "accepted", c);
    char b;
    (void)!read(c, &b, 1);  // until the parent closes
    close(c);
    _exit(0);
  }
  close(lfd);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const sockaddr_in a = loopback(port);
  if (fd < 0 || connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 ||
      !send_all(fd, bytes) || !recv_all(fd, bytes)) {
    perror("client");
    return 1;
  }
  // The child describes its end once it has read ours: wait for its lines
  // by waiting for it after the close below; ours first.
  describe("parent", "connected", fd);
  int p[2];
  if (pipe(p) != 0) return 1;
  describe("parent", "pipe", p[0]);
  close(p[1]);
  describe("parent", "closed", p[1]);
  describe("parent", "small", fd, 8);
  close(fd);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "child failed\n");
    return 1;
  }
  return 0;
}
