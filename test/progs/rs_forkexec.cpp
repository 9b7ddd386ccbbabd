// rs_forkexec: a fork's child that execs takes over the connections it
// inherits, and with them the sleepers that its old image had armed on
// them (exec_handoff). A fork's child has no sleepers of its own: the
// counts it inherited are its parent's threads', and the new image must not
// take those back. Driven by test/preload/intercept_test.cpp.
//
// The client connects; a thread blocks in recv() on the connection (armed,
// asleep); the main thread forks a child that execs this program as
// "rs_forkexec_child" (--role child: it only starts and exits, so librsock
// takes the inherited connection over and releases it); once the child has
// exited, the client sends "G" and the server answers "X". The sleeping
// thread must wake with it: "CLIENT ok", else after 10 s "CLIENT lost
// wakeup" and exit status 1.
//
// Usage: rs_forkexec --role server|client --port P
//        rs_forkexec --role child
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "progs.h"

namespace {

int server(int port) {
  int l = listen_loopback(port, 4);
  if (l < 0) {
    perror("rs_forkexec server: bind/listen");
    return 1;
  }
  printf("READY\n");
  fflush(stdout);
  int c = accept(l, nullptr, nullptr);
  char b = 0;
  if (c < 0 || recv(c, &b, 1, MSG_WAITALL) != 1 || b != 'G') {
    fprintf(stderr, "rs_forkexec server: no go byte\n");
    return 1;
  }
  if (send(c, "X", 1, 0) != 1) return 1;
  // Until the client closes.
  while (recv(c, &b, 1, 0) > 0) {
  }
  printf("SERVER ok\n");
  return 0;
}

int client(int port, const char* self) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = loopback(port);
  if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    perror("rs_forkexec client: connect");
    return 1;
  }
  std::atomic<int> got{-1};
  std::thread reader([&] {
    char b = 0;
    got.store(recv(s, &b, 1, 0) == 1 && b == 'X' ? 1 : 0);
  });
  // Long enough for the reader to have spun and gone to sleep, armed.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  pid_t pid = fork();
  if (pid == 0) {
    execl(self, "rs_forkexec_child", "--role", "child", static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    fprintf(stderr, "rs_forkexec client: the child failed (status %d)\n", status);
    _exit(1);
  }
  if (send(s, "G", 1, 0) != 1) {
    perror("rs_forkexec client: send");
    _exit(1);
  }
  for (int i = 0; i < 1000 && got.load() < 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (got.load() != 1) {
    printf("CLIENT lost wakeup (%d)\n", got.load());
    fflush(stdout);
    _exit(1);  // the reader still sleeps
  }
  reader.join();
  close(s);
  printf("CLIENT ok\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string role;
  int port = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--role") == 0) role = argv[i + 1];
    if (strcmp(argv[i], "--port") == 0) port = atoi(argv[i + 1]);
  }
  if (role == "server") return server(port);
  if (role == "client") return client(port, "/proc/self/exe");
  if (role == "child") return 0;
  fprintf(stderr, "usage: rs_forkexec --role server|client --port P | --role child\n");
  return 2;
}
