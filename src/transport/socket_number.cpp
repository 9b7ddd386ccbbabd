// The descriptor of a channel's socket (see socket_number.h).
#include "transport/socket_number.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>

#include "common/own_fd.h"
#include "common/real.h"

namespace rsock {

SocketNumber::~SocketNumber() {
  const int fd = fd_.load(std::memory_order_relaxed);
  if (owned_.load(std::memory_order_acquire) && fd >= 0) real().close(fd);
}

SocketNumber::Use::Use(SocketNumber& n) {
  users_ = &n.users_[n.epoch_.load(std::memory_order_seq_cst) & 1];
  users_->fetch_add(1, std::memory_order_seq_cst);
  fd_ = n.fd_.load(std::memory_order_seq_cst);
}

int SocketNumber::own() {
  std::lock_guard<std::mutex> lock(mu_);
  return own_locked();
}

int SocketNumber::own_locked() {
  if (owned_.load(std::memory_order_relaxed) || retired_.load(std::memory_order_relaxed)) return 0;
  const int fd = fd_.load(std::memory_order_relaxed);
  if (fd < 0) return 0;
  const int d = dup_high(fd);
  if (d < 0) return -errno;
  fd_.store(d, std::memory_order_seq_cst);
  owned_.store(true, std::memory_order_release);
  // A Use that read the old number began in the old epoch (a Use that
  // reads the new epoch reads the number after this store). Uses are
  // short: a nonblocking system call each.
  std::atomic<uint32_t>& old = users_[epoch_.fetch_add(1, std::memory_order_seq_cst) & 1];
  while (old.load(std::memory_order_seq_cst) != 0) sched_yield();
  return 0;
}

bool SocketNumber::use_locked(int app_fd) {
  if (!owned_.load(std::memory_order_relaxed) || retired_.load(std::memory_order_relaxed) ||
      app_fd < 0)
    return false;
  const int mine = fd_.load(std::memory_order_relaxed);
  fd_.store(app_fd, std::memory_order_release);
  owned_.store(false, std::memory_order_release);
  real().close(mine);
  return true;
}

bool SocketNumber::use(int app_fd) {
  std::lock_guard<std::mutex> lock(mu_);
  return use_locked(app_fd);
}

int SocketNumber::release() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!owned_.exchange(false, std::memory_order_acq_rel)) return -1;
  return fd_.load(std::memory_order_relaxed);
}

void SocketNumber::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!owned_.exchange(false, std::memory_order_acq_rel)) return;
  if (const int fd = fd_.exchange(-1, std::memory_order_acq_rel); fd >= 0) real().close(fd);
}

void SocketNumber::retire(int placeholder) {
  std::lock_guard<std::mutex> lock(mu_);
  if (retired_.exchange(true)) return;
  if (owned_.load(std::memory_order_relaxed)) {
    // Without a placeholder the socket stays until its owner goes.
    if (placeholder >= 0) real().dup3(placeholder, fd_.load(std::memory_order_relaxed), O_CLOEXEC);
    return;
  }
  // The application's number: nothing of ours to close, and the number is
  // no longer the socket's.
  fd_.store(placeholder, std::memory_order_release);
}

}  // namespace rsock
