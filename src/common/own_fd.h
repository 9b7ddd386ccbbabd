// librsock's own descriptors live above the application's.
//
// A program that runs without librsock gets the lowest free numbers for its
// sockets and files, and some programs depend on that: wrk sizes its event
// loop for 10 + 3 x connections fds, and a select() loop works only below
// FD_SETSIZE (1024). The descriptors librsock keeps for a connection
// (the region files, eventfds, a pairing's sockets, a dup of a connection's
// socket when it needs one, those of the RDMA transport) would take low numbers between the
// program's own. So each is made, or moved, at or above own_fd_floor(): the application's numbers
// stay the ones it would get on kernel TCP, as long as librsock's fit above
// the floor. When no number there is free, the descriptor stays where the
// kernel put it (the behaviour without a floor), never an error.
//
// A descriptor that lives only for a few system calls of one step, with no
// wait between them (the listener probe, the netlink lookup, a proof of
// possession), is not lifted: the move would cost two system calls more
// than its whole life, and a program's own call made meanwhile on another
// thread sees at most one number taken, as it does during a move.
#pragma once

namespace rsock {

// The lowest number librsock uses for its own descriptors: 1024 (above
// select()'s range) when RLIMIT_NOFILE allows 2048 or more, half the limit
// below that, and 0 (no floor) when the limit is under 64.
int own_fd_floor();

// A duplicate of fd at or above the floor (close-on-exec unless cloexec is
// false), or at the lowest free number when there is none above it; -1 and
// errno as fcntl(F_DUPFD).
int dup_high(int fd, bool cloexec = true);

// Moves a descriptor librsock just made (close-on-exec) above the floor:
// returns the new number and closes fd, or returns fd itself when it is
// already there, negative, or cannot move.
int lift_fd(int fd);

// Sets O_NONBLOCK on fd (librsock's own: an event channel, a completion
// channel). 0, or -errno.
int set_nonblock(int fd);

}  // namespace rsock
