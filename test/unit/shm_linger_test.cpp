// Unit tests for src/transport/shm/shm_linger.h over real socket pairs: a
// lingering end keeps its socket while its peer has not read its prefix,
// closes it once the peer has, and no more than kShmLingerMaxEnds ends
// linger at once (the oldest closes when one more comes).
#include "transport/shm/shm_linger.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace rsock {
namespace {

// One closed end as the linger sees it: our socket (handed over), the
// peer's socket (kept here to watch for the close), and the peer's counts.
struct End {
  int ours = -1, peers = -1;
  std::atomic<uint64_t> peer_read{0}, peer_switch_at{0}, read{0};
  std::atomic<uint32_t> peer_flags{0};

  bool make() {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return false;
    ours = sv[0];
    peers = sv[1];
    return true;
  }
  ShmLinger linger(uint64_t sent) {
    ShmLinger l;
    l.socket_fd = ours;
    l.map_len = 4096;
    l.map = mmap(nullptr, l.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    l.sent = sent;
    l.peer_read = &peer_read;
    l.peer_flags = &peer_flags;
    l.peer_switch_at = &peer_switch_at;
    l.read = &read;
    return l;
  }
  // Whether our socket is closed, as the peer sees it.
  bool closed() const {
    pollfd p = {peers, POLLRDHUP, 0};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLRDHUP)) != 0;
  }
  ~End() {
    if (peers >= 0) close(peers);
  }
};

bool wait_closed(const End& e) {
  for (int i = 0; i < 500; ++i) {
    if (e.closed()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Whether `e`'s socket is still on the lingering list. The list's lock also
// orders the linger thread's last look at an end (under it, with the end's
// removal) before the test frees the end's counts.
bool listed(const End& e) {
  std::vector<int> fds;
  shm_linger_own_fds(&fds);
  return std::find(fds.begin(), fds.end(), e.ours) != fds.end();
}

TEST(ShmLinger, AnEndKeepsItsSocketUntilThePeerReadItsPrefix) {
  End e;
  ASSERT_TRUE(e.make());
  shm_linger(e.linger(100));
  e.peer_read.store(99);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(e.closed()) << "closed with a byte of the prefix unread";
  EXPECT_TRUE(listed(e));
  e.peer_read.store(100);
  EXPECT_TRUE(wait_closed(e)) << "still open 5 s after the peer read the prefix";
  EXPECT_FALSE(listed(e)) << "closed, and still on the list";
}

TEST(ShmLinger, NoMoreThanTheCapLingerTheOldestClosesFirst) {
  std::vector<std::unique_ptr<End>> ends;
  for (size_t i = 0; i <= kShmLingerMaxEnds; ++i) {
    ends.push_back(std::make_unique<End>());
    ASSERT_TRUE(ends.back()->make()) << "socket pair " << i;
  }
  for (size_t i = 0; i < kShmLingerMaxEnds; ++i) shm_linger(ends[i]->linger(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(ends[0]->closed()) << "the oldest closed before the cap was passed";
  EXPECT_FALSE(ends[kShmLingerMaxEnds - 1]->closed());

  shm_linger(ends[kShmLingerMaxEnds]->linger(1));
  EXPECT_TRUE(ends[0]->closed()) << "one past the cap, and the oldest still lingers";
  EXPECT_FALSE(ends[1]->closed()) << "more than the oldest closed";
  EXPECT_FALSE(ends[kShmLingerMaxEnds]->closed()) << "the newest closed";

  // The peers read everything: every end closes, so none outlives the test.
  for (auto& e : ends) e->peer_read.store(1);
  for (size_t i = 0; i < ends.size(); ++i) EXPECT_TRUE(wait_closed(*ends[i])) << "end " << i;
  for (size_t i = 0; i < ends.size(); ++i) EXPECT_FALSE(listed(*ends[i])) << "end " << i;
}

}  // namespace
}  // namespace rsock
