// rs_sigfd: the signalfds librsock keeps for blocking sleeps (one per
// sleeping thread, socket/interruptible.cpp), counted in /proc/self/fd.
// Driven by test/preload/signals_test.cpp against an rs_echo server, both
// preloaded. Prints one line per step, then DONE:
//   EXITED n   a thread slept in recv (woken by the echo of another
//              thread's byte) and exited: its signalfd went with it
//   MAIN n     the main thread slept the same way: it keeps one
//   BOTH n     and a second thread sleeps now on another connection
//   CHILD n    in a fork's child: only the forking thread's is left
//   AFTER n    the second thread woke and exited
//   MASKED n   while the main thread sleeps with another signal blocked:
//              its kept fd was replaced, not joined by a second one
//   KEPT n     after that sleep: the new one is kept
// Each count is read until it reaches the value librsock should show, for
// at most 10 s (a sleep starts after a short spin), then printed.
//
// Usage: rs_sigfd --port P (two connections to 127.0.0.1:P)
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <thread>

namespace {

int g_conn[2] = {-1, -1};

int count_signalfds() {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  while (dirent* e = readdir(d)) {
    char path[300], target[64] = {};
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    if (readlink(path, target, sizeof target - 1) > 0 &&
        strcmp(target, "anon_inode:[signalfd]") == 0)
      ++n;
  }
  closedir(d);
  return n;
}

// The count once it is `want`, or whatever it is after 10 s.
int count_when(int want) {
  int n = count_signalfds();
  for (int i = 0; i < 1000 && n != want; ++i) {
    usleep(10000);
    n = count_signalfds();
  }
  return n;
}

// Blocks in recv on connection i until its echo comes back.
void sleep_on(int i) {
  char b;
  if (recv(g_conn[i], &b, 1, MSG_WAITALL) != 1) {
    perror("recv");
    _exit(1);
  }
}

// Sends the byte whose echo ends the sleep, once the sleeper has had time
// to fall asleep (it would only not sleep, which the counts then show).
void wake_later(int i) {
  usleep(300 * 1000);
  if (send(g_conn[i], "x", 1, MSG_NOSIGNAL) != 1) {
    perror("send");
    _exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || strcmp(argv[1], "--port") != 0) {
    fprintf(stderr, "usage: rs_sigfd --port P\n");
    return 2;
  }
  setvbuf(stdout, nullptr, _IONBF, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(atoi(argv[2])));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int& fd : g_conn) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      perror("connect");
      return 1;
    }
  }
  {
    std::thread sleeper(sleep_on, 0), waker(wake_later, 0);
    sleeper.join();
    waker.join();
  }
  printf("EXITED %d\n", count_when(0));
  {
    std::thread waker(wake_later, 0);
    sleep_on(0);
    waker.join();
  }
  printf("MAIN %d\n", count_when(1));
  std::thread second(sleep_on, 1);
  printf("BOTH %d\n", count_when(2));
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    printf("CHILD %d\n", count_when(1));
    _exit(0);
  }
  int st = 0;
  if (waitpid(child, &st, 0) != child || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;
  wake_later(1);
  second.join();
  printf("AFTER %d\n", count_when(1));
  // The main thread blocks a signal for good: its next sleep replaces its
  // kept fd (one signalfd while it sleeps, not the kept one and a second).
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  if (pthread_sigmask(SIG_BLOCK, &usr1, nullptr) != 0) return 1;
  {
    int during = -1;
    std::thread waker([&during] {
      usleep(300 * 1000);
      during = count_signalfds();
      wake_later(0);
    });
    sleep_on(0);
    waker.join();
    printf("MASKED %d\n", during);
  }
  printf("KEPT %d\n", count_when(1));
  for (int fd : g_conn) close(fd);
  printf("DONE\n");
  return 0;
}
