// Unit tests for driven pairings (transport/pairing.h): both ends of a
// same-host pairing advanced by one thread through step(), wait_fds() and
// wake_at_ms(), as socket/pending.cpp's driver thread does. If a step ever
// waited for the other end, that one thread would stall (the other end
// cannot answer while it waits) until the pairing's deadline, and the
// pairing would fall back; a client whose server never comes must end at
// its deadline with step() alone. No timing is asserted: a stalled step
// shows as a fallback.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <vector>

#include "common/clock.h"
#include "config/config.h"
#include "transport/pairing.h"
#include "transport/shm/rendezvous.h"

namespace rsock {
namespace {

struct TcpPair {
  int listener = -1, client = -1, server = -1;
  sockaddr_in addr = {};
  ~TcpPair() {
    for (int fd : {listener, client, server})
      if (fd >= 0) close(fd);
  }
  // A loopback listener and an unconnected client socket.
  bool open() {
    listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (listener < 0 || bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(listener, 8) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
      return false;
    client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    return client >= 0;
  }
  bool connect_and_accept() {
    if (::connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return false;
    server = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    return server >= 0;
  }
};

// Drives every pairing in `ps` from this thread until all have finished:
// a poll() over their wait_fds() until the earliest wake_at_ms(), then a
// step() of each. Returns the number of polls.
int drive_all(std::vector<Pairing*> ps) {
  std::vector<bool> done(ps.size(), false);
  int polls = 0;
  for (size_t left = ps.size(); left > 0;) {
    std::vector<pollfd> pfds;
    int64_t wake = INT64_MAX;
    for (size_t i = 0; i < ps.size(); ++i) {
      if (done[i]) continue;
      pollfd tmp[Pairing::kMaxWaitFds];
      const int n = ps[i]->wait_fds(tmp);
      EXPECT_LE(n, Pairing::kMaxWaitFds);
      pfds.insert(pfds.end(), tmp, tmp + n);
      wake = std::min(wake, ps[i]->wake_at_ms());
    }
    const int64_t now = monotonic_ms();
    const int64_t left_ms = wake <= now ? 0 : std::min<int64_t>(wake - now, 5000);
    ::poll(pfds.data(), pfds.size(), static_cast<int>(left_ms));
    ++polls;
    for (size_t i = 0; i < ps.size(); ++i) {
      if (done[i]) continue;
      if (ps[i]->step()) {
        done[i] = true;
        --left;
      }
    }
  }
  return polls;
}

TEST(DrivenPairing, BothEndsPairFromOneThread) {
  TcpPair t;
  ASSERT_TRUE(t.open());
  const int rdv = shm_client_prepare(t.client, reinterpret_cast<sockaddr*>(&t.addr));
  ASSERT_GE(rdv, 0) << "rendezvous: " << -rdv;
  ASSERT_TRUE(t.connect_and_accept());
  Config cfg;
  cfg.tcp_first = false;           // the rendezvous was made before connect()
  cfg.connect_timeout_ms = 10000;  // a stalled step would reach it
  std::unique_ptr<Pairing> client = shm_client_pairing(t.client, rdv, cfg);
  std::unique_ptr<Pairing> server = shm_server_pairing(t.server, cfg);
  ASSERT_TRUE(client->driven());
  ASSERT_TRUE(server->driven());
  const int polls = drive_all({client.get(), server.get()});
  EXPECT_GE(polls, 1);
  std::unique_ptr<Channel> cch = client->take_channel();
  std::unique_ptr<Channel> sch = server->take_channel();
  EXPECT_NE(cch, nullptr) << "client fell back: " << static_cast<int>(client->why());
  EXPECT_NE(sch, nullptr) << "server fell back: " << static_cast<int>(server->why());
}

TEST(DrivenPairing, AClientWithoutItsServerEndsAtItsDeadline) {
  TcpPair t;
  ASSERT_TRUE(t.open());
  const int rdv = shm_client_prepare(t.client, reinterpret_cast<sockaddr*>(&t.addr));
  ASSERT_GE(rdv, 0);
  ASSERT_TRUE(t.connect_and_accept());  // the server never pairs
  Config cfg;
  cfg.tcp_first = false;  // the rendezvous was made before connect()
  cfg.connect_timeout_ms = 300;
  const int64_t start = monotonic_ms();
  std::unique_ptr<Pairing> client = shm_client_pairing(t.client, rdv, cfg);
  EXPECT_LE(client->wake_at_ms(), monotonic_ms() + 300);  // its deadline, not later
  EXPECT_GE(drive_all({client.get()}), 1);
  EXPECT_GE(monotonic_ms() - start, 300);
  EXPECT_EQ(client->take_channel(), nullptr);
  EXPECT_EQ(client->why(), Fallback::kPairTimeout);
}

TEST(DrivenPairing, AServerWhoseClientHasNoRendezvousFallsBackAtOnce) {
  TcpPair t;
  ASSERT_TRUE(t.open());
  ASSERT_TRUE(t.connect_and_accept());  // a plain client: no rendezvous
  Config cfg;
  cfg.tcp_first = false;  // the rendezvous was made before connect()
  std::unique_ptr<Pairing> server = shm_server_pairing(t.server, cfg);
  EXPECT_TRUE(server->step()) << "finished in one step";
  EXPECT_EQ(server->take_channel(), nullptr);
  EXPECT_EQ(server->why(), Fallback::kPeerNotAccelerated);
}

}  // namespace
}  // namespace rsock
