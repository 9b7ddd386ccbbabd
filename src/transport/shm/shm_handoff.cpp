// A shared-memory end across exec (transport/handoff.h): everything the new
// image needs besides the socket is in the region, so the entry names the
// file that holds the region (a non-close-on-exec dup of it, one per
// entry), the region's offset in it and its nonce.
//   S,<sdev>,<sino>,<memfd>,<mdev>,<mino>,<offset>,<role>,<nonce>,<armed_data>,<armed_space>
//       an end the new image holds; role s (server end) or c; the waiting
//       counts that threads of the old image left armed (exec kills them);
//   C,<memfd>,<mdev>,<mino>,<offset>,<role>,<nonce>
//       an end whose fds all close at this exec and whose last holder this
//       process was: the new image tells the peer it closed.
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/own_fd.h"
#include "common/real.h"
#include "ring/region.h"
#include "ring/ring.h"
#include "transport/handoff.h"
#include "transport/shm/shm_channel.h"

namespace rsock {
namespace {

constexpr uint32_t kUndoHolder = 1;  // the holder count changed for the exec

bool parse_role(const char* s, bool* is_server) {
  if ((s[0] != 's' && s[0] != 'c') || s[1] != '\0') return false;
  *is_server = s[0] == 's';
  return true;
}

// This process no longer holds an end it was counted for: drops it as a
// holder and, when it was the last, tells the peer (as close() would).
// Closes memfd.
void release_holder(int memfd, const char* offset_s, bool is_server, const char* nonce_s) {
  uint64_t nonce = 0, offset = 0;
  RegionHeader h;
  void* map = nullptr;
  if (parse_u64(nonce_s, 16, &nonce) && parse_u64(offset_s, 10, &offset) &&
      offset < (uint64_t{1} << 62) &&
      pread(memfd, &h, sizeof h, static_cast<off_t>(offset)) == static_cast<ssize_t>(sizeof h) &&
      is_power_of_two(h.ring_bytes) && h.ring_bytes >= 4096 && h.ring_bytes <= (size_t{1} << 28) &&
      shm_region_attach(memfd, offset, region_bytes_for(h.ring_bytes), nonce, h.ring_bytes, &map) ==
          0) {
    ShmChannel ch(ShmChannel::Resume{}, map, region_bytes_for(h.ring_bytes), is_server, -1, {});
    if (ch.drop_holder()) ch.signal(kSendClosed);
  }  // the channel unmaps the region
  real().close(memfd);
}

}  // namespace

void ShmChannel::exec_prepare(ExecKind kind, bool inherited, ExecSink& sink) {
  char fields[kExecFieldsCap];
  uint64_t mdev = 0, mino = 0;
  if (!inherited) {
    // Every fd of this connection closes at exec: this process stops
    // holding it. Another holder left: only the count changes (taken back
    // if the exec fails). We were the last: the new image says goodbye.
    if (kind != ExecKind::kReplace) return;
    if (drop_holder_unless_last()) {
      sink.undo_later(kUndoHolder);
      return;
    }
    const int dup = exec_dup(arena_fd_or_none(), &mdev, &mino);
    if (dup < 0) return;  // the peer learns of the close from the TCP connection
    snprintf(fields, sizeof fields, "%d,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%c,%" PRIx64, dup, mdev,
             mino, region_.offset, is_server_ ? 's' : 'c', nonce());
    if (sink.add('C', false, fields))
      sink.keep(dup);
    else
      real().close(dup);
    return;
  }
  const int dup = exec_dup(arena_fd_or_none(), &mdev, &mino);
  if (dup < 0) {
    (void)sink.add('L', true, "resources");
    return;
  }
  // Every byte read so far is reported consumed: the new image starts
  // reading exactly after it.
  sink.report_consumed();
  uint32_t armed_data = 0, armed_space = 0;
  if (kind == ExecKind::kReplace) local_armed(&armed_data, &armed_space);
  snprintf(fields, sizeof fields, "%d,%" PRIu64 ",%" PRIu64 ",%" PRIu64 ",%c,%" PRIx64 ",%u,%u",
           dup, mdev, mino, region_.offset, is_server_ ? 's' : 'c', nonce(), armed_data,
           armed_space);
  if (!sink.add('S', true, fields)) {
    real().close(dup);
    return;
  }
  sink.keep(dup);
  // The spawned child holds the connection from the moment it runs, which
  // may be before it takes it over (this process could close its own copy
  // meanwhile): count it now. It holds the file too: nothing new goes in it,
  // ours or (a new token) our server's.
  if (kind == ExecKind::kSpawn) {
    arena_stop_placing(region_.arena);
    region_process_token_renew();
    add_holder();
    sink.quiesce();
    sink.undo_later(kUndoHolder);
  }
}

void ShmChannel::exec_undo(ExecKind kind, uint32_t token) {
  if (!(token & kUndoHolder)) return;
  // The exec failed: this image still holds what it let go. The spawn
  // failed: no child holds what it was counted for.
  if (kind == ExecKind::kReplace)
    add_holder();
  else
    (void)drop_holder_unless_last();
}

void shm_exec_adopt(char** f, const std::vector<int>& fds, bool spawned, Adoption* out) {
  // f: S,sdev,sino,memfd,mdev,mino,offset,role,nonce,armed_data,armed_space
  out->path = Path::kShm;
  int memfd = owned_memfd(f[3], f[4], f[5]);
  uint64_t offset = 0, nonce = 0, armed_data = 0, armed_space = 0;
  bool is_server = false;
  const bool role_ok = parse_role(f[7], &is_server);
  if (fds.empty()) {
    // The socket did not reach this image (posix_spawn file actions closed
    // it, or exec raced a close): this process does not hold it.
    if (memfd >= 0) release_holder(memfd, f[6], is_server, f[8]);
    return;
  }
  if (memfd < 0 || !role_ok || !parse_u64(f[6], 10, &offset) || !parse_u64(f[8], 16, &nonce) ||
      !parse_u64(f[9], 10, &armed_data) || !parse_u64(f[10], 10, &armed_space) ||
      armed_data > UINT32_MAX || armed_space > UINT32_MAX) {
    if (memfd >= 0) real().close(memfd);
    out->lost = "its hand-off entry is invalid";
    return;
  }
  void* map = nullptr;
  size_t map_len = 0;
  int rc = shm_region_validate(memfd, offset, fds[0], is_server, nonce, &map, &map_len);
  int doorbell = rc == 0 ? dup_high(fds[0]) : -1;
  if (rc != 0 || doorbell < 0) {
    if (map) munmap(map, map_len);
    real().close(memfd);
    out->lost = rc != 0 ? "its shared region failed validation" : "no fd for the doorbell";
    return;
  }
  real().fcntl(memfd, F_SETFD, FD_CLOEXEC);
  // One descriptor per file here too: the entries of other regions in it
  // brought dups of their own, closed as each is adopted.
  const RegionRef region = arena_adopt(memfd, offset);
  auto ch =
      std::make_unique<ShmChannel>(ShmChannel::Resume{}, map, map_len, is_server, doorbell, region);
  const ShmPositions pos = ch->positions();
  // A spawned child was counted as a holder by its parent; an exec'd image
  // inherits its old image's count, and the waiters its threads left.
  if (!spawned)
    ch->forget_waiters(static_cast<uint32_t>(armed_data), static_cast<uint32_t>(armed_space));
  out->channel = std::move(ch);
  out->resume = true;
  out->at = {pos.tx_head, pos.tx_credited, pos.rx_granted, pos.fin_sent};
  out->counted = true;
  out->how = "accelerated connection (shm) taken over after exec";
}

void shm_exec_goodbye(char** f, const std::vector<int>&, bool, Adoption* out) {
  // f: C,memfd,mdev,mino,offset,role,nonce
  out->path = Path::kShm;
  int memfd = owned_memfd(f[1], f[2], f[3]);
  if (memfd < 0) return;
  bool is_server = false;
  if (!parse_role(f[5], &is_server)) {
    real().close(memfd);
    return;
  }
  release_holder(memfd, f[4], is_server, f[6]);
}

}  // namespace rsock
