// An RDMA end across exec (transport/handoff.h). Its queue pair cannot
// cross exec: the old image hands the end over (its shared memory,
// verbs_end.h) and the new one takes it over with a queue pair of its own
// on first use (VerbsChannel::adopt), as a fork's child does.
//   R,<sdev>,<sino>,<memfd>,<mdev>,<mino>,<nonce>
//       the socket, a non-close-on-exec dup of the end's memfd (its fd,
//       device and inode) and the end's nonce in hex.
#include <inttypes.h>
#include <stdio.h>

#include "common/real.h"
#include "transport/handoff.h"
#include "transport/verbs/verbs_channel.h"
#include "transport/verbs/verbs_end.h"

namespace rsock {
namespace {

constexpr uint32_t kUndoHandOver = 1;  // this image handed the end over
constexpr uint32_t kUndoHolder = 2;    // the holder count changed for the exec

}  // namespace

void VerbsChannel::exec_prepare(ExecKind kind, bool inherited, ExecSink& sink) {
  // The queue pair stays with this process (spawn) or dies with this image
  // (exec), which first hands the end over.
  if (kind == ExecKind::kReplace) {
    prepare_exec();
    sink.undo_later(kUndoHandOver);
  }
  if (!inherited) {
    // Its fds close at exec: this process stops holding it (the peer
    // learns of the close from the kernel socket).
    if (kind == ExecKind::kReplace) {
      undo_add_holder();
      sink.undo_later(kUndoHolder);
    }
    return;
  }
  uint64_t mdev = 0, mino = 0;
  const int dup = exec_dup(memfd(), &mdev, &mino);
  if (dup < 0) {
    (void)sink.add('L', true, "resources");
    return;
  }
  char fields[kExecFieldsCap];
  snprintf(fields, sizeof fields, "%d,%" PRIu64 ",%" PRIu64 ",%" PRIx64, dup, mdev, mino, nonce());
  if (!sink.add('R', true, fields)) {
    real().close(dup);
    return;
  }
  sink.keep(dup);
  // The spawned child holds the end from the moment it runs.
  if (kind == ExecKind::kSpawn) {
    add_holder();
    sink.undo_later(kUndoHolder);
  }
}

void VerbsChannel::exec_undo(ExecKind kind, uint32_t token) {
  // This image takes back what it handed over (on its next use, with a
  // queue pair of its own), and the holder count goes back.
  if (token & kUndoHandOver) exec_failed();
  if (token & kUndoHolder) {
    if (kind == ExecKind::kReplace)
      add_holder();
    else
      undo_add_holder();
  }
}

void verbs_exec_adopt(char** f, const std::vector<int>& fds, bool spawned, Adoption* out) {
  // f: R,sdev,sino,memfd,mdev,mino,nonce
  out->path = Path::kRdma;
  const int memfd = owned_memfd(f[3], f[4], f[5]);
  uint64_t nonce = 0;
  if (fds.empty()) {
    // The socket did not reach this image: the parent counted a holder
    // that never was.
    if (memfd >= 0 && spawned && parse_u64(f[6], 16, &nonce)) verbs_end_drop_holder(memfd, nonce);
    if (memfd >= 0) real().close(memfd);
    return;
  }
  VerbsEnd end;
  if (memfd < 0 || !parse_u64(f[6], 16, &nonce) ||
      VerbsEnd::validate(memfd, fds[0], nonce, &end) != 0) {
    if (memfd >= 0) real().close(memfd);
    out->lost = "its RDMA end failed validation";
    return;
  }
  int err = 0;
  out->channel = VerbsChannel::adopt(std::move(end), fds[0], &err);
  if (!out->channel) {
    out->lost = "no descriptors to take its RDMA end over";
    return;
  }
  out->how = "RDMA connection inherited through exec: taken over on first use";
}

}  // namespace rsock
