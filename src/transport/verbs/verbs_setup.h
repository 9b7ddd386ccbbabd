// Cross-host discovery and pairing over rdma_cm (docs/protocol.md, "Verbs
// transport"). The kernel TCP connection is made first and stays the
// application's fd; then the client opens an RC connection with rdma_cm
// (RDMA_PS_TCP, so also right for iWARP) to the same IP:port, naming the TCP
// 4-tuple in its private data, and the server matches the request to the
// TCP connection it accepted. The process that accepts the TCP stream owns
// the queue pair. All calls are synchronous and bounded by
// Config::connect_timeout_ms. No rdma-core type appears here.
// Thread-safety: a VerbsListener may be used by several accepting threads at
// once (internally locked); everything else works on caller-owned fds.
#pragma once

#include <memory>

#include "config/config.h"
#include "stats/stats.h"
#include "transport/channel.h"

namespace rsock {

class VerbsListener;

// True when this host has at least one RDMA device (cached after the first
// call). Cheap enough for every connect.
bool verbs_available();

// Server: an rdma_cm listener on the same local IP:port as the kernel TCP
// listener tcp_listen_fd (the two coexist: rdma_cm has its own port space).
// Returns nullptr with *why = kNotSameHost when there is no RDMA device or
// address, kResources on another failure.
VerbsListener* verbs_listen(int tcp_listen_fd, Fallback* why);
// Rejects the pending requests and closes the listener.
void verbs_listener_close(VerbsListener* listener);
// In a child after fork(): the inherited listener is unusable here (the
// kernel refuses rdma_cm commands on a descriptor from another process,
// EACCES) but still serves the parent. From now on this process neither
// reads it nor destroys it; verbs_listener_usable() says false.
void verbs_listener_forked_child(VerbsListener* listener);
bool verbs_listener_usable(const VerbsListener* listener);

// Client: after the kernel TCP connect of tcp_fd succeeded. Returns the
// channel (the connection is established on both ends: commit point) or
// nullptr with *why:
//   kNotSameHost         no RDMA device here or no RDMA route to the peer
//   kPeerNotAccelerated  no rdma_cm listener at the peer (REJECTED as "no
//                        matching listener", after a few quick retries)
//   kPairTimeout         nothing conclusive within the timeout
//   kPairFailed          the server declined, or a protocol mismatch
//   kResources           registration or queue creation failed (memlock)
// After kPairTimeout the server may have committed, if our connection
// completed at the very moment we gave up: then it sees the disconnect at
// once and fails its stream (never silent divergence).
std::unique_ptr<Channel> verbs_client_pair(int tcp_fd, const Config& cfg, Fallback* why);

// Server: after the kernel accept() of tcp_fd on the listener's TCP socket.
// Waits (bounded) for the connect request naming this TCP connection;
// requests for other connections that arrive meanwhile are kept for their
// own accept (and expire). Returns the channel or nullptr with *why:
//   kPeerNotAccelerated  no request came for this connection in time (a
//                        plain TCP client, or one without RDMA)
//   kPairTimeout         the request came but the connection did not complete
//                        in time: the TCP connection has been shut down, as
//                        the client may have committed
//   kPairFailed, kResources  as for the client (stays on TCP)
std::unique_ptr<Channel> verbs_server_pair(VerbsListener* listener, int tcp_fd, const Config& cfg,
                                           Fallback* why);

}  // namespace rsock
