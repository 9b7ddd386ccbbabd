// Exec hand-off: an accelerated connection whose fd survives exec (not
// close-on-exec) keeps working in the new program image. Just before the
// real exec, exec_prepare() makes a non-close-on-exec dup of each such
// shared-memory connection's region memfd, reports every byte read so far
// as consumed (so that the region says exactly where each direction
// stands), and describes the connections in the variable RSOCK_EXEC_HANDOFF
// of the new image's environment. The new image's init (exec_adopt) removes
// the variable, treats it as hostile input, checks each connection (the fd
// is still the same socket, the memfd is sealed and sized, magic, nonce,
// and the region records this very socket's 4-tuple), maps the region and
// attaches a ConnectionState that continues from the region's positions.
// An RDMA connection's queue pair cannot cross exec: the old image hands the
// end over (its shared memory, verbs_end.h) and the new one takes it over
// with a queue pair of its own on first use, as a fork's child does. What
// each transport writes and takes over is its own (transport/handoff.h);
// this file names none.
// Whatever cannot be taken over (a region that fails validation) becomes a
// lost connection: every call on its fd fails (ECONNRESET) and one log line
// says why.
// docs/design.md, "exec", explains the choices; docs/protocol.md section 8
// the variable's format. Thread-safety: exec_prepare/exec_release run in
// the thread that execs (or spawns); exec_adopt once, from init.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/handoff.h"

namespace rsock {

inline constexpr char kHandoffVar[] = "RSOCK_EXEC_HANDOFF";

// What exec_prepare set up; exec_release undoes it. No heap memory: exec
// may be called in a vfork child.
struct ExecHandoff {
  ExecKind kind = ExecKind::kReplace;
  char* const* envp = nullptr;  // what to pass to the real exec
  void* mem = nullptr;          // mmap'd storage for envp, the variable and the lists below
  size_t mem_len = 0;
  int* dups = nullptr;  // descriptors made for the new image
  int ndups = 0;
  // What the ends asked to undo should the exec or spawn fail
  // (Channel::exec_undo): holder counts, an RDMA end handed over.
  struct Undo {
    Channel* channel;
    uint32_t token;
  };
  Undo* undo = nullptr;
  int nundo = 0;
};

// Before the real exec (or posix_spawn): fills h; h->envp is envp itself
// when there is nothing to hand over. Never fails: a connection it cannot
// describe is handed over as lost.
void exec_prepare(char* const envp[], ExecKind kind, ExecHandoff* h);
// After the real call returned: for kReplace the exec failed and this
// image goes on; for kSpawn the child has exec'd (started) or not. Undoes
// the holder counts of a failed call, closes the dups, frees the storage.
// errno is preserved.
void exec_release(ExecHandoff* h, bool started);

// In the new image, once, before anything uses the inherited fds: removes
// RSOCK_EXEC_HANDOFF from the environment and attaches what validates.
// Returns the number of fds that now carry librsock state.
int exec_adopt();

}  // namespace rsock
