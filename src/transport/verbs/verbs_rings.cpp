// Registered rings and the pinned-memory account (see verbs_rings.h).
#include "transport/verbs/verbs_rings.h"

#include <errno.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>

#include "config/config.h"

namespace rsock {
namespace {

std::atomic<uint64_t> g_pinned{0};
std::atomic<uint64_t> g_configured{kDefaultRdmaPinned};  // verbs_set_pinned_limit
std::atomic<uint64_t> g_test_limit{0};

uint64_t registered_bytes(const VerbsRings& r) {
  return (r.rx_mr ? r.rx_mr->length : 0) + (r.tx_mr ? r.tx_mr->length : 0);
}

}  // namespace

uint64_t verbs_pinned_bytes() { return g_pinned.load(std::memory_order_relaxed); }

namespace {
// Whether this thread's effective capabilities include CAP_IPC_LOCK (the
// kernel then lets registrations pin beyond RLIMIT_MEMLOCK).
bool can_lock_beyond_rlimit() {
  __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return geteuid() == 0;
  return (data[CAP_IPC_LOCK / 32].effective >> (CAP_IPC_LOCK % 32)) & 1u;
}
}  // namespace

uint64_t verbs_pinned_limit() {
  if (const uint64_t t = g_test_limit.load(std::memory_order_relaxed)) return t;
  uint64_t limit = g_configured.load(std::memory_order_relaxed);
  // Without CAP_IPC_LOCK the kernel refuses registrations beyond
  // RLIMIT_MEMLOCK: better a clear fallback than a failed registration.
  rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < limit &&
      !can_lock_beyond_rlimit())
    limit = rl.rlim_cur;
  return limit;
}

void verbs_set_pinned_limit(uint64_t bytes) {
  g_configured.store(bytes, std::memory_order_relaxed);
}
void verbs_set_pinned_limit_for_test(uint64_t bytes) {
  g_test_limit.store(bytes, std::memory_order_relaxed);
}

bool verbs_reserve_pinned(uint64_t bytes) {
  const uint64_t limit = verbs_pinned_limit();
  uint64_t cur = g_pinned.load(std::memory_order_relaxed);
  do {
    if (cur + bytes > limit) return false;
  } while (!g_pinned.compare_exchange_weak(cur, cur + bytes, std::memory_order_relaxed));
  return true;
}

void verbs_unreserve_pinned(uint64_t bytes) {
  g_pinned.fetch_sub(bytes, std::memory_order_relaxed);
}

void verbs_pinned_after_fork_child() { g_pinned.store(0, std::memory_order_relaxed); }

int verbs_register_rings(VerbsRings* r, bool reserved) {
  const size_t n = r->end.ring_bytes();
  r->rx_mr =
      ibv_reg_mr(r->pd, r->end.rx_ring(), n, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (r->rx_mr) r->tx_mr = ibv_reg_mr(r->pd, r->end.tx_mirror(), n, IBV_ACCESS_LOCAL_WRITE);
  if (!r->tx_mr) {
    const int e = errno ? errno : ENOMEM;
    if (r->rx_mr) ibv_dereg_mr(r->rx_mr);
    r->rx_mr = nullptr;
    return -e;
  }
  if (!reserved) g_pinned.fetch_add(registered_bytes(*r), std::memory_order_relaxed);
  return 0;
}

void verbs_release_registrations(VerbsRings* r) {
  g_pinned.fetch_sub(registered_bytes(*r), std::memory_order_relaxed);
  if (r->rx_mr) ibv_dereg_mr(r->rx_mr);
  if (r->tx_mr) ibv_dereg_mr(r->tx_mr);
  r->rx_mr = r->tx_mr = nullptr;
  if (r->pd) ibv_dealloc_pd(r->pd);
  r->pd = nullptr;
}

}  // namespace rsock
