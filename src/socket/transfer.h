// Kernel-side copies on accelerated sockets: sendfile (file -> socket) and
// splice (pipe -> socket, socket -> pipe). The kernel would move these bytes
// into or out of the kernel TCP socket, which after the switch carries no
// application byte; here they go through the connection's stream instead,
// with the kernel's semantics: offset pointer versus file position, count
// limits, partial transfers, O_NONBLOCK and SPLICE_F_NONBLOCK, SO_SNDTIMEO
// and SO_RCVTIMEO, EPIPE. No byte is taken from the source that the stream
// cannot take: the free ring space is known before the source is read, and
// a ring read is peeked before it is handed to the pipe.
// Thread-safety: as the socket calls (socket.h); the source fd's position
// is read and set with separate calls, as any user-space copy must.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace rsock {

class ConnectionState;

// sendfile(out, in_fd, offset, count) with out accelerated. Returns the
// bytes sent or a negative errno; *offset (or in_fd's position when offset
// is null) advances by exactly the bytes sent. *sigpipe is set when the
// kernel would raise SIGPIPE.
ssize_t conn_sendfile(ConnectionState& c, int in_fd, off_t* offset, size_t count, bool* sigpipe);

// splice(pipe_fd, NULL, sock, NULL, len, flags): pipe -> accelerated socket.
ssize_t conn_splice_from_pipe(ConnectionState& c, int pipe_fd, size_t len, unsigned flags,
                              bool* sigpipe);

// splice(sock, NULL, pipe_fd, NULL, len, flags): accelerated socket -> pipe.
ssize_t conn_splice_to_pipe(ConnectionState& c, int pipe_fd, size_t len, unsigned flags,
                            bool* sigpipe);

}  // namespace rsock
