// Same-host transport: both rings and their control words live in one memfd
// region mapped by the two processes (layout in src/ring/wire.h). The
// sender's "DMA" is one memcpy into the peer's ring and a release store of
// the head; a sleeping peer is woken by a one-byte doorbell on the kernel TCP
// socket, which stays open under the application's fd and also carries
// liveness (a peer that dies closes it). Both ends count the doorbells they
// send and the bytes they drain in the region, so that a byte that reached
// the socket behind librsock is found and resets the connection instead of
// being drained as a doorbell. Thread-safety: as Channel.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ring/wire.h"
#include "transport/channel.h"

namespace rsock {

// Creates a memfd region for rings of ring_bytes each and initialises its
// header. Returns the memfd (close-on-exec) or a negative errno; *map and
// *map_len receive the mapping.
int shm_region_create(size_t ring_bytes, uint64_t nonce, void** map, size_t* map_len);

// Maps a region received from the peer and checks it against the handshake
// (size, magic, version, nonce, ring size). Returns 0 or a negative errno.
int shm_region_attach(int memfd, size_t region_bytes, uint64_t nonce, size_t ring_bytes,
                      void** map);

class ShmChannel final : public Channel {
 public:
  // Takes ownership of the mapping and of doorbell_fd (a private dup of the
  // connection's TCP socket).
  ShmChannel(void* map, size_t map_len, bool is_server, int doorbell_fd);
  ~ShmChannel() override;
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  const char* name() const override { return "shm"; }
  size_t ring_bytes() const override { return ring_bytes_; }
  const uint8_t* rx_ring() const override { return rx_ring_; }
  int write(size_t offset, const void* src, size_t len) override;
  int publish(uint64_t head) override;
  int grant(uint64_t consumed) override;
  void signal(uint32_t flags) override;
  PeerState poll() override;
  void arm(uint32_t want) override;
  void disarm(uint32_t want) override;
  int wait_fd() const override { return doorbell_fd_; }
  void drain_wakeups() override;
  void probe() override;
  uint64_t peer_read_total() override;
  void note_read(uint64_t total) override;
  int kernel_socket() const override { return doorbell_fd_; }
  void add_holder() override;
  bool drop_holder() override;

 private:
  void ring_doorbell();
  void peer_gone(uint32_t flags);
  void kernel_bytes_seen();

  void* map_;
  size_t map_len_;
  size_t ring_bytes_;
  std::atomic<uint32_t>* holders_;  // processes holding our end
  DirectionControl* tx_;  // we produce
  DirectionControl* rx_;  // we consume
  EndpointControl* me_;   // our end's own line
  EndpointControl* peer_;
  uint8_t* tx_ring_;      // the peer's receive ring
  const uint8_t* rx_ring_;
  int doorbell_fd_;
  // kPeerClosed/kTransportError/kKernelBytes seen on the TCP socket.
  std::atomic<uint32_t> carrier_flags_{0};
  std::atomic<bool> kernel_bytes_reported_{false};
};

}  // namespace rsock
