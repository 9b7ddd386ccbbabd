// Fake transport with fault injection (see fake_channel.h).
#include "transport/fake/fake_channel.h"

#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

namespace rsock {

class FakeChannel final : public Channel {
 public:
  FakeChannel(std::shared_ptr<FakeLink> link, int side) : link_(std::move(link)), side_(side) {}
  ~FakeChannel() override = default;

  const char* name() const override { return "fake"; }
  size_t ring_bytes() const override { return link_->ring_bytes_; }
  const uint8_t* rx_ring() const override { return link_->ends_[side_].ring.data(); }

  int write(size_t offset, const void* src, size_t len) override {
    std::lock_guard<std::mutex> lock(link_->mu_);
    link_->tick_locked();
    if (link_->failed_) return -ECONNRESET;
    auto& ring = link_->ends_[1 - side_].ring;
    if (offset + len > ring.size()) return -EINVAL;  // the stream must split at the wrap
    memcpy(ring.data() + offset, src, len);
    return 0;
  }
  int publish(uint64_t head) override { return send_note(0, head); }
  int grant(uint64_t consumed) override { return send_note(1, consumed); }
  void signal(uint32_t flags) override { send_note(2, flags); }

  PeerState poll() override {
    std::lock_guard<std::mutex> lock(link_->mu_);
    link_->tick_locked();
    link_->deliver_ready_locked(side_);
    PeerState s = link_->ends_[side_].seen;
    if (link_->failed_) s.flags |= kTransportError | kPeerClosed;
    return s;
  }
  bool arm(uint32_t, uint64_t) override {
    std::lock_guard<std::mutex> lock(link_->mu_);
    link_->ends_[side_].waiting++;
    return false;
  }
  void disarm(uint32_t) override {
    std::lock_guard<std::mutex> lock(link_->mu_);
    link_->ends_[side_].waiting--;
  }
  int wait_fd() const override { return link_->ends_[side_].event_fd; }
  // Out of band and exact, as the shared-memory transport's count.
  uint64_t peer_read_total() override {
    std::lock_guard<std::mutex> lock(link_->mu_);
    return link_->ends_[1 - side_].read;
  }
  void note_read(uint64_t total) override {
    std::lock_guard<std::mutex> lock(link_->mu_);
    link_->ends_[side_].read = total;
  }
  bool drain_wakeups() override {
    uint64_t v;
    bool took = false;
    while (::read(link_->ends_[side_].event_fd, &v, sizeof v) == sizeof v) took = true;
    return took;
  }

 private:
  int send_note(int kind, uint64_t value) {
    std::lock_guard<std::mutex> lock(link_->mu_);
    link_->tick_locked();
    if (link_->failed_) return -ECONNRESET;
    link_->queue_.push_back({1 - side_, kind, value, link_->tick_ + link_->faults_.delay_ticks});
    // A sleeping peer is woken at once; it will poll until the delayed
    // notification becomes deliverable (each poll is a tick).
    link_->wake_locked(1 - side_);
    return 0;
  }

  std::shared_ptr<FakeLink> link_;
  int side_;
};

std::shared_ptr<FakeLink> FakeLink::create(size_t ring_bytes, FakeFaults faults) {
  return std::shared_ptr<FakeLink>(new FakeLink(ring_bytes, faults));
}

FakeLink::FakeLink(size_t ring_bytes, FakeFaults faults)
    : ring_bytes_(ring_bytes), faults_(faults), rng_(faults.seed) {
  for (auto& e : ends_) {
    e.ring.assign(ring_bytes, 0);
    e.event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
}

std::unique_ptr<Channel> FakeLink::take_end(int side) {
  std::lock_guard<std::mutex> lock(mu_);
  if (side < 0 || side > 1 || taken_[side]) return nullptr;
  taken_[side] = true;
  return std::make_unique<FakeChannel>(shared_from_this(), side);
}

void FakeLink::tick_locked() {
  ++tick_;
  if (!failed_ && faults_.fail_after >= 0 && static_cast<int64_t>(++ops_) > faults_.fail_after) {
    failed_ = true;
    wake_locked(0);
    wake_locked(1);
  }
}

void FakeLink::wake_locked(int end) {
  uint64_t one = 1;
  if (ends_[end].event_fd >= 0) (void)!::write(ends_[end].event_fd, &one, sizeof one);
}

void FakeLink::deliver_locked(size_t index) {
  Note n = queue_[index];
  queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(index));
  PeerState& s = ends_[n.to].seen;
  // The raw value is handed over, stale or not: keeping only the largest
  // total is the stream's job, and that is what reordering puts under test.
  switch (n.kind) {
    case 0: s.head = n.value; break;
    case 1: s.consumed = n.value; break;
    case 2:
      if (n.value & kSendFin) s.flags |= kPeerFin;
      if (n.value & kSendClosed) s.flags |= kPeerClosed;
      if (n.value & kSendReset) s.flags |= kPeerReset;
      break;
  }
  ++delivered_;
}

void FakeLink::deliver_ready_locked(int to) {
  std::vector<size_t> ready;
  for (size_t i = 0; i < queue_.size(); ++i)
    if (queue_[i].to == to && queue_[i].ready_at <= tick_) ready.push_back(i);
  if (ready.empty()) return;
  if (faults_.reorder && ready.size() > 1) {
    // Deliver one random ready note; the others wait for the next poll. Flags
    // never overtake a head queued before them (channel.h, signal): FIN means
    // "nothing beyond what was published", so no transport may show it first.
    std::vector<size_t> candidates;
    bool head_before = false;
    for (size_t i : ready) {
      if (queue_[i].kind != 2 || !head_before) candidates.push_back(i);
      if (queue_[i].kind == 0) head_before = true;
    }
    size_t pick = candidates[std::uniform_int_distribution<size_t>(0, candidates.size() - 1)(rng_)];
    if (pick != ready.front()) ++reordered_;
    deliver_locked(pick);
    return;
  }
  // In order: deliver all ready ones front to back (indices shift on erase).
  for (size_t done = 0; done < ready.size(); ++done) deliver_locked(ready[done] - done);
}

void FakeLink::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  while (!queue_.empty()) deliver_locked(0);
  wake_locked(0);
  wake_locked(1);
}

void FakeLink::fail() {
  std::lock_guard<std::mutex> lock(mu_);
  failed_ = true;
  wake_locked(0);
  wake_locked(1);
}

uint64_t FakeLink::notifications_delivered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return delivered_;
}

uint64_t FakeLink::notifications_reordered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reordered_;
}

}  // namespace rsock
