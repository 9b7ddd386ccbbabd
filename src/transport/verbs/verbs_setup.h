// Cross-host discovery and pairing over rdma_cm (docs/protocol.md, "Verbs
// transport"). The kernel TCP connection is made first and stays the
// application's fd; then the client opens an RC connection with rdma_cm
// (RDMA_PS_TCP, so also right for iWARP) to the same IP:port, naming the TCP
// 4-tuple in its private data, and the server matches the request to the
// TCP connection it accepted; a server process that cannot read its
// listener (a fork's child) connects to the client's rendezvous instead.
// rdma_cm does not tell who sent a request, so the rings are announced only
// in two proofs on the TCP connection itself, which only its two ends can
// read or write (docs/security.md). The process that accepts the TCP stream
// owns the queue pair. Every wait is bounded by Config::connect_timeout_ms.
// No rdma-core type appears here.
// Thread-safety: a VerbsListener may be used by several accepting threads at
// once (internally locked); everything else works on caller-owned fds.
#pragma once

#include <memory>

#include "config/config.h"
#include "stats/stats.h"
#include "transport/channel.h"
#include "transport/pairing.h"

namespace rsock {

class VerbsListener;

// True when this host has at least one RDMA device (cached after the first
// call). Cheap enough for every connect.
bool verbs_available();

// False in a process forked from one that had opened an RDMA device: Linux
// ties rdma_cm and verbs descriptors to the process that opened them
// (EACCES elsewhere), and librdmacm keeps the inherited ones. Such a
// process stays on TCP (Fallback::kRdmaAfterFork).
bool verbs_usable_here();
// Called in the child after fork().
void verbs_after_fork_child();
// Fork safety of registered memory, settled once before the first
// registration of this process (ibv_fork_init unless the kernel makes it
// unnecessary).
void verbs_global_init();

// Server: an rdma_cm listener on the same local IP:port as the kernel TCP
// listener tcp_listen_fd (the two coexist: rdma_cm has its own port space).
// Returns nullptr with *why = kNotSameHost when there is no RDMA device or
// address, kResources on another failure. When another process already
// holds the rdma_cm port (SO_REUSEPORT siblings), returns a listener that
// verbs_listener_usable() calls unusable: this process then pairs through
// each client's rendezvous, as a fork's child does.
VerbsListener* verbs_listen(int tcp_listen_fd, Fallback* why);
// Rejects the pending requests and closes the listener.
void verbs_listener_close(VerbsListener* listener);
// In a child after fork(): the inherited listener is unusable here (the
// kernel refuses rdma_cm commands on a descriptor from another process,
// EACCES) but still serves the parent. From now on this process neither
// reads it nor destroys it; verbs_listener_usable() says false.
void verbs_listener_forked_child(VerbsListener* listener);
bool verbs_listener_usable(const VerbsListener* listener);

class VerbsRendezvous;

// Client: before the kernel TCP connect of tcp_fd to dst. Opens the
// client's rdma_cm rendezvous: a listener on the TCP socket's own address
// and port (binding an unbound socket to a port free in both port spaces),
// which a server process that cannot read its listener (a fork's child)
// connects to. Returns nullptr when there is none (the pairing then works
// with servers that read their listener only).
VerbsRendezvous* verbs_client_prepare(int tcp_fd, const struct sockaddr* dst);
void verbs_rendezvous_close(VerbsRendezvous* rendezvous);

// Client: after the kernel TCP connect of tcp_fd succeeded (rendezvous:
// from verbs_client_prepare or nullptr; taken over). Sends a connect request
// to the server's listener, or takes the server's own request at the
// rendezvous; once the rdma_cm connection is up, writes its proof on the
// TCP connection and reads the server's answer there (docs/protocol.md
// section 7). Fallbacks:
//   kNotSameHost         no RDMA device here or no RDMA route to the peer
//   kPeerNotAccelerated  no rdma_cm listener at the peer (REJECTED as "no
//                        matching listener", after a few quick retries)
//   kPeerUnproven        the server declined our proof: the process that
//                        answered our request does not hold the connection
//   kPairTimeout         nothing conclusive within the timeout, or the
//                        server withdrew the request we were accepting
//   kPairFailed          the server refused, or a protocol mismatch
//   kResources           registration or queue creation failed (memlock)
// Once our proof is written the server may have committed: a failure after
// that point shuts the TCP connection down (never silent divergence).
std::unique_ptr<Pairing> verbs_client_pairing(int tcp_fd, VerbsRendezvous* rendezvous,
                                              const Config& cfg);

// Server: after the kernel accept() of tcp_fd on the listener's TCP socket.
// Accepts the connect requests naming this TCP connection (each with its own
// challenge; requests for other connections stay in the listener's table for
// their own accept, and expire), and pairs with the one whose challenge the
// client echoes in band. Resumable (Pairing::run). Fallbacks:
//   kPeerNotAccelerated  no request came in time, or the client's first bytes
//                        are application data (a plain client)
//   kPeerUnproven        the client proved a request that is not one of ours
//   kPairTimeout         the client accepted or sent a request, then gave up
//                        before proving (it tore its rdma_cm side down); a
//                        reverse request not accepted within one more
//                        timeout plus 2 s past ours (withdrawn: the client
//                        cannot have committed); or a client whose side may
//                        be up neither proved nor gave up within one more
//                        timeout plus kPeerDecisionMs past ours: then the
//                        TCP connection has been shut down, as the client
//                        may be committing
//   kPairFailed, kResources  as for the client (stays on TCP)
std::unique_ptr<Pairing> verbs_server_pairing(VerbsListener* listener, int tcp_fd,
                                              const Config& cfg);

// Server, in a process that cannot read its listener (a fork's child):
// sends its own request, with its challenge, to the client's rendezvous (its
// TCP address and port), then as above. kPeerNotAccelerated at once for a
// client without a rendezvous.
std::unique_ptr<Pairing> verbs_reverse_pairing(int tcp_fd, const Config& cfg);

}  // namespace rsock
