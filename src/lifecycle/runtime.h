// Runtime: the process-wide state of librsock, built once on first use (our
// constructor, or the first wrapper that runs before it): the parsed Config,
// the program name, and the stats sink. Also owns the fork and exit hooks
// (exec: lifecycle/exec_handoff.h).
// Thread-safety: init is once-only and recursion-safe (a call made while
// initialising, e.g. through dlsym or getifaddrs, sees "not active" and goes
// straight to libc); afterwards the Runtime is immutable.
#pragma once

#include <vector>

#include "config/config.h"
#include "fdtable/fdtable.h"

namespace rsock {

struct Runtime {
  Config config;
  char program[128] = {};
  bool accelerate = false;  // some rule may match: connect/listen need a look
  bool stats = false;       // RSOCK_STATS set: count every TCP connection
};

// The runtime, or nullptr when librsock is disabled or still initialising.
const Runtime* runtime();

// Writes the stats line now (exit, _exit). At exec, only a process that
// made or accepted connections writes one: a forked child about to exec
// has nothing to report, and its new image writes its own line.
enum class FlushAt { kExit, kExec };
void flush_stats(FlushAt when = FlushAt::kExit);

// At exit (our destructor, _exit): every connection the program left open
// is released as close() would release it (Stream::release_at_exit): the
// holder is dropped once, the last holder tells the peer. An RDMA end then
// delivers what it has posted (bounded) and, when other processes hold it,
// lets one of them take it over (Channel::at_exit). Then the exit waits,
// bounded, for peers still reading what the process wrote on TCP before
// its connections switched (transports_at_exit). Not in a vfork child,
// whose connections are its parent's. Once per process.
void release_at_exit();

// Each open connection once (dup'd fds share one state), through a
// reference: the application's other threads run on, and may close one or
// see it handed over meanwhile.
std::vector<FdRef> connection_refs();

// Children this process has made that may hold its sockets: fork(),
// posix_spawn and the exec of a vfork child (the hand-off counts the last
// two; a spawn by libc itself, as system() does, is not seen). A socket
// made before the latest of them may be held elsewhere too.
uint64_t children_made();
void count_child();

// True in the child of vfork() (or of a clone sharing our memory) before it
// execs: it sees this process's state, but it is another process.
bool in_vfork_child();

}  // namespace rsock
