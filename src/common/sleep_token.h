// Tokens that name one sleep of one thread: a thread that is about to
// sleep on several connections arms them all with one token
// (Channel::arm), so that a peer that has rung that sleep once need not
// ring it again (ring/sleepers.h). A token must not repeat: a waker that
// took a stale token for a live one would skip a sleeper it never rang.
// Per thread: a random 64-bit start (getrandom), then one step of a
// 64-bit counter per sleep, so a thread's tokens repeat only after 2^52
// sleeps, and two processes' only by chance (about 2^-52 for one token
// against another; a waker also forgets a token after a millisecond).
// Thread-safety: thread-local state, stepped with one atomic fetch_add: a
// signal handler that sleeps in the middle of the outer call's step takes
// a token of its own. (Two sleeps of one thread with one token could each
// be skipped for the other's doorbell: a lost wakeup, not a spare one.)
#pragma once

#include <cstdint>

namespace rsock {

uint64_t new_sleep_token();

// In a fork's child: the forking thread's sequence would repeat the
// parent's; it starts anew.
void sleep_tokens_after_fork_child();

}  // namespace rsock
