// Regions of closed connections, kept for the next connection between the
// same two processes (issue 9: creating, mapping and unmapping a region was
// the largest single cost of a pairing; docs/design.md, "Regions kept for
// the next connection").
//
// The accepting side creates every region. When its end of a connection
// closes and this process was the end's only holder from start to end (no
// fork, exec or spawn shared it), it keeps the region (its place in the
// arena for that peer, arena.h, and its mapping),
// labelled with the peer process: the pid the kernel reported on the
// rendezvous socket and the random token that process sent in its proof.
// The next pairing with that same process takes it, once the peer's end
// says it is done (RegionHeader::released, stored by the peer's only
// process after its last touch), and gives it a fresh header. A region is
// never offered to another process: its rings hold what the two processes
// said to each other, and nobody else may read it.
//
// The connecting side keeps its mapping of such a region, found again by
// the file's identity and the offset when an offer names the same place.
//
// Bounded: at most region_cache_set_limit() regions and as many mappings per
// process (the oldest go first: unmapped, their places given up); 0 keeps
// none. A
// region kept after both ends closed holds the first
// ShmChannel::kKeptWarmBytes of each ring (the rest is punched out); one
// whose server end closed first keeps what its rings touched (up to
// 2 x RSOCK_RING_SIZE + 4 KiB), since the client may still read. A fork's
// child starts with none, and its parent drops those it kept before (the
// child holds their file too, arena.h). Thread-safety: every call may come from any
// thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rsock {

struct RegionRef;  // arena.h

// The process at the other end of a region, as the creator knows it.
struct RegionPeer {
  int32_t pid = 0;
  uint64_t token = 0;  // 0: unknown (such a region is never kept)
};

// Config::region_cache (RSOCK_REGION_CACHE).
void region_cache_set_limit(size_t n);

// This process's token generation: random, made at first use, and new in
// a fork's child (which is another process) and its parent, and at
// region_process_token_renew. A server places the regions of all
// connections with one (pid, token) in one file (arena.h): a process that
// hands such a file to another one (a spawn) renews its tokens, so that no
// later region of its goes there.
uint64_t region_process_token();
void region_process_token_renew();
// The token this process proves itself with as a client to the server
// process `server_pid`: random per server process within a generation
// (never 0). A token sent to one server names nothing at another: a
// process that learned it as our server and later got our pid (once we
// exited) cannot present it to another server of ours to be placed in the
// file that server shared with us.
uint64_t region_token_for(int32_t server_pid);

// Creator's side. A kept region for a new connection to `peer` with rings
// of ring_bytes whose peer end is done: its header made fresh for `nonce`
// (as shm_region_place's). Returns true and its place (*out, holding the
// arena's reference), *map and *map_len; false when there is none.
bool region_cache_take(const RegionPeer& peer, size_t ring_bytes, uint64_t nonce, RegionRef* out,
                       void** map, size_t* map_len);
// Takes the region over (its place's reference and its mapping): kept, or
// given up and unmapped when the cache is off.
void region_cache_keep(const RegionPeer& peer, const RegionRef& r, void* map, size_t map_len);

// Attaching side. A kept mapping of map_len bytes at `offset` in the file
// (dev, ino), taken out of the cache, or nullptr.
void* region_cache_find_mapping(dev_t dev, ino_t ino, uint64_t offset, size_t map_len);
// Takes the mapping over: kept, or unmapped when the cache is off.
void region_cache_keep_mapping(dev_t dev, ino_t ino, uint64_t offset, void* map, size_t map_len);

// How many regions and mappings are kept now, and dropping them all (tests).
size_t region_cache_size();
void region_cache_drop_all();

// fork(): held across it; the child drops its copies, so that parent and
// child never hand the same region to two connections, and the parent its
// own (their files are the child's too); both draw a new token. The
// prepare hook runs before arena_fork_prepare, the others after arena's.
void region_cache_fork_prepare();
void region_cache_after_fork_parent();
void region_cache_after_fork_child();

}  // namespace rsock
