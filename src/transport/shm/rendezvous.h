// Same-host discovery and pairing (docs/protocol.md, "Same-host setup").
// Discovery is out of band, through abstract AF_UNIX names that exist only
// in this network namespace and vanish with their process:
//   rsock/L/<addr>/<port>        a librsock server listens on addr:port
//                                (addr "*" for a wildcard listen)
//   rsock/C/<addr>/<port>/<src>  a librsock client connecting from local
//                                port src to addr:port waits for its server
// The accepting process connects to the client's name, so the process that
// accepts a stream is always the one that pairs (listen-then-fork servers).
// Anyone can connect to an abstract name, so nothing moves before proof:
// each side shows that it holds its end of the TCP connection
// (possession.h) before the other sends anything that matters, and the
// server checks that the name's owner is the connection's owner before it
// waits on it (docs/security.md). No byte ever goes on the TCP connection.
// Thread-safety: all functions work on caller-owned fds; the negative cache
// is internally locked; a Pairing is used by one thread at a time.
#pragma once

#include <sys/socket.h>

#include <memory>

#include "config/config.h"
#include "stats/stats.h"
#include "transport/channel.h"
#include "transport/pairing.h"

namespace rsock {

// Server: advertises a listening socket. Returns the marker fd (close-on-
// exec; closing it withdraws the advertisement) or a negative errno.
int shm_advertise_listener(int listen_fd);

// Client: true when dst is an address of this host (loopback or one of its
// interfaces).
bool is_local_address(const sockaddr* dst);
// Client: true when a librsock server advertises dst in this namespace.
bool shm_server_advertised(const sockaddr* dst);

// Client: before the real connect(); binds the socket to an ephemeral port
// if it is unbound and opens the rendezvous. Returns the rendezvous fd or a
// negative errno: -EADDRINUSE when another process holds the name
// (Fallback::kRendezvousTaken).
int shm_client_prepare(int tcp_fd, const sockaddr* dst);
// Client: after the real connect() succeeded: waits for the server at the
// rendezvous (taken over and closed by the pairing). Falls back with
// kPairTimeout when no proven server came in time.
std::unique_ptr<Pairing> shm_client_pairing(int tcp_fd, int rendezvous_fd, const Config& cfg);

// Server: after the real accept(). Falls back with kPeerNotAccelerated when
// the client has no rendezvous (a plain client), kPeerUnproven when the
// rendezvous is not the client's.
std::unique_ptr<Pairing> shm_server_pairing(int tcp_fd, const Config& cfg);

// Negative cache of peers whose handshake failed: later connections to them
// go straight to TCP for a while (DESIGN.md invariant 4).
bool negative_cache_hit(const sockaddr* dst);
void negative_cache_add(const sockaddr* dst);

}  // namespace rsock
