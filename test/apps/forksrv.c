// forksrv: the classic fork-per-connection echo server, and its client, for
// the application tier (test/apps/run.sh) and the rdma tier. Plain POSIX
// calls only, so it behaves the same with or without librsock preloaded.
//
//   forksrv server --port P [--addr A] --count N [--mode M] [--exec PROG]
//       listens, prints "READY" and accepts N connections one after the
//       other. For each it forks; the child closes the listener, serves the
//       connection (every byte read is written back, until EOF) and exits.
//       The process model is chosen with --mode:
//         at-once      the parent closes its copy right after fork(); the
//                      child closes the socket, then exits (exit(0))
//         child-exit   as at-once, but the child exits without closing the
//                      socket (the exit closes it)
//         late-close   the parent keeps its copy until the child's first
//                      read() has returned (the child tells it over a pipe),
//                      then closes it
//         inetd        the child dup2()s the socket onto 0 and 1, closes
//                      the other fds and execs PROG (--exec), which serves
//                      stdin/stdout with read/write (forksrv echo-stdio)
//       Children are reaped as they end. Prints "SERVED connections=N
//       children_ok=K" and exits 0 iff every child exited with status 0.
//   forksrv client --port P [--addr A] --count N [--threads T] [--bytes B]
//       makes N connections, T at a time (one thread each); on each it
//       writes B pseudo-random bytes (a function of the connection's number
//       and the offset), shuts down its sending side and reads the echo to
//       EOF, checking every byte (B <= 512 KiB: it writes all before reading). Prints "RESULT connections=N ok=K
//       bytes=TOTAL" and exits 0 iff every connection came back whole.
//   forksrv echo-stdio
//       reads fd 0 and writes every byte to fd 1 with read()/write() until
//       EOF (the program an inetd-style server execs).
// Errors go to stderr with the call and errno; exit 1 on failure, 2 on bad
// usage. Every blocking call on a connection has a 60 s timeout
// (SO_RCVTIMEO/SO_SNDTIMEO), so a lost byte or wakeup ends in an error,
// never a hang. SIGPIPE is ignored.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

enum { kIoTimeoutSec = 60, kBufSize = 65536 };

static const char *g_addr = "127.0.0.1";
static int g_port = -1;
static long g_count = 1;
static int g_threads = 1;
static long g_bytes = 4096;
static const char *g_mode = "at-once";
static const char *g_exec = NULL;

static void die_usage(void) {
  fprintf(stderr,
          "usage: forksrv server --port P [--addr A] --count N [--mode "
          "at-once|child-exit|late-close|inetd] [--exec PROG]\n"
          "       forksrv client --port P [--addr A] --count N [--threads T] [--bytes B]\n"
          "       forksrv echo-stdio\n");
  exit(2);
}

static uint8_t pattern(uint64_t seed, uint64_t i) {
  uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull ^ (i / 8) * 0xbf58476d1ce4e5b9ull;
  x ^= x >> 31;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 29;
  return (uint8_t)(x >> (8 * (i % 8)));
}

static struct sockaddr_in make_addr(void) {
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)g_port);
  if (inet_pton(AF_INET, g_addr, &a.sin_addr) != 1) {
    fprintf(stderr, "forksrv: bad address %s\n", g_addr);
    exit(2);
  }
  return a;
}

static void set_timeouts(int fd) {
  struct timeval tv = {kIoTimeoutSec, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Writes all n bytes; 0 on success, else the errno.
static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

// Echoes in_fd to out_fd until EOF. first_read (may be NULL) is called once,
// after the first read() returned. Returns 0, or exits 1 with a message.
static void echo_loop(int in_fd, int out_fd, const char *who, void (*first_read)(void)) {
  static uint8_t buf[kBufSize];
  long total = 0;
  for (int first = 1;; first = 0) {
    ssize_t r = read(in_fd, buf, sizeof buf);
    if (first && first_read) first_read();
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      fprintf(stderr, "forksrv %s (pid %d): read after %ld bytes: %s\n", who, getpid(), total,
              strerror(errno));
      exit(1);
    }
    if (r == 0) return;
    int e = write_all(out_fd, buf, (size_t)r);
    if (e) {
      fprintf(stderr, "forksrv %s (pid %d): write after %ld bytes: %s\n", who, getpid(), total,
              strerror(e));
      exit(1);
    }
    total += r;
  }
}

// ---- server ----------------------------------------------------------------

static int g_signal_fd = -1;  // late-close: the child's end of the pipe
static void tell_parent(void) {
  if (g_signal_fd >= 0) {
    (void)!write(g_signal_fd, "r", 1);
    close(g_signal_fd);
    g_signal_fd = -1;
  }
}

static long g_children_ok = 0, g_children_bad = 0;
static void reap(int options) {
  int st;
  pid_t pid;
  while ((pid = waitpid(-1, &st, options)) > 0) {
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      g_children_ok++;
    } else {
      g_children_bad++;
      if (WIFEXITED(st))
        fprintf(stderr, "forksrv server: child %d exited with status %d\n", pid, WEXITSTATUS(st));
      else
        fprintf(stderr, "forksrv server: child %d killed by signal %d\n", pid, WTERMSIG(st));
    }
  }
}

static void serve_child(int lfd, int cfd, int pipe_w) {
  close(lfd);
  if (strcmp(g_mode, "inetd") == 0) {
    if (dup2(cfd, 0) != 0 || dup2(cfd, 1) != 1) {
      fprintf(stderr, "forksrv child: dup2: %s\n", strerror(errno));
      _exit(1);
    }
    close(cfd);
    execl(g_exec, g_exec, "echo-stdio", (char *)NULL);
    fprintf(stderr, "forksrv child: exec %s: %s\n", g_exec, strerror(errno));
    _exit(1);
  }
  g_signal_fd = pipe_w;
  set_timeouts(cfd);
  echo_loop(cfd, cfd, "child", pipe_w >= 0 ? tell_parent : NULL);
  if (strcmp(g_mode, "child-exit") != 0 && close(cfd) != 0) {
    fprintf(stderr, "forksrv child: close: %s\n", strerror(errno));
    exit(1);
  }
  exit(0);
}

static int run_server(void) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  struct sockaddr_in a = make_addr();
  if (lfd < 0 || setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, 128) != 0) {
    fprintf(stderr, "forksrv server: listen on %s:%d: %s\n", g_addr, g_port, strerror(errno));
    return 1;
  }
  int late = strcmp(g_mode, "late-close") == 0;
  printf("READY\n");
  fflush(stdout);
  long served = 0;
  while (served < g_count) {
    int cfd = accept(lfd, NULL, NULL);
    if (cfd < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "forksrv server: accept after %ld connections: %s\n", served, strerror(errno));
      return 1;
    }
    int p[2] = {-1, -1};
    if (late && pipe(p) != 0) {
      fprintf(stderr, "forksrv server: pipe: %s\n", strerror(errno));
      return 1;
    }
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "forksrv server: fork after %ld connections: %s\n", served, strerror(errno));
      return 1;
    }
    if (pid == 0) {
      if (late) close(p[0]);
      serve_child(lfd, cfd, late ? p[1] : -1);
    }
    if (late) {
      // Keep our copy until the child's first read() has returned.
      char c;
      close(p[1]);
      while (read(p[0], &c, 1) < 0 && errno == EINTR) {
      }
      close(p[0]);
    }
    if (close(cfd) != 0) {
      fprintf(stderr, "forksrv server: close: %s\n", strerror(errno));
      return 1;
    }
    served++;
    reap(WNOHANG);
  }
  close(lfd);
  reap(0);
  printf("SERVED connections=%ld children_ok=%ld\n", served, g_children_ok);
  return g_children_bad == 0 && g_children_ok == served ? 0 : 1;
}

// ---- client ----------------------------------------------------------------

static long g_next = 0, g_ok = 0, g_total = 0;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

// One connection: returns 1 if every byte came back, else 0 (message printed).
static int one_connection(long id) {
  struct sockaddr_in a = make_addr();
  uint8_t *tx = malloc((size_t)g_bytes + 1), *rx = malloc(kBufSize);
  int ok = 0, fd = socket(AF_INET, SOCK_STREAM, 0);
  long got = 0;
  for (long i = 0; i < g_bytes; i++) tx[i] = pattern((uint64_t)id, (uint64_t)i);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    fprintf(stderr, "forksrv client: connection %ld: connect: %s\n", id, strerror(errno));
    goto out;
  }
  set_timeouts(fd);
  // The server echoes as it reads; at most a socket buffer's worth (or a
  // ring) is in flight, so a few KiB can be written before reading.
  int e = write_all(fd, tx, (size_t)g_bytes);
  if (e) {
    fprintf(stderr, "forksrv client: connection %ld: write: %s\n", id, strerror(e));
    goto out;
  }
  if (shutdown(fd, SHUT_WR) != 0) {
    fprintf(stderr, "forksrv client: connection %ld: shutdown: %s\n", id, strerror(errno));
    goto out;
  }
  for (;;) {
    ssize_t r = read(fd, rx, kBufSize);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      fprintf(stderr, "forksrv client: connection %ld: read after %ld of %ld bytes: %s\n", id, got,
              g_bytes, strerror(errno));
      goto out;
    }
    if (r == 0) break;
    for (ssize_t i = 0; i < r; i++) {
      if (got + i >= g_bytes || rx[i] != tx[got + i]) {
        fprintf(stderr, "forksrv client: connection %ld: byte %ld differs\n", id, got + (long)i);
        goto out;
      }
    }
    got += r;
  }
  if (got != g_bytes) {
    fprintf(stderr, "forksrv client: connection %ld: EOF after %ld of %ld bytes\n", id, got, g_bytes);
    goto out;
  }
  ok = 1;
out:
  if (fd >= 0) close(fd);
  free(tx);
  free(rx);
  return ok;
}

static void *client_thread(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&g_lock);
    long id = g_next < g_count ? g_next++ : -1;
    pthread_mutex_unlock(&g_lock);
    if (id < 0) return NULL;
    int ok = one_connection(id);
    pthread_mutex_lock(&g_lock);
    g_ok += ok;
    if (ok) g_total += g_bytes;
    pthread_mutex_unlock(&g_lock);
  }
}

static int run_client(void) {
  pthread_t t[256];
  if (g_threads < 1 || g_threads > 256) die_usage();
  for (int i = 0; i < g_threads; i++) pthread_create(&t[i], NULL, client_thread, NULL);
  for (int i = 0; i < g_threads; i++) pthread_join(t[i], NULL);
  printf("RESULT connections=%ld ok=%ld bytes=%ld\n", g_count, g_ok, g_total);
  return g_ok == g_count ? 0 : 1;
}

int main(int argc, char **argv) {
  if (argc < 2) die_usage();
  signal(SIGPIPE, SIG_IGN);
  const char *role = argv[1];
  if (strcmp(role, "echo-stdio") == 0) {
    echo_loop(0, 1, "echo-stdio", NULL);
    return 0;
  }
  for (int i = 2; i < argc; i++) {
    if (i + 1 >= argc) die_usage();
    const char *k = argv[i], *v = argv[++i];
    if (!strcmp(k, "--port")) g_port = atoi(v);
    else if (!strcmp(k, "--addr")) g_addr = v;
    else if (!strcmp(k, "--count")) g_count = atol(v);
    else if (!strcmp(k, "--threads")) g_threads = atoi(v);
    else if (!strcmp(k, "--bytes")) g_bytes = atol(v);
    else if (!strcmp(k, "--mode")) g_mode = v;
    else if (!strcmp(k, "--exec")) g_exec = v;
    else die_usage();
  }
  // The client writes everything before it reads: more than fits in flight
  // (a ring or a socket buffer each way) would deadlock with the echo.
  if (g_port <= 0 || g_count < 1 || g_bytes < 0 || g_bytes > (512 << 10)) die_usage();
  if (!strcmp(role, "server")) {
    if (strcmp(g_mode, "at-once") && strcmp(g_mode, "child-exit") && strcmp(g_mode, "late-close") &&
        strcmp(g_mode, "inetd"))
      die_usage();
    if (!strcmp(g_mode, "inetd") && !g_exec) die_usage();
    return run_server();
  }
  if (!strcmp(role, "client")) return run_client();
  die_usage();
}
