// What rsockstat shows of a running process: its open connections
// (addresses, transport, state, bytes each way, credit stalls, wakeups) and
// its counts by reason code. Each process writes them into a shared-memory
// file of its own, <dir>/rsock-<uid>/<pid> (dir: RSOCK_PUBLISH_DIR, default
// /dev/shm), in a directory only its user may enter, mode 0600: a user sees
// only their own processes, unless root (docs/security.md). The file is made
// at the process's first TCP socket or connection, removed at its exit, and
// renamed <pid>.exec across an exec (back if the exec fails). rsockstat
// removes the file of a process that died without a word.
//
// The counters a connection's data path updates live in its slot of that
// file: the relaxed adds it always made, to another address. Publishing
// costs the data path no system call and no instruction; a connection's
// setup pays one getsockname and one getpeername (RSOCK_PUBLISH=0: none).
//
// The layout below is version 1, read by rsockstat (src/tools/rsockstat.cpp)
// from memory its user can write: every field is checked there.
// Thread-safety: slots are claimed and freed with atomics only (a close in
// a signal handler frees one); the file is made once, by one thread.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>

namespace rsock {

// One connection's counters, by this process. Relaxed atomics: a reader in
// another process sees each value whole, not a consistent set.
struct ConnCounters {
  std::atomic<uint64_t> sent{0};  // bytes through the rings
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> tcp_sent{0};  // bytes on the kernel socket before the switch
  std::atomic<uint64_t> tcp_received{0};
  std::atomic<uint64_t> stalls{0};   // sends that found the peer's ring full (no credit)
  std::atomic<uint64_t> wakeups{0};  // doorbells rung for the peer's sleeping threads (shm)
};

namespace pub {

inline constexpr char kMagic[8] = {'R', 'S', 'O', 'C', 'K', 'P', 'U', 'B'};
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kSlots = 16384;  // connections listed at once; more are counted
inline constexpr int kCodes = 48;          // reason codes, all kinds together
inline constexpr int kNameBytes = 24;

enum SlotState : uint32_t {
  kFree = 0,
  kFilling,      // claimed, its description not written yet
  kPairing,      // on TCP while its pairing runs (RSOCK_TCP_FIRST)
  kAccelerated,  // on a transport
  kHidden,       // done being shown (sealed into its successor, or back on TCP)
};
enum Transport : uint8_t { kTransportNone = 0, kTransportShm = 1, kTransportRdma = 2 };
enum CodeKind : uint8_t { kCodeNone = 0, kCodeFallback, kCodeReset, kCodeReject };

// A reason code's name (as the stats file and the log spell it) and count.
struct Code {
  char name[kNameBytes - 1];
  uint8_t kind;  // CodeKind
  std::atomic<uint64_t> count;
};

struct Header {
  char magic[8];  // kMagic, written last
  uint32_t version;
  uint32_t header_bytes;  // sizeof(Header); slots begin at the next page
  uint32_t slot_bytes;    // sizeof(Slot)
  uint32_t slot_count;
  int32_t pid;
  uint32_t uid;
  uint64_t start_ticks;                  // /proc/<pid>/stat's starttime: a reused pid has another
  char program[64];                      // NUL-terminated
  std::atomic<uint32_t> high;            // slots [0, high) have been used
  std::atomic<uint32_t> hint;            // where the next claim looks first
  std::atomic<uint64_t> unlisted;        // connections that found every slot taken
  std::atomic<uint64_t> connections[3];  // by path, as the stats: shm, rdma, tcp
  std::atomic<uint64_t> closed_sent;     // bytes of closed connections (rings)
  std::atomic<uint64_t> closed_received;
  Code codes[kCodes];
};

struct alignas(64) Slot {
  std::atomic<uint32_t> state;  // SlotState
  std::atomic<uint32_t> gen;    // bumped at each claim: a reader sees a slot reused
  int32_t fd;                   // the application's number when the connection was made
  uint8_t transport;            // Transport
  uint8_t family;               // AF_INET, AF_INET6, 0: addresses unknown
  uint16_t local_port;          // host order
  uint16_t remote_port;
  uint8_t local_addr[16];  // IPv4: the first 4 bytes
  uint8_t remote_addr[16];
  int64_t since;  // CLOCK_REALTIME seconds at the claim
  alignas(64) ConnCounters c;
};
static_assert(sizeof(Slot) == 128);

// The start time of a process (clock ticks after boot, field 22 of
// /proc/<pid>/stat) from that file's text; false if it cannot be read.
inline bool parse_start_ticks(const char* stat, uint64_t* out) {
  const char* p = nullptr;
  for (const char* c = stat; *c; ++c)
    if (*c == ')') p = c;  // the program name may hold ')' and spaces
  if (!p) return false;
  ++p;
  for (int field = 2; field < 21; ++field) {  // to the space before field 22
    while (*p == ' ') ++p;
    while (*p && *p != ' ') ++p;
    if (!*p) return false;
  }
  uint64_t v = 0;
  bool any = false;
  for (++p; *p >= '0' && *p <= '9'; ++p, any = true) v = v * 10 + static_cast<uint64_t>(*p - '0');
  *out = v;
  return any;
}

inline constexpr size_t kPage = 4096;
inline constexpr size_t kSlotsOffset = (sizeof(Header) + kPage - 1) / kPage * kPage;
inline constexpr size_t kFileBytes = kSlotsOffset + sizeof(Slot) * kSlots;

}  // namespace pub

// A connection's place in the file: claimed at construction when the
// process publishes (else counters() are private), freed at destruction.
class PublishedConn {
 public:
  PublishedConn();
  ~PublishedConn();
  PublishedConn(const PublishedConn&) = delete;
  PublishedConn& operator=(const PublishedConn&) = delete;

  ConnCounters* counters() { return slot_ ? &slot_->c : &own_; }
  // Writes what the connection is: its addresses (getsockname on sock_fd,
  // and getpeername unless peer is given), the application's number for it,
  // transport and state (kPairing or kAccelerated): before it is shared,
  // or by the one thread that runs its pairing (a connection on TCP
  // meanwhile, whose slot nothing else writes but its counters).
  void describe(int sock_fd, int app_fd, bool rdma, pub::SlotState state,
                const sockaddr* peer = nullptr, socklen_t peer_len = 0);
  // No longer shown (its successor is, or it went back to TCP). The
  // counters stay valid until destruction.
  void hide();

 private:
  pub::Slot* slot_ = nullptr;
  ConnCounters own_;
};

// Reason codes and connection counts, mirrored from the stats (stats.cpp).
void publish_code(pub::CodeKind kind, int index);
void publish_connection(int path);
void publish_closed_bytes(uint64_t sent, uint64_t received);
// The process made a TCP socket: its file is made now, if not yet.
void publish_begin();
// Process events (lifecycle/runtime.cpp, the exec and _exit wrappers).
void publish_fork_prepare();  // last thing before a fork
void publish_after_fork_parent();
void publish_after_fork_child();  // first thing in the child: a file of its own
void publish_before_exec();
void publish_exec_failed();
void publish_at_exit();

}  // namespace rsock
