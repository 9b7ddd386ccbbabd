// The run-time interface of include/rsock.h: what a program may ask the
// librsock preloaded into it (see that header and docs/api.md).
#include <errno.h>
#include <fcntl.h>

#include <algorithm>
#include <cstring>

#include "common/real.h"
#include "fdtable/fdtable.h"
#include "rsock.h"
#include "socket/pending.h"
#include "socket/socket.h"

#ifndef RSOCK_VERSION
#error "RSOCK_VERSION comes from the Makefile"
#endif

#define EXPORT extern "C" __attribute__((visibility("default")))

namespace rsock {
namespace {

void describe(ConnectionState& c, rsock_fd_info* out) {
  Stream& s = c.stream();
  out->tcp_bytes_sent = s.tcp_bytes_sent();
  out->tcp_bytes_received = s.tcp_bytes_received();
  if (c.prefix_only()) {  // the stream a pairing's connection uses meanwhile
    out->state = RSOCK_STATE_PAIRING;
    return;
  }
  out->state = RSOCK_STATE_ACCELERATED;
  out->transport = c.path() == Path::kRdma ? RSOCK_TRANSPORT_RDMA : RSOCK_TRANSPORT_SHM;
  out->bytes_sent = s.bytes_sent();
  out->bytes_received = s.bytes_received();
}

void describe(FdState* st, rsock_fd_info* out) {
  switch (st->kind()) {
    case FdState::Kind::kListener:
      out->state = RSOCK_STATE_LISTENER;
      return;
    case FdState::Kind::kConnection:
      describe(*static_cast<ConnectionState*>(st), out);
      return;
    case FdState::Kind::kPending: {
      auto* p = static_cast<PendingState*>(st);
      if (p->resolved()) {
        // Over: the outcome, or plain TCP.
        if (FdRef o = p->outcome(); o && o.get()->kind() == FdState::Kind::kConnection)
          describe(*o.as<ConnectionState>(), out);
        return;
      }
      if (p->live()) describe(*p->live(), out);
      out->state = RSOCK_STATE_PAIRING;
      return;
    }
    default:
      return;  // an epoll set, a descriptor of librsock's: plain to the program
  }
}

}  // namespace
}  // namespace rsock

EXPORT int rsock_describe_fd(int fd, rsock_fd_info* info) {
  using namespace rsock;
  constexpr uint32_t kMinSize = offsetof(rsock_fd_info, bytes_sent);
  if (!info || info->size < kMinSize) {
    errno = EINVAL;
    return -1;
  }
  if (real().fcntl(fd, F_GETFD) < 0) return -1;  // EBADF
  rsock_fd_info out = {};
  if (FdRef r = fd_table().get(fd)) describe(r.get(), &out);
  out.size = info->size;
  memcpy(info, &out, std::min<size_t>(info->size, sizeof out));
  return 0;
}

EXPORT const char* rsock_version(void) { return RSOCK_VERSION; }

EXPORT unsigned rsock_api_version(void) { return RSOCK_API_VERSION; }
