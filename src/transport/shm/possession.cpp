// Proof of possession of a TCP connection's end (see possession.h).
#include "transport/shm/possession.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/real.h"
#include "transport/addr.h"

namespace rsock {
namespace {

// The reply to one exact-match query: an inet_diag_msg (plus attributes we
// do not ask for), or an NLMSG_ERROR.
constexpr int kDiagReplyTimeoutMs = 1000;

}  // namespace

int peer_socket_of(int tcp_fd, PeerSocket* out) {
  WireAddr local, peer;
  if (!fd_addrs(tcp_fd, &local, &peer)) return -ENOTCONN;
  return peer_socket_of(local, peer, out);
}

int peer_socket_of(const WireAddr& local, const WireAddr& peer, PeerSocket* out) {
  struct {
    nlmsghdr nlh;
    inet_diag_req_v2 req;
  } msg = {};
  msg.nlh.nlmsg_len = sizeof msg;
  msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  msg.nlh.nlmsg_flags = NLM_F_REQUEST;
  inet_diag_req_v2& r = msg.req;
  r.sdiag_protocol = IPPROTO_TCP;
  r.idiag_states = ~0u;
  // The peer socket's own view: its local end is our peer, its remote end
  // is us. Both ends of a v4 connection are looked up as AF_INET, also when
  // either side is a dual-stack v6 socket (the kernel hashes them by their
  // v4 addresses).
  r.id.idiag_sport = htons(peer.port);
  r.id.idiag_dport = htons(local.port);
  r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  if (is_mapped_v4(peer.addr) && is_mapped_v4(local.addr)) {
    r.sdiag_family = AF_INET;
    memcpy(&r.id.idiag_src[0], peer.addr + 12, 4);
    memcpy(&r.id.idiag_dst[0], local.addr + 12, 4);
  } else {
    r.sdiag_family = AF_INET6;
    memcpy(r.id.idiag_src, peer.addr, 16);
    memcpy(r.id.idiag_dst, local.addr, 16);
  }

  // Closed before we return: not worth lifting (own_fd.h).
  int nl = real().socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (nl < 0) return -errno;
  sockaddr_nl kernel = {};
  kernel.nl_family = AF_NETLINK;
  int rc = -EPROTO;
  alignas(nlmsghdr) char buf[1024];
  if (real().sendto(nl, &msg, sizeof msg, 0, reinterpret_cast<sockaddr*>(&kernel),
                    sizeof kernel) != static_cast<ssize_t>(sizeof msg)) {
    rc = -errno;
  } else {
    // The kernel answers within sendto(): the reply is there already.
    ssize_t n = real().recv(nl, buf, sizeof buf, MSG_DONTWAIT);
    pollfd p = {nl, POLLIN, 0};
    if (n < 0 && errno == EAGAIN && real().poll(&p, 1, kDiagReplyTimeoutMs) == 1)
      n = real().recv(nl, buf, sizeof buf, MSG_DONTWAIT);
    const auto* h = reinterpret_cast<const nlmsghdr*>(buf);
    if (n < 0) {
      rc = -ETIMEDOUT;
    } else if (!NLMSG_OK(h, static_cast<size_t>(n))) {
      rc = -EPROTO;
    } else if (h->nlmsg_type == NLMSG_ERROR) {
      const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      rc = h->nlmsg_len >= NLMSG_LENGTH(sizeof *e) && e->error < 0 ? e->error : -EPROTO;
    } else if (h->nlmsg_type == SOCK_DIAG_BY_FAMILY &&
               h->nlmsg_len >= NLMSG_LENGTH(sizeof(inet_diag_msg))) {
      const auto* m = static_cast<const inet_diag_msg*>(NLMSG_DATA(h));
      out->inode = m->idiag_inode;
      out->uid = m->idiag_uid;
      rc = out->inode != 0 ? 0 : -ENOENT;
    }
  }
  real().close(nl);
  return rc;
}

int possession_proof(int tcp_fd) {
  char path[40];
  snprintf(path, sizeof path, "/proc/self/fd/%d", tcp_fd);
  // Lives for one sendmsg: not worth lifting (own_fd.h).
  int fd = ::open(path, O_PATH | O_CLOEXEC);
  return fd >= 0 ? fd : -errno;
}

bool proof_names(int proof_fd, uint64_t inode, int tcp_fd) {
  struct stat proof, ours;
  return proof_fd >= 0 && fstat(proof_fd, &proof) == 0 && fstat(tcp_fd, &ours) == 0 &&
         S_ISSOCK(proof.st_mode) && proof.st_dev == ours.st_dev && proof.st_ino == inode &&
         inode != 0;
}

}  // namespace rsock
