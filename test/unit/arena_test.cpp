// Unit tests for src/transport/shm/arena: the regions of one peer process
// share one file, sealed against shrinking only; an attaching side holds
// each file once; a place given up serves again only once the peer's end is
// done, with its pages given back; after a fork nothing new goes in a file
// both processes hold; an offered place outside the file is refused.
#include "transport/shm/arena.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <vector>

#include "ring/region.h"
#include "ring/wire.h"
#include "transport/shm/region_cache.h"
#include "transport/shm/shm_channel.h"

namespace rsock {
namespace {

constexpr size_t kRing = 1 << 14;
const RegionPeer kPeer = {4343, 0xfeedfacecafef00dull};

struct Placed {
  RegionRef ref;
  void* map = nullptr;
  size_t len = 0;
};

Placed place(const RegionPeer& peer, uint64_t nonce = 1) {
  Placed p;
  EXPECT_EQ(shm_region_place(peer, kRing, nonce, &p.ref, &p.map, &p.len), 0);
  return p;
}

void give_up(const Placed& p, bool reusable) {
  arena_release(p.ref, p.len, reusable ? p.map : nullptr, reusable);
  munmap(p.map, p.len);
}

bool is_open(int fd) { return fcntl(fd, F_GETFD) >= 0; }

size_t allocated(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? static_cast<size_t>(st.st_blocks) * 512 : 0;
}

class ArenaTest : public ::testing::Test {
 protected:
  void SetUp() override { region_cache_drop_all(); }
  void TearDown() override { EXPECT_EQ(arena_count(), 0u) << "a test left a file open"; }
};

TEST_F(ArenaTest, OneFileHoldsTheRegionsOfOnePeerProcess) {
  const Placed a = place(kPeer), b = place(kPeer);
  ASSERT_NE(a.ref.arena, nullptr);
  EXPECT_EQ(a.ref.arena, b.ref.arena);
  EXPECT_EQ(a.ref.offset % kPageBytes, 0u);
  EXPECT_EQ(b.ref.offset % kPageBytes, 0u);
  EXPECT_GE(a.ref.offset > b.ref.offset ? a.ref.offset - b.ref.offset : b.ref.offset - a.ref.offset,
            a.len);  // apart
  // Each mapping sees its own region.
  EXPECT_EQ(region_header_check(a.map, a.len, a.len, 1, kRing), 0);
  static_cast<RegionHeader*>(a.map)->dir[0].head.store(5);
  EXPECT_EQ(static_cast<RegionHeader*>(b.map)->dir[0].head.load(), 0u);
  // Another process (pid or token) has a file of its own; a peer without
  // a token, one per region.
  const Placed c = place({kPeer.pid + 1, kPeer.token});
  const Placed d = place({kPeer.pid, kPeer.token + 1});
  const Placed e = place({kPeer.pid, 0}), f = place({kPeer.pid, 0});
  EXPECT_NE(c.ref.arena, a.ref.arena);
  EXPECT_NE(d.ref.arena, a.ref.arena);
  EXPECT_NE(d.ref.arena, c.ref.arena);
  EXPECT_NE(e.ref.arena, f.ref.arena);
  EXPECT_EQ(arena_count(), 5u);
  for (const Placed* p : {&a, &b, &c, &d, &e, &f}) give_up(*p, false);
}

TEST_F(ArenaTest, TheFileIsSealedAgainstShrinkingOnly) {
  const Placed a = place(kPeer);
  const int fd = arena_fd(a.ref.arena);
  const int seals = fcntl(fd, F_GET_SEALS);
  EXPECT_TRUE(seals & F_SEAL_SHRINK);
  EXPECT_TRUE(seals & F_SEAL_SEAL);  // nobody adds a seal (growth) either
  EXPECT_FALSE(seals & F_SEAL_GROW);
  EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_NE(ftruncate(fd, st.st_size - static_cast<off_t>(kPageBytes)), 0);
  // A peer may grow it (its right): the next place lies past its end.
  ASSERT_EQ(ftruncate(fd, st.st_size + 3 * static_cast<off_t>(kPageBytes) + 100), 0);
  const Placed b = place(kPeer);
  EXPECT_EQ(b.ref.arena, a.ref.arena);
  EXPECT_GE(b.ref.offset, static_cast<uint64_t>(st.st_size) + 3 * kPageBytes + 100);
  EXPECT_EQ(b.ref.offset % kPageBytes, 0u);
  give_up(a, false);
  give_up(b, false);
}

TEST_F(ArenaTest, AnAttachingSideHoldsEachFileOnce) {
  const Placed a = place(kPeer);
  const int fd = arena_fd(a.ref.arena);
  // Two offers bring the same file in two descriptors.
  const int first = fcntl(fd, F_DUPFD_CLOEXEC, 0), second = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  const RegionRef r1 = arena_adopt(first, a.ref.offset);
  const RegionRef r2 = arena_adopt(second, 4096);
  // (the creator's own file, in this process: held once for both sides)
  EXPECT_EQ(r1.arena, a.ref.arena);
  EXPECT_EQ(r2.arena, a.ref.arena);
  EXPECT_EQ(r2.offset, 4096u);
  EXPECT_FALSE(is_open(first));
  EXPECT_FALSE(is_open(second));
  EXPECT_EQ(arena_count(), 1u);
  give_up(a, false);
  EXPECT_TRUE(is_open(fd));  // the attaching side's regions still hold it
  arena_release(r1, a.len, nullptr, false);
  arena_release(r2, a.len, nullptr, false);
  EXPECT_FALSE(is_open(fd));
  // A file this process did not make, offered twice: the first descriptor
  // stays, the second goes.
  int other = memfd_create("rsock-test", MFD_CLOEXEC);
  ASSERT_GE(other, 0);
  const int again = fcntl(other, F_DUPFD_CLOEXEC, 0);
  const RegionRef o1 = arena_adopt(other, 0), o2 = arena_adopt(again, 0);
  EXPECT_EQ(o1.arena, o2.arena);
  EXPECT_EQ(arena_fd(o1.arena), other);
  EXPECT_TRUE(is_open(other));
  EXPECT_FALSE(is_open(again));
  arena_release(o1, 0, nullptr, false);
  EXPECT_TRUE(is_open(other));
  arena_release(o2, 0, nullptr, false);
  EXPECT_FALSE(is_open(other));
  // Not a regular file: nothing held, the descriptor closed.
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  EXPECT_EQ(arena_adopt(pipefd[0], 0).arena, nullptr);
  EXPECT_FALSE(is_open(pipefd[0]));
  close(pipefd[1]);
}

TEST_F(ArenaTest, APlaceServesAgainOnlyOnceThePeerIsDone) {
  const Placed keep = place(kPeer);  // holds the file open throughout
  const Placed a = place(kPeer);
  auto* h = static_cast<RegionHeader*>(a.map);
  memset(static_cast<uint8_t*>(a.map) + region_header_bytes(), 0x5a, 2 * kRing);
  const int fd = arena_fd(a.ref.arena);
  const size_t before = allocated(fd);
  // Given up while the peer's end still holds it: a new place for the next.
  arena_release(a.ref, a.len, a.map, true);
  const Placed b = place(kPeer);
  EXPECT_NE(b.ref.offset, a.ref.offset);
  // The peer's end says it is done (this mapping stands for the peer's):
  // the place serves the next region, its pages given back.
  h->released[1].store(1);
  munmap(a.map, a.len);
  const Placed c = place(kPeer);
  EXPECT_EQ(c.ref.offset, a.ref.offset);
  EXPECT_LE(allocated(fd) + 2 * kRing, before + region_header_bytes());  // (b's header)
  const uint8_t* ring = static_cast<const uint8_t*>(c.map) + region_header_bytes();
  EXPECT_EQ(ring[0], 0);
  EXPECT_EQ(ring[2 * kRing - 1], 0);
  EXPECT_EQ(region_header_check(c.map, c.len, c.len, 1, kRing), 0);
  // Given up when the peer was done already: its pages go at once.
  static_cast<RegionHeader*>(c.map)->released[1].store(1);
  memset(static_cast<uint8_t*>(c.map) + region_header_bytes(), 0x5a, 2 * kRing);
  const size_t full = allocated(fd);
  give_up(c, true);
  EXPECT_LE(allocated(fd) + 2 * kRing, full);
  // Not reusable (another process may hold the end): never again.
  const Placed d = place(kPeer);
  EXPECT_EQ(d.ref.offset, a.ref.offset);
  static_cast<RegionHeader*>(d.map)->released[1].store(1);
  give_up(d, false);
  const Placed e = place(kPeer);
  EXPECT_NE(e.ref.offset, a.ref.offset);
  for (const Placed* p : {&keep, &b, &e}) give_up(*p, false);
}

// A peer that keeps one connection open and never says it is done with
// the others: past 64 places held for it, the file takes no more regions
// (it goes, with those pages, when its last region does).
TEST_F(ArenaTest, AFileTakesNoMoreRegionsPastItsBoundOfHeldPlaces) {
  const Placed keep = place(kPeer);
  std::vector<Placed> given(65);
  for (Placed& p : given) p = place(kPeer);
  for (int i = 0; i < 64; ++i) give_up(given[i], true);  // the peer's end not done
  const Placed still = place(kPeer);
  EXPECT_EQ(still.ref.arena, keep.ref.arena);
  give_up(given[64], true);
  const Placed next = place(kPeer);
  EXPECT_NE(next.ref.arena, keep.ref.arena);
  for (const Placed* p : {&keep, &still, &next}) give_up(*p, false);
}

TEST_F(ArenaTest, AfterAForkNothingNewGoesInTheSharedFile) {
  const Placed a = place(kPeer);
  // A region kept for the next connection with kPeer, its peer end done.
  const Placed kept = place(kPeer);
  static_cast<RegionHeader*>(kept.map)->released[1].store(1);
  region_cache_keep(kPeer, kept.ref, kept.map, kept.len);
  arena_fork_prepare();
  const pid_t pid = fork();
  if (pid == 0) {
    arena_after_fork_child();
    Placed b;
    const bool ok = shm_region_place(kPeer, kRing, 2, &b.ref, &b.map, &b.len) == 0 &&
                    b.ref.arena != a.ref.arena && b.ref.offset == 0;
    _exit(ok ? 0 : 1);
  }
  arena_after_fork_parent();
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const Placed c = place(kPeer);
  EXPECT_NE(c.ref.arena, a.ref.arena);
  EXPECT_EQ(arena_count(), 2u);
  // Nor does the kept region serve again: it lies in the shared file.
  RegionRef g;
  void* map = nullptr;
  size_t len = 0;
  EXPECT_FALSE(region_cache_take(kPeer, kRing, 3, &g, &map, &len));
  region_cache_drop_all();
  give_up(a, true);
  give_up(c, false);
}

// A program's RLIMIT_FSIZE bounds a file it writes, memfds too: past it
// ftruncate raises SIGXFSZ, which ends the program. A full file's regions
// stay; the next region goes into a new file. (In a child: the limit is
// the whole process's.)
TEST_F(ArenaTest, AFileStopsGrowingAtTheProgramsFileSizeLimit) {
  const pid_t pid = fork();
  if (pid == 0) {
    const size_t len = region_bytes_for(kRing);
    rlimit lim = {static_cast<rlim_t>(2 * len + len / 2), RLIM_INFINITY};
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(2);
    Placed p[3];
    for (Placed& x : p)
      if (shm_region_place(kPeer, kRing, 1, &x.ref, &x.map, &x.len) != 0) _exit(3);
    const bool two_then_new = p[0].ref.arena == p[1].ref.arena && p[1].ref.offset == len &&
                              p[2].ref.arena != p[0].ref.arena && p[2].ref.offset == 0;
    // One more than the limit allows on its own: refused, nothing raised.
    lim.rlim_cur = len / 2;
    Placed big;
    const bool refused = setrlimit(RLIMIT_FSIZE, &lim) == 0 &&
                         shm_region_place(kPeer, kRing, 1, &big.ref, &big.map, &big.len) == -EFBIG;
    _exit(two_then_new && refused ? 0 : 1);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST_F(ArenaTest, AnOfferedPlaceOutsideTheFileIsRefused) {
  const Placed a = place(kPeer);
  const int fd = arena_fd(a.ref.arena);
  void* map = nullptr;
  ASSERT_EQ(shm_region_attach(fd, a.ref.offset, a.len, 1, kRing, &map), 0);
  munmap(map, a.len);
  map = nullptr;
  EXPECT_EQ(shm_region_attach(fd, a.ref.offset + kPageBytes, a.len, 1, kRing, &map), -EPROTO);
  EXPECT_EQ(shm_region_attach(fd, a.ref.offset + 512, a.len, 1, kRing, &map), -EPROTO);
  EXPECT_EQ(shm_region_attach(fd, ~uint64_t{0} & ~uint64_t{kPageBytes - 1}, a.len, 1, kRing, &map),
            -EPROTO);
  EXPECT_EQ(map, nullptr);
  give_up(a, false);
}

}  // namespace
}  // namespace rsock
