// SocketNumber: the descriptor through which a channel reaches its
// connection's kernel socket. It is the application's own fd while that
// number is sure to name the socket, so that a connection holds one
// descriptor, as on kernel TCP (issue 9), and a private dup of the socket
// from the moment the number could come to name something else while the
// channel still needs the socket:
//  * the application gives the socket a second number (dup and its kin):
//    either may be closed first, and an epoll set keys its registrations
//    by number (before_share in the wrappers);
//  * the application's number goes (close, a dup2 onto it, close_range)
//    while the connection lives on: a thread still inside a call on it, a
//    dup, a close that lingers (forget_fd in the wrappers).
// A channel made with a dup of its own may give it up for the
// application's number once that number names its socket (use()). Every
// change happens under mutex(), which a caller that must decide together
// with it (whether the number still names the socket) holds around its
// check.
//
// A system call of the channel's own on the socket (a doorbell, a drain, a
// look at the carrier), which the application did not make on its number
// and may not expect to race with its close, goes through a Use: own()
// returns, and so the application's close of the number goes on, only
// once every Use that may have read the number is over. (A thread asleep
// in poll on the old number is woken by its caller: socket_number_leaving.)
// Thread-safety: fd() and owned() are atomic loads, a Use two atomic
// counts; the rest locks.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace rsock {

class SocketNumber {
 public:
  // fd: the socket's descriptor; owned: a dup of ours, closed with us.
  SocketNumber(int fd, bool owned) : fd_(fd), owned_(owned) {}
  ~SocketNumber();
  SocketNumber(const SocketNumber&) = delete;
  SocketNumber& operator=(const SocketNumber&) = delete;

  int fd() const { return fd_.load(std::memory_order_acquire); }

  // A short, nonblocking system call on the socket (see above).
  class Use {
   public:
    explicit Use(SocketNumber& n);
    ~Use() { users_->fetch_sub(1, std::memory_order_release); }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    int fd() const { return fd_; }

   private:
    std::atomic<uint32_t>* users_;
    int fd_;
  };

  bool owned() const { return owned_.load(std::memory_order_acquire); }
  // Whether the channel uses the application's number app_fd.
  bool uses(int app_fd) const { return !owned() && fd() == app_fd; }

  std::mutex& mutex() { return mu_; }

  // From now on a private dup of the socket (lifted above the
  // application's numbers, close-on-exec). 0 or -errno (EMFILE: no
  // descriptor left). Idempotent. own_locked: with mutex() held.
  int own();
  int own_locked();
  // The channel's dup goes, and the application's app_fd, which names the
  // same socket, takes its place. With mutex() held, by a caller that knows
  // app_fd names the socket and will go on doing so until a close or dup
  // of it calls own() (a dup of the application's own is kept: nothing to
  // give up). Returns whether it did.
  bool use_locked(int app_fd);
  bool use(int app_fd);  // the same, taking mutex()
  // The socket goes to a new owner (a lingering close, which closes it):
  // returns the owned dup, which this object no longer closes, or -1 when
  // the descriptor is the application's.
  int release();
  // Closes an owned dup now (the application's number is left alone).
  void close();
  // The socket is done, and its number must go on naming a socket that
  // has ended: an owned dup is replaced in place by `placeholder` (dup3,
  // so that no other file takes the number), the application's number is
  // no longer ours and `placeholder` names the socket from now on. After
  // this, own() and use_locked() do nothing. Idempotent.
  void retire(int placeholder);
  bool retired() const { return retired_.load(std::memory_order_acquire); }

 private:
  std::atomic<int> fd_;
  std::atomic<bool> owned_;
  std::atomic<bool> retired_{false};
  std::mutex mu_;
  // Uses in progress, by the parity of the epoch they began in: own()
  // moves the epoch on once the number changed, and waits for the old
  // epoch's Uses only (the new ones read the new number).
  std::atomic<uint32_t> epoch_{0};
  std::atomic<uint32_t> users_[2] = {};
};

}  // namespace rsock
