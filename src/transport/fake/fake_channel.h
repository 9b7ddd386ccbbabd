// An in-process fake transport with fault injection, for unit tests of the
// protocol (src/ring, src/stream). Two ends share one FakeLink. Payload is
// placed into the peer's ring at once (as an RDMA WRITE places it), but the
// notifications that make it visible (publish, grant, flags) travel as
// queued "completions" that can be delayed by a number of ticks, delivered
// in random order, or lost to an injected carrier failure. Every call on an
// end is one tick. Thread-safety: all state is under the link's mutex; the
// ends may be used from different threads.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "transport/channel.h"

namespace rsock {

struct FakeFaults {
  uint32_t delay_ticks = 0;   // a notification is deliverable this many ticks after it was sent
  bool reorder = false;       // deliver deliverable notifications in random order
  int64_t fail_after = -1;    // after this many operations the carrier fails (-1: never)
  uint32_t seed = 1;
};

class FakeLink : public std::enable_shared_from_this<FakeLink> {
 public:
  static std::shared_ptr<FakeLink> create(size_t ring_bytes, FakeFaults faults);
  // End 0 and end 1; each may be taken once.
  std::unique_ptr<Channel> take_end(int side);
  // Delivers every queued notification (test helper, ignores delays).
  void flush();
  // Makes the carrier fail now.
  void fail();
  uint64_t notifications_delivered() const;
  uint64_t notifications_reordered() const;

 private:
  friend class FakeChannel;
  struct Note {
    int to;          // receiving end
    int kind;        // 0 head, 1 consumed, 2 flags
    uint64_t value;
    uint64_t ready_at;
  };
  struct EndState {
    std::vector<uint8_t> ring;  // this end's receive ring
    PeerState seen;             // what this end knows of its peer
    uint32_t waiting = 0;       // armed sleepers (peer rings our eventfd)
    uint64_t read = 0;          // bytes this end's application has read (note_read)
    int event_fd = -1;
  };
  FakeLink(size_t ring_bytes, FakeFaults faults);
  void tick_locked();
  void deliver_locked(size_t index);
  void deliver_ready_locked(int to);
  bool failed_locked() const { return failed_; }
  void wake_locked(int end);

  mutable std::mutex mu_;
  size_t ring_bytes_;
  FakeFaults faults_;
  std::mt19937 rng_;
  uint64_t tick_ = 0;
  uint64_t ops_ = 0;
  bool failed_ = false;
  bool taken_[2] = {false, false};
  EndState ends_[2];
  std::deque<Note> queue_;
  uint64_t delivered_ = 0;
  uint64_t reordered_ = 0;
};

}  // namespace rsock
