// The table of the real libc functions underneath librsock's wrappers,
// resolved with dlsym(RTLD_NEXT). Every internal call that must not come
// back into our own wrappers goes through real(). Resolution is lazy and
// idempotent so that a wrapper called before our constructor (another
// library's constructor, an inherited fd) still works. Thread-safety: racing
// first calls resolve the same pointers; stores are word-sized and benign.
#pragma once

#include <aio.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>

namespace rsock {

struct RealCalls {
#define RSOCK_REAL(ret, name, args) ret(*name) args;
#include "common/real_list.h"
#undef RSOCK_REAL
  bool resolved;
};

void resolve_real_calls();
extern RealCalls g_real;

inline const RealCalls& real() {
  if (__builtin_expect(!__atomic_load_n(&g_real.resolved, __ATOMIC_ACQUIRE), 0)) resolve_real_calls();
  return g_real;
}

}  // namespace rsock
