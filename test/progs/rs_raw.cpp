// rs_raw: bytes written to a connection's kernel socket behind the socket
// API that librsock wraps, driven by test/preload/kernel_bytes_test.cpp and
// the rdma tier (test/rdma, case kernel-bytes).
//
// The process (the reader) listens on --port and forks a writer, which
// connects. The writer sends "hello" with send(), then writes "RAW" past
// the wrappers (--mode sendto: syscall(SYS_sendto); write: syscall(SYS_write);
// stdio: fdopen + fprintf + fflush, whose writes glibc makes internally;
// none: a plain send()), then "bye" with send(). The reader reads with
// blocking recv() until it has the 11 bytes, EOF or an error and prints
// what it got, then tells the writer, which tries one more send() and
// prints both results. On plain TCP every mode delivers "helloRAWbye";
// under librsock the raw bytes cannot be delivered in order, so the
// connection must be reset on both ends (ECONNRESET), never dropped in
// silence and never hang.
//
// Output (reader):  READ <bytes as text> END <complete | 0 | errno name>
//         (writer): WRITER bye=<send result> after=<send result>
// Usage: rs_raw --port P --mode sendto|write|stdio|none
//
// Between two hosts each side runs alone, in step by time instead of pipes
// (the writer waits 500 ms before its raw write and 1 s before its last
// send; the reader stays 2 s after it is done):
//        rs_raw --role reader --addr A --port P
//        rs_raw --role writer --addr A --port P --mode M
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>

namespace {

[[noreturn]] void die(int line, const char* what) {
  fprintf(stderr, "FAIL rs_raw line %d: %s (errno %d %s)\n", line, what, errno, strerror(errno));
  fflush(stderr);
  _exit(1);
}
#define CHECK(cond)                    \
  do {                                 \
    if (!(cond)) die(__LINE__, #cond); \
  } while (0)

void say(const std::string& s) {
  std::string l = s + "\n";
  (void)!::write(1, l.data(), l.size());
}

std::string errname(int e) {
  switch (e) {
    case ECONNRESET:
      return "ECONNRESET";
    case EPIPE:
      return "EPIPE";
    case EAGAIN:
      return "EAGAIN";
    default:
      return "errno" + std::to_string(e);
  }
}

std::string g_addr = "127.0.0.1";  // --addr

sockaddr_in server_addr(int port) {
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  CHECK(inet_pton(AF_INET, g_addr.c_str(), &a.sin_addr) == 1);
  return a;
}

void sleep_ms(int ms) {
  timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// A byte from the other side's pipe; fd -1 (two hosts): waits ms instead.
char get_byte(int fd, char want, int ms) {
  if (fd < 0) {
    sleep_ms(ms);
    return want;
  }
  pollfd p = {fd, POLLIN, 0};
  CHECK(poll(&p, 1, 60000) == 1);
  char c = 0;
  CHECK(read(fd, &c, 1) == 1);
  return c;
}

[[noreturn]] void run_writer(int port, const std::string& mode, int go_fd, int done_fd) {
  int a = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(a >= 0);
  sockaddr_in sa = server_addr(port);
  CHECK(connect(a, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  CHECK(send(a, "hello", 5, 0) == 5);
  CHECK(get_byte(go_fd, 'g', 500) == 'g');  // the reader has "hello" and sleeps in recv
  if (mode == "sendto") {
    CHECK(syscall(SYS_sendto, a, "RAW", 3, 0, nullptr, 0) == 3);
  } else if (mode == "write") {
    CHECK(syscall(SYS_write, a, "RAW", 3) == 3);
  } else if (mode == "stdio") {
    FILE* f = fdopen(dup(a), "w");
    CHECK(f != nullptr);
    CHECK(fprintf(f, "RAW") == 3);
    CHECK(fflush(f) == 0);
    fclose(f);
  } else {
    CHECK(send(a, "RAW", 3, 0) == 3);
  }
  // Under librsock the reset may be back already: bye may fail.
  ssize_t r = send(a, "bye", 3, MSG_NOSIGNAL);
  const std::string bye = r >= 0 ? std::to_string(r) : errname(errno);
  CHECK(get_byte(go_fd, 'r', 1000) == 'r');  // the reader is done
  r = send(a, "more", 4, MSG_NOSIGNAL);
  say("WRITER bye=" + bye + " after=" + (r >= 0 ? std::to_string(r) : errname(errno)));
  if (done_fd >= 0) CHECK(write(done_fd, "d", 1) == 1);
  close(a);
  exit(0);  // exit(): librsock writes the stats line
}

// Accepts one connection on l and reads "helloRAWbye" (or what comes); go,
// done: the pipes to a forked writer, or -1 between two hosts.
int run_reader(int l, int go, int done, pid_t child) {
  int u = accept(l, nullptr, nullptr);
  CHECK(u >= 0);
  std::string got;
  char buf[64];
  // "hello" first (the writer's raw bytes come only once we have it).
  while (got.size() < 5) {
    ssize_t r = recv(u, buf, 5 - got.size(), 0);
    CHECK(r > 0);
    got.append(buf, static_cast<size_t>(r));
  }
  if (go >= 0) CHECK(write(go, "g", 1) == 1);
  std::string end = "complete";
  while (got.size() < 11) {  // "helloRAWbye"
    ssize_t r = recv(u, buf, 11 - got.size(), 0);
    if (r > 0) {
      got.append(buf, static_cast<size_t>(r));
      continue;
    }
    end = r == 0 ? "0" : errname(errno);
    break;
  }
  say("READ " + got + " END " + end);
  if (go >= 0) {
    CHECK(write(go, "r", 1) == 1);
    CHECK(get_byte(done, 'd', 0) == 'd');
    int st = 0;
    CHECK(waitpid(child, &st, 0) == child);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  } else {
    sleep_ms(2000);  // the writer's last send meets an open connection
  }
  close(u);
  close(l);
  say("DONE");
  return 0;
}

int listen_on(int port) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(l >= 0);
  int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa = server_addr(port);
  CHECK(bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
  CHECK(listen(l, 1) == 0);
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  int port = 0;
  std::string mode, role;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--port") port = atoi(argv[i + 1]);
    if (k == "--mode") mode = argv[i + 1];
    if (k == "--role") role = argv[i + 1];
    if (k == "--addr") g_addr = argv[i + 1];
  }
  const bool mode_ok = mode == "sendto" || mode == "write" || mode == "stdio" || mode == "none";
  const bool role_ok = role.empty() || role == "reader" || role == "writer";
  if (port <= 0 || !role_ok || (role != "reader" && !mode_ok)) {
    fprintf(stderr,
            "usage: rs_raw --port P --mode sendto|write|stdio|none\n"
            "       rs_raw --role reader|writer --addr A --port P [--mode M]\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (role == "writer") run_writer(port, mode, -1, -1);
  if (role == "reader") return run_reader(listen_on(port), -1, -1, -1);
  int l = listen_on(port);
  int go[2], done[2];
  CHECK(pipe2(go, O_CLOEXEC) == 0 && pipe2(done, O_CLOEXEC) == 0);
  pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    close(l);
    close(go[1]);
    close(done[0]);
    run_writer(port, mode, go[0], done[1]);
  }
  close(go[0]);
  close(done[1]);
  return run_reader(l, go[1], done[0], child);
}
