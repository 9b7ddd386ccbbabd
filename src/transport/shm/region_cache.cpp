// Regions kept for the next connection (see region_cache.h).
#include "transport/shm/region_cache.h"

#include <sys/mman.h>
#include <sys/random.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "common/real.h"
#include "config/config.h"
#include "ring/wire.h"
#include "transport/shm/arena.h"
#include "transport/shm/shm_channel.h"

namespace rsock {
namespace {

struct Kept {
  // Creator's: its place (ref.arena set) and the peer; attaching side's:
  // the file and offset it was mapped from.
  RegionRef ref;
  RegionPeer peer;
  dev_t dev = 0;
  ino_t ino = 0;
  uint64_t offset = 0;
  void* map = nullptr;
  size_t len = 0;
  bool creator() const { return ref.arena != nullptr; }
};

std::mutex g_mu;
std::vector<Kept>* g_kept = nullptr;  // oldest first; never freed
std::atomic<size_t> g_limit{kDefaultRegionCache};
std::atomic<uint64_t> g_token{0};
// region_token_for's tokens: server pid -> (generation, token); under g_mu.
// Bounded: past kMaxServerTokens it starts afresh (a server then gets a new
// token, and places our next regions in a new file).
struct ServerToken {
  uint64_t generation = 0;
  uint64_t token = 0;
};
std::unordered_map<int32_t, ServerToken>* g_server_tokens = nullptr;  // never freed
constexpr size_t kMaxServerTokens = 1024;

uint64_t random_nonzero() {
  uint64_t v = 0;
  while (v == 0)
    if (getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) v = 0;
  return v;
}

void drop(const Kept& k) {
  // (a place given up while this process still maps it: its header says
  // whether the peer is done)
  arena_release(k.ref, k.len, k.map, true);
  munmap(k.map, k.len);
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
  const bool creator = k.creator();
  size_t n = 0;
  for (const Kept& e : *g_kept) n += e.creator() == creator;
  for (auto it = g_kept->begin(); n >= limit && it != g_kept->end();) {
    if (it->creator() != creator) {
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
  const uint64_t mine = random_nonzero();
  // Two threads may race to make it: one value wins for both.
  return g_token.compare_exchange_strong(t, mine, std::memory_order_acq_rel) ? mine : t;
}

uint64_t region_token_for(int32_t server_pid) {
  const uint64_t generation = region_process_token();
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_server_tokens == nullptr) g_server_tokens = new std::unordered_map<int32_t, ServerToken>;
  auto it = g_server_tokens->find(server_pid);
  if (it != g_server_tokens->end() && it->second.generation == generation) return it->second.token;
  if (it == g_server_tokens->end() && g_server_tokens->size() >= kMaxServerTokens)
    g_server_tokens->clear();
  const ServerToken made = {generation, random_nonzero()};
  (*g_server_tokens)[server_pid] = made;
  return made.token;
}

bool region_cache_take(const RegionPeer& peer, size_t ring_bytes, uint64_t nonce, RegionRef* out,
                       void** map, size_t* map_len) {
  if (peer.token == 0) return false;
  const size_t len = region_bytes_for(ring_bytes);
  Kept found;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_kept == nullptr) return false;
    for (auto it = g_kept->begin(); it != g_kept->end(); ++it) {
      if (!it->creator() || it->peer.pid != peer.pid || it->peer.token != peer.token ||
          it->len != len)
        continue;
      // Nor a file that a fork's child or a spawned program holds too: a
      // new connection's bytes go where only the two processes reach.
      if (!arena_places(it->ref.arena)) continue;
      // The peer's end must be done with it: its only process stored this
      // after its last touch (an end that a fork shared never does).
      auto* h = static_cast<RegionHeader*>(it->map);
      if (h->released[1].load(std::memory_order_acquire) != 1) continue;
      found = *it;
      g_kept->erase(it);
      break;
    }
  }
  if (!found.creator()) return false;
  shm_region_init_header(found.map, ring_bytes, nonce);
  *out = found.ref;
  *map = found.map;
  *map_len = found.len;
  return true;
}

void region_cache_keep(const RegionPeer& peer, const RegionRef& r, void* map, size_t map_len) {
  Kept k;
  k.ref = r;
  k.peer = peer;
  k.map = map;
  k.len = map_len;
  if (peer.token == 0 || r.arena == nullptr) {
    drop(k);
    return;
  }
  keep(k);
}

void* region_cache_find_mapping(dev_t dev, ino_t ino, uint64_t offset, size_t map_len) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_kept == nullptr) return nullptr;
  for (auto it = g_kept->begin(); it != g_kept->end(); ++it) {
    if (it->creator() || it->dev != dev || it->ino != ino || it->offset != offset) continue;
    void* map = it->len == map_len ? it->map : nullptr;
    if (map == nullptr) munmap(it->map, it->len);  // the same place holds a region of another size
    g_kept->erase(it);
    return map;
  }
  return nullptr;
}

void region_cache_keep_mapping(dev_t dev, ino_t ino, uint64_t offset, void* map, size_t map_len) {
  Kept k;
  k.dev = dev;
  k.ino = ino;
  k.offset = offset;
  k.map = map;
  k.len = map_len;
  keep(k);
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

void region_process_token_renew() { g_token.store(0, std::memory_order_release); }

void region_cache_fork_prepare() { g_mu.lock(); }

void region_cache_after_fork_parent() {
  // The child holds every region file of ours now (arena.h): a region kept
  // in one serves no new connection again. Mappings of others' files stay.
  // And it holds the files our servers made for us: a new token makes them
  // place our next regions in new ones.
  g_token.store(0, std::memory_order_relaxed);
  if (g_kept != nullptr)
    std::erase_if(*g_kept, [](const Kept& k) {
      if (!k.creator()) return false;
      drop(k);
      return true;
    });
  g_mu.unlock();
}

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
