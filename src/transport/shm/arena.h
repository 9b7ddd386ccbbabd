// One memory file for the regions of every connection between two
// processes (issue 9: one descriptor per connection; docs/design.md, "One
// descriptor per connection").
//
// The accepting side creates every region. It places the regions of its
// connections with one peer process (the pid and token that process proved
// itself with, region_cache.h) in one memfd, its arena for that peer, each
// region at a page-aligned offset; the file grows as regions are placed and
// is sealed against shrinking (a peer can never pull pages from under a
// mapping), not against growing, and never past the program's
// RLIMIT_FSIZE (a full file keeps its regions; the next go into a new
// one). The offer names the offset, and the
// connecting side keeps one descriptor per file however many connections
// it maps from it, found by the file's identity. So a process holds one
// memfd per peer process, beside the sockets.
//
// The file holds only what the two processes of the pair said to each
// other. Nothing new is placed in an arena once a fork or spawn shared its
// descriptor: the next region for that peer goes in a new file, as it
// would with a file per region (and the peer, its token renewed at a fork
// or spawn, proves itself as a new process). A program that receives an
// accelerated socket through exec or spawn gets the whole file with it:
// RSOCK_REGION_FILE=connection (a token of 0) gives each region a file of
// its own instead (docs/security.md).
//
// A region the creator gives up is placed again (or its pages given back)
// only once the peer's end said it is done with it (RegionHeader::released,
// which its only process stores after its last touch); an end a fork
// shared never says so, and its place stays unused until the file goes.
// The file goes when the last region of this process in it does: the
// descriptor closes, and the memory goes with the last mapping of either
// process. Thread-safety: every call may come from any thread.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "transport/shm/region_cache.h"

namespace rsock {

struct Arena;

// A region's place: its file and offset. A reference to the file while
// `arena` is set (dropped by arena_release).
struct RegionRef {
  Arena* arena = nullptr;
  uint64_t offset = 0;
};

// The descriptor of the arena's file (close-on-exec; valid while a
// reference is held).
int arena_fd(const Arena* a);

// Whether new regions go in this file (not once a fork or spawn shared it).
bool arena_places(const Arena* a);

// Creator's side: a place of len bytes (a page multiple) for a new region
// of a connection with `peer`, in the arena for that peer (made at first
// use; a peer whose token is 0 gets a file of its own). The place is
// writable and reads as zero where nothing was written before. Returns 0 or
// a negative errno.
int arena_place(const RegionPeer& peer, size_t len, RegionRef* out);

// Attaching side (and an exec'd image): the arena that the file open as
// `fd` is, holding a reference. Takes `fd` over: closed at once when this
// process holds the file under another number already. {nullptr} (fd
// closed) when fd is no regular file.
RegionRef arena_adopt(int fd, uint64_t offset);

// Drops a reference to the region of len bytes at r. `reusable`: the
// creator's only holder of the end gives the place up for good, mapped at
// `header` (nullptr: it never was); the place serves a later region once the
// peer's end is done with it, and its pages go back then.
void arena_release(const RegionRef& r, size_t len, const void* header, bool reusable);

// A spawned child receives the file: nothing new is placed in it.
void arena_stop_placing(Arena* a);

// The open arena files (an application's closefrom must leave them open).
void arena_own_fds(std::vector<int>* out);
// How many arenas this process holds open (tests).
size_t arena_count();

// fork(): held across it; parent and child both hold every file now, so
// neither places anything new in them.
void arena_fork_prepare();
void arena_after_fork_parent();
void arena_after_fork_child();

}  // namespace rsock
