// Regions kept for the next connection (see region_cache.h).
#include "transport/shm/region_cache.h"

#include <sys/mman.h>
#include <sys/random.h>

#include <atomic>
#include <mutex>

#include "common/real.h"
#include "config/config.h"
#include "ring/wire.h"
#include "transport/shm/shm_channel.h"

namespace rsock {
namespace {

struct Kept {
  // Creator's: memfd >= 0 and the peer; attaching side's: memfd -1.
  int memfd = -1;
  RegionPeer peer;
  dev_t dev = 0;
  ino_t ino = 0;
  void* map = nullptr;
  size_t len = 0;
};

std::mutex g_mu;
std::vector<Kept>* g_kept = nullptr;  // oldest first; never freed
std::atomic<size_t> g_limit{kDefaultRegionCache};
std::atomic<uint64_t> g_token{0};

void drop(const Kept& k) {
  munmap(k.map, k.len);
  if (k.memfd >= 0) real().close(k.memfd);
}

// Keeps `k`, dropping the oldest of its kind past the limit.
void keep(const Kept& k) {
  const size_t limit = g_limit.load(std::memory_order_relaxed);
  if (limit == 0) {
    drop(k);
    return;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_kept == nullptr) g_kept = new std::vector<Kept>;
  const bool creator = k.memfd >= 0;
  size_t n = 0;
  for (const Kept& e : *g_kept) n += (e.memfd >= 0) == creator;
  for (auto it = g_kept->begin(); n >= limit && it != g_kept->end();) {
    if ((it->memfd >= 0) != creator) {
      ++it;
      continue;
    }
    drop(*it);
    it = g_kept->erase(it);
    --n;
  }
  g_kept->push_back(k);
}

}  // namespace

void region_cache_set_limit(size_t n) { g_limit.store(n, std::memory_order_relaxed); }

uint64_t region_process_token() {
  uint64_t t = g_token.load(std::memory_order_acquire);
  if (t != 0) return t;
  uint64_t mine = 0;
  while (mine == 0)
    if (getrandom(&mine, sizeof mine, 0) != static_cast<ssize_t>(sizeof mine)) mine = 0;
  // Two threads may race to make it: one value wins for both.
  return g_token.compare_exchange_strong(t, mine, std::memory_order_acq_rel) ? mine : t;
}

int region_cache_take(const RegionPeer& peer, size_t ring_bytes, uint64_t nonce, void** map,
                      size_t* map_len) {
  if (peer.token == 0) return -1;
  const size_t len = region_bytes_for(ring_bytes);
  Kept found;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_kept == nullptr) return -1;
    for (auto it = g_kept->begin(); it != g_kept->end(); ++it) {
      if (it->memfd < 0 || it->peer.pid != peer.pid || it->peer.token != peer.token ||
          it->len != len)
        continue;
      // The peer's end must be done with it: its only process stored this
      // after its last touch (an end that a fork shared never does).
      auto* h = static_cast<RegionHeader*>(it->map);
      if (h->released[1].load(std::memory_order_acquire) != 1) continue;
      found = *it;
      g_kept->erase(it);
      break;
    }
  }
  if (found.memfd < 0) return -1;
  shm_region_init_header(found.map, ring_bytes, nonce);
  *map = found.map;
  *map_len = found.len;
  return found.memfd;
}

void region_cache_keep(const RegionPeer& peer, int memfd, void* map, size_t map_len) {
  if (peer.token == 0) {
    drop({memfd, peer, 0, 0, map, map_len});
    return;
  }
  keep({memfd, peer, 0, 0, map, map_len});
}

void* region_cache_find_mapping(dev_t dev, ino_t ino, size_t map_len) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_kept == nullptr) return nullptr;
  for (auto it = g_kept->begin(); it != g_kept->end(); ++it) {
    if (it->memfd >= 0 || it->dev != dev || it->ino != ino) continue;
    void* map = it->len == map_len ? it->map : nullptr;
    if (map == nullptr) munmap(it->map, it->len);  // the same file cannot change size
    g_kept->erase(it);
    return map;
  }
  return nullptr;
}

void region_cache_keep_mapping(dev_t dev, ino_t ino, void* map, size_t map_len) {
  keep({-1, {}, dev, ino, map, map_len});
}

void region_cache_own_fds(std::vector<int>* out) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_kept == nullptr) return;
  for (const Kept& k : *g_kept)
    if (k.memfd >= 0) out->push_back(k.memfd);
}

size_t region_cache_size() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_kept == nullptr ? 0 : g_kept->size();
}

void region_cache_drop_all() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_kept == nullptr) return;
  for (const Kept& k : *g_kept) drop(k);
  g_kept->clear();
}

void region_cache_fork_prepare() { g_mu.lock(); }

void region_cache_after_fork_parent() { g_mu.unlock(); }

void region_cache_after_fork_child() {
  // Parent and child would otherwise both hand a kept region to a new
  // connection of their own. The peer's pid is not ours either.
  if (g_kept != nullptr) {
    for (const Kept& k : *g_kept) drop(k);
    g_kept->clear();
  }
  g_token.store(0, std::memory_order_relaxed);
  g_mu.unlock();
}

}  // namespace rsock
