// Unit tests for src/transport/shm/region_cache: a region kept by its
// creator serves only the same peer process (pid and token), only once the
// peer's end says it is done, with a fresh header; the cache is bounded
// (the oldest goes) and can be off; an attaching side finds its mapping of
// the same place again; a channel keeps its region only when its process
// held the end alone and dropped it last; after a fork neither keeps one; a
// receive ring is read-only in a new region and in a kept one; a region
// kept after both ends closed holds only the warm start of each ring.
#include "transport/shm/region_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "config/config.h"
#include "ring/region.h"
#include "ring/wire.h"
#include "stats/stats.h"
#include "transport/shm/arena.h"
#include "transport/shm/shm_channel.h"

namespace rsock {
namespace {

constexpr size_t kRing = 1 << 16;
const RegionPeer kPeer = {4242, 0x1234567890abcdefull};

class RegionCache : public ::testing::Test {
 protected:
  void SetUp() override {
    region_cache_drop_all();
    region_cache_set_limit(kDefaultRegionCache);
    stats_reset();
  }
  void TearDown() override {
    region_cache_drop_all();
    region_cache_set_limit(kDefaultRegionCache);
  }
  // A region as a creator makes it for kPeer, its peer end marked done or
  // not.
  RegionRef make(void** map, size_t* len, bool peer_done, uint64_t nonce = 1) {
    RegionRef r;
    EXPECT_EQ(shm_region_place(kPeer, kRing, nonce, &r, map, len), 0);
    if (r.arena != nullptr && peer_done) static_cast<RegionHeader*>(*map)->released[1].store(1);
    return r;
  }
  static void give_up(const RegionRef& r, void* map, size_t len) {
    arena_release(r, len, nullptr, false);
    munmap(map, len);
  }
};

TEST_F(RegionCache, AKeptRegionServesTheSameProcessOnceItsPeerIsDone) {
  void* map = nullptr;
  size_t len = 0;
  const RegionRef r = make(&map, &len, false);
  ASSERT_NE(r.arena, nullptr);
  auto* h = static_cast<RegionHeader*>(map);
  h->dir[0].head.store(777);
  h->holders[0].store(1);
  region_cache_keep(kPeer, r, map, len);
  void* got = nullptr;
  size_t got_len = 0;
  RegionRef g;
  // The peer's end still holds it.
  EXPECT_FALSE(region_cache_take(kPeer, kRing, 99, &g, &got, &got_len));
  h->released[1].store(1);
  // Another process: another pid, or the same pid with another token (a
  // new process that took a dead one's pid, or a fork's child).
  EXPECT_FALSE(region_cache_take({kPeer.pid + 1, kPeer.token}, kRing, 99, &g, &got, &got_len));
  EXPECT_FALSE(region_cache_take({kPeer.pid, kPeer.token + 1}, kRing, 99, &g, &got, &got_len));
  EXPECT_FALSE(region_cache_take(kPeer, kRing * 2, 99, &g, &got, &got_len));  // other rings
  ASSERT_TRUE(region_cache_take(kPeer, kRing, 99, &g, &got, &got_len));
  EXPECT_EQ(g.arena, r.arena);
  EXPECT_EQ(g.offset, r.offset);
  EXPECT_EQ(got, map);
  EXPECT_EQ(got_len, len);
  // A fresh header: the new nonce, every word of the last connection gone.
  EXPECT_EQ(region_header_check(got, got_len, got_len, 99, kRing), 0);
  EXPECT_EQ(h->dir[0].head.load(), 0u);
  EXPECT_EQ(h->holders[0].load(), 0u);
  EXPECT_EQ(h->released[1].load(), 0u);
  EXPECT_EQ(h->end[0].switch_at.load(), kNotSwitched);
  // Taken: not kept twice.
  EXPECT_FALSE(region_cache_take(kPeer, kRing, 100, &g, &got, &got_len));
  EXPECT_EQ(region_cache_size(), 0u);
  give_up(g, map, len);
  EXPECT_EQ(arena_count(), 0u);
}

TEST_F(RegionCache, APeerWithoutATokenGetsNoneKept) {
  void* map = nullptr;
  size_t len = 0;
  const RegionRef r = make(&map, &len, true);
  region_cache_keep({kPeer.pid, 0}, r, map, len);
  EXPECT_EQ(region_cache_size(), 0u);
  EXPECT_EQ(arena_count(), 0u);  // its file closed with its last region
}

TEST_F(RegionCache, AtMostTheLimitAreKeptAndTheOldestGoesFirst) {
  region_cache_set_limit(2);
  RegionRef refs[3];
  void* maps[3];
  size_t len = 0;
  for (int i = 0; i < 3; ++i) {
    refs[i] = make(&maps[i], &len, true, 10 + i);
    region_cache_keep(kPeer, refs[i], maps[i], len);
  }
  EXPECT_EQ(region_cache_size(), 2u);
  EXPECT_EQ(arena_count(), 1u);  // one file for the three
  // Mappings of the attaching side count apart from the creator's regions.
  void* m = mmap(nullptr, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  region_cache_keep_mapping(1, 2, 0, m, 4096);
  EXPECT_EQ(region_cache_size(), 3u);
  void* got = nullptr;
  size_t got_len = 0;
  RegionRef g;
  ASSERT_TRUE(region_cache_take(kPeer, kRing, 5, &g, &got, &got_len));
  EXPECT_EQ(g.offset, refs[1].offset);  // the oldest kept; the first went
  // The place of the one that went serves the next region.
  RegionRef next;
  void* next_map = nullptr;
  ASSERT_EQ(shm_region_place(kPeer, kRing, 6, &next, &next_map, &len), 0);
  EXPECT_EQ(next.offset, refs[0].offset);
  give_up(next, next_map, len);
  give_up(g, got, got_len);
}

TEST_F(RegionCache, OffKeepsNothing) {
  region_cache_set_limit(0);
  void* map = nullptr;
  size_t len = 0;
  const RegionRef r = make(&map, &len, true);
  region_cache_keep(kPeer, r, map, len);
  EXPECT_EQ(region_cache_size(), 0u);
  EXPECT_EQ(arena_count(), 0u);
}

TEST_F(RegionCache, AnAttachingSideFindsItsMappingOfTheSameFileAgain) {
  void* smap = nullptr;
  size_t len = 0;
  // (a second region first: the one under test lies past the file's start)
  void* other = nullptr;
  const RegionRef first = make(&other, &len, false, 6);
  const RegionRef r = make(&smap, &len, false, 7);
  const int fd = arena_fd(r.arena);
  ASSERT_NE(r.offset, 0u);
  void* cmap = nullptr;
  RegionFile file;
  ASSERT_EQ(shm_region_attach(fd, r.offset, len, 7, kRing, &cmap, &file), 0);
  EXPECT_EQ(stats_regions(false), 3u);  // two made, then one mapped
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_EQ(file.dev, st.st_dev);
  EXPECT_EQ(file.ino, st.st_ino);
  EXPECT_EQ(file.offset, r.offset);
  // The same file at another place is another region.
  void* cmap0 = nullptr;
  EXPECT_EQ(shm_region_attach(fd, first.offset, len, 7, kRing, &cmap0), -EPROTO);
  region_cache_keep_mapping(file.dev, file.ino, file.offset, cmap, len);
  // The creator refreshes the header for its next connection; the offer
  // brings the same file in another descriptor.
  shm_region_init_header(smap, kRing, 8);
  const int again = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  void* cmap2 = nullptr;
  ASSERT_EQ(shm_region_attach(again, r.offset, len, 8, kRing, &cmap2), 0);
  EXPECT_EQ(cmap2, cmap);  // the same mapping, not a new one
  EXPECT_EQ(stats_regions(true), 1u);
  EXPECT_EQ(region_cache_size(), 0u);
  // A kept mapping whose header fails the offer's check goes.
  region_cache_keep_mapping(file.dev, file.ino, file.offset, cmap2, len);
  void* cmap3 = nullptr;
  EXPECT_EQ(shm_region_attach(again, r.offset, len, 7, kRing, &cmap3), -EPROTO);
  EXPECT_EQ(region_cache_size(), 0u);
  EXPECT_EQ(stats_regions(true), 1u);
  close(again);
  give_up(r, smap, len);
  give_up(first, other, len);
}

// One connection's two ends in this process over the region at smap (its
// place r, len bytes, a header for nonce), each channel as a pairing makes it:
// the server's labelled with kPeer, the client's with the file it mapped.
// server_reused: the region came out of the cache.
struct Ends {
  std::unique_ptr<ShmChannel> server, client;
  void* cmap = nullptr;
  bool client_reused = false;
};
void connect_ends(const RegionRef& r, void* smap, size_t len, uint64_t nonce, bool server_reused,
                  Ends* e) {
  shm_region_start_on_ring(smap);
  RegionFile file;
  const int memfd = arena_fd(r.arena);
  ASSERT_EQ(
      shm_region_attach(memfd, r.offset, len, nonce, kRing, &e->cmap, &file, &e->client_reused), 0);
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  e->server = std::make_unique<ShmChannel>(smap, len, true, sv[0], r, nullptr, server_reused);
  // (the offer's descriptor: the client holds the file once, as the server)
  e->client = std::make_unique<ShmChannel>(e->cmap, len, false, sv[1],
                                           arena_adopt(fcntl(memfd, F_DUPFD_CLOEXEC, 0), r.offset),
                                           nullptr, e->client_reused);
  e->server->keep_region_for(kPeer);
  e->client->keep_mapping_of(file);
}

// Both ends of one connection in this process, each channel as a pairing
// makes it; `shared`: the server's end was shared (a fork) before it closed.
void close_both(bool shared) {
  void* smap = nullptr;
  size_t len = 0;
  RegionRef r;
  ASSERT_EQ(shm_region_place(kPeer, kRing, 5, &r, &smap, &len), 0);
  Ends e;
  ASSERT_NO_FATAL_FAILURE(connect_ends(r, smap, len, 5, false, &e));
  EXPECT_EQ(arena_count(), 1u);  // the client's end holds the same file
  auto& server = e.server;
  auto& client = e.client;
  if (shared) {
    server->add_holder();
    EXPECT_FALSE(server->drop_holder());  // the other holder stays
  }
  EXPECT_TRUE(client->drop_holder());
  client.reset();
  EXPECT_EQ(static_cast<RegionHeader*>(smap)->released[1].load(), 1u);
  if (shared)
    (void)server->drop_holder();  // the other holder closes: last, but not alone
  else
    EXPECT_TRUE(server->drop_holder());
  server.reset();
}

TEST_F(RegionCache, AChannelThatHeldItsEndAloneKeepsItsRegion) {
  ASSERT_NO_FATAL_FAILURE(close_both(false));
  EXPECT_EQ(region_cache_size(), 2u);  // the server's region, the client's mapping
  void* map = nullptr;
  size_t len = 0;
  RegionRef r;
  ASSERT_TRUE(region_cache_take(kPeer, kRing, 6, &r, &map, &len));
  EXPECT_EQ(region_header_check(map, len, len, 6, kRing), 0);
  give_up(r, map, len);
}

TEST_F(RegionCache, AChannelWhoseEndWasSharedKeepsNothing) {
  ASSERT_NO_FATAL_FAILURE(close_both(true));
  EXPECT_EQ(region_cache_size(), 1u);  // the client's mapping only
  void* map = nullptr;
  size_t len = 0;
  RegionRef r;
  EXPECT_FALSE(region_cache_take(kPeer, kRing, 6, &r, &map, &len));
  EXPECT_EQ(arena_count(), 0u);  // the file went with its last region here
}

TEST_F(RegionCache, AForkLeavesNoKeptRegionAndNewTokensOnBothSides) {
  void* map = nullptr;
  size_t len = 0;
  const RegionRef r = make(&map, &len, true);
  const int fd = arena_fd(r.arena);
  region_cache_keep(kPeer, r, map, len);
  const uint64_t token = region_process_token();
  EXPECT_NE(token, 0u);
  EXPECT_EQ(region_process_token(), token);
  region_cache_fork_prepare();
  const pid_t pid = fork();
  if (pid == 0) {
    region_cache_after_fork_child();
    const bool ok = region_cache_size() == 0 && fcntl(fd, F_GETFD) < 0 &&
                    region_process_token() != token && region_process_token() != 0;
    _exit(ok ? 0 : 1);
  }
  region_cache_after_fork_parent();
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // The parent's goes too: the child holds its file. And the parent proves
  // itself with a new token: the child holds the files its servers made
  // for the old one (arena.h).
  EXPECT_EQ(region_cache_size(), 0u);
  EXPECT_EQ(arena_count(), 0u);
  EXPECT_NE(region_process_token(), token);
  EXPECT_NE(region_process_token(), 0u);
}

// A client's token is its server's alone: another server process gets
// another, the same one the same (its regions go to one file) until the
// tokens are renewed (a spawn) or a fork makes new ones, and none is 0
// (which asks for a file per region).
TEST(RegionToken, OnePerServerProcess) {
  const uint64_t a = region_token_for(1001);
  const uint64_t b = region_token_for(1002);
  EXPECT_NE(a, 0u);
  EXPECT_NE(b, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(region_token_for(1001), a);
  EXPECT_EQ(region_token_for(1002), b);
  region_process_token_renew();
  const uint64_t a2 = region_token_for(1001);
  EXPECT_NE(a2, a);
  EXPECT_NE(a2, 0u);
  EXPECT_EQ(region_token_for(1001), a2);
  region_cache_fork_prepare();
  const pid_t pid = fork();
  if (pid == 0) {
    region_cache_after_fork_child();
    const uint64_t c = region_token_for(1001);
    _exit(c != a2 && c != 0 && region_token_for(1001) == c ? 0 : 1);
  }
  region_cache_after_fork_parent();
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_NE(region_token_for(1001), a2);
}

// The protection of this process's mapping that holds addr, as
// /proc/self/maps shows it ("r--s"), or "" when none does.
std::string protection_at(const void* addr) {
  const auto a = reinterpret_cast<unsigned long>(addr);
  std::string perms;
  FILE* f = fopen("/proc/self/maps", "r");
  char line[512];
  while (f != nullptr && fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    char p[8] = {};
    if (sscanf(line, "%lx-%lx %7s", &lo, &hi, p) == 3 && a >= lo && a < hi) {
      perms = p;
      break;
    }
  }
  if (f != nullptr) fclose(f);
  return perms;
}

// A kept mapping is not protected again (its receive ring is read-only from
// its first connection on): each side's receive ring must be read-only and
// the peer's view of it writable, whether the region is new or kept.
TEST_F(RegionCache, AReceiveRingIsReadOnlyInANewRegionAndInAKeptOne) {
  for (const bool kept : {false, true}) {
    SCOPED_TRACE(kept ? "kept region" : "new region");
    void* smap = nullptr;
    size_t len = 0;
    RegionRef r;
    ASSERT_TRUE(kept ? region_cache_take(kPeer, kRing, 9, &r, &smap, &len)
                     : shm_region_place(kPeer, kRing, 9, &r, &smap, &len) == 0);
    Ends e;
    e.client_reused = !kept;
    ASSERT_NO_FATAL_FAILURE(connect_ends(r, smap, len, 9, kept, &e));
    EXPECT_EQ(e.client_reused, kept);
    auto& server = e.server;
    auto& client = e.client;
    void* cmap = e.cmap;
    const auto* s_rx = server->rx_ring();
    const auto* c_rx = client->rx_ring();
    EXPECT_EQ(protection_at(s_rx), "r--s");
    EXPECT_EQ(protection_at(c_rx), "r--s");
    // Each ring as its producer maps it.
    EXPECT_EQ(protection_at(static_cast<uint8_t*>(cmap) + (s_rx - static_cast<uint8_t*>(smap))),
              "rw-s");
    EXPECT_EQ(protection_at(static_cast<uint8_t*>(smap) + (c_rx - static_cast<uint8_t*>(cmap))),
              "rw-s");
    EXPECT_TRUE(client->drop_holder());
    client.reset();
    EXPECT_TRUE(server->drop_holder());
    server.reset();
    EXPECT_EQ(region_cache_size(), 2u);  // kept for the next round
  }
}

// The bytes of memory a file holds.
size_t allocated(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? static_cast<size_t>(st.st_blocks) * 512 : 0;
}

// A connection that filled both rings, then closed: the server keeps its
// region with only the first ShmChannel::kKeptWarmBytes of each ring, when
// the client's end closed first. When the server's closes first the client
// may still be reading: its pages stay.
TEST_F(RegionCache, AKeptRegionHoldsOnlyTheWarmStartOfEachRing) {
  for (const bool client_first : {true, false}) {
    SCOPED_TRACE(client_first ? "the client closes first" : "the server closes first");
    region_cache_drop_all();
    void* smap = nullptr;
    size_t len = 0;
    RegionRef r;
    ASSERT_EQ(shm_region_place(kPeer, kRing, 3, &r, &smap, &len), 0);
    const int memfd = arena_fd(r.arena);
    auto* h = static_cast<RegionHeader*>(smap);
    for (int dir : {kServerToClient, kClientToServer}) {
      memset(static_cast<uint8_t*>(smap) + h->ring_offset[dir], 0x5a, kRing);
      h->dir[dir].head.store(3 * kRing);  // went round the ring three times
    }
    Ends e;
    ASSERT_NO_FATAL_FAILURE(connect_ends(r, smap, len, 3, false, &e));
    auto& server = e.server;
    auto& client = e.client;
    EXPECT_GE(allocated(memfd), 2 * kRing);
    auto close_end = [](std::unique_ptr<ShmChannel>& ch) {
      EXPECT_TRUE(ch->drop_holder());
      ch.reset();
    };
    close_end(client_first ? client : server);
    close_end(client_first ? server : client);
    EXPECT_EQ(region_cache_size(), 2u);  // the file stays open in the cache
    if (client_first)
      EXPECT_LE(allocated(memfd), region_header_bytes() + 2 * ShmChannel::kKeptWarmBytes);
    else
      EXPECT_GE(allocated(memfd), 2 * kRing);
  }
}

}  // namespace
}  // namespace rsock
