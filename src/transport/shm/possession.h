// Proof of possession for same-host pairing (docs/security.md): how a
// process shows that it holds one end of a TCP connection without handing
// that end over. The proof is an O_PATH descriptor of the socket, passed
// with SCM_RIGHTS: it names the socket (fstat gives its inode) but grants
// nothing (no I/O, no socket options, and a socket cannot be reopened
// through /proc). The verifier looks up, with NETLINK_SOCK_DIAG, which
// socket is at the other end of its own connection (the 4-tuple reversed;
// unique in the network namespace) and compares inodes. Only the process
// that holds that socket can open such a descriptor; a process that merely
// knows the addresses cannot.
// Thread-safety: every function works on caller-owned fds only.
#pragma once

#include <cstdint>

#include "ring/wire.h"

namespace rsock {

// The socket at the other end of tcp_fd's connection, when it lives in this
// host's network namespace: its inode and the effective uid that created it
// (as `ss -e` shows them to every user).
struct PeerSocket {
  uint64_t inode = 0;
  uint32_t uid = 0;
};

// Looks up the peer end of tcp_fd. Returns 0, -ENOENT when no such socket
// exists here (another host, or it is gone), or another negative errno.
int peer_socket_of(int tcp_fd, PeerSocket* out);
// The same, for a connection whose addresses the caller has (fd_addrs).
int peer_socket_of(const WireAddr& local, const WireAddr& peer, PeerSocket* out);

// A proof of holding tcp_fd: an O_PATH, close-on-exec descriptor of it.
// Returns the descriptor or a negative errno (e.g. /proc not mounted).
int possession_proof(int tcp_fd);

// True when proof_fd is a proof of the socket with this inode: a socket
// inode on the same (socket) filesystem as our own tcp_fd.
bool proof_names(int proof_fd, uint64_t inode, int tcp_fd);

}  // namespace rsock
