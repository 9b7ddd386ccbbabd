// rs_reuse: many connections one after the other between the same two
// processes, each carrying its own bytes both ways, for the preload test
// RegionReuseTest (test/preload/reuse_test.cpp). librsock keeps the
// shared-memory region of a closed connection for the next connection
// between the same two processes; every byte a connection reads must still
// be its own. Plain POSIX calls only.
//
//   rs_reuse --role server --port P --connections N
//       accepts N connections one after the other; on each, reads an 8-byte
//       header (the connection's index and its size, 32 bits each), then
//       that many bytes, each checked; writes as many bytes of the answer
//       pattern and closes. Prints READY after listen(), then "RESULT
//       served=N" and exits 0, or prints "FAIL ..." and exits 1.
//   rs_reuse --role client --port P --connections N --bytes B [--overlap 1]
//       N connections one after the other, each: the header, B bytes of its
//       pattern, then B answer bytes read and checked. --overlap 1: a
//       connection stays open until the next one has carried all its bytes;
//       then it must read end-of-file, and only then it is closed (the
//       server closed its end long before, so a region given to the next
//       connection too early would show here or in the next one's bytes).
//       Prints "RESULT ok=N" and exits 0, or "FAIL ..." and exits 1.
// Every wait is bounded by SO_RCVTIMEO/SO_SNDTIMEO of 10 s; 2 on bad usage.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace {

uint8_t pattern(uint32_t conn, uint64_t j, bool answer) {
  const uint64_t v = j * 131 + conn * 17 + (j >> 9) + (answer ? 0x5b : 0);
  return static_cast<uint8_t>(v ^ (v >> 7));
}

void timeouts(int fd) {
  timeval tv = {10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Reads exactly n bytes; false on EOF, an error or a timeout.
bool read_all(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// The first byte of `got` that is not conn's pattern, or -1.
long long first_wrong(const std::vector<uint8_t>& got, uint32_t conn, bool answer) {
  for (size_t j = 0; j < got.size(); ++j)
    if (got[j] != pattern(conn, j, answer)) return static_cast<long long>(j);
  return -1;
}

int serve(int port, int conns) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 16) != 0) {
    printf("FAIL listen\n");
    return 1;
  }
  printf("READY\n");
  fflush(stdout);
  for (int i = 0; i < conns; ++i) {
    int c = accept(l, nullptr, nullptr);
    if (c < 0) {
      printf("FAIL accept %d\n", i);
      return 1;
    }
    timeouts(c);
    uint32_t hdr[2];
    if (!read_all(c, reinterpret_cast<uint8_t*>(hdr), sizeof hdr) || hdr[1] > (64u << 20)) {
      printf("FAIL header of connection %d\n", i);
      return 1;
    }
    std::vector<uint8_t> buf(hdr[1]);
    if (!read_all(c, buf.data(), buf.size())) {
      printf("FAIL connection %u: short read\n", hdr[0]);
      return 1;
    }
    if (long long at = first_wrong(buf, hdr[0], false); at >= 0) {
      printf("FAIL connection %u: byte %lld is not its own\n", hdr[0], at);
      return 1;
    }
    for (size_t j = 0; j < buf.size(); ++j) buf[j] = pattern(hdr[0], j, true);
    if (!write_all(c, buf.data(), buf.size())) {
      printf("FAIL connection %u: answer not written\n", hdr[0]);
      return 1;
    }
    close(c);
  }
  printf("RESULT served=%d\n", conns);
  return 0;
}

int dial(int port) {
  int c = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(c, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(c);
    return -1;
  }
  timeouts(c);
  return c;
}

int client(int port, int conns, size_t bytes, bool overlap) {
  int prev = -1;
  std::vector<uint8_t> buf(bytes);
  for (int i = 0; i < conns; ++i) {
    const int c = dial(port);
    if (c < 0) {
      printf("FAIL connect %d\n", i);
      return 1;
    }
    const uint32_t hdr[2] = {static_cast<uint32_t>(i), static_cast<uint32_t>(bytes)};
    for (size_t j = 0; j < bytes; ++j) buf[j] = pattern(i, j, false);
    if (!write_all(c, reinterpret_cast<const uint8_t*>(hdr), sizeof hdr) ||
        !write_all(c, buf.data(), bytes)) {
      printf("FAIL connection %d: not written\n", i);
      return 1;
    }
    if (!read_all(c, buf.data(), bytes)) {
      printf("FAIL connection %d: short answer\n", i);
      return 1;
    }
    if (long long at = first_wrong(buf, i, true); at >= 0) {
      printf("FAIL connection %d: answer byte %lld is not its own\n", i, at);
      return 1;
    }
    if (prev >= 0) {
      uint8_t b;
      ssize_t r = read(prev, &b, 1);
      if (r != 0) {
        printf("FAIL connection %d: read %zd after the next one, not end-of-file\n", i - 1, r);
        return 1;
      }
      close(prev);
      prev = -1;
    }
    if (overlap)
      prev = c;
    else
      close(c);
  }
  if (prev >= 0) close(prev);
  printf("RESULT ok=%d\n", conns);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string role;
  int port = 0, conns = 0, overlap = 0;
  long bytes = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--role")
      role = argv[i + 1];
    else if (k == "--port")
      port = atoi(argv[i + 1]);
    else if (k == "--connections")
      conns = atoi(argv[i + 1]);
    else if (k == "--bytes")
      bytes = atol(argv[i + 1]);
    else if (k == "--overlap")
      overlap = atoi(argv[i + 1]);
    else
      return 2;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (port <= 0 || conns <= 0) return 2;
  if (role == "server") return serve(port, conns);
  if (role == "client" && bytes > 0)
    return client(port, conns, static_cast<size_t>(bytes), overlap);
  return 2;
}
