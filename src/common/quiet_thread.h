// Library threads (the pairing driver and its workers, the lingering ends'
// watcher) must never take a signal meant for the application: a handler of
// its would run on a thread it does not know, and a signal sent to the
// process could be consumed by us. Such a thread starts with every signal
// blocked, and detached: it ends on its own and nobody joins it.
#pragma once

namespace rsock {

// Starts fn(arg) on a detached thread with all signals blocked; the
// caller's mask is unchanged. Returns 0 or pthread_create's error.
int spawn_quiet_thread(void* (*fn)(void*), void* arg);

}  // namespace rsock
