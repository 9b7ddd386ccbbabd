// Ring index math and credit accounting: the transport-agnostic core of the
// stream protocol (docs/protocol.md). Positions are absolute 64-bit byte
// counts that never wrap in practice (2^64 bytes); the offset in a ring of
// power-of-two size is pos & (size - 1). Pure, header-only, no I/O.
// Thread-safety: plain values; the owner (Stream) serialises access.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rsock {

inline constexpr bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// A contiguous piece of a ring: [offset, offset + len) with offset < size.
struct RingSpan {
  size_t offset = 0;
  size_t len = 0;
};

// Splits the range [pos, pos + len) of a ring of `size` bytes into at most two
// contiguous spans (the second one starts at offset 0 when the range wraps).
// Returns the number of spans (0 when len == 0).
inline int ring_split(uint64_t pos, size_t len, size_t size, RingSpan out[2]) {
  if (len == 0) return 0;
  const size_t off = static_cast<size_t>(pos & (size - 1));
  const size_t first = len < size - off ? len : size - off;
  out[0] = {off, first};
  if (first == len) return 1;
  out[1] = {0, len - first};
  return 2;
}

// Sender side of one direction. `sent` counts the bytes written into the
// peer's ring; `credited` counts the bytes the peer reported as consumed (its
// credit grants). Free space is size - (sent - credited): the sender may
// never overwrite bytes the receiver has not consumed yet.
class CreditLedger {
 public:
  explicit CreditLedger(size_t ring_bytes) : size_(ring_bytes) {}

  size_t ring_bytes() const { return size_; }
  uint64_t sent() const { return sent_; }
  uint64_t credited() const { return credited_; }
  size_t in_flight() const { return static_cast<size_t>(sent_ - credited_); }
  size_t available() const { return size_ - in_flight(); }

  // Records that n bytes were written (n <= available()).
  void on_sent(size_t n) { sent_ += n; }

  // Takes over a sender's totals (a program that inherited the connection
  // through exec): the caller has checked credited <= sent <= credited + size.
  void restore(uint64_t sent, uint64_t credited) {
    sent_ = sent;
    credited_ = credited;
  }

  // Applies a credit grant: the peer has consumed `consumed` bytes in total.
  // Grants may arrive late, duplicated or out of order; only a larger total
  // counts, and a total beyond what was sent is a protocol violation.
  // Returns false on such a violation (the caller resets the stream).
  bool on_credit(uint64_t consumed) {
    if (consumed > sent_) return false;
    if (consumed > credited_) credited_ = consumed;
    return true;
  }

 private:
  size_t size_;
  uint64_t sent_ = 0;
  uint64_t credited_ = 0;
};

// Receiver side of one direction. `arrived` is the highest position the
// sender has published; `consumed` what the application has read; `granted`
// the total last reported back as credits.
class ReceiveWindow {
 public:
  explicit ReceiveWindow(size_t ring_bytes) : size_(ring_bytes) {}

  size_t ring_bytes() const { return size_; }
  uint64_t arrived() const { return arrived_; }
  uint64_t consumed() const { return consumed_; }
  uint64_t granted() const { return granted_; }
  size_t readable() const { return static_cast<size_t>(arrived_ - consumed_); }

  // Applies a publication from the sender (possibly stale or reordered).
  // Returns false when it claims more than a ring's worth of unconsumed
  // bytes, which an honest sender can never do.
  bool on_arrival(uint64_t head) {
    if (head < arrived_) return true;  // stale notification
    if (head - consumed_ > size_) return false;
    arrived_ = head;
    return true;
  }

  void on_consumed(size_t n) { consumed_ += n; }

  // Takes over a receiver whose last grant was `consumed` (exec): nothing
  // beyond it is known to have arrived until the next publication is seen.
  void restore(uint64_t consumed) { arrived_ = consumed_ = granted_ = consumed; }

  // Credit rule: grant once half the ring has been freed since the last
  // grant, or as soon as anything was freed when the sender is stalled on
  // credits. Batching halves the control traffic on transports where a grant
  // costs a message (verbs) without ever letting a waiting sender starve.
  bool should_grant(bool sender_stalled) const {
    const uint64_t freed = consumed_ - granted_;
    return freed >= size_ / 2 || (sender_stalled && freed > 0);
  }
  void on_granted() { granted_ = consumed_; }

 private:
  size_t size_;
  uint64_t arrived_ = 0;
  uint64_t consumed_ = 0;
  uint64_t granted_ = 0;
};

}  // namespace rsock
