// EndOwner: which process, of those holding one end of a connection (fork,
// exec), moves its bytes. Both transports keep one per end in memory that
// every holder maps: verbs in the end's own memfd (verbs/verbs_end.h), shm
// in the region, one per side (ring/wire.h). docs/design.md, "Connections
// that move", says why and how the two use it.
//
// The protocol (no transport type here; unit-tested in-process and across
// fork):
//  * Each takeover bumps `epoch` and records the taker's pid; a process owns
//    the end while the epoch it took is the current one.
//  * An owner brackets every operation that moves bytes with owner_enter()/
//    owner_leave() (a counter, `busy`, then a re-check of the epoch: Dekker
//    with seq_cst) and records its positions inside the bracket. A taker
//    bumps the epoch, then waits until `busy` is 0: from then on the old
//    owner fails every call, and the positions it left are exact.
// Thread-safety: the fields are atomics shared by processes.
#pragma once

#include <cstdint>

#include "ring/wire.h"  // EndOwner

namespace rsock {

// A new end: this process owns it, at epoch 1. Returns that epoch.
uint64_t owner_init(EndOwner* o);
// An end used again for a new connection (no process holds the old one):
// this process owns it at the next epoch, so that a process that still
// knew the old epoch owns nothing. Returns that epoch.
uint64_t owner_renew(EndOwner* o);

// An operation of the owner that took `epoch` begins: false (and nothing
// counted) when another process has taken the end over since.
bool owner_enter(EndOwner* o, uint64_t epoch);
void owner_leave(EndOwner* o);
// Whether `epoch` is still the current one (a cheap look, no bracket).
bool owner_owns(const EndOwner* o, uint64_t epoch);

// Makes this process the owner: bumps the epoch, records our pid, then
// waits until the previous owner has left its operations: at once when it
// released the end or died (then its count is cleared), else until `busy`
// is 0 (its operations are short: a copy and a publish or a post). Returns
// the new epoch in *epoch, or -ETIMEDOUT at the deadline (CLOCK_MONOTONIC
// ms; the end is then ours but its positions are not known to be final).
int owner_fence(EndOwner* o, int64_t deadline_ms, uint64_t* epoch);

// The owner lets go of the end (close, exit or exec while other processes
// hold it): a taker need not wait for it. Its epoch stays current until a
// taker comes, so an exec that fails can go on (owner_reclaim).
void owner_release(EndOwner* o, uint64_t epoch);
bool owner_reclaim(EndOwner* o, uint64_t epoch);

// Whether the end's owner let go of it (released, or its process is gone):
// then any holder may take it.
bool owner_free(const EndOwner* o);

// True when no process has pid (kill(pid, 0) says ESRCH), or it is a
// zombie.
bool pid_gone(int pid);

}  // namespace rsock
