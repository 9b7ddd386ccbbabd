// Unit tests for src/transport/shm in one process: the region a server
// creates (header, seals) and the checks a client makes when attaching it
// (nonce, size, seals, magic, version, layout); two ShmChannels over two
// mappings of one memfd with a socketpair as the doorbell socket: ring
// placement, control words, doorbells rung only for an armed peer, liveness
// through the socket (close, reset); then Stream over the channels, streaming
// 256 MiB between two threads with random sizes and verified content.

#include "transport/shm/shm_channel.h"
#include "transport/prefix/prefix_channel.h"

#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/barrier.h"
#include "common/sleep_token.h"
#include "ring/sleepers.h"
#include "ring/wire.h"
#include "stats/stats.h"
#include "stream/stream.h"
#include "stream_test_support.h"

namespace rsock {
namespace {

constexpr uint64_t kNonce = 0x0123456789abcdefull;

// A created region and a second mapping of it, as the two processes hold them.
struct Region {
  int memfd = -1;
  void* server_map = nullptr;
  void* client_map = nullptr;
  size_t len = 0;
  ~Region() {
    if (server_map) munmap(server_map, len);
    if (client_map) munmap(client_map, len);
    if (memfd >= 0) close(memfd);
  }
};

RegionHeader* header(void* map) { return static_cast<RegionHeader*>(map); }

// Both channels of one connection. Each takes its mapping and socket end.
struct ShmPair {
  std::unique_ptr<ShmChannel> server;
  std::unique_ptr<ShmChannel> client;
  RegionHeader* region = nullptr;  // the server's mapping (valid while server lives)
};

// A region whose two ends have both switched before any byte and read
// the region (docs/protocol.md section 10): every byte on the rings, the
// socket for doorbells only. The tests of the ring paths start there.
void start_on_ring(void* map) { shm_region_start_on_ring(map); }

// keep_memfd: each channel keeps a dup of the region's memfd, as a paired
// end does (giving pages back needs it). on_ring: start_on_ring; else both
// directions start on the socket.
ShmPair make_shm_pair(size_t ring, uint64_t nonce = kNonce, bool keep_memfd = false,
                      bool on_ring = true) {
  ShmPair p;
  void* smap = nullptr;
  size_t len = 0;
  int memfd = shm_region_create(ring, nonce, &smap, &len);
  EXPECT_GE(memfd, 0) << strerror(-memfd);
  if (memfd < 0) return p;
  if (on_ring) start_on_ring(smap);
  void* cmap = nullptr;
  const int rc = shm_region_attach(memfd, 0, len, nonce, ring, &cmap);
  EXPECT_EQ(rc, 0);
  int sv[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  const RegionRef smem =
      keep_memfd ? arena_adopt(fcntl(memfd, F_DUPFD_CLOEXEC, 0), 0) : RegionRef{};
  const RegionRef cmem =
      keep_memfd ? arena_adopt(fcntl(memfd, F_DUPFD_CLOEXEC, 0), 0) : RegionRef{};
  close(memfd);  // the mappings keep the memory
  p.server = std::make_unique<ShmChannel>(smap, len, true, sv[0], smem);
  p.region = static_cast<RegionHeader*>(smap);
  if (rc == 0) p.client = std::make_unique<ShmChannel>(cmap, len, false, sv[1], cmem);
  return p;
}

int queued_bytes(int fd) {
  int n = -1;
  EXPECT_EQ(ioctl(fd, FIONREAD, &n), 0);
  return n;
}

bool fd_readable(int fd) {
  pollfd p = {fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP | POLLERR));
}

// ----------------------------------------------------------------- region

TEST(ShmRegion, CreateInitialisesHeaderAndSeals) {
  Region r;
  r.memfd = shm_region_create(1 << 16, kNonce, &r.server_map, &r.len);
  ASSERT_GE(r.memfd, 0);
  EXPECT_EQ(r.len, region_bytes_for(1 << 16));
  const RegionHeader* h = header(r.server_map);
  EXPECT_EQ(h->magic, kRegionMagic);
  EXPECT_EQ(h->version, kProtocolVersion);
  EXPECT_EQ(h->header_bytes, region_header_bytes());
  EXPECT_EQ(h->nonce, kNonce);
  EXPECT_EQ(h->ring_bytes, 1u << 16);
  EXPECT_EQ(h->ring_offset[kServerToClient], region_header_bytes());
  EXPECT_EQ(h->ring_offset[kClientToServer], region_header_bytes() + (1 << 16));
  EXPECT_EQ(h->ring_offset[kServerToClient] % kPageBytes, 0u);
  EXPECT_EQ(h->ring_offset[kClientToServer] % kPageBytes, 0u);
  EXPECT_EQ(h->region_bytes, r.len);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(h->dir[d].head.load(), 0u);
    EXPECT_EQ(h->dir[d].consumed.load(), 0u);
    EXPECT_EQ(h->dir[d].producer_flags.load(), 0u);
    EXPECT_EQ(h->dir[d].consumer_flags.load(), 0u);
    EXPECT_EQ(h->dir[d].producer_sleepers.load(), 0u);
    EXPECT_EQ(h->dir[d].consumer_sleepers.load(), 0u);
  }
  struct stat st;
  ASSERT_EQ(fstat(r.memfd, &st), 0);
  EXPECT_EQ(static_cast<size_t>(st.st_size), r.len);
  const int seals = fcntl(r.memfd, F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_GROW);
  EXPECT_TRUE(seals & F_SEAL_SEAL);
  EXPECT_NE(ftruncate(r.memfd, 4096), 0);  // the seals hold
  EXPECT_TRUE(fcntl(r.memfd, F_GETFD) & FD_CLOEXEC);
}

TEST(ShmRegion, AttachMapsTheSameMemory) {
  Region r;
  r.memfd = shm_region_create(4096, kNonce, &r.server_map, &r.len);
  ASSERT_GE(r.memfd, 0);
  ASSERT_EQ(shm_region_attach(r.memfd, 0, r.len, kNonce, 4096, &r.client_map), 0);
  ASSERT_NE(r.client_map, r.server_map);
  header(r.server_map)->dir[1].head.store(42);
  EXPECT_EQ(header(r.client_map)->dir[1].head.load(), 42u);
  static_cast<uint8_t*>(r.client_map)[r.len - 1] = 0x5a;
  EXPECT_EQ(static_cast<uint8_t*>(r.server_map)[r.len - 1], 0x5a);
}

TEST(ShmRegion, AttachRejectsWrongNonce) {
  Region r;
  r.memfd = shm_region_create(4096, kNonce, &r.server_map, &r.len);
  ASSERT_GE(r.memfd, 0);
  void* map = reinterpret_cast<void*>(1);
  EXPECT_EQ(shm_region_attach(r.memfd, 0, r.len, kNonce + 1, 4096, &map), -EPROTO);
  EXPECT_EQ(map, reinterpret_cast<void*>(1));  // untouched on failure
  EXPECT_EQ(shm_region_attach(r.memfd, 0, r.len, 0, 4096, &map), -EPROTO);
  EXPECT_EQ(shm_region_attach(r.memfd, 0, r.len, kNonce, 4096, &r.client_map), 0);
}

TEST(ShmRegion, AttachRejectsWrongSizes) {
  Region r;
  r.memfd = shm_region_create(8192, kNonce, &r.server_map, &r.len);
  ASSERT_GE(r.memfd, 0);
  void* map = nullptr;
  // region_bytes that does not match the ring size, or the memfd.
  EXPECT_EQ(shm_region_attach(r.memfd, 0, r.len - 4096, kNonce, 8192, &map), -EPROTO);
  EXPECT_EQ(shm_region_attach(r.memfd, 0, r.len + 4096, kNonce, 8192, &map), -EPROTO);
  // A consistent offer for another ring size: the memfd's size gives it away.
  EXPECT_EQ(shm_region_attach(r.memfd, 0, region_bytes_for(4096), kNonce, 4096, &map), -EPROTO);
  EXPECT_EQ(shm_region_attach(r.memfd, 0, region_bytes_for(16384), kNonce, 16384, &map), -EPROTO);
  // Not a power of two.
  EXPECT_EQ(shm_region_attach(r.memfd, 0, region_bytes_for(6144), kNonce, 6144, &map), -EPROTO);
  EXPECT_EQ(shm_region_attach(r.memfd, 0, region_bytes_for(0), kNonce, 0, &map), -EPROTO);
  EXPECT_EQ(map, nullptr);
  EXPECT_EQ(shm_region_attach(r.memfd, 0, r.len, kNonce, 8192, &r.client_map), 0);
}

// A byte-for-byte copy of a valid region in a memfd: unsealed, or sealed.
int copy_region(const void* src, size_t len, bool seal) {
  int fd = memfd_create("rsock-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return -1;
  if (ftruncate(fd, static_cast<off_t>(len)) != 0 ||
      pwrite(fd, src, len, 0) != static_cast<ssize_t>(len)) {
    close(fd);
    return -1;
  }
  if (seal) fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
  return fd;
}

TEST(ShmRegion, AttachRejectsUnsealedMemfd) {
  Region r;
  r.memfd = shm_region_create(4096, kNonce, &r.server_map, &r.len);
  ASSERT_GE(r.memfd, 0);
  int unsealed = copy_region(r.server_map, r.len, false);
  int sealed = copy_region(r.server_map, r.len, true);
  ASSERT_GE(unsealed, 0);
  ASSERT_GE(sealed, 0);
  void* map = nullptr;
  EXPECT_EQ(shm_region_attach(unsealed, 0, r.len, kNonce, 4096, &map), -EPROTO);
  EXPECT_EQ(map, nullptr);
  // The same bytes, sealed, are accepted: the seal was the only difference.
  EXPECT_EQ(shm_region_attach(sealed, 0, r.len, kNonce, 4096, &map), 0);
  if (map) munmap(map, r.len);
  close(unsealed);
  close(sealed);
}

TEST(ShmRegion, AttachRejectsCorruptHeader) {
  Region r;
  r.memfd = shm_region_create(4096, kNonce, &r.server_map, &r.len);
  ASSERT_GE(r.memfd, 0);
  RegionHeader* h = header(r.server_map);
  void* map = nullptr;
  auto expect_rejected = [&](const char* what) {
    EXPECT_EQ(shm_region_attach(r.memfd, 0, r.len, kNonce, 4096, &map), -EPROTO) << what;
    EXPECT_EQ(map, nullptr) << what;
  };
  h->magic ^= 1;
  expect_rejected("magic");
  h->magic ^= 1;
  h->version = kProtocolVersion + 1;
  expect_rejected("version");
  h->version = kProtocolVersion;
  h->ring_bytes = 2048;
  expect_rejected("ring_bytes");
  h->ring_bytes = 4096;
  h->region_bytes = r.len - 1;
  expect_rejected("region_bytes");
  h->region_bytes = r.len;
  h->ring_offset[kClientToServer] = region_header_bytes();  // both rings overlap
  expect_rejected("ring_offset");
  h->ring_offset[kClientToServer] = region_header_bytes() + 4096;
  h->ring_offset[kServerToClient] += 4096;
  expect_rejected("ring_offset");
  h->ring_offset[kServerToClient] = region_header_bytes();
  EXPECT_EQ(shm_region_attach(r.memfd, 0, r.len, kNonce, 4096, &r.client_map), 0);
}

TEST(ShmRegion, AttachRejectsANonMemfd) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  void* map = nullptr;
  EXPECT_EQ(shm_region_attach(sv[0], 0, region_bytes_for(4096), kNonce, 4096, &map), -EPROTO);
  EXPECT_EQ(map, nullptr);
  close(sv[0]);
  close(sv[1]);
}

// --------------------------------------------------------------- channels

TEST(ShmChannel, RingsAndControlWordsAreCrossed) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  EXPECT_STREQ(p.server->name(), "shm");
  EXPECT_EQ(p.server->ring_bytes(), 4096u);
  EXPECT_EQ(p.client->ring_bytes(), 4096u);
  ASSERT_EQ(p.server->write(4090, "abcdef", 6), 0);
  EXPECT_EQ(memcmp(p.client->rx_ring() + 4090, "abcdef", 6), 0);
  ASSERT_EQ(p.client->write(0, "xyz", 3), 0);
  EXPECT_EQ(memcmp(p.server->rx_ring(), "xyz", 3), 0);
  EXPECT_NE(memcmp(p.server->rx_ring() + 4090, "abcdef", 6), 0);  // not the same ring

  ASSERT_EQ(p.server->publish(123), 0);
  EXPECT_EQ(p.client->poll().head, 123u);
  EXPECT_EQ(p.server->poll().head, 0u);
  ASSERT_EQ(p.client->grant(100), 0);
  EXPECT_EQ(p.server->poll().consumed, 100u);
  EXPECT_EQ(p.client->poll().consumed, 0u);
  ASSERT_EQ(p.client->publish(7), 0);
  EXPECT_EQ(p.server->poll().head, 7u);
  EXPECT_EQ(p.client->poll().flags, 0u);
  EXPECT_EQ(p.server->poll().flags, 0u);
}

TEST(ShmChannel, FlagsReachThePeer) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  p.server->signal(kSendFin);
  EXPECT_EQ(p.client->poll().flags, uint32_t{kPeerFin});
  EXPECT_EQ(p.server->poll().flags, 0u);  // our own flags are not the peer's
  p.server->signal(kSendClosed);
  EXPECT_EQ(p.client->poll().flags, uint32_t{kPeerFin | kPeerClosed});
  EXPECT_EQ(p.server->poll().flags, 0u);
  // A close is not a FIN by itself (the stream decides FIN or reset), and
  // an abortive one says so.
  p.client->signal(kSendClosed | kSendReset);
  EXPECT_EQ(p.server->poll().flags, uint32_t{kPeerClosed | kPeerReset});
}

TEST(ShmChannel, StalledPeerIsReported) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  p.client->arm(kWantData, 0);
  EXPECT_FALSE(p.server->poll().flags & kPeerStalled);
  p.client->arm(kWantSpace, 0);
  EXPECT_TRUE(p.server->poll().flags & kPeerStalled);
  EXPECT_FALSE(p.client->poll().flags & kPeerStalled);
  p.client->disarm(kWantSpace);
  EXPECT_FALSE(p.server->poll().flags & kPeerStalled);
  p.client->disarm(kWantData);
}

TEST(ShmChannel, DoorbellRingsOnlyForAnArmedPeer) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  const int cfd = p.client->wait_fd();
  const int sfd = p.server->wait_fd();
  // Nobody sleeps: publishing and granting cost no syscall.
  ASSERT_EQ(p.server->publish(10), 0);
  ASSERT_EQ(p.server->grant(0), 0);
  EXPECT_EQ(queued_bytes(cfd), 0);
  // Armed for space, the client is not woken by data, and the reverse.
  p.client->arm(kWantSpace, 0);
  ASSERT_EQ(p.server->publish(20), 0);
  EXPECT_EQ(queued_bytes(cfd), 0);
  p.client->disarm(kWantSpace);
  p.client->arm(kWantData, 0);
  ASSERT_EQ(p.server->grant(0), 0);
  EXPECT_EQ(queued_bytes(cfd), 0);
  // Armed for data: a publish rings exactly once.
  ASSERT_EQ(p.server->publish(30), 0);
  EXPECT_EQ(queued_bytes(cfd), 1);
  EXPECT_TRUE(fd_readable(cfd));
  p.client->disarm(kWantData);
  ASSERT_EQ(p.server->publish(40), 0);
  EXPECT_EQ(queued_bytes(cfd), 1);
  p.client->drain_wakeups();
  EXPECT_EQ(queued_bytes(cfd), 0);
  EXPECT_FALSE(fd_readable(cfd));
  EXPECT_EQ(p.client->poll().flags, 0u);  // draining is not a failure
  // Armed for space: a grant rings.
  p.client->arm(kWantSpace, 0);
  ASSERT_EQ(p.server->grant(0), 0);
  EXPECT_EQ(queued_bytes(cfd), 1);
  p.client->disarm(kWantSpace);
  p.client->drain_wakeups();
  // Counts nest: two sleepers, one leaves, the other is still woken.
  p.client->arm(kWantData, 0);
  p.client->arm(kWantData, 0);
  p.client->disarm(kWantData);
  ASSERT_EQ(p.server->publish(50), 0);
  EXPECT_EQ(queued_bytes(cfd), 1);
  p.client->disarm(kWantData);
  p.client->drain_wakeups();
  // Flags always ring (a peer may be asleep in the application's poll).
  p.client->signal(kSendFin);
  EXPECT_EQ(queued_bytes(sfd), 1);
  EXPECT_EQ(queued_bytes(cfd), 0);
}

// One sleep on several connections (epoll_wait, poll) arms them all with
// one token: a thread that rang it on one connection skips the others,
// and further publishes on the same one (ring/sleepers.h).
TEST(ShmChannel, OneSleepIsRungOnce) {
  ShmPair a = make_shm_pair(4096);
  ShmPair b = make_shm_pair(4096);
  ASSERT_TRUE(a.server && a.client && b.server && b.client);
  const int afd = a.client->wait_fd();
  const int bfd = b.client->wait_fd();
  const uint64_t sent = stats_wakeups(true), spared = stats_wakeups(false);
  const uint64_t sleep = new_sleep_token();
  a.client->arm(kWantData, sleep);
  b.client->arm(kWantData, sleep);
  ASSERT_EQ(a.server->publish(1), 0);
  ASSERT_EQ(b.server->publish(1), 0);
  ASSERT_EQ(a.server->publish(2), 0);
  EXPECT_EQ(queued_bytes(afd), 1);
  EXPECT_EQ(queued_bytes(bfd), 0);
  EXPECT_EQ(stats_wakeups(true), sent + 1);
  EXPECT_EQ(stats_wakeups(false), spared + 2);
  a.client->disarm(kWantData);
  b.client->disarm(kWantData);
  a.client->drain_wakeups();
  // The next sleep is another token: rung again.
  const uint64_t next = new_sleep_token();
  EXPECT_NE(next, sleep);
  b.client->arm(kWantData, next);
  a.client->arm(kWantData, next);
  ASSERT_EQ(a.server->publish(3), 0);
  ASSERT_EQ(b.server->publish(2), 0);
  EXPECT_EQ(queued_bytes(afd), 1);
  EXPECT_EQ(queued_bytes(bfd), 0);
  // A second sleeper on b (another thread, its own sleep): b's word names
  // no single sleep any more, so b rings whatever was rung before.
  b.client->arm(kWantData, new_sleep_token());
  ASSERT_EQ(b.server->publish(3), 0);
  EXPECT_EQ(queued_bytes(bfd), 1);
  b.client->disarm(kWantData);
  b.client->disarm(kWantData);
  a.client->disarm(kWantData);
  a.client->drain_wakeups();
  b.client->drain_wakeups();
}

// A remembered sleep is trusted for a millisecond only.
TEST(ShmChannel, ARungSleepIsForgottenAfterAMillisecond) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  const int cfd = p.client->wait_fd();
  p.client->arm(kWantData, new_sleep_token());
  ASSERT_EQ(p.server->publish(1), 0);
  ASSERT_EQ(p.server->publish(2), 0);
  EXPECT_EQ(queued_bytes(cfd), 1);
  usleep(3000);
  ASSERT_EQ(p.server->publish(3), 0);
  EXPECT_EQ(queued_bytes(cfd), 2);
  p.client->disarm(kWantData);
  p.client->drain_wakeups();
}

// The word itself: a count, and the token of a sole sleeper.
TEST(Sleepers, CountAndTokenOfTheOnlySleeper) {
  std::atomic<uint64_t> w{0};
  const uint64_t t = sleepers::fit_token(0xabcdef12345ull);
  sleepers::arm(w, t);
  EXPECT_EQ(sleepers::count(w.load()), 1u);
  EXPECT_EQ(sleepers::token(w.load()), t);
  sleepers::arm(w, t);  // the same sleep twice (a fd twice in one poll): no token
  EXPECT_EQ(sleepers::count(w.load()), 2u);
  EXPECT_EQ(sleepers::token(w.load()), 0u);
  sleepers::disarm(w);
  EXPECT_EQ(sleepers::count(w.load()), 1u);
  EXPECT_EQ(sleepers::token(w.load()), 0u);  // whoever stays may be another sleep
  sleepers::disarm(w);
  EXPECT_EQ(w.load(), 0u);
  sleepers::disarm(w, 5);  // stops at zero
  EXPECT_EQ(w.load(), 0u);
  sleepers::arm(w, sleepers::fit_token(uint64_t{1} << sleepers::kTokenBits));  // no bits left
  EXPECT_EQ(sleepers::token(w.load()), 0u);
  sleepers::arm(w, t);
  sleepers::arm(w, t);
  sleepers::disarm(w, 2);
  EXPECT_EQ(sleepers::count(w.load()), 1u);
  sleepers::disarm(w, 3);
  EXPECT_EQ(w.load(), 0u);
  // A count that reached its limit stays there (spare doorbells, never a
  // lost one).
  w.store(sleepers::kSaturated - 1);
  sleepers::arm(w, t);
  sleepers::arm(w, t);
  EXPECT_EQ(sleepers::count(w.load()), sleepers::kSaturated);
  sleepers::disarm(w, 100);
  EXPECT_EQ(sleepers::count(w.load()), sleepers::kSaturated);
}

TEST(ShmChannel, PeerSocketCloseIsPeerGone) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  const int cfd = p.client->wait_fd();
  p.server.reset();                       // unmaps and closes its socket end, without setting flags
  EXPECT_EQ(p.client->poll().flags, 0u);  // not noticed until the wakeup is drained
  EXPECT_TRUE(fd_readable(cfd));
  p.client->drain_wakeups();
  const uint32_t flags = p.client->poll().flags;
  EXPECT_EQ(flags & (kPeerFin | kPeerClosed), uint32_t{kPeerClosed});
  EXPECT_FALSE(flags & (kTransportError | kKernelBytes));
}

TEST(ShmChannel, PeerSocketResetIsPeerGoneNotAnError) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  // A doorbell the server never reads: closing a unix socket with unread data
  // resets the connection (the client's recv fails with ECONNRESET). Only
  // doorbells sat there: the peer is gone, and the stream decides from the
  // ring whether that is a FIN or a reset.
  p.client->signal(kSendFin);
  ASSERT_EQ(queued_bytes(p.server->wait_fd()), 1);
  p.server.reset();
  p.client->drain_wakeups();
  const uint32_t flags = p.client->poll().flags;
  EXPECT_EQ(flags & (kPeerFin | kPeerClosed), uint32_t{kPeerClosed});
  EXPECT_FALSE(flags & (kTransportError | kKernelBytes));
}

TEST(ShmChannel, ResetAfterACleanCloseIsNotAnError) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  p.client->signal(kSendFin);
  ASSERT_EQ(queued_bytes(p.server->wait_fd()), 1);
  p.server->signal(kSendClosed);
  p.server.reset();
  p.client->drain_wakeups();
  const uint32_t flags = p.client->poll().flags;
  EXPECT_EQ(flags & (kPeerFin | kPeerClosed), uint32_t{kPeerClosed});
  EXPECT_FALSE(flags & kTransportError);
}

TEST(ShmChannel, DoorbellsAreCountedAndNeverForeign) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  RegionHeader* h = p.region;
  const int cfd = p.client->wait_fd();
  p.client->arm(kWantData, 0);
  for (int i = 0; i < 100; ++i) {
    ASSERT_EQ(p.server->publish(static_cast<uint64_t>(i) + 1), 0);
    if (i % 7 == 0) p.client->drain_wakeups();
  }
  p.client->drain_wakeups();
  p.client->disarm(kWantData);
  EXPECT_EQ(queued_bytes(cfd), 0);
  EXPECT_EQ(h->end[0].doorbells.load(), 100u);  // the server is side 0
  EXPECT_EQ(h->end[1].drained.load(), 100u);
  EXPECT_FALSE(p.client->poll().flags & kKernelBytes);
  EXPECT_FALSE(p.server->poll().flags & kKernelBytes);
}

TEST(ShmChannel, ADrainTakesAtMostItsShareOfAFlood) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  RegionHeader* h = p.region;
  // The server rings far more than one drain takes: counted doorbells,
  // written as fast as the socket takes them.
  const int sfd = p.server->wait_fd();
  const std::vector<char> bells(16 * 1024, 'd');
  size_t sent = 0;
  for (;;) {
    const ssize_t n = ::send(sfd, bells.data(), bells.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
    h->end[0].doorbells.fetch_add(static_cast<uint64_t>(n));
  }
  ASSERT_GT(sent, 2 * ShmChannel::kDrainMaxBytes);
  const int cfd = p.client->wait_fd();
  EXPECT_TRUE(p.client->drain_wakeups());
  // One drain stops at its bound and leaves the rest readable.
  EXPECT_EQ(h->end[1].drained.load(), ShmChannel::kDrainMaxBytes);
  EXPECT_EQ(static_cast<size_t>(queued_bytes(cfd)), sent - ShmChannel::kDrainMaxBytes);
  EXPECT_TRUE(fd_readable(cfd));
  // Later drains take the rest; every byte was a counted doorbell.
  for (int i = 0; i < 64 && queued_bytes(cfd) > 0; ++i) p.client->drain_wakeups();
  EXPECT_EQ(queued_bytes(cfd), 0);
  EXPECT_EQ(h->end[1].drained.load(), sent);
  EXPECT_FALSE(p.client->poll().flags & kKernelBytes);
}

TEST(ShmChannel, ADoorbellThatCannotBeSentIsTakenBack) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  RegionHeader* h = p.region;
  // Fill the client's socket until the server's sends fail with EAGAIN.
  const int cfd = p.client->wait_fd();
  p.client->arm(kWantData, 0);
  int before = -1;
  for (int i = 0; i < 1000000 && queued_bytes(cfd) != before; ++i) {
    before = queued_bytes(cfd);
    for (int k = 0; k < 64; ++k) ASSERT_EQ(p.server->publish(static_cast<uint64_t>(i) + 1), 0);
  }
  p.client->disarm(kWantData);
  // Only the doorbells that went are counted.
  EXPECT_EQ(h->end[0].doorbells.load(), static_cast<uint64_t>(queued_bytes(cfd)));
  p.client->drain_wakeups();
  EXPECT_FALSE(p.client->poll().flags & kKernelBytes);
}

TEST(ShmChannel, AForeignByteResetsBothEndsOnce) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  const uint64_t resets = stats_resets(Reset::kKernelBytes);
  // A byte written to the client's socket behind librsock (the client's
  // end of the socket pair is the server's peer).
  p.client->arm(kWantData, 0);
  ASSERT_EQ(p.server->publish(1), 0);  // one honest doorbell
  ASSERT_EQ(::send(p.server->wait_fd(), "x", 1, MSG_NOSIGNAL), 1);
  p.client->drain_wakeups();
  p.client->disarm(kWantData);
  EXPECT_TRUE(p.client->poll().flags & kKernelBytes);
  // The server is told (and woken): both ends reset, each counted once.
  EXPECT_TRUE(fd_readable(p.server->wait_fd()));
  EXPECT_TRUE(p.server->poll().flags & kKernelBytes);
  p.client->drain_wakeups();
  (void)p.client->poll();
  (void)p.server->poll();
  EXPECT_EQ(stats_resets(Reset::kKernelBytes), resets + 2);
}

// ------------------------------------------------------- Stream over shm

TEST(ShmStream, PeerThatDiesLeavesDataThenEof) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  auto server = std::make_unique<Stream>(std::move(p.server));
  Stream client(std::move(p.client));
  iovec v = {const_cast<char*>("last"), 4};
  ASSERT_EQ(server->send(&v, 1), 4);
  server.reset();  // no close(): the process died, its socket closed
  char buf[16];
  iovec in = {buf, sizeof buf};
  EXPECT_EQ(client.recv(&in, 1, false), 4);
  EXPECT_EQ(memcmp(buf, "last", 4), 0);
  EXPECT_EQ(client.recv(&in, 1, false), -EAGAIN);  // the death is seen on the socket
  client.channel().drain_wakeups();
  // It had read everything: a FIN. Our first write goes and draws the
  // reset of a closed socket (EPIPE pending, as in CLOSE_WAIT).
  EXPECT_EQ(client.recv(&in, 1, false), 0);
  EXPECT_FALSE(client.events().hup);
  EXPECT_EQ(client.send(&v, 1), 4);
  EXPECT_TRUE(client.events().hup);
  EXPECT_EQ(client.send(&v, 1), -EPIPE);
  EXPECT_EQ(client.send(&v, 1), -EPIPE);
}

TEST(ShmStream, PeerThatDiesHavingReadEverythingIsAFinEvenWithoutCredits) {
  ShmPair p = make_shm_pair(1 << 16);
  ASSERT_TRUE(p.server && p.client);
  auto server = std::make_unique<Stream>(std::move(p.server));
  Stream client(std::move(p.client));
  iovec v = {const_cast<char*>("request"), 7};
  ASSERT_EQ(client.send(&v, 1), 7);
  char buf[16];
  iovec in = {buf, sizeof buf};
  ASSERT_EQ(server->recv(&in, 1, false), 7);  // too little to return credits
  server.reset();                             // dies without close()
  client.channel().drain_wakeups();
  char rb[16];
  iovec rin = {rb, sizeof rb};
  EXPECT_EQ(client.recv(&rin, 1, false), 0);
  EXPECT_EQ(client.take_error(), 0);
}

TEST(ShmStream, PeerThatDiesWithUnreadBytesIsAReset) {
  ShmPair p = make_shm_pair(1 << 16);
  ASSERT_TRUE(p.server && p.client);
  auto server = std::make_unique<Stream>(std::move(p.server));
  Stream client(std::move(p.client));
  iovec v = {const_cast<char*>("request"), 7};
  ASSERT_EQ(client.send(&v, 1), 7);
  server.reset();
  client.channel().drain_wakeups();
  StreamEvents ev = client.events();
  EXPECT_TRUE(ev.error && ev.hup && ev.rdhup);
  char rb[16];
  iovec rin = {rb, sizeof rb};
  EXPECT_EQ(client.recv(&rin, 1, false), -ECONNRESET);
  EXPECT_EQ(client.recv(&rin, 1, false), 0);
  EXPECT_EQ(client.send(&v, 1), -EPIPE);
}

TEST(ShmStream, CloseAndShutdown) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  Stream server(std::move(p.server)), client(std::move(p.client));
  iovec v = {const_cast<char*>("ping"), 4};
  ASSERT_EQ(client.send(&v, 1), 4);
  client.shutdown(false, true);
  char buf[16];
  iovec in = {buf, sizeof buf};
  EXPECT_EQ(server.recv(&in, 1, false), 4);
  EXPECT_EQ(server.recv(&in, 1, false), 0);
  EXPECT_TRUE(server.events().rdhup);
  v = {const_cast<char*>("pong"), 4};
  ASSERT_EQ(server.send(&v, 1), 4);  // half-close: the other way still works
  EXPECT_EQ(client.recv(&in, 1, false), 4);
  EXPECT_EQ(memcmp(buf, "pong", 4), 0);
  client.close();
  // The client read everything: a FIN (the server's first write goes and
  // draws the reset, the next fails).
  EXPECT_FALSE(server.events().hup);
  EXPECT_EQ(server.send(&v, 1), 4);
  EXPECT_EQ(server.send(&v, 1), -EPIPE);
  EXPECT_TRUE(server.events().hup);
}

// Over shm the peer takes our credits as read bytes (peer_read_total): bytes
// that relieve() held and the program never read must still make the close
// a reset, as the kernel's close over unread bytes.
TEST(ShmStream, CloseOverHeldBytesIsAReset) {
  ShmPair p = make_shm_pair(4096);
  ASSERT_TRUE(p.server && p.client);
  Stream server(std::move(p.server)), client(std::move(p.client));
  std::vector<char> out(4096, 'h');
  iovec v = {out.data(), out.size()};
  ASSERT_EQ(client.send(&v, 1), 4096);
  ASSERT_EQ(server.relieve(), 4096u);
  server.close();
  client.channel().drain_wakeups();
  EXPECT_EQ(client.send(&v, 1), -ECONNRESET);
}

struct ShmCase {
  size_t ring;
  uint64_t bytes;
};

class ShmStreamThreaded : public ::testing::TestWithParam<ShmCase> {};

TEST_P(ShmStreamThreaded, StreamArrivesIntact) {
  const ShmCase c = GetParam();
  ShmPair p = make_shm_pair(c.ring);
  ASSERT_TRUE(p.server && p.client);
  Stream server(std::move(p.server)), client(std::move(p.client));
  testing::PumpShared sh;
  testing::WaitParams wp;
  wp.spin = 64;
  wp.timeout_ms = 100;  // a lost wakeup shows as a timeout, not a hang
  wp.stall_limit = 50;  // 5 s without any progress anywhere: deadlock
  testing::SendResult sent;
  testing::RecvResult got;
  std::thread tx([&] { sent = testing::pump_send(client, 42, c.bytes, 1, sh, wp, true); });
  std::thread rx([&] { got = testing::pump_recv(server, 42, 2, sh, wp); });
  tx.join();
  rx.join();
  ASSERT_FALSE(sh.deadlock.load());
  EXPECT_TRUE(sent.finished);
  EXPECT_EQ(sent.error, 0);
  EXPECT_EQ(got.error, 0);
  EXPECT_TRUE(got.eof);
  EXPECT_EQ(got.received, c.bytes);
  EXPECT_EQ(got.first_bad, UINT64_MAX) << "corrupt byte at " << got.first_bad;
  EXPECT_EQ(client.bytes_sent(), c.bytes);
  EXPECT_EQ(server.bytes_received(), c.bytes);
  RecordProperty("sleeps", std::to_string(sh.sleeps.load()));
  RecordProperty("timeouts", std::to_string(sh.timeouts.load()));
}

INSTANTIATE_TEST_SUITE_P(Sizes, ShmStreamThreaded,
                         ::testing::Values(ShmCase{1 << 16, uint64_t{256} << 20},
                                           ShmCase{4096, uint64_t{32} << 20}),
                         [](const ::testing::TestParamInfo<ShmCase>& info) {
                           return "ring" + std::to_string(info.param.ring / 1024) + "k";
                         });

// ---- giving an idle ring's pages back (Stream::trim) --------------------------

// Pages of [p, p + len) that are resident (the region is shared memory: a
// page given back is no longer in the memfd).
size_t resident_pages(const void* p, size_t len) {
  std::vector<unsigned char> v(len / kPageBytes);
  EXPECT_EQ(mincore(const_cast<void*>(p), len, v.data()), 0) << strerror(errno);
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

// Sends n pattern bytes from `from` (stream position pos on) and reads them
// all at `to`, checking each byte.
void move_bytes(Stream& from, Stream& to, uint64_t* pos, size_t n) {
  std::vector<uint8_t> buf(n), got(n), scratch;
  testing::fill_pattern(7, *pos, buf.data(), n);
  size_t sent = 0, read = 0;
  while (read < n) {
    if (sent < n) {
      iovec v = {buf.data() + sent, n - sent};
      const ssize_t w = from.send(&v, 1);
      ASSERT_TRUE(w > 0 || w == -EAGAIN) << w;
      if (w > 0) sent += static_cast<size_t>(w);
    }
    iovec in = {got.data() + read, n - read};
    const ssize_t r = to.recv(&in, 1, false);
    ASSERT_TRUE(r > 0 || r == -EAGAIN) << r;
    if (r > 0) read += static_cast<size_t>(r);
  }
  ASSERT_EQ(testing::check_pattern(7, *pos, got.data(), n, scratch), n);
  *pos += n;
}

TEST(ShmTrim, AnIdleRingsTouchedPagesAreGivenBack) {
  const size_t ring = 1 << 16;
  ShmPair p = make_shm_pair(ring, kNonce, true);
  ASSERT_TRUE(p.server && p.client);
  const uint8_t* c2s = reinterpret_cast<const uint8_t*>(p.region) + region_header_bytes() + ring;
  Stream server(std::move(p.server)), client(std::move(p.client));
  stats_reset();
  uint64_t pos = 0;
  ASSERT_NO_FATAL_FAILURE(move_bytes(client, server, &pos, 40000));  // 10 pages touched
  EXPECT_EQ(resident_pages(c2s, ring), 10u);
  // The receiver gives them back; the ring the other way carried nothing.
  EXPECT_EQ(server.trim(), 40960u);
  EXPECT_EQ(resident_pages(c2s, ring), 0u);
  EXPECT_EQ(stats_trims(), 1u);
  EXPECT_EQ(stats_trimmed_bytes(), 40960u);
  // Nothing touched since: nothing to do, from either end.
  EXPECT_EQ(server.trim(), 0u);
  EXPECT_EQ(client.trim(), 0u);
  // The stream goes on across the ring's end (wrapping), intact, and the
  // sender gives back what it touched once the receiver has read it all.
  ASSERT_NO_FATAL_FAILURE(move_bytes(client, server, &pos, 50000));
  EXPECT_GT(resident_pages(c2s, ring), 0u);
  EXPECT_EQ(client.trim(), 13 * kPageBytes);  // 90,000 bytes in: pages 9..15, then 0..5
  EXPECT_EQ(resident_pages(c2s, ring), 0u);
  ASSERT_NO_FATAL_FAILURE(move_bytes(client, server, &pos, 3000));
  EXPECT_EQ(client.trim(), 0u);  // under kTrimMinBytes: kept
  EXPECT_EQ(stats_trims(), 2u);
}

TEST(ShmTrim, NothingIsGivenBackWhileBytesAreInFlight) {
  const size_t ring = 1 << 16;
  ShmPair p = make_shm_pair(ring, kNonce, true);
  ASSERT_TRUE(p.server && p.client);
  Stream server(std::move(p.server)), client(std::move(p.client));
  std::vector<uint8_t> buf(30000), got(30000), scratch;
  testing::fill_pattern(3, 0, buf.data(), buf.size());
  iovec v = {buf.data(), buf.size()};
  ASSERT_EQ(client.send(&v, 1), 30000);
  EXPECT_EQ(server.trim(), 0u);  // unread: neither end may
  EXPECT_EQ(client.trim(), 0u);
  iovec in = {got.data(), 20000};
  ASSERT_EQ(server.recv(&in, 1, false), 20000);
  EXPECT_EQ(server.trim(), 0u);  // still 10,000 unread
  EXPECT_EQ(client.trim(), 0u);
  in = {got.data() + 20000, 10000};
  ASSERT_EQ(server.recv(&in, 1, false), 10000);
  EXPECT_EQ(testing::check_pattern(3, 0, got.data(), got.size(), scratch), got.size());
  EXPECT_GT(client.trim(), 0u);  // the sender, once its peer has read everything
}

TEST(ShmTrim, NotWhileTheProducerIsWriting) {
  const size_t ring = 1 << 16;
  ShmPair p = make_shm_pair(ring, kNonce, true);
  ASSERT_TRUE(p.server && p.client);
  ShmChannel* cch = p.client.get();
  Stream server(std::move(p.server)), client(std::move(p.client));
  uint64_t pos = 0;
  ASSERT_NO_FATAL_FAILURE(move_bytes(client, server, &pos, 40000));
  ASSERT_TRUE(cch->begin_tx());  // a send between its first copy and its publish
  EXPECT_EQ(server.trim(), 0u);
  cch->end_tx();
  EXPECT_EQ(server.trim(), 40960u);
}

TEST(ShmTrim, ASendWaitsWhileThePeerHoldsItsRing) {
  const size_t ring = 1 << 16;
  ShmPair p = make_shm_pair(ring, kNonce, true);
  ASSERT_TRUE(p.server && p.client);
  RegionHeader* h = p.region;
  ShmChannel* cch = p.client.get();
  Stream server(std::move(p.server)), client(std::move(p.client));
  std::atomic<uint64_t>& seq = h->dir[kClientToServer].trim_seq;
  // The server's end (the consumer) holds the client's ring, as its trim
  // does for the length of one system call.
  seq.store(1);
  // A send that looked before the hold was taken sees it once it has
  // raised `writing`, and lowers it again.
  EXPECT_FALSE(cch->begin_tx());
  EXPECT_EQ(h->dir[kClientToServer].writing.load(), 0u);
  const StreamEvents before = client.events();
  EXPECT_FALSE(before.writable);
  iovec v = {const_cast<char*>("x"), 1};
  EXPECT_EQ(client.send(&v, 1), -EAGAIN);
  EXPECT_EQ(client.writable_bytes(), 0u);
  // Its own end's hold (the producer's, inside its send lock) blocks nobody.
  seq.store(4 | 1 | 2);
  EXPECT_TRUE(client.events().writable);
  // Released: writable again, a new edge for EPOLLET (tx_gen moved).
  seq.store(8);
  const StreamEvents after = client.events();
  EXPECT_TRUE(after.writable);
  EXPECT_NE(after.tx_gen, before.tx_gen);
  EXPECT_EQ(client.send(&v, 1), 1);
  char c;
  iovec in = {&c, 1};
  EXPECT_EQ(server.recv(&in, 1, false), 1);
}

// The race the Dekker pair of `writing` and trim_seq exists for: a sender
// that writes while its receiver gives pages back, both as fast as they can.
// A page punched under a copy shows as zeros in the pattern.
TEST(ShmTrim, StreamStaysIntactWhileBothEndsTrimConstantly) {
  barrier_register();
  const size_t ring = 1 << 16;
  ShmPair p = make_shm_pair(ring, kNonce, true);
  ASSERT_TRUE(p.server && p.client);
  Stream server(std::move(p.server)), client(std::move(p.client));
  stats_reset();
  // At least 48 MiB, and on until more than 10 trims happened (a loaded
  // machine, whose threads take turns, trims less often per byte), up to
  // 1 GiB: the count of trims is not a timing to assert.
  const uint64_t min_total = uint64_t{48} << 20, max_total = uint64_t{1} << 30;
  std::atomic<uint64_t> end{UINT64_MAX};  // what the sender sent in all, once it stopped
  std::atomic<bool> failed{false};
  std::thread tx([&] {
    std::mt19937_64 rng(11);
    std::vector<uint8_t> buf(1 << 16);
    for (uint64_t pos = 0, sends = 0; !failed;) {
      if (pos >= min_total && (stats_trims() > 10 || pos >= max_total)) {
        end.store(pos, std::memory_order_release);
        break;
      }
      // Every 32nd send first waits for the receiver to have read (and
      // trimmed) everything, so that the ring is empty many times whatever
      // the speeds (a sanitizer build's too), then writes at once, into
      // the receiver's trims.
      if (++sends % 32 == 0)
        while (client.writable_bytes() < ring && !failed) std::this_thread::yield();
      const size_t n = std::min<uint64_t>(1 + rng() % buf.size(), max_total - pos);
      testing::fill_pattern(5, pos, buf.data(), n);
      iovec v = {buf.data(), n};
      const ssize_t w = client.send(&v, 1);
      if (w > 0)
        pos += static_cast<uint64_t>(w);
      else if (w != -EAGAIN)
        failed = true;
      else if (rng() % 4 == 0)
        client.trim();
      else
        std::this_thread::yield();
    }
  });
  std::vector<uint8_t> got(1 << 16), scratch;
  uint64_t pos = 0, first_bad = UINT64_MAX;
  while (pos < end.load(std::memory_order_acquire) && !failed) {
    iovec in = {got.data(), got.size()};
    const ssize_t r = server.recv(&in, 1, false);
    if (r == -EAGAIN) {
      server.trim();
      std::this_thread::yield();
      continue;
    }
    if (r <= 0) {
      failed = true;
      break;
    }
    const size_t ok = testing::check_pattern(5, pos, got.data(), static_cast<size_t>(r), scratch);
    if (ok != static_cast<size_t>(r)) {
      first_bad = pos + ok;
      failed = true;
      break;
    }
    pos += static_cast<uint64_t>(r);
    server.trim();
  }
  tx.join();
  EXPECT_FALSE(failed.load());
  EXPECT_EQ(first_bad, UINT64_MAX) << "byte " << first_bad << " lost to a trim";
  EXPECT_EQ(pos, end.load());
  EXPECT_GE(pos, min_total);
  EXPECT_GT(stats_trims(), 10u);  // the race was run, not avoided
  RecordProperty("trims", std::to_string(stats_trims()));
}

// ---- exec hand-off: validation and resume ------------------------------------

// A TCP connection over loopback in this process: [0] the accepted (server)
// end, [1] the connecting (client) end.
void tcp_pair(int fds[2]) {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(l, 0);
  sockaddr_in a = {};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(l, 1), 0);
  ASSERT_EQ(getsockname(l, reinterpret_cast<sockaddr*>(&a), &len), 0);
  fds[1] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(connect(fds[1], reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  fds[0] = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
  ASSERT_GE(fds[0], 0);
  close(l);
}

TEST(ShmHandoff, ValidatesThenResumesWhereTheOldImageStopped) {
  int tcp[2];
  ASSERT_NO_FATAL_FAILURE(tcp_pair(tcp));
  const size_t ring = 1 << 16;
  void* smap = nullptr;
  size_t len = 0;
  const int memfd = shm_region_create(ring, kNonce, &smap, &len);
  ASSERT_GE(memfd, 0);
  start_on_ring(smap);
  void* cmap = nullptr;
  ASSERT_EQ(shm_region_attach(memfd, 0, len, kNonce, ring, &cmap), 0);
  Stream server(
      std::make_unique<ShmChannel>(smap, len, true, dup(tcp[0]), arena_adopt(dup(memfd), 0)));
  auto client = std::make_unique<Stream>(
      std::make_unique<ShmChannel>(cmap, len, false, dup(tcp[1]), arena_adopt(dup(memfd), 0)));

  // 40000 bytes in flight; the client reads 1000 (not enough to grant on
  // its own), sends 3000 of its own, then "execs".
  std::vector<uint8_t> out(40000), in(40000);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(i * 7 + 1);
  iovec v = {out.data(), out.size()};
  ASSERT_EQ(server.send(&v, 1), 40000);
  iovec r = {in.data(), 1000};
  ASSERT_EQ(client->recv(&r, 1, false), 1000);
  std::vector<uint8_t> up(3000, 0x5a);
  iovec u = {up.data(), up.size()};
  ASSERT_EQ(client->send(&u, 1), 3000);
  client->report_consumed();
  client.reset();  // the old image is gone (no close: the fds survive exec)

  // Anything but this connection's region, seen from this side, is refused
  // before it is trusted.
  void* map = nullptr;
  size_t map_len = 0;
  EXPECT_EQ(shm_region_validate(memfd, 0, tcp[1], false, kNonce + 1, &map, &map_len), -EPROTO);
  EXPECT_EQ(shm_region_validate(memfd, 0, tcp[1], true, kNonce, &map, &map_len), -EPROTO);
  EXPECT_EQ(shm_region_validate(memfd, 0, tcp[0], false, kNonce, &map, &map_len), -EPROTO);
  int plain = memfd_create("not-a-region", MFD_CLOEXEC);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(ftruncate(plain, static_cast<off_t>(len)), 0);
  EXPECT_EQ(shm_region_validate(plain, 0, tcp[1], false, kNonce, &map, &map_len), -EPROTO);
  close(plain);
  EXPECT_EQ(map, nullptr);

  // The new image: the rest of the server's bytes, then more both ways.
  ASSERT_EQ(shm_region_validate(memfd, 0, tcp[1], false, kNonce, &map, &map_len), 0);
  auto ch = std::make_unique<ShmChannel>(ShmChannel::Resume{}, map, map_len, false, dup(tcp[1]),
                                         arena_adopt(dup(memfd), 0));
  const ShmPositions pos = ch->positions();
  EXPECT_EQ(pos.tx_head, 3000u);
  EXPECT_EQ(pos.rx_granted, 1000u);
  Stream resumed(std::move(ch));
  ASSERT_TRUE(resumed.resume(pos.tx_head, pos.tx_credited, pos.rx_granted, pos.fin_sent));
  size_t got = 1000;
  while (got < in.size()) {
    iovec rr = {in.data() + got, in.size() - got};
    ssize_t n = resumed.recv(&rr, 1, false);
    ASSERT_GT(n, 0);
    got += static_cast<size_t>(n);
  }
  EXPECT_EQ(in, out);
  ASSERT_EQ(resumed.send(&u, 1), 3000);
  std::vector<uint8_t> back(6000);
  iovec b = {back.data(), back.size()};
  EXPECT_EQ(server.recv(&b, 1, false), 6000);
  EXPECT_EQ(back, std::vector<uint8_t>(6000, 0x5a));
  close(memfd);
  close(tcp[0]);
  close(tcp[1]);
}

TEST(ShmHandoff, WaitersKilledByExecAreWithdrawn) {
  auto p = make_shm_pair(1 << 16);
  ASSERT_TRUE(p.client && p.server);
  // Two threads of the old image asleep on data, one on space.
  p.client->arm(kWantData, 0);
  p.client->arm(kWantData, 0);
  p.client->arm(kWantSpace, 0);
  uint32_t data = 0, space = 0;
  p.client->local_armed(&data, &space);
  EXPECT_EQ(data, 2u);
  EXPECT_EQ(space, 1u);
  EXPECT_NE(p.server->poll().flags & kPeerStalled, 0u);
  // The new image withdraws what the old one left: the server no longer
  // sees the client stalled, nor rings its doorbell for new data.
  p.client->forget_waiters(data, space);
  EXPECT_EQ(p.server->poll().flags & kPeerStalled, 0u);
  ASSERT_EQ(p.server->publish(0), 0);
  EXPECT_EQ(queued_bytes(p.client->wait_fd()), 0);
  // More than is left stops at zero (a wrapped count would read as stalled).
  p.client->forget_waiters(5, 5);
  EXPECT_EQ(p.server->poll().flags & kPeerStalled, 0u);
  // A waiter armed afterwards still gets its doorbell.
  p.client->arm(kWantData, 0);
  ASSERT_EQ(p.server->publish(0), 0);
  EXPECT_EQ(queued_bytes(p.client->wait_fd()), 1);
  p.client->disarm(kWantData);
}

TEST(ShmHandoff, ImpossiblePositionsAreRefused) {
  auto p = make_shm_pair(1 << 16);
  ASSERT_TRUE(p.client);
  Stream s(std::move(p.client));
  EXPECT_FALSE(s.resume(100, 200, 0, false));              // credited beyond sent
  EXPECT_FALSE(s.resume((1 << 16) + 101, 100, 0, false));  // more in flight than a ring
  EXPECT_TRUE(s.resume((1 << 16) + 100, 100, 0, false));
}

// ---- starting on TCP (docs/protocol.md section 10) ---------------------------

// A pair whose two ends start with both directions on the socket (a
// socketpair here), as a connection that carried bytes before it paired.
struct TcpFirst {
  RegionHeader* region = nullptr;
  int server_fd = -1, client_fd = -1;  // the channels' sockets (theirs)
  std::unique_ptr<Stream> server, client;
};

// over_tcp: a loopback TCP connection instead of a socketpair (for what
// only TCP does: a reset when a socket closes with bytes unread).
TcpFirst make_tcp_first(size_t ring = 1 << 16, bool over_tcp = false) {
  TcpFirst t;
  ShmPair p = make_shm_pair(ring, kNonce, false, false);
  EXPECT_TRUE(p.server && p.client);
  if (!p.server || !p.client) return t;
  if (over_tcp) {
    int tcp[2];
    tcp_pair(tcp);
    // The channels keep their numbers; the socket behind them changes.
    EXPECT_EQ(dup3(tcp[0], p.server->kernel_socket(), O_CLOEXEC), p.server->kernel_socket());
    EXPECT_EQ(dup3(tcp[1], p.client->kernel_socket(), O_CLOEXEC), p.client->kernel_socket());
    close(tcp[0]);
    close(tcp[1]);
  }
  t.region = p.region;
  t.server_fd = p.server->kernel_socket();
  t.client_fd = p.client->kernel_socket();
  t.server = std::make_unique<Stream>(std::move(p.server));
  t.client = std::make_unique<Stream>(std::move(p.client));
  return t;
}

ssize_t send_str(Stream& s, const std::string& str) {
  iovec iov = {const_cast<char*>(str.data()), str.size()};
  return s.send(&iov, 1);
}

std::string recv_str(Stream& s, size_t cap, bool peek = false) {
  std::string out(cap, '\0');
  iovec iov = {out.data(), cap};
  const ssize_t n = s.recv(&iov, 1, peek);
  if (n < 0) return "<" + std::to_string(n) + ">";
  out.resize(static_cast<size_t>(n));
  return out;
}

TEST(ShmSwitch, BytesBeforeTheAttachGoOnTheSocketAndTheRestOnTheRing) {
  TcpFirst t = make_tcp_first();
  ASSERT_TRUE(t.server && t.client);
  EXPECT_TRUE(t.client->tx_on_tcp() && t.client->rx_on_tcp());
  // Neither end reads the region yet: bytes go on the socket.
  ASSERT_EQ(send_str(*t.client, "hello "), 6);
  EXPECT_EQ(queued_bytes(t.server_fd), 6);
  EXPECT_EQ(t.region->end[1].tcp_sent.load(), 6u);
  // The client reads the region first: it may not switch yet (the server
  // does not), and its next bytes still go on the socket.
  t.client->attach();
  EXPECT_TRUE(t.client->tx_on_tcp());
  ASSERT_EQ(send_str(*t.client, "world"), 5);
  EXPECT_EQ(queued_bytes(t.server_fd), 11);
  EXPECT_EQ(t.region->end[1].switch_at.load(), kNotSwitched);
  // The server attaches second: it switches at once (0 bytes sent on the
  // socket), with one doorbell that announces it.
  t.server->attach();
  EXPECT_FALSE(t.server->tx_on_tcp());
  EXPECT_EQ(t.region->end[0].switch_at.load(), 0u);
  EXPECT_EQ(queued_bytes(t.client_fd), 1);
  // The client's next send switches at 11 and goes on the ring.
  ASSERT_EQ(send_str(*t.client, "!"), 1);
  EXPECT_FALSE(t.client->tx_on_tcp());
  EXPECT_EQ(t.region->end[1].switch_at.load(), 11u);
  EXPECT_EQ(queued_bytes(t.server_fd), 12);  // 11 data bytes and the doorbell
  // The server reads the socket up to 11, then the ring: in order, and the
  // doorbell is no data (one read may not run past the count).
  EXPECT_EQ(recv_str(*t.server, 100), "hello world");
  EXPECT_EQ(recv_str(*t.server, 100), "!");
  EXPECT_FALSE(t.server->rx_on_tcp());
  EXPECT_EQ(t.region->end[0].tcp_read.load(), 11u);
  // The doorbell stays on the socket for a sleeper to drain, counted.
  EXPECT_EQ(queued_bytes(t.server_fd), 1);
  EXPECT_TRUE(t.server->channel().drain_wakeups());
  EXPECT_EQ(t.region->end[0].drained.load(), 1u);
  // The client's receiver: the server's count was 0, so the doorbell is
  // all it finds on its socket, then the ring.
  ASSERT_EQ(send_str(*t.server, "pong"), 4);
  EXPECT_EQ(recv_str(*t.client, 100), "pong");
  EXPECT_FALSE(t.client->rx_on_tcp());
  EXPECT_EQ(queued_bytes(t.client_fd), 1);
  EXPECT_TRUE(t.client->channel().drain_wakeups());
  EXPECT_EQ(t.region->end[1].drained.load(), 1u);
  // Nothing looked foreign on either side.
  EXPECT_EQ(t.server->channel().poll().flags & kKernelBytes, 0u);
  EXPECT_EQ(t.client->channel().poll().flags & kKernelBytes, 0u);
}

TEST(ShmSwitch, AReadNeverReturnsAByteOfTheRingBeforeThePrefixIsRead) {
  TcpFirst t = make_tcp_first(4096);
  ASSERT_TRUE(t.server && t.client);
  std::vector<uint8_t> a(3000), b(2000);
  testing::fill_pattern(7, 0, a.data(), a.size());
  testing::fill_pattern(7, a.size(), b.data(), b.size());
  iovec ia = {a.data(), a.size()}, ib = {b.data(), b.size()};
  ASSERT_EQ(t.client->send(&ia, 1), 3000);
  t.server->attach();
  t.client->attach();  // second: the client's sender switches at 3000
  EXPECT_EQ(t.region->end[1].switch_at.load(), 3000u);
  ASSERT_EQ(t.client->send(&ib, 1), 2000);
  // Small reads: each stops at the count, then the ring follows.
  std::vector<uint8_t> got, scratch;
  for (int i = 0; i < 100 && got.size() < 5000; ++i) {
    uint8_t buf[700];
    iovec io = {buf, sizeof buf};
    const ssize_t n = t.server->recv(&io, 1, false);
    ASSERT_GT(n, 0) << "read " << got.size();
    got.insert(got.end(), buf, buf + n);
  }
  ASSERT_EQ(got.size(), 5000u);
  EXPECT_EQ(testing::check_pattern(7, 0, got.data(), got.size(), scratch), got.size());
}

TEST(ShmSwitch, APeekLooksWithoutMovingTheCount) {
  TcpFirst t = make_tcp_first();
  ASSERT_TRUE(t.server && t.client);
  ASSERT_EQ(send_str(*t.client, "abc"), 3);
  t.server->attach();
  t.client->attach();
  ASSERT_EQ(send_str(*t.client, "def"), 3);
  EXPECT_EQ(recv_str(*t.server, 100, true), "abc");  // the doorbell is not data
  EXPECT_EQ(recv_str(*t.server, 100, true), "abc");
  EXPECT_EQ(t.region->end[0].tcp_read.load(), 0u);
  EXPECT_EQ(recv_str(*t.server, 2), "ab");
  EXPECT_EQ(recv_str(*t.server, 100), "c");
  EXPECT_EQ(recv_str(*t.server, 100, true), "def");
  EXPECT_EQ(recv_str(*t.server, 100), "def");
}

TEST(ShmSwitch, NoDoorbellGoesOnTheSocketBeforeItsSenderSwitched) {
  TcpFirst t = make_tcp_first(4096);
  ASSERT_TRUE(t.server && t.client);
  ASSERT_EQ(send_str(*t.server, "xy"), 2);  // the server's prefix: 2 bytes
  t.server->attach();                       // first: the server may not switch
  t.client->attach();                       // second: the client switches at 0
  EXPECT_TRUE(t.server->tx_on_tcp());
  EXPECT_EQ(queued_bytes(t.server_fd), 1);  // the client's announcement
  // The client fills the server's ring and waits for credits.
  std::vector<uint8_t> fill(4096, 'z');
  iovec io = {fill.data(), fill.size()};
  ASSERT_EQ(t.client->send(&io, 1), 4096);
  ASSERT_FALSE(t.client->channel().arm(kWantSpace, new_sleep_token()));
  // The server reads it all; its grant must wake the client, but its own
  // sender is still on the socket: the doorbell is owed, and paid by
  // switching (the server's count, 2, before the one byte it rings).
  std::vector<uint8_t> sink(8192);
  iovec in = {sink.data(), sink.size()};
  ASSERT_EQ(t.server->recv(&in, 1, false), 4096);
  EXPECT_FALSE(t.server->tx_on_tcp());
  EXPECT_EQ(t.region->end[0].switch_at.load(), 2u);
  EXPECT_EQ(queued_bytes(t.client_fd), 3);  // "xy", then the doorbell
  t.client->channel().disarm(kWantSpace);
  EXPECT_EQ(recv_str(*t.client, 100), "xy");
  EXPECT_EQ(t.client->channel().poll().flags & kKernelBytes, 0u);
}

TEST(ShmSwitch, AByteOnTheSocketPastTheCountIsForeign) {
  TcpFirst t = make_tcp_first();
  ASSERT_TRUE(t.server && t.client);
  ASSERT_EQ(send_str(*t.client, "data"), 4);
  t.server->attach();
  t.client->attach();
  EXPECT_EQ(t.region->end[1].switch_at.load(), 4u);
  // Something writes to the client's socket behind librsock's back.
  ASSERT_EQ(::send(t.client_fd, "!", 1, MSG_NOSIGNAL), 1);
  EXPECT_EQ(recv_str(*t.server, 100), "data");
  EXPECT_EQ(t.server->channel().poll().flags & kKernelBytes, 0u);
  // What follows the count: the doorbell and one byte more.
  (void)t.server->channel().drain_wakeups();
  EXPECT_NE(t.server->channel().poll().flags & kKernelBytes, 0u);
}

// Bytes written behind librsock before the writer's switch are read as
// prefix (nothing tells them apart yet); once the count comes, it is below
// what the reader read: both ends reset loudly, as for bytes past the count
// (kKernelBytes here, kSendKernelBytes told to the peer), never a stream
// that goes on with bytes nobody counted.
TEST(ShmSwitch, BytesBehindLibrsockBeforeTheCountResetBothEnds) {
  TcpFirst t = make_tcp_first();
  ASSERT_TRUE(t.server && t.client);
  ASSERT_EQ(send_str(*t.client, "hello"), 5);
  ASSERT_EQ(::send(t.client_fd, "RAW", 3, MSG_NOSIGNAL), 3);  // behind librsock
  EXPECT_EQ(recv_str(*t.server, 100), "helloRAW");
  t.server->attach();
  t.client->attach();  // second: switches at its count, 5
  EXPECT_EQ(t.region->end[1].switch_at.load(), 5u);
  EXPECT_EQ(recv_str(*t.server, 100), "<" + std::to_string(-ECONNRESET) + ">");
  EXPECT_NE(t.server->channel().poll().flags & kKernelBytes, 0u);
  EXPECT_NE(t.region->dir[kServerToClient].producer_flags.load() & kSendKernelBytes, 0u)
      << "the peer is told";
}

TEST(ShmSwitch, EofBeforeTheSwitchIsTheSocketsEof) {
  TcpFirst t = make_tcp_first();
  ASSERT_TRUE(t.server && t.client);
  ASSERT_EQ(send_str(*t.client, "last words"), 10);
  ASSERT_EQ(::shutdown(t.client_fd, SHUT_WR), 0);  // as a close of a client on TCP
  EXPECT_EQ(recv_str(*t.server, 100), "last words");
  EXPECT_EQ(recv_str(*t.server, 100), "");
  EXPECT_TRUE(t.server->rx_on_tcp());
}

TEST(ShmSwitch, ShutdownWaitsForThePeerToReadTheRegionThenFinFollowsThePrefix) {
  TcpFirst t = make_tcp_first();
  ASSERT_TRUE(t.server && t.client);
  ASSERT_EQ(send_str(*t.client, "abc"), 3);
  t.client->attach();
  EXPECT_EQ(t.client->shutdown(false, true), -EAGAIN);  // the server does not read the region yet
  t.server->attach();
  EXPECT_EQ(t.client->shutdown(false, true), 0);
  EXPECT_EQ(recv_str(*t.server, 100), "abc");
  EXPECT_EQ(recv_str(*t.server, 100), "");  // the FIN, from the region
  EXPECT_FALSE(t.server->rx_on_tcp());
}

TEST(ShmSwitch, ReadinessFollowsTheSocketUntilTheSwitch) {
  TcpFirst t = make_tcp_first();
  ASSERT_TRUE(t.server && t.client);
  StreamEvents ev = t.server->events();
  EXPECT_FALSE(ev.readable);
  EXPECT_TRUE(ev.writable);  // the socket takes bytes
  ASSERT_EQ(send_str(*t.client, "q"), 1);
  ev = t.server->events();
  EXPECT_TRUE(ev.readable);
  EXPECT_EQ(ev.rx_gen, 0u) << "bytes on the socket, not counted unless asked";
  ev = t.server->events(true, 0, /*edges=*/true);
  const uint64_t gen = ev.rx_gen;
  EXPECT_EQ(gen, 1u);
  ASSERT_EQ(send_str(*t.client, "r"), 1);
  ev = t.server->events(true, 0, /*edges=*/true);
  EXPECT_NE(ev.rx_gen, gen);  // a new edge for EPOLLET
  EXPECT_EQ(recv_str(*t.server, 100), "qr");
  EXPECT_FALSE(t.server->events().readable);
  t.server->attach();
  t.client->attach();
  ASSERT_EQ(send_str(*t.client, "s"), 1);
  EXPECT_TRUE(t.server->events().readable);
  EXPECT_EQ(recv_str(*t.server, 100), "s");
  EXPECT_FALSE(t.server->events().readable);  // the doorbell is not data
}

// The race the count is loaded twice for: a read that starts before the
// sender switches and returns the bytes before the count together with the
// doorbell after it. Run often enough to hit it (the receiver spins on the
// socket while the sender switches).
TEST(ShmSwitch, AReadThatRacesTheSwitchKeepsOnlyTheBytesBeforeTheCount) {
  int raced = 0;
  for (int i = 0; i < 1500; ++i) {
    TcpFirst t = make_tcp_first(4096);
    ASSERT_TRUE(t.server && t.client);
    t.server->attach();
    std::atomic<bool> go{false};
    std::thread tx([&] {
      while (!go.load()) {
      }
      ASSERT_EQ(send_str(*t.client, "abc"), 3);
      t.client->attach();  // switches at 3, rings
      ASSERT_EQ(send_str(*t.client, "def"), 3);
    });
    std::string got;
    go.store(true);
    for (int k = 0; k < 1000000 && got.size() < 6; ++k) {
      const std::string part = recv_str(*t.server, 64);
      if (part.size() > 0 && part[0] != '<') {
        // Read from the socket past the count: the doorbell came with it.
        if (got.empty() && part == "abc" && t.region->end[0].drained.load() == 1) ++raced;
        got += part;
      }
    }
    tx.join();
    ASSERT_EQ(got, "abcdef") << "iteration " << i;
  }
  RecordProperty("raced", std::to_string(raced));
}

// The first answer of a read that is not EAGAIN (the peer's reset takes a
// moment to reach our socket), as recv_str gives it.
std::string recv_until_not_eagain(Stream& s) {
  std::string got;
  for (int i = 0; i < 200; ++i) {
    got = recv_str(s, 100);
    if (got != "<-11>") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return got;
}

// The peer closes while its bytes still go on the socket, leaving our
// announcing doorbell unread: its kernel resets, where kernel TCP would
// have sent a FIN (it read every byte of ours). The region tells them apart.
TEST(ShmSwitch, APeersResetForOurUnreadDoorbellIsAFin) {
  TcpFirst t = make_tcp_first(1 << 16, true);
  ASSERT_TRUE(t.server && t.client);
  ASSERT_EQ(send_str(*t.server, "bye"), 3);  // on the socket: nobody attached
  t.server->attach();
  t.client->attach();  // second: switches at 0, one doorbell to the server
  EXPECT_FALSE(t.client->tx_on_tcp());
  EXPECT_TRUE(t.server->tx_on_tcp());
  t.server->close();
  t.server.reset();  // its socket closes with the doorbell unread: a reset
  EXPECT_EQ(recv_str(*t.client, 100), "bye");
  const std::string end = recv_until_not_eagain(*t.client);
  EXPECT_EQ(end, "");  // EOF, not <-104> (ECONNRESET)
}

// The same close with a byte of ours unread is a reset, as on TCP.
TEST(ShmSwitch, APeerThatLeftOurBytesUnreadResets) {
  TcpFirst t = make_tcp_first(1 << 16, true);
  ASSERT_TRUE(t.server && t.client);
  ASSERT_EQ(send_str(*t.client, "unread"), 6);  // on the socket
  t.server->attach();
  t.client->attach();
  t.server->close();
  t.server.reset();
  const std::string end = recv_until_not_eagain(*t.client);
  EXPECT_EQ(end, "<-104>");
}

// The peer wrote on the socket and then reset (SO_LINGER {1, 0}) before
// either side switched, and we learned of the reset (a poll) before we read:
// the kernel delivers what it queued first, then the error, then EOF. Until
// 2026-12-05 the reset came first and the bytes were lost (CloseTest
// peer_linger0 in the default mode, when the pairing landed inside it).
TEST(ShmSwitch, BytesThePeerWroteOnTheSocketComeBeforeItsReset) {
  TcpFirst t = make_tcp_first(1 << 16, true);
  ASSERT_TRUE(t.server && t.client);
  ASSERT_EQ(send_str(*t.server, "late"), 4);  // on the socket: nobody attached
  for (int i = 0; i < 200 && queued_bytes(t.client_fd) < 4; ++i) usleep(1000);
  ASSERT_EQ(queued_bytes(t.client_fd), 4);
  t.server->close(/*abort=*/true);  // the region says: a reset
  const StreamEvents ev = t.client->events();
  EXPECT_TRUE(ev.readable && ev.error) << "readable " << ev.readable << " error " << ev.error;
  EXPECT_EQ(recv_str(*t.client, 100, /*peek=*/true), "late");
  EXPECT_EQ(recv_str(*t.client, 3), "lat");
  EXPECT_EQ(recv_str(*t.client, 100), "e");
  EXPECT_EQ(recv_str(*t.client, 100), "<-104>");  // ECONNRESET, once
  EXPECT_EQ(recv_str(*t.client, 100), "");
  t.server.reset();
}

// The peer closed over our unread bytes (a reset, told through the region)
// and its kernel reset the socket, whose error a send of ours (a doorbell)
// then took: the socket reads EOF, but the end is the reset the peer told,
// as kernel TCP reports it. Until 2026-12-05 it read as a FIN
// (CloseTest close_unread in the default mode).
TEST(ShmSwitch, AResetThePeerToldStaysAResetWhenADoorbellTookTheSocketsError) {
  TcpFirst t = make_tcp_first(1 << 16, true);
  ASSERT_TRUE(t.server && t.client);
  ASSERT_EQ(send_str(*t.client, "unread"), 6);  // on the socket
  t.server->attach();
  t.client->attach();
  t.server->close();
  t.server.reset();  // its socket closes over our bytes: its kernel resets
  pollfd p = {t.client_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 2000), 1);
  ASSERT_TRUE(p.revents & POLLERR)
      << "no reset on the socket: revents " << p.revents << " queued " << queued_bytes(t.client_fd);
  int err = 0;
  socklen_t len = sizeof err;
  ASSERT_EQ(getsockopt(t.client_fd, SOL_SOCKET, SO_ERROR, &err, &len), 0);  // the doorbell's
  ASSERT_EQ(err, ECONNRESET);
  EXPECT_EQ(recv_str(*t.client, 100), "<-104>");  // ECONNRESET, once
  EXPECT_EQ(recv_str(*t.client, 100), "");
}

// The peer read everything and closed (a FIN, in the region's word), but
// left a doorbell of ours unread, so its kernel reset the socket; a send of
// ours since (on the ring, to a peer that is gone) left EPIPE pending. The
// kernel reads EOF and gives the error only after (SO_ERROR): the FIN came
// first. Until 2026-12-05 the recv failed with EPIPE (CloseTest
// close_read_all_data_left in the default mode).
TEST(ShmSwitch, AFinThePeerToldComesBeforeAnErrorOfOurs) {
  TcpFirst t = make_tcp_first(1 << 16, true);
  ASSERT_TRUE(t.server && t.client);
  ASSERT_EQ(send_str(*t.server, "bye"), 3);  // on the socket: nobody attached
  t.server->attach();
  t.client->attach();  // switches at 0: one doorbell to the server, unread
  EXPECT_FALSE(t.client->tx_on_tcp());
  EXPECT_EQ(recv_str(*t.client, 100), "bye");  // so the server's end does not linger
  t.server->close();
  t.server.reset();  // a FIN in the region, a reset on the socket
  pollfd p = {t.client_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 2000), 1);
  ASSERT_TRUE(p.revents & POLLERR) << "no reset on the socket: revents " << p.revents;
  (void)t.client->events();                 // learns of the peer's end
  EXPECT_EQ(send_str(*t.client, "x"), 1);   // to a peer that is gone: EPIPE pending
  EXPECT_EQ(recv_str(*t.client, 100), "");  // EOF first
  EXPECT_EQ(t.client->take_error(), EPIPE);
}

// Both ends attach at random moments while a stream runs each way.
class ShmSwitchThreaded : public ::testing::TestWithParam<int> {};

TEST_P(ShmSwitchThreaded, StreamsArriveIntactAcrossTheSwitch) {
  TcpFirst t = make_tcp_first(4096);
  ASSERT_TRUE(t.server && t.client);
  testing::PumpShared sh;
  testing::WaitParams wp;
  wp.spin = 16;
  wp.timeout_ms = 100;
  wp.stall_limit = 50;
  const uint64_t bytes = uint64_t{2} << 20;
  const int seed = GetParam();
  testing::SendResult s1, s2;
  testing::RecvResult r1, r2;
  std::thread a([&] { s1 = testing::pump_send(*t.client, 1, bytes, seed, sh, wp, false); });
  std::thread b([&] { r1 = testing::pump_recv(*t.server, 1, seed + 1, sh, wp); });
  std::thread c([&] { s2 = testing::pump_send(*t.server, 2, bytes, seed + 2, sh, wp, false); });
  std::thread d([&] { r2 = testing::pump_recv(*t.client, 2, seed + 3, sh, wp); });
  std::mt19937 rng(seed);
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
  (seed % 2 ? t.client : t.server)->attach();
  std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
  (seed % 2 ? t.server : t.client)->attach();
  a.join();
  b.join();
  c.join();
  d.join();
  ASSERT_FALSE(sh.deadlock.load());
  for (auto* r : {&r1, &r2}) {
    EXPECT_EQ(r->error, 0);
    EXPECT_TRUE(r->eof);
    EXPECT_EQ(r->received, bytes);
    EXPECT_EQ(r->first_bad, UINT64_MAX) << "corrupt byte at " << r->first_bad;
  }
  EXPECT_TRUE(s1.finished && s2.finished);
  // Both directions moved on to their rings, and nothing looked foreign.
  EXPECT_FALSE(t.client->tx_on_tcp() || t.server->tx_on_tcp());
  EXPECT_EQ(t.server->channel().poll().flags & kKernelBytes, 0u);
  EXPECT_EQ(t.client->channel().poll().flags & kKernelBytes, 0u);
  RecordProperty("client_switch_at", std::to_string(t.region->end[1].switch_at.load()));
  RecordProperty("server_switch_at", std::to_string(t.region->end[0].switch_at.load()));
}

INSTANTIATE_TEST_SUITE_P(Seeds, ShmSwitchThreaded, ::testing::Range(1, 9));


// ---- before the pairing (PrefixChannel, Stream::seal) --------------------

// A stream whose connection has not paired: both directions on the kernel
// socket, every byte counted, and the end of the connection the kernel's.
TEST(ShmPrefix, AStreamBeforeThePairingMovesItsBytesOnTheSocketCounted) {
  int tcp[2];
  tcp_pair(tcp);
  auto server = std::make_unique<Stream>(
      std::make_unique<PrefixChannel>(fcntl(tcp[0], F_DUPFD_CLOEXEC, 0), true));
  Stream client(std::make_unique<PrefixChannel>(fcntl(tcp[1], F_DUPFD_CLOEXEC, 0), true));
  EXPECT_TRUE(client.tx_on_tcp() && client.rx_on_tcp());
  // No peer ever attaches: attaching ours changes nothing.
  client.attach();
  server->attach();
  ASSERT_EQ(send_str(client, "hello"), 5);
  EXPECT_EQ(queued_bytes(tcp[0]), 5);
  EXPECT_TRUE(server->events().readable);
  EXPECT_EQ(server->readable_bytes(), 5u);
  EXPECT_EQ(recv_str(*server, 3), "hel");
  EXPECT_EQ(recv_str(*server, 100), "lo");
  EXPECT_EQ(recv_str(*server, 100), "<-11>");  // -EAGAIN: nothing more
  ASSERT_EQ(send_str(*server, "pong"), 4);
  EXPECT_EQ(recv_str(client, 100), "pong");
  EXPECT_TRUE(client.tx_on_tcp() && client.rx_on_tcp() && server->tx_on_tcp());
  EXPECT_EQ(client.tcp_bytes_sent(), 5u);
  EXPECT_EQ(client.tcp_bytes_received(), 4u);
  EXPECT_EQ(server->tcp_bytes_sent(), 4u);
  EXPECT_EQ(server->tcp_bytes_received(), 5u);
  EXPECT_EQ(static_cast<PrefixChannel&>(client.channel()).sent(), 5u);
  EXPECT_EQ(static_cast<PrefixChannel&>(server->channel()).read(), 5u);
  // A clean close is the socket's EOF, not a reset (the peer's read count
  // is not known here, and not asked).
  ASSERT_EQ(send_str(*server, "x"), 1);
  close(tcp[0]);
  server->close();
  server.reset();  // its channel's socket closes with it
  EXPECT_EQ(recv_str(client, 100), "x");
  EXPECT_EQ(recv_str(client, 100), "");
  EXPECT_FALSE(client.events().error);
  close(tcp[1]);
}

// The application closed its last fd before the pairing began: the socket
// ends at once (the peer reads EOF), while the channel keeps its number, on
// a dead placeholder: a thread still on it meets an ended socket, never
// another file that took the number.
TEST(ShmPrefix, ARetiredSocketEndsAtOnceAndKeepsItsNumber) {
  int tcp[2];
  tcp_pair(tcp);
  const int dup = fcntl(tcp[0], F_DUPFD_CLOEXEC, 0);
  Stream server(std::make_unique<PrefixChannel>(dup, true));
  ASSERT_EQ(send_str(server, "bye"), 3);
  close(tcp[0]);  // the application's close: the channel's dup holds the socket
  char buf[8];
  pollfd p = {tcp[1], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 2000), 1);
  ASSERT_EQ(read(tcp[1], buf, sizeof buf), 3);
  EXPECT_EQ(poll(&p, 1, 50), 0) << "an EOF while the channel holds the socket";
  auto& ch = static_cast<PrefixChannel&>(server.channel());
  ch.retire_socket();
  ASSERT_EQ(poll(&p, 1, 2000), 1);
  EXPECT_EQ(read(tcp[1], buf, sizeof buf), 0);  // the FIN
  // The number is still open, on an ended socket of another kind.
  int domain = -1;
  socklen_t len = sizeof domain;
  ASSERT_EQ(getsockopt(dup, SOL_SOCKET, SO_DOMAIN, &domain, &len), 0) << strerror(errno);
  EXPECT_EQ(domain, AF_UNIX);
  EXPECT_EQ(read(dup, buf, sizeof buf), 0);
  EXPECT_EQ(ch.kernel_socket(), dup);
  ch.retire_socket();  // again: nothing changes
  EXPECT_EQ(getsockopt(dup, SOL_SOCKET, SO_DOMAIN, &domain, &len), 0);
  close(tcp[1]);
}

// A connection's stream before its pairing uses the application's own fd
// for its socket (one descriptor per connection, as on TCP): it closes
// nothing of it. own_socket makes it a private dup of the same socket (the
// application's number may then go first); retire_socket at the
// application's last close takes the number out of the stream, with the
// dead placeholder in its place, and leaves the socket to the application.
TEST(ShmPrefix, AStreamOnTheApplicationsFdTakesItsOwnDupOnlyWhenAsked) {
  int tcp[2];
  tcp_pair(tcp);
  auto same_file = [](int a, int b) {
    struct stat sa, sb;
    return fstat(a, &sa) == 0 && fstat(b, &sb) == 0 && sa.st_ino == sb.st_ino &&
           sa.st_dev == sb.st_dev;
  };
  {
    Stream s(std::make_unique<PrefixChannel>(tcp[0]));
    auto& ch = static_cast<PrefixChannel&>(s.channel());
    EXPECT_EQ(ch.kernel_socket(), tcp[0]);
    EXPECT_EQ(ch.wait_fd(), tcp[0]);
    EXPECT_FALSE(ch.owns_socket());
    std::vector<int> own;
    ch.own_fds(&own);
    EXPECT_TRUE(own.empty()) << "the application's fd is not librsock's to keep";
    ASSERT_EQ(send_str(s, "ab"), 2);
    ASSERT_EQ(ch.own_socket(), 0);
    const int d = ch.kernel_socket();
    EXPECT_NE(d, tcp[0]);
    EXPECT_TRUE(ch.owns_socket());
    EXPECT_TRUE(same_file(d, tcp[0]));
    ch.own_fds(&own);
    EXPECT_EQ(own, std::vector<int>{d});
    ASSERT_EQ(ch.own_socket(), 0);  // again: the same dup
    EXPECT_EQ(ch.kernel_socket(), d);
    // The application's number goes first: the stream goes on on its dup.
    const int saved = fcntl(tcp[0], F_DUPFD_CLOEXEC, 0);
    close(tcp[0]);
    ASSERT_EQ(send_str(s, "cd"), 2);
    char buf[8];
    pollfd p = {tcp[1], POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 2000), 1);
    EXPECT_EQ(read(tcp[1], buf, sizeof buf), 4);
    tcp[0] = saved;
  }  // its dup closes with it; the application's socket stays
  ASSERT_EQ(fcntl(tcp[0], F_GETFD), FD_CLOEXEC);
  {
    Stream s(std::make_unique<PrefixChannel>(tcp[0]));
    auto& ch = static_cast<PrefixChannel&>(s.channel());
    ch.retire_socket();
    EXPECT_NE(ch.kernel_socket(), tcp[0]);
    EXPECT_FALSE(same_file(ch.kernel_socket(), tcp[0]));
    char buf[8];
    EXPECT_EQ(recv_str(s, 8), "");  // the placeholder: an ended socket
    EXPECT_EQ(read(ch.kernel_socket(), buf, sizeof buf), 0);
    EXPECT_EQ(ch.own_socket(), 0);  // retired: nothing to own
    EXPECT_FALSE(ch.owns_socket());
  }
  // The socket is still the application's, and open.
  ASSERT_EQ(write(tcp[0], "e", 1), 1);
  char c = 0;
  ASSERT_EQ(read(tcp[1], &c, 1), 1);
  EXPECT_EQ(c, 'e');
  close(tcp[0]);
  close(tcp[1]);
}

TEST(ShmPrefix, AKernelResetIsAReset) {
  int tcp[2];
  tcp_pair(tcp);
  auto server = std::make_unique<Stream>(
      std::make_unique<PrefixChannel>(fcntl(tcp[0], F_DUPFD_CLOEXEC, 0), true));
  Stream client(std::make_unique<PrefixChannel>(fcntl(tcp[1], F_DUPFD_CLOEXEC, 0), true));
  ASSERT_EQ(send_str(client, "unread"), 6);
  // The server closes with our bytes unread: its kernel resets.
  for (int i = 0; i < 200 && queued_bytes(tcp[0]) < 6; ++i) usleep(1000);
  server->close();
  server.reset();
  close(tcp[0]);
  pollfd p = {tcp[1], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 2000), 1);
  const StreamEvents ev = client.events();
  EXPECT_TRUE(ev.readable && ev.hup) << "readable " << ev.readable << " hup " << ev.hup;
  EXPECT_EQ(recv_str(client, 100), "<-104>");  // ECONNRESET
  close(tcp[1]);
}

// Our own shutdown(SHUT_RDWR) on a connection still on TCP makes the socket
// read EOF; that is no FIN of the peer's. When the peer then resets (it
// closes over our unread byte), the error is ECONNRESET, as the kernel's
// (FIN_WAIT2 meets the reset); taken for both FINs, the reset was dropped.
TEST(ShmPrefix, OurOwnShutdownIsNoFinOfThePeers) {
  int tcp[2];
  tcp_pair(tcp);
  auto server = std::make_unique<Stream>(
      std::make_unique<PrefixChannel>(fcntl(tcp[0], F_DUPFD_CLOEXEC, 0), true));
  const int cfd = fcntl(tcp[1], F_DUPFD_CLOEXEC, 0);
  Stream client(std::make_unique<PrefixChannel>(cfd, true));
  ASSERT_EQ(send_str(client, "x"), 1);
  for (int i = 0; i < 200 && queued_bytes(tcp[0]) < 1; ++i) usleep(1000);
  ASSERT_EQ(shutdown(tcp[1], SHUT_RDWR), 0);  // the application's, on the kernel socket
  client.shut_on_tcp(true, true);
  EXPECT_EQ(recv_str(client, 100), "");  // our own SHUT_RD
  server->close();
  server.reset();
  close(tcp[0]);  // the server's last holder: our byte unread, a reset
  pollfd p = {cfd, POLLIN, 0};
  for (int i = 0; i < 2000 && !(p.revents & POLLERR); ++i) ASSERT_GE(poll(&p, 1, 1), 0);
  ASSERT_TRUE(p.revents & POLLERR) << "no reset on the socket: revents " << p.revents;
  EXPECT_TRUE(client.events().error);
  EXPECT_EQ(client.take_error(), ECONNRESET);
  close(tcp[1]);
}

// The pairing ended while the connection had carried bytes: the sealed
// stream hands its counts to a paired one, which reads the rest of the
// peer's socket bytes before the ring, and calls on the sealed one are
// forwarded.
TEST(ShmPrefix, ASealedStreamForwardsAndItsSuccessorGoesOnFromItsCounts) {
  ShmPair p = make_shm_pair(1 << 16, kNonce, false, /*on_ring=*/false);
  ASSERT_TRUE(p.server && p.client);
  const int sfd = p.server->kernel_socket(), cfd = p.client->kernel_socket();
  auto server0 = std::make_unique<Stream>(std::make_unique<PrefixChannel>(dup(sfd), true));
  auto client0 = std::make_unique<Stream>(std::make_unique<PrefixChannel>(dup(cfd), true));
  ASSERT_EQ(send_str(*client0, "ab"), 2);
  EXPECT_EQ(recv_str(*server0, 1), "a");
  ASSERT_EQ(send_str(*server0, "xyz"), 3);
  Stream server(std::move(p.server));
  Stream client(std::move(p.client));
  server0->seal([&](uint64_t sent, uint64_t read) {
    EXPECT_EQ(sent, 3u);
    EXPECT_EQ(read, 1u);
    server.continue_from(sent, read);
  });
  client0->seal([&](uint64_t sent, uint64_t read) {
    EXPECT_EQ(sent, 2u);
    EXPECT_EQ(read, 0u);
    client.continue_from(sent, read);
  });
  EXPECT_TRUE(server0->sealed());
  EXPECT_EQ(send_str(*client0, "!"), Stream::kForwarded);
  EXPECT_EQ(recv_str(*server0, 10), "<" + std::to_string(Stream::kForwarded) + ">");
  const StreamEvents sealed = client0->events();
  EXPECT_TRUE(sealed.readable && sealed.writable);
  server.attach();
  client.attach();
  // Each sender switches at what it had sent on the socket; each receiver
  // reads the rest of the peer's prefix, then the ring.
  ASSERT_EQ(send_str(client, "c"), 1);
  ASSERT_EQ(send_str(server, "w"), 1);
  EXPECT_FALSE(client.tx_on_tcp());
  EXPECT_EQ(recv_str(server, 100), "b");
  EXPECT_EQ(recv_str(server, 100), "c");
  EXPECT_EQ(recv_str(client, 100), "xyz");
  EXPECT_EQ(recv_str(client, 100), "w");
  EXPECT_FALSE(server.rx_on_tcp() || client.rx_on_tcp());
  EXPECT_EQ(server.tcp_bytes_received(), 2u);
  EXPECT_EQ(client.tcp_bytes_sent(), 2u);
  EXPECT_EQ(server.channel().poll().flags & kKernelBytes, 0u);
  EXPECT_EQ(client.channel().poll().flags & kKernelBytes, 0u);
}

}  // namespace
}  // namespace rsock
