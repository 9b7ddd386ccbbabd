// Connection setup behind one interface: which transport carries a
// candidate stream, and how its pairing starts (issue 9, item 7). The socket
// layer (src/socket) asks here and never names a transport; this file's
// implementation is the one place that lists them (shm for a same-host peer,
// rdma for another host, as the rule allows). A new transport is a folder
// under src/transport with its pairing, and a branch here.
// Thread-safety: a ClientSetup belongs to one connect() (or its background
// pairing); a ListenSetup is shared by the threads that accept on its
// listener: accept() and result() may run concurrently.
#pragma once

#include <sys/socket.h>

#include <memory>
#include <vector>

#include "config/config.h"
#include "stats/stats.h"
#include "transport/channel.h"
#include "transport/pairing.h"

namespace rsock {

// What a transport set up for a client connection before its real
// connect() (shm: the rendezvous socket the server will call back; rdma: an
// rdma_cm id). Destroying it releases what no pairing took over.
class ClientSetup {
 public:
  virtual ~ClientSetup() = default;
  virtual Path path() const = 0;
  // Whether its pairing will be driven (Pairing::driven()): a background
  // pairing of a driven kind shares the driver thread from the start.
  virtual bool driven() const { return false; }
  // After the TCP connect of sock succeeded: the pairing, which takes over
  // what was set up. Called at most once.
  virtual std::unique_ptr<Pairing> pairing(int sock, const Config& cfg) = 0;
};

// The transport for a candidate client connection on fd to addr, under the
// rule's transport `kind`, set up before the real connect(); or nullptr
// with *why, and the stream stays on TCP. lazy (RSOCK_TCP_FIRST): what a
// driven pairing needs is set up when it begins (ClientSetup::pairing), so
// a connection that ends before costs nothing but this object.
std::unique_ptr<ClientSetup> client_setup(int fd, const sockaddr* addr, TransportKind kind,
                                          bool lazy, Fallback* why);

// A client pairing that fell back: a peer that did not answer, or does not
// run librsock, is not asked again for a while (the negative cache).
void client_fell_back(const sockaddr* addr, Fallback why);

// In a fork's child, before anything else: what the transports set up in
// the parent for pairing (rdma_cm listeners, device contexts) stays the
// parent's.
void transports_after_fork_child();
// Around fork(): what the transports keep beyond a connection's life (shm:
// closed ends that wait for their peer, shm_linger.h) is held still.
void transports_fork_prepare();
void transports_after_fork_parent();
// The engines' locks, held across fork() so that the child finds their
// lists whole: taken last, once the connections' operations have ended
// (an operation polls through its engine), released first.
void transports_fork_prepare_last();
void transports_after_fork_parent_first();
// The descriptors the transports hold beyond any connection's (an
// application's closefrom must leave them open).
void transports_own_fds(std::vector<int>* out);
// The process exits (after every connection was let go): what a peer still
// needs of it is waited for, bounded.
void transports_at_exit();
// An exec replaces this image: what lingers after a close (a same-host
// end's socket, shm_linger.h; an RDMA queue pair, VerbsEngine::Linger)
// dies with it, so it is waited for first, as at exit.
void transports_before_exec();

// The transports' side of one candidate listener: an advertisement to
// same-host clients, an rdma_cm listener at the same address (as the rule
// allows and the host can).
class ListenSetup {
 public:
  // Sets up every transport `kind` allows on the listening TCP socket fd;
  // what it cannot set up it logs, and leaves out.
  ListenSetup(int fd, TransportKind kind);
  ~ListenSetup();
  ListenSetup(const ListenSetup&) = delete;
  ListenSetup& operator=(const ListenSetup&) = delete;

  // The pairing of an accepted socket, or nullptr with *why when it is
  // decided at once (no transport for this peer, the negative cache).
  // *path: the transport it pairs over (or would have).
  // peer: the peer's address as accept() gave it, or nullptr.
  std::unique_ptr<Pairing> accept(int sock, const sockaddr* peer, const Config& cfg, Path* path,
                                  Fallback* why);
  // A finished server pairing's channel, or nullptr with *why (a host that
  // did not pair over rdma is not waited for again for a while).
  static std::unique_ptr<Channel> result(Pairing& p, int sock, Path path, Fallback* why);
  // In a fork's child: the rdma_cm listener is the parent's.
  void forked_child();
  // For the log: "shm yes, rdma no".
  bool has(Path path) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace rsock
