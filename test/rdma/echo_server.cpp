// echo_server: a plain blocking TCP echo server for the soft-RoCE tier
// (test/rdma/run.sh). It accepts COUNT connections one after the other in ONE
// process and echoes each until the client's EOF, so that a librsock preloaded
// into it sees several connections from the same client host: the fallback
// matrix uses it to show the server's per-host negative cache (the second
// plain connection is not waited for). Only plain POSIX socket calls are
// used, so it behaves the same with or without librsock. The data check is
// the client's: rs_stream with equal --tx-seed and --rx-seed verifies that
// every byte came back unchanged.
//
// With --workers W it is a listen-then-fork server (nginx-style): after
// listen() it forks W worker processes that all accept from the inherited
// listener, K connections each, at the same time; the parent only waits for
// them. The soft-RoCE tier uses it for what librsock does with workers that
// inherited a listener.
//
// Usage: echo_server --addr A --port P [--count K] [--workers W]
//        (K defaults to 1; no --workers: one process)
// Output (stdout, unbuffered): "READY" once listening (and forked), then per
// connection "CONN i echoed=N end=eof" (or end=<errno text>; with workers
// "CONN w.i ..."). Exit status 0 when every connection ended with EOF after
// all its bytes were echoed (in every worker), 1 otherwise, 2 on bad usage.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace {

void say(const std::string& line) {
  std::string s = line + "\n";
  ssize_t r = ::write(1, s.data(), s.size());
  (void)r;
}

bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Echoes fd until EOF. Returns "eof" or the errno text of the failing call.
std::string echo(int fd, unsigned long long* echoed) {
  std::vector<char> buf(64 << 10);
  for (;;) {
    ssize_t r = ::read(fd, buf.data(), buf.size());
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return strerror(errno);
    if (r == 0) return "eof";
    if (!write_all(fd, buf.data(), static_cast<size_t>(r))) return strerror(errno);
    *echoed += static_cast<unsigned long long>(r);
  }
}

// Accepts count connections from ls one after the other and echoes each.
// Returns whether every one ended with EOF after all its bytes were echoed.
bool serve(int ls, int count, const std::string& tag) {
  bool ok = true;
  for (int i = 1; i <= count; ++i) {
    int c;
    do {
      c = accept(ls, nullptr, nullptr);
    } while (c < 0 && errno == EINTR);
    if (c < 0) {
      fprintf(stderr, "echo_server: accept: %s\n", strerror(errno));
      return false;
    }
    unsigned long long echoed = 0;
    std::string end = echo(c, &echoed);
    say("CONN " + tag + std::to_string(i) + " echoed=" + std::to_string(echoed) + " end=" + end);
    if (end != "eof") ok = false;
    if (close(c) != 0) ok = false;
  }
  close(ls);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  std::string addr;
  int port = 0;
  int count = 1;
  int workers = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--addr") {
      addr = argv[i + 1];
    } else if (k == "--port") {
      port = atoi(argv[i + 1]);
    } else if (k == "--count") {
      count = atoi(argv[i + 1]);
    } else if (k == "--workers") {
      workers = atoi(argv[i + 1]);
    } else {
      fprintf(stderr, "echo_server: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (argc % 2 != 1 || port <= 0 || count <= 0 || workers < 0 ||
      inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) {
    fprintf(stderr, "usage: echo_server --addr IPv4 --port P [--count K] [--workers W]\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (ls < 0 || bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || listen(ls, 16) != 0) {
    fprintf(stderr, "echo_server: listen on %s:%d: %s\n", addr.c_str(), port, strerror(errno));
    return 1;
  }
  if (workers == 0) {
    say("READY");
    return serve(ls, count, "") ? 0 : 1;
  }
  std::vector<pid_t> kids;
  for (int w = 1; w <= workers; ++w) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "echo_server: fork: %s\n", strerror(errno));
      return 1;
    }
    if (pid == 0) _exit(serve(ls, count, std::to_string(w) + ".") ? 0 : 1);
    kids.push_back(pid);
  }
  say("READY");  // the parent keeps its listener open, as an nginx master does
  bool ok = true;
  for (pid_t pid : kids) {
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = false;
  }
  close(ls);
  return ok ? 0 : 1;
}
