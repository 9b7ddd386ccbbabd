// VerbsRings: the registered memory of one end of an RDMA connection (its
// VerbsEnd, whose receive ring and send mirror are registered in a
// protection domain of the connection's own), and the process's account
// of the memory its registrations pin (docs/design.md, "Registered rings").
//
// Making it costs a protection domain, a sealed memfd and two
// registrations (on a real NIC a registration pins and maps every page: the
// dearest step of a connection's setup). A connection that ended in this
// process with no other process holding its end gives its rings back to
// the device's engine (VerbsEngine::give_rings), which keeps up to
// RSOCK_REGION_CACHE of them for the next connection of the same ring size;
// that one then creates and registers nothing (VerbsEngine::take_rings).
// A kept end is renewed before its next use: a new nonce (an exec hand-off
// of the old connection validates no more) and the next epoch (a process
// that still held the old connection owns nothing of the new one). Its
// protection domain keeps the old guarantee: the ring's rkey works through
// one queue pair at a time, that of the connection it serves.
//
// Pinned memory is bounded by RSOCK_RDMA_PINNED per process (and, for a
// process without CAP_IPC_LOCK, by RLIMIT_MEMLOCK), kept rings included: a
// new connection that would pass the bound first drops kept rings, then
// stays on TCP (fallback rdma_pinned_limit). A takeover (a fork's child or
// an exec'd program continuing a connection) is counted but never refused:
// it has no TCP to fall back to.
// Thread-safety: the account is atomic; a VerbsRings belongs to one owner.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>

#include "transport/verbs/verbs_end.h"

namespace rsock {

struct VerbsRings {
  ibv_pd* pd = nullptr;
  ibv_mr* rx_mr = nullptr;  // the receive ring: the peer writes into it
  ibv_mr* tx_mr = nullptr;  // the send mirror: our writes read from it
  VerbsEnd end;

  // Moved, never copied: the source is left empty. Nothing is released
  // on destruction (verbs_release_registrations, VerbsEngine::give_rings).
  VerbsRings() = default;
  VerbsRings(VerbsRings&& o) noexcept { *this = static_cast<VerbsRings&&>(o); }
  VerbsRings& operator=(VerbsRings&& o) noexcept {
    if (this == &o) return *this;
    pd = o.pd;
    rx_mr = o.rx_mr;
    tx_mr = o.tx_mr;
    o.pd = nullptr;
    o.rx_mr = o.tx_mr = nullptr;
    end = static_cast<VerbsEnd&&>(o.end);
    return *this;
  }
  VerbsRings(const VerbsRings&) = delete;
  VerbsRings& operator=(const VerbsRings&) = delete;
};

// Registers r->end's mapped ring and mirror in r->pd. `reserved`: their
// bytes were reserved in the account (verbs_reserve_pinned); else they are
// counted whatever the bound (a takeover). 0 or a negative errno (then
// nothing is registered, and a reservation is still the caller's).
int verbs_register_rings(VerbsRings* r, bool reserved);
// Deregisters what r holds and frees its protection domain (the end stays
// in r); the account goes down by what they pinned.
void verbs_release_registrations(VerbsRings* r);

// The account: bytes pinned now, and whether `bytes` more fit under the
// bound (reserved if so; verbs_unreserve_pinned gives them back).
uint64_t verbs_pinned_bytes();
uint64_t verbs_pinned_limit();
bool verbs_reserve_pinned(uint64_t bytes);
void verbs_unreserve_pinned(uint64_t bytes);
// The configured bound (RSOCK_RDMA_PINNED).
void verbs_set_pinned_limit(uint64_t bytes);
// Tests: a bound of their own (0: the configured one again).
void verbs_set_pinned_limit_for_test(uint64_t bytes);
// In a fork's child: the parent's registrations are not ours.
void verbs_pinned_after_fork_child();

}  // namespace rsock
