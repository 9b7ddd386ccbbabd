// Same-host transport: both rings and their control words live in one
// region of shared memory mapped by the two processes (layout in
// src/ring/wire.h), a place in the memfd that holds every region of the
// pair of processes (arena.h). The
// sender's "DMA" is one memcpy into the peer's ring and a release store of
// the head; a sleeping peer is woken by a one-byte doorbell on the kernel TCP
// socket, which stays open under the application's fd and also carries
// liveness (a peer that dies closes it). Both ends count the doorbells they
// send and the bytes they drain in the region, so that a byte that reached
// the socket behind librsock is found and resets the connection instead of
// being drained as a doorbell. The channel holds a reference to the
// region's file (close-on-exec, one per peer process) so that an exec'd
// program can take this end over (src/lifecycle/exec_handoff.h), and to
// give ring pages back; everything the new image needs besides the socket
// is in the region. Thread-safety: as Channel; the accessors for the
// exec hand-off read atomics and may be called from any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "ring/wire.h"
#include "transport/channel.h"
#include "transport/handoff.h"
#include "transport/shm/arena.h"
#include "transport/shm/region_cache.h"
#include "transport/shm/shm_linger.h"
#include "transport/socket_number.h"

namespace rsock {

// Places a region for rings of ring_bytes each in the arena for `peer`
// (arena.h), maps it and initialises its header. Returns 0 (*out holds the
// place, *map and *map_len the mapping) or a negative errno.
int shm_region_place(const RegionPeer& peer, size_t ring_bytes, uint64_t nonce, RegionRef* out,
                     void** map, size_t* map_len);
// A region in a memfd of its own, at offset 0, its size sealed (tests).
// Returns the memfd (close-on-exec) or a negative errno; *map and *map_len
// receive the mapping.
int shm_region_create(size_t ring_bytes, uint64_t nonce, void** map, size_t* map_len);
// Both ends of a region created as above start with their directions on the
// kernel socket (docs/protocol.md section 10). An end whose pairing runs
// before the connection's first byte (its fd's data calls wait for it; all
// but RSOCK_TCP_FIRST=1) is marked switched at 0 and attached by its own
// side, before it commits: every byte of that end goes on the rings, as
// before version 5. shm_region_start_on_ring marks both (tests).
void shm_region_start_on_ring(void* map);
void shm_region_end_on_ring(void* map, bool server);

// Writes a fresh header for rings of ring_bytes into the region at `map`
// (zeroing the old one first: a kept region's, region_cache.h).
void shm_region_init_header(void* map, size_t ring_bytes, uint64_t nonce);

// The place a region was mapped from, by which a kept mapping is found
// again.
struct RegionFile {
  dev_t dev = 0;
  ino_t ino = 0;
  uint64_t offset = 0;
};

// Maps the region at `offset` (a page multiple) of a file received from the
// peer and checks it against the handshake (seals, size, magic, version,
// nonce, ring size): a mapping of the same place kept from an earlier
// connection is used again (region_cache.h). Returns 0 or a negative errno;
// *file (may be nullptr) receives the place's identity, and *reused (may be
// nullptr) whether the mapping is such a kept one.
int shm_region_attach(int memfd, uint64_t offset, size_t region_bytes, uint64_t nonce,
                      size_t ring_bytes, void** map, RegionFile* file = nullptr,
                      bool* reused = nullptr);

// Validates the region at `offset` of a file inherited through exec before
// anything trusts it: seals (no shrinking), size, magic, version, ring
// layout and nonce, and
// that `socket_fd` is the TCP connection the region was made for (its local
// and peer address equal what side `is_server` recorded). Maps it on
// success. Returns 0 or a negative errno (-EPROTO: not this connection's
// region).
int shm_region_validate(int memfd, uint64_t offset, int socket_fd, bool is_server, uint64_t nonce,
                        void** map, size_t* map_len);

// The positions of one end as the region holds them, from which a process
// that takes this end over rebuilds its stream (Stream::resume).
struct ShmPositions {
  uint64_t tx_head = 0;      // bytes we published to the peer
  uint64_t tx_credited = 0;  // of those, bytes the peer consumed
  uint64_t rx_granted = 0;   // bytes of the peer's we consumed and reported
  bool fin_sent = false;     // we shut down our sending side
};

// The exec hand-off's entries of this transport (transport/handoff.h):
// S, an end the new image holds; C, one whose last holder closed it by exec.
void shm_exec_adopt(char** f, const std::vector<int>& fds, bool spawned, Adoption* out);
void shm_exec_goodbye(char** f, const std::vector<int>& fds, bool spawned, Adoption* out);

class ShmChannel final : public Channel {
 public:
  // A freshly paired end: takes ownership of the mapping (map_len bytes,
  // checked by shm_region_create/attach: the rings' layout follows from it),
  // of doorbell_fd (a private dup of the connection's TCP socket) and of
  // the reference to the region's place (none: no exec hand-off, no pages
  // given back then).
  // This process is the end's only holder, and its socket's addresses are
  // recorded in the region: ends[0] (local) and ends[1] (peer) when the
  // caller knows them, else asked of doorbell_fd. rx_read_only: the mapping
  // served an earlier end of this process on the same side (a kept region,
  // region_cache.h), so its receive ring is mapped read-only already.
  ShmChannel(void* map, size_t map_len, bool is_server, int doorbell_fd, RegionRef region = {},
             const WireAddr* ends = nullptr, bool rx_read_only = false);
  // An end taken over after exec (the region validated by
  // shm_region_validate): the holder count is left alone, since exec does
  // not change which processes hold the connection.
  struct Resume {};
  ShmChannel(Resume, void* map, size_t map_len, bool is_server, int doorbell_fd, RegionRef region);
  ~ShmChannel() override;
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;

  const char* name() const override { return "shm"; }
  size_t ring_bytes() const override { return ring_bytes_; }
  const uint8_t* rx_ring() const override { return rx_ring_; }
  bool begin_tx() override;
  void end_tx() override;
  size_t trim(uint64_t rx_consumed) override;
  bool trimmable() const override;
  int write(size_t offset, const void* src, size_t len) override;
  int publish(uint64_t head) override;
  int grant(uint64_t consumed) override;
  void signal(uint32_t flags) override;
  PeerState poll() override;
  bool arm(uint32_t want, uint64_t sleep) override;
  void disarm(uint32_t want) override;
  int wait_fd() const override { return socket_.fd(); }
  bool drain_wakeups() override;
  bool leave_wakeups() override;
  bool drain_left_wakeups() override;
  void probe() override;
  // wait_fd() is the kernel socket: the peer's FIN, a reset and foreign
  // bytes all make it readable.
  bool wait_fd_shows_carrier() const override { return true; }
  uint64_t peer_read_total() override;
  void note_read(uint64_t total) override;
  int kernel_socket() const override { return socket_.fd(); }
  SocketNumber* socket_number() override { return &socket_; }
  TcpPrefix* tcp_prefix() override { return &prefix_; }
  void attach() override;
  void switch_tx(uint64_t at) override;
  bool doorbell_owed() const override { return owed_.load(std::memory_order_acquire); }
  void switch_rx(uint64_t taken) override;
  void tcp_closed(bool) override { peer_gone(kPeerClosed); }
  bool peer_told_close() const override;
  void foreign_bytes() override { kernel_bytes_seen(); }
  void add_holder() override;
  bool drop_holder() override;
  bool sole_holder() const override { return holders_->load(std::memory_order_acquire) == 1; }
  // Several processes may hold this end (fork, exec): the one that uses it
  // owns it (transport/end_owner.h, docs/design.md "Connections that
  // move"). The rings are shared memory already, so taking it over is a
  // fence and a read of the positions; a process whose end another one
  // took over fails its calls with ECONNRESET while that one holds it.
  bool needs_take_over() override;
  int take_over(EndPositions* at) override;
  int enter() override;
  void leave() override;
  void after_fork_child() override;
  // The process exits holding this end: one whose prefix the peer has not
  // read all of holds up the exit a while (shm_linger.h).
  void at_exit() override;
  // Exec hand-off: shm_handoff.cpp.
  void exec_prepare(ExecKind kind, bool inherited, ExecSink& sink) override;
  void exec_undo(ExecKind kind, uint32_t token) override;

  // A region kept after both ends are done (region_cache.h) keeps the
  // first kKeptWarmBytes of each ring resident (a short connection's bytes
  // land there) and gives the rest back: the server, whose destructor finds
  // the client's end done, punches them out.
  static constexpr size_t kKeptWarmBytes = 16 * 1024;
  // The most one drain_wakeups takes off the socket: a peer that rings
  // without pause cannot keep a sleeper (or a close) draining.
  static constexpr size_t kDrainMaxBytes = 64 * 1024;

  // Once this end closes, its region may serve the next connection between
  // the same two processes (region_cache.h), if this process was its only
  // holder throughout. The creator's side names the peer process, the
  // attaching side the region's file. Set by the pairing, before any use.
  void keep_region_for(const RegionPeer& peer) { keep_peer_ = peer; }
  void keep_mapping_of(const RegionFile& file) {
    keep_file_ = file;
    keep_mapping_ = true;
  }

  // For the exec hand-off.
  // Drops this process as a holder unless it is the last one (then it
  // must tell the peer, which the new image does); returns whether it did.
  bool drop_holder_unless_last();
  const RegionRef& region() const { return region_; }
  int arena_fd_or_none() const { return region_.arena ? arena_fd(region_.arena) : -1; }
  bool is_server() const { return is_server_; }
  uint64_t nonce() const;
  ShmPositions positions() const;
  // Threads of this process armed right now (they vanish at exec).
  void local_armed(uint32_t* data, uint32_t* space) const;
  // Withdraws waiters that no longer exist (threads that exec killed while
  // armed), never below zero.
  void forget_waiters(uint32_t data, uint32_t space);

 private:
  void init(void* map, bool is_server, bool rx_read_only = false);
  void doorbells_only();  // TCP_NODELAY, no cork: our sender switched
  // Gives back the pages of len bytes at `offset` in the region.
  bool punch(size_t offset, size_t len);
  // Whether our sender has switched (doorbells may go out) / our receiver
  // has read the peer's prefix (every byte on the socket is a doorbell), as
  // the region says: another holder of the end may have moved it on.
  bool tx_open();
  bool rx_open();
  // Rings; true when a doorbell is on its way (sent, or the socket is full
  // of them).
  bool ring_doorbell();
  // Rings for the sleepers a sleepers word names, unless this thread has
  // just rung the one sleep it names (ring/sleepers.h).
  void wake(uint64_t sleepers_word);
  void peer_gone(uint32_t flags);
  // Gives back the pages of one ring that traffic has touched since the
  // last time, if it is empty and its producer writes nothing meanwhile
  // (we are the producer: `ours`; else the Dekker of `writing` and
  // heavy_fence). `consumed`: what its consumer has read. Returns bytes.
  size_t trim_ring(DirectionControl* d, size_t ring_offset, bool ours, uint64_t consumed);
  // A hold on trim_seq, or a raised `writing`, that a process left behind
  // (killed inside a trim or a send, or an image before exec): released by
  // the end that takes over.
  void release_stale_trims();
  void kernel_bytes_seen();
  bool owns() const;
  // Whether the socket must outlive our close, and the lingering end.
  bool must_linger();
  ShmLinger linger_end(bool owned) const;
  // A region kept after both ends are done gives back its rings' pages
  // past kKeptWarmBytes.
  void shed_cold_pages();

  void* map_;
  size_t map_len_;
  size_t ring_bytes_;
  std::atomic<uint32_t>* holders_;  // processes holding our end
  DirectionControl* tx_;            // we produce
  DirectionControl* rx_;            // we consume
  EndpointControl* me_;             // our end's own line
  EndpointControl* peer_;
  uint8_t* tx_ring_;  // the peer's receive ring
  const uint8_t* rx_ring_;
  size_t tx_ring_offset_;  // in the region
  size_t rx_ring_offset_;
  // The socket, which carries the doorbells: the private dup the pairing
  // made until the hand-over gives the channel the application's number
  // (socket_number.h).
  SocketNumber socket_;
  RegionRef region_;  // the region's place (its arena's reference)
  bool is_server_;
  // kPeerClosed/kTransportError/kKernelBytes seen on the TCP socket.
  std::atomic<uint32_t> carrier_flags_{0};
  std::atomic<bool> kernel_bytes_reported_{false};
  std::atomic<uint32_t> armed_data_{0};   // this process's share of consumer_sleepers
  std::atomic<uint32_t> armed_space_{0};  // and of producer_sleepers
  // Ownership of our end: the region's word for our side, and the epoch
  // this process took (0: it never owned the end). epoch_ changes only in
  // take_over(), under both of the stream's locks, and at fork.
  EndOwner* own_ = nullptr;
  uint64_t epoch_ = 0;
  std::atomic<bool> lost_reported_{false};
  // This process's stats count the connection (the pairing or the exec
  // hand-off did; a fork's child does when it takes the end over).
  bool counted_ = true;
  // Starting on TCP (docs/protocol.md section 10): the region's words, and
  // what this process derived from them. Until our sender has switched, no
  // doorbell goes on the socket (it would read as data on the other side):
  // one held back is owed. Until our receiver has read the peer's prefix,
  // bytes on the socket are data: drain_wakeups and probe leave them.
  TcpPrefix prefix_ = {};
  std::atomic<bool> tx_switched_{false};
  std::atomic<bool> rx_switched_{false};
  std::atomic<bool> owed_{false};
  std::atomic<bool> wakeups_left_{false};  // leave_wakeups(): on the socket still
  // Keeping the region when the end closes (keep_region_for /
  // keep_mapping_of): only if this process held the end alone from start to
  // end (sole_: no fork, exec or spawn shared it) and dropped it last.
  RegionPeer keep_peer_;
  RegionFile keep_file_;
  bool keep_mapping_ = false;
  bool sole_ = true;
  bool dropped_last_ = false;
  // This process closed the end as its last holder, not abortively: if the
  // peer has not read all of our prefix, the socket lingers (shm_linger.h).
  std::atomic<bool> closed_clean_{false};
};

}  // namespace rsock
